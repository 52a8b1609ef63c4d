"""An attempt's side of the checkpoint (`fleet.checkpoint`): the parts it reads when it resumes and those it writes.

A resumed attempt reads the parts its checkpoint names (its ids checked before
they become keys) and hands their items to the crawler, which skips them, and to
the result, which holds each once. After each page the new items are staged;
the next part carries every staged item, and only once it is stored does the
record's checkpoint count it: a part that could not be written stays staged for
the next checkpoint, and a checkpoint never names a part that is not there.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from fleet import checkpoint as ck
from fleet import ops
from fleet.aws.results import ResultStore, part_key
from fleet.codec import ERROR_MAX_CHARS, capped
from fleet.logs import event
from fleet.state import SiteRecord

log = logging.getLogger("gridfleet.node")


@dataclass
class Parts:
    """The parts of one claim of a site: where they go, what earlier claims saved, what waits for a part."""

    where: tuple[str, str, str]  # (site, run date, run id)
    attempt: int
    claim: int  # the record's version the claim wrote
    earlier: list[ck.Segment] = field(default_factory=list)
    saved_items: int = 0  # items in the parts the checkpoint names (earlier claims' and this one's)
    written: int = 0  # parts this claim has stored
    staged: list[dict[str, Any]] = field(default_factory=list)  # items no stored part holds yet

    def stage(self, items: list[dict[str, Any]]) -> None:
        self.staged.extend(items)

    def next_part(self) -> tuple[str, bytes] | None:
        """(key, body) of the part holding every staged item; None when nothing is staged."""
        if not self.staged:
            return None
        site, run_date, run_id = self.where
        key = part_key(site, run_date, run_id, self.attempt, self.claim, self.written + 1)
        return key, ck.part_body(self.staged)

    def stored(self) -> None:
        """The part `next_part` gave is in the store."""
        self.written += 1
        self.saved_items += len(self.staged)
        self.staged = []

    def checkpoint(self, next_ref: Any, pages: Any) -> dict[str, Any]:
        mine = ck.Segment(self.attempt, self.claim, self.written)
        return ck.make(next_ref, pages, self.saved_items, [*self.earlier, mine])


def load(results: ResultStore, rec: SiteRecord, run_date: str) -> tuple[Parts, Mapping[str, Any] | None]:
    """This claim's parts and the checkpoint it resumes from (for the crawler: its items listed), read from the
    parts its record's checkpoint names. A checkpoint whose parts cannot be read is not resumed from: the crawl
    starts over (its items are found again), which costs pages, never items."""
    parts = Parts((rec.site, run_date, rec.run_id), rec.attempt, rec.version)
    ckpt = ops.resumable(rec)
    if not ckpt:
        return parts, None
    if ck.is_legacy(ckpt):  # an older node's checkpoint: its items go into this claim's first part
        items = [i for i in ckpt["items"] if isinstance(i, dict)]
        parts.stage(items)
        return parts, {**ckpt, "items": items}
    try:
        segs = ck.segments(ckpt)
        items = []
        for key in ck.part_keys(rec.site, run_date, rec.run_id, segs):
            items.extend(ck.part_items(results.get(key)))
    except (ClientError, BotoCoreError, ValueError) as e:
        event(
            log,
            "resume-missed",
            logging.WARNING,
            run_id=rec.run_id,
            site=rec.site,
            attempt=rec.attempt,
            error=capped(e, ERROR_MAX_CHARS),
        )
        return parts, None
    parts.earlier, parts.saved_items = segs, len(items)
    return parts, {**ckpt, "items": items}
