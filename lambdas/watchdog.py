"""The watchdog (every 2 minutes): restart the hubs that went silent, end abandoned runs, clean up instances.

One pass, for each recent RUNNING run (the last `lookback_runs` of the run index):

1. It observes the hub's heartbeat on its own clock. It never compares the hub's epoch values with its own time:
   it keeps, on the run item, the heartbeat value it last saw and when it first saw it. A value unchanged for
   `hub_stale_s` with no hub instance pending or running means the hub is gone: a new one is started for the
   same run id and resumes it. The restart is claimed by a conditional write, so watchdogs racing on the same
   observation start at most one hub.
2. A run abandoned (still RUNNING `run_grace_s` after its deadline: its hub is gone or stuck) is ended: its open
   sites FAILED with reason `deadline`, the run FINISHED, its summary put in the bucket
   (`runs/<run_id>/summary.json`), so how it ended outlives the table, and one message to the SNS topic
   (`GRIDFLEET_NOTIFY_TOPIC_ARN`) says so; a pass that cannot send it logs why and goes on.
3. Then the stack's orphaned and stopped instances go (`lambdas.orphans`).

`read` gathers the runs and the stack's instances, `decide` (pure) turns them into actions, `apply` writes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleet.aws import ec2 as ec2_api
from fleet.aws.archive import S3RunArchive
from fleet.aws.ec2 import STOPPED_STATES, Instance
from fleet.aws.notify import notify_overdue
from fleet.clock import Clock, SystemClock
from fleet.logs import event
from fleet.outputs.archive import RunArchive
from fleet.outputs.summary import build_summary
from fleet.record.ids import is_run_id
from fleet.record.ops import fail_open_sites
from fleet.record.partition import HistoryEvent, RunInfo
from fleet.record.run_item import RunExpect, RunWatch
from fleet.record.state import Reason, RunState
from fleet.record.table import WatchTable
from fleet.record.tags import LIVE_STATES, ROLE_HUB
from lambdas.orphans import Orphans, is_abandoned, orphan_reason, retire
from lambdas.runtime import ClientsFactory, default_clients, log, outermost, state_table
from lambdas.settings import LambdaSettings
from lambdas.starter import start_hub

__all__ = [
    "run_watchdog",
    "handler",
    "watch",
    "decide",
    "heartbeat_token",
    "claim_restart",
    "release_restart",
    "orphan_reason",
    "is_abandoned",
]


@dataclass(frozen=True)
class WatchView:
    """What one pass reads before it decides."""

    runs: tuple[RunWatch, ...]  # the RUNNING runs among the recent ones, oldest first
    instances: tuple[Instance, ...]  # the stack's instances that run or are stopped
    others: Mapping[str, RunWatch | None]  # the run items of the other runs those instances are tagged with


@dataclass(frozen=True)
class End:
    run_id: str


@dataclass(frozen=True)
class Observe:
    """A heartbeat value not seen before: the observation starts again."""

    run_id: str
    seen: str
    prev_seen: str | None


@dataclass(frozen=True)
class Healthy:
    run_id: str
    unchanged_s: float


@dataclass(frozen=True)
class StaleButAlive:
    """The heartbeat is stale, but a hub instance of the run is pending or running: it is left to boot."""

    run_id: str
    unchanged_s: float
    instance_ids: tuple[str, ...]


@dataclass(frozen=True)
class Restart:
    watch: RunWatch  # as read: the claim holds only while the run item is still so
    unchanged_s: float


@dataclass(frozen=True)
class Terminate:
    instance_ids: tuple[str, ...]


@dataclass(frozen=True)
class Stop:
    instance_ids: tuple[str, ...]


WatchAction = End | Observe | Healthy | StaleButAlive | Restart | Orphans | Terminate | Stop


def heartbeat_token(run: RunInfo) -> str:
    """The hub heartbeat of a run as an opaque value: only equality means anything."""
    return "-" if run.hub_heartbeat is None else str(run.hub_heartbeat)


def decide_run(w: RunWatch, instances: Sequence[Instance], now: float, settings: LambdaSettings) -> WatchAction:
    """What a RUNNING run needs: to be ended, observed afresh, left alone, or its hub restarted."""
    run = w.run
    if is_abandoned(run, now, settings):
        return End(run.run_id)
    seen = heartbeat_token(run)
    if w.seen_hb != seen or w.seen_since is None:
        return Observe(run.run_id, seen, w.seen_hb)
    unchanged = now - w.seen_since
    if unchanged < settings.hub_stale_s:
        return Healthy(run.run_id, unchanged)
    live = sorted(i.id for i in instances if i.live and i.role == ROLE_HUB and i.run_id == run.run_id)
    if live:
        return StaleButAlive(run.run_id, unchanged, tuple(live))
    return Restart(w, unchanged)


def decide(view: WatchView, now: float, settings: LambdaSettings) -> list[WatchAction]:
    """One pass: an action for each recent RUNNING run, then the orphans and the calls that end them."""
    actions = [decide_run(w, view.instances, now, settings) for w in view.runs]
    ended = {a.run_id for a in actions if isinstance(a, End)}
    runs: dict[str, RunInfo | None] = {k: w.run if w else None for k, w in view.others.items()}
    for w in view.runs:  # a run ended by this pass is FINISHED for its instances
        runs[w.run.run_id] = dataclasses.replace(w.run, status=RunState.FINISHED) if w.run.run_id in ended else w.run
    groups = retire(view.instances, lambda run_id: runs.get(run_id), now, settings)
    terminate = tuple(o.instance_id for g in groups for o in g.terminate)
    stop = tuple(o.instance_id for g in groups for o in g.stop)
    return [*actions, *groups, *([Terminate(terminate)] if terminate else []), *([Stop(stop)] if stop else [])]


def read(settings: LambdaSettings, ec2: Any, table: WatchTable) -> WatchView:
    runs = tuple(table.running_runs(settings.lookback_runs))
    instances = tuple(ec2_api.describe(ec2, settings.stack, states=LIVE_STATES + STOPPED_STATES))
    known = {w.run.run_id for w in runs}
    wanted = sorted({i.run_id for i in instances if not i.stopped and i.run_id and is_run_id(i.run_id)} - known)
    return WatchView(runs, instances, {run_id: table.get_run_watch(run_id) for run_id in wanted})


def claim_restart(table: WatchTable, w: RunWatch, now: float) -> bool:
    """Claim the restart of the run's hub, from the observation in `w`.

    Holds only while the run item is as read: RUNNING, same heartbeat, same observation, no restart claimed since.
    The claim also restarts the observation, so the new hub gets its own `hub_stale_s`. Of watchdogs racing on
    the same observation, exactly one gets True.
    """
    expect: RunExpect = {
        "status": RunState.RUNNING,
        "hub_heartbeat": w.run.hub_heartbeat,
        "seen_hb": w.seen_hb,
        "seen_since": w.seen_since,
        "restart_at": w.restart_at,
    }
    return table.update_watch(w.run.run_id, expect, restart_at=now, seen_since=now)


def release_restart(table: WatchTable, w: RunWatch, claimed_at: float) -> bool:
    """Undo a claim whose restart failed, so the next pass may try again."""
    return table.update_watch(
        w.run.run_id, {"restart_at": claimed_at}, seen_since=w.seen_since, restart_at=w.restart_at
    )


@dataclass
class Pass:
    """What a pass writes with, and what it reports."""

    settings: LambdaSettings
    ec2: Any
    table: WatchTable
    clock: Clock
    archive: RunArchive | None
    now: float
    sns: Any = None  # the SNS client, when the overdue runs are told to GRIDFLEET_NOTIFY_TOPIC_ARN
    result: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"restarted": [], "terminated": [], "stopped": [], "observed": [], "ended": []}
    )


def apply(actions: Sequence[WatchAction], p: Pass) -> dict[str, Any]:
    """Carry the pass's actions out, in order; what happened, as the pass reports it."""
    r = p.result
    for a in actions:
        match a:
            case End() | Observe() | Healthy() | StaleButAlive() | Restart():
                r["observed"].append(apply_run(a, p))
            case Orphans():
                record_orphans(a, p)
            case Terminate():
                ec2_api.terminate(p.ec2, a.instance_ids)
            case Stop():
                ec2_api.stop(p.ec2, a.instance_ids)
    event(
        log,
        "watch-pass",
        restarted=len(r["restarted"]),
        terminated=len(r["terminated"]),
        stopped=len(r["stopped"]),
        observed=len(r["observed"]),
        ended=len(r["ended"]),
    )
    log.info("watch-result %s", json.dumps(r, sort_keys=True))
    return r


