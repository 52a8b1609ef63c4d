"""The items of a run besides its sites: the run item, the nodes' items and the history lines, and reading a run's
partitions whole.

A run's site records and node items live in its partition (`run_id` = the run's id), which nodes write; its run
item and history live in its hub partition (`#run:<run_id>`), which the node role may not write at all
(`infra/terraform`: no item of a partition whose key begins `#run`). The index of runs has a partition of its own
(`#runs`), written only by hubs. Reading is total (`fleet.record.readback`): nothing a node wrote makes a read raise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fleet.errors import quote
from fleet.record.codec import ERROR_MAX_CHARS, capped, item_to_site, num, plain_to_item, unnum
from fleet.record.ids import is_node_id, is_site_id
from fleet.record.readback import Notes, Reader, Unread, UnreadableItem
from fleet.record.state import RunState, SiteRecord

RUN_ITEM = "#run"  # Site key of the run-level item, in the run's hub partition (`hub_partition`)
NODE_PREFIX = "#node#"  # Site key prefix of per-node items, in the run's partition
#: Every attribute of a node item but its key (`node_to_item`): what a node's UpdateItem of its item sets or removes.
#: Not `state`, `started_at` or `expireAt`: those names are the hub's alone (the node role may not write them), and
#: the hub gives a node item its expiry when the run ends.
NODE_ATTRS = ("node_state", "heartbeatEpoch", "booted_at", "sites_done", "site", "attempt", "error", "stats")
RUNS_PARTITION = "#runs"  # run_id of the index of runs (one item per run)
#: The partition of what only the hub writes of a run: its run item and its history (`#run:<run_id>`). The node role
#: may write no item of a partition whose key begins `#run` (infra/terraform, `dynamodb:LeadingKeys`), so neither
#: the run item (its status, deadline, expiry) nor the index of runs nor the history can be touched by a node.
HUB_PARTITION_PREFIX = "#run:"
HISTORY_PREFIX = "#h#"  # Site key prefix of the run's history events: #h#<epoch ms>#<n>


def hub_partition(run_id: str) -> str:
    """The partition of run `run_id`'s run item and history, which only the hub writes."""
    return HUB_PARTITION_PREFIX + run_id


@dataclass(frozen=True)
class RunInfo:
    """The run-level item (`Site = "#run"`)."""

    run_id: str
    status: RunState
    started_at: float
    deadline_at: float
    run_date: str  # YYYYMMDD, the date part of result keys
    hub_id: str | None = None
    hub_heartbeat: float | None = None
    finished_at: float | None = None
    nodes_launched: int = 0
    expire_at: int | None = None
    launch_failures: int = 0  # launches in a row that started no node
    launch_error: str | None = None  # the last launch error
    launch_retry_at: float | None = None  # hub clock: no launch before this (backoff)
    reruns: int = 0  # times an operator reopened the run (`gridfleet rerun`); each brings a new launch budget
    full: bool = False  # `run --full`: incremental sites ignore their high-water marks in this run

    @property
    def finished(self) -> bool:
        return self.status == RunState.FINISHED


def run_to_item(r: RunInfo) -> dict[str, Any]:
    item = {
        "run_id": hub_partition(r.run_id),
        "Site": RUN_ITEM,
        "status": str(r.status),
        "started_at": num(r.started_at),
        "deadline_at": num(r.deadline_at),
        "run_date": r.run_date,
        "nodes_launched": num(r.nodes_launched),
        "launch_failures": num(r.launch_failures),
        "reruns": num(r.reruns),
    }
    if r.full:
        item["full"] = True
    for k, v in (
        ("hub_id", r.hub_id),
        ("hub_heartbeat", r.hub_heartbeat),
        ("finished_at", r.finished_at),
        ("expireAt", r.expire_at),
        ("launch_error", r.launch_error),
        ("launch_retry_at", r.launch_retry_at),
    ):
        if v is not None:
            item[k] = num(v) if isinstance(v, (int, float)) else v
    return item


