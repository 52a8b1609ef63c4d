"""The contract of the state table, the site queue and the result store.

Every test runs twice: against the AWS adapters on a moto server ("moto") and
against the in-memory stand-ins of `sim.memory` ("memory"). A difference
between the two is a bug in one of them: the fakes are what the unit tests and
the simulator trust (the queue is one model for both, `sim.queue`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import uuid
from decimal import Decimal

import pytest
from botocore.exceptions import ClientError

from fleet.aws.table import DynamoStateTable, wait_table_active
from fleet.errors import GridfleetError, StaleWrite
from fleet.outputs.results import result_key
from fleet.record import ops
from fleet.record.codec import HELD_PREFIX, OPEN_ATTR
from fleet.record.messages import BadMessage, QueueDepth, SiteMessage
from fleet.record.partition import NODE_ATTRS, HistoryEvent, NodeInfo, RunInfo, node_to_item
from fleet.record.run_item import RunWatch
from fleet.record.stamp import record_stamp
from fleet.record.state import Attempt, Counts, Reason, RunState, RunStatus, SiteRecord, SiteSpec, SiteStatus
from fleet.record.table import RunIndexEntry

NOW = 1_800_000_000.0
RUN = "20270115-0600-ab12"
OPTIONAL_ATTRIBUTES = (
    "instance_id",
    "lastUpdateEpoch",
    "heartbeatEpoch",
    "failure_reason",
    "error",
    "result_key",
    "url",
    "kill_reason",
    "kill_path",
    "expireAt",
)


def backends():
    """Parametrize `backend` over both implementations: the same contract holds for each."""
    return pytest.mark.parametrize("backend", ["moto", "memory"], indirect=True)


def seed(table, site: str = "s1", run_id: str = RUN, **spec_options) -> SiteRecord:
    rec = ops.new_site(run_id, site, SiteSpec(f"https://{site}.example.test/", "links", spec_options), 1_800_086_400)
    assert table.create_site(rec)
    return rec


def full_record(run_id: str = RUN, site: str = "s-full") -> SiteRecord:
    """A record with every field set, nested options and a closed and an open attempt."""
    options = {
        "depth": 2,
        "ratio": 0.25,
        "follow": True,
        "skip": None,
        "label": "",
        "tags": ["a", "b", 3],
        "nested": {"limits": {"pages": 50, "delay_s": 1.5}, "empty_map": {}, "empty_list": []},
    }
    return SiteRecord(
        run_id=run_id,
        site=site,
        spec=SiteSpec(
            "https://full.example.test/start?q=1", "links", options, incremental=True, rate_limit="shop", per_s=2.5
        ),
        run_status=RunStatus.RUN,
        site_status=SiteStatus.URL_CALL,
        attempt=2,
        instance_id="i-0abc",
        version=7,
        last_update=NOW + 12.5,
        heartbeat=NOW + 11.125,
        enqueued=True,
        failure_reason="hang",
        error="boom: 500",
        result_key=result_key(site, "20270115"),
        url="https://full.example.test/p/3",
        pages=3,
        items=16,
        kill_reason="hang",
        kill_path="watchdog",
        spot_requeues=1,
        attempts=(
            Attempt(1, "i-0old", NOW - 9, NOW - 4, "spot"),  # an attempt of an older node: no counts
            Attempt(
                1, "i-0aaa", NOW, NOW + 5.5, "hang", "local", Counts(12, 2, 1, 3, ("https://full.example.test/a",))
            ),
            Attempt(2, "i-0abc", NOW + 6.75, counts=Counts(items=4, pages=1)),
        ),
        expire_at=1_800_086_400,
        checkpoint={
            "next": "https://full.example.test/p/4",
            "pages": 3,
            "items": [{"id": f"it-{i}", "text": "x" * 20, "n": i, "score": 0.5} for i in range(30)],
        },
        mark=("it-0", "it-1", "old"),
    )


def run_info(run_id: str = RUN, started_at: float = NOW) -> RunInfo:
    return RunInfo(
        run_id=run_id, status="RUNNING", started_at=started_at, deadline_at=started_at + 21600, run_date="20270115"
    )


# --- state table: site records ---------------------------------------------------------------------


def test_create_site_is_put_if_absent(table):
    first = seed(table)
    other = dataclasses.replace(first, spec=SiteSpec("https://elsewhere.test/"), version=5)
    assert table.create_site(other) is False
    assert table.get_site(RUN, "s1") == first


def test_get_site_of_an_unknown_site_is_none(table):
    seed(table)
    assert table.get_site(RUN, "nope") is None
    assert table.get_site("other-run", "s1") is None


def test_every_field_of_a_site_record_round_trips(backend):
    rec = full_record()
    assert backend.table.create_site(rec)
    assert backend.table.get_site(RUN, "s-full") == rec
    raw = backend.raw_site(RUN, "s-full")
    # the names of the original design, and expireAt a number (the table's TTL attribute)
    assert (raw["attemptCount"], raw["lastUpdateEpoch"], raw["heartbeatEpoch"]) == (
        2,
        Decimal("1800000012.5"),
        Decimal("1800000011.125"),
    )
    assert isinstance(raw["expireAt"], Decimal) and raw["expireAt"] == 1_800_086_400


def test_absent_fields_are_absent_attributes(backend):
    rec = ops.new_site(RUN, "s-min", SiteSpec("http://min.test/"), None)
    assert backend.table.create_site(rec)
    assert backend.table.get_site(RUN, "s-min") == rec
    raw = backend.raw_site(RUN, "s-min")
    assert [k for k in OPTIONAL_ATTRIBUTES if k in raw] == []
    assert None not in raw.values()


def test_records_written_by_ops_read_back_equal(backend):
    table = backend.table
    rec = seed(table, depth=3, budget={"pages": 10, "bytes": 1.5e6})
    steps = [
        lambda r: ops.claim(table, r, "i-1", NOW),
        lambda r: ops.report(table, r, SiteStatus.RUNNING, NOW + 1.25),
        lambda r: ops.report(table, r, SiteStatus.URL_CALL, NOW + 2.5, url="https://s1.example.test/a", pages=1),
        lambda r: ops.beat(table, r, NOW + 3.125),
        lambda r: ops.report(table, r, SiteStatus.CALL_DONE, NOW + 4, pages=2),
        lambda r: ops.request_kill(table, r, Reason.HANG, NOW + 5),
        lambda r: ops.end_attempt(
            table,
            r,
            reason=Reason.HANG,
            now=NOW + 6,
            max_attempts=3,
            spot_cap=3,
            kill_path="local",
            error="page load hung",
        ),
        lambda r: ops.send_next(table, backend.queue, r),
        lambda r: ops.claim(table, r, "i-2", NOW + 7),
        lambda r: ops.complete(table, r, result_key("s1", "20270115"), NOW + 8),
    ]
    for step in steps:
        rec = step(rec)
        assert table.get_site(RUN, "s1") == rec
    assert (rec.run_status, rec.attempt, rec.version) == (RunStatus.COMPLETED, 2, 8)
    assert [(a.n, a.instance_id, a.outcome, a.kill_path) for a in rec.attempts] == [
        (1, "i-1", "hang", "local"),
        (2, "i-2", "completed", None),
    ]
    msg = backend.queue.receive(0, 30)
    assert isinstance(msg, SiteMessage) and (msg.run_id, msg.site, msg.attempt) == (RUN, "s1", 2)


def test_write_from_a_stale_record_raises_with_the_current_record(table):
    rec = seed(table)
    mine = ops.claim(table, rec, "i-1", NOW)
    with pytest.raises(StaleWrite) as e:
        ops.claim(table, rec, "i-2", NOW + 1)  # computed from the record before the first claim
    assert e.value.current == mine
    assert (e.value.run_id, e.value.site) == (RUN, "s1")
    assert table.get_site(RUN, "s1") == mine


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param({"instance_id": "i-zombie"}, id="instance"),
        pytest.param({"attempt": 2}, id="attempt"),
        pytest.param({"instance_id": None}, id="no-instance"),
    ],
)
def test_write_is_fenced_on_attempt_and_instance_too(table, forge):
    claimed = ops.claim(table, seed(table), "i-1", NOW)
    forged = dataclasses.replace(claimed, **forge)  # the right version, someone else's attempt
    with pytest.raises(StaleWrite) as e:
        ops.report(table, forged, SiteStatus.RUNNING, NOW + 1)
    assert e.value.current == claimed
    assert table.get_site(RUN, "s1") == claimed


def test_write_of_a_record_that_does_not_exist_is_stale(table):
    ghost = ops.new_site(RUN, "ghost", SiteSpec("https://ghost.test/"), None)
    with pytest.raises(StaleWrite) as e:
        ops.claim(table, ghost, "i-1", NOW)
    assert e.value.current is None
    assert table.get_site(RUN, "ghost") is None


def test_a_zombie_node_is_fenced_off_after_the_hub_marks_the_kill(table):
    node_view = ops.beat(table, ops.claim(table, seed(table), "i-1", NOW), NOW + 30)
    killed = ops.request_kill(table, table.get_site(RUN, "s1"), Reason.HANG, NOW + 31)
    with pytest.raises(StaleWrite) as e:
        ops.beat(table, node_view, NOW + 60)
    assert e.value.current == killed
    assert e.value.current.kill_reason == "hang"


@backends()
def test_a_write_that_changes_nothing_is_still_fenced(table):
    node_view = ops.beat(table, ops.claim(table, seed(table), "i-1", NOW), NOW + 30)
    ops.request_kill(table, table.get_site(RUN, "s1"), Reason.HANG, NOW + 31)
    # The zombie's check before it writes a result ("still ours?") is a heartbeat; its clock has not
    # moved past the millisecond of its last one, so the heartbeat attribute would not change.
    with pytest.raises(StaleWrite):
        ops.beat(table, node_view, NOW + 30.0004)


def test_a_write_that_clears_an_optional_field_removes_the_attribute(backend):
    table = backend.table
    rec = ops.claim(table, seed(table), "i-1", NOW)
    rec = ops.report(table, rec, SiteStatus.RUNNING, NOW + 1)
    rec = ops.report(table, rec, SiteStatus.URL_CALL, NOW + 2, url="https://s1.example.test/slow")
    rec = ops.request_kill(table, rec, Reason.HANG, NOW + 3)
    raw = backend.raw_site(RUN, "s1")
    assert (raw["kill_reason"], raw["url"]) == ("hang", "https://s1.example.test/slow")

    rec = ops.end_attempt(table, rec, reason=Reason.HANG, now=NOW + 4, max_attempts=3, spot_cap=3)
    raw = backend.raw_site(RUN, "s1")
    assert "kill_reason" not in raw and "url" not in raw
    assert raw["failure_reason"] == "hang"
    got = table.get_site(RUN, "s1")
    assert got == rec and got.kill_reason is None and got.url is None


def test_beat_moves_the_heartbeat_but_not_the_version(table):
    claimed = ops.claim(table, seed(table), "i-1", NOW)
    beaten = ops.beat(table, claimed, NOW + 30.5)
    got = table.get_site(RUN, "s1")
    assert got == beaten
    assert (got.version, got.heartbeat, got.last_update) == (claimed.version, NOW + 30.5, NOW)


def test_mark_enqueued_does_not_move_the_version(table):
    rec = seed(table)
    marked = ops.mark_enqueued(table, rec)
    got = table.get_site(RUN, "s1")
    assert got == marked and got.enqueued is True and got.version == rec.version


@backends()
def test_a_state_write_keeps_a_heartbeat_it_did_not_see(table):
    claimed = ops.claim(table, seed(table), "i-1", NOW)
    hub_view = table.get_site(RUN, "s1")
    ops.beat(table, claimed, NOW + 30)  # the node beats after the hub read; the version does not move
    ops.request_kill(table, hub_view, Reason.LOST, NOW + 31)  # still fenced right: same version
    got = table.get_site(RUN, "s1")
    assert got.kill_reason == "lost"
    assert got.heartbeat == NOW + 30


# --- state table: the run partition ---------------------------------------------------------------


def test_read_run_separates_the_run_item_sites_and_nodes(table):
    run = run_info()
    assert table.create_run(run)
    sites = [seed(table, s) for s in ("b-site", "a-site", "c.site_2")]
    nodes = [
        NodeInfo(
            RUN, "i-0001", "busy", NOW + 5.5, NOW, site="a-site", attempt=1, sites_done=2
        ),  # no expiry: the node role may not write one (the hub's `stamp_expiry` gives it)
        NodeInfo(RUN, "i-0002", "booting", NOW + 1, NOW + 0.25),
    ]
    for n in nodes:
        table.put_node(n)
    seed(table, "a-site", run_id="another-run")
    table.create_run(run_info("another-run"))

    rows = table.read_run(RUN)
    assert rows.run == run
    assert sorted(rows.sites, key=lambda r: r.site) == sorted(sites, key=lambda r: r.site)
    assert sorted(rows.nodes, key=lambda n: n.instance_id) == nodes


def test_read_run_of_an_unknown_run_is_empty(table):
    rows = table.read_run("never-ran")
    assert (rows.run, rows.sites, rows.nodes) == (None, [], [])
    assert table.get_run("never-ran") is None


def test_read_run_reads_every_page_of_a_large_run(backend):
    table = backend.table
    table.create_run(run_info())
    blob = "x" * 10_000  # 120 records of ~10 KB: more than one 1 MB Query page
    expected = {}
    for i in range(120):
        rec = ops.new_site(RUN, f"site-{i:03d}", SiteSpec("https://big.test/", "links", {"blob": blob, "i": i}), None)
        assert table.create_site(rec)
        expected[rec.site] = rec
    if backend.name == "moto":
        backend.calls.clear()

    rows = table.read_run(RUN)
    assert rows.run == run_info()
    assert len(rows.sites) == 120
    assert {r.site: r for r in rows.sites} == expected
    if backend.name == "moto":
        assert backend.calls.get("Query", 0) >= 2, "the run fit in one page; the test does not test paging"


def test_node_items_are_overwritten_by_put_node(table):
    table.create_run(run_info())
    table.put_node(NodeInfo(RUN, "i-0001", "booting", NOW, NOW))
    busy = NodeInfo(RUN, "i-0001", "busy", NOW + 20, NOW, site="a", attempt=1, error="e", stats={"completed": 1})
    table.put_node(busy)
    assert table.read_run(RUN).nodes == [busy]
    later = NodeInfo(RUN, "i-0001", "idle", NOW + 40, NOW, sites_done=1)
    table.put_node(later)  # what it no longer holds (site, attempt, error, stats) is gone
    assert table.read_run(RUN).nodes == [later]


def test_every_attribute_of_a_node_item_is_one_its_update_names():
    """put_node is an UpdateItem of NODE_ATTRS (the node role may not put whole items): an attribute node_to_item
    writes outside that list would never be written, nor removed."""
    full = NodeInfo(RUN, "i-0001", "busy", NOW, NOW, site="a", attempt=1, expire_at=9, error="e", stats={"x": 1})
    assert set(node_to_item(full)) == {"run_id", "Site", *NODE_ATTRS}


def test_create_run_is_put_if_absent_and_indexes_the_run(table):
    first = run_info(started_at=NOW)
    assert table.create_run(first)
    assert table.create_run(dataclasses.replace(first, status="FINISHED", started_at=NOW + 99)) is False
    assert table.get_run(RUN) == first
    assert table.list_runs() == [RunIndexEntry(RUN, NOW)]


def test_list_runs_is_ordered_by_start(table):
    for run_id, started in (("r-middle", NOW + 100), ("r-last", NOW + 200.5), ("r-first", NOW)):
        assert table.create_run(run_info(run_id, started))
    assert table.list_runs() == [
        RunIndexEntry("r-first", NOW),
        RunIndexEntry("r-middle", NOW + 100),
        RunIndexEntry("r-last", NOW + 200.5),
    ]
    assert table.read_run("r-first").sites == []  # the index is not part of any run


def test_update_run_sets_fields(table):
    run = run_info()
    table.create_run(run)
    table.update_run(RUN, hub_id="hub-a", hub_heartbeat=NOW + 10.5)
    assert table.get_run(RUN) == dataclasses.replace(run, hub_id="hub-a", hub_heartbeat=NOW + 10.5)
    table.update_run(
        RUN,
        status="FINISHED",
        finished_at=NOW + 3600.25,
        expire_at=1_800_090_000,
        deadline_at=NOW + 7200,
        hub_heartbeat=NOW + 3600,
    )
    assert table.get_run(RUN) == dataclasses.replace(
        run,
        hub_id="hub-a",
        hub_heartbeat=NOW + 3600,
        status="FINISHED",
        finished_at=NOW + 3600.25,
        expire_at=1_800_090_000,
        deadline_at=NOW + 7200,
    )
    assert table.get_run(RUN).finished


def test_add_launched_is_atomic(table):
    table.create_run(run_info())
    threads = [
        threading.Thread(target=lambda k=k: [table.add_launched(RUN, k) for _ in range(5)]) for k in (1, 2, 3, 1, 2, 3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert table.get_run(RUN).nodes_launched == 5 * (1 + 2 + 3) * 2
    assert table.read_run(RUN).run.status == "RUNNING"  # the other attributes are untouched


@backends()
def test_add_launched_on_an_unknown_run_creates_no_run_item(table):
    with contextlib.suppress(Exception):
        table.add_launched("never-ran", 1)
    assert table.get_run("never-ran") is None
    assert table.read_run("never-ran").run is None


# --- state table: the watchdog's bookkeeping on the run item -----------------------------------------------


def test_the_watchdogs_fields_round_trip_and_leave_the_run_alone(table):
    run = dataclasses.replace(run_info(), hub_heartbeat=NOW + 10.5)
    table.create_run(run)
    assert table.get_run_watch(RUN) == RunWatch(run)
    assert table.update_watch(RUN, {"seen_hb": None}, seen_hb="1800000010.5", seen_since=NOW + 1.25) is True
    assert table.get_run_watch(RUN) == RunWatch(run, "1800000010.5", NOW + 1.25)
    assert table.get_run(RUN) == run
    table.update_run(RUN, hub_heartbeat=NOW + 20)  # the hub's writes leave the watchdog's fields be
    assert table.get_run_watch(RUN).seen_since == NOW + 1.25
    assert table.get_run_watch("never-ran") is None


def test_update_watch_holds_only_while_the_run_item_is_as_expected(table):
    table.create_run(dataclasses.replace(run_info(), hub_heartbeat=NOW))
    table.update_watch(RUN, {}, seen_hb="a", seen_since=NOW + 1)
    read = table.get_run_watch(RUN)
    expect = {
        "status": RunState.RUNNING,
        "hub_heartbeat": read.run.hub_heartbeat,
        "seen_hb": "a",
        "seen_since": NOW + 1,
        "restart_at": None,
    }
    for wrong in (
        {"status": RunState.FINISHED},
        {"hub_heartbeat": NOW + 1},
        {"hub_heartbeat": None},
        {"seen_hb": "b"},
        {"seen_hb": None},
        {"seen_since": NOW + 2},
        {"restart_at": NOW},
    ):
        assert table.update_watch(RUN, {**expect, **wrong}, restart_at=NOW + 5) is False, wrong
        assert table.get_run_watch(RUN) == read, wrong
    assert table.update_watch(RUN, expect, restart_at=NOW + 5, seen_since=NOW + 5) is True
    assert table.update_watch(RUN, expect, restart_at=NOW + 6) is False  # what was read is gone: one winner
    assert table.get_run_watch(RUN) == dataclasses.replace(read, seen_since=NOW + 5, restart_at=NOW + 5)
    assert table.update_watch(RUN, {"restart_at": NOW + 5}, seen_since=NOW + 1, restart_at=None) is True
    assert table.get_run_watch(RUN) == read  # None removed the field


def test_the_watchdog_writes_nothing_on_a_run_without_its_item(table):
    assert table.update_watch("never-ran", {}, seen_hb="a", seen_since=NOW) is False
    assert table.update_watch("never-ran", {"seen_hb": None}, seen_hb="a") is False
    table.add_hub_start("never-ran")  # a hub started before its run item exists: nothing to count on yet
    assert table.get_run_watch("never-ran") is None
    assert table.read_run("never-ran").run is None


def test_hub_starts_are_counted_on_the_run_item(table):
    table.create_run(run_info())
    table.add_hub_start(RUN)
    table.add_hub_start(RUN)
    assert table.get_run_watch(RUN).hub_starts == 2
    assert table.get_run(RUN) == run_info()


def test_running_runs_are_the_running_ones_among_the_last_of_the_index(table):
    for run_id, started in (("r-first", NOW), ("r-done", NOW + 100), ("r-last", NOW + 200)):
        assert table.create_run(run_info(run_id, started))
    table.update_run("r-done", status=RunState.FINISHED, finished_at=NOW + 150)
    assert [w.run.run_id for w in table.running_runs(3)] == ["r-first", "r-last"]
    assert [w.run.run_id for w in table.running_runs(2)] == ["r-last"]
    assert [w.run.status for w in table.running_runs(10)] == [RunState.RUNNING] * 2


# --- state table: the hub's reads of what moved -------------------------------------------------------------


def stamp(rec: SiteRecord) -> tuple:
    """What open_stamps says of a record (`fleet.record.codec.STAMP_ATTRS`)."""
    return record_stamp(rec)


def seed_partition(table, run_id: str = RUN) -> None:
    """The items of a run that are not site records: the run item, node items, history."""
    table.create_run(run_info(run_id))
    table.put_node(NodeInfo(run_id, "i-0001", "busy", NOW + 5.5, NOW, site="a", attempt=1))
    table.add_history([HistoryEvent(run_id, NOW + 1.5, "launch", {"count": 2})])


def test_open_stamps_follow_the_sites_that_can_still_change(backend):
    table = backend.table
    seed_partition(table)
    recs = {s: seed(table, s) for s in ("a", "b", "c")}
    seed(table, "a", run_id="another-run")
    # Sites as seeded are the hub's to send: they sort apart in the index, and its Query leaves them out.
    assert table.open_stamps(RUN) == {} and table.has_held(RUN)
    assert backend.raw_site(RUN, "c")[OPEN_ATTR] == HELD_PREFIX + "c"
    recs["a"] = ops.mark_enqueued(table, recs["a"])  # sent: in the Query from now on
    assert table.open_stamps(RUN) == {"a": stamp(recs["a"])} and backend.raw_site(RUN, "a")[OPEN_ATTR] == "a"
    assert stamp(recs["a"]) == (0, None, "QUEUED", None, 0, "PENDING", None, None, True, 0, None)

    recs["a"] = ops.claim(table, recs["a"], "i-0001", NOW)  # QUEUED -> RUN: still open
    recs["b"] = ops.mark_enqueued(table, recs["b"])
    opened = {s: stamp(recs[s]) for s in ("a", "b")}
    assert table.open_stamps(RUN) == opened
    assert table.open_stamps(RUN)["a"][:4] == (1, "i-0001", "RUN", None) and table.open_stamps(RUN)["b"][8] is True

    beaten = ops.beat(table, recs["a"], NOW + 30.5)  # the heartbeat moves, the version does not
    assert table.open_stamps(RUN)["a"] == stamp(beaten) and stamp(beaten)[4] == recs["a"].version
    recs["a"] = beaten
    recs["a"] = ops.report(table, recs["a"], SiteStatus.RUNNING, NOW + 31)
    recs["a"] = ops.report(table, recs["a"], SiteStatus.URL_CALL, NOW + 32, url="https://a.test/p/2", pages=1)
    assert table.open_stamps(RUN)["a"] == stamp(recs["a"])  # progress: the hub patches its copy from this

    done = ops.complete(table, recs["a"], result_key("a", "20270115"), NOW + 40)
    assert "a" not in table.open_stamps(RUN)
    assert OPEN_ATTR not in backend.raw_site(RUN, "a")
    assert table.get_site(RUN, "a") == done  # closed, not gone

    reopened = ops.reopen(table, done, NOW + 50)
    assert table.open_stamps(RUN) == {"a": stamp(reopened), "b": stamp(recs["b"])}
    assert backend.raw_site(RUN, "a")[OPEN_ATTR] == "a"
    ended = ops.fail_now(table, recs["c"], Reason.DEADLINE, NOW + 60)  # the last held one, ended by its hub
    assert not table.has_held(RUN) and OPEN_ATTR not in backend.raw_site(RUN, "c") and ended.is_terminal
    assert table.open_stamps("another-run") == {} and table.has_held("another-run")
    assert table.open_stamps("never-ran") == {} and not table.has_held("never-ran")


def test_open_stamps_read_every_page(backend, monkeypatch):
    table = backend.table
    seed_partition(table)
    expected = {}
    for i in range(40):
        rec = ops.mark_enqueued(table, seed(table, f"site-{i:02d}"))  # sent: a site as seeded is not in the Query
        if i % 3 == 0:
            rec = ops.claim(table, rec, "i-0001", NOW + i)
        if i % 5 == 0:
            ops.complete(
                table,
                ops.claim(table, rec, "i-0001", NOW + i) if i % 3 else rec,
                result_key(rec.site, "20270115"),
                NOW + 100,
            )
            continue
        expected[rec.site] = stamp(rec)
    seen: list[str] = []
    if backend.name == "moto":
        table.page_size = 4  # 32 open sites (8 of the 40 are closed): 8 pages of 4
        client = table._c
        real_query = client.query

        def query(**kwargs):
            page = real_query(**kwargs)
            seen.extend(i["Site"]["S"] for i in page.get("Items", []))
            return page

        monkeypatch.setattr(client, "query", query)

    assert table.open_stamps(RUN) == expected
    if backend.name == "moto":
        assert sorted(seen) == sorted(expected), "a site came back twice, or a page was skipped"
        assert len(seen) > table.page_size


def test_get_sites_reads_many_records_in_the_order_asked(backend):
    table = backend.table
    seed_partition(table)
    recs = {}
    for i in range(250):  # more than two BatchGetItem calls (100 keys each)
        rec = seed(table, f"site-{i:03d}", i=i)
        if i % 7 == 0:
            rec = ops.beat(table, ops.claim(table, rec, f"i-{i:04d}", NOW + i), NOW + i + 0.25)
        recs[rec.site] = rec
    names = [f"site-{i:03d}" for i in reversed(range(250))]
    asked = names[:120] + ["unknown"] + names[120:] + ["also-unknown"]
    if backend.name == "moto":
        backend.calls.clear()

    got = table.get_sites(RUN, asked)

    assert [r.site for r in got] == names
    assert got == [table.get_site(RUN, s) for s in names] == [recs[s] for s in names]
    if backend.name == "moto":
        assert backend.calls.get("BatchGetItem", 0) >= 3
    assert table.get_sites(RUN, []) == []
    assert table.get_sites("never-ran", names[:3]) == []
    assert table.get_sites(RUN, iter(["site-007", "site-003"])) == [recs["site-007"], recs["site-003"]]


@pytest.mark.parametrize("backend", ["moto"], indirect=True)
def test_get_sites_retries_the_keys_left_unprocessed(backend, monkeypatch):
    """moto only: DynamoDB may answer part of a BatchGetItem (throttling, 16 MB); the rest is asked again."""
    table = backend.table
    recs = [seed(table, f"site-{i:03d}") for i in range(150)]
    client, real = table._c, table._c.batch_get_item
    asked: list[int] = []

    def halving(RequestItems):  # noqa: N803 - boto3's parameter name
        (spec,) = RequestItems.values()
        keys = spec["Keys"]
        assert spec["ConsistentRead"] is True
        asked.append(len(keys))
        if len(keys) == 1:
            return real(RequestItems=RequestItems)
        half = len(keys) // 2
        out = real(RequestItems={table.name: {**spec, "Keys": keys[:half]}})
        return {**out, "UnprocessedKeys": {table.name: {**spec, "Keys": keys[half:]}}}

    monkeypatch.setattr("fleet.aws.table.time.sleep", lambda s: None)
    monkeypatch.setattr(client, "batch_get_item", halving)
    assert table.get_sites(RUN, [r.site for r in recs]) == recs
    assert asked[:4] == [100, 50, 25, 13] and len(asked) == 8 + 7

    monkeypatch.setattr(
        client,
        "batch_get_item",
        lambda RequestItems: {  # noqa: N803
            "Responses": {},
            "UnprocessedKeys": RequestItems,
        },
    )
    with pytest.raises(GridfleetError, match="100 keys still unprocessed after 8 retries"):
        table.get_sites(RUN, [r.site for r in recs])


def test_checkpoints_are_written_compressed_and_cleared_when_the_site_completes(backend):
    table = backend.table
    rec = ops.claim(table, seed(table), "i-1", NOW)
    items = [{"id": f"a-{i}", "text": "same words again " * 4} for i in range(200)]
    rec = ops.save_checkpoint(
        table,
        rec,
        NOW + 1,
        ops.Progress(SiteStatus.CALL_DONE, NOW + 0.5, "u", 2),
        {"next": "tok-3", "pages": 2, "items": items},
    )
    back = table.get_site(RUN, "s1")
    assert back == rec and back.checkpoint["items"] == items and back.site_status is SiteStatus.CALL_DONE
    assert ops.resumable(back) == back.checkpoint
    raw = backend.raw_site(RUN, "s1")["checkpoint"]
    assert raw.startswith("z:") and len(raw) < len(str(items)) / 5  # stored compressed
    done = ops.complete(table, back, "s1/20270115/result.json", NOW + 2)
    assert done.checkpoint is None and "checkpoint" not in backend.raw_site(RUN, "s1")


def test_a_checkpoint_too_large_for_an_item_keeps_no_items_and_is_not_resumed_from(backend, monkeypatch):
    monkeypatch.setattr(ops, "CHECKPOINT_MAX_CHARS", 200)
    table = backend.table
    rec = ops.claim(table, seed(table), "i-1", NOW)
    rec = ops.save_checkpoint(
        table, rec, NOW + 1, None, {"next": "p9", "pages": 8, "items": [{"id": str(i)} for i in range(500)]}
    )
    assert table.get_site(RUN, "s1").checkpoint == {"next": "p9", "pages": 8, "items": [], "partial": True}
    assert ops.resumable(rec) is None


def test_high_water_marks_outlive_runs_and_are_read_in_batches(backend):
    table = backend.table
    for i in range(120):
        table.put_mark(f"site-{i:03d}", (f"new-{i}", "older"), "run-a", NOW + i)
    table.put_mark("site-000", ("newest",), "run-b", NOW + 500)
    got = table.get_marks([f"site-{i:03d}" for i in range(130)])
    assert len(got) == 120 and got["site-000"] == ("newest",) and got["site-007"] == ("new-7", "older")
    assert table.get_marks([]) == {}


def test_history_lines_are_written_in_batches_and_read_back_in_order(backend):
    table = backend.table
    table.create_run(run_info(RUN))
    events = [HistoryEvent(RUN, NOW + i, "kill", {"site": f"s{i}", "attempt": 1}, seq=i) for i in range(60)]
    if backend.name == "moto":
        backend.calls.clear()
    table.add_history(events)
    table.add_history([])
    got = table.read_run(RUN).history
    assert [(h.kind, h.fields["site"]) for h in got] == [("kill", f"s{i}") for i in range(60)]
    if backend.name == "moto":
        assert backend.calls.get("BatchWriteItem") == 3 and "PutItem" not in backend.calls  # 25 + 25 + 10


@pytest.mark.parametrize("backend", ["moto"], indirect=True)
def test_history_writes_left_unprocessed_are_sent_again(backend, monkeypatch):
    """moto only: DynamoDB may leave part of a BatchWriteItem unprocessed (throttling); it is sent again."""
    table = backend.table
    client, real = table._c, table._c.batch_write_item
    sizes: list[int] = []

    def halving(RequestItems):  # noqa: N803 - boto3's parameter name
        (requests,) = RequestItems.values()
        sizes.append(len(requests))
        half = (len(requests) + 1) // 2
        out = real(RequestItems={table.name: requests[:half]})
        rest = requests[half:]
        return {**out, "UnprocessedItems": {table.name: rest} if rest else {}}

    monkeypatch.setattr("fleet.aws.table.time.sleep", lambda s: None)
    monkeypatch.setattr(client, "batch_write_item", halving)
    table.add_history([HistoryEvent(RUN, NOW + i, "launch", {"n": i}, seq=i) for i in range(20)])
    assert sizes == [20, 10, 5, 2, 1] and len(table.read_run(RUN).history) == 20

    monkeypatch.setattr(
        client,
        "batch_write_item",
        lambda RequestItems: {  # noqa: N803
            "UnprocessedItems": RequestItems
        },
    )
    with pytest.raises(GridfleetError, match="3 writes still unprocessed after 8 retries"):
        table.add_history([HistoryEvent(RUN, NOW + i, "launch", {}, seq=100 + i) for i in range(3)])


def test_read_nodes_reads_only_the_node_items(table):
    seed_partition(table)
    for s in ("a", "node-b", "z"):
        seed(table, s)
    later = NodeInfo(RUN, "i-0001", "idle", NOW + 60, NOW, sites_done=1)
    other = NodeInfo(RUN, "i-0000", "booting", NOW + 2, NOW + 1.25)
    table.put_node(later)  # overwrites the one seed_partition put
    table.put_node(other)
    table.put_node(NodeInfo("another-run", "i-0002", "busy", NOW, NOW))

    assert table.read_nodes(RUN) == [other, later]
    assert table.read_nodes(RUN) == sorted(table.read_run(RUN).nodes, key=lambda n: n.instance_id)
    assert table.read_nodes("never-ran") == []


def test_open_stamps_on_a_table_without_the_index(shared_clients, caplog):
    """moto only: a table made before the index existed is read whole instead, and a warning says so once."""
    ddb = shared_clients.client("dynamodb")
    name = f"t-old-{uuid.uuid4().hex}"
    ddb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "run_id", "KeyType": "HASH"}, {"AttributeName": "Site", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "run_id", "AttributeType": "S"},
            {"AttributeName": "Site", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    wait_table_active(ddb, name)
    table = DynamoStateTable(ddb, name, page_size=3)
    seed_partition(table)
    a = ops.beat(table, ops.claim(table, seed(table, "a"), "i-0001", NOW), NOW + 9.5)
    b = ops.mark_enqueued(table, seed(table, "b"))
    ops.complete(table, ops.claim(table, seed(table, "c"), "i-0001", NOW), result_key("c", "20270115"), NOW + 1)
    seed(table, "a", run_id="another-run")

    with caplog.at_level(logging.WARNING, logger="gridfleet.table"):
        assert table.open_stamps(RUN) == {"a": stamp(a), "b": stamp(b)}
        assert table.open_stamps(RUN) == {"a": stamp(a), "b": stamp(b)}
    warnings = [r for r in caplog.records if r.name == "gridfleet.table"]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert name in warnings[0].getMessage() and "bootstrap" in warnings[0].getMessage()


# --- queue ----------------------------------------------------------------------------------------------


def test_send_then_receive(queue):
    queue.send(RUN, "s1", 1)
    msg = queue.receive(0, 30)
    assert isinstance(msg, SiteMessage)
    assert (msg.run_id, msg.site, msg.attempt, msg.receive_count) == (RUN, "s1", 1, 1)
    assert msg.receipt and msg.message_id
    assert queue.receive(0, 30) is None


def test_receive_on_an_empty_queue_is_none(queue):
    assert queue.receive(0, 30) is None
    assert queue.depth() == QueueDepth(0, 0, 0)


def test_a_received_message_is_invisible_until_its_visibility_runs_out(backend):
    q = backend.queue
    q.send(RUN, "short", 1)
    q.send(RUN, "extended", 1)
    short, extended = q.receive(0, 1), q.receive(0, 1)
    assert {short.site, extended.site} == {"short", "extended"}
    if short.site != "short":
        short, extended = extended, short
    assert q.receive(0, 1) is None
    assert q.depth() == QueueDepth(0, 2, 0)
    q.set_visibility(extended, 30)  # what a node's heartbeat does for the message it works on

    backend.elapse(1.3)
    again = q.receive(0, 30)
    assert isinstance(again, SiteMessage)
    assert (again.site, again.receive_count) == ("short", 2)
    assert again.message_id == short.message_id and again.receipt != short.receipt
    assert q.receive(0, 30) is None  # the extended one is still in flight
    assert q.depth() == QueueDepth(0, 2, 0)


def test_set_visibility_zero_makes_it_receivable_at_once(queue):
    queue.send(RUN, "s1", 1)
    first = queue.receive(0, 30)
    queue.set_visibility(first, 0)
    again = queue.receive(0, 30)
    assert isinstance(again, SiteMessage)
    assert (again.site, again.attempt) == ("s1", 1)
    assert again.receive_count == first.receive_count + 1


def test_delete_removes_the_message(queue):
    queue.send(RUN, "s1", 1)
    msg = queue.receive(0, 30)
    queue.delete(msg)
    queue.set_visibility(msg, 0)  # a receipt of a deleted message is no error
    queue.delete(msg)
    assert queue.receive(0, 30) is None
    assert queue.depth() == QueueDepth(0, 0, 0)


def test_send_many_delivers_every_item(queue):
    items = [(RUN, f"site-{i:02d}", 1 + i % 3) for i in range(25)]
    queue.send_many(items)
    assert queue.depth() == QueueDepth(25, 0, 0)
    got = []
    for _ in range(25):
        msg = queue.receive(0, 30)
        assert isinstance(msg, SiteMessage)
        got.append((msg.run_id, msg.site, msg.attempt))
    assert sorted(got) == sorted(items)
    assert queue.receive(0, 30) is None
    assert queue.depth() == QueueDepth(0, 25, 0)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param("this is not json", id="not-json"),
        pytest.param('{"run_id": "r", "site": "s"}', id="no-attempt"),
        pytest.param('{"run_id": "r", "site": "s", "attempt": 0}', id="attempt-0"),
        pytest.param('["r", "s", 1]', id="a-list"),
    ],
)
def test_a_body_that_is_not_a_site_message_comes_back_as_bad_message(backend, body):
    backend.send_raw(backend.queue, body)
    msg = backend.queue.receive(0, 30)
    assert isinstance(msg, BadMessage)
    assert (msg.body, msg.receive_count) == (body, 1)
    assert msg.receipt and msg.message_id and msg.problem


def test_a_poison_message_goes_to_the_dlq_after_max_receive_count(backend):
    q = backend.new_queue(2)
    backend.send_raw(q, "poison")
    counts = []
    for _ in range(2):
        bad = q.receive(0, 30)
        assert isinstance(bad, BadMessage)
        counts.append(bad.receive_count)
        q.set_visibility(bad, 0)  # what a node does with it: give it back
    assert counts == [1, 2]
    assert q.receive(0, 30) is None  # the third receive moves it to the DLQ instead of delivering it
    assert q.depth() == QueueDepth(0, 0, 1)
    q.send(RUN, "s1", 1)  # the queue goes on working
    assert isinstance(q.receive(0, 30), SiteMessage)
    assert q.depth() == QueueDepth(0, 1, 1)


def test_depth_counts_visible_and_in_flight_messages(queue):
    for i in range(4):
        queue.send(RUN, f"s{i}", 1)
    assert queue.depth() == QueueDepth(4, 0, 0)
    a, b = queue.receive(0, 30), queue.receive(0, 30)
    assert queue.depth() == QueueDepth(2, 2, 0)
    queue.delete(a)
    assert queue.depth() == QueueDepth(2, 1, 0)
    queue.set_visibility(b, 0)
    assert queue.depth() == QueueDepth(3, 0, 0)


# --- results -----------------------------------------------------------------------------------------------


def test_put_new_writes_once(results):
    key = result_key("s1", "20270115")
    assert key == "s1/20270115/result.json"
    assert results.exists(key) is False
    assert results.put_new(key, b'{"pages": 3}') is True
    assert results.exists(key) is True
    assert results.put_new(key, b'{"pages": 99, "zombie": true}') is False
    assert results.get(key) == b'{"pages": 3}'


def test_results_of_other_keys_are_independent(results):
    assert results.put_new(result_key("s1", "20270115"), b"one")
    assert results.put_new(result_key("s1", "20270116"), b"two")
    assert results.put_new(result_key("s2", "20270115"), b"three")
    assert results.get(result_key("s1", "20270116")) == b"two"
    assert results.exists(result_key("s3", "20270115")) is False


def test_an_empty_body_is_a_result(results):
    key = result_key("s-empty", "20270115")
    assert results.put_new(key, b"") is True
    assert results.exists(key)
    assert results.get(key) == b""
    assert results.put_new(key, b"{}") is False


def test_evidence_is_written_beside_the_result_replaced_by_a_later_capture_and_listed(results):
    from fleet.outputs.results import evidence_key, evidence_prefix, parse_evidence_key

    key = evidence_key("s-ev", "20270115", None, 2, "evidence.json")
    results.put_evidence(key, b'{"answered": false}', "application/json")
    results.put_evidence(key, b'{"answered": true}', "application/json")  # the same attempt captured again
    assert results.get(key) == b'{"answered": true}'
    assert results.exists(result_key("s-ev", "20270115")) is False  # evidence is not a result
    prefix = evidence_prefix("s-ev", "20270115")
    assert [parse_evidence_key(prefix, k) for k in results.keys(prefix)] == [(2, "evidence.json")]


def test_results_carry_the_tag_the_expiry_rule_selects(moto_endpoint):
    """moto only: the tag is what infra/terraform's lifecycle rule filters on (results share no prefix)."""
    from fleet.aws.bootstrap import ensure_resources
    from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
    from fleet.aws.results import RESULT_TAG, S3ResultStore
    from fleet.config.aws import AwsConfig

    hx = uuid.uuid4().hex[:10]
    clients = AwsClients(
        AwsConfig(endpoint_url=moto_endpoint, table=f"t-{hx}", queue=f"q-{hx}", bucket=f"b-{hx}"),
        credentials=LOCAL_CREDENTIALS,
    )
    ensure_resources(clients, 30)
    S3ResultStore(clients.client("s3"), f"b-{hx}").put_new("s1/20261121/result.json", b"{}")
    tags = clients.client("s3").get_object_tagging(Bucket=f"b-{hx}", Key="s1/20261121/result.json")["TagSet"]
    assert [f"{t['Key']}={t['Value']}" for t in tags] == [RESULT_TAG]
    evidence = "s1/20261121/evidence/1/page.html"  # evidence expires with the results it explains
    S3ResultStore(clients.client("s3"), f"b-{hx}").put_evidence(evidence, b"<p>x</p>", "text/html; charset=utf-8")
    tags = clients.client("s3").get_object_tagging(Bucket=f"b-{hx}", Key=evidence)["TagSet"]
    assert [f"{t['Key']}={t['Value']}" for t in tags] == [RESULT_TAG]


