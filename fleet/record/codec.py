"""Records <-> DynamoDB items (plain Python values; numbers as Decimal).

Some field names (`run_status`, `site_status`, `lastUpdateEpoch`, `attemptCount`, `instance_id`,
`expireAt`) are read by programs outside gridfleet, so they keep the spelling those know; the rest are ours.
Absent values are absent attributes, never NULLs, so a diff of two items is the
exact update to send.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from fleet.errors import quote
from fleet.record.blocked import MAX_MARKERS, marker_problem
from fleet.record.failures import known_class, known_status
from fleet.record.ids import is_site_id
from fleet.record.readback import Notes, Reader, as_count, as_epoch, kind
from fleet.record.state import (
    COLLIDED_ID_MAX_CHARS,
    MAX_COLLIDED,
    SITE_FOR_RUN,
    Attempt,
    Counts,
    Outcome,
    RunStatus,
    SiteRecord,
    SiteSpec,
    SiteStatus,
    known_reason,
)

OPEN_ATTR = "openSite"  # set (to the site id) while a site is QUEUED or RUN: the key of the sparse index `open`
#: A site as seeded and not yet sent (QUEUED, never sent, never written since its creation) sorts apart in the index:
#: `openSite` is this prefix and its id. A site id starts with a letter or a digit, which all sort before it, so
#: the hub's Query of what can change (`openSite < HELD_PREFIX`) leaves out the sites it holds itself, however
#: many: at 100,000 sites a metered queue holds nearly all of them at first, and only its own feed sends them.
HELD_PREFIX = "~"
OPEN_INDEX = "open"  # local secondary index over OPEN_ATTR: the sites that can still change, nothing else
MARKS_PARTITION = "#sites"  # run_id of what outlives runs, one item per site: its incremental high-water mark


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


def plain_to_item(x: Any) -> Any:
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, (int, float)):
        return num(x)
    if isinstance(x, Mapping):
        return {str(k): plain_to_item(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain_to_item(v) for v in x]
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
    "staged": lambda r: _number(r.staged),
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
    "staged": ("staged",),
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


#: Attempts a record's history may hold when read back (claims, given-back attempts and reruns together: far
#: beyond any max_attempts); a longer list is not read.
MAX_ATTEMPTS_READ = 1000


def _item_to_attempt(a: object, r: Reader) -> Attempt | None:
    """One entry of `attempts` as read back; None (noted) when it is no attempt: a map with a whole `n` from 1, an
    `instance_id` and a `start` time. Its counts are what a node wrote: a value that is no count reads as 0."""
    if not isinstance(a, Mapping):
        r.bad("attempts", f"an entry is {kind(a)}, not a map")
        return None
    e = Reader(a, r.notes, r.partition, r.key)
    n, iid, start = as_count(a.get("n")), a.get("instance_id"), as_epoch(a.get("start"))
    if not n or not isinstance(iid, str) or not 0 < len(iid) <= 64 or start is None:
        r.bad("attempts", "an entry has no whole n from 1, instance_id or start time")
        return None
    counts = None
    if "items" in a:  # an attempt of an older node has no counts
        collided = e.listed("collided", MAX_COLLIDED) or []
        counts = Counts(
            e.count("items") or 0,
            e.count("pages") or 0,
            e.count("collisions") or 0,
            e.count("skipped") or 0,
            tuple(str(i)[:COLLIDED_ID_MAX_CHARS] for i in collided if isinstance(i, str)),
            e.count("robots_skipped") or 0,
        )
    outcome = e.word("outcome", 32)
    return Attempt(
        n,
        iid,
        start,
        e.epoch("end"),
        outcome if outcome in _OUTCOMES else None,
        e.word("kill_path", 64),
        counts,
        _class_or_none(a.get("failure_class")),  # nodes write these: what is not a class or a status is none
        known_status(a.get("http_status")),
    )


_OUTCOMES = frozenset(o.value for o in Outcome)


def _class_or_none(value: object) -> str | None:
    cls = known_class(value)
    return None if cls is None else str(cls)


#: What a site's `run_status` requires of its `site_status` when the pair read back is none that a record can
#: hold: the pair is made whole with the first of these (the run status is what the fleet acts on).
_SITE_STATUS_OF = {
    RunStatus.QUEUED: SiteStatus.PENDING,
    RunStatus.RUN: SiteStatus.RUNNING,
    RunStatus.COMPLETED: SiteStatus.COMPLETED,
    RunStatus.FAILED: SiteStatus.FAILED,
}


def item_to_site(item: Mapping[str, Any], notes: Notes | None = None) -> SiteRecord:
    """A site item as read back, each attribute checked (`fleet.record.readback`): one that cannot be read is absent
    (and noted). An item no hub seeded (no spec: nodes cannot write one), whose key is no site id, or whose status or
    fence (version, attemptCount, instance_id) cannot be read raises UnreadableItem: no write can be fenced on it."""
    run_id, site = str(item.get("run_id", "")), item.get("Site")
    r = Reader(item, notes, run_id, str(site))
    if not isinstance(site, str) or not is_site_id(site):
        raise r.unreadable("", "its key is not a site id")
    spec = _spec(r)
    run_status = r.enum("run_status", RunStatus)
    if run_status is None:
        raise r.unreadable("run_status", "none a site can be in")
    version, attempt = r.count("version", None), r.count("attemptCount", None)
    if ("version" in item and version is None) or ("attemptCount" in item and attempt is None):
        raise r.unreadable("version" if version is None else "attemptCount", "the fence cannot be read")
    instance_id = r.word("instance_id", 64)
    if "instance_id" in item and instance_id is None:
        raise r.unreadable("instance_id", "the fence cannot be read")
    site_status = r.enum("site_status", SiteStatus)
    if site_status is None or site_status not in SITE_FOR_RUN[run_status]:
        if site_status is not None:
            r.bad("site_status", f"{site_status} is not a status of a {run_status} site")
        site_status = _SITE_STATUS_OF[run_status]
    raw_attempts = r.listed("attempts", MAX_ATTEMPTS_READ) or []
    return SiteRecord(
        run_id=run_id,
        site=site,
        spec=spec,
        run_status=run_status,
        site_status=site_status,
        attempt=attempt or 0,
        instance_id=instance_id,
        version=version or 0,
        last_update=r.epoch("lastUpdateEpoch"),
        heartbeat=r.epoch("heartbeatEpoch"),
        enqueued=r.flag("enqueued"),
        failure_reason=_reason(r),
        failure_class=_class_or_none(item.get("failure_class")),
        http_status=known_status(item.get("http_status")),
        retry_at=r.epoch("retry_at"),
        avoid_instance=r.word("avoid_instance", 64),
        error=r.text("error", ERROR_MAX_CHARS),
        result_key=r.text("result_key", 1024),
        url=r.text("url", URL_MAX_CHARS),
        pages=r.count("pages") or 0,  # a node's count: one that is none reads as 0
        kill_reason=_kill_reason(r),
        kill_path=r.word("kill_path", 64),
        receipt=r.word("receipt", 8192),
        spot_requeues=r.count("spot_requeues") or 0,
        attempt_base=r.count("attemptBase") or 0,
        attempts=tuple(a for a in (_item_to_attempt(x, r) for x in raw_attempts) if a is not None),
        expire_at=r.count("expireAt", None),
        checkpoint=_checkpoint(r),
        mark=_mark(r),
        items=r.count("items", None),  # a node's count: one that is none reads as none
        staged=r.count("staged", None),
    )


def salvage_site(item: Mapping[str, Any]) -> tuple[int, int, int, tuple[Attempt, ...]]:
    """What can still be read of a site item that cannot be read whole (`item_to_site` raised): its attempts so
    far (`attemptCount`, or the highest attempt of its history), version, `attemptBase` and history, each 0 or
    empty where it cannot be read either."""
    r = Reader(item, None, str(item.get("run_id", "")), str(item.get("Site")))
    history = tuple(a for a in (_item_to_attempt(x, r) for x in r.listed("attempts", MAX_ATTEMPTS_READ) or []) if a)
    spent = max([r.count("attemptCount", 0) or 0, *(a.n for a in history)])
    return spent, r.count("version", 0) or 0, r.count("attemptBase", 0) or 0, history


def _reason(r: Reader) -> str | None:
    reason = r.word("failure_reason", 32)
    if reason is not None and known_reason(reason) is None:
        r.bad("failure_reason", f"{quote(reason)} is no reason")
        return None
    return reason


def _kill_reason(r: Reader) -> str | None:
    """The hub's kill mark (only the hub writes it): a value that is no reason is no mark."""
    reason = r.word("kill_reason", 32)
    return reason if known_reason(reason) is not None else None


