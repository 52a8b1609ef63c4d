"""Kill a crawl on a local instance: signal the crawler's process group.

The node agent writes `crawler.json` (site, attempt, pgid) in its instance
directory while a crawler runs; this is the local twin of the shell command that
SSM or SSH runs on EC2. The agent notices its crawler died and closes the
browser session itself.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from fleet.local import procs
from hub.control.base import KillResult


class LocalNodeControl:
    def __init__(self, instances_dir: Path, stack_id: str, run_id: str, wait_s: float = 3.0):
        self.dir = instances_dir / run_id
        self.stack_id = stack_id
        self.wait_s = wait_s

    def kill(self, instance_id: str, site: str, attempt: int) -> KillResult:
        alive = procs.find(procs.scan(), GRIDFLEET_INSTANCE=instance_id, GRIDFLEET_STACK=self.stack_id)
        if not alive:
            return KillResult(False, "local", "instance is not running")
        try:
            info = json.loads((self.dir / instance_id / "crawler.json").read_text())
        except (OSError, ValueError):
            return KillResult(True, "local", "no crawler running")
        if info.get("site") != site or int(info.get("attempt", -1)) != attempt:
            return KillResult(True, "local", f"crawler runs {info.get('site')} attempt {info.get('attempt')}")
        pid, pgid = int(info["pid"]), int(info["pgid"])
        if not procs.pid_alive(pid, info.get("start_ticks")):
            return KillResult(True, "local", "crawler already exited")
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return KillResult(True, "local", "crawler already exited")
        except PermissionError as e:
            return KillResult(False, "local", str(e))
        end = time.monotonic() + self.wait_s
        while procs.pid_alive(pid) and time.monotonic() < end:
            time.sleep(0.05)
        if procs.pid_alive(pid):
            return KillResult(False, "local", "crawler survived SIGKILL")
        return KillResult(True, "local", f"killed process group {pgid}")
