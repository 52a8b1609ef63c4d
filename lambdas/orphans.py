"""Which of the stack's instances the watchdog ends: those of runs that are over, and those left stopped.

An instance tagged with a run id whose run is FINISHED (its hub only once it has had the time to archive the
run, `FINISHING_HUB_S`), abandoned (RUNNING past its deadline and the grace) or
has no run item at all (after `hub_stale_s` from launch, the time a new hub has to create it) is terminated, and
so is every stopped hub or node of the stack that no configuration keeps (a stopped instance bills for its
volume every day). The configured reusable hub is stopped instead, so the starter can start it again. Instances
of another stack, and instances without the tags, are never touched: the listing selects by the stack's tag.
All of it is pure: the watchdog applies what `retire` decides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fleet.record.ids import is_run_id
from fleet.record.instance import Instance
from fleet.record.partition import RunInfo
from fleet.record.state import RunState
from fleet.record.tags import LIVE_STATES, ROLE_HUB, ROLE_NODE
from lambdas.settings import LambdaSettings


def is_abandoned(run: RunInfo, now: float, settings: LambdaSettings) -> bool:
    """A RUNNING run still not finished `run_grace_s` after its deadline: its hub is gone or stuck."""
    return run.status == RunState.RUNNING and now > float(run.deadline_at) + settings.run_grace_s


#: A hub marks its run FINISHED, then checks the run, puts its summary and report in the bucket and ends its own
#: instance: seconds, or minutes on a busy instance. Its instance is left that long after `finished_at`, so that a
#: pass falling between the two never costs the run its archived summary.
FINISHING_HUB_S = 900.0


def orphan_reason(
    run: RunInfo | None, launched_at: float | None, now: float, settings: LambdaSettings, role: str | None = None
) -> str | None:
    """Why an instance of `run` must go, or None when it belongs to a live run (or is a hub still finishing it)."""
    if run is None:
        # A new hub creates its run item shortly after boot; give it the time a hub has to show a heartbeat.
        if launched_at is None or now - launched_at >= settings.hub_stale_s:
            return "no run item"
        return None
    if run.status == RunState.FINISHED:
        finishing = role == ROLE_HUB and run.finished_at is not None and now - run.finished_at < FINISHING_HUB_S
        return None if finishing else "run FINISHED"
    if is_abandoned(run, now, settings):
        return "run abandoned (RUNNING past deadline + grace)"
    return None


@dataclass(frozen=True)
class Orphan:
    instance_id: str
    run_id: str | None
    role: str | None
    reason: str
    state: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "run_id": self.run_id,
            "role": self.role,
            "reason": self.reason,
            "state": self.state,
        }


@dataclass(frozen=True)
class Orphans:
    """The orphans of one run for one reason: those terminated, and the configured hub, stopped."""

    run_id: str  # "-" for stopped instances without a run
    reason: str
    terminate: tuple[Orphan, ...]
    stop: tuple[Orphan, ...]


def doomed(
    inst: Instance, run_of: Callable[[str], RunInfo | None], now: float, settings: LambdaSettings
) -> Orphan | None:
    """The instance as an orphan, or None when it stays."""
    if inst.stopped:
        if inst.id == settings.hub_instance_id or inst.role not in (ROLE_HUB, ROLE_NODE):
            return None  # the reusable hub (stopped between runs on purpose), or not a fleet instance (the NAT)
        reason: str | None = "stopped, and kept by no configuration"
    elif not inst.run_id or not is_run_id(inst.run_id):
        return None
    else:
        reason = orphan_reason(run_of(inst.run_id), inst.launched_at, now, settings, inst.role)
    return None if reason is None else Orphan(inst.id, inst.run_id, inst.role, reason, inst.state)


def retire(
    instances: Iterable[Instance], run_of: Callable[[str], RunInfo | None], now: float, settings: LambdaSettings
) -> list[Orphans]:
    """The stack's orphans, by run and reason (sorted); `run_of` answers the run of a run id as it is now."""
    groups: dict[tuple[str, str], list[Orphan]] = {}
    for inst in instances:
        o = doomed(inst, run_of, now, settings)
        if o is not None:
            groups.setdefault((o.run_id or "-", o.reason), []).append(o)
    out = []
    for (run_id, reason), entries in sorted(groups.items()):
        stop = tuple(e for e in entries if e.instance_id == settings.hub_instance_id and e.state in LIVE_STATES)
        gone = tuple(e for e in entries if e.instance_id != settings.hub_instance_id)
        out.append(Orphans(run_id, reason, gone, stop))
    return out
