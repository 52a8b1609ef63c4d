"""The embedded default end to end: the real CLI, moto server, a Selenium Grid hub and nodes, Chromium.

Few and small (seconds-long thresholds, a handful of sites): the detail is in the unit tests.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.conftest import assert_no_overlap, attempts

pytestmark = pytest.mark.e2e

MIXED = """\
run:
  max_attempts: 3
  hang_after_s: 4
  heartbeat_timeout_s: 15
  watch_interval_s: 2
  deadline_s: 240
  retry: {http_5xx: {backoff_s: 1}}  # the sites built to fail wait a second, not 30
fleet: {max_nodes: 3, idle_exit_s: 5}
hub: {port: 0}
sites:
  - {id: plain, start_url: "{demo}/s/plain/?pages=3", crawler: links,
     options: {item: a.item, next: a.next, max_pages: 5}}
  - {id: hangs, start_url: "{demo}/s/hangs/?pages=2&hang_page=2"}
  - {id: flaky, start_url: "{demo}/s/flaky/?pages=2&fail_attempts=1"}
  - {id: broken, start_url: "{demo}/s/broken/?fail_attempts=99"}
  - {id: slow, start_url: "{demo}/s/slow/?pages=4&delay_s=1.2"}
"""


def test_mixed_sites_on_a_running_stack_end_as_their_behaviour_implies(gf):
    up = gf.run("local", "up", timeout=120)
    assert up.returncode == 0, up.stderr
    status = gf.run("local", "status")
    assert status.returncode == 0
    for component in ("moto", "grid", "demo"):
        assert component in status.stdout
    assert "http://127.0.0.1:" in status.stdout

    cfg = gf.write_config("mixed.yaml", MIXED)
    hub = gf.start("run", "--local", "--config", str(cfg), "--run-id", "mixed", log="mixed.log")
    metrics = metrics_while_running(gf.cwd / "mixed.log", hub)  # the hub's /metrics, scraped mid-run
    for family in (
        "gridfleet_sites",
        "gridfleet_nodes_active",
        "gridfleet_queue_messages",
        "gridfleet_run_progress_ratio",
        "gridfleet_node_jobs_completed_total",
        "gridfleet_node_heartbeat_timestamp_seconds",
    ):
        assert family in metrics, family
    assert hub.wait(timeout=240) == 3, (gf.cwd / "mixed.log").read_text()[-3000:]  # finished, some sites FAILED
    s = gf.summary("mixed")
    assert set(s) >= {"run_id", "started_at", "finished_at", "sites", "nodes"}
    assert s["nodes"]["left_running"] == 0 and s["nodes"]["launched"] >= 1
    sites = s["sites"]

    assert (sites["plain"]["run_status"], sites["plain"]["attemptCount"]) == ("COMPLETED", 1)
    assert (sites["hangs"]["run_status"], sites["hangs"]["failure_reason"]) == ("FAILED", "hang")
    assert [a["outcome"] for a in attempts(s, "hangs")] == ["hang"] * 3
    # The node's watchdog kills first; the hub is the backup and may win a race on a loaded machine.
    assert all(a["kill_path"] in ("watchdog", "local") for a in attempts(s, "hangs"))
    assert (sites["flaky"]["run_status"], sites["flaky"]["attemptCount"]) == ("COMPLETED", 2)
    assert (sites["broken"]["run_status"], sites["broken"]["failure_reason"]) == ("FAILED", "error")
    assert sites["broken"]["attemptCount"] == 3
    assert (sites["slow"]["run_status"], sites["slow"]["attemptCount"]) == ("COMPLETED", 1)  # never killed
    assert_no_overlap(s)

    result = json.loads((gf.cwd / "runs" / "mixed" / "results" / "plain.json").read_text())
    assert len(result["items"]) == 30 and result["pages"] == 3
    assert {i["id"] for i in result["items"]} == {f"plain-{p}-{i}" for p in (1, 2, 3) for i in range(1, 11)}

    stats = gf.demo_stats()  # the outside view of what was fetched
    assert stats["plain"]["hits"] == {"1": 1, "2": 1, "3": 1}
    assert stats["slow"]["hits"] == {"1": 1, "2": 1, "3": 1, "4": 1}
    assert stats["hangs"]["hits"]["2"] == 3
    assert stats["flaky"]["hits"] == {"1": 2, "2": 1}

    assert gf.status("mixed")["sites"] == s["sites"]  # status --json and the summary agree
    assert s["check"]["ok"], s["check"]  # the run checked itself at its end
    assert s["check"]["false_losses"] == 0, s["check"]["false_loss_details"]  # no node was harmed
    check = gf.run("check", "--run-id", "mixed")  # and again from outside, with the demo server's own counts
    assert check.returncode == 0 and "OK" in check.stdout and "demo server fetches" in check.stdout, check.stdout
    assert gf.run("local", "status").returncode == 0  # a stack started by `local up` outlives the run

    # The operator fixes what broke the two FAILED sites and reruns them: fresh attempts, same machinery.
    fixed = gf.write_config("fixed.yaml", MIXED.replace("&hang_page=2", "").replace("?fail_attempts=99", ""))
    rerun = gf.run("rerun", "--failed", "--local", "--config", str(fixed), "--run-id", "mixed", timeout=180)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    s2 = gf.summary("mixed")
    for name in ("hangs", "broken"):
        assert (s2["sites"][name]["run_status"], s2["sites"][name]["attemptCount"]) == ("COMPLETED", 4), name
    assert s2["sites"]["plain"]["attempts"] == s["sites"]["plain"]["attempts"]  # untouched
    assert s2["check"]["ok"], s2["check"]
    assert s2["check"]["false_losses"] == 0, s2["check"]["false_loss_details"]  # no node was harmed
    assert gf.status("mixed")["sites"] == s2["sites"]
    report = gf.run("report", "--run-id", "mixed")
    assert report.returncode == 0, report.stderr
    html = (gf.cwd / "runs" / "mixed" / "report.html").read_text()
    assert html.count('<rect class="bar') == sum(len(v["attempts"]) for v in s2["sites"].values())

    down = gf.run("local", "down", timeout=60)
    assert down.returncode == 0
    assert gf.wait_no_leftovers() == []
    # moto forgot the run with its stack: `check` reads it from runs/mixed/, as `status` and `report` do
    check = gf.run("check", "--run-id", "mixed")
    assert check.returncode == 0 and "run mixed: OK (" in check.stdout, check.stdout + check.stderr
    assert "the stores went with the local stack" in check.stdout
    assert gf.run("local", "status").returncode != 0  # and nothing was started for it


def metrics_while_running(log: Path, hub, timeout: float = 60) -> str:
    """The text of the hub's /metrics once it shows a node at work (the URL is on its `dashboard` log line)."""
    end = time.monotonic() + timeout
    url = None
    while time.monotonic() < end and hub.poll() is None:
        if url is None:
            for line in log.read_text().splitlines():
                if line.startswith("{") and '"event": "dashboard"' in line:
                    url = json.loads(line)["metrics"]
        if url is not None:
            with urllib.request.urlopen(url, timeout=5) as r:
                text = r.read().decode()
            if "gridfleet_node_jobs_completed_total{" in text:
                return text
        time.sleep(0.5)
    raise AssertionError(f"no /metrics with node counters while the run went (url {url})")


