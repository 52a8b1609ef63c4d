"""What hub and node do to a site record: each operation is a `transition()` then a fenced write.

Both programs use these and nothing else to change a site, so the record's
rules live in one place: attempts are counted on claim, a spot interruption
gives its attempt back (up to a cap), the last failed attempt makes the site
FAILED with its reason, and a requeue is "write QUEUED, send the message, mark
it sent" (a crash between the last two is repaired by the hub, see `plan`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleet.clock import Clock
from fleet.errors import StaleWrite
from fleet.record.codec import (
    CHECKPOINT_MAX_CHARS,
    ERROR_MAX_CHARS,
    ITEM_ID_MAX_CHARS,
    URL_MAX_CHARS,
    capped,
    encode_checkpoint,
    salvage_site,
)
from fleet.record.failures import Failure, RetryPolicy, decide, of_reason
from fleet.record.messages import SiteQueue
from fleet.record.readback import UnreadableItem
from fleet.record.state import (
    COLLIDED_ID_MAX_CHARS,
    GIVEN_BACK,
    MAX_COLLIDED,
    Attempt,
    Counts,
    Outcome,
    Reason,
    RunStatus,
    SiteRecord,
    SiteSpec,
    SiteStatus,
    transition,
)
from fleet.record.table import StateTable


def new_site(
    run_id: str, site: str, spec: SiteSpec, expire_at: int | None, mark: tuple[str, ...] | None = None
) -> SiteRecord:
    return SiteRecord(run_id=run_id, site=site, spec=spec, expire_at=expire_at, mark=mark)


#: Item ids an incremental site's high-water mark keeps (its newest).
MARK_SIZE = 100


def next_mark(old: tuple[str, ...] | None, new_ids: list[str]) -> tuple[str, ...] | None:
    """The mark after a successful crawl that found `new_ids` (newest first); None: unchanged."""
    # An id longer than ITEM_ID_MAX_CHARS is dropped from the mark rather than cut: a cut id would match no item
    # of the next crawl anyway, and an item missing from the mark is only fetched again.
    new_ids = [i for i in new_ids if len(i) <= ITEM_ID_MAX_CHARS]
    if not new_ids:
        return None
    merged = list(dict.fromkeys([*new_ids, *(old or ())]))
    return tuple(merged[:MARK_SIZE])


class Verdict(enum.Enum):
    CLAIM = "claim"  # attempt N may start now
    STALE = "stale"  # attempt N has been and gone (or the site is done): drop the message
    WAIT = "wait"  # attempt N is running elsewhere, or its requeue is under way: look again later


def classify(rec: SiteRecord | None, attempt: int) -> Verdict:
    """What a node should do with a message for `attempt` of a site in state `rec`."""
    if rec is None or rec.is_terminal:
        return Verdict.STALE
    if rec.run_status is RunStatus.QUEUED:
        if rec.attempt == attempt - 1:
            return Verdict.CLAIM
        return Verdict.STALE if rec.attempt >= attempt else Verdict.WAIT
    # RUN: a SAVED attempt has been (its result is staged: only the hub's part is left)
    if rec.attempt > attempt or (rec.site_status is SiteStatus.SAVED and rec.attempt == attempt):
        return Verdict.STALE
    return Verdict.WAIT


def claim(table: StateTable, rec: SiteRecord, instance_id: str, now: float, receipt: str | None = None) -> SiteRecord:
    """Start an attempt; `receipt` (of the message that asked for it) lets the hub delete that message later."""
    new = transition(
        rec,
        run_status=RunStatus.RUN,
        site_status=SiteStatus.PENDING,
        attempt=rec.attempt + 1,
        instance_id=instance_id,
        last_update=now,
        heartbeat=now,
        enqueued=False,
        url=None,
        pages=0,
        kill_reason=None,
        error=None,
        retry_at=None,
        avoid_instance=None,
        receipt=receipt,
        staged=None,
        attempts=rec.attempts + (Attempt(rec.attempt + 1, instance_id, now, counts=Counts()),),
    )
    return table.write(rec, new)


def bounded(counts: Counts) -> Counts:
    """`counts` as a record keeps them: at most MAX_COLLIDED collided ids, each cut to COLLIDED_ID_MAX_CHARS (a
    crawler's output is not trusted to be small), no count below 0."""
    ids = tuple(capped(i, COLLIDED_ID_MAX_CHARS) for i in counts.collided[:MAX_COLLIDED])
    c = counts
    return Counts(
        max(0, c.items), max(0, c.pages), max(0, c.collisions), max(0, c.skipped), ids, max(0, c.robots_skipped)
    )


def _counted(rec: SiteRecord, counts: Counts | None) -> dict[str, Any]:
    """The record's changes that put `counts` on its current attempt (none when unchanged or there is none)."""
    cur = rec.current_attempt
    if counts is None or cur is None:
        return {}
    kept = bounded(counts)
    if cur.counts == kept:
        return {}
    return {"attempts": rec.attempts[:-1] + (dataclasses.replace(cur, counts=kept),)}


def report(
    table: StateTable,
    rec: SiteRecord,
    site_status: SiteStatus,
    now: float,
    *,
    url: str | None = None,
    pages: int | None = None,
) -> SiteRecord:
    """Crawler progress: RUNNING, URL_CALL (before a navigation), CALL_DONE (after)."""
    return table.write(rec, transition(rec, **_step(site_status, now, url, pages)))


def _step(site_status: SiteStatus, at: float, url: str | None, pages: int | None) -> dict[str, Any]:
    """The record's fields for a crawler step (url and pages only when the step names them)."""
    changes: dict[str, Any] = {"site_status": site_status, "last_update": at}
    if url is not None:
        changes["url"] = capped(url, URL_MAX_CHARS)
    if pages is not None:
        changes["pages"] = pages
    return changes


@dataclass(frozen=True)
class Progress:
    """The crawler's latest step, held by the node until its next heartbeat writes it."""

    site_status: SiteStatus
    at: float  # epoch of the step (lastUpdateEpoch)
    url: str | None = None
    pages: int | None = None


def beat(
    table: StateTable,
    rec: SiteRecord,
    now: float,
    progress: Progress | None = None,
    counts: Counts | None = None,
    **extra: Any,
) -> SiteRecord:
    """The node's heartbeat on its attempt; fenced. Alone it moves no version; with the crawler's progress since
    the last write (one write for any number of steps: the hub needs the latest, not each) it does. `counts`
    (what the attempt found so far) ride on the same write, on the current attempt's entry."""
    extra = {**extra, **_counted(rec, counts)}
    if progress is None or (progress.site_status, progress.at) == (rec.site_status, rec.last_update):
        return table.write(rec, transition(rec, bump=False, heartbeat=now, **extra))
    changes = _step(progress.site_status, progress.at, progress.url, progress.pages)
    return table.write(rec, transition(rec, **changes, heartbeat=now, **extra))


def save_checkpoint(
    table: StateTable,
    rec: SiteRecord,
    now: float,
    progress: Progress | None,
    checkpoint: Mapping[str, Any],
    counts: Counts | None = None,
) -> SiteRecord:
    """Where the crawl got to, with the heartbeat and progress: a retry of the site resumes from it. A node
    writes the cursor and counts (`fleet.outputs.checkpoint`: the items are in parts beside the result). A checkpoint of
    the older form, holding the items themselves, has its item ids cut and, when too large for an item, keeps
    no items and is not resumed from."""
    ckpt = dict(checkpoint)
    if isinstance(ckpt.get("items"), list):
        ckpt["items"] = _cut_item_ids(ckpt["items"])
    if len(encode_checkpoint(ckpt)) > CHECKPOINT_MAX_CHARS:
        ckpt = {"next": ckpt.get("next"), "pages": ckpt.get("pages"), "items": [], "partial": True}
    return beat(table, rec, now, progress, counts, checkpoint=ckpt)


def _cut_item_ids(items: Any) -> list[Any]:
    """A checkpoint's items, each id longer than ITEM_ID_MAX_CHARS cut to that length. The item is kept (the
    result needs it; the checkpoint's own size limit bounds the rest of it), and when a resumed crawl finds it
    again the node matches the two by the cut id (`node.agent.merged_items`)."""
    out = []
    for item in items or []:
        if isinstance(item, Mapping) and item.get("id") is not None and len(str(item["id"])) > ITEM_ID_MAX_CHARS:
            item = {**item, "id": capped(item["id"], ITEM_ID_MAX_CHARS)}
        out.append(item)
    return out


def resumable(rec: SiteRecord) -> Mapping[str, Any] | None:
    """The checkpoint a new attempt of the site resumes from, if any (`next` None: every page was fetched)."""
    c = rec.checkpoint
    return c if c and not c.get("partial") else None


def mark_enqueued(table: StateTable, rec: SiteRecord) -> SiteRecord:
    return table.write(rec, transition(rec, bump=False, enqueued=True))


def saved(
    table: StateTable,
    rec: SiteRecord,
    now: float,
    *,
    staged: int,
    counts: Counts | None = None,
    items: int | None = None,
    pages: int | None = None,
) -> SiteRecord:
    """The node staged the attempt's result under its own prefix (`staged`: the version its claim wrote, which names
    the staged key; 0: the run's result was at its key already, nothing staged): SAVED, with the attempt's
    `counts` and the result's `items` and `pages`. The hub makes it the site's result (`complete`): the node role
    cannot write a result where readers take one from."""
    changes: dict[str, Any] = {
        "site_status": SiteStatus.SAVED,
        "last_update": now,
        "heartbeat": now,
        "staged": max(0, int(staged)),
        "items": None if items is None else max(0, int(items)),
        "pages": rec.pages if pages is None else max(0, int(pages)),
        **_counted(rec, counts),
    }
    return table.write(rec, transition(rec, **changes))


def complete(
    table: StateTable,
    rec: SiteRecord,
    result_key: str,
    now: float,
    *,
    skipped: bool = False,
    counts: Counts | None = None,
    items: int | None = None,
    pages: int | None = None,
) -> SiteRecord:
    """The result is at its key: COMPLETED, with the attempt's `counts` (None: those its node last wrote) and the
    result's `items` and `pages` (None: not known, e.g. a result an earlier attempt left that could not be read).
    The hub's, once it has made a SAVED attempt's staged result the site's result."""
    attempts = _close(rec, now, Outcome.SKIPPED if skipped else Outcome.COMPLETED, counts=counts)
    new = transition(
        rec,
        run_status=RunStatus.COMPLETED,
        site_status=SiteStatus.COMPLETED,
        result_key=result_key,
        last_update=now,
        failure_reason=None,
        kill_reason=None,
        attempts=attempts,
        receipt=None,
        checkpoint=None,
        staged=None,
        items=None if items is None else max(0, int(items)),
        pages=rec.pages if pages is None else max(0, int(pages)),
    )
    return table.write(rec, new)


def request_kill(table: StateTable, rec: SiteRecord, reason: Reason, now: float) -> SiteRecord:
    """The hub's mark before it kills an attempt: fences the node off (its next write fails)."""
    return table.write(rec, transition(rec, kill_reason=str(reason)))


def end_attempt(
    table: StateTable,
    rec: SiteRecord,
    *,
    reason: Reason,
    now: float,
    max_attempts: int,
    spot_cap: int,
    kill_path: str | None = None,
    error: str | None = None,
    counts: Counts | None = None,
    failure: Failure | None = None,
    policy: RetryPolicy | None = None,
) -> SiteRecord:
    """The current attempt ended without a result: requeue (QUEUED, message not yet sent) or FAILED (out of
    attempts, or its failure's rule in `policy` says fail). A retry may wait (`retry_at`: the message is sent
    then) and avoid this instance (`avoid_instance`). `failure` is the attempt's class, as the node saw it; without
    one the reason gives it (`fleet.record.failures.of_reason`). The node that ends its own attempt gives its `counts`;
    the hub's end keeps those the node last wrote."""
    failed = failure if failure is not None else of_reason(reason)
    pair = (str(failed.cls), failed.status) if failed is not None else (None, None)
    attempts = _close(rec, now, Outcome.of(reason), kill_path, counts, pair)
    common: dict[str, Any] = {
        "last_update": now,
        "kill_reason": None,
        "attempts": attempts,
        "failure_reason": str(reason),
        "failure_class": pair[0],
        "http_status": pair[1],
        "retry_at": None,
        "avoid_instance": None,
        "url": None,
        "receipt": None,
        "staged": None,
    }
    if kill_path is not None:
        common["kill_path"] = kill_path
    if error is not None:
        common["error"] = capped(error, ERROR_MAX_CHARS)
    spent = rec.attempt - rec.attempt_base
    if reason in GIVEN_BACK and rec.spot_requeues < spot_cap:
        new = transition(
            rec,
            run_status=RunStatus.QUEUED,
            site_status=SiteStatus.PENDING,
            enqueued=False,
            attempt=rec.attempt - 1,
            spot_requeues=rec.spot_requeues + 1,
            **common,
        )
        return table.write(rec, new)
    step = decide(policy or RetryPolicy(), failed, failures=spent, now=now, instance_id=rec.instance_id)
    if step.retry and spent < max_attempts:
        common.update(retry_at=step.not_before, avoid_instance=step.avoid)
        new = transition(rec, run_status=RunStatus.QUEUED, site_status=SiteStatus.PENDING, enqueued=False, **common)
    else:
        new = transition(rec, run_status=RunStatus.FAILED, site_status=SiteStatus.FAILED, **common)
    return table.write(rec, new)


def fail_now(table: StateTable, rec: SiteRecord, reason: Reason, now: float, *, error: str | None = None) -> SiteRecord:
    """End the site FAILED whatever attempts remain (deadline, teardown)."""
    new = transition(
        rec,
        run_status=RunStatus.FAILED,
        site_status=SiteStatus.FAILED,
        failure_reason=str(reason),
        last_update=now,
        kill_reason=None,
        attempts=_close(rec, now, Outcome.of(reason)),
        receipt=None,
        error=capped(error, ERROR_MAX_CHARS) if error else rec.error,
    )
    return table.write(rec, new)


def fail_open_sites(table: StateTable, run_id: str, reason: Reason, clock: Clock, *, error: str) -> tuple[str, ...]:
    """Mark every site of the run that is not terminal FAILED with `reason`, as a run that is ended from outside its
    hub (teardown, the watchdog) must. A node that writes in between is looked at again: a result it wrote first
    stands. Returns the sites failed."""
    failed = []
    for r in table.read_run(run_id).sites:
        while not r.is_terminal:
            try:
                fail_now(table, r, reason, clock.now(), error=error)
                failed.append(r.site)
                break
            except StaleWrite as e:  # a node wrote in between: look again
                if e.current is None:
                    break
                r = e.current
    return tuple(failed)


def reopen(table: StateTable, rec: SiteRecord, now: float, spec: SiteSpec | None = None) -> SiteRecord:
    """An operator's rerun: a FAILED (or, forced, COMPLETED) site is QUEUED again with max_attempts fresh attempts.

    The history of its attempts stays; the message is sent by `send_next`, as for any requeue."""
    new = transition(
        rec,
        reopen=True,
        run_status=RunStatus.QUEUED,
        site_status=SiteStatus.PENDING,
        enqueued=False,
        attempt_base=rec.attempt,
        failure_reason=None,
        error=None,
        kill_reason=None,
        result_key=None,
        items=None,
        url=None,
        receipt=None,
        last_update=now,
        checkpoint=None,
        staged=None,
        spec=spec if spec is not None else rec.spec,
    )
    return table.write(rec, new)


def repaired(
    bad: UnreadableItem, spec: SiteSpec, now: float, *, max_attempts: int, expire_at: int | None
) -> SiteRecord:
    """The record the hub puts over a site item no one can read (`fleet.record.readback`: a node wrote what is no status
    or fence into it): what can still be read of its history, the attempt under way ended as an error (the node
    that held it is fenced off: the item is replaced), then QUEUED for the next attempt, or FAILED when none is
    left. Not a `transition()`: there is no readable record to move from; the version moves past the one read."""
    run_id, site = str((bad.raw or {}).get("run_id", "")), str((bad.raw or {}).get("Site", ""))
    spent, version, base, history = salvage_site(bad.raw or {})
    if history and history[-1].end is None:
        history = history[:-1] + (history[-1].finished(now, Outcome.ERROR, failure=("error", None)),)
    failed = spent - base >= max_attempts
    why = f"its record could not be read ({bad.unread.attr or 'item'}: {bad.unread.why}); repaired by the hub"
    return SiteRecord(
        run_id=run_id,
        site=site,
        spec=spec,
        run_status=RunStatus.FAILED if failed else RunStatus.QUEUED,
        site_status=SiteStatus.FAILED if failed else SiteStatus.PENDING,
        attempt=spent,
        version=version + 1,
        last_update=now,
        failure_reason=str(Reason.ERROR),
        failure_class="error",
        error=capped(why, ERROR_MAX_CHARS),
        attempt_base=base,
        attempts=history,
        expire_at=expire_at,
    )


def send_next(table: StateTable, queue: SiteQueue, rec: SiteRecord) -> SiteRecord:
    """Send the message for the next attempt of a QUEUED site, then mark it sent."""
    if rec.run_status is not RunStatus.QUEUED or rec.enqueued:
        return rec
    queue.send(rec.run_id, rec.site, rec.attempt + 1, rec.spot_requeues)
    return mark_enqueued(table, rec)


def _close(
    rec: SiteRecord,
    now: float,
    outcome: Outcome,
    kill_path: str | None = None,
    counts: Counts | None = None,
    failure: tuple[str | None, int | None] = (None, None),
) -> tuple[Attempt, ...]:
    cur = rec.current_attempt
    if cur is None:
        return rec.attempts
    kept = None if counts is None else bounded(counts)
    return rec.attempts[:-1] + (cur.finished(now, outcome, kill_path, kept, failure),)
