"""plan(): the hub's decisions from a snapshot and the hub's own clock. No I/O, time passed in."""

import dataclasses

from fleet.config import Config
from fleet.record.messages import QueueDepth
from fleet.record.partition import NodeInfo, RunInfo
from fleet.record.state import Reason, RunState, RunStatus, SiteRecord, SiteSpec, SiteStatus
from hub.actions import (
    EndAttempt,
    Enqueue,
    FailSites,
    Finish,
    KillAttempt,
    KillLadder,
    Launch,
    SeedSites,
    StartRun,
    Terminate,
)
from hub.plan import BACKUP_GRACE_S, plan, run_date_for
from hub.snapshot import Instance, Observations, Snapshot, observe

T0 = 1_800_000_000.0


def config(n_sites=3, node_watchdog=False, **run):
    base = {
        "hang_after_s": 10,
        "heartbeat_timeout_s": 30,
        "watch_interval_s": 30,
        "deadline_s": 3600,
        "enqueue_grace_s": 15,
    }
    base.update(run)
    return Config.model_validate(
        {
            "run": base,
            "fleet": {"max_nodes": 2, "boot_timeout_s": 60, "node_watchdog": node_watchdog},
            "sites": [{"id": f"s{i}", "start_url": f"http://x.test/{i}"} for i in range(n_sites)],
        }
    )


def site(name, **kw):
    return dataclasses.replace(SiteRecord("r1", name, SiteSpec("http://x.test/"), enqueued=True), **kw)


def running(name, node="i-1", **kw):
    fields = {"site_status": SiteStatus.RUNNING, "last_update": 5.0, "heartbeat": 5.0, **kw}
    return site(name, run_status=RunStatus.RUN, attempt=1, instance_id=node, **fields)


RUN = RunInfo("r1", RunState.RUNNING, T0, T0 + 3600, "20261121")


class World:
    """Snapshots over time, observed the way the hub observes them; the plan's `ending` is carried to the next
    snapshot as the hub carries it, and the queue is empty."""

    def __init__(self, cfg, sites, instances=("i-1",), nodes=None, run=RUN, expected=None):
        self.cfg, self.run, self.expected = cfg, run, expected or {}
        self.sites = {s.site: s for s in sites}
        self.instances = {i: Instance(i, "running") for i in instances}
        self.nodes = nodes if nodes is not None else {i: NodeInfo("r1", i, "busy", 1.0, 0.0) for i in instances}
        self.obs = Observations()
        self.ending = None
        self.queue = QueueDepth(0, 0, 0)

    def plan(self, now):
        self.obs = observe(self.obs, self.sites, self.nodes, self.instances, now)
        p = plan(
            Snapshot(
                "r1",
                self.run,
                self.sites,
                self.nodes,
                self.instances,
                self.obs,
                queue=self.queue,
                expected=self.expected,
                ending=self.ending,
            ),
            now,
            self.cfg,
        )
        self.ending = p.ending
        return p

    def settle(self, p):
        """What the executor's Terminate and FailSites do to the world."""
        for a in p.actions:
            if isinstance(a, Terminate):
                self.instances.update({i: Instance(i, "terminated") for i in a.instance_ids})
            elif isinstance(a, FailSites):
                self.sites.update(
                    {
                        n: dataclasses.replace(
                            self.sites[n],
                            run_status=RunStatus.FAILED,
                            site_status=SiteStatus.FAILED,
                            failure_reason=str(a.reason),
                        )
                        for n in a.sites
                    }
                )


def kinds(p):
    return [type(a).__name__ for a in p.actions]


def test_a_new_run_starts_seeds_and_launches():
    cfg = config()
    p = plan(Snapshot("2026-11-21", None, {}, {}, {}, Observations()), T0, cfg)
    assert isinstance(p.actions[0], StartRun) and p.actions[0].run_date == "20261121"
    seed = [a for a in p.actions if isinstance(a, SeedSites)][0]
    assert [name for name, _ in seed.sites] == ["s0", "s1", "s2"]
    assert Launch(2, target=2) in p.actions  # min(max_nodes=2, 3 open sites)


