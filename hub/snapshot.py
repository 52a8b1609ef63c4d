"""What the hub sees at one tick, and what it has observed over time.

A `Snapshot` is rebuilt every tick from the table, the provider and the queue:
nothing the hub decides on lives only in memory. `SiteCache` keeps that read
proportional to the sites that can still change: after one full read it asks
the table only for the stamps of the open (QUEUED or RUN) sites and fetches
the records whose stamp moved; a terminal site never changes again (an
operator's rerun reopens it, and it shows up open again). The exception to
"nothing in memory" is `Observations`: when the hub first saw each value it watches (a site's
lastUpdateEpoch, a heartbeat, an instance). Hangs and lost nodes are measured
on the hub's own clock from those moments, never by comparing another host's
epoch with ours. A restarted hub starts them afresh, which can only delay a
kill, never cause a false one. Nothing here loads an AWS client: `plan()`
imports this module and must run without boto3.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Iterable, Iterator, Mapping, MutableSet
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from fleet.record.codec import as_seeded
from fleet.record.instance import Instance
from fleet.record.messages import QueueDepth
from fleet.record.partition import NodeInfo, RunInfo
from fleet.record.readback import Notes, UnreadableItem
from fleet.record.stamp import TRANSITION_FIELDS, Stamp, patch_from_stamp, patchable, record_stamp
from fleet.record.state import RunStatus, SiteRecord, SiteStatus
from hub.actions import Ending


@dataclass(frozen=True)
class Seen:
    value: Any
    since: float  # hub clock


def _seen(prev: Mapping[str, Seen], key: str, value: Any, now: float) -> Seen:
    old = prev.get(key)
    return old if old is not None and old.value == value else Seen(value, now)


#: A node's signs of life as the hub last read them: (its node item's heartbeat, the newest heartbeat it wrote on
#: any site record: its claims, its attempts' beats and checkpoints). `NO_SIGN` until it shows either.
NodeSigns = tuple[Any, Any]
NO_SIGN: NodeSigns = (None, None)


@dataclass(frozen=True)
class Observations:
    progress: Mapping[str, Seen] = field(default_factory=dict)  # site -> (attempt, site_status, lastUpdateEpoch)
    heartbeat: Mapping[str, Seen] = field(default_factory=dict)  # site -> (attempt, heartbeatEpoch)
    unsent: Mapping[str, Seen] = field(default_factory=dict)  # QUEUED site without its message -> version
    node_beat: Mapping[str, Seen] = field(default_factory=dict)  # instance -> its NodeSigns (NO_SIGN: none yet)


def held(r: SiteRecord) -> bool:
    """A site whose first message the hub has not sent yet: QUEUED, never sent, never attempted (a metered queue
    holds most sites so until it feeds them; otherwise only a seeding the hub did not finish leaves one)."""
    return r.run_status is RunStatus.QUEUED and not r.enqueued and not r.attempts


def watched(r: SiteRecord) -> bool:
    """The sites the hub looks at one by one each tick: running ones, and QUEUED ones whose message for a next
    attempt is not sent (held sites apart: see `held`)."""
    return r.run_status is RunStatus.RUN or (r.run_status is RunStatus.QUEUED and not r.enqueued and bool(r.attempts))


def site_beats(records: Iterable[SiteRecord]) -> dict[str, float]:
    """Each node's newest heartbeat on any of `records` (only the node that holds an attempt writes its
    `heartbeatEpoch`: at the claim, each beat and checkpoint, and just before its result)."""
    out: dict[str, float] = {}
    for r in records:
        if r.instance_id and r.heartbeat is not None and r.heartbeat > out.get(r.instance_id, float("-inf")):
            out[r.instance_id] = r.heartbeat
    return out


def observe(
    prev: Observations,
    sites: Mapping[str, SiteRecord],
    nodes: Mapping[str, NodeInfo],
    instances: Mapping[str, Instance],
    now: float,
    watch: Iterable[str] | None = None,
    beats: Mapping[str, float] | None = None,
    held: Iterable[str] = (),
) -> Observations:
    """What changed since `prev`, timed by the hub's clock. A node is seen alive whenever any of its signs moves:
    its node item, or a heartbeat it wrote on a site record (`beats`, else found in `sites`), so a node that was
    busy longer than heartbeat_timeout_s and has just finished one site and claimed the next is alive whichever
    of those writes this tick's reads caught."""
    if beats is None:
        beats = site_beats(sites.values())
    progress, heartbeat, unsent, node_beat = {}, {}, {}, {}
    for name in watch if watch is not None else sites:
        r = sites[name]
        if r.run_status is RunStatus.RUN:
            progress[name] = _seen(prev.progress, name, (r.attempt, r.site_status, r.last_update), now)
            heartbeat[name] = _seen(prev.heartbeat, name, (r.attempt, r.heartbeat), now)
        elif r.run_status is RunStatus.QUEUED and not r.enqueued:
            unsent[name] = _seen(prev.unsent, name, r.version, now)
    for name in held:  # how long each has waited unsent: only a hub that does not meter its queue asks
        unsent[name] = _seen(prev.unsent, name, sites[name].version, now)
    for iid, inst in instances.items():
        if inst.live:
            n = nodes.get(iid)
            node_beat[iid] = _seen(prev.node_beat, iid, (n.heartbeat if n else None, beats.get(iid)), now)
    return Observations(progress, heartbeat, unsent, node_beat)


