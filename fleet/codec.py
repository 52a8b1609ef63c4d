"""Records <-> DynamoDB items (plain Python values; numbers as Decimal).

Some field names (`run_status`, `site_status`, `lastUpdateEpoch`, `attemptCount`, `instance_id`,
`expireAt`) are read by programs outside gridfleet, so they keep the spelling those know; the rest are ours.
Absent values are absent attributes, never NULLs, so a diff of two items is the
exact update to send.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from fleet.blocked import MAX_MARKERS, marker_problem
from fleet.failures import known_class, known_status
from fleet.state import Attempt, Counts, RunState, RunStatus, SiteRecord, SiteSpec, SiteStatus

RUN_ITEM = "#run"  # Site key of the run-level item
NODE_PREFIX = "#node#"  # Site key prefix of per-node items
#: Every attribute of a node item but its key (`node_to_item`): what a node's UpdateItem of its item sets or removes.
NODE_ATTRS = ("state", "heartbeatEpoch", "started_at", "sites_done", "site", "attempt", "expireAt", "error", "stats")
RUNS_PARTITION = "#runs"  # run_id of the index of runs (one item per run)
OPEN_ATTR = "openSite"  # set (to the site id) while a site is QUEUED or RUN: the key of the sparse index `open`
#: A site as seeded and not yet sent (QUEUED, never sent, never written since its creation) sorts apart in the index:
#: `openSite` is this prefix and its id. A site id starts with a letter or a digit, which all sort before it, so
#: the hub's Query of what can change (`openSite < HELD_PREFIX`) leaves out the sites it holds itself, however
#: many: at 100,000 sites a metered queue holds nearly all of them at first, and only its own feed sends them.
HELD_PREFIX = "~"
OPEN_INDEX = "open"  # local secondary index over OPEN_ATTR: the sites that can still change, nothing else
MARKS_PARTITION = "#sites"  # run_id of what outlives runs, one item per site: its incremental high-water mark
HISTORY_PREFIX = "#h#"  # Site key prefix of the run's history events: #h#<epoch ms>#<n>


def num(x: float | int) -> Decimal:
    return Decimal(str(round(float(x), 3))) if isinstance(x, float) else Decimal(x)


def unnum(x: Any) -> Any:
    if isinstance(x, Decimal):
        return int(x) if x == x.to_integral_value() else float(x)
    if isinstance(x, list):
        return [unnum(v) for v in x]
    if isinstance(x, dict):
        return {k: unnum(v) for k, v in x.items()}
    return x


def _plain_to_item(x: Any) -> Any:
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, (int, float)):
        return num(x)
    if isinstance(x, Mapping):
        return {str(k): _plain_to_item(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain_to_item(v) for v in x]
    raise TypeError(f"cannot store {type(x).__name__} in a site record")


def _number(v: Any) -> Any:
    return num(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


#: Each attribute of a site item but its keys, encoded from a record (None: absent): what `site_to_item` writes,
#: and what `site_update` encodes of the fields a write changed.
_ENCODE: dict[str, Callable[[SiteRecord], Any]] = {
    "run_status": lambda r: str(r.run_status),
    "site_status": lambda r: str(r.site_status),
    "attemptCount": lambda r: num(r.attempt),
    "version": lambda r: num(r.version),
    "enqueued": lambda r: r.enqueued,
    "pages": lambda r: num(r.pages),
    "spot_requeues": lambda r: num(r.spot_requeues),
    "attemptBase": lambda r: num(r.attempt_base),
    "spec": lambda r: spec_to_item(r.spec),
    "attempts": lambda r: [_attempt_to_item(a) for a in r.attempts],
    OPEN_ATTR: lambda r: None if r.is_terminal else open_key(r),
    "instance_id": lambda r: r.instance_id,
    "lastUpdateEpoch": lambda r: _number(r.last_update),
    "heartbeatEpoch": lambda r: _number(r.heartbeat),
    "failure_reason": lambda r: r.failure_reason,
    "failure_class": lambda r: r.failure_class,
    "http_status": lambda r: _number(r.http_status),
    "retry_at": lambda r: _number(r.retry_at),
    "avoid_instance": lambda r: r.avoid_instance,
    "error": lambda r: r.error,
    "result_key": lambda r: r.result_key,
    "url": lambda r: r.url,
    "kill_reason": lambda r: r.kill_reason,
    "kill_path": lambda r: r.kill_path,
    "receipt": lambda r: r.receipt,
    "expireAt": lambda r: _number(r.expire_at),
    "checkpoint": lambda r: encode_checkpoint(r.checkpoint) if r.checkpoint is not None else None,
    "mark": lambda r: list(r.mark) if r.mark is not None else None,
    "items": lambda r: _number(r.items),
}

#: The attributes each field of a record is encoded in (`OPEN_ATTR` from several).
_FIELD_ATTRS: dict[str, tuple[str, ...]] = {
    "run_status": ("run_status", OPEN_ATTR),
    "site_status": ("site_status",),
    "attempt": ("attemptCount",),
    "version": ("version", OPEN_ATTR),
    "enqueued": ("enqueued", OPEN_ATTR),
    "pages": ("pages",),
    "spot_requeues": ("spot_requeues",),
    "attempt_base": ("attemptBase",),
    "spec": ("spec",),
    "attempts": ("attempts", OPEN_ATTR),
    "instance_id": ("instance_id",),
    "last_update": ("lastUpdateEpoch",),
    "heartbeat": ("heartbeatEpoch",),
    "failure_reason": ("failure_reason",),
    "failure_class": ("failure_class",),
    "http_status": ("http_status",),
    "retry_at": ("retry_at",),
    "avoid_instance": ("avoid_instance",),
    "error": ("error",),
    "result_key": ("result_key",),
    "url": ("url",),
    "kill_reason": ("kill_reason",),
    "kill_path": ("kill_path",),
    "receipt": ("receipt",),
    "expire_at": ("expireAt",),
    "checkpoint": ("checkpoint",),
    "mark": ("mark",),
    "items": ("items",),
}


def site_to_item(r: SiteRecord) -> dict[str, Any]:
    item: dict[str, Any] = {"run_id": r.run_id, "Site": r.site}
    for attr, encode in _ENCODE.items():
        value = encode(r)
        if value is not None:
            item[attr] = value
    return item


def as_seeded(r: SiteRecord) -> bool:
    """A site as its seeding created it: QUEUED, its message never sent, never written since (version 0)."""
    return r.run_status is RunStatus.QUEUED and not r.enqueued and not r.attempts and r.version == 0


def open_key(r: SiteRecord) -> str:
    """The value of OPEN_ATTR on an open record: its id, or HELD_PREFIX and its id for a site as seeded."""
    return HELD_PREFIX + r.site if as_seeded(r) else r.site


def _attempt_to_item(a: Attempt) -> dict[str, Any]:
    out: dict[str, Any] = {"n": num(a.n), "instance_id": a.instance_id, "start": num(a.start)}
    if a.end is not None:
        out["end"] = num(a.end)
    if a.outcome is not None:
        out["outcome"] = a.outcome
    if a.kill_path is not None:
        out["kill_path"] = a.kill_path
    if a.failure_class is not None:
        out["failure_class"] = a.failure_class
    if a.http_status is not None:
        out["http_status"] = num(a.http_status)
    if a.counts is not None:
        c = a.counts
        out.update(items=num(c.items), pages=num(c.pages), collisions=num(c.collisions), skipped=num(c.skipped))
        if c.robots_skipped:
            out["robots_skipped"] = num(c.robots_skipped)
        if c.collided:
            out["collided"] = list(c.collided)
    return out


def _item_to_attempt(a: Mapping[str, Any]) -> Attempt:
    counts = None
    if "items" in a:  # an attempt of an older node has no counts
        collided = a.get("collided")
        counts = Counts(  # what a node wrote: a value that is no count reads as 0, never as a failed read
            count_or_none(a.get("items")) or 0,
            count_or_none(a.get("pages")) or 0,
            count_or_none(a.get("collisions")) or 0,
            count_or_none(a.get("skipped")) or 0,
            tuple(str(i) for i in collided) if isinstance(collided, list | tuple) else (),
            count_or_none(a.get("robots_skipped")) or 0,
        )
    return Attempt(
        int(a["n"]),
        a["instance_id"],
        a["start"],
        a.get("end"),
        a.get("outcome"),
        a.get("kill_path"),
        counts,
        _class_or_none(a.get("failure_class")),  # nodes write these: what is not a class or a status is none
        known_status(a.get("http_status")),
    )


def _class_or_none(value: object) -> str | None:
    cls = known_class(value)
    return None if cls is None else str(cls)


def _epoch_or_none(value: object) -> float | None:
    """A time read back (epoch seconds), or None if it is none."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e11
    return float(value) if ok else None  # type: ignore[arg-type]


