"""The executor of the actions that end a run, and how every executor finds the method for an action.

`EndExecutor` performs what ending a run takes (terminate instances, fail sites, finish) with only the table, the
provider and the clock: what an operator's `gridfleet teardown` has. The hub's `hub.executor.Executor` adds the
rest. Each class says in `handlers()` which method performs which kind of action, so the method for an action
is found by its name in that table; an action a class has no method for is a TypeError, never skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleet.clock import Clock
from fleet.errors import StaleWrite
from fleet.logs import event
from fleet.record import ops
from fleet.record.partition import HistoryEvent
from fleet.record.state import RunState
from fleet.record.table import StateTable
from hub.actions import Action, Done, FailSites, Finish, Terminate
from hub.providers.base import ComputeProvider
from hub.snapshot import Snapshot

log = logging.getLogger("gridfleet.hub")

#: A method that performs one kind of action.
Handler = Callable[[Any, Snapshot], Done]


@dataclass
class Finished:
    reason: str
    left_running: int


@dataclass(kw_only=True)
class EndExecutor:
    """The actions that end a run, which need only the table, the provider and the clock: what an operator's
    `gridfleet teardown` has, and the hub's `Executor` builds on."""

    run_id: str
    table: StateTable
    provider: ComputeProvider
    clock: Clock
    finished: Finished | None = None
    conflicts: int = 0
    _history: list[HistoryEvent] = field(default_factory=list, init=False, repr=False)
    _seq: int = field(default=0, init=False, repr=False)
    _handlers: dict[type[Action], Handler] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._handlers = self.handlers()

    def history(self, kind: str, **fields: Any) -> None:
        """Record what the hub did on the run; written by `flush_history` at the end of the tick."""
        self._seq += 1
        self._history.append(HistoryEvent(self.run_id, self.clock.now(), kind, fields, self._seq))

    def flush_history(self) -> None:
        """Write the tick's history lines in batches (best effort: a lost line must not stop the run)."""
        events, self._history = self._history, []
        if not events:
            return
        try:
            self.table.add_history(events)
        except Exception as e:  # noqa: BLE001 - the history is a record, not a decision
            log.warning(
                "history-lost lines=%d kinds=%s error=%s", len(events), ",".join(sorted({e.kind for e in events})), e
            )

    def handlers(self) -> dict[type[Action], Handler]:
        """Which method performs each kind of action (`Executor` adds those only a hub performs)."""
        return {Terminate: self._terminate, FailSites: self._fail_sites, Finish: self._finish}

    def execute(self, action: Action, snap: Snapshot) -> Done:
        handler = self._handlers.get(type(action))
        if handler is None:
            raise TypeError(f"{type(self).__name__} performs no {type(action).__name__}")
        try:
            done = handler(action, snap)
        except StaleWrite as e:
            self.conflicts += 1
            event(log, "conflict", logging.DEBUG, run_id=self.run_id, site=e.site, action=type(action).__name__)
            return Done(action, conflicts=1)
        self.conflicts += done.conflicts
        return done

    def mark_finished(self, now: float) -> None:
        """The run item's last write: the run is over (after its summary is out, so a crash before is resumed)."""
        self.table.update_run(self.run_id, status=RunState.FINISHED, finished_at=now)

    def _terminate(self, a: Terminate, snap: Snapshot) -> Done:
        self.terminate(a.instance_ids, a.reason)
        return Done(a, a.instance_ids)

    def terminate(self, instance_ids: tuple[str, ...], why: str) -> None:
        self.provider.terminate(list(instance_ids))
        event(log, "terminate", run_id=self.run_id, nodes=",".join(instance_ids), why=why)
        self.history("terminate", nodes=list(instance_ids), why=why)

    def _fail_sites(self, a: FailSites, snap: Snapshot) -> Done:
        now = self.clock.now()
        failed: list[str] = []
        lost = 0
        for name in a.sites:
            try:
                ops.fail_now(self.table, snap.sites[name], a.reason, now, error=a.error)
            except StaleWrite as e:
                # A node finished it in the meantime (a result beats the end), or wrote progress: the next plan
                # sees which, and fails it again if it is still open.
                if e.current is None or not e.current.is_terminal:
                    lost += 1
                continue
            failed.append(name)
            event(log, "failed", logging.WARNING, run_id=self.run_id, site=name, reason=a.reason)
            self.history("failed", site=name, reason=str(a.reason))
        return Done(a, tuple(failed), conflicts=lost)

    def _finish(self, a: Finish, snap: Snapshot) -> Done:
        if a.left_running:
            event(log, "teardown-incomplete", logging.ERROR, run_id=self.run_id, left_running=a.left_running)
        self.finished = Finished(a.reason, a.left_running)
        self.history("finish", reason=a.reason, left_running=a.left_running)
        return Done(a)