def observe_changes(
    prev: Observations,
    sites: Mapping[str, SiteRecord],
    changed: Iterable[str],
    watch: Collection[str],
    nodes: Mapping[str, NodeInfo],
    instances: Mapping[str, Instance],
    now: float,
    beats: Mapping[str, float],
    held: Iterable[str] = (),
    moved: Collection[str] | None = None,
) -> Observations:
    """`observe` by delta, for the hub's site cache: only the sites whose records changed since `prev` (`changed`)
    are looked at again (a record that did not change shows the same values, first seen when they were), and only
    the instances in `moved` (those whose node item, state or newest heartbeat on a record may have moved; None:
    every one); `prev`'s maps are taken over and changed in place. Its result is what `observe` gives (the tests
    hold it to that)."""
    progress, heartbeat, unsent = (
        m if isinstance(m, dict) else dict(m) for m in (prev.progress, prev.heartbeat, prev.unsent)
    )
    for name in held:  # how long each has waited unsent: only a hub that does not meter its queue asks
        unsent[name] = _seen(unsent, name, sites[name].version, now)
    for name in changed:
        r = sites[name]
        if name in watch and r.run_status is RunStatus.RUN:
            progress[name] = _seen(progress, name, (r.attempt, r.site_status, r.last_update), now)
            heartbeat[name] = _seen(heartbeat, name, (r.attempt, r.heartbeat), now)
            unsent.pop(name, None)
            continue
        progress.pop(name, None)
        heartbeat.pop(name, None)
        if name in watch:  # QUEUED, its message for a next attempt not sent
            unsent[name] = _seen(unsent, name, r.version, now)
        elif name not in held:
            unsent.pop(name, None)
    node_beat = prev.node_beat if isinstance(prev.node_beat, dict) and moved is not None else {}
    before = prev.node_beat
    for iid in moved if moved is not None else instances:
        inst = instances.get(iid)
        if inst is None or not inst.live:
            node_beat.pop(iid, None)
            continue
        n = nodes.get(iid)
        value = (n.heartbeat if n else None, beats.get(iid))
        old = before.get(iid)
        node_beat[iid] = old if old is not None and old.value == value else Seen(value, now)
    return Observations(progress, heartbeat, unsent, node_beat)


class NodeMoves:
    """The instances whose signs may have moved since the last tick (`observe_changes`' `moved`): a node item
    written again, an instance new, gone or in another state, a record of theirs changed. Finding them costs a
    comparison of each node item and instance by identity (the simulator's and the memory table's are the same
    objects until they change), else by value."""

    def __init__(self) -> None:
        self._nodes: Mapping[str, NodeInfo] = {}
        self._instances: Mapping[str, Instance] = {}

    def since_last(
        self, nodes: Mapping[str, NodeInfo], instances: Mapping[str, Instance], cache: SiteCache
    ) -> set[str]:
        out: set[str] = set()
        seen_nodes, seen_instances = self._nodes, self._instances
        for iid, n in nodes.items():
            was = seen_nodes.get(iid)
            if was is not n and (was is None or was.heartbeat != n.heartbeat):
                out.add(iid)
        for iid, inst in instances.items():
            was_i = seen_instances.get(iid)
            if was_i is not inst and (was_i is None or was_i.state != inst.state):
                out.add(iid)
        out.update(iid for iid in seen_instances if iid not in instances)
        sites = cache.sites
        for name in cache.changed:
            holder = sites[name].instance_id
            if holder:
                out.add(holder)
        self._nodes, self._instances = nodes, instances  # (the hub makes both afresh each tick)
        return out