def apply_run(a: End | Observe | Healthy | StaleButAlive | Restart, p: Pass) -> dict[str, Any]:
    """Carry out what a run needs; what was observed of it."""
    match a:
        case End():
            event(
                log,
                "run-abandoned",
                logging.WARNING,
                run_id=a.run_id,
                reason=f"RUNNING more than {p.settings.run_grace_s:.0f}s past its deadline; ending it",
            )
            ended = end_abandoned(p.settings, p.table, p.clock, a.run_id, p.archive)
            ended["notified"] = notify_overdue(p.sns, p.settings.notify_topic_arn, ended, p.settings.run_grace_s)
            p.result["ended"].append(ended)
            return {"run_id": a.run_id, "state": "abandoned"}
        case Observe():
            won = p.table.update_watch(a.run_id, {"seen_hb": a.prev_seen}, seen_hb=a.seen, seen_since=p.now)
            return {
                "run_id": a.run_id,
                "state": "fresh",
                "unchanged_s": 0.0,
                **({} if won else {"note": "observed by another watchdog"}),
            }
        case Healthy():
            return {"run_id": a.run_id, "state": "ok", "unchanged_s": round(a.unchanged_s, 3)}
        case StaleButAlive():
            event(
                log,
                "hub-stale-but-alive",
                logging.WARNING,
                run_id=a.run_id,
                instance_id=",".join(a.instance_ids),
                reason=f"heartbeat unchanged for {a.unchanged_s:.0f}s but the hub instance is pending/running",
            )
            return {
                "run_id": a.run_id,
                "state": "stale-hub-alive",
                "unchanged_s": round(a.unchanged_s, 3),
                "instance_ids": list(a.instance_ids),
            }
        case Restart():
            return restart(a, p)


