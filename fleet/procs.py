"""Processes of the embedded default: started detached, found again by marker, killed as trees.

Every process the local stack or a local instance starts carries environment
markers (`GRIDFLEET_STACK`, `GRIDFLEET_RUN`, `GRIDFLEET_INSTANCE`), which its
children inherit (Grid node -> chromedriver -> Chromium). A hub started again
after a crash finds them in the process table even if its registry missed them.
Chromium's helpers rewrite their environment, so a kill takes the marked
processes *and all their descendants*, collected before anything is signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MARKERS = ("GRIDFLEET_STACK", "GRIDFLEET_RUN", "GRIDFLEET_INSTANCE", "GRIDFLEET_ROLE")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str
    start_ticks: int
    markers: Mapping[str, str]
    cmdline: tuple[str, ...]

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")


def _read_stat(pid: int) -> tuple[int, str, int] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2 :].split()
    return int(rest[1]), rest[0], int(rest[19])  # ppid, state, starttime


def _markers(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for entry in raw.split(b"\0"):
        if entry.startswith(b"GRIDFLEET_"):
            k, _, v = entry.decode(errors="replace").partition("=")
            if k in MARKERS:
                out[k] = v
    return out


def cmdline(pid: int) -> tuple[str, ...]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ()
    return tuple(p.decode(errors="replace") for p in raw.split(b"\0") if p)


def scan(with_cmdline: bool = False) -> list[Proc]:
    procs = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        st = _read_stat(pid)
        if st is None:
            continue
        procs.append(Proc(pid, st[0], st[1], st[2], _markers(pid), cmdline(pid) if with_cmdline else ()))
    return procs


def find(procs: Iterable[Proc], **markers: str) -> list[Proc]:
    """Live processes whose markers include all of `markers` (e.g. GRIDFLEET_RUN='2026-11-21')."""
    return [p for p in procs if p.alive and all(p.markers.get(k) == v for k, v in markers.items())]


def descendants(procs: Sequence[Proc], roots: Iterable[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p.pid)
    out: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.add(pid)
        todo.extend(children.get(pid, ()))
    return out


def pid_alive(pid: int, start_ticks: int | None = None) -> bool:
    st = _read_stat(pid)
    if st is None or st[1] in ("Z", "X"):
        return False
    return start_ticks is None or st[2] == start_ticks


def start_ticks(pid: int) -> int | None:
    st = _read_stat(pid)
    return st[2] if st else None


def kill_tree(select, grace_s: float = 3.0, poll_s: float = 0.05) -> int:
    """Kill every process `select(procs)` returns, with all its descendants; return how many.

    SIGTERM first, SIGKILL after `grace_s`; rescans until nothing selected is
    left, so processes forked meanwhile are caught too.
    """
    killed: set[int] = set()
    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    while True:
        procs = scan()
        roots = [p.pid for p in select(procs) if p.pid != os.getpid()]  # never the caller, nor through it
        targets = {pid for pid in descendants(procs, roots) if pid != os.getpid() and pid_alive(pid)}
        if not targets:
            return len(killed)
        if time.monotonic() >= deadline:
            sig = signal.SIGKILL
        for pid in targets:
            try:
                os.kill(pid, sig)
                killed.add(pid)
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
        _reap(targets)
        time.sleep(poll_s)


def _reap(pids: Iterable[int]) -> None:
    """Collect our own exited children so they do not linger as zombies."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        except OSError:
            pass


def spawn(
    cmd: Sequence[str],
    *,
    markers: Mapping[str, str],
    log_path: Path,
    cwd: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> subprocess.Popen:
    """Start `cmd` detached (own session, stdin closed, output to `log_path`), carrying `markers`."""
    env = {k: v for k, v in os.environ.items() if k not in MARKERS}
    env.update(extra_env or {})
    env.update(markers)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
            close_fds=True,
        )


def free_port(preferred: int | None = None, host: str = "127.0.0.1") -> int:
    import socket

    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free port")
