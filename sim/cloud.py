"""The simulated cloud: EC2 and SSM on virtual time, for `gridfleet simulate`.

`VirtualCloud` is a ComputeProvider on virtual time: instances boot after a
random delay, launches can fail for lack of capacity (per instance type, as
EC2 answers InsufficientInstanceCapacity), spot instances are reclaimed at a
rate with EC2's two-minute notice, and every instance is billed from launch
to termination (at least 60 s, as EC2 bills Linux). Each instance runs a
`SimNode` (`sim.node`).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence

from hub.control.base import KillResult
from hub.providers.base import LaunchResult
from hub.snapshot import Instance
from sim.model import VInstance
from sim.node import SimNode
from sim.world import World

SPOT_NOTICE_S = 120.0  # EC2's interruption notice
SHUTDOWN_S = 5.0  # from `shutdown -h now` to terminated


class VirtualCloud:
    """EC2 for the simulator (see the module doc)."""

    def __init__(self, sim: World, rng: random.Random):
        self.sim = sim
        self.rng = rng
        self.instances: dict[str, VInstance] = {}
        self._ids = itertools.count(1)
        self.run_instances_calls = 0
        self._listed: dict[str, Instance] = {}  # each instance as last listed (an Instance is frozen)
        self.changes = 0  # launches and changes of state so far (`changed`)
        self._list: tuple[int, float, list[Instance]] | None = None  # the last list: at which changes, until when

    # --- ComputeProvider ---------------------------------------------------------------
    def list(self, run_id: str) -> list[Instance]:
        """The run's instances, a terminated one for an hour after it ended (as DescribeInstances shows them). The
        list is made again only when an instance changed or one ended an hour ago."""
        now = self.sim.engine.now
        if self._list is not None and self._list[0] == self.changes and now < self._list[1]:
            return list(self._list[2])
        out, listed, expires = [], self._listed, math.inf
        for v in self.instances.values():
            if v.state == "terminated":
                gone_at = (v.ended_at or 0) + 3600
                if now >= gone_at:
                    continue
                expires = min(expires, gone_at)
            seen = listed.get(v.id)
            if seen is None or seen.state != v.state or seen.interrupted != v.interrupted:
                seen = listed[v.id] = Instance(v.id, v.state, "node", {}, v.instance_type, v.interrupted)
            out.append(seen)
        self._list = (self.changes, expires, out)
        return list(out)

    def changed(self) -> None:
        """An instance was launched or changed its state."""
        self.changes += 1

    def launch(self, run_id: str, count: int, target: int | None = None) -> LaunchResult:
        p, fleet = self.sim.params, self.sim.config.fleet
        if target is not None:
            live = sum(1 for v in self.instances.values() if v.state in ("pending", "running"))
            count = min(count, max(0, target - live))
        launched: list[str] = []
        errors: list[str] = []
        markets = [True, False] if fleet.spot and fleet.on_demand_fallback else [fleet.spot]
        for spot in markets:
            for itype in fleet.instance_types:
                if len(launched) >= count:
                    break
                self.run_instances_calls += 1
                if self.rng.random() < p.capacity_error_rate:
                    errors.append(f"InsufficientInstanceCapacity: no {itype} ({'spot' if spot else 'on-demand'})")
                    continue
                for _ in range(count - len(launched)):
                    launched.append(self._start(itype, spot))
        return LaunchResult(tuple(launched), tuple(errors) if not launched else ())

    def terminate(self, instance_ids: Sequence[str]) -> None:
        for iid in instance_ids:
            self.end(iid)

    def hub_alive(self, hub_id: str) -> bool:
        return True

    # --- the instances' lives -------------------------------------------------------------
    def _start(self, itype: str, spot: bool) -> str:
        now, p = self.sim.engine.now, self.sim.params
        iid = f"i-{next(self._ids):06d}"
        boot = max(5.0, self.rng.gauss(p.boot_s, p.boot_s * 0.15))
        v = VInstance(iid, itype, now, boot, spot)
        self.instances[iid] = v
        self.changed()
        v.node = SimNode(self.sim, v)
        self.sim.engine.at(now + boot, v.node.boot)
        if spot and p.spot_per_hour > 0:
            reclaim = now + self.rng.expovariate(p.spot_per_hour / 3600.0)
            v.notice_at = reclaim - SPOT_NOTICE_S
            self.sim.engine.at(v.notice_at, v.node.spot_notice_arrives)
            self.sim.engine.at(reclaim, lambda: self.end(iid, interrupted=True))
        return iid

    def end(self, iid: str, interrupted: bool = False) -> None:
        v = self.instances.get(iid)
        if v is None or v.state == "terminated":
            return
        v.state, v.ended_at = "terminated", self.sim.engine.now
        v.interrupted = v.interrupted or interrupted
        self.changed()
        if v.node is not None:
            v.node.dead = True

    def shutdown(self, iid: str) -> None:
        """The node shut its instance down (it ran dry, or after a spot notice)."""
        v = self.instances[iid]
        if v.state != "terminated":
            v.state = "shutting-down"
            self.changed()
            self.sim.engine.at(self.sim.engine.now + SHUTDOWN_S, lambda: self.end(iid))


class SimControl:
    """The kill ladder's first rung (SSM) reaching a simulated node: it always gets through."""

    def __init__(self, cloud: VirtualCloud):
        self.cloud = cloud

    def kill(self, instance_id: str, site: str, attempt: int) -> KillResult:
        v = self.cloud.instances.get(instance_id)
        if v is None or v.state == "terminated" or v.node is None:
            return KillResult(True, "ssm", "instance gone")
        v.node.crawler_killed(site, attempt)
        return KillResult(True, "ssm")
