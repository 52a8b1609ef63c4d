"""Item identity within one crawl: which items a crawler emits, and why each one it does not emit was left out.

An item is known by its `id`. The first item of an id is kept; a later one of the same id is:
- a duplicate when its content is the same (a page listed twice, an item found again after a resume): kept once,
  not counted;
- a collision when its content differs (15 functions of one page that share its link as their id): counted, its
  id among the first few listed, never emitted (it would overwrite the first in the result, or be lost there);
- skipped when it has no id (missing, null or blank): counted, the first one kept to be shown.

`Ledger` holds what a crawl saw; `BaseCrawler.fresh` asks it of each page's items and `BaseCrawler.run` of each
item the crawler hands out, so a crawler that never calls `fresh` gets the same rules. Items of the checkpoint a
resumed crawl starts from are known too; their content may hold what was read after the listing (a detail page's
fields), so an item found again is compared with them on its own keys only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet.record.state import MAX_COLLIDED

#: Characters of an item kept to show it (a collision's two items, the first skipped one).
SHOWN_CHARS = 300


def item_id(item: Mapping[str, Any]) -> str | None:
    """The item's id as a string; None when it has none (missing, null, or a blank string)."""
    raw = item.get("id")
    if raw is None:
        return None
    key = raw if isinstance(raw, str) else str(raw)
    return key if key.strip() else None


def _digest(item: Mapping[str, Any]) -> str:
    return json.dumps(item, sort_keys=True, separators=(",", ":"), default=str)


def shown(item: Mapping[str, Any]) -> str:
    """An item as one line of JSON, cut to SHOWN_CHARS."""
    text = json.dumps(dict(item), ensure_ascii=False, default=str)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


@dataclass(frozen=True)
class Collision:
    """An item that was not emitted because `kept` came first with its id."""

    id: str
    kept: Mapping[str, Any]
    dropped: Mapping[str, Any]


@dataclass
class Tally:
    """What a crawl left out: collisions (the first MAX_COLLIDED listed), items skipped for want of an id, and
    pages its site's robots.txt disallows."""

    collisions: int = 0
    skipped: int = 0
    collided: list[Collision] = field(default_factory=list)
    first_skipped: Mapping[str, Any] | None = None
    robots_skipped: int = 0  # pages not fetched: the site's robots.txt disallows them (`BaseCrawler.allow`)

    def collide(self, key: str, kept: Mapping[str, Any], dropped: Mapping[str, Any]) -> None:
        self.collisions += 1
        if len(self.collided) < MAX_COLLIDED:
            self.collided.append(Collision(key, dict(kept), dict(dropped)))

    def skip(self, item: Mapping[str, Any]) -> None:
        self.skipped += 1
        if self.first_skipped is None:
            self.first_skipped = dict(item)

    def plain(self) -> dict[str, Any]:
        """As the crawler's events carry it to the node: counts, the collided ids, the first skipped item shown."""
        return {
            "collisions": self.collisions,
            "skipped": self.skipped,
            "collided": [c.id for c in self.collided],
            "first_skipped": shown(self.first_skipped) if self.first_skipped is not None else None,
            "robots_skipped": self.robots_skipped,
        }

    def lines(self) -> list[str]:
        """What a person is told of it: one line per listed collision, one for the skipped items."""
        out = [f"collision: id {c.id!r}: kept {shown(c.kept)}, dropped {shown(c.dropped)}" for c in self.collided]
        if self.collisions > len(self.collided):
            out.append(f"... and {self.collisions - len(self.collided)} more collisions")
        if self.skipped and self.first_skipped is not None:
            out.append(f"skipped {self.skipped} items with no id (first: {shown(self.first_skipped)})")
        return out


class Ledger:
    """The items a crawl has seen by id (those of its checkpoint too), and its `Tally` of those it left out."""

    def __init__(self, tally: Tally, earlier: Iterable[Any] = ()):
        self.tally = tally
        self.seen: dict[str, tuple[str, Mapping[str, Any]]] = {}  # id -> (content when first seen, the item)
        self.earlier: dict[str, Mapping[str, Any]] = {}  # the checkpoint's items: compared on the new item's keys
        for item in earlier:
            key = item_id(item) if isinstance(item, Mapping) else None
            if key is not None:
                self.earlier.setdefault(key, item)

    def __contains__(self, key: object) -> bool:
        return key in self.seen or key in self.earlier

    def add(self, key: str) -> None:
        """Know `key` without its content (as a set of ids took it): an item found with it later is a duplicate."""
        self.earlier.setdefault(key, {})

    def __len__(self) -> int:
        return len(self.seen.keys() | self.earlier.keys())

    def admit(self, item: Mapping[str, Any]) -> dict[str, Any] | None:
        """The item as a new dict to emit, or None: a duplicate, a collision or an item without an id (the
        latter two counted in the tally)."""
        key = item_id(item)
        if key is None:
            self.tally.skip(item)
            return None
        held = self.seen.get(key)
        if held is not None:
            if held[0] != _digest(item):
                self.tally.collide(key, held[1], item)
            return None
        before = self.earlier.get(key)
        if before is not None:
            if before and any(before.get(k) != v for k, v in item.items() if k != "id"):
                self.tally.collide(key, before, item)
            return None
        kept = dict(item)
        self.seen[key] = (_digest(kept), kept)
        return kept
