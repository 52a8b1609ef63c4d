"""The simulated cloud and its nodes.

`VirtualCloud` is a ComputeProvider on virtual time: instances boot after a
random delay, launches can fail for lack of capacity (per instance type, as
EC2 answers InsufficientInstanceCapacity), spot instances are reclaimed at a
rate with EC2's two-minute notice, and every instance is billed from launch
to termination (at least 60 s, as EC2 bills Linux).

`SimNode` follows the node agent's protocol step for step (`node/agent.py`:
receive -> classify -> claim -> skip check -> crawl with heartbeats and the
watchdog -> result or requeue -> next or exit) and makes its decisions with
the same `fleet.ops` functions on the same table, queue and result store. It
is event-driven instead of a blocking loop, so that 500 nodes cost no threads.
A crawl is a timeline of progress reports; a hang is a page that never ends.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from fleet import ops
from fleet.codec import NodeInfo
from fleet.errors import StaleWrite
from fleet.results import result_key
from fleet.state import Outcome, Reason, RunStatus, SiteStatus
from hub.control.base import KillResult
from hub.providers.base import LaunchResult
from hub.snapshot import Instance
from node.agent import CLAIMED_VISIBILITY_S, run_has_queued

if TYPE_CHECKING:
    from hub.sim.engine import Engine
    from hub.sim.run import Sim

SPOT_NOTICE_S = 120.0  # EC2's interruption notice
MIN_BILLED_S = 60.0
SHUTDOWN_S = 5.0  # from `shutdown -h now` to terminated
BROWSER_START_S = 2.0  # a Grid session, as measured on the embedded default


@dataclass
class VInstance:
    id: str
    instance_type: str
    launched_at: float
    boot_s: float
    spot: bool
    state: str = "pending"
    ended_at: float | None = None
    interrupted: bool = False
    notice_at: float | None = None
    node: "SimNode | None" = None

    def billed_s(self, now: float) -> float:
        end = self.ended_at if self.ended_at is not None else now
        return max(MIN_BILLED_S, end - self.launched_at)


class VirtualCloud:
    """EC2 for the simulator (see the module doc)."""

    def __init__(self, sim: "Sim", rng: random.Random):
        self.sim = sim
        self.rng = rng
        self.instances: dict[str, VInstance] = {}
        self._ids = itertools.count(1)
        self.run_instances_calls = 0

    # --- ComputeProvider ---------------------------------------------------------------
    def list(self, run_id: str) -> list[Instance]:
        return [Instance(v.id, v.state, "node", {}, v.instance_type, v.interrupted) for v in self.instances.values()
                if v.state != "terminated" or self.sim.engine.now - (v.ended_at or 0) < 3600]

    def launch(self, run_id: str, count: int, target: int | None = None) -> LaunchResult:
        p, fleet = self.sim.params, self.sim.config.fleet
        if target is not None:
            live = sum(1 for v in self.instances.values() if v.state in ("pending", "running"))
            count = min(count, max(0, target - live))
        launched: list[str] = []
        errors: list[str] = []
        markets = [True, False] if fleet.spot and fleet.on_demand_fallback else [fleet.spot]
        for spot in markets:
            for itype in fleet.instance_types:
                if len(launched) >= count:
                    break
                self.run_instances_calls += 1
                if self.rng.random() < p.capacity_error_rate:
                    errors.append(f"InsufficientInstanceCapacity: no {itype} ({'spot' if spot else 'on-demand'})")
                    continue
                for _ in range(count - len(launched)):
                    launched.append(self._start(itype, spot))
        return LaunchResult(tuple(launched), tuple(errors) if not launched else ())

    def terminate(self, instance_ids: Sequence[str]) -> None:
        for iid in instance_ids:
            self.end(iid)

    def hub_alive(self, hub_id: str) -> bool:
        return True

    # --- the instances' lives -------------------------------------------------------------
    def _start(self, itype: str, spot: bool) -> str:
        now, p = self.sim.engine.now, self.sim.params
        iid = f"i-{next(self._ids):06d}"
        boot = max(5.0, self.rng.gauss(p.boot_s, p.boot_s * 0.15))
        v = VInstance(iid, itype, now, boot, spot)
        self.instances[iid] = v
        v.node = SimNode(self.sim, v)
        self.sim.engine.at(now + boot, v.node.boot)
        if spot and p.spot_per_hour > 0:
            reclaim = now + self.rng.expovariate(p.spot_per_hour / 3600.0)
            v.notice_at = reclaim - SPOT_NOTICE_S
            self.sim.engine.at(v.notice_at, v.node.spot_notice_arrives)
            self.sim.engine.at(reclaim, lambda: self.end(iid, interrupted=True))
        return iid

    def end(self, iid: str, interrupted: bool = False) -> None:
        v = self.instances.get(iid)
        if v is None or v.state == "terminated":
            return
        v.state, v.ended_at = "terminated", self.sim.engine.now
        v.interrupted = v.interrupted or interrupted
        if v.node is not None:
            v.node.dead = True

    def shutdown(self, iid: str) -> None:
        """The node shut its instance down (it ran dry, or after a spot notice)."""
        v = self.instances[iid]
        if v.state != "terminated":
            v.state = "shutting-down"
            self.sim.engine.at(self.sim.engine.now + SHUTDOWN_S, lambda: self.end(iid))


class SimControl:
    """The kill ladder's first rung (SSM) reaching a simulated node: it always gets through."""

    def __init__(self, cloud: VirtualCloud):
        self.cloud = cloud

    def kill(self, instance_id: str, site: str, attempt: int) -> KillResult:
        v = self.cloud.instances.get(instance_id)
        if v is None or v.state == "terminated" or v.node is None:
            return KillResult(True, "ssm", "instance gone")
        v.node.crawler_killed(site, attempt)
        return KillResult(True, "ssm")