def test_what_a_node_writes_is_a_new_object_only_and_a_part_a_missing_one_is_no_such_key(results):
    from fleet.outputs.results import part_key

    key = part_key("s-pt", "20270115", None, 1, 4, 1, "local:i-0aaa")
    assert results.put_staged(key, b'[{"id":"a"}]')
    assert not results.put_staged(key, b'[{"id":"a"},{"id":"b"}]')  # never replaced: the first stays
    assert results.get(key) == b'[{"id":"a"}]'
    assert results.exists(result_key("s-pt", "20270115")) is False  # a part is not a result
    with pytest.raises(ClientError) as missing:
        results.get(part_key("s-pt", "20270115", None, 1, 4, 2, "local:i-0aaa"))
    assert missing.value.response["Error"]["Code"] == "NoSuchKey"


def test_a_staged_result_is_promoted_once_never_over_a_result_and_nothing_staged_is_missing(results):
    from fleet.outputs.results import EXISTED, MISSING, PROMOTED, staged_result_key

    staged = staged_result_key("local:i-0aaa", "s-pr", "20270115", None, 1, 3)
    key = result_key("s-pr", "20270115")
    assert results.promote(staged, key) == MISSING and not results.exists(key)
    assert results.put_staged(staged, b'{"items": [1]}')
    assert results.promote(staged, key) == PROMOTED and results.get(key) == b'{"items": [1]}'
    other = staged_result_key("local:i-0bbb", "s-pr", "20270115", None, 2, 9)
    results.put_staged(other, b'{"items": [2]}')
    assert results.promote(other, key) == EXISTED and results.get(key) == b'{"items": [1]}'
    with pytest.raises(ValueError):  # the hub copies to a result's key only, never to its config or bundle
        results.promote(staged, "hub/fleet.yaml")