def test_hang_is_detected_on_the_hubs_clock_from_when_it_saw_the_value():
    cfg = config(1)
    # The node's epoch says the page started long ago (clock skew); only the hub's observation counts.
    w = World(cfg, [running("s0", site_status=SiteStatus.URL_CALL, last_update=T0 - 10_000)])
    p = w.plan(T0)
    assert not any(isinstance(a, KillAttempt) for a in p.actions)
    assert p.wake_at == T0 + 10  # sleeps exactly until the hang could be declared
    assert not any(isinstance(a, KillAttempt) for a in w.plan(T0 + 9.9).actions)
    assert KillAttempt("s0", "i-1", 1, Reason.HANG) in w.plan(T0 + 10).actions


def test_with_node_watchdogs_the_hub_is_the_backup_a_little_later():
    w = World(config(1, node_watchdog=True), [running("s0", site_status=SiteStatus.URL_CALL)])
    # The node ends its own hang on time; the hub checks at its next tick rather than waking for it.
    assert w.plan(T0).wake_at == T0 + 30
    assert not any(isinstance(a, KillAttempt) for a in w.plan(T0 + 10).actions)
    assert KillAttempt("s0", "i-1", 1, Reason.HANG) in w.plan(T0 + 10 + BACKUP_GRACE_S).actions


def test_slow_but_alive_is_never_a_hang():
    w = World(config(1), [running("s0", site_status=SiteStatus.URL_CALL, last_update=1.0)])
    for k in range(1, 20):  # every 8 s the crawler moves on: no kill however long the site takes
        w.sites["s0"] = dataclasses.replace(w.sites["s0"], last_update=1.0 + k, heartbeat=1.0 + k)
        assert not any(isinstance(a, KillAttempt) for a in w.plan(T0 + 8 * k).actions)


def test_hang_only_in_url_call():
    w = World(config(1), [running("s0", site_status=SiteStatus.CALL_DONE)])
    w.plan(T0)
    w.sites["s0"] = dataclasses.replace(w.sites["s0"], heartbeat=6.0)
    assert not any(isinstance(a, KillAttempt) for a in w.plan(T0 + 25).actions)


def test_lost_when_the_heartbeat_stops():
    w = World(config(1), [running("s0")])
    w.plan(T0)
    assert KillAttempt("s0", "i-1", 1, Reason.LOST, KillLadder.TERMINATE) in w.plan(T0 + 30).actions


def test_lost_at_once_when_the_instance_is_gone():
    w = World(config(1), [running("s0", node="i-9")])
    assert EndAttempt("s0", 1, Reason.LOST) in w.plan(T0).actions


def test_an_interrupted_kill_is_finished_by_the_next_hub():
    w = World(config(1), [running("s0", kill_reason="hang")])
    assert KillAttempt("s0", "i-1", 1, Reason.HANG) in w.plan(T0).actions


def test_a_queued_site_without_its_message_gets_one_after_the_grace():
    w = World(config(1), [site("s0", enqueued=False, version=3)])
    p = w.plan(T0)
    assert not any(isinstance(a, Enqueue) for a in p.actions) and p.wake_at == T0 + 15
    assert Enqueue("s0", 3) in w.plan(T0 + 15).actions


def test_deadline_fails_open_sites_terminates_and_finishes():
    run = dataclasses.replace(RUN, deadline_at=T0 + 5)
    done = site("s2", run_status=RunStatus.COMPLETED, site_status=SiteStatus.COMPLETED)
    w = World(config(3), [running("s0"), site("s1"), done], run=run)
    p = w.plan(T0 + 5)
    assert p.actions == (Terminate(("i-1",), "deadline"), FailSites(("s0", "s1"), Reason.DEADLINE))
    w.settle(p)
    assert w.plan(T0 + 6).actions == (Finish("deadline"),)  # the next tick: nothing live, nothing open


def test_finish_when_every_site_is_terminal():
    sites = [site(f"s{i}", run_status=RunStatus.FAILED, site_status=SiteStatus.FAILED) for i in range(3)]
    w = World(config(3), sites)
    p = w.plan(T0)
    assert p.actions == (Terminate(("i-1",), "finish"),)
    w.settle(p)
    assert Finish("done") in w.plan(T0 + 1).actions