def _instance_or_none(value: object) -> str | None:
    """An instance id read back, only ever compared with a node's own: any short string, else None."""
    return value if isinstance(value, str) and 0 < len(value) <= 64 else None


def item_to_site(item: Mapping[str, Any]) -> SiteRecord:
    i = unnum(dict(item))
    spec = i.get("spec") or {}
    return SiteRecord(
        run_id=i["run_id"],
        site=i["Site"],
        spec=SiteSpec(
            spec.get("start_url", ""),
            spec.get("crawler", "links"),
            spec.get("options") or {},
            bool(spec.get("incremental", False)),
            spec.get("rate_limit"),
            spec.get("per_s"),
            bool(spec.get("robots", True)),
            _expect(spec.get("expect")),
            count_or_none(spec.get("baseline_items")),
            _markers(spec.get("blocked_markers")),
            float(spec["per_domain_s"]) if spec.get("per_domain_s") else None,
        ),
        run_status=RunStatus(i["run_status"]),
        site_status=SiteStatus(i["site_status"]),
        attempt=int(i.get("attemptCount", 0)),
        instance_id=i.get("instance_id"),
        version=int(i.get("version", 0)),
        last_update=i.get("lastUpdateEpoch"),
        heartbeat=i.get("heartbeatEpoch"),
        enqueued=bool(i.get("enqueued", False)),
        failure_reason=i.get("failure_reason"),
        failure_class=_class_or_none(i.get("failure_class")),
        http_status=known_status(i.get("http_status")),
        retry_at=_epoch_or_none(i.get("retry_at")),
        avoid_instance=_instance_or_none(i.get("avoid_instance")),
        error=i.get("error"),
        result_key=i.get("result_key"),
        url=i.get("url"),
        pages=count_or_none(i.get("pages")) or 0,  # a node's count: one that is none reads as 0
        kill_reason=i.get("kill_reason"),
        kill_path=i.get("kill_path"),
        receipt=i.get("receipt"),
        spot_requeues=int(i.get("spot_requeues", 0)),
        attempt_base=int(i.get("attemptBase", 0)),
        attempts=tuple(_item_to_attempt(a) for a in i.get("attempts", [])),
        expire_at=i.get("expireAt"),
        checkpoint=decode_checkpoint(i["checkpoint"]) if i.get("checkpoint") else None,
        mark=tuple(i["mark"]) if i.get("mark") is not None else None,
        items=count_or_none(i.get("items")),  # a node's count: one that is none reads as none
    )