def test_promoted_results_carry_the_result_tag_and_type_whatever_the_node_wrote(moto_endpoint):
    """moto only: the hub's copy is tagged for the results' expiry rule and typed as JSON; the node's write has no
    tag (the node role may tag nothing: its prefix's own rule expires it)."""
    from fleet.aws.bootstrap import ensure_resources
    from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
    from fleet.aws.results import RESULT_TAG, S3ResultStore
    from fleet.config.aws import AwsConfig
    from fleet.outputs.results import staged_result_key

    hx = uuid.uuid4().hex[:10]
    clients = AwsClients(
        AwsConfig(endpoint_url=moto_endpoint, table=f"t-{hx}", queue=f"q-{hx}", bucket=f"b-{hx}"),
        credentials=LOCAL_CREDENTIALS,
    )
    ensure_resources(clients, 30)
    s3, store = clients.client("s3"), S3ResultStore(clients.client("s3"), f"b-{hx}")
    staged = staged_result_key("AROAX:i-0aaa", "s1", "20261121", None, 1, 3)
    store.put_staged(staged, b"{}", "text/html")
    assert s3.get_object_tagging(Bucket=f"b-{hx}", Key=staged)["TagSet"] == []
    store.promote(staged, result_key("s1", "20261121"))
    key = result_key("s1", "20261121")
    tags = s3.get_object_tagging(Bucket=f"b-{hx}", Key=key)["TagSet"]
    assert [f"{t['Key']}={t['Value']}" for t in tags] == [RESULT_TAG]
    assert s3.head_object(Bucket=f"b-{hx}", Key=key)["ContentType"] == "application/json"