RESUME = """\
run: {max_attempts: 3, hang_after_s: 4, heartbeat_timeout_s: 20, watch_interval_s: 1, deadline_s: 300}
fleet: {max_nodes: 3, idle_exit_s: 8, node_watchdog: false}
sites:
  - {id: a1, start_url: "{demo}/s/a1/?pages=3&delay_s=0.8"}
  - {id: a2, start_url: "{demo}/s/a2/?pages=3&delay_s=0.8"}
  - {id: a3, start_url: "{demo}/s/a3/?pages=3&delay_s=0.8"}
  - {id: a4, start_url: "{demo}/s/a4/?pages=3&delay_s=0.8"}
  - {id: a5, start_url: "{demo}/s/a5/?pages=3&delay_s=0.8"}
  - {id: a6, start_url: "{demo}/s/a6/?pages=3&delay_s=0.8"}
  - {id: once, start_url: "{demo}/s/once/?pages=2&hang_page=1&hang_attempts=1"}
"""


def crawling_node(gf, hub, run_id: str, site: str) -> str:
    """The node crawling `site` once a page load of it is under way (the hub must still be running)."""
    deadline = time.monotonic() + 120
    while True:
        assert hub.poll() is None, (gf.cwd / "hub.log").read_text()
        st = gf.run("status", "--run-id", run_id, "--json", timeout=60)
        rec = json.loads(st.stdout)["sites"].get(site) if st.returncode == 0 else None
        if rec and rec["site_status"] in ("URL_CALL", "CALL_DONE") and rec["instance_id"]:
            return rec["instance_id"]
        assert time.monotonic() < deadline, f"site {site} never started"
        time.sleep(0.3)


