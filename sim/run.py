"""`gridfleet simulate`: a whole run of N sites on M nodes in virtual time, on the hub's own code.

The hub is the real `Hub` (its `plan()`, executor and site cache) on the
in-memory table; the nodes are `SimNode`s making the agent's decisions with
`fleet.protocol` and writing with `fleet.record.ops`; the cloud and the crawls are
simulated (`sim.cloud`, `sim.node`, `sim.workload`).
The figures it reports are defined in `SimResult`.
"""

from __future__ import annotations

import gc
import logging
import math
import random
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.config import Config
from fleet.config.rules import rules_from_config
from fleet.outputs.summary import failed_attempts, site_entry
from hub.control.base import KillResult
from hub.loop import Hub
from hub.plan import run_date_for
from sim.cloud import SimControl, VirtualCloud
from sim.cost import Meter, SimResults
from sim.engine import (
    EC2_CALLS,
    EPOCH0,
    QUEUE_CALLS,
    RESULT_CALLS,
    TABLE_CALLS,
    Counted,
    Engine,
    SimClock,
)
from sim.memory import MemoryStateTable
from sim.model import SimParams, Stats
from sim.queue import MemoryQueue
from sim.workload import Workload
from sim.world import Waiter

#: gridfleet: today's defaults; unmetered: the same with every first message sent at seeding (`run.feed: all`, as
#: before the queue was metered); seed: the original design.
POLICIES = ("gridfleet", "unmetered", "seed")
SEED_POLL_S = 30.0  # the original design's hub polled on a fixed period
GC_EVERY_EVENTS = 200_000  # the simulation collects its garbage once per this many events


def sim_config(p: SimParams, site_ids: list[str]) -> Config:
    base = p.config.model_dump(mode="json", exclude={"sites"}) if p.config else {}
    run = {"deadline_s": 7 * 86400, **base.get("run", {})}
    fleet = {**base.get("fleet", {}), "max_nodes": p.nodes}
    if p.policy == "seed":  # FIFO, one site per node, no node watchdog (the hub polls and kills)
        run.update(order="config", feed="all")
        fleet.update(sites_per_node=1, node_watchdog=False)
    elif p.policy == "unmetered":
        run["feed"] = "all"
    fleet.setdefault("max_launches", 3 * p.nodes + 3 * len(site_ids))
    sites = [{"id": s, "start_url": f"https://{s}.example.test/"} for s in site_ids]
    return Config.model_validate({**base, "run": run, "fleet": fleet, "sites": sites})


