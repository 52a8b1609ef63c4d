"""A site's checkpoint: where its crawl got to, and where the items found so far are kept.

DynamoDB bills a write by the kilobyte of the item (the larger of the item before
and after an update), so a checkpoint that carried every item so far made each
write of the site record cost more than the one before: the bytes of a site's
state grew with the square of its pages. The record now holds the cursor and
counts only, a few dozen bytes whatever the crawl's length:

    {"next": <URL or token>, "pages": 12, "items": 240, "parts": [[<attempt>, <claim>, <n>, <node>], ...]}

and the new items of the pages each save covers (`SaveEvery`: a batch of pages)
go first, as one part object, to the results store, under the prefix of the node
that holds the claim (`fleet.outputs.results.part_key`):
`staging/<writer>/<site>/<YYYYMMDD>[/<run_id>]/parts/<attempt>-<claim>/<seq>.json`,
seq 1..n, each a new object (no node can write another's prefix, nor replace a
part). An entry of `parts` names the parts one claim of the site saved (`claim`:
the record's version its claim wrote, unique per claim; `node`: the node that
held it, whose prefix they are under), so `parts` grows with the attempts, never
with the pages. An entry of three (no node) names parts an older node kept
beside the result. A retry reads the parts its checkpoint names and
continues; the parts of an attempt that was fenced off past its last accepted
checkpoint (a zombie) are named by no checkpoint and never read.

A checkpoint written by an older node holds the items themselves (`items` a
list): it is still resumed from (`is_legacy`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.errors import quote
from fleet.outputs.results import LOCAL_ROLE, part_key, writer_id, writer_node
from fleet.record.ids import is_node_id

#: Claims of one site a checkpoint may name (attempts, given-back attempts and reruns together): far beyond
#: any max_attempts; a longer list read back is refused rather than read.
MAX_SEGMENTS = 1000


@dataclass(frozen=True)
class Segment:
    """The parts one claim saved: `<attempt>-<claim>/000001.json` .. `<n>`, under the prefix of `node` (None: beside
    the result, where an older node kept them)."""

    attempt: int
    claim: int
    parts: int
    node: str | None = None

    def to_plain(self) -> list[Any]:
        head: list[Any] = [self.attempt, self.claim, self.parts]
        return head if self.node is None else [*head, self.node]


def is_legacy(ckpt: Mapping[str, Any]) -> bool:
    """A checkpoint of the older form, holding its items (a list) rather than their count and parts."""
    return isinstance(ckpt.get("items"), list)


def _whole(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"checkpoint {what} {value!r} is not a whole number")
    return value


def segments(ckpt: Mapping[str, Any]) -> list[Segment]:
    """The claims a checkpoint names, checked (they come back from the table): ValueError when one is not
    `[attempt, claim, n]` of whole numbers, or there are more than MAX_SEGMENTS."""
    raw = ckpt.get("parts") or []
    if not isinstance(raw, list) or len(raw) > MAX_SEGMENTS:
        raise ValueError(f"checkpoint parts is not a list of at most {MAX_SEGMENTS} claims")
    out = []
    for entry in raw:
        if not isinstance(entry, list) or len(entry) not in (3, 4):
            raise ValueError(f"checkpoint part entry {quote(entry)} is not [attempt, claim, parts, node]")
        node = entry[3] if len(entry) == 4 else None
        if node is not None and not is_node_id(node):
            raise ValueError(f"checkpoint part entry names {quote(node)}, which is no node")
        attempt, claim, parts = (_whole(v, "number") for v in entry[:3])
        out.append(Segment(attempt, claim, parts, node))
    return out


def part_keys(
    site: str, run_date: str, run_id: str | None, segs: Iterable[Segment], role: str = LOCAL_ROLE
) -> list[str]:
    """The keys of every part the segments name, in the order they were saved, each under the prefix of the node
    that held its claim (its writer id: `role` and that node); ValueError for a bad one."""
    out: list[str] = []
    for s in segs:
        writer = None if s.node is None else writer_id(role, s.node)
        out.extend(part_key(site, run_date, run_id, s.attempt, s.claim, i, writer) for i in range(1, s.parts + 1))
    return out


def make(next_ref: Any, pages: Any, items: int, segs: Iterable[Segment]) -> dict[str, Any]:
    """The record's checkpoint: the cursor, the count of items saved in parts, and the claims that saved them."""
    return {"next": next_ref, "pages": pages, "items": items, "parts": [s.to_plain() for s in segs if s.parts]}


