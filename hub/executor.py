"""Perform the actions of a plan through the adapters. Thin: the decisions were made in `plan`.

Every write is fenced; a `StaleWrite` means the world moved since the snapshot,
and the action is dropped (the next tick plans again from fresh state).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from fleet import ops
from fleet.clock import Clock
from fleet.codec import HistoryEvent, RunInfo
from fleet.config import Config
from fleet.errors import StaleWrite
from fleet.logs import event
from fleet.aws.queue import SiteQueue
from fleet.state import Reason, RunState, RunStatus, SiteRecord
from fleet.aws.table import StateTable
from hub.actions import (
    Action, EndAttempt, Enqueue, FailSites, Finish, KillAttempt, Launch, SeedSites, StartRun, Terminate,
)
from hub.control.base import NodeControl
from hub.providers.base import ComputeProvider
from hub.snapshot import Snapshot

log = logging.getLogger("gridfleet.hub")

LAUNCH_BACKOFF_MAX_S = 60.0


@dataclass
class Finished:
    reason: str
    left_running: int


@dataclass
class Executor:
    run_id: str
    config: Config
    table: StateTable
    queue: SiteQueue
    provider: ComputeProvider
    control: NodeControl
    clock: Clock
    hub_id: str
    expire_at: Callable[[float], int]
    finished: Finished | None = None
    conflicts: int = 0
    kills: dict[str, int] = field(default_factory=dict)
    teardown_timeout_s: float = 60.0
    full: bool = False  # `run --full`: seed incremental sites without their high-water marks
    _history: list[HistoryEvent] = field(default_factory=list)

    def history(self, kind: str, **fields: Any) -> None:
        """Record what the hub did on the run; written by `flush_history` at the end of the tick."""
        self._seq = getattr(self, "_seq", 0) + 1
        self._history.append(HistoryEvent(self.run_id, self.clock.now(), kind, fields, self._seq))

    def flush_history(self) -> None:
        """Write the tick's history lines in batches (best effort: a lost line must not stop the run)."""
        events, self._history = self._history, []
        if not events:
            return
        try:
            self.table.add_history(events)
        except Exception as e:  # noqa: BLE001 - the history is a record, not a decision
            log.warning("history-lost lines=%d kinds=%s error=%s", len(events),
                        ",".join(sorted({e.kind for e in events})), e)

    def execute(self, action: Action, snap: Snapshot) -> None:
        try:
            getattr(self, "_" + type(action).__name__)(action, snap)
        except StaleWrite as e:
            self.conflicts += 1
            event(log, "conflict", logging.DEBUG, run_id=self.run_id, site=e.site, action=type(action).__name__)

    # --- run and seeding --------------------------------------------------------
    def _StartRun(self, a: StartRun, snap: Snapshot) -> None:
        info = RunInfo(self.run_id, RunState.RUNNING, a.started_at, a.deadline_at, a.run_date, hub_id=self.hub_id,
                       hub_heartbeat=a.started_at, expire_at=self.expire_at(a.deadline_at), full=self.full)
        if self.table.create_run(info):
            event(log, "run-start", run_id=self.run_id, sites=len(self.config.sites), deadline_s=self.config.run.deadline_s)

    def _SeedSites(self, a: SeedSites, snap: Snapshot) -> None:
        expire = self.expire_at(snap.run.deadline_at if snap.run else self.clock.now() + self.config.run.deadline_s)
        full = self.full or (snap.run is not None and snap.run.full)
        incremental = [name for name, spec in a.sites if spec.incremental]
        marks = self.table.get_marks(incremental) if incremental and not full else {}
        created = [ops.new_site(self.run_id, name, spec, expire, marks.get(name)) for name, spec in a.sites]
        fresh = [r for r in created if self.table.create_site(r)]
        # First messages in batches, then mark them sent (a crash in between is repaired by Enqueue).
        self.queue.send_many((r.run_id, r.site, 1) for r in fresh)
        for r in fresh:
            try:
                ops.mark_enqueued(self.table, r)
            except StaleWrite:
                pass  # a node claimed it already: the mark no longer matters
        event(log, "seed", run_id=self.run_id, sites=len(fresh),
              **({"incremental": len(incremental), "marks": len(marks), "full": full} if incremental else {}))

    def _Enqueue(self, a: Enqueue, snap: Snapshot) -> None:
        rec = snap.sites[a.site]
        ops.send_next(self.table, self.queue, rec)
        event(log, "enqueue", run_id=self.run_id, site=a.site, attempt=rec.attempt + 1, why="message never marked sent")
        self.history("enqueue", site=a.site, attempt=rec.attempt + 1)

    # --- ending attempts ----------------------------------------------------------
    def _KillAttempt(self, a: KillAttempt, snap: Snapshot) -> None:
        rec = snap.sites[a.site]
        now = self.clock.now()
        if not rec.kill_reason:
            rec = ops.request_kill(self.table, rec, a.reason, now)
        path = self._kill(rec, a.reason)
        self.kills[path] = self.kills.get(path, 0) + 1
        self._end(rec, a.reason, path)

    def _kill(self, rec: SiteRecord, reason: Reason) -> str:
        iid = rec.instance_id
        if iid is None:
            return "none"
        result = self.control.kill(iid, rec.site, rec.attempt)
        event(log, "kill", run_id=self.run_id, site=rec.site, attempt=rec.attempt, node=iid, reason=reason,
              path=result.path, ok=result.ok, detail=result.detail or None)
        self.history("kill", site=rec.site, attempt=rec.attempt, node=iid, reason=str(reason), path=result.path,
                     ok=result.ok, detail=result.detail or None)
        if result.ok and reason is not Reason.LOST:
            return result.path
        # Last rung: the node is unreachable, or its agent stopped heartbeating (it is sick): terminate it.
        self.provider.terminate([iid])
        event(log, "terminate", run_id=self.run_id, node=iid, why=f"kill {reason}", site=rec.site)
        self.history("terminate", nodes=[iid], why=f"kill {reason}", site=rec.site)
        return "terminate" if not result.ok else f"{result.path}+terminate"

    def _EndAttempt(self, a: EndAttempt, snap: Snapshot) -> None:
        self._end(snap.sites[a.site], a.reason, None)

    def _end(self, rec: SiteRecord, reason: Reason, kill_path: str | None) -> None:
        now = self.clock.now()
        new = ops.end_attempt(self.table, rec, reason=reason, now=now,
                              max_attempts=self.config.run.max_attempts, spot_cap=self.config.run.spot_requeue_cap,
                              kill_path=kill_path)
        if rec.receipt:  # the message of the attempt that ended (its node is dead or was stopped): not needed
            self.queue.delete_receipt(rec.receipt)
        kind = "requeue" if new.run_status is RunStatus.QUEUED else "failed"
        self.history(kind, site=rec.site, attempt=rec.attempt, node=rec.instance_id, reason=str(reason),
                     kill_path=kill_path)
        if new.run_status is RunStatus.QUEUED:
            event(log, "requeue", run_id=self.run_id, site=rec.site, attempt=rec.attempt, node=rec.instance_id,
                  reason=reason, next_attempt=new.attempt + 1)
            ops.send_next(self.table, self.queue, new)
        else:
            event(log, "failed", logging.WARNING, run_id=self.run_id, site=rec.site, attempt=rec.attempt,
                  node=rec.instance_id, reason=reason)

    def _FailSites(self, a: FailSites, snap: Snapshot) -> None:
        now = self.clock.now()
        for name in a.sites:
            try:
                ops.fail_now(self.table, snap.sites[name], a.reason, now, error=a.error)
                event(log, "failed", logging.WARNING, run_id=self.run_id, site=name, reason=a.reason)
                self.history("failed", site=name, reason=str(a.reason))
            except StaleWrite as e:
                # A node finished it in the meantime; a result beats the deadline.
                if e.current is None or not e.current.is_terminal:
                    raise

    # --- the fleet --------------------------------------------------------------
    def _Launch(self, a: Launch, snap: Snapshot) -> None:
        result = self.provider.launch(self.run_id, a.count, target=a.target)
        for err in result.errors:
            event(log, "launch-error", logging.WARNING, run_id=self.run_id, error=err)
        if result.errors:
            self.history("launch-error", errors=list(result.errors[-3:]))
        if result.launched:
            self.table.add_launched(self.run_id, len(result.launched))
            event(log, "launch", run_id=self.run_id, count=len(result.launched), nodes=",".join(result.launched))
            self.history("launch", nodes=list(result.launched))
            if snap.run is not None and snap.run.launch_failures:
                self.table.update_run(self.run_id, launch_failures=0)
        elif result.errors:  # nothing started: back off, and let the plan give up if it never works
            failures = (snap.run.launch_failures if snap.run else 0) + 1
            delay = min(LAUNCH_BACKOFF_MAX_S, 2.0 ** failures)
            self.table.update_run(self.run_id, launch_failures=failures, launch_error=result.errors[-1][:500],
                                  launch_retry_at=self.clock.now() + delay)
            event(log, "launch-backoff", logging.WARNING, run_id=self.run_id, failures=failures, retry_in_s=delay)

    def _Terminate(self, a: Terminate, snap: Snapshot) -> None:
        self.provider.terminate(list(a.instance_ids))
        event(log, "terminate", run_id=self.run_id, nodes=",".join(a.instance_ids), why=a.reason)
        self.history("terminate", nodes=list(a.instance_ids), why=a.reason)

    def _Finish(self, a: Finish, snap: Snapshot) -> None:
        left = self.teardown(why=f"finish ({a.reason})")
        drained = self.drain()
        if drained:
            event(log, "drain", run_id=self.run_id, messages=drained, why="every site is done: its messages are stale")
        self.finished = Finished(a.reason, left)
        self.history("finish", reason=a.reason, left_running=left)

    def drain(self, max_messages: int = 1000) -> int:
        """Delete what is left of this run in the queue (duplicates, messages put aside by nodes, messages of
        dead nodes); leave other runs' messages alone. Messages still invisible are waited for, at most one
        visibility timeout: every node is gone, so nobody holds them any more."""
        deleted, seen = 0, 0
        give_up = self.clock.monotonic() + max(30.0, self.config.run.heartbeat_timeout_s) + 5
        while seen < max_messages:
            msg = self.queue.receive(0, 5)
            if msg is None:
                if self.queue.depth().in_flight == 0 or self.clock.monotonic() >= give_up:
                    return deleted
                self.clock.sleep(2.0)
                continue
            seen += 1
            if getattr(msg, "run_id", None) == self.run_id:
                self.queue.delete(msg)
                deleted += 1
            else:
                self.queue.set_visibility(msg, 0)
        return deleted

    def teardown(self, why: str) -> int:
        """Terminate every instance of the run and wait until none is pending or running."""
        deadline = self.clock.monotonic() + self.teardown_timeout_s
        while True:
            live = [i.id for i in self.provider.list(self.run_id) if i.live]
            if not live:
                self.flush_history()
                return 0
            if self.clock.monotonic() >= deadline:
                event(log, "teardown-incomplete", logging.ERROR, run_id=self.run_id, nodes=",".join(live))
                self.flush_history()
                return len(live)
            self.provider.terminate(live)
            event(log, "terminate", run_id=self.run_id, nodes=",".join(live), why=why)
            self.history("terminate", nodes=live, why=why)
            self.clock.sleep(0.5)
