"""Node control: how the hub stops a crawl on a node (the middle rungs of the kill ladder).

The node's own watchdog is the first rung and `ComputeProvider.terminate` the
last; a NodeControl tries what lies between and says which path worked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class KillResult:
    ok: bool  # the crawl is no longer running (killed now, or already gone)
    path: str  # which path did it: local | ssm | ssh
    detail: str = ""


class NodeControl(Protocol):
    def kill(self, instance_id: str, site: str, attempt: int) -> KillResult: ...
