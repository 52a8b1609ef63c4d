"""Perform the actions of a plan through the adapters, one bounded pass each, and say what happened as data.

The executor decides nothing: which sites, nodes and rungs, how long to back off,
when to drain and when the run is over were all decided by `plan()`. What it
learns (a launch that started nothing, a kill that could not reach its node, a
write that lost to a newer one) is written where the next snapshot reads it, or
returned as `Done`. Every write is fenced; a `StaleWrite` means the world moved
since the snapshot, and the write is dropped (the next tick plans again from
fresh state).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from fleet.aws.notify import notify_finished
from fleet.config import Config
from fleet.errors import StaleWrite
from fleet.logs import event
from fleet.outputs.results import EXISTED, LOCAL_ROLE, MISSING, RESULT_MAX_BYTES, ResultStore
from fleet.record import ops
from fleet.record.messages import BadMessage, SiteMessage, SiteQueue
from fleet.record.partition import RunInfo
from fleet.record.state import Reason, RunState, RunStatus, SiteRecord
from hub.actions import (
    Action,
    Done,
    Drain,
    EndAttempt,
    Enqueue,
    Feed,
    Finish,
    KillAttempt,
    KillLadder,
    Launch,
    Promote,
    Repair,
    SeedSites,
    StartRun,
)
from hub.control.base import KillResult, NodeControl
from hub.end_executor import EndExecutor, Handler
from hub.history import previous_items
from hub.plan.start import spec_of
from hub.promote import promote
from hub.snapshot import Snapshot, held

log = logging.getLogger("gridfleet.hub")

#: How long a message of another run stays hidden during a drain pass (so the pass sees it once).
DRAIN_HIDE_S = 5


def kill_path(result: KillResult | None, terminated: bool) -> str:
    """How an attempt was killed, as its record keeps it: the node control's path, `terminate`, or both."""
    if result is None:
        return "terminate" if terminated else "none"
    if not terminated:
        return result.path
    return f"{result.path}+terminate" if result.ok else "terminate"


