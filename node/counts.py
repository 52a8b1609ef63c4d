"""What an attempt found, as the node counts it from its crawler's events: the `Counts` its attempt entry carries.

The crawler's events say how far the crawl got (`pages`, its checkpoint's included) and what it left out so far
(`collisions`, their first ids, `skipped` items without an id: `node.itemids`); each checkpoint brings the items
it saved. The attempt's own share is what it added to the checkpoint it resumed from: pages past the
checkpoint's, items beside the checkpoint's. The node writes the counts with each heartbeat and checkpoint (so an
attempt the hub ends still shows what it found) and with the attempt's end.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleet.logs import event
from fleet.record.state import Counts


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@dataclass
class AttemptCounter:
    base_pages: int = 0  # the pages of the checkpoint the attempt resumed from
    pages: int = 0  # the crawl's pages as last reported (the checkpoint's included)
    items: int = 0  # items this attempt saved in checkpoints
    collisions: int = 0
    skipped: int = 0
    robots_skipped: int = 0
    collided: tuple[str, ...] = ()
    first_skipped: str | None = None

    @classmethod
    def resumed(cls, resume: Mapping[str, Any] | None) -> AttemptCounter:
        """The counter of an attempt that starts from `resume` (None: from the start)."""
        base = _whole((resume or {}).get("pages")) or 0
        return cls(base_pages=base, pages=base)

    def heard(self, ev: Mapping[str, Any]) -> None:
        """A crawler's event (status, checkpoint, result, error): what it says of pages and left-out items. Each
        value is checked: the crawler's output is not trusted to be well formed."""
        pages = _whole(ev.get("pages"))
        if pages is not None:
            self.pages = max(self.pages, pages)
        for name in ("collisions", "skipped", "robots_skipped"):
            n = _whole(ev.get(name))
            if n is not None:
                setattr(self, name, max(getattr(self, name), n))
        ids = ev.get("collided")
        if isinstance(ids, list):
            self.collided = tuple(str(i) for i in ids)
        first = ev.get("first_skipped")
        if isinstance(first, str) and self.first_skipped is None:
            self.first_skipped = first

    def saved(self, items: int) -> None:
        """A checkpoint of this attempt saved `items` items."""
        self.items += items

    def counts(self, items: int | None = None) -> Counts:
        """The attempt's counts; `items` when its result says how many it added (else those it saved)."""
        added = self.items if items is None else max(0, items)
        pages = max(0, self.pages - self.base_pages)
        return Counts(added, pages, self.collisions, self.skipped, self.collided, self.robots_skipped)

    def told(self, log: logging.Logger, fields: Mapping[str, Any]) -> None:
        """One WARNING line when the crawl left items out: how many collided (the first ids) and how many had no
        id (the first of them), so no item goes missing without a word."""
        if not self.collisions and not self.skipped:
            return
        event(
            log,
            "items-left-out",
            logging.WARNING,
            **fields,
            collisions=self.collisions,
            collided=",".join(self.collided) or None,
            skipped=self.skipped,
            first_skipped=self.first_skipped,
            hint="give the site an id that tells its items apart" if self.collisions else None,
        )