def _checkpoint(r: Reader) -> dict[str, Any] | None:
    text = r.text("checkpoint", CHECKPOINT_MAX_CHARS * 2)
    if not text:
        return None
    try:
        value = decode_checkpoint(text)
    except (ValueError, RecursionError, zlib.error, binascii.Error) as e:
        r.bad("checkpoint", f"not a checkpoint ({type(e).__name__})")
        return None
    if not isinstance(value, dict):
        r.bad("checkpoint", "not a map")
        return None
    return value


def _mark(r: Reader) -> tuple[str, ...] | None:
    mark = r.listed("mark", 10 * MARK_READ)
    if mark is None:
        return None
    return tuple(m[:ITEM_ID_MAX_CHARS] for m in mark if isinstance(m, str))


#: Item ids a high-water mark read back may hold (`fleet.record.ops.MARK_SIZE` is what one keeps).
MARK_READ = 100


def _spec(r: Reader) -> SiteSpec:
    """The site's spec, which only a hub writes (at seeding): an item without a readable one is none a hub made."""
    spec = r.mapping("spec")
    if spec is None:
        raise r.unreadable("spec", "no spec: no hub seeded this site")
    s = Reader(spec, r.notes, r.partition, r.key)
    start_url, crawler = s.text("start_url", URL_MAX_CHARS), s.word("crawler", 512)
    if not start_url or not crawler:
        raise r.unreadable("spec", "no start_url or crawler")
    per_domain = s.number("per_domain_s", 0, 1e6)
    return SiteSpec(
        start_url,
        crawler,
        unnum(dict(s.mapping("options") or {})),  # plain numbers, as the crawler's job (JSON) takes them
        s.flag("incremental"),
        s.word("rate_limit", 256),
        s.number("per_s", 0, 1e9),
        s.flag("robots", True),
        _expect(spec.get("expect")),
        s.count("baseline_items", None),
        _markers(spec.get("blocked_markers")),
        per_domain or None,
    )


