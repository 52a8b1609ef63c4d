"""In-memory stand-ins for the state table, the queue and the result store.

They keep the same contracts as the AWS adapters (conditional writes, visibility
timeouts, receive counts and the DLQ, write-once results); the contract suite in
tests/adapter runs against both so they stay faithful. Unit tests and the
simulator use them; they are never used to run a real crawl. The queue is the
simulator's own (`sim.queue`): one model of SQS for both.
"""

from __future__ import annotations

import bisect
import copy
import threading
from collections.abc import Iterable, Sequence
from typing import Any, Unpack

from fleet.crawl.pacing import PACING_PARTITION_PREFIX, pacing_section
from fleet.errors import StaleWrite
from fleet.outputs.results import EXISTED, MISSING, PROMOTED, RESULT_MAX_BYTES, TOO_LARGE, aside_key, is_result_key
from fleet.record.codec import HELD_PREFIX, MARKS_PARTITION, OPEN_ATTR, item_to_site, num, site_to_item, site_update
from fleet.record.partition import (
    NODE_PREFIX,
    RUN_ITEM,
    RUNS_PARTITION,
    HistoryEvent,
    NodeInfo,
    RunInfo,
    history_to_item,
    hub_partition,
    item_to_run,
    node_to_item,
    run_to_item,
    split_partition,
)
from fleet.record.readback import Notes, UnreadableItem
from fleet.record.run_item import HUB_STARTS, RunExpect, RunFields, RunWatch, WatchFields, assign, holds, item_to_watch
from fleet.record.stamp import Stamp, item_stamp
from fleet.record.state import RunState, SiteRecord
from fleet.record.table import REPAIR_FENCE, RunIndexEntry, RunRows, mark_of, nodes_of, runs_of
from sim.queue import MemoryQueue

__all__ = ["MemoryQueue", "MemoryResults", "MemoryStateTable"]


_ABSENT = object()


def _site_or_none(item: dict[str, Any] | None) -> SiteRecord | None:
    """A site item as read back, None when there is none or none that can be read (as `DynamoStateTable`)."""
    if not item:
        return None
    try:
        return item_to_site(item)  # decoding builds new objects: nothing shared with the store
    except UnreadableItem as e:
        Notes().item(e)
        return None