#: A claim saves its checkpointed pages as one part, and the record's checkpoint with them, every this many pages
#: or this many seconds after the first page not yet saved, whichever comes first (`run.checkpoint_pages`,
#: `run.checkpoint_s`). A retry after a node that vanished repeats at most those pages; an attempt its node ends
#: (an error, its watchdog, a spot notice) saves what it holds first, so its retry repeats at most the page it
#: was on.
SAVE_PAGES = 25
SAVE_S = 120.0


@dataclass(frozen=True)
class SaveEvery:
    """When staged pages are due to be saved: `pages` pages staged, or `seconds` since the first of them."""

    pages: int = SAVE_PAGES
    seconds: float = SAVE_S


@dataclass
class ClaimParts:
    """The parts one claim of a site writes after those of earlier claims: the key of its next part, and the
    checkpoint naming them all. The agent and the simulator's node both keep their parts with it.

    The crawler's checkpoints are staged (`page`) and saved in batches (`due`): the record's checkpoint always
    names the cursor of the last page whose items are in a stored part, never a later one."""

    where: tuple[str, str, str]  # (site, run date, run id)
    attempt: int
    claim: int  # the record's version the claim wrote
    # the writer id of the node that holds the claim (`fleet.outputs.results.writer_id`): its parts' prefix
    writer: str = ""
    earlier: list[Segment] = field(default_factory=list)
    saved_items: int = 0  # items in the parts the checkpoint names (earlier claims' and this one's)
    written: int = 0  # parts this claim has stored
    cursor: tuple[Any, Any] | None = None  # (next, pages) of the last page staged, saved by the next part
    staged_pages: int = 0  # pages checkpointed by the crawler whose items no stored part holds yet
    staged_since: float | None = None  # monotonic time of the first of them

    def page(self, next_ref: Any, pages: Any, mono: float) -> None:
        """The crawler checkpointed a page: its cursor waits for the next save."""
        self.cursor = (next_ref, pages)
        self.staged_pages += 1
        if self.staged_since is None:
            self.staged_since = mono

    def due(self, every: SaveEvery, mono: float) -> bool:
        """Whether the staged pages are due to be saved at `mono` (a heartbeat asks with its next beat's time, so
        that a save due before then rides on this beat instead of a write of its own)."""
        if not self.staged_pages:
            return False
        assert self.staged_since is not None
        return self.staged_pages >= every.pages or mono - self.staged_since >= every.seconds

    @property
    def node(self) -> str | None:
        """The node whose prefix this claim's parts are under (None: no writer, the older layout beside the result)."""
        return writer_node(self.writer) if self.writer else None

    def next_key(self) -> str:
        site, run_date, run_id = self.where
        return part_key(site, run_date, run_id, self.attempt, self.claim, self.written + 1, self.writer or None)

    def stored(self, items: int) -> None:
        """The part `next_key` names is in the store, holding `items` items (none: the staged pages had none, and
        no part was written)."""
        if items:
            self.written += 1
            self.saved_items += items
        self.staged_pages, self.staged_since = 0, None

    def checkpoint(self, next_ref: Any, pages: Any) -> dict[str, Any]:
        this = Segment(self.attempt, self.claim, self.written, self.node)
        return make(next_ref, pages, self.saved_items, [*self.earlier, this])

    def saved(self) -> dict[str, Any]:
        """The checkpoint of the staged cursor, once its pages' part is stored."""
        assert self.cursor is not None
        return self.checkpoint(*self.cursor)

    def earlier_keys(self) -> list[str]:
        """The keys of the parts earlier claims saved, which a resumed claim reads (the nodes of a stack share one
        role: each earlier node's prefix is this node's role and that node)."""
        site, run_date, run_id = self.where
        return part_keys(site, run_date, run_id, self.earlier, self.writer.partition(":")[0] or LOCAL_ROLE)


def part_body(items: Sequence[Mapping[str, Any]]) -> bytes:
    return json.dumps(list(items), separators=(",", ":"), default=str).encode()


def part_items(body: bytes) -> list[dict[str, Any]]:
    """The items of a part read back: a JSON list of objects, else ValueError."""
    try:
        items = json.loads(body)
    except RecursionError:
        raise ValueError("a checkpoint part nests too deep") from None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ValueError("a checkpoint part is not a JSON list of items")
    return items
