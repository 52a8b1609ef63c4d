"""A week of daily runs on the EC2 twin: seven runs started by the starter's schedule, the watchdog on its own.

The sites are the demo server's JSON API (the `api` crawler: no browser, so each day is short). The operator
changes the config as one does between days: day 3 adds a site that fails, day 4 fixes it, so the reports'
comparisons with the day before have something to show; day 5 makes one site slow, and its hub instance is
terminated while that site is crawled (the fault injected, as EC2 would lose it): the watchdog sees its
heartbeat stop and starts another hub, which resumes and finishes the run. After each day: its summary and
report in the bucket, nothing of the stack running or stopped, and one hub (two on day 5, never two at
once). The week's hubs boot the node image baked for the stack (its hub template switched to it, as
`hub_ami_parameter` does); the day's hub booted the stock one. Root only (see conftest)."""

from __future__ import annotations

import re

import pytest

from twin.day import TwinDay, wait_until

SITES = {"news": "/api/news?pages=2", "shop": "/api/shop?pages=3"}
#: The week is bounded by its days' own waits (each named, each with its time); the suite's 300 s per test is
#: for a test, not for seven days, which take five minutes on an idle machine and more on a busy one.
pytestmark = pytest.mark.timeout(2700)
FLAKY_DOWN = "/api/flaky?pages=1&fail_attempts=99"
FLAKY_UP = "/api/flaky?pages=1"
SLOW_SHOP = "/api/shop?pages=3&delay_s=3"  # day 5: the hub is lost while this site is being crawled
KILL_DAY = 5


def kill_the_hub_mid_run(day: TwinDay, run_id: str, hubs_before: int) -> str:
    """Terminate the day's hub while the slow site is crawled; returns its id. Then move the twin's clock to
    the watchdog's passes (two: one that sees the heartbeat, one `hub_stale_s` later that sees it unchanged)
    until one restarts the hub."""
    hub = wait_until(lambda: [b.instance_id for b in day.twin.boots if b.role == "hub"][hubs_before:], 120, "a hub")[0]
    wait_until(lambda: day.node_of("shop", run_id, "RUN"), 180, "the slow site claimed")
    day.twin.client("ec2").terminate_instances(InstanceIds=[hub])
    wait_until(lambda: hub not in day.twin.ec2twin.running, 30, "the hub's processes ended")
    day.restart_by_watchdog()
    return hub


#: One node a day: the API sites take a second each.
WEEK = {
    "fleet": {"max_nodes": 1, "min_nodes": 1, "idle_exit_s": 10},
    "run": {"max_attempts": 2, "retry": {"http_5xx": {"backoff_s": 1}}},
}


@pytest.fixture(scope="module")
def week(twin_stack):
    d = twin_stack
    d.ensure_deployed()
    stock = d.twin.client("ec2").describe_launch_templates(LaunchTemplateNames=[d.config["aws"]["hub_launch_template"]])
    d.launch_from("hub", d.node_image_id())  # the week's hubs boot the baked node image (the day's, the stock one)
    d.before_week = d.run_ids[-1] if d.run_ids else None  # the day's run, when it ran before on this stack
    days = []
    for n in range(1, 8):
        sites = {**SITES, "flaky": FLAKY_DOWN} if n == 3 else {**SITES, "flaky": FLAKY_UP} if n >= 4 else SITES
        d.put_config({**sites, "shop": SLOW_SHOP} if n == KILL_DAY else sites, **WEEK)
        hubs_before = len([b for b in d.twin.boots if b.role == "hub"])
        run_id = d.start_by_schedule()
        killed = kill_the_hub_mid_run(d, run_id, hubs_before) if n == KILL_DAY else None
        wait_until(lambda r=run_id: d.stack_idle() and d.summary(r), 480, f"day {n} archived and the stack idle",
                   explain=d.processes)  # fmt: skip
        hubs = [b for b in d.twin.boots if b.role == "hub"][hubs_before:]
        days.append({"run_id": run_id, "summary": d.summary(run_id), "hubs": hubs, "killed": killed,
                     "states": d.instance_states(), "report": d.report(run_id)})  # fmt: skip
    d.days = days
    yield d
    [template] = stock["LaunchTemplates"]
    ec2 = d.twin.client("ec2")
    ec2.modify_launch_template(LaunchTemplateName=template["LaunchTemplateName"],
                               DefaultVersion=str(template["DefaultVersionNumber"]))  # fmt: skip