def item_to_run(item: Mapping[str, Any], notes: Notes | None = None) -> RunInfo:
    """The run item as read back (only hubs, the Lambdas and operators write it: checked all the same). One without
    its status, times or date raises UnreadableItem."""
    run_id = str(item.get("run_id", "")).removeprefix(HUB_PARTITION_PREFIX)
    r = Reader(item, notes, str(item.get("run_id", "")), RUN_ITEM)
    status, started, deadline, date = (
        r.enum("status", RunState),
        r.epoch("started_at"),
        r.epoch("deadline_at"),
        r.word("run_date", 8),
    )
    if status is None or started is None or deadline is None or date is None:
        raise r.unreadable("", "no status, started_at, deadline_at or run_date")
    return RunInfo(
        run_id=run_id,
        status=status,
        started_at=started,
        deadline_at=deadline,
        run_date=date,
        hub_id=r.word("hub_id", 128),
        hub_heartbeat=r.epoch("hub_heartbeat"),
        finished_at=r.epoch("finished_at"),
        nodes_launched=r.count("nodes_launched") or 0,
        expire_at=r.count("expireAt", None),
        launch_failures=r.count("launch_failures") or 0,
        launch_error=r.text("launch_error", ERROR_MAX_CHARS),
        full=r.flag("full"),
        launch_retry_at=r.epoch("launch_retry_at"),
        reruns=r.count("reruns") or 0,
    )


@dataclass(frozen=True)
class NodeInfo:
    """A node's own item (`Site = "#node#<instance id>"`), written by that node (or, the role being shared, by any
    node of the run: the hub takes it as a hint, never as proof)."""

    run_id: str
    instance_id: str
    state: str  # booting | idle | busy | exiting
    heartbeat: float
    started_at: float
    site: str | None = None
    attempt: int | None = None
    sites_done: int = 0
    expire_at: int | None = None
    error: str | None = None  # why it could not work (state boot-failed)
    stats: Mapping[str, Any] | None = None  # the node's job counters (`fleet.aws.metrics.JobStats.to_plain`)


def node_to_item(n: NodeInfo) -> dict[str, Any]:
    item: dict[str, Any] = {
        "run_id": n.run_id,
        "Site": NODE_PREFIX + n.instance_id,
        "node_state": n.state,
        "heartbeatEpoch": num(n.heartbeat),
        "booted_at": num(n.started_at),
        "sites_done": num(n.sites_done),
    }
    if n.site is not None:
        item["site"] = n.site
    if n.attempt is not None:
        item["attempt"] = num(n.attempt)
    if n.error is not None:
        item["error"] = capped(n.error, ERROR_MAX_CHARS)
    if n.stats:
        item["stats"] = plain_to_item(n.stats)
    return item


#: The states a node item may say (`fleet.record.state.NodeState`, and the boot script's `boot-failed`).
NODE_STATES = frozenset({"booting", "idle", "busy", "exiting", "boot-failed"})


def item_to_node(item: Mapping[str, Any], notes: Notes | None = None) -> NodeInfo:
    """A node item as read back: its key names a node (`fleet.record.ids.is_node_id`), else UnreadableItem; a state that
    is none, or a heartbeat that is no time, is noted and reads as `booting` at time 0 (no sign of life)."""
    key = item.get("Site")
    iid = key[len(NODE_PREFIX) :] if isinstance(key, str) and key.startswith(NODE_PREFIX) else ""
    r = Reader(item, notes, str(item.get("run_id", "")), str(key))
    if not is_node_id(iid):
        raise r.unreadable("", "its key names no node")
    state = r.word("node_state", 16)
    if state is not None and state not in NODE_STATES:
        r.bad("node_state", f"{quote(state)} is no state of a node")
        state = None
    return NodeInfo(
        run_id=str(item.get("run_id", "")),
        instance_id=iid,
        state=state or "booting",
        heartbeat=r.epoch("heartbeatEpoch") or 0.0,
        started_at=r.epoch("booted_at") or 0.0,
        site=r.word("site", 128),
        attempt=r.count("attempt", None),
        sites_done=r.count("sites_done") or 0,
        expire_at=r.count("expireAt", None),
        error=r.text("error", ERROR_MAX_CHARS),
        stats=unnum(dict(stats)) if (stats := r.mapping("stats")) is not None else None,
    )