@dataclass(kw_only=True)
class Executor(EndExecutor):
    """Everything a hub's plan asks for."""

    config: Config
    queue: SiteQueue
    control: NodeControl
    hub_id: str
    expire_at: Callable[[float], int]
    results: ResultStore | None = None  # where staged results are made the sites' results (Promote)
    writer_role: str = LOCAL_ROLE  # the nodes' role id: a node's writer id is it and the node's id
    completed: set[str] = field(default_factory=set)  # the sites this hub completed (Promote)
    teardown_timeout_s: float = 60.0
    full: bool = False  # `run --full`: seed incremental sites without their high-water marks
    out_dir: Path = Path("runs")  # where the run's files go on the embedded default (named in the end message)

    def _finish(self, a: Finish, snap: Snapshot) -> Done:
        done = super()._finish(a, snap)
        # fleet.yaml's `notify`: one message as the run ends; a failure is logged, never raised
        notify_finished(self.config, self.table, self.run_id, a.reason, a.left_running, self.clock.now(), self.out_dir)
        return done

    def handlers(self) -> dict[type[Action], Handler]:
        return {
            **super().handlers(),
            StartRun: self._start_run,
            SeedSites: self._seed_sites,
            Feed: self._feed,
            Enqueue: self._enqueue,
            KillAttempt: self._kill_attempt,
            EndAttempt: self._end_attempt,
            Repair: self._repair,
            Promote: self._promote,
            Launch: self._launch,
            Drain: self._drain,
        }

    # --- run and seeding --------------------------------------------------------
    def _start_run(self, a: StartRun, snap: Snapshot) -> Done:
        info = RunInfo(
            self.run_id,
            RunState.RUNNING,
            a.started_at,
            a.deadline_at,
            a.run_date,
            hub_id=self.hub_id,
            hub_heartbeat=a.started_at,
            expire_at=self.expire_at(a.deadline_at),
            full=self.full,
        )
        if self.table.create_run(info):
            event(
                log,
                "run-start",
                run_id=self.run_id,
                sites=len(self.config.sites),
                deadline_s=self.config.run.deadline_s,
            )
        return Done(a)

    def _seed_sites(self, a: SeedSites, snap: Snapshot) -> Done:
        expire = self.expire_at(snap.run.deadline_at if snap.run else self.clock.now() + self.config.run.deadline_s)
        full = self.full or (snap.run is not None and snap.run.full)
        incremental = [name for name, spec in a.sites if spec.incremental]
        marks = self.table.get_marks(incremental) if incremental and not full else {}
        judged = [name for name, spec in a.sites if "max_drop" in spec.expect]
        baselines = previous_items(self.table, self.run_id, judged) if judged else {}
        specs = [(name, replace(spec, baseline_items=baselines.get(name))) for name, spec in a.sites]
        created = [ops.new_site(self.run_id, name, spec, expire, marks.get(name)) for name, spec in specs]
        fresh = [r for r in created if self.table.create_site(r)]
        if a.send:  # else a metered queue sends them later (`Feed`)
            self._send_first(fresh)
        event(
            log,
            "seed",
            run_id=self.run_id,
            sites=len(fresh),
            **({"incremental": len(incremental), "marks": len(marks), "full": full} if incremental else {}),
            **({"max_drop": len(judged), "baselines": len(baselines)} if judged else {}),
        )
        return Done(a, tuple(r.site for r in fresh))

    def _feed(self, a: Feed, snap: Snapshot) -> Done:
        recs = [r for n in a.sites if (r := snap.sites.get(n)) is not None and held(r)]
        self._send_first(recs)
        event(log, "feed", logging.DEBUG, run_id=self.run_id, sites=len(recs), first=recs[0].site if recs else None)
        return Done(a, tuple(r.site for r in recs))

    def _send_first(self, recs: list[SiteRecord]) -> None:
        """First messages in batches, in order, then marked sent (a crash in between: sent again, harmless)."""
        self.queue.send_many((r.run_id, r.site, r.attempt + 1) for r in recs)
        for r in recs:
            try:
                ops.mark_enqueued(self.table, r)
            except StaleWrite:
                pass  # a node claimed it already: the mark no longer matters

    def _enqueue(self, a: Enqueue, snap: Snapshot) -> Done:
        rec = snap.sites[a.site]
        ops.send_next(self.table, self.queue, rec)
        why = "its backoff ended" if rec.retry_at is not None else "message never marked sent"
        event(log, "enqueue", run_id=self.run_id, site=a.site, attempt=rec.attempt + 1, why=why)
        self.history("enqueue", site=a.site, attempt=rec.attempt + 1)
        return Done(a, (a.site,))

    # --- ending attempts ----------------------------------------------------------
    def _kill_attempt(self, a: KillAttempt, snap: Snapshot) -> Done:
        rec = snap.sites[a.site]
        if not rec.kill_reason:  # the mark fences the node off first: its next write fails
            rec = ops.request_kill(self.table, rec, a.reason, self.clock.now())
        path = self._climb(rec, a)
        self._end(rec, a.reason, path)
        return Done(a, (a.site,), kill_path=path)

    def _climb(self, rec: SiteRecord, a: KillAttempt) -> str:
        """The rungs of `a.ladder`, in order; returns the kill path the attempt records."""
        iid = a.instance_id
        if iid is None or a.ladder is KillLadder.NONE:
            return kill_path(None, False)
        result = self.control.kill(iid, rec.site, rec.attempt)
        event(
            log,
            "kill",
            run_id=self.run_id,
            site=rec.site,
            attempt=rec.attempt,
            node=iid,
            reason=a.reason,
            path=result.path,
            ok=result.ok,
            detail=result.detail or None,
        )
        self.history(
            "kill",
            site=rec.site,
            attempt=rec.attempt,
            node=iid,
            reason=str(a.reason),
            path=result.path,
            ok=result.ok,
            detail=result.detail or None,
        )
        if result.ok and a.ladder is KillLadder.FALLBACK:
            return kill_path(result, False)
        self.provider.terminate([iid])
        event(log, "terminate", run_id=self.run_id, node=iid, why=f"kill {a.reason}", site=rec.site)
        self.history("terminate", nodes=[iid], why=f"kill {a.reason}", site=rec.site)
        return kill_path(result, True)

    def _promote(self, a: Promote, snap: Snapshot) -> Done:
        """A SAVED attempt: its staged result becomes the site's result (`hub.promote`), or, with nothing staged
        where its record says, the attempt ends as an error."""
        rec = snap.sites[a.site]
        assert self.results is not None and snap.run is not None  # a hub's executor has both by a SAVED
        now = self.clock.now()
        answer, new = promote(self.table, self.results, self.queue, rec, snap.run.run_date, self.writer_role, now)
        if new is None:
            why = "no staged result" if answer == MISSING else f"its staged result is over {RESULT_MAX_BYTES} bytes"
            event(log, "promote-refused", logging.WARNING, run_id=self.run_id, site=a.site, attempt=rec.attempt,
                  node=rec.instance_id, why=why)  # fmt: skip
            self._end(rec, Reason.ERROR, None, error=f"SAVED, but {why} under the node's prefix")
            return Done(a, (a.site,))
        self.completed.add(a.site)
        event(log, "promoted", logging.DEBUG, run_id=self.run_id, site=a.site, attempt=rec.attempt,
              kept=answer == EXISTED)  # fmt: skip
        return Done(a, (a.site,))

    def _repair(self, a: Repair, snap: Snapshot) -> Done:
        """Make a record no one can read whole again (`ops.repaired`), then send the next attempt's message."""
        bad = snap.repairs[a.site]
        site = next((x for x in self.config.sites if x.id == a.site), None)
        if site is None:
            return Done(a)
        new = ops.repaired(
            bad,
            spec_of(site, self.config),
            self.clock.now(),
            max_attempts=self.config.run.max_attempts,
            expire_at=self.expire_at(snap.run.deadline_at if snap.run else self.clock.now()),
        )
        if not self.table.repair(bad, new):
            return Done(a, conflicts=1)  # it changed since it was read: the next read decides again
        event(
            log,
            "repaired",
            logging.WARNING,
            run_id=self.run_id,
            site=a.site,
            attempt=new.attempt,
            status=new.run_status,
            unreadable=bad.unread.line(),
        )
        self.history("repaired", site=a.site, attempt=new.attempt, status=str(new.run_status), why=bad.unread.why)
        if new.run_status is RunStatus.QUEUED:
            ops.send_next(self.table, self.queue, new)
        return Done(a, (a.site,))

    def _end_attempt(self, a: EndAttempt, snap: Snapshot) -> Done:
        self._end(snap.sites[a.site], a.reason, None)
        return Done(a, (a.site,))

    def _end(self, rec: SiteRecord, reason: Reason, path: str | None, error: str | None = None) -> None:
        new = ops.end_attempt(
            self.table,
            rec,
            reason=reason,
            now=self.clock.now(),
            max_attempts=self.config.run.max_attempts,
            spot_cap=self.config.run.spot_requeue_cap,
            kill_path=path,
            error=error,
            policy=self.config.run.retry_policy,
        )
        if rec.receipt:  # the message of the attempt that ended (its node is dead or was stopped): not needed
            self.queue.delete_receipt(rec.receipt)
        requeued = new.run_status is RunStatus.QUEUED
        self.history(
            "requeue" if requeued else "failed",
            site=rec.site,
            attempt=rec.attempt,
            node=rec.instance_id,
            reason=str(reason),
            kill_path=path,
        )
        if requeued:
            event(
                log,
                "requeue",
                run_id=self.run_id,
                site=rec.site,
                attempt=rec.attempt,
                node=rec.instance_id,
                reason=reason,
                next_attempt=new.attempt + 1,
            )
            ops.send_next(self.table, self.queue, new)
        else:
            event(
                log,
                "failed",
                logging.WARNING,
                run_id=self.run_id,
                site=rec.site,
                attempt=rec.attempt,
                node=rec.instance_id,
                reason=reason,
            )

    # --- the fleet and the queue ------------------------------------------------------
    def _launch(self, a: Launch, snap: Snapshot) -> Done:
        result = self.provider.launch(self.run_id, a.count, target=a.target)
        for err in result.errors:
            event(log, "launch-error", logging.WARNING, run_id=self.run_id, error=err)
        if result.errors:
            self.history("launch-error", errors=list(result.errors[-3:]))
        if result.launched:
            self.table.add_launched(self.run_id, len(result.launched))
            event(log, "launch", run_id=self.run_id, count=len(result.launched), nodes=",".join(result.launched))
            self.history("launch", nodes=list(result.launched))
            if a.failures:
                self.table.update_run(self.run_id, launch_failures=0)
        elif result.errors:  # nothing started: record it as the plan said, for the next plan to wait or give up
            self.table.update_run(
                self.run_id,
                launch_failures=a.failures + 1,
                launch_error=result.errors[-1][:500],
                launch_retry_at=self.clock.now() + a.backoff_s,
            )
            event(
                log,
                "launch-backoff",
                logging.WARNING,
                run_id=self.run_id,
                failures=a.failures + 1,
                retry_in_s=a.backoff_s,
            )
        return Done(a, result.launched)

    def _drain(self, a: Drain, snap: Snapshot) -> Done:
        """One pass over what is visible (at most `a.max_messages` receives): delete this run's messages
        (duplicates, messages put aside by nodes, messages of dead nodes). Other runs' messages are made visible
        again once the pass is over; a body that is no site message at all at once, so that its receives run out
        and SQS moves it to the dead-letter queue, where the run's summary reports it."""
        deleted: list[str] = []
        others: list[SiteMessage] = []
        for _ in range(a.max_messages):
            msg = self.queue.receive(0, DRAIN_HIDE_S)
            if msg is None:
                break
            if isinstance(msg, BadMessage):
                self.queue.set_visibility(msg, 0)
            elif msg.run_id == self.run_id:
                self.queue.delete(msg)
                deleted.append(msg.site)
            else:
                others.append(msg)
        for msg in others:
            self.queue.set_visibility(msg, 0)
        if deleted:
            event(
                log,
                "drain",
                run_id=self.run_id,
                messages=len(deleted),
                why="every site is done: its messages are stale",
            )
        return Done(a, tuple(deleted))

    def teardown(self, why: str) -> int:
        """Terminate every instance of the run and wait (at most `teardown_timeout_s`) until none is pending or
        running; returns how many are left. For a hub stopped without finishing (interrupted): no later tick
        looks again, so this waits here."""
        deadline = self.clock.monotonic() + self.teardown_timeout_s
        while True:
            live = [i.id for i in self.provider.list(self.run_id) if i.live]
            if not live or self.clock.monotonic() >= deadline:
                if live:
                    event(log, "teardown-incomplete", logging.ERROR, run_id=self.run_id, nodes=",".join(live))
                self.flush_history()
                return len(live)
            self.terminate(tuple(live), why)
            self.clock.sleep(0.5)
