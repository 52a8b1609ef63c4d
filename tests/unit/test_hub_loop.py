"""The hub's loop on fakes: a whole run, a restarted hub, an interrupted kill, an operator's teardown."""

from __future__ import annotations

import json

import pytest

from fleet.clock import FakeClock
from fleet.config import Config
from fleet.errors import MissingResource
from fleet.record import ops
from fleet.record.partition import RunInfo
from fleet.record.state import Reason, RunState, RunStatus, SiteStatus
from hub.control.base import KillResult
from hub.loop import Hub
from hub.plan import END_WAIT_S
from hub.providers.base import LaunchResult
from hub.snapshot import Instance
from hub.teardown import teardown_run
from sim.memory import MemoryQueue, MemoryResults, MemoryStateTable

RUN = "2026-11-21"


class FakeProvider:
    """Instances as data: what EC2 or the local registry would report."""

    def __init__(self):
        self.instances: dict[str, str] = {}
        self.launches = 0

    def list(self, run_id):
        return [Instance(i, state) for i, state in self.instances.items()]

    def launch(self, run_id, count, target=None):
        ids = []
        for _ in range(count):
            self.launches += 1
            ids.append(f"i-{self.launches}")
            self.instances[ids[-1]] = "running"
        return LaunchResult(tuple(ids))

    def terminate(self, ids):
        for i in ids:
            self.instances[i] = "terminated"

    def hub_alive(self, hub_id):
        return False


class FakeControl:
    def __init__(self, ok=True):
        self.ok = ok
        self.calls = []

    def kill(self, instance_id, site, attempt):
        self.calls.append((instance_id, site, attempt))
        return KillResult(self.ok, "local", "")


def config(**run):
    return Config.model_validate(
        {
            "run": {"hang_after_s": 10, "heartbeat_timeout_s": 30, "watch_interval_s": 5, "deadline_s": 600, **run},
            "fleet": {"max_nodes": 2, "node_watchdog": False},  # the hub's own kill path, at hang_after_s
            "sites": [{"id": f"s{i}", "start_url": f"http://x.test/{i}"} for i in range(3)],
        }
    )


class Rig:
    def __init__(self, tmp_path, cfg=None):
        self.clock = FakeClock()
        self.table, self.queue, self.results = MemoryStateTable(), MemoryQueue(clock=self.clock), MemoryResults()
        self.provider, self.control = FakeProvider(), FakeControl()
        self.cfg = cfg or config()
        self.out = tmp_path / "runs"

    def hub(self):
        return Hub(
            run_id=RUN,
            config=self.cfg,
            table=self.table,
            queue=self.queue,
            results=self.results,
            provider=self.provider,
            control=self.control,
            clock=self.clock,
            out_dir=self.out,
            hub_id="h",
        )

    def node_takes(self, node="i-1"):
        """What an agent does with the next message: claim, crawl, write the result, complete."""
        msg = self.queue.receive(0, 30)
        rec = self.table.get_site(RUN, msg.site)
        if ops.classify(rec, msg.attempt) is not ops.Verdict.CLAIM:
            self.queue.delete(msg)
            return None
        rec = ops.claim(self.table, rec, node, self.clock.now())
        return rec, msg

    def node_completes(self, rec, msg):
        key = f"{rec.site}/20261121/result.json"
        self.results.put_new(key, json.dumps({"site": rec.site}).encode())
        ops.complete(self.table, rec, key, self.clock.now())
        self.queue.delete(msg)


def test_a_whole_run_seeds_launches_finishes_and_writes_the_summary(tmp_path):
    rig = Rig(tmp_path)
    hub = rig.hub()
    hub.tick()
    assert rig.queue.sent == 3 and rig.provider.launches == 2
    for _ in range(3):
        rig.node_completes(*rig.node_takes())
    hub.tick()  # every site is done: the run's nodes are terminated ...
    assert hub.executor.finished is None and hub.ending is not None and hub.ending.why == "done"
    hub.tick()  # ... and seen gone, the queue holds nothing of the run: finished
    assert hub.executor.finished is not None
    out = hub._finish(hub.executor.finished)
    assert out.exit_code == 0 and out.left_running == 0
    summary = json.loads(out.summary_path.read_text())
    assert summary["nodes"] == {"launched": 2, "left_running": 0}
    assert set(summary["sites"]) == {"s0", "s1", "s2"}
    assert json.loads((rig.out / RUN / "results" / "s1.json").read_text()) == {"site": "s1"}
    assert all(state == "terminated" for state in rig.provider.instances.values())
    assert rig.table.get_run(RUN).finished


def test_a_restarted_hub_neither_reseeds_nor_overlaunches(tmp_path):
    rig = Rig(tmp_path)
    rig.hub().tick()
    taken = rig.node_takes()
    second = rig.hub()  # the first hub died; a new one reads the same table and provider
    second.tick()
    assert rig.queue.sent == 3 and rig.provider.launches == 2
    rig.node_completes(*taken)
    for _ in range(2):
        rig.node_completes(*rig.node_takes())
    second.tick()
    second.tick()  # the end: nodes terminated, then seen gone
    assert second._finish(second.executor.finished).exit_code == 0


