"""The embedded default's stack: moto server (AWS), a Selenium Grid hub, the demo site server, and an
IMDSv2 emulator (instance metadata for local nodes, where spot notices can be posted).

`gridfleet local up` starts it and leaves it running (state in `stack.json`
under the stack directory), so a hub can be killed and resumed against it;
`gridfleet run --local` uses a running stack or starts its own and stops it
at the end. Every component listens on 127.0.0.1 and carries the stack's
marker, so `down` finds and kills them, and any node still running, by marker.
The demo sites' reset and the emulator's spot notices change state: they answer
only requests carrying the stack's own random token, kept in `stack.json`
(readable by its owner only). The Grid takes only nodes that show the stack's
Grid secret, and only clients that show its router credentials: the secret is
made when the stack starts, kept in `stack.json` and in `grid-secret` beside it
(both mode 0600, whose path local nodes are given), and reaches the Grid hub in
its config file `grid-hub.toml` (0600), never on a command line.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fleet import procs
from fleet.errors import MissingResource, StackError
from fleet.grid_auth import GridSecret, grid_request, hub_toml, write_private
from fleet.httpd import TOKEN_ENV

PREFERRED_PORTS = {"moto": 5000, "grid": 4444, "grid_publish": 4442, "grid_subscribe": 4443, "demo": 8800, "imds": 8169}
#: Held by a stack from the choice of its ports until its components listen on them (see `_choosing_ports`).
PORTS_LOCK = Path(tempfile.gettempdir()) / "gridfleet-stack-ports.lock"
#: How many times `up` starts the stack when a component finds its port taken. A port is free when chosen
#: and taken only when the component listens, seconds later (the Grid binds its HTTP port after its event
#: bus): another program of this machine (a node, a browser's outgoing connection) may take it between.
START_TRIES = 3
#: What a component's log says when it could not listen on its port (Python's OSError, Java's BindException).
PORT_TAKEN = ("Address already in use", "port is already in use")


def stack_id_for(path: Path) -> str:
    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]


def check_tools(java: str, chromium: str, chromedriver: str) -> None:
    missing = [name for name in (java, chromium, chromedriver) if not shutil.which(name)]
    if missing:
        raise MissingResource(f"not installed: {', '.join(missing)}; run `make setup`")


@dataclass
class Component:
    name: str
    pid: int
    start_ticks: int | None
    url: str
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return procs.pid_alive(self.pid, self.start_ticks)


@dataclass
class StackState:
    stack_id: str
    dir: str
    owner_run: str | None  # set when `run --local` started the stack for itself (it stops it at the end)
    components: dict[str, Component]
    started_at: float
    token: str = ""  # what the demo server's reset and the emulator's spot notices must carry (X-Gridfleet-Token)
    grid_secret: str = field(default="", repr=False)  # the Grid's (fleet.grid_auth); "": a stack from before it

    @property
    def secret(self) -> GridSecret | None:
        return GridSecret(self.grid_secret) if self.grid_secret else None

    @property
    def moto_url(self) -> str:
        return self.components["moto"].url

    @property
    def grid_url(self) -> str:
        return self.components["grid"].url

    @property
    def grid_publish(self) -> str:
        return f"tcp://127.0.0.1:{self.components['grid'].ports['publish']}"

    @property
    def grid_subscribe(self) -> str:
        return f"tcp://127.0.0.1:{self.components['grid'].ports['subscribe']}"

    @property
    def demo_url(self) -> str:
        return self.components["demo"].url

    @property
    def imds_url(self) -> str:
        return self.components["imds"].url

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @staticmethod
    def from_json(text: str) -> StackState:
        d = json.loads(text)
        d["components"] = {k: Component(**v) for k, v in d["components"].items()}
        return StackState(**d)


#: How often the Grid tries again a queued session request whose node's one slot is busy, in milliseconds (the
#: option's unit). A node's next session request can wait for the slot its last crawl's browser is freeing; 1 ms
#: made the hub busy-loop meanwhile, on the cores the browsers need.
SESSION_RETRY_INTERVAL_MS = 20


class LocalStack:
    def __init__(
        self,
        root: Path,
        *,
        grid_jar: Path | None = None,
        java: str = "java",
        session_request_timeout_s: float = 60,
        progress: Callable[[str], None] = lambda _: None,
    ):
        self.root = root
        self.dir = root / "local"
        self.stack_id = stack_id_for(self.dir)
        self.grid_jar = grid_jar
        self.java = java
        self.session_request_timeout_s = session_request_timeout_s
        self.progress = progress

    @property
    def state_file(self) -> Path:
        return self.dir / "stack.json"

    @property
    def grid_secret_file(self) -> Path:
        """The Grid secret, for local nodes (mode 0600)."""
        return self.dir / "grid-secret"

    @property
    def grid_config_file(self) -> Path:
        """The Grid hub's config: its registration secret and router credentials (mode 0600)."""
        return self.dir / "grid-hub.toml"

    @property
    def instances_dir(self) -> Path:
        return self.dir / "instances"

    @property
    def efs_root(self) -> Path:
        """Where profiles and locks live: the local stand-in for EFS; kept across stacks."""
        return self.root / "efs"

    def read_state(self) -> StackState | None:
        try:
            return StackState.from_json(self.state_file.read_text())
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def running(self) -> StackState | None:
        """The stack's state if every component is alive and answers, else None."""
        st = self.read_state()
        if st is None or st.stack_id != self.stack_id:
            return None
        healthy = all(_healthy(c, st.secret) for c in st.components.values())
        if all(c.alive for c in st.components.values()) and healthy and self._secret_kept(st):
            return st
        return None

    def up(self, owner_run: str | None = None, timeout_s: float = 90) -> StackState:
        st = self.running()
        if st is not None:
            return st
        self.down(quiet=True)  # a half-alive stack: start clean
        # moto starts empty: what referred to the old state (local instances, run configs) goes with it.
        # Runs are exported to runs/<run_id>/ (node logs included) when they end.
        for stale in (self.instances_dir, self.dir / "runs"):
            shutil.rmtree(stale, ignore_errors=True)
        if self.grid_jar is None:
            raise MissingResource("the Selenium server jar is needed to start the local stack; run `make setup`")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.efs_root.mkdir(parents=True, exist_ok=True)
        logs = self.dir / "logs"
        token = secrets.token_urlsafe(32)
        grid_secret = GridSecret.make()
        for attempt in range(1, START_TRIES + 1):
            try:
                grid_secret.write(self.grid_secret_file)
                write_private(self.grid_config_file, hub_toml(grid_secret))
                # the preferred ports first; after one was taken, wherever the system finds room
                started = self._start(logs, token, grid_secret, timeout_s, preferred=attempt == 1)
                break
            except PortTaken as e:
                self.down(quiet=True)  # also removes the secret files: written again above
                if attempt == START_TRIES:
                    raise StackError(f"{e} (tried {START_TRIES} times)") from None
                self.progress(f"{e}; starting again on other ports")
            except BaseException:
                self.down(quiet=True)
                raise
        st = StackState(self.stack_id, str(self.dir), owner_run, started, time.time(), token, grid_secret.value)
        self._write_state(st)
        return st

    def _start(
        self, logs: Path, token: str, grid_secret: GridSecret, timeout_s: float, preferred: bool
    ) -> dict[str, Component]:
        """Start each component on ports chosen now and wait until all answer."""
        started: dict[str, Component] = {}
        with _choosing_ports():
            ports = {name: procs.free_port(p if preferred else None) for name, p in PREFERRED_PORTS.items()}
            for name, cmd, url, extra in self._specs(ports):
                self.progress(f"starting {name} on {url}")
                p = procs.spawn(
                    cmd,
                    markers={"GRIDFLEET_STACK": self.stack_id, "GRIDFLEET_ROLE": f"stack-{name}"},
                    log_path=logs / f"{name}.log",
                    extra_env={TOKEN_ENV: token} if name in ("demo", "imds") else None,
                )
                started[name] = Component(name, p.pid, procs.start_ticks(p.pid), url, extra)
            _await_healthy(started.values(), logs, timeout_s, grid_secret)
        return started

    def _specs(self, ports: dict[str, int]) -> list[tuple[str, list[str], str, dict[str, int]]]:
        """(name, command, url, extra ports) of each component, in the order they start."""
        py = sys.executable
        return [
            (
                "moto",
                [py, "-m", "embedded.moto_server", "-H", "127.0.0.1", "-p", str(ports["moto"])],
                f"http://127.0.0.1:{ports['moto']}",
                {},
            ),
            (
                "grid",
                [
                    self.java,
                    "-Xmx512m",
                    "-XX:+UseSerialGC",
                    "-jar",
                    str(self.grid_jar),
                    "hub",
                    "--config",
                    str(self.grid_config_file),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(ports["grid"]),
                    "--publish-events",
                    f"tcp://127.0.0.1:{ports['grid_publish']}",
                    "--subscribe-events",
                    f"tcp://127.0.0.1:{ports['grid_subscribe']}",
                    "--session-request-timeout",
                    str(int(self.session_request_timeout_s)),
                    "--session-retry-interval",
                    str(SESSION_RETRY_INTERVAL_MS),
                ],
                f"http://127.0.0.1:{ports['grid']}",
                {"publish": ports["grid_publish"], "subscribe": ports["grid_subscribe"]},
            ),
            (
                "demo",
                [py, "-m", "embedded.demo_server", "--host", "127.0.0.1", "--port", str(ports["demo"])],
                f"http://127.0.0.1:{ports['demo']}",
                {},
            ),
            (
                "imds",
                [py, "-m", "embedded.imds_server", "--host", "127.0.0.1", "--port", str(ports["imds"])],
                f"http://127.0.0.1:{ports['imds']}",
                {},
            ),
        ]

    def _write_state(self, st: StackState) -> None:
        write_private(self.state_file, st.to_json())

    def _secret_kept(self, st: StackState) -> bool:
        """Whether the nodes' copy of the Grid secret is the stack's (a stack from before the secret has none)."""
        try:
            return st.secret is not None and GridSecret.read(self.grid_secret_file) == st.secret
        except MissingResource:
            return False

    def status(self) -> list[tuple[str, str, str, int | None]]:
        """(component, state, url, pid) for each component, plus live local nodes."""
        st = self.read_state()
        rows: list[tuple[str, str, str, int | None]] = []
        if st is None:
            return [(n, "stopped", "-", None) for n in ("moto", "grid", "demo", "imds")]
        for c in st.components.values():
            state = ("up" if _healthy(c, st.secret) else "not answering") if c.alive else "stopped"
            rows.append((c.name, state, c.url, c.pid))
        nodes = {
            p.markers.get("GRIDFLEET_INSTANCE")
            for p in procs.find(procs.scan(), GRIDFLEET_STACK=self.stack_id)
            if p.markers.get("GRIDFLEET_ROLE") == "node"
        }
        for iid in sorted(n for n in nodes if n):
            rows.append((f"node {iid}", "up", "-", None))
        return rows

    def down(self, quiet: bool = False) -> int:
        """Kill every process of the stack (components, nodes, browsers); return how many."""
        n = procs.kill_tree(lambda ps: [p for p in ps if p.markers.get("GRIDFLEET_STACK") == self.stack_id])
        for f in (self.state_file, self.grid_secret_file, self.grid_config_file):
            f.unlink(missing_ok=True)
        if not quiet:
            self.progress(f"stopped {n} processes")
        return n