def spec_to_item(spec: SiteSpec) -> dict[str, Any]:
    out: dict[str, Any] = {
        "start_url": spec.start_url,
        "crawler": spec.crawler,
        "options": _plain_to_item(dict(spec.options)),
    }
    if spec.incremental:
        out["incremental"] = True
    if spec.rate_limit is not None:
        out["rate_limit"] = spec.rate_limit
        out["per_s"] = num(float(spec.per_s or 0))
    if not spec.robots:
        out["robots"] = False
    if spec.expect:  # as JSON text: a schema's numbers stay as written (the table's numbers are rounded)
        out["expect"] = json.dumps(dict(spec.expect), sort_keys=True)
    if spec.baseline_items is not None:
        out["baseline_items"] = spec.baseline_items
    if spec.blocked_markers:
        out["blocked_markers"] = list(spec.blocked_markers)
    if spec.per_domain_s:
        out["per_domain_s"] = num(spec.per_domain_s)
    return out


def _markers(value: object) -> tuple[str, ...]:
    """A spec's blocked markers as read back: each one usable, at most MAX_MARKERS (the rest are dropped)."""
    if not isinstance(value, list | tuple):
        return ()
    return tuple(m for m in value[:MAX_MARKERS] if marker_problem(m) is None)


def count_or_none(value: object) -> int | None:
    """`value` if it is a count (an int >= 0, not a bool), else None: a count read back from what a node could write."""
    if isinstance(value, Decimal) and value == value.to_integral_value():
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _expect(text: object) -> dict[str, Any]:
    """A spec's data contract as stored (JSON text): a mapping, else none."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


#: What a node may write into the table from what its crawler sent, whatever that was: the URL of a step, any
#: error text, each item id of a checkpoint or a mark. A crawler's output is not trusted to be small; these keep
#: every write of one attempt far from DynamoDB's 400 KB item limit.
URL_MAX_CHARS = 2048
ERROR_MAX_CHARS = 1000
ITEM_ID_MAX_CHARS = 512


def capped(text: object, max_chars: int) -> str:
    """`text` as a string of at most `max_chars` characters (cut at the end)."""
    s = text if isinstance(text, str) else str(text)
    return s[:max_chars]


#: A checkpoint is stored compressed (zlib, base64) in one string attribute. Nodes write a cursor and counts
#: (`fleet.checkpoint`: the items are in parts beside the result); a checkpoint of the older form, holding its
#: items, has them dropped past this size (a DynamoDB item holds 400 KB at most), and is then not resumed from.
CHECKPOINT_MAX_CHARS = 300_000


def encode_checkpoint(ckpt: Mapping[str, Any]) -> str:
    raw = json.dumps(ckpt, separators=(",", ":"), default=str).encode()
    return "z:" + base64.b64encode(zlib.compress(raw, 6)).decode()


def decode_checkpoint(text: str) -> dict[str, Any]:
    if not text.startswith("z:"):
        raise ValueError("not a gridfleet checkpoint")
    return json.loads(zlib.decompress(base64.b64decode(text[2:])))


@dataclass(frozen=True)
class RunInfo:
    """The run-level item (`Site = "#run"`)."""

    run_id: str
    status: RunState
    started_at: float
    deadline_at: float
    run_date: str  # YYYYMMDD, the date part of result keys
    hub_id: str | None = None
    hub_heartbeat: float | None = None
    finished_at: float | None = None
    nodes_launched: int = 0
    expire_at: int | None = None
    launch_failures: int = 0  # launches in a row that started no node
    launch_error: str | None = None  # the last launch error
    launch_retry_at: float | None = None  # hub clock: no launch before this (backoff)
    reruns: int = 0  # times an operator reopened the run (`gridfleet rerun`); each brings a new launch budget
    full: bool = False  # `run --full`: incremental sites ignore their high-water marks in this run

    @property
    def finished(self) -> bool:
        return self.status == RunState.FINISHED


def run_to_item(r: RunInfo) -> dict[str, Any]:
    item = {
        "run_id": r.run_id,
        "Site": RUN_ITEM,
        "status": str(r.status),
        "started_at": num(r.started_at),
        "deadline_at": num(r.deadline_at),
        "run_date": r.run_date,
        "nodes_launched": num(r.nodes_launched),
        "launch_failures": num(r.launch_failures),
        "reruns": num(r.reruns),
    }
    if r.full:
        item["full"] = True
    for k, v in (
        ("hub_id", r.hub_id),
        ("hub_heartbeat", r.hub_heartbeat),
        ("finished_at", r.finished_at),
        ("expireAt", r.expire_at),
        ("launch_error", r.launch_error),
        ("launch_retry_at", r.launch_retry_at),
    ):
        if v is not None:
            item[k] = num(v) if isinstance(v, (int, float)) else v
    return item


def item_to_run(item: Mapping[str, Any]) -> RunInfo:
    i = unnum(dict(item))
    return RunInfo(
        run_id=i["run_id"],
        status=RunState(i["status"]),
        started_at=i["started_at"],
        deadline_at=i["deadline_at"],
        run_date=i["run_date"],
        hub_id=i.get("hub_id"),
        hub_heartbeat=i.get("hub_heartbeat"),
        finished_at=i.get("finished_at"),
        nodes_launched=int(i.get("nodes_launched", 0)),
        expire_at=i.get("expireAt"),
        launch_failures=int(i.get("launch_failures", 0)),
        launch_error=i.get("launch_error"),
        full=bool(i.get("full", False)),
        launch_retry_at=i.get("launch_retry_at"),
        reruns=int(i.get("reruns", 0)),
    )


@dataclass(frozen=True)
class NodeInfo:
    """A node's own item (`Site = "#node#<instance id>"`), written only by that node."""

    run_id: str
    instance_id: str
    state: str  # booting | idle | busy | exiting
    heartbeat: float
    started_at: float
    site: str | None = None
    attempt: int | None = None
    sites_done: int = 0
    expire_at: int | None = None
    error: str | None = None  # why it could not work (state boot-failed)
    stats: Mapping[str, Any] | None = None  # the node's job counters (`fleet.aws.metrics.JobStats.to_plain`)