def test_fleet_is_sized_by_open_sites_and_the_launch_budget():
    sites = [
        site("s0"),
        site("s1", run_status=RunStatus.COMPLETED, site_status=SiteStatus.COMPLETED),
        site("s2", run_status=RunStatus.COMPLETED, site_status=SiteStatus.COMPLETED),
    ]
    w = World(config(3), sites, instances=())
    assert Launch(1, target=1) in w.plan(T0).actions
    spent = dataclasses.replace(RUN, nodes_launched=config(3).launch_budget)
    assert not any(isinstance(a, Launch) for a in World(config(3), sites, instances=(), run=spent).plan(T0).actions)


def test_a_node_that_never_heartbeats_is_terminated_after_boot_timeout():
    w = World(config(1), [site("s0")], instances=("i-1",), nodes={})
    w.plan(T0)
    assert Terminate(("i-1",), "boot-timeout") in w.plan(T0 + 60).actions


def test_a_busy_node_is_not_terminated_for_a_stale_node_item():
    w = World(config(1), [running("s0")])
    w.plan(T0)
    w.sites["s0"] = dataclasses.replace(w.sites["s0"], heartbeat=9.0)
    assert not any(isinstance(a, Terminate) for a in w.plan(T0 + 45).actions)


def test_run_date():
    assert run_date_for("2026-11-21", T0) == "20261121"
    assert run_date_for("20261121-rerun", T0) == "20261121"
    assert run_date_for("demo", 0) == "19700101"


def test_a_run_whose_nodes_cannot_start_gives_up_at_once_with_a_reason():
    w = World(config(2), [site("s0"), site("s1")], instances=(), nodes={})
    w.instances = {f"i-{k}": Instance(f"i-{k}", "terminated") for k in range(3)}
    p = w.plan(T0)
    fail = [a for a in p.actions if isinstance(a, FailSites)][0]
    assert fail.sites == ("s0", "s1") and fail.reason is Reason.NO_NODES and "i-0" in fail.error
    w.settle(p)
    assert w.plan(T0 + 1).actions[-1] == Finish("no-nodes")


def test_nodes_that_booted_once_are_not_a_reason_to_give_up():
    booted = {"i-0": NodeInfo("r1", "i-0", "exiting", 1.0, 0.0)}
    w = World(config(1), [site("s0")], instances=(), nodes=booted)
    w.instances = {f"i-{k}": Instance(f"i-{k}", "terminated") for k in range(5)}
    assert not any(isinstance(a, (FailSites, Finish)) for a in w.plan(T0).actions)


def test_spot_instances_reclaimed_while_booting_are_not_a_reason_to_give_up():
    w = World(config(2), [site("s0"), site("s1")], instances=(), nodes={})
    w.instances = {f"i-{k}": Instance(f"i-{k}", "terminated", interrupted=True) for k in range(5)}
    w.instances["i-9"] = Instance("i-9", "pending")
    assert not any(isinstance(a, (FailSites, Finish)) for a in w.plan(T0).actions)
    w.instances.update({f"i-{k}": Instance(f"i-{k}", "terminated") for k in range(5, 8)})  # three that simply died
    assert any(isinstance(a, FailSites) for a in w.plan(T0 + 1).actions)


def test_a_node_that_reports_a_failed_boot_is_terminated_and_its_reason_surfaces():
    failed = {"i-1": NodeInfo("r1", "i-1", "boot-failed", 1.0, 0.0, error="mount of fs-1 timed out")}
    w = World(config(1), [site("s0")], instances=("i-1",), nodes=failed)
    assert Terminate(("i-1",), "boot-failed") in w.plan(T0).actions
    w.instances = {f"i-{k}": Instance(f"i-{k}", "terminated") for k in range(1, 4)}
    fail = [a for a in w.plan(T0).actions if isinstance(a, FailSites)][0]
    assert "mount of fs-1 timed out" in fail.error


def test_a_launch_that_started_nothing_is_not_retried_before_its_backoff():
    run = dataclasses.replace(RUN, launch_failures=2, launch_error="x", launch_retry_at=T0 + 4)
    w = World(config(1), [site("s0")], instances=(), nodes={}, run=run)
    p = w.plan(T0)
    assert not any(isinstance(a, Launch) for a in p.actions) and p.wake_at == T0 + 4
    assert any(isinstance(a, Launch) for a in w.plan(T0 + 4).actions)