@contextlib.contextmanager
def _choosing_ports() -> Iterator[None]:
    """One stack of this machine at a time between choosing its ports and listening on them: a port is free
    when chosen but taken only when its component listens, seconds later, so two stacks starting together
    would otherwise choose the same (the preferred ones first) and one would answer the other's checks."""
    try:  # read-only: the file may be another user's, and a lock needs no more
        fd = os.open(PORTS_LOCK, os.O_RDONLY)
    except FileNotFoundError:
        fd = os.open(PORTS_LOCK, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _await_healthy(components: Iterable[Component], logs: Path, timeout_s: float, secret: GridSecret) -> None:
    """Wait until each component answers; StackError if one exits or `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    for c in components:
        while not _healthy(c, secret):
            if not c.alive:
                log = logs / (c.name + ".log")
                cause = exit_cause(log)
                said = f"{c.name} exited while starting" + (f" ({cause})" if cause else "") + f"; see {log}"
                raise PortTaken(said) if cause and any(t in cause for t in PORT_TAKEN) else StackError(said)
            if time.monotonic() > deadline:
                raise StackError(
                    f"{c.name} did not answer on {c.url} in {timeout_s:.0f}s; see {logs / (c.name + '.log')}"
                )
            time.sleep(0.2)


class PortTaken(StackError):
    """A component exited while starting because another program listens on its port."""


def exit_cause(log: Path, limit: int = 200) -> str:
    """The line of a component's log that says why it ended: the last that names an error (a Java trace's
    innermost `Caused by`, a Python traceback's last line), else its last line; "" if it has none."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - 16384))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    caused = [ln for ln in lines if ln.startswith("Caused by:")]
    said = [ln for ln in lines if not ln.startswith(("at ", "...")) and ("Error" in ln or "Exception" in ln)]
    line = (caused or said or lines or [""])[-1]
    return " ".join(line.split())[:limit]


def _healthy(c: Component, secret: GridSecret | None) -> bool:
    """Whether `c` answers; the Grid's /status, with the stack's credentials (a Grid that refuses them is not
    the stack's)."""
    path = {"moto": "/moto-api/", "grid": "/status", "demo": "/_stats", "imds": "/_health"}.get(c.name, "/")
    try:
        with urllib.request.urlopen(grid_request(c.url + path, secret if c.name == "grid" else None), timeout=2) as r:
            return 200 <= r.status < 300  # the Grid says "not ready" until a node registers: answering is enough
    except (OSError, ValueError):
        return False