class Sim:
    def __init__(self, p: SimParams):
        if p.policy not in POLICIES:
            raise ValueError(f"unknown policy {p.policy!r}: one of {', '.join(POLICIES)}")
        self.params = p
        self.rng = random.Random(p.seed)
        self.workload = Workload(p, self.rng)
        self.config = sim_config(p, self.workload.site_ids)
        self.engine = Engine()
        self.clock = SimClock(self.engine)
        self.run_id = "2027-01-15"
        self.run_date = run_date_for(self.run_id, self.clock.now())
        self.settings = rules_from_config(self.config)
        self.stats = Stats(self.config.run.hang_after_s)
        self.waiters: deque[Waiter] = deque()
        self.hub_calls: Counter = Counter()
        self.node_calls: Counter = Counter()
        table, results = MemoryStateTable(), SimResults()
        self.meter = Meter(results, table)
        # the nodes' long polls are events on the heap: an empty receive returns at once, a send wakes a waiter
        queue = MemoryQueue(self.clock, self.config.aws.max_receive_count, long_poll=False, on_send=self._message_sent)
        self.queue = queue
        self.cloud = VirtualCloud(self, self.rng)
        self.node_table = Counted(table, "dynamodb", TABLE_CALLS, self.node_calls, self.meter.table)
        self.node_queue = Counted(queue, "sqs", QUEUE_CALLS, self.node_calls)
        self.node_results = Counted(results, "s3", RESULT_CALLS, self.node_calls, self.meter.s3)
        self.table = table
        self.results = results
        self._out = tempfile.TemporaryDirectory(prefix="gridfleet-sim-")
        self.hub_restarts = 0
        self.hub = self._new_hub()
        self.finished_at: float | None = None

    def _new_hub(self) -> Hub:
        """A hub as the run's instance starts it: all it knows is read back from the table and the cloud."""
        return Hub(
            run_id=self.run_id,
            config=self.config,
            table=Counted(self.table, "dynamodb", TABLE_CALLS, self.hub_calls, self.meter.table),
            queue=Counted(self.queue, "sqs", QUEUE_CALLS, self.hub_calls),
            results=Counted(self.results, "s3", RESULT_CALLS, self.hub_calls, self.meter.s3),
            provider=Counted(self.cloud, "ec2", EC2_CALLS, self.hub_calls),
            control=_CountedControl(self),
            clock=self.clock,
            out_dir=Path(self._out.name),
            hub_id=f"sim-hub-{self.hub_restarts}",
            manage_gc=False,  # the simulation runs the collector itself (`run`)
            expected=self.workload.expected if self.config.run.order == "longest_first" else {},
        )

    def _restart_hub(self) -> None:
        """The hub dies between two ticks (its memory with it) and a new one takes over at its next tick."""
        if self.finished_at is None:
            self.hub.release_memory()
            self.hub_restarts += 1
            self.hub = self._new_hub()

    def _message_sent(self) -> None:
        while self.waiters:
            if self.waiters.popleft().woken_by_message():
                return

    def message_visible(self) -> None:
        """A message a node hid (`MessageAction.HIDE`) shows again: a node in a long poll receives it at once, the
        one waiting longest first, rather than the node that hid it, whose turns fall on that very time."""
        while self.waiters:
            if self.waiters.popleft().polled_by_visible_message():
                return

    def _collect(self) -> None:
        """The garbage collector, run by the simulation: its hundreds of thousands of live objects (records, items,
        timers) made the automatic collector stop whatever ran, the hub's ticks included, for 100 ms and more;
        now it runs between two events, on what was made since it last ran (the rest set apart, `gc.freeze`),
        and the hub's decisions are timed without it, as a large run's hub runs it between ticks."""
        gc.collect()
        gc.freeze()
        if not self.engine.stop:
            self.engine.after_events(GC_EVERY_EVENTS, self._collect)

    def _hub_tick(self) -> None:
        now = self.engine.now
        _, p = self.hub.tick()
        self.stats.tick_ms.append(self.hub.decision_s * 1000)
        if self.hub.executor.finished:
            self.finished_at = now
            self.hub.executor.mark_finished(self.clock.now())  # as the hub's end does (`gridfleet check` reads it)
            self.engine.stop = True
            return
        pause = SEED_POLL_S if self.params.policy == "seed" else self.hub.pause(p, now)
        self.engine.at(now + pause, self._hub_tick)

    def run(self) -> SimResult:
        logger = logging.getLogger("gridfleet")
        level = logger.level
        logger.setLevel(logging.ERROR)
        wall0, cpu0 = time.perf_counter(), time.process_time()
        collecting = gc.isenabled()
        gc.disable()  # collected every GC_EVERY_EVENTS events instead (see there)
        try:
            self.engine.at(0.0, self._hub_tick)
            if self.params.hub_restart_at is not None:
                self.engine.at(self.params.hub_restart_at, self._restart_hub)
            self.engine.after_events(GC_EVERY_EVENTS, self._collect)
            self.engine.run(until=self.config.run.deadline_s + 3600)
        finally:
            logger.setLevel(level)
            self._out.cleanup()
            gc.unfreeze()
            if collecting:
                gc.enable()
        wall = time.perf_counter() - wall0
        self.hub_calls[("ec2", "RunInstances")] += self.cloud.run_instances_calls
        return SimResult.of(self, wall, time.process_time() - cpu0)


class _CountedControl:
    """SSM: SendCommand, then GetCommandInvocation until it is done (once, here)."""

    def __init__(self, sim: Sim):
        self.sim = sim
        self.inner = SimControl(sim.cloud)

    def kill(self, instance_id: str, site: str, attempt: int) -> KillResult:
        self.sim.hub_calls[("ssm", "SendCommand")] += 1
        self.sim.hub_calls[("ssm", "GetCommandInvocation")] += 1
        return self.inner.kill(instance_id, site, attempt)


def _tail(sites: list[Any], lower_bound_s: float) -> dict[str, Any]:
    """`SimResult`'s figures of the run's tail, from the sites' attempt histories (times on the virtual clock)."""
    waits: list[float] = []
    late = late_retried = 0
    for r in sites:
        at = r.attempts
        waits.extend(b.start - a.end for a, b in zip(at, at[1:], strict=False) if a.end is not None)
        if at and at[-1].end is not None and at[-1].end - EPOCH0 > lower_bound_s:
            late += 1
            late_retried += len(at) > 1
    return {
        "retry_wait_p95_s": round(_pct(waits, 0.95), 1),
        "retry_wait_max_s": round(max(waits, default=0.0), 1),
        "late_sites": late,
        "late_retried": late_retried,
    }


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


