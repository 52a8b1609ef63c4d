"""End a run now, from outside its hub: terminate its nodes, fail its open sites, finish it.

What an operator runs when a run must stop (`gridfleet teardown`). A hub still
running that run sees it finished on its next tick and exits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fleet import ops
from fleet.clock import Clock
from fleet.errors import MissingResource, StaleWrite
from fleet.logs import event
from fleet.state import Reason, RunState
from fleet.aws.table import StateTable
from hub.providers.base import ComputeProvider

log = logging.getLogger("gridfleet.hub")


@dataclass(frozen=True)
class TeardownResult:
    terminated: tuple[str, ...]
    failed_sites: tuple[str, ...]
    left_running: int


def fail_open_sites(table: StateTable, run_id: str, reason: Reason, clock: Clock, *, error: str) -> tuple[str, ...]:
    """Mark every site of the run that is not terminal FAILED with `reason` (a node that writes in between is
    looked at again: a result it wrote first stands). Returns the sites failed."""
    failed = []
    for r in table.read_run(run_id).sites:
        while not r.is_terminal:
            try:
                ops.fail_now(table, r, reason, clock.now(), error=error)
                failed.append(r.site)
                break
            except StaleWrite as e:  # a node wrote in between: look again
                if e.current is None:
                    break
                r = e.current
    return tuple(failed)


def teardown_run(run_id: str, table: StateTable, provider: ComputeProvider, clock: Clock,
                 reason: Reason = Reason.KILLED) -> TeardownResult:
    run = table.get_run(run_id)
    if run is None:
        raise MissingResource(f"there is no run {run_id}")
    live = tuple(i.id for i in provider.list(run_id) if i.live)
    provider.terminate(live)
    failed = fail_open_sites(table, run_id, reason, clock, error="torn down by an operator")
    table.update_run(run_id, status=RunState.FINISHED, finished_at=clock.now())
    left = sum(1 for i in provider.list(run_id) if i.live)
    event(log, "teardown", run_id=run_id, terminated=len(live), failed=len(failed), left_running=left)
    return TeardownResult(live, tuple(failed), left)
