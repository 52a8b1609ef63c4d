"""The stamp of a site: what the hub watches of an open site, as the sparse index `open` projects it.

Equal stamps mean an unchanged record. The hub reads the stamps each tick and reads a record whole only when
its stamp moved by a transition; a stamp that moved by progress patches the hub's copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleet.record.codec import URL_MAX_CHARS
from fleet.record.readback import as_count, as_epoch
from fleet.record.state import SITE_FOR_RUN, RunStatus, SiteRecord, SiteStatus, known_reason

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


#: A stamp's value that could not be read back (nodes write these attributes: any type may be there). A stamp
#: holding it is never patched from: the record is read whole (`fleet.record.codec.item_to_site`), which makes it whole
#: or leaves it out.
UNREAD = "\x00unreadable"

_RUN_STATUSES = frozenset(s.value for s in RunStatus)
_SITE_STATUSES = frozenset(s.value for s in SiteStatus)


def item_stamp(item: Mapping[str, Any]) -> Stamp:
    """The stamp of a site item (as stored or as read back): equal stamps mean an unchanged record. Reading it
    never raises: what cannot be read is UNREAD (or, for progress, absent)."""
    g = item.get
    attempt, version = as_count(g("attemptCount", 0)), as_count(g("version", 0))
    iid, run_status, site_status = g("instance_id"), g("run_status"), g("site_status")
    if iid is not None and not (isinstance(iid, str) and 0 < len(iid) <= 64):
        iid = UNREAD
    if not isinstance(run_status, str) or run_status not in _RUN_STATUSES:
        run_status = UNREAD
    elif (
        not isinstance(site_status, str)
        or site_status not in _SITE_STATUSES
        or SiteStatus(site_status) not in SITE_FOR_RUN[RunStatus(run_status)]
    ):
        site_status = UNREAD
    kill, url, enqueued = g("kill_reason"), g("url"), g("enqueued", False)
    return (
        UNREAD if attempt is None else attempt,
        iid,
        run_status,
        kill if isinstance(kill, str) and known_reason(kill) is not None else None,
        UNREAD if version is None else version,
        site_status,
        as_epoch(g("lastUpdateEpoch")),
        as_epoch(g("heartbeatEpoch")),
        enqueued if isinstance(enqueued, bool) else False,
        as_count(g("pages", 0)) or 0,
        url[:URL_MAX_CHARS] if isinstance(url, str) else None,
    )


def patchable(st: Stamp) -> bool:
    """Whether a record may be patched from the stamp: every value of it was read (`UNREAD` is in none), and it is
    no SAVED (the node staged its result: the record says under which claim, which no stamp carries)."""
    return UNREAD not in st and st[5] != SiteStatus.SAVED.value


def record_stamp(r: SiteRecord) -> Stamp:
    return (
        r.attempt,
        r.instance_id,
        str(r.run_status),
        r.kill_reason,
        r.version,
        str(r.site_status),
        None if r.last_update is None else float(r.last_update),
        None if r.heartbeat is None else float(r.heartbeat),
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