@dataclass
class SimResult:
    """The figures of one simulated run (keys of `--json`)."""

    policy: str
    sites: int
    nodes: int
    seed: int
    makespan_s: float
    lower_bound_s: float
    ratio: float
    hang_lag_max_s: float
    hang_lag_p95_s: float
    hangs: int
    utilization: float
    node_hours: float
    cost_usd: float
    instances_launched: int
    api_calls_per_site: dict[str, float]
    api_calls_by_operation: dict[str, float]
    hub_calls_per_site: float
    heartbeat_calls_per_site: float
    heartbeat_interval_s: float
    checkpoint_calls_per_site: float
    ticks: int
    hub_restarts: int
    tick_cpu_ms_p95: float
    tick_cpu_ms_max: float
    completed: int
    failed: int
    attempts: dict[str, int]
    failures: dict[str, int]  # failed attempts by class, as summary.json's `failures` counts them (`http_4xx 404`)
    left_running: int
    sim_events: int
    wall_s: float
    cpu_s: float
    # What the sites' state and the run's DynamoDB and S3 requests cost (sim/cost.py, sim/units.py):
    state_bytes_per_site: float = 0.0  # bytes the checkpoints wrote: the record's checkpoint and the parts
    state_write_units_per_site: float = 0.0  # DynamoDB write units of the checkpoint writes
    state_usd_per_site: float = 0.0  # those units, the parts' PUTs and a retry's GETs, in USD
    write_units_per_site: float = 0.0  # every DynamoDB write unit (hub and nodes)
    read_units_per_site: float = 0.0  # every DynamoDB read unit
    s3_requests_per_site: dict[str, float] = field(default_factory=dict)  # put, get (HEAD counts as a get)
    s3_bytes_per_site: dict[str, float] = field(default_factory=dict)  # put, get
    requests_usd_per_site: float = 0.0  # DynamoDB units and S3 requests, in USD
    requests_usd: float = 0.0  # the same for the whole run
    requests_share: float = 0.0  # requests_usd over the fleet's EC2 cost (cost_usd)
    # Where the time above the lower bound goes: how long retried sites waited for their next attempt, and the
    # sites that ended after the lower bound (with how many of them had been retried).
    retry_wait_p95_s: float = 0.0
    retry_wait_max_s: float = 0.0
    late_sites: int = 0
    late_retried: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, sim: Sim, wall: float, cpu: float) -> SimResult:
        p, cfg = sim.params, sim.config
        n = len(sim.workload.site_ids)
        end = sim.finished_at if sim.finished_at is not None else sim.engine.now
        work = sim.workload.work
        boot = min((v.boot_s for v in sim.cloud.instances.values()), default=p.boot_s)  # the fastest seen
        lb = max(boot + max(work), boot + sum(work) / p.nodes)
        billed = sum(v.billed_s(end) for v in sim.cloud.instances.values())
        price = cfg.fleet.hourly_price
        cost = sum(v.billed_s(end) / 3600 * price.get(v.instance_type, 0.0) for v in sim.cloud.instances.values())
        calls = sim.hub_calls + sim.node_calls
        by_service: Counter = Counter()
        for (service, _), c in calls.items():
            by_service[service] += c
        total = sum(by_service.values())
        sim.meter.n["sqs_requests"] = by_service["sqs"]  # (EC2 and SSM calls cost nothing)
        sites = sim.table.read_run(sim.run_id).sites
        completed = sum(1 for r in sites if r.run_status.value == "COMPLETED")
        failed = sum(1 for r in sites if r.run_status.value == "FAILED")
        left = sum(1 for v in sim.cloud.instances.values() if v.state in ("pending", "running"))
        return cls(
            policy=p.policy,
            sites=n,
            nodes=p.nodes,
            seed=p.seed,
            makespan_s=round(end, 1),
            lower_bound_s=round(lb, 1),
            ratio=round(end / lb, 3),
            hang_lag_max_s=round(max(sim.stats.hang_lags, default=0.0), 2),
            hang_lag_p95_s=round(_pct(sim.stats.hang_lags, 0.95), 2),
            hangs=len(sim.stats.hang_lags),
            utilization=round(sim.stats.busy_s / billed, 3) if billed else 0.0,
            node_hours=round(billed / 3600, 2),
            cost_usd=round(cost, 2),
            instances_launched=len(sim.cloud.instances),
            api_calls_per_site={
                **{k: round(v / n, 2) for k, v in sorted(by_service.items())},
                "total": round(total / n, 2),
            },
            api_calls_by_operation={f"{s}:{op}": round(c / n, 3) for (s, op), c in sorted(calls.items())},
            hub_calls_per_site=round(sum(sim.hub_calls.values()) / n, 2),
            heartbeat_calls_per_site=round(sim.stats.heartbeats / n, 2),
            heartbeat_interval_s=sim.settings.heartbeat_interval_s,
            checkpoint_calls_per_site=round(sim.stats.checkpoints / n, 2),
            ticks=len(sim.stats.tick_ms),
            hub_restarts=sim.hub_restarts,
            tick_cpu_ms_p95=round(_pct(sim.stats.tick_ms, 0.95), 2),
            tick_cpu_ms_max=round(max(sim.stats.tick_ms, default=0.0), 2),
            completed=completed,
            failed=failed,
            attempts=dict(sim.stats.outcomes),
            failures=failed_attempts({r.site: site_entry(r) for r in sites}),
            left_running=left,
            sim_events=sim.engine.events,
            wall_s=round(wall, 2),
            cpu_s=round(cpu, 2),
            **sim.meter.figures(n),
            requests_share=round(sim.meter.usd() / cost, 4) if cost else 0.0,
            **_tail(sites, lb),
        )

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out.pop("extra")
        return out


def simulate(p: SimParams) -> SimResult:
    return Sim(p).run()
