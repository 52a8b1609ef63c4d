"""Reading back what nodes wrote: every value is checked, and a value that cannot be read is absent.

A node opens strangers' pages all day, and its role may write many attributes of the table (`infra/terraform`,
the node's policy): a node taken over, or an old or buggy build, can write any DynamoDB type into any of them,
and add items under any key of the partitions it may write. No read of the table may raise on that, and no
decision may rest on it. So each attribute is read through one of the readers here: a value of the wrong type
or out of range reads as absent (its default), and is noted, once per process for each key and attribute, in
the log and in the read's `Unread` list, which `summary.json` counts (`unreadable`). An item that cannot stand
as what its key says (a site item no hub seeded, a fence or status no one can reason from) raises
`UnreadableItem`: the reader leaves it out, notes it, and the hub repairs it when it is one of its sites.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Any, TypeVar

from fleet.errors import quote

log = logging.getLogger("gridfleet.readback")

E = TypeVar("E", bound=StrEnum)

#: The latest epoch a time read back may hold (year 5138): anything later is no time of this fleet.
MAX_EPOCH = 1e11
#: The largest count read back (attempts, pages, items, versions): a DynamoDB number may hold 38 digits.
MAX_COUNT = 10**12


@dataclass(frozen=True)
class Unread:
    """One value (or, `attr` empty, one whole item) that could not be read: where, and why."""

    partition: str
    key: str
    attr: str
    why: str

    def line(self) -> str:
        where = f"{quote(self.partition)}/{quote(self.key)}"
        return f"{where} {self.attr}: {self.why}" if self.attr else f"{where}: {self.why}"


class UnreadableItem(ValueError):
    """An item that cannot stand as what its key says; `raw` is the item as it was read (for a repair's condition)."""

    def __init__(self, unread: Unread, raw: Mapping[str, Any] | None = None):
        super().__init__(unread.line())
        self.unread = unread
        self.raw = raw


_said: set[tuple[str, str, str]] = set()
_said_lock = threading.Lock()
#: Distinct (partition, key, attribute) triples logged; past this, the rest are counted only (a hostile node can
#: write many keys, and the log is not the place for all of them).
MAX_LOGGED = 10_000


def say_once(u: Unread) -> None:
    """Log `u` the first time this process meets its key and attribute."""
    k = (u.partition, u.key, u.attr)
    with _said_lock:
        if k in _said or len(_said) >= MAX_LOGGED:
            return
        _said.add(k)
    log.warning("unreadable %s", u.line())


def forget() -> None:
    """Forget what was logged: the next note of each key and attribute is logged again (each test starts afresh)."""
    with _said_lock:
        _said.clear()


class Notes:
    """What one read found unreadable (`Unread`s, in the order met), each also said once in the log, and the site
    items it left out (`quarantined`: site -> the UnreadableItem, with the item as read, for a repair)."""

    def __init__(self) -> None:
        self.found: list[Unread] = []
        self.quarantined: dict[str, UnreadableItem] = {}

    def add(self, partition: str, key: str, attr: str, why: str) -> None:
        u = Unread(partition, key, attr, why)
        self.found.append(u)
        say_once(u)

    def item(self, e: UnreadableItem, site: str | None = None) -> None:
        """An item left out; `site`: it is that site's item (quarantined)."""
        self.found.append(e.unread)
        say_once(e.unread)
        if site is not None:
            self.quarantined[site] = e


def kind(v: object) -> str:
    """The DynamoDB type a value read back was, in words (for the log)."""
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, Decimal | int | float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, bytes | bytearray):
        return "binary"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, Mapping):
        return "a map"
    if isinstance(v, set | frozenset):
        return "a set"
    return "null" if v is None else type(v).__name__


