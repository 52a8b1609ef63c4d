"""The stamp of a site: what the hub watches of an open site, as the sparse index `open` projects it.

Equal stamps mean an unchanged record. The hub reads the stamps each tick and reads a record whole only when
its stamp moved by a transition; a stamp that moved by progress patches the hub's copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleet.state import SiteRecord, SiteStatus

#: What the hub watches of an open site, read each tick through the sparse index (its projection). The first
#: four change only with a transition (claim, end of an attempt, kill mark, completion, rerun): the hub then
#: reads the whole record. The rest change with a node's progress, heartbeat or the enqueued mark (and the
#: version with them): the hub patches its copy from the stamp without reading the record.
STAMP_ATTRS = (
    "attemptCount",
    "instance_id",
    "run_status",
    "kill_reason",
    "version",
    "site_status",
    "lastUpdateEpoch",
    "heartbeatEpoch",
    "enqueued",
    "pages",
    "url",
)
TRANSITION_FIELDS = 4

Stamp = tuple  # the values of STAMP_ATTRS


def item_stamp(item: Mapping[str, Any]) -> Stamp:
    """The stamp of a site item (as stored or as read back): equal stamps mean an unchanged record."""
    g = item.get
    return (
        int(g("attemptCount", 0)),
        g("instance_id"),
        g("run_status"),
        g("kill_reason"),
        int(g("version", 0)),
        g("site_status"),
        _num_or_none(g("lastUpdateEpoch")),
        _num_or_none(g("heartbeatEpoch")),
        bool(g("enqueued", False)),
        int(g("pages", 0)),
        g("url"),
    )


def _num_or_none(v: Any) -> float | None:
    return float(v) if v is not None else None


def record_stamp(r: SiteRecord) -> Stamp:
    return (
        r.attempt,
        r.instance_id,
        str(r.run_status),
        r.kill_reason,
        r.version,
        str(r.site_status),
        _num_or_none(r.last_update),
        _num_or_none(r.heartbeat),
        r.enqueued,
        r.pages,
        r.url,
    )


def patch_from_stamp(r: SiteRecord, st: Stamp) -> SiteRecord:
    """`r` with the progress fields of a newer stamp whose transition fields are the same as `r`'s (a copy
    with those fields set: many per tick, and the fields need no validation, they were read back as written)."""
    new = object.__new__(SiteRecord)
    new.__dict__.update(r.__dict__)
    new.__dict__.update(zip(_PATCHED, (st[4], SiteStatus(st[5]), st[6], st[7], st[8], st[9], st[10]), strict=True))
    return new


_PATCHED = ("version", "site_status", "last_update", "heartbeat", "enqueued", "pages", "url")