@backends()
def test_a_transition_from_a_copy_older_than_the_sent_mark_writes_enqueued_as_it_is(backend):
    """The enqueued mark moves no version: a node may claim from a copy read before the hub marked the message
    sent. Its claim, and its end of the attempt, must not leave the mark standing: a QUEUED site marked sent whose
    message is gone is never sent again (the node's end of an attempt with a backoff sends none)."""
    table = backend.table
    rec = seed(table, site="s-mark")
    node_copy = table.get_site(RUN, "s-mark")  # read before the hub's mark
    ops.mark_enqueued(table, rec)  # the hub sent the first message and marks it, the version unmoved
    assert table.get_site(RUN, "s-mark").enqueued
    claimed = ops.claim(table, node_copy, "i-0aaa", NOW)
    assert not table.get_site(RUN, "s-mark").enqueued
    ops.end_attempt(table, claimed, reason=Reason.ERROR, now=NOW + 1, max_attempts=3, spot_cap=3)
    after = table.get_site(RUN, "s-mark")
    assert after.run_status is RunStatus.QUEUED and not after.enqueued


# --- what a node wrote, read back: reading is total -------------------------------------------------------------

#: Values of every DynamoDB type, none of which the attribute they are put in can hold (the fuzzer in
#: tests/adapter/test_hostile_node.py draws them at random; these are the shapes each reader must survive).
WRONG = {
    "run_status": "BOGUS",
    "site_status": Decimal(3),
    "attemptCount": "x",
    "pages": "x",
    "attempts": "x",
    "heartbeatEpoch": {"m": [1]},
    "lastUpdateEpoch": True,
    "url": Decimal("1e30"),
    "error": ["a"],
    "checkpoint": "z:!!!not base64",
    "items": Decimal("-1"),
    "kill_path": b"\x00",
    "failure_class": {"SS"},
    "retry_at": "soon",
}