@dataclass(frozen=True)
class Snapshot:
    run_id: str
    run: RunInfo | None
    sites: Mapping[str, SiteRecord]
    nodes: Mapping[str, NodeInfo]
    instances: Mapping[str, Instance]
    obs: Observations
    queue: QueueDepth | None = None  # read while the run is ending (None: not read)
    watch: Collection[str] | None = None  # the watched sites (see `watched`); None: found from `sites`
    hold: Collection[str] | None = None  # the held sites (see `held`); None: found from `sites`
    tally: Mapping[str, int] | None = None  # sites per run status; None: counted from `sites`
    unseen: Collection[str] | None = None  # configured sites not read yet (none: every one is in `sites`)
    # The watched sites that can need something now (`hub.loop.Attention`); None: every one. With node watchdogs,
    # a running site whose record and node did not change needs nothing before its `recheck_at`.
    attend: Collection[str] | None = None
    busy: Collection[str] | None = None  # instances holding a RUN site; None: found from `sites`
    saving: Collection[str] | None = None  # RUN sites SAVED (`SiteCache.saving`); None: found from `sites`
    retrying: Collection[str] | None = None  # watched QUEUED sites (message not sent); None: found from `sites`
    expected: Mapping[str, float] = field(default_factory=dict)  # site -> seconds its last successful crawl took
    ending: Ending | None = None  # the run is being ended (decided by an earlier plan, or a teardown request)
    #: Configured sites whose record a hub seeded but no one can read now (`fleet.record.readback`): the hub repairs
    #: them.
    repairs: Mapping[str, UnreadableItem] = field(default_factory=dict)

    @cached_property
    def live_instances(self) -> list[Instance]:
        return [i for i in self.instances.values() if i.live and i.role == "node"]

    @cached_property
    def watched(self) -> list[str]:
        """The watched sites in name order (the order the plan handles them in)."""
        if self.watch is not None:
            return sorted(self.watch)
        return sorted(n for n, r in self.sites.items() if watched(r))

    @cached_property
    def held(self) -> Collection[str]:
        """The held sites (see `held`): the cache's `RankedSet`, or found from `sites`."""
        if self.hold is not None:
            return self.hold
        return frozenset(n for n, r in self.sites.items() if held(r))

    @cached_property
    def saved(self) -> int:
        """RUN sites whose node staged their result (SAVED): open until the hub makes it theirs, but no node's work."""
        if self.saving is not None:
            return len(self.saving)
        return sum(
            1 for r in self.sites.values() if r.run_status is RunStatus.RUN and r.site_status is SiteStatus.SAVED
        )

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in RunStatus}
        if self.tally is not None:
            out.update(self.tally)
            return out
        for r in self.sites.values():
            out[r.run_status.value] += 1
        return out


