"""Making a staged result a site's result: what the hub does for an attempt its node left SAVED.

A node may write only under its own prefix of the bucket (`fleet.outputs.results.staging_prefix`), so the result a node
stages is no site's result until the hub copies it to the key the site, the run's date and the run derive (never a
key a node named), from the prefix of the node the record says holds the attempt, under the claim the record says
it staged. A SAVED that nothing staged backs (a node that wrote it into a record it does not hold, or a build that
staged elsewhere) makes no result: the attempt ends as an error instead (`hub.executor`).
"""

from __future__ import annotations

from fleet.outputs.results import (
    EXISTED,
    MISSING,
    PROMOTED,
    ResultStore,
    checked_result_key,
    staged_result_key,
    writer_id,
)
from fleet.record import ops
from fleet.record.ids import is_node_id
from fleet.record.messages import SiteQueue
from fleet.record.state import SiteRecord
from fleet.record.table import StateTable


def staged_of(rec: SiteRecord, run_date: str, role: str) -> str | None:
    """The key a SAVED record's node staged its result under (`staged` 0: nothing staged), or None when the record
    names none that can be (no node, or no claim)."""
    if not rec.staged or not rec.instance_id or not is_node_id(rec.instance_id):
        return None
    return staged_result_key(writer_id(role, rec.instance_id), rec.site, run_date, rec.run_id, rec.attempt, rec.staged)


def promote(
    table: StateTable, results: ResultStore, queue: SiteQueue, rec: SiteRecord, run_date: str, role: str, now: float
) -> tuple[str, SiteRecord | None]:
    """Make `rec`'s staged result its site's result, then COMPLETED (its counts as its node wrote them) and the
    attempt's message deleted. Returns what the store answered (`fleet.outputs.results.PROMOTED`, EXISTED, MISSING,
    TOO_LARGE) and the new record, None when there is no result to complete with (the caller ends the attempt).
    StaleWrite when the record moved on since it was read."""
    key = checked_result_key(rec.site, run_date, rec.run_id)
    if rec.staged == 0:  # the node found the run's result at its key already
        answer = EXISTED if results.exists(key) else MISSING
    else:
        staged = staged_of(rec, run_date, role)
        answer = results.promote(staged, key) if staged is not None else MISSING
    if answer not in (EXISTED, PROMOTED):
        return answer, None
    new = ops.complete(table, rec, key, now, skipped=rec.staged == 0, items=rec.items, pages=rec.pages)
    if rec.receipt:
        queue.delete_receipt(rec.receipt)
    return answer, new
