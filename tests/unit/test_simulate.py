"""The simulator: the real hub in virtual time, nodes on fleet.record.ops, a simulated cloud. Small runs, fast."""

import dataclasses
import json

import pytest

import hub.attention
import hub.loop
import hub.snapshot
from cli.main import main
from fleet.errors import UsageError
from fleet.protocol import StopWhy
from fleet.record import ops
from fleet.record.partition import RunInfo
from fleet.record.state import NodeState, Reason, RunStatus, SiteSpec
from hub.history import durations_from_file, previous_durations
from sim.memory import MemoryStateTable
from sim.model import SimParams
from sim.run import Sim, simulate

CALM = SimParams(sites=40, nodes=8, seed=3, hang_rate=0.0, spot_per_hour=0.0, capacity_error_rate=0.0)
FIGURES = (
    "makespan_s",
    "lower_bound_s",
    "ratio",
    "hang_lag_max_s",
    "hang_lag_p95_s",
    "utilization",
    "node_hours",
    "cost_usd",
    "api_calls_per_site",
    "tick_cpu_ms_p95",
    "tick_cpu_ms_max",
    "wall_s",
)


def test_the_simulator_runs_the_hubs_own_plan(monkeypatch):
    calls = []
    real = hub.loop.plan
    monkeypatch.setattr(hub.loop, "plan", lambda *a: calls.append(1) or real(*a))
    r = simulate(CALM)
    assert calls and len(calls) == r.ticks


def test_a_calm_run_completes_every_site_and_leaves_nothing_running():
    r = simulate(CALM)
    assert (r.completed, r.failed, r.left_running) == (40, 0, 0)
    assert r.makespan_s >= r.lower_bound_s and 0 < r.utilization <= 1
    assert r.attempts == {"completed": 40} and r.failures == {}  # no fault injected: none lost, spot or failed
    assert r.api_calls_per_site["total"] == pytest.approx(
        sum(v for k, v in r.api_calls_per_site.items() if k != "total"), abs=0.05
    )


def test_the_same_seed_is_the_same_run():
    a, b = simulate(dataclasses.replace(CALM, hang_rate=0.05)), simulate(dataclasses.replace(CALM, hang_rate=0.05))
    same = ("makespan_s", "attempts", "api_calls_per_site", "node_hours", "hang_lag_max_s", "completed")
    assert [getattr(a, k) for k in same] == [getattr(b, k) for k in same]


def test_hangs_end_on_time_with_node_watchdogs_and_a_poll_later_with_the_seed_policy():
    p = dataclasses.replace(CALM, sites=10, hang_rate=1.0)  # every attempt hangs: every site FAILED after 3
    ours, seed = simulate(p), simulate(dataclasses.replace(p, policy="seed"))
    assert ours.failed == seed.failed == 10 and ours.hangs == seed.hangs == 30
    assert ours.hang_lag_max_s == 0.0
    assert 0 < seed.hang_lag_max_s <= 2 * 30 + 1  # first seen up to a poll late, killed up to a poll later


def test_the_seed_policy_uses_one_node_per_site_and_ours_reuses_nodes():
    ours, seed = simulate(CALM), simulate(dataclasses.replace(CALM, policy="seed"))
    assert seed.instances_launched >= 40 and ours.instances_launched <= 8
    assert ours.makespan_s < seed.makespan_s and ours.node_hours < seed.node_hours


def test_longest_first_beats_first_in_first_out_on_spread_out_sites():
    p = dataclasses.replace(CALM, sites=60, nodes=6, sigma=1.2, drift=0.0)
    ours, fifo = simulate(p), simulate(dataclasses.replace(p, config=_config_order("config")))
    assert ours.ratio < fifo.ratio and ours.ratio < 1.1


@pytest.mark.slow
def test_a_metered_queue_ends_within_ten_percent_of_the_bound_under_faults_and_beats_sending_all_at_once():
    """1,000 sites on 50 nodes with the default fault rates (1% hangs, 0.05 spot reclaims per hour, 2% capacity
    errors): with every first message sent at seeding, a retry waits behind the fresh sites and ends the run."""
    p = SimParams(sites=1000, nodes=50, seed=7)
    ours, unmetered = simulate(p), simulate(dataclasses.replace(p, policy="unmetered"))
    assert ours.completed == unmetered.completed == 1000 and ours.left_running == 0
    assert ours.attempts.get("hang", 0) > 0 and ours.attempts.get("spot", 0) > 0  # faults were met
    assert ours.ratio <= 1.10 and ours.ratio < unmetered.ratio - 0.05
    assert ours.retry_wait_max_s < unmetered.retry_wait_max_s / 5
    assert ours.late_retried < unmetered.late_retried