def restart(a: Restart, p: Pass) -> dict[str, Any]:
    """Claim the restart, then start a hub for the run as the starter would; what was observed of the run."""
    run_id, unchanged = a.watch.run.run_id, a.unchanged_s
    observed: dict[str, Any] = {"run_id": run_id, "unchanged_s": round(unchanged, 3)}
    if not claim_restart(p.table, a.watch, p.now):
        event(
            log,
            "hub-restart-lost-race",
            run_id=run_id,
            reason="another watchdog claimed this restart or the run changed since it was read",
        )
        return {**observed, "state": "restart-claimed-elsewhere"}
    event(
        log,
        "hub-restart",
        logging.WARNING,
        run_id=run_id,
        reason=f"heartbeat unchanged for {unchanged:.0f}s and no hub instance is pending/running",
    )
    try:
        out = start_hub(p.settings, p.ec2, p.table, p.clock, run_id=run_id)
    except Exception:
        release_restart(p.table, a.watch, p.now)
        raise
    observed["state"] = "restart-" + out["action"]
    if out["action"] == "started":
        p.result["restarted"].append(
            {"run_id": run_id, "instance_id": out["instance_id"], "how": out["how"], "unchanged_s": round(unchanged, 3)}
        )
    else:
        observed["reason"] = out["reason"]
    return observed