def test_an_interrupted_kill_is_completed_by_the_next_hub(tmp_path):
    rig = Rig(tmp_path)
    rig.hub().tick()
    rec, msg = rig.node_takes()
    ops.request_kill(rig.table, rec, Reason.HANG, rig.clock.now())  # the first hub died right after this
    rig.hub().tick()
    assert rig.control.calls == [("i-1", rec.site, 1)]
    after = rig.table.get_site(RUN, rec.site)
    assert (after.run_status, after.attempt, after.enqueued) == (RunStatus.QUEUED, 1, True)
    assert after.attempts[0].kill_path == "local"
    assert rig.queue.sent == 4  # exactly one new message, for attempt 2


def test_an_unreachable_node_is_terminated_as_the_last_rung(tmp_path):
    rig = Rig(tmp_path, config(hang_after_s=10))
    rig.control.ok = False
    hub = rig.hub()
    hub.tick()
    rec, _ = rig.node_takes()
    rec = ops.report(rig.table, rec, SiteStatus.RUNNING, rig.clock.now())
    ops.report(rig.table, rec, SiteStatus.URL_CALL, rig.clock.now(), url="http://x.test/")
    hub.tick()
    rig.clock.advance(10)
    hub.tick()
    assert rig.provider.instances["i-1"] == "terminated"
    assert rig.table.get_site(RUN, rec.site).attempts[0].kill_path == "terminate"


def test_deadline_fails_what_is_open_and_terminates_everything(tmp_path):
    rig = Rig(tmp_path, config(deadline_s=60))
    hub = rig.hub()
    hub.tick()
    rig.node_completes(*rig.node_takes())
    rig.clock.advance(61)
    hub.tick()  # terminate, fail what is open ...
    hub.tick()  # ... then drain the run's messages and finish
    out = hub._finish(hub.executor.finished)
    summary = json.loads(out.summary_path.read_text())
    assert out.exit_code == 3
    assert sorted(s["failure_reason"] for s in summary["sites"].values() if s["run_status"] == "FAILED") == [
        "deadline",
        "deadline",
    ]
    assert all(state == "terminated" for state in rig.provider.instances.values())
    assert rig.queue.depth().visible == 0  # the failed sites' messages were drained


def test_teardown_from_outside_ends_the_run_and_the_hub_stands_down(tmp_path):
    rig = Rig(tmp_path)
    hub = rig.hub()
    hub.tick()
    rig.node_takes()
    result = teardown_run(RUN, rig.table, rig.provider, rig.clock)
    assert sorted(result.failed_sites) == ["s0", "s1", "s2"] and result.left_running == 0
    assert all(r.failure_reason == "killed" for r in rig.table.read_run(RUN).sites)
    hub.tick()
    assert hub.executor.finished.reason == "teardown"
    assert hub._finish(hub.executor.finished).exit_code == 3


def test_teardown_terminates_again_what_is_still_running_and_counts_what_never_goes(tmp_path):
    rig = Rig(tmp_path)
    rig.hub().tick()
    calls = []
    stubborn = {"i-2"}  # i-1 goes at the second call; i-2 never

    def terminate(ids):
        calls.append(sorted(ids))
        for i in ids:
            if i not in stubborn and len(calls) >= 2:
                rig.provider.instances[i] = "terminated"

    rig.provider.terminate = terminate
    t0 = rig.clock.now()
    result = teardown_run(RUN, rig.table, rig.provider, rig.clock)
    assert calls[0] == ["i-1", "i-2"] and calls[-1] == ["i-2"] and len(calls) > 2
    assert sorted(result.terminated) == ["i-1", "i-2"] and result.left_running == 1
    assert rig.clock.now() - t0 >= END_WAIT_S  # waited for them, then gave up
    assert rig.table.get_run(RUN).finished


def test_teardown_of_a_run_the_table_does_not_hold_is_refused(tmp_path):
    rig = Rig(tmp_path)
    with pytest.raises(MissingResource, match="no run"):
        teardown_run("nope", rig.table, rig.provider, rig.clock)


def test_a_failing_tick_is_retried_and_does_not_end_the_loop(tmp_path):
    rig = Rig(tmp_path)
    hub = rig.hub()
    calls = {"n": 0}
    real = rig.provider.list

    def flaky(run_id):  # the provider is read every tick
        calls["n"] += 1
        if calls["n"] <= 2:
            raise ConnectionError("EC2 unreachable")
        if calls["n"] == 4:  # once seeded, every site completes
            for _ in range(3):
                rig.node_completes(*rig.node_takes())
        return real(run_id)

    rig.provider.list = flaky
    out = hub.run()
    assert out.exit_code == 0 and calls["n"] >= 5


def test_too_many_failing_ticks_end_the_loop(tmp_path):
    rig = Rig(tmp_path)
    hub = rig.hub()
    hub.max_tick_failures = 3
    rig.table.read_run = lambda run_id: (_ for _ in ()).throw(ConnectionError("down"))
    with pytest.raises(ConnectionError):
        hub.run()


