"""Kill a crawl on a local instance: signal the crawler's process group.

The local twin of the command that SSM or SSH runs on an EC2 node (`gridfleet
node kill`): both read the node's `crawler.json` (see `fleet.crawl.crawlerfile`). The
agent notices its crawler died and closes the browser session itself.
"""

from __future__ import annotations

from pathlib import Path

from fleet import procs
from fleet.crawl import crawlerfile
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
        k = crawlerfile.kill(self.dir / instance_id, site, attempt, self.wait_s)
        return KillResult(k.ok, "local", k.detail)
