"""The checker judges a run by what that run did, and a result belongs to its run."""

from __future__ import annotations

import json

from cli.report.check import attach, check_export, check_run, demo_hits
from fleet.outputs.checkpoint import Segment, part_keys
from fleet.outputs.results import EVIDENCE_FILES, evidence_key, evidence_prefix, is_daily_run, result_key
from fleet.outputs.summary import build_summary, export
from fleet.record import ops
from fleet.record.partition import RunInfo
from fleet.record.state import SiteSpec, SiteStatus
from hub.plan import run_date_for
from hub.snapshot import Instance
from sim.memory import MemoryQueue, MemoryResults, MemoryStateTable

DEMO = "http://127.0.0.1:8800"


class NoInstances:
    def list(self, run_id):
        return []


def test_the_daily_run_keeps_its_key_and_other_runs_of_the_day_store_beside_it():
    assert result_key("shop", "20261121", "2026-11-21") == "shop/20261121/result.json"
    assert result_key("shop", "20261121", "20261121") == "shop/20261121/20261121/result.json"  # another run
    assert result_key("shop", "20261121") == "shop/20261121/result.json"
    assert result_key("shop", "20261121", "a") == "shop/20261121/a/result.json"
    assert result_key("shop", "20261121", "2026-11-21-rerun") == "shop/20261121/2026-11-21-rerun/result.json"
    assert is_daily_run("2026-11-21", "20261121") and not is_daily_run("2026-11-22", "20261121")
    for other in ("20261121", "20261121--", "2026--1121", "2026-1121-", "202611-21"):
        assert not is_daily_run(other, "20261121"), other


def _keys(site: str, run_id: str) -> set[str]:
    """Every key a run writes for a site: its result, each evidence file of two attempts, parts of two claims."""
    run_date = run_date_for(run_id, 0.0)
    return {
        result_key(site, run_date, run_id),
        *(evidence_key(site, run_date, run_id, attempt, name) for attempt in (1, 2) for name in EVIDENCE_FILES),
        evidence_prefix(site, run_date, run_id),
        *part_keys(site, run_date, run_id, [Segment(1, 3, 2), Segment(2, 7, 1)]),
    }


def test_run_ids_that_read_as_one_date_keep_keys_of_their_own():
    """2026-11-21 (the daily run), 20261121 and 20261121-- are three runs of one date: no key of one is a key of
    another, so none reads another's result as its own, skips a site for it, or resumes from its parts."""
    ids = ("2026-11-21", "20261121", "20261121--", "2026-1121", "2026-11-21-rerun")
    assert {run_date_for(run_id, 0.0) for run_id in ids} == {"20261121"}
    keys = {run_id: _keys("shop", run_id) for run_id in ids}
    for a in ids:
        for b in ids:
            assert a == b or not keys[a] & keys[b], (a, b, keys[a] & keys[b])
    assert result_key("shop", "20261121", "2026-11-21") == "shop/20261121/result.json"
    assert result_key("shop", "20261121", "20261121--") == "shop/20261121/20261121--/result.json"


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


def test_a_finished_run_is_checked_from_its_export_alone_once_its_stores_are_gone(tmp_path):
    """The local stack stopped: moto forgot the run, runs/<run_id>/ is what is left. The same promises hold
    there, against the results exported beside the summary, and what only the stores could show is taken from
    the check the run made of itself at its end."""
    table, queue, results = MemoryStateTable(), MemoryQueue(), MemoryResults()
    _finished_run(table, results, "a", 1000.0)
    rows = table.read_run("a")
    assert rows.run is not None
    summary = build_summary(rows.run, rows.sites, left_running=0, finished_at=1020.0, finish_reason="done")
    summary["max_attempts"] = 3
    path = export(tmp_path, summary, rows.sites, results)
    at_end = check_run("a", table=table, queue=queue, results=results, provider=NoInstances())
    attach(at_end, path)

    report = check_export(json.loads(path.read_text()), path.parent, nodes=NoInstances())
    assert report.ok, report.violations
    assert report.checked == {**at_end.checked, "sites": 1}

    class StillRunning:
        def list(self, run_id):
            return [Instance("n-1", "running", "node", {"gridfleet:run_id": run_id})]

    data = json.loads(path.read_text())
    [first] = data["sites"]["inc"]["attempts"]
    later = [{**first, "start": first["start"] + 20 * n, "end": first["end"] + 20 * n} for n in (1, 2, 3)]
    data["sites"]["inc"].update(attemptCount=4, attempts=[first, *later])
    data["check"]["violations"] = ["DLQ: something the run's own check saw"]
    (path.parent / "results" / "inc.json").unlink()
    report = check_export(data, path.parent, nodes=StillRunning())
    assert report.violations == [
        "inc: 4 attempts counted (attemptCount 4), more than max_attempts 3",
        "inc: COMPLETED but 0 result objects in inc/20261121/a/ (want exactly inc/20261121/a/result.json)",
        "nodes of the run still running: n-1",
        "at the run's end: DLQ: something the run's own check saw",
    ]


def test_a_quarantined_result_is_no_result_to_the_check():
    """A contract's FAILED site with its result in quarantine is as it should be; a COMPLETED site whose only
    object is in quarantine has no result."""
    from fleet.outputs.results import quarantine_key
    from fleet.record.state import Reason, RunStatus

    table, queue, results = MemoryStateTable(), MemoryQueue(), MemoryResults()
    table.create_run(RunInfo("b", "FINISHED", 1000.0, 4600.0, "20261121", finished_at=1020.0))
    for site in ("broke", "forged"):
        table.create_site(ops.new_site("b", site, SiteSpec(f"{DEMO}/s/{site}/"), None))
        rec = ops.claim(table, table.get_site("b", site), "i-1", 1001.0)
        results.put_new(quarantine_key(result_key(site, "20261121", "b"), 1), b"{}")
        if site == "broke":
            rec = ops.end_attempt(table, rec, reason=Reason.CONTRACT, now=1005.0, max_attempts=3, spot_cap=3,
                                  error="min_items: 0 items < 1")  # fmt: skip
            assert rec.run_status is RunStatus.FAILED and rec.attempt == 1  # not retried
        else:
            ops.complete(table, rec, result_key(site, "20261121", "b"), 1005.0)  # names a result never written

    report = check_run("b", table=table, queue=queue, results=results, provider=NoInstances())

    assert report.violations == ["forged: COMPLETED but 0 result objects in forged/20261121/b/ (want exactly "
                                 "forged/20261121/b/result.json)"]  # fmt: skip