class RankedSet(MutableSet[str]):
    """A set of site names that also gives its first few by a rank, kept by delta: each name on a heap under its
    rank, a name that left dropped when the heap meets it. `first(n, rank)` costs in proportion to `n` and to the
    names that left since, not to the set's size (the metered feed asks it each tick of a 100,000-site run)."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._names: set[str] = set(names)
        self._rank: Mapping[str, int] | None = None
        self._heap: list[tuple[int, str]] = []

    def add(self, name: str) -> None:
        if name not in self._names:
            self._names.add(name)
            if self._rank is not None:
                heapq.heappush(self._heap, (self._rank[name], name))

    def discard(self, name: str) -> None:
        self._names.discard(name)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __len__(self) -> int:
        return len(self._names)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def first(self, n: int, rank: Mapping[str, int]) -> list[str]:
        """The `n` names of least `rank` (then by name), in that order. A new `rank` (another mapping) ranks anew."""
        if rank is not self._rank:
            self._rank = rank
            self._heap = [(rank[x], x) for x in self._names]
            heapq.heapify(self._heap)
        out: list[tuple[int, str]] = []
        names, heap = self._names, self._heap
        while heap and len(out) < n:
            entry = heapq.heappop(heap)
            if entry[1] in names and (not out or out[-1] != entry):  # a name back again is on the heap twice
                out.append(entry)
        for entry in out:
            heapq.heappush(heap, entry)
        return [name for _, name in out]


class SiteCache:
    """The hub's copy of a run's site records, refreshed by reading only what can have changed.

    The first refresh reads the whole partition; each later one reads the stamps of the open sites (one
    paginated Query of the sparse index, see `fleet.record.codec.STAMP_ATTRS`) and fetches, in batches, the
    records that went through a transition, are new, or left the index (they became terminal). A stamp
    that moved only by a node's progress, heartbeat or the enqueued mark is patched without a read.
    Sites as seeded are not in that Query (`fleet.record.codec.HELD_PREFIX`): nobody but the hub's feed moves one
    on, and the sites the hub itself wrote are named to `recheck`, so a tick costs what is crawled and
    queued, however many sites wait their turn.
    """

    def __init__(self) -> None:
        self.sites: dict[str, SiteRecord] = {}
        self.watch: set[str] = set()
        self.held = RankedSet()  # see `held`
        self.open: set[str] = set()  # not terminal, and in the Query of open stamps (not as seeded)
        self.seeded: set[str] = set()  # open, and as seeded: not in that Query (`fleet.record.codec.as_seeded`)
        self.rechecks: set[str] = set()  # sites as seeded the hub wrote: read by name at the next refresh
        self.stamps: dict[str, Stamp] = {}  # the stamp of each cached open record
        self.tally: dict[str, int] = {s.value: 0 for s in RunStatus}
        self.loaded = False
        self.unseen: set[str] = set()  # sites the run should have that the cache has not read yet
        self.fetched = 0  # records read by the last refresh (for tests and the simulator)
        self.changed: set[str] = set()  # sites whose records the last load or refresh put (`observe_changes`)
        self.by_instance: dict[str, set[str]] = {}  # instance -> the RUN sites it holds (none: not there)
        self.retrying: set[str] = set()  # watched sites QUEUED: their message for a next attempt not sent
        self.saving: set[str] = set()  # RUN sites SAVED: their node staged the result and moved on (no node needed)
        self.beats: dict[str, float] = {}  # node -> the newest heartbeat it wrote on any cached record
        self.names: frozenset[str] | None = None  # the run's sites (`expect`); None: any site read
        #: Sites of the run whose item a hub seeded but the last read of it could not read: the hub repairs them.
        self.quarantined: dict[str, UnreadableItem] = {}

    def _put(self, r: SiteRecord) -> None:
        self.changed.add(r.site)
        was = self.sites.get(r.site)
        if was is not None and was.instance_id and was.run_status is RunStatus.RUN:
            holds = self.by_instance.get(was.instance_id)
            if holds is not None:
                holds.discard(r.site)
                if not holds:
                    del self.by_instance[was.instance_id]
        if r.instance_id and r.run_status is RunStatus.RUN:
            self.by_instance.setdefault(r.instance_id, set()).add(r.site)
        if r.run_status is RunStatus.QUEUED and watched(r):
            self.retrying.add(r.site)
        else:
            self.retrying.discard(r.site)
        if r.run_status is RunStatus.RUN and r.site_status is SiteStatus.SAVED:
            self.saving.add(r.site)
        else:
            self.saving.discard(r.site)
        if r.instance_id and r.heartbeat is not None and r.heartbeat > self.beats.get(r.instance_id, float("-inf")):
            self.beats[r.instance_id] = r.heartbeat
        old = self.sites.get(r.site)
        if old is not None:
            self.tally[old.run_status.value] -= 1
        self.sites[r.site] = r
        self.tally[r.run_status.value] += 1
        if watched(r):
            self.watch.add(r.site)
        else:
            self.watch.discard(r.site)
        if held(r):
            self.held.add(r.site)
        else:
            self.held.discard(r.site)
        if r.is_terminal:
            self.open.discard(r.site)
            self.seeded.discard(r.site)
            self.stamps.pop(r.site, None)
        elif as_seeded(r):
            self.open.discard(r.site)
            self.seeded.add(r.site)
            self.stamps[r.site] = record_stamp(r)
        else:
            self.open.add(r.site)
            self.seeded.discard(r.site)
            self.stamps[r.site] = record_stamp(r)

    def expect(self, names: Iterable[str]) -> None:
        """The sites of the run: one created and finished between two reads never shows up open, so any the
        cache has not seen yet is read by name."""
        self.names = frozenset(names)
        self.unseen = {n for n in self.names if n not in self.sites}

    def load(self, records: Iterable[SiteRecord], notes: Notes | None = None) -> None:
        """A full read (the first tick, or a restarted hub); `notes`: what it could not read."""
        self.sites, self.watch, self.held, self.open, self.stamps, self.beats = {}, set(), RankedSet(), set(), {}, {}
        self.seeded, self.rechecks, self.changed, self.by_instance, self.retrying = set(), set(), set(), {}, set()
        self.saving = set()
        self.tally = {s.value: 0 for s in RunStatus}
        n = 0
        for r in records:
            if self.names is None or r.site in self.names:  # a record of a site no longer configured is not the run's
                self._put(r)
                n += 1
        self.unseen.difference_update(self.sites)
        self.quarantined = {}
        self._quarantine(notes, ())
        self.loaded, self.fetched = True, n

    def _quarantine(self, notes: Notes | None, fetched: Iterable[str]) -> None:
        """Keep the run's seeded sites that the read could not read (a record read back whole is one no longer)."""
        for name in fetched:
            if name in self.sites:
                self.quarantined.pop(name, None)
        for name, bad in (notes.quarantined if notes is not None else {}).items():
            if (self.names is None or name in self.names) and "spec" in (bad.raw or {}):
                self.quarantined[name] = bad
                self._drop(name)

    def set_apart(self, name: str, why: UnreadableItem) -> None:
        """A record the hub cannot take as it reads (`hub.loop`: a completion no hub made): repaired like one no one
        can read."""
        self.quarantined[name] = why
        self._drop(name)

    def _drop(self, name: str) -> None:
        """Forget a site's record (it can no longer be read): the plan repairs it instead of acting on a copy."""
        r = self.sites.pop(name, None)
        if r is None:
            return
        self.tally[r.run_status.value] -= 1
        for group in (self.watch, self.held, self.open, self.seeded, self.retrying, self.changed, self.saving):
            group.discard(name)
        self.stamps.pop(name, None)
        if r.instance_id and name in self.by_instance.get(r.instance_id, ()):
            self.by_instance[r.instance_id].discard(name)
            if not self.by_instance[r.instance_id]:
                del self.by_instance[r.instance_id]

    def refresh(self, stamps: Mapping[str, Stamp], fetch) -> None:
        """Bring the cache up to date from the open sites' `stamps`; `fetch(names, notes)` reads whole records
        (those it cannot read go into `notes`). A stamp of a site the run does not have (an item a node made) is
        not looked at: what a node writes never makes the hub read more than its own sites."""
        self.changed = set()
        if self.names is not None:
            stamps = {n: st for n, st in stamps.items() if n in self.names}
        need: list[str] = []
        own = self.stamps
        for name in [n for n, st in stamps.items() if own.get(n) != st]:
            st, mine = stamps[name], own.get(name)
            if mine is not None and mine[:TRANSITION_FIELDS] == st[:TRANSITION_FIELDS] and patchable(st):
                old = self.sites[name]
                new = patch_from_stamp(old, st)  # progress, a heartbeat, the enqueued mark
                if old.run_status is RunStatus.RUN:  # still RUN, on the same node: only what a beat moves
                    self.sites[name], self.stamps[name] = new, st
                    self.changed.add(name)
                    if new.heartbeat is not None and new.heartbeat > self.beats.get(new.instance_id or "", -math.inf):
                        self.beats[new.instance_id or ""] = new.heartbeat
                else:
                    self._put(new)
            else:
                need.append(name)
        need.extend(n for n in self.open if n not in stamps)  # closed since the last read
        need.extend(n for n in self.unseen if n not in stamps)
        need.extend(n for n in self.rechecks if n in self.seeded and n not in stamps)  # the hub ended it, say
        need.extend(n for n in self.quarantined if n not in need)  # repaired, or made whole by its node since
        self.rechecks.clear()
        notes = Notes()
        for r in fetch(need, notes) if need else ():
            self._put(r)
        self._quarantine(notes, need)
        if self.unseen:
            self.unseen.difference_update(self.sites)
        self.fetched = len(need)

    def recheck(self, names: Iterable[str]) -> None:
        """Sites the hub wrote: one as seeded that is no longer so, and not open either (ended by the hub's own
        write), is in no Query of stamps, so the next refresh reads it by name."""
        self.rechecks.update(n for n in names if n in self.seeded)