class MemoryStateTable:
    def __init__(self) -> None:
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._open: dict[str, dict[str, Stamp]] = {}  # the sparse index `open` below HELD_PREFIX: run -> site -> stamp
        self._held: dict[str, set[str]] = {}  # the index's held range: run -> sites as seeded
        self._nodes: dict[str, set[str]] = {}  # run -> node item keys (a begins_with Query)
        self.last_write: tuple[tuple[str, str], dict[str, Any], list[str]] | None = None  # for the simulator's meter
        self._node_keys: dict[str, list[str]] = {}  # run -> its node item keys, sorted
        self._node_info: dict[tuple[str, str], NodeInfo] = {}  # each node item as read back (decoded once per write)

    def _index(self, run_id: str, site: str, item: dict[str, Any]) -> None:
        key = item.get(OPEN_ATTR)
        if key is not None and not key.startswith(HELD_PREFIX):
            self._open.setdefault(run_id, {})[site] = item_stamp(item)
        else:
            self._open.get(run_id, {}).pop(site, None)
        if key is not None and key.startswith(HELD_PREFIX):
            self._held.setdefault(run_id, set()).add(site)
        else:
            self._held.get(run_id, set()).discard(site)

    def create_site(self, rec: SiteRecord) -> bool:
        with self._lock:
            key = (rec.run_id, rec.site)
            if key in self.items and "spec" in self.items[key]:  # one no hub seeded is taken over (as on DynamoDB)
                return False
            self.items[key] = site_to_item(rec)
            self._index(rec.run_id, rec.site, self.items[key])
            return True

    def get_marks(self, sites: Iterable[str]) -> dict[str, tuple[str, ...]]:
        out = {}
        for s in sites:
            item = self.items.get((MARKS_PARTITION, s))
            if item is not None:
                out[s] = mark_of(item)
        return out

    def put_mark(self, site: str, mark: tuple[str, ...], run_id: str, at: float) -> None:
        with self._lock:
            self.items[(MARKS_PARTITION, site)] = {
                "run_id": MARKS_PARTITION,
                "Site": site,
                "mark": list(mark),
                "run": run_id,
                "at": at,
            }

    def get_site(self, run_id: str, site: str) -> SiteRecord | None:
        return _site_or_none(self.items.get((run_id, site)))

    def write(self, old: SiteRecord, new: SiteRecord) -> SiteRecord:
        with self._lock:
            key = (old.run_id, old.site)
            cur = self.items.get(key)
            fenced = (
                cur is not None
                and cur.get("version") == num(old.version)
                and cur.get("attemptCount") == num(old.attempt)
                and cur.get("instance_id") == old.instance_id
            )
            if cur is None or not fenced:
                raise StaleWrite(old.run_id, old.site, old.fence(), _site_or_none(copy.deepcopy(cur)) if cur else None)
            sets, removes = site_update(old, new)  # what DynamoDB would SET/REMOVE
            self.last_write = (key, sets, removes)
            cur.update(sets)  # encoded afresh by site_update: nothing in them is shared with a record or a caller
            for k in removes:
                cur.pop(k, None)
            self._index(old.run_id, old.site, cur)
            return new

    def read_run(self, run_id: str) -> RunRows:
        hub = hub_partition(run_id)
        items = [copy.deepcopy(item) for (rid, _), item in sorted(self.items.items()) if rid in (run_id, hub)]
        return RunRows.of(split_partition(items))

    def open_stamps(self, run_id: str) -> dict[str, Stamp]:
        """The stamps of the sites that can still change (QUEUED or RUN) but for those as seeded: the Query of the
        index `open` below HELD_PREFIX."""
        with self._lock:
            return dict(self._open.get(run_id, {}))

    def has_held(self, run_id: str) -> bool:
        return bool(self._held.get(run_id))

    def get_sites(self, run_id: str, sites: Iterable[str], notes: Notes | None = None) -> list[SiteRecord]:
        out = []
        notes = notes if notes is not None else Notes()
        for site in sites:
            item = self.items.get((run_id, site))
            if item is not None:
                try:
                    out.append(item_to_site(item, notes))  # decoding builds new objects: nothing shared with the store
                except UnreadableItem as e:
                    e.raw = copy.deepcopy(e.raw)  # as it was read: the stored item may change under it
                    notes.item(e, site)
        return out

    def repair(self, bad: UnreadableItem, new: SiteRecord) -> bool:
        with self._lock:
            key = (new.run_id, new.site)
            cur, raw = self.items.get(key), bad.raw or {}
            if cur is None or any(cur.get(a, _ABSENT) != raw.get(a, _ABSENT) for a in REPAIR_FENCE):
                return False
            self.items[key] = site_to_item(new)
            self._index(new.run_id, new.site, self.items[key])
            return True

    def stamp_expiry(self, run_id: str, expire_at: int) -> int:
        with self._lock:
            n = 0
            for (rid, _), item in self.items.items():
                if rid in (run_id, PACING_PARTITION_PREFIX + run_id) and "expireAt" not in item:
                    item["expireAt"] = num(expire_at)
                    n += 1
            return n

    def read_nodes(self, run_id: str) -> list[NodeInfo]:
        out = []
        keys = self._node_keys.get(run_id)
        if keys is None:  # sorted again only when a node is new
            keys = self._node_keys[run_id] = sorted(self._nodes.get(run_id, ()))
        for k in keys:
            info = self._node_info.get((run_id, k))
            if info is None:  # NodeInfo is frozen: one decoding serves every read until the next write
                found = nodes_of([self.items[(run_id, k)]], Notes())
                if not found:
                    continue
                info = self._node_info[(run_id, k)] = found[0]
            out.append(info)
        return out

    def read_pacing(self, run_id: str) -> dict[str, dict[str, Any]]:
        partition = PACING_PARTITION_PREFIX + run_id
        return pacing_section(item for (p, _), item in list(self.items.items()) if p == partition)

    def create_run(self, run: RunInfo) -> bool:
        with self._lock:
            if (hub_partition(run.run_id), RUN_ITEM) in self.items:
                return False
            self.items[(hub_partition(run.run_id), RUN_ITEM)] = run_to_item(run)
            self.items[(RUNS_PARTITION, run.run_id)] = {
                "run_id": RUNS_PARTITION,
                "Site": run.run_id,
                "started_at": num(run.started_at),
            }
            return True

    def get_run(self, run_id: str) -> RunInfo | None:
        item = self.items.get((hub_partition(run_id), RUN_ITEM))
        return item_to_run(copy.deepcopy(item)) if item else None

    def update_run(self, run_id: str, **fields: Unpack[RunFields]) -> None:
        with self._lock:
            assign(self.items[(hub_partition(run_id), RUN_ITEM)], fields)

    def get_run_watch(self, run_id: str) -> RunWatch | None:
        item = self.items.get((hub_partition(run_id), RUN_ITEM))
        return item_to_watch(copy.deepcopy(item)) if item else None

    def running_runs(self, last: int) -> list[RunWatch]:
        found = (self.get_run_watch(e.run_id) for e in self.list_runs()[-last:])
        return [w for w in found if w is not None and w.run.status is RunState.RUNNING]

    def update_watch(self, run_id: str, expect: RunExpect, **fields: Unpack[WatchFields]) -> bool:
        with self._lock:
            item = self.items.get((hub_partition(run_id), RUN_ITEM))
            if item is None or not holds(item, expect):
                return False
            assign(item, fields)
            return True

    def add_hub_start(self, run_id: str) -> None:
        with self._lock:
            item = self.items.get((hub_partition(run_id), RUN_ITEM))
            if item is not None:
                item[HUB_STARTS] = item.get(HUB_STARTS, num(0)) + 1

    def add_launched(self, run_id: str, count: int) -> None:
        with self._lock:
            item = self.items[(hub_partition(run_id), RUN_ITEM)]
            item["nodes_launched"] = item.get("nodes_launched", num(0)) + count

    def put_node(self, node: NodeInfo) -> None:
        with self._lock:
            self.items[(node.run_id, NODE_PREFIX + node.instance_id)] = node_to_item(node)
            self._node_info.pop((node.run_id, NODE_PREFIX + node.instance_id), None)
            keys = self._nodes.setdefault(node.run_id, set())
            if NODE_PREFIX + node.instance_id not in keys:
                keys.add(NODE_PREFIX + node.instance_id)
                self._node_keys.pop(node.run_id, None)

    def add_history(self, events: Sequence[HistoryEvent]) -> None:
        with self._lock:
            for event in events:
                self.items[(hub_partition(event.run_id), event.key)] = history_to_item(event)

    def list_runs(self) -> list[RunIndexEntry]:
        return runs_of(v for (rid, _), v in list(self.items.items()) if rid == RUNS_PARTITION)