def spec_to_item(spec: SiteSpec) -> dict[str, Any]:
    out: dict[str, Any] = {
        "start_url": spec.start_url,
        "crawler": spec.crawler,
        "options": plain_to_item(dict(spec.options)),
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
    """`value` if it is a count (a whole number >= 0, not a bool), else None: a count read back from what a node
    could write (`fleet.record.readback.as_count`)."""
    return as_count(value)


def _expect(text: object) -> dict[str, Any]:
    """A spec's data contract as stored (JSON text): a mapping, else none."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
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
#: (`fleet.outputs.checkpoint`: the items are in parts beside the result); a checkpoint of the older form, holding its
#: items, has them dropped past this size (a DynamoDB item holds 400 KB at most), and is then not resumed from.
CHECKPOINT_MAX_CHARS = 300_000


def encode_checkpoint(ckpt: Mapping[str, Any]) -> str:
    raw = json.dumps(ckpt, separators=(",", ":"), default=str).encode()
    return "z:" + base64.b64encode(zlib.compress(raw, 6)).decode()


#: The most a stored checkpoint may inflate to: a node writes the compressed text, and a small text can hold a
#: very large document (a zip bomb), so decompression stops here and such a checkpoint is not read.
CHECKPOINT_MAX_BYTES = 16 * CHECKPOINT_MAX_CHARS


def decode_checkpoint(text: str) -> dict[str, Any]:
    """A stored checkpoint; ValueError (or zlib's, base64's, RecursionError) when the text is none."""
    if not text.startswith("z:"):
        raise ValueError("not a gridfleet checkpoint")
    inflate = zlib.decompressobj()
    raw = inflate.decompress(base64.b64decode(text[2:], validate=True), CHECKPOINT_MAX_BYTES)
    if inflate.unconsumed_tail:
        raise ValueError(f"a checkpoint inflates past {CHECKPOINT_MAX_BYTES} bytes")
    return json.loads(raw)


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
