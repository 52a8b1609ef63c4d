"""The run item's changing fields, named once for the table adapter and its in-memory stand-in.

Two writers share the run item: the hub (`RunFields`: status, heartbeat, launch bookkeeping) and the watchdog
(`WatchFields`: what it last saw of the hub's heartbeat, and when). The watchdog's writes are conditional on
what it read (`RunExpect`), so watchdogs racing on one observation act once. Both adapters build their writes
from the same names and values here, so they cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, TypedDict

from fleet.record.codec import num
from fleet.record.partition import RunInfo, item_to_run
from fleet.record.state import RunState


class RunFields(TypedDict, total=False):
    """The run item's fields that change after it is created; None removes a field."""

    status: RunState
    hub_id: str | None
    hub_heartbeat: float | None
    finished_at: float | None
    expire_at: int | None
    deadline_at: float
    launch_failures: int
    launch_error: str | None
    launch_retry_at: float | None
    reruns: int


class WatchFields(TypedDict, total=False):
    """The watchdog's bookkeeping on the run item (the hub never writes it); None removes a field."""

    seen_hb: str | None  # the hub heartbeat last seen, as an opaque token: only equality means anything
    seen_since: float | None  # the watchdog's clock when it first saw that token
    restart_at: float | None  # the watchdog's clock at the last hub restart a watchdog claimed


class RunExpect(WatchFields, total=False):
    """What a conditional write expects of the run item, field by field; None: the attribute is absent."""

    status: RunState
    hub_heartbeat: float | None


@dataclass(frozen=True)
class RunWatch:
    """The run item as the Lambdas read it: the run, and the watchdog's bookkeeping on the same item."""

    run: RunInfo
    seen_hb: str | None = None
    seen_since: float | None = None
    restart_at: float | None = None
    hub_starts: int = 0  # hubs started for the run by the starter or the watchdog


#: Field name -> the run item's attribute.
RUN_ATTRS = {
    "status": "status",
    "hub_id": "hub_id",
    "hub_heartbeat": "hub_heartbeat",
    "finished_at": "finished_at",
    "expire_at": "expireAt",
    "deadline_at": "deadline_at",
    "launch_failures": "launch_failures",
    "launch_error": "launch_error",
    "launch_retry_at": "launch_retry_at",
    "reruns": "reruns",
    "seen_hb": "watch_hb",
    "seen_since": "watch_since",
    "restart_at": "watch_restart_at",
}
HUB_STARTS = "hub_starts"


def run_value(v: Any) -> Any:
    """A run field as the item holds it: numbers as Decimal, the status as its plain string."""
    if isinstance(v, RunState):
        return str(v)
    return num(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def item_to_watch(item: Mapping[str, Any]) -> RunWatch:
    since, restart = item.get(RUN_ATTRS["seen_since"]), item.get(RUN_ATTRS["restart_at"])
    return RunWatch(
        item_to_run(item),
        item.get(RUN_ATTRS["seen_hb"]),
        None if since is None else float(since),
        None if restart is None else float(restart),
        int(item.get(HUB_STARTS, 0)),
    )


def assignments(fields: Mapping[str, Any], names: dict[str, str], values: dict[str, Any]) -> str:
    """The UpdateExpression that sets `fields` (None: REMOVE); their names and values go into the two maps."""
    sets, removes = [], []
    for i, (k, v) in enumerate(fields.items()):
        names[f"#f{i}"] = RUN_ATTRS[k]
        if v is None:
            removes.append(f"#f{i}")
        else:
            values[f":f{i}"] = run_value(v)
            sets.append(f"#f{i} = :f{i}")
    clauses = ([f"SET {', '.join(sets)}"] if sets else []) + ([f"REMOVE {', '.join(removes)}"] if removes else [])
    return " ".join(clauses)


def expectations(expect: RunExpect, names: dict[str, str], values: dict[str, Any]) -> str:
    """The ConditionExpression that holds while the run item exists and is as `expect` says."""
    conds = ["attribute_exists(Site)"]
    for i, (k, v) in enumerate(expect.items()):
        names[f"#e{i}"] = RUN_ATTRS[k]
        if v is None:
            conds.append(f"attribute_not_exists(#e{i})")
        else:
            values[f":e{i}"] = run_value(v)
            conds.append(f"#e{i} = :e{i}")
    return " AND ".join(conds)


def holds(item: Mapping[str, Any], expect: RunExpect) -> bool:
    """Whether a stored run item is as `expect` says (`expectations`, evaluated in memory)."""
    return all(item.get(RUN_ATTRS[k]) == (None if v is None else run_value(v)) for k, v in expect.items())


def assign(item: MutableMapping[str, Any], fields: Mapping[str, Any]) -> None:
    """Apply `fields` to a stored run item (`assignments`, evaluated in memory)."""
    for k, v in fields.items():
        if v is None:
            item.pop(RUN_ATTRS[k], None)
        else:
            item[RUN_ATTRS[k]] = run_value(v)
