"""End a run now, from outside its hub: what an operator runs when a run must stop (`gridfleet teardown`).

It ends the run the way a hub ends one: a snapshot carrying a teardown request
goes through the plan's one end path (`hub.plan.end`: terminate the run's
instances, fail its open sites with Reason.KILLED, finish), and the executor
performs it. A hub still running that run sees it finished on its next tick and
stands down.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fleet.clock import Clock
from fleet.errors import MissingResource
from fleet.logs import event
from fleet.record.ops import fail_open_sites  # re-exported for callers that still import it from here
from fleet.record.state import Reason
from fleet.record.table import StateTable
from hub.actions import Ending, FailSites, Terminate
from hub.end_executor import EndExecutor
from hub.plan import end_plan, teardown_request
from hub.providers.base import ComputeProvider
from hub.snapshot import Observations, Snapshot

__all__ = ["TeardownResult", "fail_open_sites", "read_snapshot", "teardown_run"]

log = logging.getLogger("gridfleet.hub")

#: Ticks of the end path at most: each waits a moment (the plan's wake) for instances to go, and the plan
#: itself finishes once `hub.plan.END_WAIT_S` has passed, so this only guards against a clock that stands still.
MAX_TICKS = 1000


@dataclass(frozen=True)
class TeardownResult:
    terminated: tuple[str, ...]
    failed_sites: tuple[str, ...]
    left_running: int


def read_snapshot(
    run_id: str, table: StateTable, provider: ComputeProvider, now: float, ending: Ending | None = None
) -> Snapshot:
    """A snapshot from one full read of the run (no observations: nothing here times a hang)."""
    rows = table.read_run(run_id)
    if rows.run is None:
        raise MissingResource(f"there is no run {run_id}")
    instances = {i.id: i for i in provider.list(run_id)}
    return Snapshot(
        run_id,
        rows.run,
        {r.site: r for r in rows.sites},
        {n.instance_id: n for n in rows.nodes},
        instances,
        Observations(),
        ending=ending,
    )


def teardown_run(
    run_id: str, table: StateTable, provider: ComputeProvider, clock: Clock, reason: Reason = Reason.KILLED
) -> TeardownResult:
    """Terminate the run's instances, fail its open sites with `reason`, mark it finished (MissingResource if
    the table holds no such run)."""
    request = teardown_request(clock.now(), reason)
    executor = EndExecutor(run_id=run_id, table=table, provider=provider, clock=clock)
    terminated: dict[str, None] = {}
    failed: dict[str, None] = {}
    for _ in range(MAX_TICKS):
        now = clock.now()
        snap = read_snapshot(run_id, table, provider, now, request)
        p = end_plan(snap, now, request)
        for action in p.actions:
            done = executor.execute(action, snap)
            if isinstance(action, Terminate):
                terminated.update(dict.fromkeys(done.acted_on))
            elif isinstance(action, FailSites):
                failed.update(dict.fromkeys(done.acted_on))
        executor.flush_history()
        if executor.finished is not None:
            break
        clock.sleep(max(0.0, p.wake_at - clock.now()))
    executor.mark_finished(clock.now())
    left = sum(1 for i in provider.list(run_id) if i.live)
    event(log, "teardown", run_id=run_id, terminated=len(terminated), failed=len(failed), left_running=left)
    return TeardownResult(tuple(terminated), tuple(failed), left)