class MemoryResults:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.refused = 0
        self._names: list[str] = []  # the keys in order, as of the last listing (`keys`)
        self._named = -1  # how many objects there were then: a key added or removed since makes it stale
        self._moved = False  # a key renamed since (`set_aside`), which leaves the count as it was

    def exists(self, key: str) -> bool:
        return key in self.objects

    def put_new(self, key: str, body: bytes) -> bool:
        if key in self.objects:
            self.refused += 1
            return False
        self.objects[key] = body
        return True

    def get(self, key: str) -> bytes:
        if key not in self.objects:  # as S3 answers GetObject of a missing key
            # botocore is loaded only here, so that the simulator, which uses this store, runs without it
            from botocore.exceptions import ClientError

            raise ClientError({"Error": {"Code": "NoSuchKey", "Message": "The specified key does not exist."}}, "Get")
        return self.objects[key]

    def put_evidence(self, key: str, body: bytes, content_type: str) -> None:
        self.objects[key] = body

    def put_staged(self, key: str, body: bytes, content_type: str = "application/json") -> bool:
        """A node's write: a new object only (as on S3, where the node role may make no other)."""
        return self.put_new(key, body)

    def promote(self, staged: str, key: str) -> str:
        if not is_result_key(key):
            raise ValueError(f"{key!r} is not a result's key: nothing promoted to it")
        if staged not in self.objects:
            return MISSING
        if len(self.objects[staged]) > RESULT_MAX_BYTES:
            return TOO_LARGE
        if key in self.objects:
            return EXISTED
        self.objects[key] = self.objects[staged]
        return PROMOTED

    def keys(self, prefix: str) -> list[str]:
        """The keys under `prefix`, in order. The order is kept between listings (checking a run lists one folder
        per site, of a bucket with a million parts at 100,000 sites) and made again after objects come or go."""
        if self._named != len(self.objects) or self._moved:
            self._names, self._named, self._moved = sorted(self.objects), len(self.objects), False
        names, out = self._names, []
        i = bisect.bisect_left(names, prefix)
        while i < len(names) and names[i].startswith(prefix):
            out.append(names[i])
            i += 1
        return out

    def set_aside(self, key: str, suffix: str) -> str | None:
        if key not in self.objects:
            return None
        new = aside_key(key, suffix)
        self.objects[new] = self.objects.pop(key)
        self._moved = True
        return new