def test_launches_that_never_start_a_node_end_the_run_with_the_error():
    run = dataclasses.replace(
        RUN, launch_failures=5, launch_error="spot t3.medium: UnauthorizedOperation", launch_retry_at=T0 - 1
    )
    w = World(config(1), [site("s0")], instances=(), nodes={}, run=run)
    p = w.plan(T0)
    fail = [a for a in p.actions if isinstance(a, FailSites)][0]
    assert fail.reason is Reason.NO_NODES and "UnauthorizedOperation" in fail.error
    w.settle(p)
    assert w.plan(T0 + 1).actions[-1] == Finish("no-nodes")


def test_a_site_whose_spot_node_was_reclaimed_is_requeued_as_spot_not_lost():
    w = World(config(1), [running("s0")])
    w.instances = {"i-1": Instance("i-1", "terminated", interrupted=True)}
    assert EndAttempt("s0", 1, Reason.SPOT) in w.plan(T0).actions


def test_seeding_puts_the_longest_expected_crawls_first_and_unknown_sites_in_the_middle():
    w = World(config(4), [], instances=(), expected={"s0": 10.0, "s1": 900.0, "s3": 60.0})
    seed = [a for a in w.plan(T0).actions if isinstance(a, SeedSites)][0]
    assert [name for name, _ in seed.sites] == ["s1", "s2", "s3", "s0"]  # s2: no history, the median (60 s)


def test_seeding_keeps_the_config_order_when_asked_or_without_history():
    cfg = config(3, order="config")
    w = World(cfg, [], instances=(), expected={"s2": 900.0})
    assert [n for n, _ in [a for a in w.plan(T0).actions if isinstance(a, SeedSites)][0].sites] == ["s0", "s1", "s2"]
    w = World(config(3), [], instances=())
    assert [n for n, _ in [a for a in w.plan(T0).actions if isinstance(a, SeedSites)][0].sites] == ["s0", "s1", "s2"]


def test_heartbeats_do_not_wake_the_hub_they_are_checked_each_tick():
    w = World(config(1), [running("s0", site_status=SiteStatus.CALL_DONE)])
    assert w.plan(T0).wake_at == T0 + 30  # the watch interval, not the heartbeat's expiry at T0 + 30 ...
    # ... which the next tick sees
    assert KillAttempt("s0", "i-1", 1, Reason.LOST, KillLadder.TERMINATE) in w.plan(T0 + 31).actions


def test_a_node_that_holds_an_attempt_is_never_scaled_in_as_booting():
    # i-2's node item, read before the sites, showed no sign yet, nor has its claim beaten; the sites show it holding
    # s0. Two live nodes for one open site: the surplus is the other, booting, node, never the one holding the attempt.
    w = World(config(1), [running("s0", node="i-2", heartbeat=None)], instances=("i-1", "i-2"), nodes={})
    terminated = [a for a in w.plan(T0).actions if isinstance(a, Terminate)]
    assert terminated == [Terminate(("i-1",), "scale-in")]


def test_the_fleet_is_kept_at_min_nodes_while_sites_remain():
    cfg = Config.model_validate(
        {"fleet": {"max_nodes": 5, "min_nodes": 3}, "sites": [{"id": "s0", "start_url": "http://x.test/"}]}
    )
    w = World(cfg, [site("s0")], instances=())
    assert Launch(3, target=3) in w.plan(T0).actions


def test_nodes_still_booting_beyond_the_open_sites_are_terminated():
    # Two queued sites, four live nodes: two booted and idle, two never heartbeat yet -> one booting node goes.
    nodes = {"i-1": NodeInfo("r1", "i-1", "idle", 1.0, 0.0), "i-2": NodeInfo("r1", "i-2", "idle", 1.0, 0.0)}
    w = World(config(2), [site("s0"), site("s1")], instances=("i-1", "i-2", "i-3", "i-4"), nodes=nodes)
    p = w.plan(T0)
    assert Terminate(("i-3", "i-4"), "scale-in") in p.actions
    assert not any(isinstance(a, Launch) for a in p.actions)
