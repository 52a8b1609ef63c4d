"""What the hub sees at one tick, and what it has observed over time.

A `Snapshot` is rebuilt every tick from the table, the provider and the queue:
nothing the hub decides on lives only in memory. The one exception is
`Observations`: when the hub first saw each value it watches (a site's
lastUpdateEpoch, a heartbeat, an instance). Hangs and lost nodes are measured
on the hub's own clock from those moments, never by comparing another host's
epoch with ours. A restarted hub starts them afresh, which can only delay a
kill, never cause a false one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from fleet.codec import NodeInfo, RunInfo
from fleet.queue import QueueDepth
from fleet.state import RunStatus, SiteRecord

LIVE_STATES = frozenset({"pending", "running"})


@dataclass(frozen=True)
class Instance:
    id: str
    state: str  # pending | running | shutting-down | stopping | stopped | terminated
    role: str = "node"
    tags: Mapping[str, str] = field(default_factory=dict)
    instance_type: str | None = None
    interrupted: bool = False  # EC2 reclaimed it (spot interruption)

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


@dataclass(frozen=True)
class Seen:
    value: Any
    since: float  # hub clock


def _seen(prev: Mapping[str, Seen], key: str, value: Any, now: float) -> Seen:
    old = prev.get(key)
    return old if old is not None and old.value == value else Seen(value, now)


@dataclass(frozen=True)
class Observations:
    progress: Mapping[str, Seen] = field(default_factory=dict)  # site -> (attempt, site_status, lastUpdateEpoch)
    heartbeat: Mapping[str, Seen] = field(default_factory=dict)  # site -> (attempt, heartbeatEpoch)
    unsent: Mapping[str, Seen] = field(default_factory=dict)  # QUEUED site without its message -> version
    node_beat: Mapping[str, Seen] = field(default_factory=dict)  # instance -> node item heartbeat (None = none yet)


def observe(prev: Observations, sites: Mapping[str, SiteRecord], nodes: Mapping[str, NodeInfo],
            instances: Mapping[str, Instance], now: float) -> Observations:
    progress, heartbeat, unsent, node_beat = {}, {}, {}, {}
    for name, r in sites.items():
        if r.run_status is RunStatus.RUN:
            progress[name] = _seen(prev.progress, name, (r.attempt, r.site_status, r.last_update), now)
            heartbeat[name] = _seen(prev.heartbeat, name, (r.attempt, r.heartbeat), now)
        elif r.run_status is RunStatus.QUEUED and not r.enqueued:
            unsent[name] = _seen(prev.unsent, name, r.version, now)
    for iid, inst in instances.items():
        if inst.live:
            n = nodes.get(iid)
            node_beat[iid] = _seen(prev.node_beat, iid, n.heartbeat if n else None, now)
    return Observations(progress, heartbeat, unsent, node_beat)


@dataclass(frozen=True)
class Snapshot:
    run_id: str
    run: RunInfo | None
    sites: Mapping[str, SiteRecord]
    nodes: Mapping[str, NodeInfo]
    instances: Mapping[str, Instance]
    obs: Observations
    queue: QueueDepth | None = None

    @property
    def live_instances(self) -> list[Instance]:
        return [i for i in self.instances.values() if i.live and i.role == "node"]

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in RunStatus}
        for r in self.sites.values():
            out[r.run_status.value] += 1
        return out
