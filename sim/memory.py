"""In-memory stand-ins for the state table, the queue and the result store.

They keep the same contracts as the AWS adapters (conditional writes, visibility
timeouts, receive counts and the DLQ, write-once results); the contract suite in
tests/adapter runs against both so they stay faithful. Unit tests and the
simulator use them; they are never used to run a real crawl.
"""

from __future__ import annotations

import copy
import hashlib
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Unpack

from fleet.clock import Clock, SystemClock
from fleet.codec import (
    MARKS_PARTITION,
    NODE_PREFIX,
    OPEN_ATTR,
    RUN_ITEM,
    RUNS_PARTITION,
    HistoryEvent,
    NodeInfo,
    RunInfo,
    diff_items,
    history_to_item,
    item_to_node,
    item_to_run,
    item_to_site,
    node_to_item,
    num,
    run_to_item,
    site_to_item,
    split_partition,
)
from fleet.errors import StaleWrite
from fleet.messages import DEDUP_WINDOW_S, BadMessage, QueueDepth, SiteMessage, decode, dedup_id, encode, group_id
from fleet.results import aside_key
from fleet.run_item import HUB_STARTS, RunExpect, RunFields, RunWatch, WatchFields, assign, holds, item_to_watch
from fleet.stamp import Stamp, item_stamp
from fleet.state import RunState, SiteRecord
from fleet.table import RunIndexEntry, RunRows


class MemoryStateTable:
    def __init__(self) -> None:
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._open: dict[str, dict[str, Stamp]] = {}  # the sparse index `open`: run -> site -> its stamp
        self._nodes: dict[str, set[str]] = {}  # run -> node item keys (a begins_with Query)

    def _index(self, run_id: str, site: str, item: dict[str, Any]) -> None:
        if OPEN_ATTR in item:
            self._open.setdefault(run_id, {})[site] = item_stamp(item)
        else:
            self._open.get(run_id, {}).pop(site, None)

    def create_site(self, rec: SiteRecord) -> bool:
        with self._lock:
            key = (rec.run_id, rec.site)
            if key in self.items:
                return False
            self.items[key] = site_to_item(rec)
            self._index(rec.run_id, rec.site, self.items[key])
            return True

    def get_marks(self, sites: Iterable[str]) -> dict[str, tuple[str, ...]]:
        out = {}
        for s in sites:
            item = self.items.get((MARKS_PARTITION, s))
            if item is not None:
                out[s] = tuple(item["mark"])
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
        item = self.items.get((run_id, site))
        return item_to_site(copy.deepcopy(item)) if item else None

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
                raise StaleWrite(old.run_id, old.site, old.fence(), item_to_site(copy.deepcopy(cur)) if cur else None)
            sets, removes = diff_items(site_to_item(old), site_to_item(new))  # what DynamoDB would SET/REMOVE
            cur.update({k: copy.deepcopy(v) if isinstance(v, (dict, list)) else v for k, v in sets.items()})
            for k in removes:
                cur.pop(k, None)
            self._index(old.run_id, old.site, cur)
            return new

    def read_run(self, run_id: str) -> RunRows:
        items = [copy.deepcopy(item) for (rid, _), item in sorted(self.items.items()) if rid == run_id]
        return RunRows(*split_partition(items))

    def open_stamps(self, run_id: str) -> dict[str, Stamp]:
        """The stamps of the sites that can still change (QUEUED or RUN): the Query of the index `open`."""
        with self._lock:
            return dict(self._open.get(run_id, {}))

    def get_sites(self, run_id: str, sites: Iterable[str]) -> list[SiteRecord]:
        out = []
        for site in sites:
            item = self.items.get((run_id, site))
            if item is not None:
                out.append(item_to_site(item))  # decoding builds new objects: nothing shared with the store
        return out

    def read_nodes(self, run_id: str) -> list[NodeInfo]:
        return [item_to_node(self.items[(run_id, k)]) for k in sorted(self._nodes.get(run_id, ()))]

    def create_run(self, run: RunInfo) -> bool:
        with self._lock:
            if (run.run_id, RUN_ITEM) in self.items:
                return False
            self.items[(run.run_id, RUN_ITEM)] = run_to_item(run)
            self.items[(RUNS_PARTITION, run.run_id)] = {
                "run_id": RUNS_PARTITION,
                "Site": run.run_id,
                "started_at": num(run.started_at),
            }
            return True

    def get_run(self, run_id: str) -> RunInfo | None:
        item = self.items.get((run_id, RUN_ITEM))
        return item_to_run(copy.deepcopy(item)) if item else None

    def update_run(self, run_id: str, **fields: Unpack[RunFields]) -> None:
        with self._lock:
            assign(self.items[(run_id, RUN_ITEM)], fields)

    def get_run_watch(self, run_id: str) -> RunWatch | None:
        item = self.items.get((run_id, RUN_ITEM))
        return item_to_watch(copy.deepcopy(item)) if item else None

    def running_runs(self, last: int) -> list[RunWatch]:
        found = (self.get_run_watch(e.run_id) for e in self.list_runs()[-last:])
        return [w for w in found if w is not None and w.run.status is RunState.RUNNING]

    def update_watch(self, run_id: str, expect: RunExpect, **fields: Unpack[WatchFields]) -> bool:
        with self._lock:
            item = self.items.get((run_id, RUN_ITEM))
            if item is None or not holds(item, expect):
                return False
            assign(item, fields)
            return True

    def add_hub_start(self, run_id: str) -> None:
        with self._lock:
            item = self.items.get((run_id, RUN_ITEM))
            if item is not None:
                item[HUB_STARTS] = item.get(HUB_STARTS, num(0)) + 1

    def add_launched(self, run_id: str, count: int) -> None:
        with self._lock:
            item = self.items[(run_id, RUN_ITEM)]
            item["nodes_launched"] = item.get("nodes_launched", num(0)) + count

    def put_node(self, node: NodeInfo) -> None:
        with self._lock:
            self.items[(node.run_id, NODE_PREFIX + node.instance_id)] = node_to_item(node)
            self._nodes.setdefault(node.run_id, set()).add(NODE_PREFIX + node.instance_id)

    def add_history(self, events: Sequence[HistoryEvent]) -> None:
        with self._lock:
            for event in events:
                self.items[(event.run_id, event.key)] = history_to_item(event)

    def list_runs(self) -> list[RunIndexEntry]:
        out = [RunIndexEntry(k, float(v["started_at"])) for (rid, k), v in self.items.items() if rid == RUNS_PARTITION]
        return sorted(out, key=lambda e: e.started_at)