def test_nodes_that_die_at_boot_end_the_run_fast_instead_of_at_the_deadline(tmp_path):
    rig = Rig(tmp_path)
    launch = rig.provider.launch

    def dies(run_id, count, target=None):
        result = launch(run_id, count, target)
        for i in result.launched:
            rig.provider.instances[i] = "terminated"  # exits before its first heartbeat
        return result

    rig.provider.launch = dies
    out = rig.hub().run()
    summary = json.loads(out.summary_path.read_text())
    assert out.exit_code == 3 and summary["finish_reason"] == "no-nodes"
    assert {s["failure_reason"] for s in summary["sites"].values()} == {"no-nodes"}
    assert rig.provider.launches <= 4
    assert rig.clock.now() - summary["started_at"] < 60  # not the 600 s deadline


def test_a_launch_error_backs_off_and_ends_the_run_naming_it(tmp_path):
    rig = Rig(tmp_path)
    calls = []

    def refuses(run_id, count, target=None):
        calls.append(rig.clock.now())
        return LaunchResult((), ("spot t3.medium in subnet-1: UnauthorizedOperation: not allowed",))

    rig.provider.launch = refuses
    out = rig.hub().run()
    summary = json.loads(out.summary_path.read_text())
    assert out.exit_code == 3 and summary["finish_reason"] == "no-nodes"
    site = summary["sites"]["s0"]
    assert site["failure_reason"] == "no-nodes" and "UnauthorizedOperation" in site["error"]
    assert len(calls) == 5
    gaps = [b - a for a, b in zip(calls, calls[1:], strict=False)]
    assert all(g2 > g1 for g1, g2 in zip(gaps, gaps[1:], strict=False))  # each wait longer than the last


def test_a_reclaimed_spot_node_does_not_spend_the_sites_attempt(tmp_path):
    rig = Rig(tmp_path)
    hub = rig.hub()
    hub.tick()
    rec, _ = rig.node_takes()
    rig.provider.instances["i-1"] = "terminated"
    rig.provider.list = lambda run_id: [
        Instance(i, st, interrupted=(i == "i-1")) for i, st in rig.provider.instances.items()
    ]
    hub.tick()
    after = rig.table.get_site(RUN, rec.site)
    assert (after.run_status, after.attempt, after.spot_requeues) == (RunStatus.QUEUED, 0, 1)
    assert after.attempts[0].outcome == "spot"


def test_resume_is_refused_only_for_another_live_hub():
    from cli.commands.run import check_existing
    from fleet.errors import UsageError

    run = RunInfo(RUN, RunState.RUNNING, 0.0, 1e12, "20261121", hub_id="ec2:i-hub")
    with pytest.raises(UsageError, match="held by a hub"):
        check_existing(run, RUN, True, lambda hid: True, me="ec2:i-other")
    check_existing(run, RUN, True, lambda hid: True, me="ec2:i-hub")  # the same instance, booted again
    check_existing(run, RUN, True, lambda hid: False, me="ec2:i-other")  # the old hub is gone
    check_existing(None, RUN, True, lambda hid: True, me="x")  # --resume starts a run that does not exist
    with pytest.raises(UsageError, match="already exists"):
        check_existing(run, RUN, False, lambda hid: False, me="x")


def incremental_config(**extra):
    return Config.model_validate(
        {
            "run": {"hang_after_s": 10, "heartbeat_timeout_s": 30, "watch_interval_s": 5, "deadline_s": 600},
            "fleet": {"max_nodes": 2},
            "rate_limits": {"shop-api": {"per_s": 6}},
            "sites": [
                {"id": "s0", "start_url": "http://x.test/0", "incremental": True, "rate_limit": "shop-api"},
                {"id": "s1", "start_url": "http://x.test/1", "incremental": True},
                {"id": "s2", "start_url": "http://x.test/2"},
            ],
            **extra,
        }
    )


@pytest.mark.parametrize("full", [False, True])
def test_incremental_sites_are_seeded_with_their_marks_unless_the_run_is_full(tmp_path, full):
    rig = Rig(tmp_path, incremental_config())
    rig.table.put_mark("s0", ("a", "b"), "yesterday", 1.0)
    rig.table.put_mark("s2", ("z",), "long-ago", 1.0)  # not incremental (any more): not given
    hub = Hub(
        run_id=RUN,
        config=rig.cfg,
        table=rig.table,
        queue=rig.queue,
        results=rig.results,
        provider=rig.provider,
        control=rig.control,
        clock=rig.clock,
        out_dir=rig.out,
        hub_id="h",
        full=full,
    )
    hub.tick()
    recs = {s: rig.table.get_site(RUN, s) for s in ("s0", "s1", "s2")}
    assert recs["s0"].spec.incremental and recs["s0"].spec.rate_limit == "shop-api" and recs["s0"].spec.per_s == 6
    assert recs["s0"].mark == (None if full else ("a", "b"))
    assert recs["s1"].mark is None and recs["s2"].mark is None and not recs["s2"].spec.incremental
    assert rig.table.get_run(RUN).full is full
