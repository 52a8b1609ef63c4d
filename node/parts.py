"""An attempt's side of the checkpoint (`fleet.outputs.checkpoint`): the parts it reads when it resumes and those it
writes.

A resumed attempt reads the parts its checkpoint names (its ids checked before
they become keys) and hands their items to the crawler, which skips them, and to
the result, which holds each once. After each page the new items are staged;
the next save's part carries every staged item, and only once it is stored does
the record's checkpoint count it: a part that could not be written stays staged
for the next save, and a checkpoint never names a part that is not there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from fleet.logs import event
from fleet.outputs import checkpoint as ck
from fleet.outputs.results import ResultStore
from fleet.record import ops
from fleet.record.codec import ERROR_MAX_CHARS, capped
from fleet.record.state import SiteRecord

log = logging.getLogger("gridfleet.node")


@dataclass
class Parts:
    """This claim's parts (`fleet.outputs.checkpoint.ClaimParts`) and the items waiting for the next one."""

    claim: ck.ClaimParts
    staged: list[dict[str, Any]] = field(default_factory=list)  # items no stored part holds yet

    def stage(self, items: list[dict[str, Any]]) -> None:
        self.staged.extend(items)

    def next_part(self) -> tuple[str, bytes] | None:
        """(key, body) of the part holding every staged item; None when nothing is staged."""
        return (self.claim.next_key(), ck.part_body(self.staged)) if self.staged else None

    def stored(self) -> None:
        """The part `next_part` gave is in the store."""
        self.claim.stored(len(self.staged))
        self.staged = []

    def store(self, save: Callable[[str, bytes], bool | None], read: Callable[[str], bytes] | None = None) -> bool:
        """Store the staged items as the next part with `save(key, body)` (True: written; False: the key holds a
        part already; None: not written, an error said); False when they are not all stored (what is not stays
        staged, so the checkpoint never names a part that is not there). Nothing staged: True.

        A part is a new object only, under this node's own prefix: a key that holds one already holds what this
        claim wrote there when a save seemed to fail (a timeout after S3 took it), the first of the items staged
        now. Those count as stored (`read` reads the part back), and the rest go into the next part."""
        part = self.next_part()
        if part is None:  # the staged pages found no items: nothing to store, their cursor may be saved
            self.claim.stored(0)
            return True
        written = save(*part)
        if written is None:
            return False
        if written:
            self.stored()
            return True
        held = ck.part_items(read(part[0])) if read is not None else []
        if not held or held != self.staged[: len(held)]:
            raise ValueError(f"{part[0]} holds a part that is not this claim's staged items")
        self.claim.stored(len(held))
        self.staged = self.staged[len(held) :]
        return self.store(save, read)


def load(results: ResultStore, rec: SiteRecord, run_date: str, writer: str) -> tuple[Parts, Mapping[str, Any] | None]:
    """This claim's parts (written under `writer`'s prefix) and the checkpoint it resumes from (for the crawler: its
    items listed), read from the parts its record's checkpoint names. A checkpoint whose parts cannot be read is
    not resumed from: the crawl starts over (its items are found again), which costs pages, never items."""
    claim = ck.ClaimParts((rec.site, run_date, rec.run_id), rec.attempt, rec.version, writer)
    parts = Parts(claim)
    ckpt = ops.resumable(rec)
    if not ckpt:
        return parts, None
    if ck.is_legacy(ckpt):  # an older node's checkpoint: its items go into this claim's first part
        items = [i for i in ckpt["items"] if isinstance(i, dict)]
        parts.stage(items)
        return parts, {**ckpt, "items": items}
    try:
        claim.earlier = ck.segments(ckpt)
        items = []
        for key in claim.earlier_keys():
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
        return Parts(ck.ClaimParts(claim.where, claim.attempt, claim.claim, writer)), None
    claim.saved_items = len(items)
    return parts, {**ckpt, "items": items}
