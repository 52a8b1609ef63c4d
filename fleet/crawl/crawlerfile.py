"""`crawler.json`: which crawl runs on a node now, and how to kill exactly that one.

The node agent writes it (site, attempt, process group) while a crawler runs.
Every way the hub kills a crawl ends here: `LocalNodeControl` on the embedded
default, and `gridfleet node kill` run on an EC2 node through SSM or SSH. Only
the crawl of the named site and attempt is signalled, never the next one.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from fleet import procs

FILE = "crawler.json"


def write(state_dir: Path, site: str, attempt: int, pid: int) -> None:
    data = {"site": site, "attempt": attempt, "pid": pid, "pgid": pid, "start_ticks": procs.start_ticks(pid)}
    tmp = state_dir / (FILE + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, state_dir / FILE)


def remove(state_dir: Path) -> None:
    try:
        (state_dir / FILE).unlink()
    except FileNotFoundError:
        pass


@dataclass(frozen=True)
class Killed:
    ok: bool  # the crawl of that site and attempt no longer runs
    detail: str


def kill(state_dir: Path, site: str, attempt: int, wait_s: float = 3.0) -> Killed:
    try:
        info = json.loads((state_dir / FILE).read_text())
    except (OSError, ValueError):
        return Killed(True, "no crawler running")
    if info.get("site") != site or int(info.get("attempt", -1)) != attempt:
        return Killed(True, f"crawler runs {info.get('site')} attempt {info.get('attempt')}")
    pid, pgid = int(info["pid"]), int(info["pgid"])
    if not procs.pid_alive(pid, info.get("start_ticks")):
        return Killed(True, "crawler already exited")
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return Killed(True, "crawler already exited")
    except PermissionError as e:
        return Killed(False, str(e))
    end = time.monotonic() + wait_s
    while procs.pid_alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    if procs.pid_alive(pid):
        return Killed(False, "crawler survived SIGKILL")
    return Killed(True, f"killed process group {pgid}")
