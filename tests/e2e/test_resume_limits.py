"""Crawls that resume, skip what they have seen and share a rate limit, on the embedded default, checked
from outside through the demo server's own counts (`/_stats`)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from fleet.aws import ratelimit
from tests.e2e.conftest import assert_no_overlap, attempts
from tests.helpers.windows import max_in_window

pytestmark = pytest.mark.e2e

FIRST = """\
run: {max_attempts: 3, hang_after_s: 4, heartbeat_timeout_s: 15, watch_interval_s: 2, deadline_s: 240}
fleet: {max_nodes: 3, idle_exit_s: 5}
hub: {port: 0}
rate_limits: {feed: {per_s: 5}}
sites:
  - {id: feed-a, start_url: "{demo}/api/feed-a?pages=12&per_page=5", crawler: api, rate_limit: feed,
     incremental: true, options: {max_pages: 20}}
  - {id: feed-b, start_url: "{demo}/api/feed-b?pages=12&per_page=5", crawler: api, rate_limit: feed,
     incremental: true, options: {max_pages: 20}}
  - {id: feed-c, start_url: "{demo}/api/feed-c?pages=12&per_page=5", crawler: api, rate_limit: feed,
     incremental: true, options: {max_pages: 20}}
  - {id: resumes, start_url: "{demo}/s/resumes/?pages=5&hang_page=3&hang_attempts=1"}
  - {id: news, start_url: "{demo}/s/news/?pages=3", incremental: true}
"""

# The next day: the same incremental sites, unchanged.
SECOND = "\n".join(line for line in FIRST.splitlines() if "resumes" not in line) + "\n"


def test_resume_incremental_and_a_shared_rate_limit(gf):
    assert gf.run("local", "up", timeout=120).returncode == 0

    cfg = gf.write_config("first.yaml", FIRST)
    first = gf.run("run", "--local", "--config", str(cfg), "--run-id", "2026-11-20-feeds", timeout=300)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    s = gf.summary("2026-11-20-feeds")
    assert s["nodes"]["left_running"] == 0 and s["check"]["ok"], s["check"]
    assert s["check"]["false_losses"] == 0, s["check"]["false_loss_details"]  # hangs are not losses
    assert all(site["run_status"] == "COMPLETED" for site in s["sites"].values())
    assert_no_overlap(s)
    stats = gf.demo_stats()

    # Resume: attempt 1 hung on page 3 and was killed; attempt 2 went on from page 3.
    assert [a["outcome"] for a in attempts(s, "resumes")] == ["hang", "completed"]
    assert stats["resumes"]["hits"] == {"1": 1, "2": 1, "3": 2, "4": 1, "5": 1}
    result = gf.result("2026-11-20-feeds", "resumes")
    ids = [i["id"] for i in result["items"]]
    assert len(ids) == len(set(ids)) == 50  # five pages of ten, each item once

    # Rate limit: the three feeds ran on three nodes at once and the fleet kept to 5 requests a second.
    nodes = {attempts(s, f)[0]["instance_id"] for f in ("feed-a", "feed-b", "feed-c")}
    times = [t for f in ("feed-a", "feed-b", "feed-c") for t in stats[f]["times"]]
    assert len(times) == 36 and all(
        stats[f]["hits"] == {str(p): 1 for p in range(1, 13)} for f in ("feed-a", "feed-b", "feed-c")
    )
    busiest = max_in_window(times)
    rate = (len(times) - 1) / (max(times) - min(times))
    print(f"feeds: {len(times)} requests from {len(nodes)} nodes, {rate:.2f}/s, at most {busiest} in any second")
    # The fleet's slots are 1.1/5 s apart (tests/adapter/test_ratelimit.py holds them exactly): over the 36
    # requests the rate stays under 5/s whatever the machine's load, and in any one second the server sees 5
    # at most, or 6 when a busy machine delayed one request by more than the slots' headroom (0.1 s).
    assert rate <= 5 / ratelimit.PACE_MARGIN + 0.1, rate
    assert busiest <= 6
    assert len(nodes) >= 2  # shared: the limit held across nodes, not within one

    # Incremental: the next day's run of the unchanged sites fetches page 1 of each and stops there.
    token = json.loads(gf.stack_file.read_text())["token"]
    urllib.request.urlopen(
        urllib.request.Request(gf.demo_url() + "/_reset", method="POST", headers={"X-Gridfleet-Token": token}),
        timeout=5,
    ).read()
    cfg2 = gf.write_config("second.yaml", SECOND)
    second = gf.run("run", "--local", "--config", str(cfg2), "--run-id", "2026-11-21-feeds", timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    s2 = gf.summary("2026-11-21-feeds")
    assert s2["check"]["ok"], s2["check"]
    assert s2["check"]["false_losses"] == 0, s2["check"]["false_loss_details"]
    stats = gf.demo_stats()
    for site in ("feed-a", "feed-b", "feed-c", "news"):
        assert stats[site]["hits"] == {"1": 1}, (site, stats[site])
        assert gf.result("2026-11-21-feeds", site)["items"] == []  # nothing new since yesterday
