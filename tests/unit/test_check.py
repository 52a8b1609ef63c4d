"""The checker judges a run by what that run did, and a result belongs to its run."""

from __future__ import annotations

from cli.report.check import check_run, demo_hits
from fleet import ops
from fleet.codec import RunInfo
from fleet.results import is_daily_run, result_key
from fleet.state import SiteSpec, SiteStatus
from sim.memory import MemoryQueue, MemoryResults, MemoryStateTable

DEMO = "http://127.0.0.1:8800"


class NoInstances:
    def list(self, run_id):
        return []


def test_the_daily_run_keeps_its_key_and_other_runs_of_the_day_store_beside_it():
    assert result_key("shop", "20261121", "2026-11-21") == "shop/20261121/result.json"
    assert result_key("shop", "20261121", "20261121") == "shop/20261121/result.json"
    assert result_key("shop", "20261121") == "shop/20261121/result.json"
    assert result_key("shop", "20261121", "a") == "shop/20261121/a/result.json"
    assert result_key("shop", "20261121", "2026-11-21-rerun") == "shop/20261121/2026-11-21-rerun/result.json"
    assert is_daily_run("2026-11-21", "20261121") and not is_daily_run("2026-11-22", "20261121")


def _finished_run(table, results, run_id: str, t0: float, site: str = "inc"):
    """A run of one demo site crawled (3 pages) by one attempt from t0 to t0 + 10."""
    table.create_run(RunInfo(run_id, "FINISHED", t0, t0 + 3600, "20261121", finished_at=t0 + 20))
    rec = ops.new_site(run_id, site, SiteSpec(f"{DEMO}/s/{site}/?pages=3"), None)
    table.create_site(rec)
    rec = ops.claim(table, rec, "i-1", t0)
    rec = ops.beat(table, rec, t0 + 9, ops.Progress(SiteStatus.CALL_DONE, t0 + 9, pages=3))
    key = result_key(site, "20261121", run_id)
    results.put_new(key, b"{}")
    return ops.complete(table, rec, key, t0 + 10)


def test_a_second_run_on_one_stack_is_not_charged_with_the_first_runs_fetches():
    table, queue, results = MemoryStateTable(), MemoryQueue(), MemoryResults()
    _finished_run(table, results, "a", 1000.0)
    second = _finished_run(table, results, "b", 2000.0)
    # The demo server's log: run a fetched pages 1-3 around t=1000, run b the same around t=2000.
    stats = {
        "inc": {
            "hits": {"1": 2, "2": 2, "3": 2},
            "requests": [[1001, 1], [1004, 2], [1007, 3], [2001, 1], [2004, 2], [2007, 3]],
        }
    }
    assert demo_hits(stats["inc"], second) == {1: 1, 2: 1, 3: 1}
    for run_id in ("a", "b"):
        report = check_run(
            run_id, table=table, queue=queue, results=results, provider=NoInstances(), demo_stats=stats, demo_url=DEMO
        )
        assert report.violations == [], (run_id, report.violations)
        assert report.false_losses == 0


def test_two_fetches_of_a_page_within_one_attempt_are_still_caught():
    table, queue, results = MemoryStateTable(), MemoryQueue(), MemoryResults()
    _finished_run(table, results, "b", 2000.0)
    stats = {"inc": {"requests": [[2001, 1], [2002, 1], [2004, 2], [2007, 3]]}}
    report = check_run(
        "b", table=table, queue=queue, results=results, provider=NoInstances(), demo_stats=stats, demo_url=DEMO
    )
    assert any("page 1 was fetched 2 times by 1 attempts" in v for v in report.violations), report.violations


def test_each_run_counts_only_its_own_result_object():
    table, queue, results = MemoryStateTable(), MemoryQueue(), MemoryResults()
    _finished_run(table, results, "2026-11-21", 1000.0)
    _finished_run(table, results, "b", 2000.0)
    assert set(results.keys("inc/")) == {"inc/20261121/result.json", "inc/20261121/b/result.json"}
    for run_id in ("2026-11-21", "b"):
        report = check_run(run_id, table=table, queue=queue, results=results, provider=NoInstances())
        assert report.violations == [], (run_id, report.violations)
