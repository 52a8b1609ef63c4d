"""A whole fleet in virtual time, for fault tests: the real Hub and real node Agents on in-memory AWS.

Fakes stand in only where nothing real can run in one test process in virtual
time: AWS is sim.memory (whose contract the adapter suite checks against moto),
instances are Agent actors, and a crawl is a scripted event stream (the real
crawler process and Chromium are covered by the adapter and e2e tiers). Hub,
plan, executor, agent, ops and records are the real code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cli.report.check import CheckReport, check_run
from fleet.config import Config
from hub.control.base import KillResult
from hub.loop import Hub, RunOutcome
from hub.providers.base import LaunchResult
from hub.snapshot import Instance
from node.agent import Agent, AgentSettings
from profiles import ProfileStore
from sim.memory import MemoryQueue, MemoryResults, MemoryStateTable
from tests.helpers.fake_node import HANG, ScriptedCrawl, pages_script, status
from tests.helpers.vclock import Actor, Crashed, VirtualClock

RUN = "2026-11-21"

#: What one attempt of a site does: a name -> a script for ScriptedCrawl.
ATTEMPT_SCRIPTS: dict[str, Callable[[], list]] = {
    "ok": lambda: pages_script(3, step=2.0),
    "slow": lambda: pages_script(6, step=25.0),  # each page under hang_after_s, the site well over it
    "hang": lambda: pages_script(1)[:3] + [HANG],
    "error": lambda: [(0.5, status("RUNNING")), (1.0, {"event": "error", "message": "HTTP 500 from x"})],
}

#: A site's behaviour: the attempt kinds in order (the last repeats).
BEHAVIOURS = {
    "ok": ["ok"],
    "slow": ["slow"],
    "hang-once": ["hang", "ok"],
    "hang-always": ["hang"],
    "error-once": ["error", "ok"],
    "error-always": ["error"],
}


def sim_config(sites: dict[str, str], **run: Any) -> Config:
    return Config.model_validate(
        {
            "run": {
                "max_attempts": 3,
                "hang_after_s": 30,
                "heartbeat_timeout_s": 20,
                "watch_interval_s": 10,
                "deadline_s": 7200,
                "enqueue_grace_s": 15,
                **run,
            },
            "fleet": {"max_nodes": 3, "idle_exit_s": 20, "boot_timeout_s": 60},
            "sites": [{"id": s, "start_url": f"https://{s}.test/"} for s in sites],
        }
    )


class CrashAt:
    """A table whose owner crashes (SIGKILL) at its n-th write: to stop a hub between any two of its writes."""

    WRITES = ("create_site", "write", "create_run", "update_run", "add_launched", "put_node", "add_history")

    def __init__(self, table: MemoryStateTable, clock: VirtualClock, after: int):
        self._t, self._clock, self.left = table, clock, after

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._t, name)
        if name not in self.WRITES:
            return attr

        def write(*a: Any, **kw: Any) -> Any:
            self.left -= 1
            if self.left < 0:
                raise Crashed("hub")
            return attr(*a, **kw)

        return write


class SimCloud:
    def __init__(
        self,
        tmp: Path,
        config: Config,
        behaviours: dict[str, str],
        *,
        boot_s: float = 5.0,
        node_clock_skew_s: float = 0.0,
        expected: dict[str, float] | None = None,
    ):
        self.tmp = tmp
        # Each hub's expected durations (a previous run's, site -> seconds): with them the hub meters its queue
        # (`run.feed`); without (None: the table holds no earlier run) it sends every first message at seeding.
        self.expected = expected
        self.config = config
        self.behaviours = behaviours
        self.clock = VirtualClock()
        self.table = MemoryStateTable()
        self.queue = MemoryQueue(clock=self.clock, max_receive_count=config.aws.max_receive_count)
        self.queue_for_nodes: Any = self.queue  # the queue as nodes reach it (a test may slow it down)
        self.results = MemoryResults()
        self.profiles = HostLocks(tmp / "efs")
        self.boot_s = boot_s
        self.node_clock = SkewedClock(self.clock, node_clock_skew_s)
        self.instances: dict[str, dict[str, Any]] = {}
        self.hubs: list[Actor] = []
        self.outcomes: list[RunOutcome] = []
        self.attempt_counter: dict[str, int] = {}
        self.concurrent: list[str] = []  # a site crawled by two live crawls at once (must stay empty)
        self.kills: list[tuple[str, str, int]] = []
        self.duplicate_sends = 0
        self.duds = 0  # how many of the next launched nodes never boot

    # --- the hub ------------------------------------------------------------------
    def start_hub(
        self,
        at: float | None = None,
        crash_after_writes: int | None = None,
        control: Any = None,
        provider: Any = None,
        table: Any = None,
    ) -> Actor:
        table = table or self.table
        if crash_after_writes is not None:
            table = CrashAt(table, self.clock, crash_after_writes)
        hub = Hub(
            run_id=RUN,
            config=self.config,
            table=table,
            queue=self.queue,
            results=self.results,
            provider=provider or SimProvider(self),
            control=control or SimControl(self),
            clock=self.clock,
            out_dir=self.tmp / "runs",
            hub_id=f"sim:hub{len(self.hubs)}",
            expected=self.expected,
        )

        def run() -> RunOutcome:
            out = hub.run()
            self.outcomes.append(out)
            return out

        actor = self.clock.spawn(f"hub{len(self.hubs)}", run, at=at)
        self.hubs.append(actor)
        return actor

    def crash_hub(self) -> None:
        self.clock.crash(self.hubs[-1])

    # --- nodes ----------------------------------------------------------------------------
    def launch_node(self) -> str:
        iid = f"i-sim{len(self.instances):03d}"
        if self.duds > 0:  # its bootstrap fails silently: no agent, no heartbeat, ever
            self.duds -= 1
            actor = self.clock.spawn(iid, lambda: self.clock.sleep(10**9))
            self.instances[iid] = {
                "actor": actor,
                "crawl": None,
                "interrupted": False,
                "spot": None,
                "partitioned": False,
                "dud": True,
            }
            return iid
        state = self.tmp / "nodes" / iid
        state.mkdir(parents=True)
        settings = dataclasses.replace(
            AgentSettings.from_config(self.config, RUN, iid, grid_url=""), receive_wait_s=5.0
        )
        agent = Agent(
            settings,
            table=self.table,
            queue=self.queue_for_nodes,
            results=self.results,
            profiles=self.profiles,
            start_crawl=lambda job, log: self._crawl(iid, job),
            cleanup=lambda *a: None,
            clock=self.node_clock,
            state_dir=state,
            spot_notice=lambda: self.instances[iid]["spot"],
        )
        actor = self.clock.spawn(iid, agent.run, at=self.clock.now() + self.boot_s)
        self.instances[iid] = {
            "actor": actor,
            "crawl": None,
            "interrupted": False,
            "spot": None,
            "partitioned": False,
            "dud": False,
        }
        return iid

    def _crawl(self, iid: str, job: dict) -> ScriptedCrawl:
        site, attempt = job["site"], job["attempt"]
        kinds = BEHAVIOURS[self.behaviours[site]]
        n = self.attempt_counter[site] = self.attempt_counter.get(site, 0) + 1  # crawls started, spot included
        crawl = ScriptedCrawl(self.clock, ATTEMPT_SCRIPTS[kinds[min(n, len(kinds)) - 1]]())
        crawl.site, crawl.attempt = site, attempt
        for other, inst in self.instances.items():
            c = inst["crawl"]
            if (
                other != iid
                and c is not None
                and c.site == site
                and not inst["actor"].done
                and not c.killed
                and c.closed_with is None
            ):
                self.concurrent.append(f"{site}: crawled on {iid} while {other} still crawls it")
        self.instances[iid]["crawl"] = crawl
        return crawl

    def partition(self, iid: str, seconds: float) -> None:
        """The node is cut off for `seconds`: it writes nothing, the hub cannot reach it, and EC2 reports it
        terminated, but it is still running and comes back afterwards (a zombie)."""
        inst = self.instances[iid]
        inst["partitioned"] = True
        self.clock.stall(inst["actor"], seconds)

    def kill_node(self, iid: str, spot: bool = False) -> None:
        """The instance is gone (reclaimed, crashed) without its agent saying a word."""
        inst = self.instances[iid]
        inst["interrupted"] = spot
        self.clock.crash(inst["actor"])

    def spot_notice(self, iid: str) -> None:
        self.instances[iid]["spot"] = {"action": "terminate"}

    def live(self) -> list[str]:
        return [i for i, inst in self.instances.items() if not inst["actor"].done and not inst.get("terminated")]

    def duplicate_messages(self) -> None:
        """From now on every message is delivered twice (SQS is at-least-once)."""
        send = self.queue.send

        def twice(run_id: str, site: str, attempt: int, given_back: int = 0) -> None:
            send(run_id, site, attempt, given_back)
            send(run_id, site, attempt, given_back)
            self.duplicate_sends += 1

        self.queue.send = twice  # type: ignore[method-assign]

    # --- running and checking ---------------------------------------------------------
    def finished(self) -> bool:
        run = self.table.get_run(RUN)
        return bool(run and run.finished and all(h.done for h in self.hubs))

    def run(self, until: float | None = None) -> None:
        self.clock.run(until=until if until is not None else self.clock.now() + 6 * 3600, stop=self.finished)
        for actor in self.clock.actors:
            if actor.error is not None:
                raise AssertionError(f"{actor.name} failed") from actor.error

    def check(self) -> CheckReport:
        report = check_run(
            RUN,
            table=self.table,
            queue=self.queue,
            results=self.results,
            provider=SimProvider(self),
            config=self.config,
        )
        self.clock.shutdown()
        return report

    def site(self, name: str):
        return self.table.get_site(RUN, name)


class SkewedClock:
    """A node's clock, off by `skew_s` from the hub's (epochs only: waiting is the same virtual time)."""

    def __init__(self, clock: VirtualClock, skew_s: float):
        self._c, self.skew_s = clock, skew_s

    def now(self) -> float:
        return self._c.now() + self.skew_s

    def monotonic(self) -> float:
        return self._c.monotonic()

    def sleep(self, seconds: float) -> None:
        self._c.sleep(seconds)

    def advance(self, seconds: float) -> None:
        self._c.sleep(seconds)


class SimProvider:
    def __init__(self, cloud: SimCloud):
        self.cloud = cloud

    def list(self, run_id: str) -> list[Instance]:
        return [
            Instance(
                iid,
                "terminated" if inst["actor"].done or inst.get("terminated") else "running",
                interrupted=inst["interrupted"],
            )
            for iid, inst in self.cloud.instances.items()
        ]

    def launch(self, run_id: str, count: int, target: int | None = None) -> LaunchResult:
        if target is not None:
            count = min(count, max(0, target - len(self.cloud.live())))
        return LaunchResult(tuple(self.cloud.launch_node() for _ in range(count)))

    def terminate(self, ids: Sequence[str]) -> None:
        for iid in ids:
            inst = self.cloud.instances.get(iid)
            if inst is None:
                continue
            inst["terminated"] = True
            if not inst["partitioned"]:  # a partitioned node does not hear it (yet)
                self.cloud.clock.crash(inst["actor"])

    def hub_alive(self, hub_id: str) -> bool:
        return False


class SimControl:
    """Kill the scripted crawl of a site and attempt on a node, as the local control signals its process group."""

    def __init__(self, cloud: SimCloud):
        self.cloud = cloud

    def kill(self, instance_id: str, site: str, attempt: int) -> KillResult:
        inst = self.cloud.instances.get(instance_id)
        if inst is None or inst["actor"].done or inst["partitioned"]:
            return KillResult(False, "local", "instance is not running or not reachable")
        crawl = inst["crawl"]
        if crawl is not None and (crawl.site, crawl.attempt) == (site, attempt) and not crawl.killed:
            crawl.kill()
            self.cloud.kills.append((instance_id, site, attempt))
            return KillResult(True, "local", "killed")
        return KillResult(True, "local", "no crawler of that attempt running")


def viewer_hub(cloud: SimCloud, out_dir: Path) -> Hub:
    """A hub over the cloud's run that only looks (`snapshot`): what a status view or a monitor reads from."""
    return Hub(
        run_id=RUN,
        config=cloud.config,
        table=cloud.table,
        queue=cloud.queue,
        results=cloud.results,
        provider=SimProvider(cloud),
        control=SimControl(cloud),
        clock=cloud.clock,
        out_dir=out_dir,
        hub_id="viewer",
    )


class HostLocks:
    """Profile locks as several hosts see them on one EFS: a lock held by another node makes `acquire`
    wait (in virtual time) up to its timeout, then ProfileBusy. One test process cannot hold fcntl locks
    for several hosts (they are per process), hence this stand-in; profiles.ProfileStore has its own tests."""

    def __init__(self, root: Path):
        self.store = ProfileStore(root)  # paths and Singleton* cleanup stay the real code's
        self.owner: dict[str, object] = {}

    def acquire(self, site: str, timeout_s: float, *, poll_s: float = 0.2, on_wait=None, monotonic=None, sleep=None):
        from profiles import ProfileBusy

        me = object()
        deadline = monotonic() + timeout_s
        while site in self.owner:
            if monotonic() >= deadline:
                raise ProfileBusy(site)
            if on_wait:
                on_wait()
            sleep(min(poll_s * 5, max(0.01, deadline - monotonic())))
        self.owner[site] = me
        held = self.store.acquire(site, 0)
        locks = self

        class Held:
            path, removed = held.path, held.removed

            def release(self) -> None:
                held.release()
                if locks.owner.get(site) is me:
                    del locks.owner[site]

        return Held()