def node_to_item(n: NodeInfo) -> dict[str, Any]:
    item: dict[str, Any] = {
        "run_id": n.run_id,
        "Site": NODE_PREFIX + n.instance_id,
        "state": n.state,
        "heartbeatEpoch": num(n.heartbeat),
        "started_at": num(n.started_at),
        "sites_done": num(n.sites_done),
    }
    if n.site is not None:
        item["site"] = n.site
    if n.attempt is not None:
        item["attempt"] = num(n.attempt)
    if n.expire_at is not None:
        item["expireAt"] = num(n.expire_at)
    if n.error is not None:
        item["error"] = capped(n.error, ERROR_MAX_CHARS)
    if n.stats:
        item["stats"] = _plain_to_item(n.stats)
    return item


def item_to_node(item: Mapping[str, Any]) -> NodeInfo:
    i = unnum(dict(item))
    return NodeInfo(
        run_id=i["run_id"],
        instance_id=i["Site"][len(NODE_PREFIX) :],
        state=i["state"],
        heartbeat=i["heartbeatEpoch"],
        started_at=i["started_at"],
        site=i.get("site"),
        attempt=i.get("attempt"),
        sites_done=int(i.get("sites_done", 0)),
        expire_at=i.get("expireAt"),
        error=i.get("error"),
        stats=i.get("stats"),
    )