@backends()
def test_no_read_raises_on_what_a_node_wrote_and_each_unreadable_value_reads_as_absent(backend):
    table = backend.table
    table.create_run(run_info())
    good = seed(table, "good")
    victim = seed(table, "victim")
    ops.claim(table, victim, "i-0aaa", NOW)
    for attr in ("pages", "attempts", "heartbeatEpoch", "lastUpdateEpoch", "url", "error", "checkpoint", "items"):
        backend.scribble(RUN, "victim", {attr: WRONG[attr]})  # values that leave the fence and status readable
    backend.scribble(RUN, "junk", {"run_status": "RUN", "openSite": "junk", "version": Decimal(1)})  # no spec
    backend.scribble(RUN, "#node#i-0bad", {"node_state": 7, "heartbeatEpoch": "never"})
    backend.scribble(RUN, "#node#../x", {"node_state": "idle"})
    backend.scribble(RUN, "#h#0000000000001#000001", {"kind": "forged"})  # history lives in the hub's partition
    rows = table.read_run(RUN)
    assert sorted(r.site for r in rows.sites) == ["good", "victim"] and rows.run is not None
    rec = next(r for r in rows.sites if r.site == "victim")
    assert (rec.run_status, rec.attempt, rec.instance_id) == (RunStatus.RUN, 1, "i-0aaa")
    assert (rec.pages, rec.attempts, rec.heartbeat, rec.url, rec.error, rec.checkpoint, rec.items) == (
        0, (), None, None, None, None, None
    )  # fmt: skip
    assert [n.instance_id for n in rows.nodes] == ["i-0bad"] and rows.nodes[0].state == "booting"
    noted = {(u.key, u.attr) for u in rows.notes.found}
    assert {("victim", "pages"), ("victim", "checkpoint"), ("junk", "spec"), ("#node#../x", "")} <= noted
    assert ("#h#0000000000001#000001", "") in noted and "junk" in rows.notes.quarantined
    assert set(table.open_stamps(RUN)) >= {"victim", "junk"}  # the index holds what a node made, as any item
    assert [r.site for r in table.get_sites(RUN, ["good", "victim", "junk"])] == ["good", "victim"]
    assert table.get_site(RUN, "junk") is None and table.get_site(RUN, "good") == good
    assert [n.instance_id for n in table.read_nodes(RUN)] == ["i-0bad"]


