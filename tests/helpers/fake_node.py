"""A scripted crawler process for agent tests, on a FakeClock, and the rig that runs an agent on it.

It stands in for the real crawler process only where time must be injected:
`next_event` advances the fake clock instead of waiting, so a hang of any
length costs no wall time. The real process and pipe are covered by the
adapter tests in tests/adapter/test_agent_processes.py. `Rig` is one agent on
the in-memory table, queue and result store, with such scripted crawls.
"""

from __future__ import annotations

import time
from typing import Any

from fleet.clock import FakeClock
from fleet.outputs.results import LOCAL_ROLE
from fleet.record import ops
from fleet.record.partition import RunInfo
from fleet.record.state import SiteSpec, SiteStatus
from hub.promote import promote
from node.agent import Agent, AgentSettings
from node.runner import Exited
from profiles import ProfileStore
from sim.memory import MemoryQueue, MemoryResults, MemoryStateTable

RUN = "2026-11-21"

HANG = object()  # script entry: no more events until killed


class ScriptedCrawl:
    def __init__(self, clock: FakeClock, script: list, pid: int = 424242):
        self.clock = clock
        self.pid = pid
        self.started = clock.monotonic()
        self.script = list(script)  # (seconds after start, event dict) or HANG
        self.killed = False
        self.closed_with: float | None = None

    def next_event(self, timeout_s: float) -> dict[str, Any] | Exited | None:
        if self.killed:
            return Exited(-9)
        if not self.script:
            return Exited(0)
        head = self.script[0]
        if head is HANG:
            self.clock.advance(timeout_s)
            return None
        at, ev = head
        due = self.started + at
        if due <= self.clock.monotonic() + timeout_s:
            self.clock.advance(max(0.0, due - self.clock.monotonic()))
            self.script.pop(0)
            return ev
        self.clock.advance(timeout_s)
        return None

    def kill(self) -> None:
        self.killed = True

    def close(self, grace_s: float = 0) -> None:
        self.closed_with = grace_s
        self.killed = True


def status(s: str, url: str | None = None, pages: int = 0) -> dict[str, Any]:
    return {"event": "status", "site_status": s, "url": url, "pages": pages}


def pages_script(n: int, step: float = 1.0) -> list:
    """A healthy crawl of n pages, `step` seconds per page."""
    out: list = [(0.5, {"event": "session", "id": "sess-1"}), (0.6, status("RUNNING"))]
    t = 0.6
    for p in range(1, n + 1):
        out.append((t + 0.01, status("URL_CALL", f"http://x.test/?page={p}", p - 1)))
        t += step
        out.append((t, status("CALL_DONE", f"http://x.test/?page={p}", p)))
    out.append((t + 0.1, {"event": "result", "items": [{"id": f"i{p}"} for p in range(n)], "pages": n}))
    return out


def promoted(table, results, queue, run_id: str, site: str, run_date: str = "20261121", role: str = LOCAL_ROLE):
    """The site's record once the hub has looked: a result its node staged (SAVED) made the site's result
    (`hub.promote`, what the hub's next tick does); the record as it is otherwise."""
    rec = table.get_site(run_id, site)
    if rec is not None and rec.site_status is SiteStatus.SAVED:
        promote(table, results, queue, rec, run_date, role, time.time())
        rec = table.get_site(run_id, site)
    return rec


class Rig:
    def __init__(self, tmp_path, scripts, **settings):
        self.clock = FakeClock()
        self.table = MemoryStateTable()
        self.queue = MemoryQueue(clock=self.clock)
        self.results = MemoryResults()
        self.scripts = list(scripts)
        self.crawls: list[ScriptedCrawl] = []
        self.cleanups: list[tuple] = []
        self.table.create_run(RunInfo(RUN, "RUNNING", self.clock.now(), self.clock.now() + 3600, "20261121"))
        defaults = dict(
            run_id=RUN,
            instance_id="i-1",
            hang_after_s=10,
            heartbeat_interval_s=5,
            visibility_s=30,
            idle_exit_s=3,
            receive_wait_s=1,
            max_attempts=3,
            lock_timeout_s=0,
        )
        defaults.update(settings)
        self.agent = Agent(
            AgentSettings(**defaults),
            table=self.table,
            queue=self.queue,
            results=self.results,
            profiles=ProfileStore(tmp_path / "efs"),
            start_crawl=self._start,
            cleanup=lambda p, s, forced: self.cleanups.append((p.name, s, forced)),
            clock=self.clock,
            state_dir=tmp_path / "state",
        )
        (tmp_path / "state").mkdir()

    def _start(self, job, log_path):
        crawl = ScriptedCrawl(self.clock, self.scripts.pop(0))
        crawl.job = job
        self.crawls.append(crawl)
        return crawl

    def seed(self, site="s1"):
        rec = ops.new_site(RUN, site, SiteSpec("http://x.test/"), None)
        self.table.create_site(rec)
        ops.send_next(self.table, self.queue, rec)

    def site(self, site="s1"):
        """The site's record once the hub has looked: a result its node staged (SAVED) is made the site's result
        (`hub.promote`), as the hub's next tick does."""
        return promoted(self.table, self.results, self.queue, RUN, site)


class Spy:
    """Records the calls made through it (name, args), then makes them on the real fake."""

    def __init__(self, inner):
        self._inner, self.calls = inner, []

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.calls.append((name, args))
            return attr(*args, **kwargs)

        return call

    def named(self, name):
        return [args for n, args in self.calls if n == name]


def spied(rig):
    rig.agent.table = rig.table_spy = Spy(rig.table)
    rig.agent.queue = rig.queue_spy = Spy(rig.queue)
    return rig
