"""Which watched sites the plan looks at in a tick: those that can need something now, not every one running.

With node watchdogs on, a running site needs the hub only when its record moved (a claim, a step, a kill mark,
an end), when its node's instance changed (reclaimed, terminated), or when its own clock ran out (`recheck_at`:
a navigation unchanged for longer than a hang, a heartbeat older than its timeout). `Attention` keeps those
clocks on a heap (a site past its clock is looked at every tick until it moves), so a tick looks at what changed
and what fell due, and costs that, not the fleet's size: at 5,000 nodes most running sites are only beating.
Sites QUEUED without their message are looked at every tick (they are few, and their grace and backoff wake the
hub), and so is each site an action was taken for (whether it took is seen on the next look). Without node
watchdogs the plan looks at every watched site, as before.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from fleet.config import Config
from fleet.record.instance import Instance
from fleet.record.state import RunStatus
from hub.plan.attempts import recheck_at
from hub.snapshot import Observations, SiteCache


class Attention:
    def __init__(self) -> None:
        self._due: list[tuple[float, str]] = []  # (recheck_at, site) of running sites, some out of date
        self._at: dict[str, float] = {}  # each running site's latest recheck_at (an entry of another is stale)
        self._queued: set[str] = set()  # watched sites QUEUED without their message
        self._acted: set[str] = set()  # sites the last plan acted on
        self._overdue: set[str] = set()  # running sites past their recheck_at: looked at each tick until they move
        self._instances: dict[str, Instance] = {}  # each instance as last seen

    def sites(
        self, cache: SiteCache, obs: Observations, instances: Mapping[str, Instance], now: float, config: Config
    ) -> frozenset[str]:
        """The watched sites to look at now (call after `observe_changes` of the same tick)."""
        watch, sites = cache.watch, cache.sites
        attend: set[str] = set()
        for name in cache.changed:
            self._overdue.discard(name)
            if name not in watch:
                self._queued.discard(name)
                self._at.pop(name, None)
                continue
            attend.add(name)
            r = sites[name]
            if r.run_status is RunStatus.RUN:
                self._queued.discard(name)
                at = self._at[name] = recheck_at(obs, r, config)
                heapq.heappush(self._due, (at, name))
            else:
                self._at.pop(name, None)
                self._queued.add(name)
        for iid in self._instances_changed(instances):
            attend.update(cache.by_instance.get(iid, ()))
        due = self._due
        while due and due[0][0] <= now:
            at, name = heapq.heappop(due)
            if self._at.get(name) == at:  # else an entry of an older record of the site: stale
                self._overdue.add(name)
        self._overdue.intersection_update(watch)
        attend.update(self._overdue)
        attend.update(self._queued)
        attend.update(self._acted)
        return frozenset(n for n in attend if n in watch)

    def acted(self, sites: Iterable[str]) -> None:
        """The sites this tick's actions were for: looked at again next tick."""
        self._acted = set(sites)

    def _instances_changed(self, instances: Mapping[str, Instance]) -> list[str]:
        seen, out = self._instances, []
        for iid, inst in instances.items():
            was = seen.get(iid)
            if was is not inst and (was is None or (was.state, was.interrupted) != (inst.state, inst.interrupted)):
                out.append(iid)
            seen[iid] = inst
        for iid in [i for i in seen if i not in instances]:
            del seen[iid]
            out.append(iid)
        return out