@backends()
def test_a_record_whose_fence_or_status_cannot_be_read_is_left_out_and_repaired_only_as_it_was_read(backend):
    from fleet.record.readback import Notes

    table = backend.table
    table.create_run(run_info())
    for name, attr in (("s-status", "run_status"), ("s-count", "attemptCount"), ("s-ver", "version")):
        ops.claim(table, seed(table, name), "i-0aaa", NOW)
        backend.scribble(RUN, name, {attr: WRONG[attr] if attr != "version" else "v"})
    notes = Notes()
    assert table.get_sites(RUN, ["s-status", "s-count", "s-ver"], notes) == []
    assert set(notes.quarantined) == {"s-status", "s-count", "s-ver"}
    for name, bad in notes.quarantined.items():
        new = ops.repaired(bad, SiteSpec("https://x.test/"), NOW + 1, max_attempts=3, expire_at=1_800_086_400)
        assert (new.run_status, new.attempt, new.failure_reason) == (RunStatus.QUEUED, 1, "error")
        assert new.attempts[-1].outcome == "error"  # the attempt under way ended: its node is fenced off
        backend.scribble(RUN, name, {"instance_id": ["moved"]})  # its fence changed since the read: not repaired
        assert not table.repair(bad, new)
        again = Notes()
        table.get_sites(RUN, [name], again)
        assert table.repair(again.quarantined[name], new)
        assert table.get_site(RUN, name) == new


