"""The hub's reconcile loop: snapshot -> plan -> execute -> sleep until the next deadline.

Restartable by construction: everything is read back from the table and the
provider each tick, so a hub killed at any point and started again with the
same run id continues where the first one stopped. The one thing carried from
a tick to the next is the plan's own `Ending` (why and since when the run is
ending), which a restarted hub decides afresh.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gc
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fleet.clock import Clock
from fleet.config import Config
from fleet.logs import event
from fleet.outputs.results import LOCAL_ROLE, ResultStore, checked_result_key
from fleet.outputs.summary import build_summary, export, instances_section
from fleet.record.codec import site_to_item
from fleet.record.messages import SiteQueue
from fleet.record.partition import RunInfo
from fleet.record.readback import Unread, UnreadableItem
from fleet.record.state import RunStatus
from fleet.record.table import StateTable
from hub.actions import Ending, Plan, action_sites
from hub.attention import Attention
from hub.control.base import NodeControl
from hub.end_executor import Finished
from hub.executor import Executor
from hub.history import previous_durations
from hub.plan import metering, plan
from hub.providers.base import ComputeProvider
from hub.snapshot import NodeMoves, Observations, SiteCache, Snapshot, observe_changes

if TYPE_CHECKING:  # the Lambda package imports this module without prometheus_client
    from hub.monitor import HubMonitor

log = logging.getLogger("gridfleet.hub")

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_FAILED_SITES = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a program Ctrl-C stopped
#: What each exit code of `gridfleet` means: its `--help` and its reference page say it from here.
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "every site COMPLETED (any other command: it did what was asked)",
    EXIT_FAILED_SITES: "the run finished with FAILED sites",
    EXIT_USAGE: "bad config or usage: nothing was launched",
    EXIT_ERROR: "any other error",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}
HUB_BEAT_S = 5.0  # how often the hub writes its heartbeat on the run item (the watchdog reads it)
#: The records a tick should find changed, at most: at scale the hub looks again before more have (`pause`).
TICK_CHANGES = 1000
#: After acting the hub looks again soon (`min_sleep_s`), but not sooner than this many seconds per live node: at
#: 5,000 nodes the feed acts at nearly every look, and a look every 0.2 s would cost the hub its whole core.
BUSY_S_PER_NODE = 0.0005
#: From this many site records on, the hub runs the cyclic garbage collector itself, once at the end of each tick,
#: and sets what survives apart from it (`gc.freeze`): a hub holds its run's records for the whole run, and the
#: automatic collector, walking them at random moments, stopped ticks for 100-200 ms at 10,000 sites and made
#: every tick's decision twice as slow. Records hold no cycles: one replaced is freed by its reference count,
#: frozen or not. `release_memory` gives the collector back.
FREEZE_AT_SITES = 5000


@dataclass
class Pace:
    """How fast the run changes as the ticks see it: site records changed per second of the hub's clock (smoothed
    over ticks), and the live nodes."""

    change_rate: float = 0.0
    live_nodes: int = 0
    last_tick_at: float | None = None

    def ticked(self, now: float, changed: int, live_nodes: int) -> None:
        if self.last_tick_at is not None and now > self.last_tick_at:
            rate = changed / (now - self.last_tick_at)
            self.change_rate = rate if self.change_rate == 0 else 0.5 * self.change_rate + 0.5 * rate
        self.last_tick_at, self.live_nodes = now, live_nodes


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    exit_code: int
    summary_path: Path
    counts: dict[str, int]
    left_running: int


class Hub:
    def __init__(
        self,
        *,
        run_id: str,
        config: Config,
        table: StateTable,
        queue: SiteQueue,
        results: ResultStore,
        provider: ComputeProvider,
        control: NodeControl,
        clock: Clock,
        out_dir: Path,
        hub_id: str,
        min_sleep_s: float = 0.2,
        max_tick_failures: int = 20,
        monitor: HubMonitor | None = None,
        expected: Mapping[str, float] | None = None,
        full: bool = False,
        manage_gc: bool = True,
        writer_role: str = LOCAL_ROLE,
    ):
        self.run_id, self.config, self.table, self.queue, self.results = run_id, config, table, queue, results
        self.provider, self.clock, self.out_dir, self.hub_id = provider, clock, out_dir, hub_id
        self.min_sleep_s, self.max_tick_failures, self.monitor = min_sleep_s, max_tick_failures, monitor
        self.obs = Observations()
        self.ending: Ending | None = None  # the last plan's: the run is ending (see `hub.plan.end`)
        self.cache = SiteCache()
        self.attention = Attention()  # which watched sites a plan looks at
        self.node_moves = NodeMoves()  # which nodes' signs may have moved since the last tick
        self.cache.expect(s.id for s in config.sites)
        self.expected = dict(expected) if expected is not None else None  # read once, when the run is seeded
        self.executor = Executor(
            run_id=run_id,
            config=config,
            table=table,
            queue=queue,
            provider=provider,
            control=control,
            clock=clock,
            hub_id=hub_id,
            expire_at=self._expire_at,
            full=full,
            out_dir=out_dir,
            results=results,
            writer_role=writer_role,
        )
        self._last_progress: tuple | None = None
        self._last_beat = float("-inf")
        self.decision_s = 0.0
        self.io_s = 0.0
        self._collecting = False  # the hub runs the garbage collector itself (FREEZE_AT_SITES)
        self.manage_gc = manage_gc  # False: the process around the hub does (the simulator)
        self._pace = Pace()  # how fast the run changes, for `pause`

    def _expire_at(self, t: float) -> int:
        return int(t + self.config.aws.result_ttl_days * 86400)

    def snapshot(self, now: float) -> Snapshot:
        """What the hub sees now. The first call reads the whole partition; later ones read the run item, the
        node items and only the site records that can have changed (see `SiteCache`). While the run is ending,
        the queue's depths too (the end waits for the run's messages in flight)."""
        cache, io = self.cache, self._io
        if not cache.loaded:
            rows = io(self.table.read_run, self.run_id)
            cache.load(rows.sites, rows.notes)
            run, node_rows = rows.run, rows.nodes
        else:
            run = io(self.table.get_run, self.run_id)
            node_rows = io(self.table.read_nodes, self.run_id)
            cache.refresh(
                io(self.table.open_stamps, self.run_id),
                lambda names, notes: io(self.table.get_sites, self.run_id, names, notes),
            )
            self._unbacked_completions(run)
        instances = {i.id: i for i in io(self.provider.list, self.run_id)}
        sites = cache.sites  # the cache's own: the plan only reads it, and the next refresh is after this tick
        nodes = {n.instance_id: n for n in node_rows}
        expected = self._expected(sites)
        held = cache.held if not metering(self.config, expected) else ()  # unsent ones to repair, unless fed
        moved = self.node_moves.since_last(nodes, instances, cache)
        obs = observe_changes(
            self.obs, sites, cache.changed, cache.watch, nodes, instances, now, cache.beats, held, moved
        )
        self.obs = obs
        attend = self.attention.sites(cache, obs, instances, now, self.config)
        depth = io(self.queue.depth) if self.ending is not None else None
        return Snapshot(
            self.run_id,
            run,
            sites,
            nodes,
            instances,
            self.obs,
            queue=depth,
            watch=cache.watch,
            hold=cache.held,
            tally=dict(cache.tally),
            unseen=frozenset(cache.unseen),
            attend=attend,
            busy=cache.by_instance,
            retrying=cache.retrying,
            saving=cache.saving,
            expected=expected,
            ending=self.ending,
            repairs=dict(cache.quarantined),
        )

    def _unbacked_completions(self, run: RunInfo | None) -> None:
        """Sites a record shows COMPLETED that this hub did not complete, with no result at the key their site, date
        and run derive: only the hub completes a site (a node stages its result: `hub.promote`), so such a
        record is a node's write into a site it does not hold. It is set apart for a repair like a record no one
        can read (the attempt counted, the site queued again). One HEAD per completion seen, none in a run no node
        writes into: the hub's own are known (`Executor.completed`)."""
        if run is None:
            return
        for name in sorted(self.cache.changed):
            r = self.cache.sites.get(name)
            if r is None or r.run_status is not RunStatus.COMPLETED or name in self.executor.completed:
                continue
            if self._io(self.results.exists, checked_result_key(name, run.run_date, self.run_id)):
                continue
            why = Unread(self.run_id, name, "run_status", "COMPLETED, with no result at its key: no hub completed it")
            self.cache.set_apart(name, UnreadableItem(why, site_to_item(r)))

    def _io(self, fn, *args):
        """Call an adapter, adding its time to `io_s` (the tick's reads, apart from the hub's own work)."""
        t0 = time.thread_time()
        try:
            return fn(*args)
        finally:
            self.io_s += time.thread_time() - t0

    def _expected(self, sites: Mapping[str, object]) -> Mapping[str, float]:
        """Previous durations, for the order of seeding and of the metered queue: read once, and only while sites
        remain to be seeded or held (a restarted hub reads them again to feed the queue in the same order)."""
        if self.expected is None:
            if self.config.run.order != "longest_first" or (
                len(sites) >= len(self.config.sites) and not self.cache.held
            ):
                return {}
            try:
                self.expected = previous_durations(self.table, self.run_id)
            except Exception as e:  # noqa: BLE001 - an order is a preference: the run goes on without it
                log.warning("expected-durations-unavailable run_id=%s error=%s", self.run_id, e)
                self.expected = {}
        return self.expected

    def tick(self) -> tuple[Snapshot, Plan]:
        now = self.clock.now()
        t0, self.io_s = time.thread_time(), 0.0
        snap = self.snapshot(now)
        if snap.run is not None and snap.run.finished:  # finished from outside (teardown): nothing left to do
            left = sum(1 for i in snap.instances.values() if i.live)
            self.executor.finished = Finished("teardown", left)
            return snap, Plan((), now)
        self._pace.ticked(now, len(self.cache.changed), len(snap.live_instances))
        p = plan(snap, now, self.config)
        # The hub's own work this tick (its cache, observations and plan), apart from its reads and its actions.
        self.decision_s = time.thread_time() - t0 - self.io_s
        acted: list[str] = []
        try:
            for action in p.actions:
                acted.extend(action_sites(action))
                self.cache.recheck(action_sites(action))
                self.executor.execute(action, snap)
                if self.executor.finished:
                    break
        finally:
            self.executor.flush_history()
            self.attention.acted(acted)
        self.ending = p.ending
        if snap.run is not None and not self.executor.finished and now - self._last_beat >= HUB_BEAT_S:
            self.table.update_run(self.run_id, hub_heartbeat=now, hub_id=self.hub_id)
            self._last_beat = now
        self._progress(snap)
        self._monitor(snap)
        self._collect()
        return snap, p

    def _collect(self) -> None:
        """The garbage collection of a large run (see FREEZE_AT_SITES), between two decisions."""
        if not self.manage_gc:
            return
        if not self._collecting and len(self.cache.sites) >= FREEZE_AT_SITES and gc.isenabled():
            gc.disable()
            self._collecting = True
        if self._collecting:
            gc.collect()  # the cycles made since the last tick: what is frozen is not walked
            gc.freeze()

    def release_memory(self) -> None:
        """Give the garbage collector back its automatic passes over everything (the run is over)."""
        if self._collecting:
            self._collecting = False
            gc.unfreeze()
            gc.enable()

    def _monitor(self, snap: Snapshot, finished: bool = False) -> None:
        if self.monitor is None:
            return
        try:  # the monitor's views read the snapshot from other threads: its own copy of the cache's records
            self.monitor.observe(dataclasses.replace(snap, sites=dict(snap.sites)), finished)
        except Exception as e:  # noqa: BLE001 - the dashboard and metrics never stop a run
            log.warning("monitor-failed error=%s: %s", type(e).__name__, e)

    def _progress(self, snap: Snapshot) -> None:
        c = snap.counts()
        live = len(snap.live_instances)
        key = (tuple(sorted(c.items())), live)
        if key != self._last_progress:
            self._last_progress = key
            done = c["COMPLETED"] + c["FAILED"]
            event(
                log,
                "progress",
                run_id=self.run_id,
                done=f"{done}/{len(self.config.sites)}",
                completed=c["COMPLETED"],
                failed=c["FAILED"],
                running=c["RUN"],
                queued=c["QUEUED"],
                nodes=live,
            )

    def _stamp_expiry(self, deadline_at: float) -> None:
        """The run's items no hub made (node items, pacing counters, items a node added) get the run's expiry: the
        node role may not write `expireAt`. Best effort: an item left without one only outlives the run."""
        try:
            n = self.table.stamp_expiry(self.run_id, self._expire_at(deadline_at))
        except Exception as e:  # noqa: BLE001 - expiry keeps the table small; the run's end does not wait on it
            log.warning("expiry-not-stamped run_id=%s error=%s", self.run_id, e)
            return
        if n:
            event(log, "expiry-stamped", logging.DEBUG, run_id=self.run_id, items=n)

    def run(self) -> RunOutcome:
        try:
            return self._run()
        finally:
            self.release_memory()

    def _run(self) -> RunOutcome:
        failures = 0
        while True:
            try:
                _, p = self.tick()
                failures = 0
            except Exception as e:  # the outermost loop: a bad tick is logged and retried, not fatal
                failures += 1
                event(
                    log,
                    "tick-failed",
                    logging.ERROR,
                    run_id=self.run_id,
                    failures=failures,
                    error=f"{type(e).__name__}: {e}",
                )
                log.debug("tick failure", exc_info=True)
                if failures >= self.max_tick_failures:
                    raise
                self.clock.sleep(min(self.config.run.watch_interval_s, 0.5 * 2 ** min(failures, 6)))
                continue
            if self.executor.finished:
                return self._finish(self.executor.finished)
            self.clock.sleep(self.pause(p, self.clock.now()))

    def pause(self, p: Plan, now: float) -> float:
        """How long to sleep after a tick: briefly after acting (its effects are worth a look), else until the
        plan's next deadline, never longer than the watch interval, nor than it takes the fleet to change about
        TICK_CHANGES records (at 5,000 nodes a few seconds: each look then costs a few hundred changes)."""
        busy = bool(p.actions) or self.executor.conflicts
        self.executor.conflicts = 0
        pace = self._pace
        soon = max(self.min_sleep_s, BUSY_S_PER_NODE * pace.live_nodes)
        pause = soon if busy else max(self.min_sleep_s, p.wake_at - now)
        if pace.change_rate > 0:
            pause = min(pause, max(self.min_sleep_s, TICK_CHANGES / pace.change_rate))
        return min(pause, self.config.run.watch_interval_s)

    def _finish(self, fin: Finished) -> RunOutcome:
        rows = self.table.read_run(self.run_id)
        if rows.run is None:  # the plan finishes only a run whose item it saw
            raise RuntimeError(f"run {self.run_id} has no run item to finish")
        now = self.clock.now()
        summary = build_summary(
            rows.run,
            rows.sites,
            left_running=fin.left_running,
            finished_at=now,
            finish_reason=fin.reason,
            unreadable=rows.notes.found,
        )
        try:
            types = {i.id: i.instance_type for i in self.provider.list(self.run_id)}
        except Exception as e:  # noqa: BLE001 - instance types are for the report's cost only
            log.warning("instance-types-unavailable error=%s", e)
            types = {}
        summary["instances"] = instances_section(rows.nodes, types)
        summary["pacing"] = self.table.read_pacing(self.run_id)  # each domain's pace, from the nodes' counters
        summary["max_attempts"] = self.config.run.max_attempts  # what `check` bounds attempts by, from runs/ too
        if self.config.crawlers is not None and self.config.crawlers.installed is not None:
            summary["crawlers"] = self.config.crawlers.installed.model_dump()  # which code produced the results
        try:
            depth = self.queue.depth()
            summary["queue"] = {"visible": depth.visible, "in_flight": depth.in_flight, "dlq": depth.dlq}
            if depth.dlq:
                event(
                    log,
                    "dlq-not-empty",
                    logging.WARNING,
                    run_id=self.run_id,
                    messages=depth.dlq,
                    hint="see `gridfleet check`",
                )
        except Exception as e:  # noqa: BLE001 - depths are a report, not a decision
            log.warning("queue-depth-unavailable error=%s", e)
        path = export(self.out_dir, summary, rows.sites, self.results, self.executor.writer_role)
        self._stamp_expiry(rows.run.deadline_at)
        self.executor.mark_finished(now)
        if self.monitor is not None:
            self._monitor(self.snapshot(now), finished=True)
        c = summary["counts"]
        failed = c[RunStatus.FAILED.value]
        event(
            log,
            "run-finished",
            run_id=self.run_id,
            reason=fin.reason,
            completed=c["COMPLETED"],
            failed=failed,
            nodes_launched=summary["nodes"]["launched"],
            left_running=fin.left_running,
            summary=str(path),
        )
        code = EXIT_FAILED_SITES if failed else EXIT_OK
        if fin.left_running:
            code = EXIT_ERROR
        return RunOutcome(self.run_id, code, path, c, fin.left_running)


def default_run_id(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%d")
