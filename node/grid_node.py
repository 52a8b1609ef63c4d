"""This node's Selenium Grid node: one slot whose stereotype names the node.

The stereotype carries `gridfleet:node=<instance id>`, so the Grid routes a
session to this node only when the crawler asks for it: the browser runs on the
machine that holds the site's profile lock. One session at a time.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from fleet.local import procs
from node.browser import NODE_CAPABILITY, grid_node_ready

log = logging.getLogger("gridfleet.node")


@dataclass(frozen=True)
class GridNodeSpec:
    jar: Path
    grid_url: str  # the Grid hub, e.g. http://10.0.1.5:4444
    publish: str  # the hub's event bus, e.g. tcp://10.0.1.5:4442
    subscribe: str  # e.g. tcp://10.0.1.5:4443
    chromedriver: str = "/usr/bin/chromedriver"
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port
    java: str = "java"
    session_timeout_s: int = 300


def render_toml(spec: GridNodeSpec, node_id: str, port: int) -> str:
    stereotype = json.dumps({"browserName": "chrome", "platformName": "linux", NODE_CAPABILITY: node_id})
    q = json.dumps  # TOML basic strings accept JSON string escapes
    return "\n".join([
        "[server]", f"host = {q(spec.host)}", f"port = {port}", "",
        "[events]", f"publish = {q(spec.publish)}", f"subscribe = {q(spec.subscribe)}", "",
        "[node]", "detect-drivers = false", "max-sessions = 1", "selenium-manager = false",
        f"session-timeout = {int(spec.session_timeout_s)}", "", "[[node.driver-configuration]]",
        'display-name = "chromium"', "max-sessions = 1", f"webdriver-executable = {q(spec.chromedriver)}",
        f"stereotype = {q(stereotype)}", "",
    ])


class GridNode:
    def __init__(self, spec: GridNodeSpec, node_id: str, state_dir: Path):
        self.spec = spec
        self.node_id = node_id
        self.state_dir = state_dir
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 90) -> None:
        port = self.spec.port or procs.free_port()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        toml = self.state_dir / "grid-node.toml"
        toml.write_text(render_toml(self.spec, self.node_id, port))
        log_file = open(self.state_dir / "grid-node.log", "ab")
        cmd = [self.spec.java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-jar", str(self.spec.jar), "node", "--config", str(toml)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT)
        log_file.close()
        deadline = time.monotonic() + timeout_s
        while not grid_node_ready(self.spec.grid_url, self.node_id):
            if self.proc.poll() is not None:
                raise RuntimeError(f"Grid node exited with {self.proc.returncode}; see {self.state_dir / 'grid-node.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Grid node not registered with {self.spec.grid_url} after {timeout_s:.0f}s")
            time.sleep(0.25)
        log.info("grid-node-up node=%s port=%d grid=%s", self.node_id, port, self.spec.grid_url)

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
