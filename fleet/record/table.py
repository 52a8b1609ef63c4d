"""The state table as the code that uses it sees it (`StateTable`), and what its reads return.

One table holds a run: its site records and node items under the run's partition,
its run item and history lines under the run's hub partition (`#run:<run_id>`,
which no node may write); the run index and the sites' high-water marks live in
partitions of their own. Every write of a site record is conditional on
the fence of the record it was computed from (version, attemptCount,
instance_id): a writer that lost a race, or a zombie node, gets `StaleWrite`
carrying the record as it is now, and its write is not applied. The run item
also carries the watchdog's bookkeeping (`fleet.record.run_item`), changed only by
writes conditional on what the watchdog read.

The DynamoDB adapter is `fleet.aws.table`; the tests and the simulator use an
in-memory one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Unpack

from fleet.record.ids import is_run_id
from fleet.record.partition import HistoryEvent, NodeInfo, Partition, RunInfo, item_to_node
from fleet.record.readback import Notes, UnreadableItem, as_epoch
from fleet.record.run_item import RunExpect, RunFields, RunWatch, WatchFields
from fleet.record.stamp import Stamp
from fleet.record.state import SiteRecord


@dataclass(frozen=True)
class RunRows:
    """A run's partitions, read whole; `notes`: what could not be read (`fleet.record.readback`), which the reader left
    out or read as absent."""

    run: RunInfo | None
    sites: list[SiteRecord]
    nodes: list[NodeInfo]
    history: list[HistoryEvent] = field(default_factory=list)
    notes: Notes = field(default_factory=Notes)

    @classmethod
    def of(cls, p: Partition) -> RunRows:
        return cls(p.run, p.sites, p.nodes, p.history, p.notes)


@dataclass(frozen=True)
class RunIndexEntry:
    run_id: str
    started_at: float


#: What a repair's PutItem expects of the item it replaces: the values it was read with (`DynamoStateTable.repair`).
REPAIR_FENCE = ("run_status", "version", "attemptCount", "instance_id", "spec")


def mark_of(item: dict[str, Any]) -> tuple[str, ...]:
    """A high-water mark as read back (nodes put them): its item ids that are strings, at most 1,000."""
    mark = item.get("mark")
    return tuple(m for m in mark[:1000] if isinstance(m, str)) if isinstance(mark, list) else ()


def nodes_of(items: Iterable[dict[str, Any]], notes: Notes) -> list[NodeInfo]:
    """The node items among `items` that can be read (the others noted)."""
    out = []
    for i in items:
        try:
            out.append(item_to_node(i, notes))
        except UnreadableItem as e:
            notes.item(e)
    return out


def runs_of(items: Iterable[dict[str, Any]]) -> list[RunIndexEntry]:
    """The index of runs as read back (only hubs write it): entries whose key is a run id, oldest first."""
    out = [RunIndexEntry(i["Site"], as_epoch(i.get("started_at")) or 0.0) for i in items if is_run_id(i.get("Site"))]
    return sorted(out, key=lambda e: e.started_at)


class StateTable(Protocol):
    def create_site(self, rec: SiteRecord) -> bool: ...
    def get_site(self, run_id: str, site: str) -> SiteRecord | None: ...
    def write(self, old: SiteRecord, new: SiteRecord) -> SiteRecord: ...
    def read_run(self, run_id: str) -> RunRows: ...
    def open_stamps(self, run_id: str) -> dict[str, Stamp]: ...
    def has_held(self, run_id: str) -> bool: ...
    def get_sites(self, run_id: str, sites: Iterable[str], notes: Notes | None = None) -> list[SiteRecord]: ...
    def read_nodes(self, run_id: str) -> list[NodeInfo]: ...
    def read_pacing(self, run_id: str) -> dict[str, dict[str, Any]]: ...
    def create_run(self, run: RunInfo) -> bool: ...
    def get_run(self, run_id: str) -> RunInfo | None: ...
    def update_run(self, run_id: str, **fields: Unpack[RunFields]) -> None: ...
    def add_launched(self, run_id: str, count: int) -> None: ...
    def put_node(self, node: NodeInfo) -> None: ...
    def add_history(self, events: Sequence[HistoryEvent]) -> None: ...
    def list_runs(self) -> list[RunIndexEntry]: ...
    def get_marks(self, sites: Iterable[str]) -> dict[str, tuple[str, ...]]: ...
    def put_mark(self, site: str, mark: tuple[str, ...], run_id: str, at: float) -> None: ...
    def repair(self, bad: UnreadableItem, new: SiteRecord) -> bool: ...
    def stamp_expiry(self, run_id: str, expire_at: int) -> int: ...


class WatchTable(StateTable, Protocol):
    """The state table as the Lambdas use it: the hub's API, and the watchdog's bookkeeping on the run item."""

    def get_run_watch(self, run_id: str) -> RunWatch | None: ...
    def running_runs(self, last: int) -> list[RunWatch]: ...
    def update_watch(self, run_id: str, expect: RunExpect, **fields: Unpack[WatchFields]) -> bool: ...
    def add_hub_start(self, run_id: str) -> None: ...