@dataclass
class Crawl:
    """One attempt in progress: its timeline of crawler events, and where it has got to."""

    site: str
    attempt: int
    claimed_at: float
    events: deque  # (time, kind, payload): status / result; a hang is a URL_CALL with nothing after it
    hang_at: float | None = None  # when the hung page started
    status: SiteStatus = SiteStatus.PENDING
    since: float = 0.0
    next_beat: float = 0.0
    killed: bool = False
    msg: Any = None
    progress: Any = None  # ops.Progress: the latest step, written with the next heartbeat
    hidden_until: float = 0.0


@dataclass
class SimNode:
    sim: "Sim"
    inst: VInstance
    dead: bool = False
    stopping: bool = False
    notice: bool = False
    sites_done: int = 0
    idle_since: float = 0.0
    next_node_beat: float = 0.0
    state: str = "booting"
    crawl: Crawl | None = None
    gen: int = 0  # wake-ups scheduled under an older generation are void
    waiting: bool = False
    rec: Any = None

    # --- scheduling -------------------------------------------------------------------
    @property
    def engine(self) -> "Engine":
        return self.sim.engine

    def _wake(self, t: float, fn: Callable[[], None]) -> None:
        self.gen += 1
        gen = self.gen

        def go() -> None:
            if gen == self.gen and not self.dead:
                fn()
        self.engine.at(t, go)

    # --- life ---------------------------------------------------------------------------
    def boot(self) -> None:
        if self.dead:
            return
        self.inst.state = "running"
        run = self.sim.node_table.get_run(self.sim.run_id)
        if run is None:
            return self._exit()
        self._set_node("idle")
        self.idle_since = self.engine.now
        self.poll()

    def _exit(self) -> None:
        self._set_node("exiting")
        self.gen += 1
        self.sim.cloud.shutdown(self.inst.id)

    def spot_notice_arrives(self) -> None:
        if self.dead:
            return
        self.notice = True
        if self.crawl is not None and not self.crawl.killed:
            self._wake(self.engine.now, self._step)  # the agent looks at the notice within a second
        elif self.waiting:
            self._wake(self.engine.now, self.poll)

    def woken_by_message(self) -> bool:
        if not self.waiting or self.dead:
            return False
        self.waiting = False
        self._wake(self.engine.now, self.poll)
        return True

    def poll(self) -> None:
        """One turn of the agent's main loop."""
        s, now = self.sim.settings, self.engine.now
        self.waiting = False
        if self.stopping or self.notice:
            return self._exit()
        if s.sites_per_node and self.sites_done >= s.sites_per_node:
            return self._exit()
        msg = self.sim.node_queue.receive(s.receive_wait_s, s.visibility_s)
        self._node_beat()
        if msg is None:
            if now - self.idle_since >= s.idle_exit_s:
                if not run_has_queued(self.sim.node_table, self.sim.run_id):
                    return self._exit()
                self.idle_since = now  # as the agent: a message is on its way
            run = self.sim.node_table.get_run(self.sim.run_id)
            if run is None or run.finished:
                return self._exit()
            # A long poll: back when a message arrives, or after the wait.
            self.waiting = True
            self.sim.waiters.append(self)
            self._wake(now + s.receive_wait_s, self.poll)
            return
        if self._handle(msg):
            return  # an attempt started; its end calls poll again
        self._wake(now, self.poll)

    def _handle(self, msg: Any) -> bool:
        table, queue, now = self.sim.node_table, self.sim.node_queue, self.engine.now
        rec = table.get_site(msg.run_id, msg.site)
        verdict = ops.classify(rec, msg.attempt)
        if verdict is ops.Verdict.STALE:
            queue.delete(msg)
            return False
        if verdict is ops.Verdict.WAIT:
            queue.set_visibility(msg, min(self.sim.settings.visibility_s, 30))
            return False
        try:
            rec = ops.claim(table, rec, self.inst.id, self.sim.clock.now(), receipt=msg.receipt)
        except StaleWrite as e:
            if ops.classify(e.current, msg.attempt) is ops.Verdict.STALE:
                queue.delete(msg)
            return False
        self.rec = rec
        queue.set_visibility(msg, CLAIMED_VISIBILITY_S)  # once: the hub recovers claimed sites
        key = result_key(rec.site, self.sim.run_date, rec.run_id)
        if self.sim.node_results.exists(key):
            self._write(ops.complete, key, self.sim.clock.now(), skipped=True)
            queue.delete(msg)
            self.sites_done += 1
            self._after_attempt()
            return True
        self._set_node("busy", rec.site, rec.attempt)
        self.crawl = self.sim.workload.attempt(self, rec, now)
        self.crawl.msg = msg
        self.crawl.hidden_until = now + CLAIMED_VISIBILITY_S
        self.crawl.since = now
        self.crawl.next_beat = now + self.sim.settings.heartbeat_interval_s
        self._schedule()
        return True

    # --- the crawl ------------------------------------------------------------------------
    def _schedule(self) -> None:
        c, s = self.crawl, self.sim.settings
        assert c is not None
        wake = c.next_beat
        if c.events:
            wake = min(wake, c.events[0][0])
        if c.status is SiteStatus.URL_CALL and s.node_watchdog:
            wake = min(wake, c.since + s.hang_after_s)
        self._wake(wake, self._step)

    def _step(self) -> None:
        c, s, now = self.crawl, self.sim.settings, self.engine.now
        assert c is not None
        try:
            if c.killed:
                return self._end("error", "crawler process ended without a result (killed by signal 9)")
            while c.events and c.events[0][0] <= now:
                _, kind, payload = c.events.popleft()
                if kind == "status":
                    status, url, pages = payload
                    c.progress = ops.Progress(status, self.sim.clock.now(), url, pages)
                    if not s.node_watchdog:  # as the agent: each step at once only when the hub times them
                        self._write(ops.report, status, c.progress.at, url=url, pages=pages)
                    c.status, c.since = status, now
                elif kind == "checkpoint":  # as the agent: one write with the progress, and a heartbeat
                    self.sim.stats.checkpoints += 1
                    self._write(ops.save_checkpoint, self.sim.clock.now(), c.progress,
                                {"next": f"p{payload + 1}", "pages": payload, "items": []})
                    c.next_beat = now + s.heartbeat_interval_s
                elif kind == "result":
                    return self._end("result")
            if now >= c.next_beat:
                self._beat()
                c.next_beat = now + s.heartbeat_interval_s
            if self.notice:
                return self._give_back_spot()
            if c.status is SiteStatus.URL_CALL and s.node_watchdog and now >= c.since + s.hang_after_s:
                return self._end("hang", kill_path="watchdog")
        except _Fenced as f:
            return self._fenced(f.current)
        self._schedule()

    def crawler_killed(self, site: str, attempt: int) -> None:
        c = self.crawl
        if c is not None and c.site == site and c.attempt == attempt and not c.killed:
            c.killed = True
            self._wake(self.engine.now, self._step)

    def _end(self, kind: str, error: str | None = None, kill_path: str | None = None) -> None:
        c, rec, now = self.crawl, self.rec, self.engine.now
        assert c is not None and rec is not None
        table, queue = self.sim.node_table, self.sim.node_queue
        try:
            if kind == "result":
                self._beat()  # still ours? (a zombie must not write a result)
                key = result_key(rec.site, self.sim.run_date, rec.run_id)
                self.sim.node_results.put_new(key, b"{}")
                self._write(ops.complete, key, self.sim.clock.now())
                queue.delete(c.msg)
                self.sim.stats.attempt_ended(self.inst.id, rec.site, c.attempt, now, "completed", c)
            else:
                reason = Reason.HANG if kind == "hang" else Reason.ERROR
                new = self._write(ops.end_attempt, outcome=Outcome(str(reason)), reason=reason,
                                  now=self.sim.clock.now(), max_attempts=self.sim.settings.max_attempts,
                                  spot_cap=self.sim.settings.spot_cap, kill_path=kill_path, error=error)
                if new.run_status is RunStatus.QUEUED:
                    ops.send_next(table, queue, new)
                queue.delete(c.msg)
                self.sim.stats.attempt_ended(self.inst.id, rec.site, c.attempt, now, str(reason), c)
        except _Fenced as f:
            return self._fenced(f.current)
        self.sites_done += 1
        self._after_attempt()

    def _fenced(self, current: Any) -> None:
        """The hub moved the record on (a kill): drop the attempt, as the agent does."""
        c, now = self.crawl, self.engine.now
        assert c is not None
        self.sim.node_queue.delete(c.msg)
        self.sim.stats.attempt_ended(self.inst.id, c.site, c.attempt, now, "fenced", c)
        if current is not None and current.kill_reason == str(Reason.LOST) and current.instance_id == self.inst.id:
            self.stopping = True
        self.sites_done += 1
        self._after_attempt()

    def _give_back_spot(self) -> None:
        c, now = self.crawl, self.engine.now
        assert c is not None
        self.stopping = True
        queue = self.sim.node_queue
        try:
            new = self._write(ops.end_attempt, outcome=Outcome.SPOT, reason=Reason.SPOT, now=self.sim.clock.now(),
                              max_attempts=self.sim.settings.max_attempts, spot_cap=self.sim.settings.spot_cap,
                              error="spot interruption notice")
        except _Fenced:
            queue.delete(c.msg)
            self.sim.stats.attempt_ended(self.inst.id, c.site, c.attempt, now, "fenced", c)
            return self._after_attempt()
        if new.run_status is RunStatus.QUEUED and new.attempt < c.attempt:
            self._write(ops.mark_enqueued)
            queue.set_visibility(c.msg, 0)
        elif new.run_status is RunStatus.QUEUED:
            ops.send_next(self.sim.node_table, queue, new)
            queue.delete(c.msg)
        else:
            queue.delete(c.msg)
        self.sim.stats.attempt_ended(self.inst.id, c.site, c.attempt, now, "spot", c)
        self._after_attempt()

    def _after_attempt(self) -> None:
        self.crawl, self.rec = None, None
        self._set_node("idle")
        self.idle_since = self.engine.now
        self._wake(self.engine.now, self.poll)

    # --- writes ---------------------------------------------------------------------------
    def _write(self, op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            self.rec = op(self.sim.node_table, self.rec, *args, **kwargs)
        except StaleWrite as e:
            raise _Fenced(e.current) from None
        return self.rec

    def _beat(self) -> None:
        """As the agent's: one write with the progress since the last; the node item is not written while busy."""
        c = self.crawl
        self.sim.stats.heartbeats += 1
        self._write(ops.beat, self.sim.clock.now(), c.progress if c is not None else None)
        now = self.engine.now
        if c is not None and c.msg is not None and now + 2 * self.sim.settings.heartbeat_interval_s >= c.hidden_until:
            self.sim.node_queue.set_visibility(c.msg, CLAIMED_VISIBILITY_S)
            c.hidden_until = now + CLAIMED_VISIBILITY_S

    def _set_node(self, state: str, site: str | None = None, attempt: int | None = None) -> None:
        self.state = state
        self._node_site = (site, attempt)
        self._node_beat(force=True)

    def _node_beat(self, force: bool = False) -> None:
        now = self.engine.now
        if not force and now < self.next_node_beat:
            return
        site, attempt = getattr(self, "_node_site", (None, None))
        self.sim.node_table.put_node(NodeInfo(self.sim.run_id, self.inst.id, self.state, self.sim.clock.now(),
                                              self.inst.launched_at, site, attempt, self.sites_done))
        self.next_node_beat = now + self.sim.settings.heartbeat_interval_s


class _Fenced(Exception):
    def __init__(self, current: Any):
        self.current = current