def sigkill_when(gf, hub, run_id: str, completed: int) -> None:
    """SIGKILL the hub once `completed` sites of the run are COMPLETED."""
    deadline = time.monotonic() + 120
    while True:
        assert hub.poll() is None, (gf.cwd / "hub.log").read_text()
        if gf.stack_file.exists():
            st = gf.run("status", "--run-id", run_id, "--json", timeout=60)
            if st.returncode == 0 and json.loads(st.stdout)["counts"]["COMPLETED"] >= completed:
                break
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.3)
    os.kill(hub.pid, signal.SIGKILL)
    hub.wait()


def test_hub_sigkilled_mid_run_then_resumed_loses_nothing_and_fetches_nothing_twice(gf):
    assert gf.run("local", "up", timeout=120).returncode == 0
    cfg = gf.write_config("resume.yaml", RESUME)
    hub = gf.start("run", "--local", "--config", str(cfg), "--run-id", "r1")
    sigkill_when(gf, hub, "r1", completed=2)

    resumed = gf.run("run", "--local", "--config", str(cfg), "--run-id", "r1", "--resume", timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr + (gf.cwd / "hub.log").read_text()
    s = gf.summary("r1")
    assert s["check"]["ok"], s["check"]
    assert s["check"]["false_losses"] == 0, s["check"]["false_loss_details"]  # no node was harmed
    assert all(v["run_status"] == "COMPLETED" for v in s["sites"].values())
    assert s["nodes"]["left_running"] == 0
    assert_no_overlap(s)
    # The hang of `once` was ended by the hub (node watchdogs are off): by signalling the crawler's group.
    assert [a["outcome"] for a in attempts(s, "once")] == ["hang", "completed"]
    assert attempts(s, "once")[0]["kill_path"] == "local"

    stats = gf.demo_stats()
    for site in ("a1", "a2", "a3", "a4", "a5", "a6"):
        assert s["sites"][site]["attemptCount"] == 1, site  # nothing re-crawled
        assert stats[site]["hits"] == {"1": 1, "2": 1, "3": 1}, site  # every page fetched exactly once
    assert stats["once"]["hits"] == {"1": 2, "2": 1}  # the hung request, then the good attempt
    assert gf.run("local", "down", timeout=60).returncode == 0
    assert gf.wait_no_leftovers() == []


def test_run_starts_its_own_stack_and_leaves_nothing_running_even_across_a_crash(gf):
    cfg = gf.write_config(
        "own.yaml",
        """\
        run: {hang_after_s: 10, watch_interval_s: 1}
        fleet: {max_nodes: 2, sites_per_node: 1}
        sites:
          - {id: one, start_url: "{demo}/s/one/?pages=2"}
          - {id: two, start_url: "{demo}/s/two/?pages=4&delay_s=3"}
        """,
    )
    hub = gf.start("run", "--local", "--config", str(cfg), "--run-id", "own")
    sigkill_when(gf, hub, "own", completed=1)  # two takes 12 s more: the run is not over
    assert gf.run("local", "status").returncode == 0  # the stack the dead hub started is still up
    run = gf.run("run", "--local", "--config", str(cfg), "--run-id", "own", "--resume", timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    s = gf.summary("own")
    assert s["check"]["ok"], s["check"]
    assert s["check"]["false_losses"] == 0, s["check"]["false_loss_details"]  # no node was harmed
    assert {k: v["run_status"] for k, v in s["sites"].items()} == {"one": "COMPLETED", "two": "COMPLETED"}
    assert s["nodes"] == {"launched": 2, "left_running": 0}  # sites_per_node 1: one node per site
    assert (gf.cwd / "runs" / "own" / "results" / "two.json").is_file()
    assert list((gf.cwd / "runs" / "own" / "nodes").glob("*/node.log"))
    assert gf.wait_no_leftovers() == []
    assert not gf.stack_file.exists()
    assert gf.run("local", "status").returncode == 1  # nothing is up
    # With the stack gone, status falls back to the exported summary.
    assert gf.status("own")["sites"] == s["sites"]
    # The same run id again once its stack is gone: refused, and --resume reports it from the export.
    again = gf.run("run", "--local", "--config", str(cfg), "--run-id", "own", timeout=60)
    assert again.returncode == 2 and "already finished" in again.stderr, again.stdout + again.stderr
    told = gf.run("run", "--local", "--config", str(cfg), "--run-id", "own", "--resume", timeout=60)
    assert told.returncode == 0 and "had already finished" in told.stdout, told.stdout + told.stderr
    assert gf.summary("own") == s and not gf.stack_file.exists()  # nothing crawled, nothing started


# The long site's first attempt holds page 3 until the spot notice comes; hang_after_s is well beyond the time a
# busy machine takes from seeing the crawl under way to the node reading the notice (the hang would win otherwise).
SPOT = """\
run: {max_attempts: 3, hang_after_s: 90, heartbeat_timeout_s: 20, watch_interval_s: 1, deadline_s: 240}
fleet: {max_nodes: 2, idle_exit_s: 6}
sites:
  - {id: long, start_url: "{demo}/s/long/?pages=4&hang_page=3&hang_attempts=1"}
  - {id: short, start_url: "{demo}/s/short/?pages=2"}
"""


def test_a_spot_notice_mid_crawl_requeues_the_site_without_spending_an_attempt(gf):
    import urllib.request

    assert gf.run("local", "up", timeout=120).returncode == 0
    cfg = gf.write_config("spot.yaml", SPOT)
    hub = gf.start("run", "--local", "--config", str(cfg), "--run-id", "spot")
    node = crawling_node(gf, hub, "spot", "long")  # then interrupt that node
    stack = json.loads(gf.stack_file.read_text())
    assert stat.S_IMODE(gf.stack_file.stat().st_mode) == 0o600  # it holds the stack's token
    spot = f"{stack['components']['imds']['url']}/_spot/{node}"
    with pytest.raises(urllib.error.HTTPError) as refused:  # without the stack's token nothing happens
        urllib.request.urlopen(urllib.request.Request(spot, method="POST"), timeout=5)
    assert refused.value.code == 403
    urllib.request.urlopen(
        urllib.request.Request(spot, method="POST", headers={"X-Gridfleet-Token": stack["token"]}), timeout=5
    ).read()
    assert hub.wait(timeout=180) == 0, (gf.cwd / "hub.log").read_text()

    s = gf.summary("spot")
    assert s["check"]["ok"], s["check"]
    long = s["sites"]["long"]
    assert long["run_status"] == "COMPLETED"
    assert [a["outcome"] for a in long["attempts"]] == ["spot", "completed"]
    assert long["attempts"][0]["instance_id"] == node
    assert long["attemptCount"] == 1  # the interrupted attempt was given back
    node_log = (gf.cwd / "runs" / "spot" / "nodes" / node / "node.log").read_text()
    assert "spot-release" in node_log and "node-exit" in node_log
    assert gf.run("local", "down", timeout=60).returncode == 0
    assert gf.wait_no_leftovers() == []


KILL_AGENT = """\
run: {max_attempts: 3, hang_after_s: 20, heartbeat_timeout_s: 8, watch_interval_s: 1, deadline_s: 240}
fleet: {max_nodes: 2, idle_exit_s: 6}
sites:
  - {id: victim, start_url: "{demo}/s/victim/?pages=6&hang_page=3&hang_attempts=1"}
  - {id: other, start_url: "{demo}/s/other/?pages=2"}
"""
# The victim's first attempt holds its third page (well within hang_after_s), so the agent is killed mid-crawl
# however long the test takes to find it.


def test_a_node_agent_sigkilled_mid_crawl_is_lost_its_instance_ended_and_the_site_retried(gf):
    from fleet import procs

    assert gf.run("local", "up", timeout=120).returncode == 0
    cfg = gf.write_config("kill.yaml", KILL_AGENT)
    hub = gf.start("run", "--local", "--config", str(cfg), "--run-id", "kill")
    node = crawling_node(gf, hub, "kill", "victim")
    agents = [
        p
        for p in procs.scan(with_cmdline=True)
        if p.alive
        and p.markers.get("GRIDFLEET_INSTANCE") == node
        and "node" in p.cmdline
        and "--instance-id" in p.cmdline
    ]
    assert len(agents) == 1, agents
    os.kill(agents[0].pid, signal.SIGKILL)  # the agent dies; its Grid node, crawler and browser do not
    assert hub.wait(timeout=180) == 0, (gf.cwd / "hub.log").read_text()

    s = gf.summary("kill")
    assert s["check"]["ok"], s["check"]
    victim = s["sites"]["victim"]
    assert victim["run_status"] == "COMPLETED"
    assert [a["outcome"] for a in victim["attempts"]] == ["lost", "completed"]
    assert victim["attempts"][0]["instance_id"] == node != victim["attempts"][1]["instance_id"]
    assert "terminate" in victim["attempts"][0]["kill_path"]  # a node whose agent stopped is ended whole
    assert not [p for p in procs.scan() if p.alive and p.markers.get("GRIDFLEET_INSTANCE") == node]
    check = gf.run("check", "--run-id", "kill")  # /_stats agrees: no page fetched more often than attempts
    assert check.returncode == 0, check.stdout
    assert gf.run("local", "down", timeout=60).returncode == 0
    assert gf.wait_no_leftovers() == []