@dataclass
class _Msg:
    id: str
    body: str
    visible_at: float = 0.0
    receives: int = 0
    receipt: str = ""
    group: str = ""


@dataclass
class MemoryQueue:
    """SQS semantics that matter here: visibility, receive counts, redrive to a DLQ.

    `fifo=True` is a FIFO queue as `SqsSiteQueue` uses one: a send whose deduplication id (that of its run, site
    and attempt) was sent within the last `DEDUP_WINDOW_S` of the clock is accepted and dropped (counted in
    `deduplicated`, not in `sent`), and while a message is in flight the later ones of its group (its site) wait.
    """

    clock: Clock = field(default_factory=SystemClock)
    max_receive_count: int = 10
    messages: list[_Msg] = field(default_factory=list)
    dlq: list[_Msg] = field(default_factory=list)
    sent: int = 0
    _seq: int = 0
    fifo: bool = False
    deduplicated: int = 0
    #: FIFO: when each deduplication id was last sent (by the monotonic clock).
    _dedup_at: dict[str, float] = field(default_factory=dict)

    def _new(self, body: str, group: str = "", dedup: str | None = None) -> None:
        if dedup is not None:
            now = self.clock.monotonic()
            at = self._dedup_at.get(dedup)
            if at is not None and now - at < DEDUP_WINDOW_S:
                self.deduplicated += 1
                return
            self._dedup_at[dedup] = now
        self._seq += 1
        self.messages.append(_Msg(f"m{self._seq}", body, group=group))
        self.sent += 1

    def send(self, run_id: str, site: str, attempt: int, given_back: int = 0) -> None:
        body = encode(run_id, site, attempt)
        if self.fifo:
            self._new(body, group_id(run_id, site), dedup_id(run_id, site, attempt, given_back))
        else:
            self._new(body)

    def send_raw(self, body: str) -> None:
        if self.fifo:  # its own group, deduplicated by content
            digest = hashlib.sha256(body.encode()).hexdigest()
            self._new(body, digest, digest)
        else:
            self._new(body)

    def send_many(self, items: Iterable[tuple[str, str, int]]) -> None:
        for item in items:
            self.send(*item)

    def receive(self, wait_s: float, visibility_s: float) -> SiteMessage | BadMessage | None:
        now = self.clock.monotonic()
        held: set[str] = set()  # FIFO: groups with a message in flight
        for m in list(self.messages):
            if self.fifo and m.group in held:
                continue
            if m.visible_at > now:
                if self.fifo:
                    held.add(m.group)
                continue
            if m.receives >= self.max_receive_count:
                self.messages.remove(m)
                self.dlq.append(m)
                continue
            m.receives += 1
            m.visible_at = now + visibility_s
            self._seq += 1
            m.receipt = f"{m.id}/{self._seq}"
            return decode(m.body, m.receipt, m.id, m.receives)
        self.clock.sleep(wait_s)  # a long poll that found nothing waits it out, as SQS does
        return None

    def _find(self, receipt: str) -> _Msg | None:
        for m in self.messages:
            if m.receipt == receipt:
                return m
        return None

    def delete(self, msg: SiteMessage | BadMessage) -> None:
        m = self._find(msg.receipt)
        if m is not None:
            self.messages.remove(m)

    def delete_receipt(self, receipt: str) -> None:
        m = self._find(receipt)
        if m is not None:
            self.messages.remove(m)

    def set_visibility(self, msg: SiteMessage | BadMessage, seconds: float) -> None:
        m = self._find(msg.receipt)
        if m is not None:
            m.visible_at = self.clock.monotonic() + seconds

    def peek(self, limit: int = 100, dlq: bool = False) -> list[SiteMessage | BadMessage]:
        return [decode(m.body, m.receipt, m.id, m.receives) for m in (self.dlq if dlq else self.messages)][:limit]

    def depth(self) -> QueueDepth:
        now = self.clock.monotonic()
        visible = sum(1 for m in self.messages if m.visible_at <= now)
        return QueueDepth(visible, len(self.messages) - visible, len(self.dlq))


class MemoryResults:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.refused = 0

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

    def put_part(self, key: str, body: bytes) -> None:
        self.objects[key] = body

    def keys(self, prefix: str) -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))

    def set_aside(self, key: str, suffix: str) -> str | None:
        if key not in self.objects:
            return None
        new = aside_key(key, suffix)
        self.objects[new] = self.objects.pop(key)
        return new