@backends()
def test_a_site_item_no_hub_seeded_is_taken_over_by_the_seeding_and_one_it_seeded_is_not(backend):
    table = backend.table
    backend.scribble(RUN, "early", {"run_status": "FAILED", "site_status": "FAILED", "version": Decimal(9)})
    assert table.create_site(ops.new_site(RUN, "early", SiteSpec("https://early.test/"), None))
    assert table.get_site(RUN, "early").run_status is RunStatus.QUEUED
    assert not table.create_site(ops.new_site(RUN, "early", SiteSpec("https://other.test/"), None))


@backends()
def test_the_hub_gives_the_items_no_hub_made_the_runs_expiry(backend):
    from fleet.crawl.pacing import PACING_PARTITION_PREFIX

    table = backend.table
    table.create_run(run_info())
    seed(table, "s1")  # seeded with its expiry
    table.put_node(NodeInfo(RUN, "i-0001", "idle", NOW, NOW))
    backend.scribble(PACING_PARTITION_PREFIX + RUN, "example.test", {"requests": Decimal(3)})
    assert table.stamp_expiry(RUN, 1_900_000_000) == 2
    assert table.read_nodes(RUN)[0].expire_at == 1_900_000_000
    assert table.get_site(RUN, "s1").expire_at == 1_800_086_400  # what had one keeps it
    assert table.stamp_expiry(RUN, 1_900_000_000) == 0
