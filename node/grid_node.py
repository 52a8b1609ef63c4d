"""This node's Selenium Grid node: two slots whose stereotype names the node.

The stereotype carries `gridfleet:node=<instance id>`, so the Grid routes a
session to this node only when the crawler asks for it: the browser runs on the
machine that holds the site's profile lock. The agent crawls one site at a time; the
second slot lets the next site's browser start while the last one closes.

The Grid node, and so chromedriver and Chromium, may run as another user than
the agent (`RunAs`): on the embedded default a root hub's nodes start it as the
crawl user, with a HOME and working directory of its own, so that Chromium runs
unprivileged with its sandbox on.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from fleet import procs
from fleet.grid_auth import REGISTRATION_REFUSED, GridSecret, write_private
from node.browser import NODE_CAPABILITY, grid_node_ready

log = logging.getLogger("gridfleet.node")


@dataclass(frozen=True)
class RunAs:
    """A user a child process runs as: uid, primary gid and supplementary groups."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    @classmethod
    def lookup(cls, name: str) -> RunAs:
        """The local user `name` (KeyError when there is none)."""
        pw = pwd.getpwnam(name)
        return cls(name, pw.pw_uid, pw.pw_gid, tuple(os.getgrouplist(name, pw.pw_gid)))


@dataclass(frozen=True)
class GridNodeSpec:
    jar: Path
    grid_url: str  # the Grid hub, e.g. http://10.0.1.5:4444
    publish: str  # the hub's event bus, e.g. tcp://10.0.1.5:4442
    subscribe: str  # e.g. tcp://10.0.1.5:4443
    chromedriver: str = "/usr/bin/chromedriver"
    browser_name: str = "chrome"  # `node.browser.browser_name` of the crawls' binary: the stereotype matches them
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port
    java: str = "java"
    session_timeout_s: int = 300
    secret: GridSecret | None = None  # the Grid's: its registration secret goes in the node's config file
    #: how long the Grid node sends its registration before it gives up (and says REGISTRATION_REFUSED)
    register_period_s: int = 80  # under the 90 s `start` waits: a refused node says so before it times out
    register_cycle_s: int = 10


def render_toml(spec: GridNodeSpec, node_id: str, port: int) -> str:
    stereotype = json.dumps({"browserName": spec.browser_name, "platformName": "linux", NODE_CAPABILITY: node_id})
    q = json.dumps  # TOML basic strings accept JSON string escapes
    secret = [f"registration-secret = {q(spec.secret.registration_secret)}"] if spec.secret else []
    return "\n".join(
        [
            "[server]",
            f"host = {q(spec.host)}",
            f"port = {port}",
            *secret,
            "",
            "[events]",
            f"publish = {q(spec.publish)}",
            f"subscribe = {q(spec.subscribe)}",
            "",
            "[node]",
            "detect-drivers = false",
            # two slots: the next site's browser starts while the last one still closes (the agent runs one
            # crawl at a time; only its own requests carry this node's id)
            "max-sessions = 2",
            "override-max-sessions = true",
            "selenium-manager = false",
            f"session-timeout = {int(spec.session_timeout_s)}",
            f"register-period = {int(spec.register_period_s)}",
            f"register-cycle = {int(spec.register_cycle_s)}",
            "",
            "[[node.driver-configuration]]",
            'display-name = "chromium"',
            "max-sessions = 2",
            f"webdriver-executable = {q(spec.chromedriver)}",
            f"stereotype = {q(stereotype)}",
            "",
        ]
    )


class GridNode:
    def __init__(self, spec: GridNodeSpec, node_id: str, state_dir: Path, run_as: RunAs | None = None):
        self.spec = spec
        self.node_id = node_id
        self.state_dir = state_dir
        self.run_as = run_as  # None: this process's user
        self.proc: subprocess.Popen | None = None

    @property
    def home(self) -> Path:
        """HOME and working directory of a Grid node run as another user (Chromium writes there)."""
        return self.state_dir / "grid-home"

    def start(self, timeout_s: float = 90) -> None:
        port = self.spec.port or procs.free_port()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        toml = self.state_dir / "grid-node.toml"
        u = self.run_as
        owner = (u.uid, u.gid) if u is not None and self._other_user() else None
        write_private(toml, render_toml(self.spec, self.node_id, port), owner)  # it may hold the registration secret
        log_path = self.state_dir / "grid-node.log"
        logged_before = log_path.stat().st_size if log_path.exists() else 0
        log_file = open(log_path, "ab")  # opened here: the Grid node needs no access
        cmd = [
            self.spec.java,
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-jar",
            str(self.spec.jar),
            "node",
            "--config",
            str(toml),
        ]
        try:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, **self._as_user()
            )
        finally:
            log_file.close()
        deadline = time.monotonic() + timeout_s
        while not grid_node_ready(self.spec.grid_url, self.node_id, secret=self.spec.secret):
            if self.proc.poll() is not None:
                raise RuntimeError(f"Grid node exited with {self.proc.returncode}; see {log_path}")
            if _refused(log_path, logged_before):
                raise RuntimeError(
                    f"the Grid hub {self.spec.grid_url} refused this Grid node's registration "
                    f"(a wrong or missing registration secret?); see {log_path}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"Grid node not registered with {self.spec.grid_url} after {timeout_s:.0f}s")
            time.sleep(0.25)
        log.info(
            "grid-node-up node=%s port=%d grid=%s user=%s",
            self.node_id,
            port,
            self.spec.grid_url,
            self.run_as.name if self.run_as else "(this process's)",
        )

    def _other_user(self) -> bool:
        return self.run_as is not None and self.run_as.uid != os.geteuid()

    def _as_user(self) -> dict:
        """Popen's arguments that start the Grid node as `run_as`: its ids, its own HOME and cwd (the toml is
        already that user's, mode 0600); the environment (and so the process markers) is kept."""
        u = self.run_as
        if u is None or not self._other_user():
            return {}
        self.home.mkdir(mode=0o700, exist_ok=True)
        os.chown(self.home, u.uid, u.gid)
        os.chmod(self.state_dir, stat.S_IMODE(os.stat(self.state_dir).st_mode) | 0o011)  # traversable, not listable
        env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}  # they name this user's dirs
        env.update(HOME=str(self.home), USER=u.name, LOGNAME=u.name)
        return {"user": u.uid, "group": u.gid, "extra_groups": list(u.groups), "env": env, "cwd": self.home}

    def problem(self) -> str | None:
        """None while the Grid node runs, else why it does not."""
        if self.proc is None:
            return "the Grid node is not started"
        code = self.proc.poll()
        return None if code is None else f"the Grid node exited with code {code}"

    def stop(self) -> None:
        if self.proc is None:
            return
        pid = self.proc.pid
        procs.kill_tree(lambda ps: [p for p in ps if p.pid == pid], grace_s=5)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None


def _refused(log_path: Path, offset: int) -> bool:
    """Whether the Grid node, since `offset` of its log, said that it gave up registering."""
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            return REGISTRATION_REFUSED.encode() in f.read()
    except OSError:
        return False