def record_orphans(a: Orphans, p: Pass) -> None:
    if a.terminate:
        event(
            log,
            "orphans-terminate",
            run_id=a.run_id,
            instance_id=",".join(o.instance_id for o in a.terminate),
            reason=a.reason,
        )
        p.result["terminated"] += [o.as_dict() for o in a.terminate]
    if a.stop:
        event(
            log,
            "orphan-hub-stop",
            run_id=a.run_id,
            instance_id=p.settings.hub_instance_id,
            reason=a.reason + "; the configured hub instance is stopped, not terminated",
        )
        p.result["stopped"] += [o.as_dict() for o in a.stop]


def end_abandoned(
    settings: LambdaSettings, table: WatchTable, clock: Clock, run_id: str, archive: RunArchive | None
) -> dict[str, Any]:
    """End a run whose hub is gone past its deadline and grace, as its hub would have at the deadline: its open
    sites FAILED (`deadline`), the run FINISHED, its summary in the bucket. Its instances go in this same pass."""
    failed = fail_open_sites(
        table,
        run_id,
        Reason.DEADLINE,
        clock,
        error=f"the run's hub was gone {settings.run_grace_s:.0f}s past the deadline",
    )
    now = clock.now()
    table.add_history(
        [
            HistoryEvent(run_id, now, "failed", {"site": name, "reason": str(Reason.DEADLINE), "by": "watchdog"}, n)
            for n, name in enumerate(failed, start=1)
        ]
        + [HistoryEvent(run_id, now, "finish", {"reason": "deadline", "by": "watchdog"}, len(failed) + 1)]
    )
    table.update_run(run_id, status=RunState.FINISHED, finished_at=now)
    rows = table.read_run(run_id)
    out: dict[str, Any] = {"run_id": run_id, "failed": failed, "summary": None}
    if rows.run is not None and archive is not None:
        summary = build_summary(
            rows.run,
            rows.sites,
            left_running=0,
            finished_at=now,
            finish_reason="deadline (ended by the watchdog)",
            unreadable=rows.notes.found,
        )
        out["summary"] = f"s3://{settings.bucket}/{archive.put_summary(summary)}"
    event(
        log,
        "run-ended",
        logging.WARNING,
        run_id=run_id,
        failed=len(failed),
        summary=out["summary"],
        reason="abandoned: FAILED (deadline) what was open",
    )
    return out


def watch(
    settings: LambdaSettings,
    ec2: Any,
    table: WatchTable,
    clock: Clock,
    archive: RunArchive | None = None,
    sns: Any = None,
) -> dict[str, Any]:
    """One watchdog pass: restart the hubs of stale runs, end abandoned ones (their summary to `archive`), then
    clean up orphaned and stopped instances. An ended run is told to the SNS topic through `sns`."""
    now = clock.now()
    actions = decide(read(settings, ec2, table), now, settings)
    return apply(actions, Pass(settings, ec2, table, clock, archive, now, sns=sns))


def run_watchdog(
    event_in: Any,
    env: Mapping[str, str],
    *,
    clients_factory: ClientsFactory = default_clients,
    clock: Clock | None = None,
) -> dict[str, Any]:
    """The watchdog with its environment, clients and clock passed in."""
    settings = LambdaSettings.from_env(env)
    clients = clients_factory(settings)
    archive = S3RunArchive(clients.client("s3"), settings.bucket) if settings.bucket else None
    sns = clients.client("sns") if settings.notify_topic_arn else None
    return watch(settings, clients.client("ec2"), state_table(clients, settings), clock or SystemClock(), archive, sns)


def handler(event_in: Any, context: Any) -> dict[str, Any]:
    """Lambda entry point of the watchdog (one pass per invocation)."""
    return outermost("watchdog", lambda: run_watchdog(event_in, os.environ))
