"""Two runs on one stack the same day: each is judged by what it did, and each keeps its own result.

A new user's day: `gridfleet local up`, a run `a`, then a run `b` that names an incremental site `a` had
crawled. `b` crawls it (its result is stored beside `a`'s, not skipped because of it), and neither run's
check counts the other's fetches on the shared demo server. No fault is injected: no false loss either.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import attempts

pytestmark = pytest.mark.e2e

CONFIG = """\
run: {{max_attempts: 3, hang_after_s: 10, heartbeat_timeout_s: 15, watch_interval_s: 2, deadline_s: 240}}
fleet: {{max_nodes: 2, idle_exit_s: 4}}
hub: {{port: 0}}
sites:
  - {{id: inc, start_url: "{{demo}}/s/inc/?pages=2", incremental: true}}
  - {{id: {other}, start_url: "{{demo}}/s/{other}/?pages=2"}}
"""


def test_two_runs_on_one_stack_are_each_judged_by_their_own_traffic_and_keep_their_own_results(gf):
    assert gf.run("local", "up", timeout=120).returncode == 0
    for run_id, other in (("a", "plain-a"), ("b", "plain-b")):
        cfg = gf.write_config(f"{run_id}.yaml", CONFIG.format(other=other))
        p = gf.run("run", "--local", "--config", str(cfg), "--run-id", run_id, timeout=240)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        s = gf.summary(run_id)
        assert s["check"]["ok"] and s["check"]["violations"] == [], s["check"]
        assert s["check"]["false_losses"] == 0, s["check"]["false_loss_details"]
        assert all(site["run_status"] == "COMPLETED" for site in s["sites"].values())
        # Crawled by this run, not skipped for the other run's result of the same date.
        assert [a["outcome"] for a in attempts(s, "inc")] == ["completed"], attempts(s, "inc")
        date = s["run_date"]
        assert s["sites"]["inc"]["result_key"] == f"inc/{date}/{run_id}/result.json"
    assert gf.demo_stats()["inc"]["hits"]["1"] == 2  # each run fetched page 1 once: two runs, one server

    check = gf.run("check", "--run-id", "a", timeout=60)  # judged again, after b's traffic
    assert check.returncode == 0 and "false_losses 0" in check.stdout, check.stdout + check.stderr