def _config_order(order):
    from fleet.config import Config

    return Config.model_validate({"run": {"order": order}, "sites": [{"id": "x", "start_url": "https://x.test/"}]})


def test_history_files_summaries_and_plain_objects(tmp_path):
    summary = {
        "sites": {
            "a": {
                "attempts": [
                    {"start": 10, "end": 20, "outcome": "hang"},
                    {"start": 30, "end": 130, "outcome": "completed"},
                ]
            },
            "b": {"attempts": [{"start": 0, "end": 5, "outcome": "error"}]},
        }
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert durations_from_file(tmp_path / "summary.json") == {"a": 100.0}
    (tmp_path / "plain.json").write_text('{"x": 12, "y": 7.5}')
    assert durations_from_file(tmp_path / "plain.json") == {"x": 12.0, "y": 7.5}
    for body in ("[1, 2]", "{oops", '{"sites": {}}'):
        (tmp_path / "bad.json").write_text(body)
        with pytest.raises(UsageError, match="bad.json"):
            durations_from_file(tmp_path / "bad.json")


def test_a_history_drives_the_crawl_times(tmp_path):
    (tmp_path / "h.json").write_text(json.dumps({f"s{i}": 100.0 + i for i in range(12)}))
    r = simulate(dataclasses.replace(CALM, sites=12, history=durations_from_file(tmp_path / "h.json"), drift=0.0))
    assert r.completed == 12 and r.lower_bound_s >= 111.0


def test_the_hub_reads_expected_durations_from_the_previous_run():
    table = MemoryStateTable()
    table.create_run(RunInfo("day1", "FINISHED", 1000.0, 9000.0, "20270114"))
    for name, took in (("a", 50.0), ("b", 500.0)):
        rec = ops.new_site("day1", name, SiteSpec("https://x.test/"), None)
        table.create_site(rec)
        rec = ops.claim(table, rec, "i-1", 1000.0)
        ops.complete(table, rec, f"{name}/r.json", 1000.0 + took)
    rec = (
        ops.claim(table, ops.new_site("day1", "c", SiteSpec("https://x.test/"), None), "i-1", 1000.0)
        if table.create_site(ops.new_site("day1", "c", SiteSpec("https://x.test/"), None))
        else None
    )
    ops.fail_now(table, rec, Reason.DEADLINE, 1200.0)
    table.create_run(RunInfo("day2", "RUNNING", 90000.0, 99000.0, "20270115"))
    assert previous_durations(table, "day2") == {"a": 50.0, "b": 500.0}  # a failed site has no duration
    assert table.get_site("day1", "c").run_status is RunStatus.FAILED


def test_simulate_on_the_command_line(capsys):
    assert main(["simulate", "--sites", "20", "--nodes", "4", "--seed", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert all(k in out for k in FIGURES) and out["sites"] == 20 and "total" in out["api_calls_per_site"]
    assert main(["simulate", "--sites", "20", "--nodes", "4"]) == 0
    assert "makespan" in capsys.readouterr().out


def test_bad_simulate_input_is_one_message_and_exit_2(capsys, tmp_path):
    for argv in (["--sites", "0"], ["--nodes", "x"], ["--hang-rate", "2"], ["--history", str(tmp_path / "none")]):
        with pytest.raises(SystemExit) if argv[0] != "--history" else _returns(2):
            assert main(["simulate", *argv]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("error:") == 1


class _returns:
    def __init__(self, code):
        self.code = code

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_simulated_retry_resumes_after_its_last_checkpointed_page():
    import random

    from sim.workload import Workload

    w = Workload(SimParams(sites=1, nodes=1, seed=3, sigma=0, site_s=300, page_s=30, hang_rate=0), random.Random(3))
    (site,) = w.site_ids
    fresh = ops.new_site("r", site, SiteSpec("http://x.test/"), None)

    def pages(crawl):
        return [p[2] for t, kind, p in crawl.events if kind == "status" and p[0].value == "URL_CALL"]

    assert pages(w.attempt(None, fresh, 0.0))[0] == 0
    resumed = dataclasses.replace(fresh, checkpoint={"next": "p5", "pages": 4, "items": []})
    crawl = w.attempt(None, resumed, 0.0)
    assert pages(crawl)[0] == 4 and crawl.events[-1][1] == "result"
    assert [p for t, kind, p in crawl.events if kind == "checkpoint"][0] == 5


def test_a_simulated_node_the_hub_declared_lost_takes_no_more_work():
    """As the agent does: a fenced write showing that the hub ended this node's attempt as lost (its kill mark gone
    already, the attempt's outcome `lost`) stops the node; it takes no other site."""
    sim = Sim(
        SimParams(sites=2, nodes=1, seed=1, sigma=0, drift=0, hang_rate=0, spot_per_hour=0, capacity_error_rate=0)
    )
    table, now = sim.table, sim.clock.now()
    table.create_run(RunInfo(sim.run_id, "RUNNING", now, now + 86400, sim.run_date))
    for site in sim.workload.site_ids:
        rec = ops.new_site(sim.run_id, site, SiteSpec(f"https://{site}.example.test/"), None)
        table.create_site(rec)
        ops.send_next(table, sim.queue, rec)
    (iid,) = sim.cloud.launch(sim.run_id, 1).launched
    node = sim.cloud.instances[iid].node

    def hub_ends_the_attempt_as_lost():  # the node boots in about a minute and crawls a site for five
        (rec,) = [r for r in table.read_run(sim.run_id).sites if r.run_status is RunStatus.RUN]
        rec = ops.request_kill(table, rec, Reason.LOST, sim.clock.now())
        ops.end_attempt(table, rec, reason=Reason.LOST, now=sim.clock.now(), max_attempts=3, spot_cap=3)

    sim.engine.at(200.0, hub_ends_the_attempt_as_lost)
    sim.engine.run(until=3000.0)
    assert node.stop_after is not None and node.stop_after.why is StopWhy.LOST
    assert node.card.state is NodeState.EXITING and sim.cloud.instances[iid].state == "terminated"
    sites = table.read_run(sim.run_id).sites
    assert [a.outcome for r in sites for a in r.attempts] == ["lost"]  # one attempt, ended by the hub; no other
    assert sim.stats.outcomes == {"fenced": 1}


SAME_RUN = (
    "makespan_s",
    "attempts",
    "failures",
    "completed",
    "failed",
    "hangs",
    "hang_lag_max_s",
    "instances_launched",
    "api_calls_by_operation",
    "retry_wait_max_s",
)


def test_a_hub_that_looks_only_at_what_changed_or_fell_due_decides_as_one_that_looks_at_everything(monkeypatch):
    """`hub.attention` and `NodeMoves`: under hangs, spot reclaims and failures, the same seed gives the same run,
    call for call, whether the hub looks at the sites and nodes that changed or fell due, or at every watched site
    and every node each tick."""
    p = SimParams(sites=150, nodes=12, seed=4, hang_rate=0.1, spot_per_hour=1.0, failure_rates={"http_503": 0.05})
    looked = []
    sites = hub.attention.Attention.sites

    def counted(self, cache, *args):
        out = sites(self, cache, *args)
        looked.append((len(out), len(cache.watch)))
        return out

    monkeypatch.setattr(hub.attention.Attention, "sites", counted)
    some = simulate(p)
    monkeypatch.setattr(hub.attention.Attention, "sites", lambda self, *args: None)
    monkeypatch.setattr(hub.snapshot.NodeMoves, "since_last", lambda self, *args: None)  # every node, every tick
    every = simulate(p)
    assert some.attempts.get("hang") and some.attempts.get("spot") and some.failures.get("http_5xx 503")
    assert {k: getattr(some, k) for k in SAME_RUN} == {k: getattr(every, k) for k in SAME_RUN}
    assert all(n <= w for n, w in looked) and sum(n for n, _ in looked) < sum(w for _, w in looked)
    assert sum(1 for n, w in looked if w and n <= w / 2) >= 10  # ticks that looked at half the running sites or fewer


def test_a_hub_restarted_mid_run_takes_over_from_the_table_and_every_promise_holds():
    """A hub that dies mid-run is replaced by one that knows only the table and the cloud: the run ends, and
    `gridfleet check` finds every promise kept; with no fault injected, nothing is taken for lost."""
    from cli.commands.simulate import checked

    faults = SimParams(sites=200, nodes=15, seed=6, hang_rate=0.05, spot_per_hour=0.5, hub_restart_at=1500.0)
    r, report = checked(faults)
    assert r.hub_restarts == 1 and report.ok, report.violations
    assert r.completed + r.failed == 200 and r.left_running == 0 and r.attempts.get("spot")
    calm, report = checked(dataclasses.replace(CALM, hub_restart_at=900.0))
    assert calm.hub_restarts == 1 and report.ok and report.false_losses == 0, report.false_loss_details
    assert calm.completed == CALM.sites and not {"lost", "spot"} & set(calm.attempts)
    assert simulate(CALM).completed == calm.completed


def test_the_simulator_prices_every_request_against_the_fleet():
    r = simulate(CALM)
    assert r.requests_share == pytest.approx(r.requests_usd / r.cost_usd, rel=0.05) and 0 < r.requests_share < 0.03
    sqs = sum(v for k, v in r.api_calls_by_operation.items() if k.startswith("sqs:")) * r.sites
    assert r.requests_usd > sqs * 0.40 / 1e6  # SQS's requests are priced too