def test_seven_daily_runs_each_archived(week):
    run_ids = [day["run_id"] for day in week.days]
    assert len(set(run_ids)) == 7 and run_ids == sorted(run_ids), run_ids
    for day in week.days:
        assert day["summary"]["run_id"] == day["run_id"] and day["report"], day["run_id"]
        sites = day["summary"]["sites"]
        assert all(sites[s]["run_status"] == "COMPLETED" for s in SITES), (day["run_id"], sites)
        outcomes = [a["outcome"] for s in sites.values() for a in s["attempts"]]
        assert "lost" not in outcomes and "spot" not in outcomes, (day["run_id"], outcomes)


def test_nothing_of_the_stack_is_left_running_or_stopped_after_each_day(week):
    for day in week.days:
        assert set(day["states"].values()) == {"terminated"}, (day["run_id"], day["states"])


def test_one_hub_a_day_and_the_watchdog_replaced_the_lost_one(week):
    for n, day in enumerate(week.days, 1):
        assert len(day["hubs"]) == (2 if n == KILL_DAY else 1), (n, day["hubs"])
    lost, replacement = week.days[KILL_DAY - 1]["hubs"]
    assert lost.instance_id == week.days[KILL_DAY - 1]["killed"]
    restarts = [f for f in week.twin.fired if f.rule.endswith("-watchdog") and (f.result or {}).get("restarted")]
    runs = {day["run_id"] for day in week.days}  # the stack's other modules may have restarted hubs of their own runs
    restarted = [r["instance_id"] for f in restarts for r in f.result["restarted"] if r["run_id"] in runs]
    assert restarted == [replacement.instance_id]
    assert replacement.booted_at > lost.booted_at


def test_the_weeks_hubs_booted_the_baked_node_image_and_installed_nothing(week):
    """A hub template naming the baked node image (`hub_ami_parameter`): the hub's boot finds every package and
    the bundle's dependencies there, as a node's does."""
    hubs = [hub for day in week.days for hub in day["hubs"]]
    for hub in hubs:
        log = (hub.sandbox.var_log / "gridfleet-boot.log").read_text()
        if hub.instance_id == week.days[KILL_DAY - 1]["killed"]:
            continue  # terminated mid-run: its log may end anywhere
        assert hub.baked and "baked image: its venv has the bundle's dependencies" in log, hub.instance_id
        assert "already installed:" in log and "installing:" not in log, hub.instance_id


def test_each_report_compares_with_the_day_before(week):
    for n, day in enumerate(week.days, 1):
        report = day["report"]
        before = week.days[n - 2]["run_id"] if n > 1 else week.before_week
        if before is None:
            assert "There is no earlier run to compare with." in report
            continue
        assert f"Compared with run {before}" in report, n
        listed = {key: re.findall(r"<li>(\S+)</li>", section) for key, section in sections(report).items()}
        if n == 1:
            continue  # the day before, if any, ran other sites
        assert listed["added"] == (["flaky"] if n == 3 else []), (n, listed)
        assert listed["newly-fixed"] == (["flaky"] if n == 4 else []), (n, listed)
    assert week.days[2]["summary"]["sites"]["flaky"]["run_status"] == "FAILED"
    assert week.days[3]["summary"]["sites"]["flaky"]["run_status"] == "COMPLETED"


def sections(report: str) -> dict[str, str]:
    """The report's "since the previous run" lists, by id (an absent list is empty)."""
    ids = ("newly-failing", "newly-fixed", "added", "removed")
    return {i: (m.group(1) if (m := re.search(rf'<ul id="{i}">(.*?)</ul>', report, re.S)) else "") for i in ids}