@dataclass(frozen=True)
class HistoryEvent:
    """Something the hub did (launch, terminate, kill, requeue, failed, ...), by the hub's clock."""

    run_id: str
    at: float
    kind: str
    fields: Mapping[str, Any]
    seq: int = 0

    @property
    def key(self) -> str:
        return f"{HISTORY_PREFIX}{int(self.at * 1000):013d}#{self.seq:06d}"


def history_to_item(e: HistoryEvent) -> dict[str, Any]:
    return {
        "run_id": hub_partition(e.run_id),
        "Site": e.key,
        "kind": e.kind,
        "at": num(e.at),
        "fields": plain_to_item({k: v for k, v in e.fields.items() if v is not None}),
    }


def item_to_history(item: Mapping[str, Any], notes: Notes | None = None) -> HistoryEvent:
    """A history line as read back (only the hub writes them, in its own partition); UnreadableItem when it has no
    time or kind."""
    key = str(item.get("Site", ""))
    r = Reader(item, notes, str(item.get("run_id", "")), key)
    at, what = r.epoch("at"), r.word("kind", 64)
    if at is None or what is None:
        raise r.unreadable("", "no time or kind")
    seq = key.rsplit("#", 1)[-1]
    fields = r.mapping("fields") or {}
    return HistoryEvent(
        str(item.get("run_id", "")).removeprefix(HUB_PARTITION_PREFIX),
        at,
        what,
        unnum(dict(fields)),
        int(seq) if seq.isdigit() and len(seq) <= 9 else 0,
    )


@dataclass(frozen=True)
class Partition:
    """A run's items as read back: the run item, its site records, node items and history (in order), and what
    could not be read (`notes`: every value and item noted, and the site items left out)."""

    run: RunInfo | None
    sites: list[SiteRecord]
    nodes: list[NodeInfo]
    history: list[HistoryEvent]
    notes: Notes


def split_partition(items: Iterable[Mapping[str, Any]], notes: Notes | None = None) -> Partition:
    """The items of a run's two partitions (its own and its hub partition) -> their records. Nothing in them can
    make this raise: an item that cannot be read is left out and noted (`fleet.record.readback`)."""
    notes = notes if notes is not None else Notes()
    run, sites, nodes, history = None, [], [], []
    for item in items:
        key = item.get("Site")
        if not isinstance(key, str):
            continue  # DynamoDB's key schema makes the sort key a string: only a broken stand-in gives another
        hub_side = str(item.get("run_id", "")).startswith(HUB_PARTITION_PREFIX)
        try:
            if hub_side and key == RUN_ITEM:
                run = item_to_run(item, notes)
            elif hub_side and key.startswith(HISTORY_PREFIX):
                history.append(item_to_history(item, notes))
            elif hub_side:
                raise UnreadableItem(Unread(str(item.get("run_id")), key, "", "no item of the hub's partition"))
            elif key.startswith(NODE_PREFIX):
                nodes.append(item_to_node(item, notes))
            elif key.startswith("#"):
                raise UnreadableItem(Unread(str(item.get("run_id")), key, "", "no item of a run's partition"))
            else:
                sites.append(item_to_site(item, notes))
        except UnreadableItem as e:
            notes.item(e, key if not hub_side and is_site_id(key) else None)
    history.sort(key=lambda e: (e.at, e.seq))
    return Partition(run, sites, nodes, history, notes)