class Reader:
    """The attributes of one item, read one by one; what cannot be read is noted and reads as `default`."""

    def __init__(self, item: Mapping[str, Any], notes: Notes | None, partition: str, key: str):
        self.item, self.notes, self.partition, self.key = item, notes, partition, key

    def bad(self, attr: str, why: str) -> None:
        if self.notes is not None:
            self.notes.add(self.partition, self.key, attr, why)
        else:
            say_once(Unread(self.partition, self.key, attr, why))

    def unreadable(self, attr: str, why: str) -> UnreadableItem:
        return UnreadableItem(Unread(self.partition, self.key, attr, why), self.item)

    def _got(self, attr: str) -> tuple[bool, Any]:
        if attr not in self.item:
            return False, None
        return True, self.item[attr]

    def count(self, attr: str, default: int | None = 0) -> int | None:
        """A whole number from 0 to MAX_COUNT."""
        there, v = self._got(attr)
        if not there:
            return default
        n = as_count(v)
        if n is None:
            self.bad(attr, f"{kind(v)}, not a count")
            return default
        return n

    def epoch(self, attr: str) -> float | None:
        """A time in epoch seconds (0 to MAX_EPOCH)."""
        there, v = self._got(attr)
        if not there:
            return None
        t = as_epoch(v)
        if t is None:
            self.bad(attr, f"{kind(v)}, not a time")
        return t

    def number(self, attr: str, low: float, high: float) -> float | None:
        there, v = self._got(attr)
        if not there:
            return None
        x = as_number(v)
        if x is None or not low <= x <= high:
            self.bad(attr, f"{kind(v)}, not a number from {low:g} to {high:g}")
            return None
        return x

    def text(self, attr: str, max_chars: int) -> str | None:
        """A string, cut to `max_chars` (a longer one is cut, not refused: it is text for people)."""
        there, v = self._got(attr)
        if not there:
            return None
        if not isinstance(v, str):
            self.bad(attr, f"{kind(v)}, not a string")
            return None
        return v[:max_chars]

    def word(self, attr: str, max_chars: int = 64) -> str | None:
        """A short string used as a value (an id, a receipt): a longer one is refused, never cut."""
        there, v = self._got(attr)
        if not there:
            return None
        if not isinstance(v, str) or not 0 < len(v) <= max_chars:
            self.bad(attr, f"{kind(v)}, not a string of 1 to {max_chars} characters")
            return None
        return v

    def flag(self, attr: str, default: bool = False) -> bool:
        there, v = self._got(attr)
        if not there:
            return default
        if not isinstance(v, bool):
            self.bad(attr, f"{kind(v)}, not a boolean")
            return default
        return v

    def enum(self, attr: str, cls: type[E]) -> E | None:
        there, v = self._got(attr)
        if not there:
            return None
        if isinstance(v, str) and v in cls._value2member_map_:
            return cls(v)
        self.bad(attr, f"{quote(v) if isinstance(v, str) else kind(v)}, not one of {', '.join(cls)}")
        return None

    def listed(self, attr: str, max_len: int) -> list[Any] | None:
        there, v = self._got(attr)
        if not there:
            return None
        if not isinstance(v, list) or len(v) > max_len:
            self.bad(attr, f"{kind(v)}, not a list of at most {max_len}")
            return None
        return v

    def mapping(self, attr: str) -> Mapping[str, Any] | None:
        there, v = self._got(attr)
        if not there:
            return None
        if not isinstance(v, Mapping):
            self.bad(attr, f"{kind(v)}, not a map")
            return None
        return v


def as_count(v: object) -> int | None:
    """`v` as a count (a whole number from 0 to MAX_COUNT, not a boolean), else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, Decimal):
        if not v.is_finite() or v != v.to_integral_value():
            return None
        v = int(v)
    if isinstance(v, float):
        if not math.isfinite(v) or v != int(v):
            return None
        v = int(v)
    return v if isinstance(v, int) and 0 <= v <= MAX_COUNT else None


def as_number(v: object) -> float | None:
    """`v` as a finite number (not a boolean), else None."""
    if isinstance(v, bool) or not isinstance(v, Decimal | int | float):
        return None
    try:
        x = float(v)
    except (OverflowError, ValueError):
        return None
    return x if math.isfinite(x) else None


def as_epoch(v: object) -> float | None:
    """`v` as a time in epoch seconds (0 to MAX_EPOCH), else None."""
    x = as_number(v)
    return x if x is not None and 0 <= x < MAX_EPOCH else None
