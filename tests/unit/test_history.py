"""The baseline of a site's `max_drop`: its items in its newest earlier COMPLETED run, read back as a count only."""

from __future__ import annotations

from fleet.outputs.results import result_key
from fleet.record import ops
from fleet.record.partition import RunInfo
from fleet.record.state import Reason, SiteSpec
from hub.history import previous_items
from sim.memory import MemoryStateTable


def _run(table: MemoryStateTable, run_id: str, t0: float, outcomes: dict[str, object]) -> None:
    """A finished run in which each site ended COMPLETED with that many items, or FAILED (None)."""
    table.create_run(RunInfo(run_id, "FINISHED", t0, t0 + 3600, "20261121", finished_at=t0 + 20))
    for site, items in outcomes.items():
        table.create_site(ops.new_site(run_id, site, SiteSpec(f"http://127.0.0.1/s/{site}/"), None))
        rec = ops.claim(table, table.get_site(run_id, site), "i-1", t0 + 1)
        if items is None:
            ops.end_attempt(table, rec, reason=Reason.ERROR, now=t0 + 2, max_attempts=1, spot_cap=3)
        elif isinstance(items, int) and items >= 0:
            ops.complete(table, rec, result_key(site, "20261121", run_id), t0 + 2, items=items, pages=1)
        else:  # a count a node wrote that is no count
            done = ops.complete(table, rec, result_key(site, "20261121", run_id), t0 + 2, items=1, pages=1)
            table.items[(run_id, site)] = {**table.items[(run_id, site)], "items": items}
            assert done is not None


def test_each_site_takes_its_newest_completed_run_and_a_count_that_is_none_is_no_baseline():
    """`c` and `d` of run d2 hold what a compromised node could write: they read as no count, and the run before
    gives the baseline."""
    table = MemoryStateTable()
    _run(table, "d1", 1000.0, {"a": 50, "b": 40, "c": 30, "d": 7})
    _run(table, "d2", 2000.0, {"a": 60, "b": None, "c": -5, "d": "lots"})
    _run(table, "d3", 3000.0, {"a": 1})  # today's run: never its own baseline

    assert previous_items(table, "d3", ["a", "b", "c", "d", "new"]) == {"a": 60, "b": 40, "c": 30, "d": 7}
    assert previous_items(table, "d3", []) == {}
