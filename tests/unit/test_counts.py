"""Items and pages counted everywhere: the node's count of an attempt from its crawler's events, the site record's
counts as summaries show them (`site_entry`, `totals`), and `gridfleet status`'s table and totals line."""

from __future__ import annotations

import json
import logging

from rich.console import Console

from cli.views.run import print_sites
from fleet.outputs.summary import build_summary, site_entry, totals
from fleet.record.partition import RunInfo
from fleet.record.state import Attempt, Counts, RunStatus, SiteRecord, SiteSpec, SiteStatus
from node.counts import AttemptCounter

RUN = "2026-11-21"


def record(site: str, status: RunStatus, *attempts: Attempt, items: int | None = None, pages: int = 0) -> SiteRecord:
    site_status = SiteStatus.CALL_DONE if status is RunStatus.RUN else SiteStatus(status.value)
    return SiteRecord(
        RUN,
        site,
        SiteSpec("http://x.test/"),
        status,
        site_status,
        len(attempts),
        attempts=attempts,
        items=items,
        pages=pages,
    )


SITES = [
    record(
        "done",
        RunStatus.COMPLETED,
        Attempt(1, "i-1", 0.0, 5.0, "hang", counts=Counts(items=20, pages=2)),
        Attempt(2, "i-2", 6.0, 9.0, "completed", counts=Counts(10, 1, 3, 1, ("https://x.test/p",))),
        items=30,
        pages=3,
    ),
    record("old", RunStatus.COMPLETED, Attempt(1, "i-1", 0.0, 4.0, "completed"), items=None, pages=2),
    record("busy", RunStatus.RUN, Attempt(1, "i-3", 8.0, counts=Counts(items=7, pages=1)), pages=1),
    record("bad", RunStatus.FAILED, Attempt(1, "i-1", 0.0, 3.0, "error", counts=Counts(pages=1))),
]


def test_the_summary_shows_each_attempts_counts_and_the_sites_result():
    done = site_entry(SITES[0])
    assert (done["items"], done["pages"]) == (30, 3)
    assert done["attempts"][1] == {
        "instance_id": "i-2",
        "start": 6.0,
        "end": 9.0,
        "outcome": "completed",
        "items": 10,
        "pages": 1,
        "collisions": 3,
        "skipped": 1,
        "robots_skipped": 0,
        "collided": ["https://x.test/p"],
    }
    old = site_entry(SITES[1])["attempts"][0]  # an attempt of an older node: its counts are not known
    assert (old["items"], old["pages"], old["collisions"], old["skipped"]) == (None, None, None, None)


def test_the_runs_totals_count_results_fetches_and_what_was_left_out():
    run = RunInfo(RUN, "FINISHED", 0.0, 100.0, "20261121")
    summary = build_summary(run, SITES, left_running=0, finished_at=10.0, finish_reason="done")
    assert summary["totals"] == {
        "items": 30,
        "pages": 5,
        "pages_fetched": 5,
        "collisions": 3,
        "skipped": 1,
        "robots_skipped": 0,
    }
    assert totals({"x": "not an entry", "y": {"run_status": "COMPLETED", "items": True}})["items"] == 0
    json.dumps(summary)


def test_status_shows_items_pages_and_what_each_site_left_out():
    console = Console(record=True, width=200)
    print_sites(console, RUN, {r.site: site_entry(r) for r in SITES}, {"COMPLETED": 2, "RUN": 1, "FAILED": 1})
    out = console.export_text()
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]
    rows = {c[0]: c for c in cells}
    assert rows["done"][4:6] == ["30", "3"] and rows["done"][-1] == "3 collisions, 1 no id"
    assert rows["busy"][4:6] == ["7 so far", "1"]  # a running site: its attempt's items so far
    assert rows["bad"][4:6] == ["-", "-"] and rows["old"][4] == "-"  # no result, or one not counted
    assert out.splitlines()[-1] == (
        "items 30 from 5 pages (pages fetched, retries included: 5); left out: 3 collisions, 1 without an id"
    )


def test_the_node_counts_an_attempt_from_its_crawlers_events(caplog):
    counter = AttemptCounter.resumed({"next": "p3", "pages": 2, "items": []})
    counter.heard({"event": "status", "pages": 3})
    counter.heard({"event": "checkpoint", "pages": 4, "items": [{}] * 5, "collisions": 2, "collided": ["a", "b"]})
    counter.saved(5)
    counter.heard({"event": "status", "pages": "lots", "skipped": -1})  # not trusted: ignored
    assert counter.counts() == Counts(items=5, pages=2, collisions=2, collided=("a", "b"))
    assert counter.counts(items=7).items == 7
    with caplog.at_level(logging.WARNING, "gridfleet.node"):
        counter.told(logging.getLogger("gridfleet.node"), {"site": "s1", "attempt": 2})
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("items-left-out site=s1 attempt=2 collisions=2 collided=a,b skipped=0")


def test_counts_a_node_wrote_that_are_no_counts_read_as_nothing_not_as_a_failed_read():
    from fleet.record.codec import item_to_site

    rec = item_to_site({
        "run_id": "r", "Site": "s", "run_status": "RUN", "site_status": "RUNNING", "pages": "many", "items": -3,
        "spec": {"start_url": "http://s.test/", "crawler": "links"},
        "attempts": [{"n": 1, "instance_id": "i-1", "start": 1.0, "items": "lots", "pages": 2.5, "collisions": True,
                      "skipped": None, "collided": "not a list", "robots_skipped": -1}],
    })  # fmt: skip
    assert (rec.pages, rec.items) == (0, None)
    counts = rec.attempts[0].counts
    assert counts is not None and (counts.items, counts.pages, counts.collisions, counts.skipped) == (0, 0, 0, 0)
    assert (counts.collided, counts.robots_skipped) == ((), 0)