@dataclass(frozen=True)
class HistoryEvent:
    """Something the hub did (launch, terminate, kill, requeue, failed, ...), by the hub's clock."""

    run_id: str
    at: float
    kind: str
    fields: Mapping[str, Any]
    seq: int = 0

    @property
    def key(self) -> str:
        return f"{HISTORY_PREFIX}{int(self.at * 1000):013d}#{self.seq:06d}"


def history_to_item(e: HistoryEvent) -> dict[str, Any]:
    return {
        "run_id": e.run_id,
        "Site": e.key,
        "kind": e.kind,
        "at": num(e.at),
        "fields": _plain_to_item({k: v for k, v in e.fields.items() if v is not None}),
    }


def item_to_history(item: Mapping[str, Any]) -> HistoryEvent:
    i = unnum(dict(item))
    seq = int(str(i["Site"]).rsplit("#", 1)[-1] or 0)
    return HistoryEvent(i["run_id"], i["at"], i["kind"], i.get("fields") or {}, seq)


def split_partition(items) -> tuple[RunInfo | None, list[SiteRecord], list[NodeInfo], list[HistoryEvent]]:
    """The items of one run's partition -> (run item, site records, node items, history in order)."""
    run, sites, nodes, history = None, [], [], []
    for item in items:
        key = item["Site"]
        if key == RUN_ITEM:
            run = item_to_run(item)
        elif key.startswith(NODE_PREFIX):
            nodes.append(item_to_node(item))
        elif key.startswith(HISTORY_PREFIX):
            history.append(item_to_history(item))
        elif not key.startswith("#"):
            sites.append(item_to_site(item))
    return run, sites, nodes, sorted(history, key=lambda e: (e.at, e.seq))


def diff_items(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(attributes to SET, attributes to REMOVE) turning `old` into `new`."""
    sets = {k: v for k, v in new.items() if k not in ("run_id", "Site") and old.get(k) != v}
    removes = [k for k in old if k not in new and k not in ("run_id", "Site")]
    return sets, removes


def site_update(old: SiteRecord, new: SiteRecord) -> tuple[dict[str, Any], list[str]]:
    """What a fenced write of `new` over `old` SETs and REMOVEs. `enqueued` is the one field another writer may
    change without moving the version (the mark of a sent message): a writer whose copy predates such a mark would
    leave it standing by the diff alone, and a QUEUED site marked sent whose message is gone is never sent again.
    So a transition (a new version) always writes it.

    Only the attributes of the fields that changed are encoded (a heartbeat encodes two numbers, not the record):
    the result is the diff of the two whole items (`diff_items`), which the tests hold it to."""
    attrs: set[str] = set()
    for f, names in _FIELD_ATTRS.items():
        a, b = getattr(old, f), getattr(new, f)
        if a is not b and a != b:
            attrs.update(names)
    sets: dict[str, Any] = {}
    removes: list[str] = []
    for attr in sorted(attrs):
        before, after = _ENCODE[attr](old), _ENCODE[attr](new)
        if after is None:
            if before is not None:
                removes.append(attr)
        elif before != after:
            sets[attr] = after
    if new.version != old.version:
        sets["enqueued"] = new.enqueued
    return sets, removes
