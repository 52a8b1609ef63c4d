"""The metered queue (hub/plan/feed.py): what the plan sends and when, and a hub that meters on fakes."""

import dataclasses

import pytest

from fleet.config import Config
from fleet.record import ops
from fleet.record.partition import RunInfo
from fleet.record.state import Attempt, SiteSpec
from hub.actions import Enqueue, Feed, SeedSites
from hub.plan import feed_order, metering, wanted_depth
from hub.snapshot import SiteCache, held, watched
from sim.memory import MemoryStateTable
from tests.unit.test_hub_loop import RUN, Rig
from tests.unit.test_hub_loop import config as loop_config
from tests.unit.test_plan import T0, World, config, running, site

#: A previous run's durations: s3 longest, s0 shortest; s1 and s4 have none (they count as the median, 100 s).
EXPECTED = {"s0": 10.0, "s2": 100.0, "s3": 900.0, "s5": 50.0}


def held_site(name, **kw):
    return site(name, enqueued=False, **kw)


def retry(name, **kw):
    """A QUEUED site whose first attempt ended and whose next message is not marked sent yet."""
    return site(name, enqueued=False, attempt=1, attempts=(Attempt(1, "i-1", 1.0, 2.0, "hang"),), **kw)


def feeds(p):
    return [a for a in p.actions if isinstance(a, Feed)]


def test_the_queue_is_metered_only_when_asked_and_the_order_is_known():
    assert metering(config(), EXPECTED)
    assert not metering(config(), {})  # a first run: nothing to order by, every message at seeding
    assert not metering(config(feed="all"), EXPECTED)
    assert not metering(config(order="config"), EXPECTED)


def test_a_metered_run_seeds_the_records_and_sends_no_message_with_them():
    seed = [
        a for a in World(config(6), [], instances=(), expected=EXPECTED).plan(T0).actions if isinstance(a, SeedSites)
    ][0]
    assert not seed.send
    assert [n for n, _ in seed.sites] == ["s3", "s1", "s2", "s4", "s5", "s0"]
    for cfg, expected in ((config(6), {}), (config(6, feed="all"), EXPECTED)):
        seed = [a for a in World(cfg, [], instances=(), expected=expected).plan(T0).actions if isinstance(a, SeedSites)]
        assert seed[0].send


def test_the_feed_sends_the_longest_held_sites_one_for_each_free_node():
    w = World(config(6), [held_site(f"s{i}") for i in range(6)], instances=("i-1", "i-2"), expected=EXPECTED)
    assert feeds(w.plan(T0)) == [Feed(("s3", "s1"))]  # s1: no history, a median one, before s2 by config order


def test_messages_already_sent_count_against_the_depth_and_the_hub_looks_again_within_the_interval():
    sites = [site("s3"), site("s1")] + [held_site(n) for n in ("s0", "s2", "s4", "s5")]
    w = World(config(6), sites, instances=("i-1", "i-2"), expected=EXPECTED)
    p = w.plan(T0)
    assert feeds(p) == [] and p.wake_at <= T0 + 30


def test_busy_nodes_get_the_claims_they_will_make_before_the_next_look():
    # Both nodes busy; the next site in line is expected to take 10 s: each node takes 3 in the 30 s to come.
    sites = [running("s0", node="i-1"), running("s1", node="i-2")] + [held_site(f"s{i}") for i in range(2, 11)]
    expected = {"s0": 50.0, "s1": 50.0} | {f"s{i}": 10.0 for i in range(2, 11)}
    w = World(config(11), sites, instances=("i-1", "i-2"), expected=expected)
    assert feeds(w.plan(T0)) == [Feed(("s2", "s3", "s4", "s5", "s6", "s7"))]  # ties in the config's order


@pytest.mark.parametrize(
    "nodes, running_, next_s, horizon, depth",
    [
        (10, 0, 600.0, 30.0, 10),  # nothing runs yet: one each
        (10, 10, 600.0, 30.0, 1),  # long sites: one node in twenty comes back before the next look
        (10, 4, 600.0, 30.0, 7),
        (10, 10, 5.0, 30.0, 60),  # short sites: six each
        (10, 10, 0.0, 30.0, 300),  # no shorter than a second
        (2, 5, 600.0, 30.0, 1),  # more running than nodes (some are leaving): no free node
    ],
)
def test_wanted_depth(nodes, running_, next_s, horizon, depth):
    assert wanted_depth(nodes, running_, next_s, horizon) == depth


def test_feed_order_is_longest_first_with_ties_in_config_order():
    cfg = config(6)
    assert feed_order({"s0", "s1", "s2", "s4"}, {"s0": 5.0, "s1": 5.0}, cfg, 3) == ["s0", "s1", "s2"]
    assert feed_order({"s0", "s1"}, EXPECTED, cfg, 0) == []


def test_a_held_site_is_fed_not_repaired_while_the_queue_is_metered():
    w = World(config(1), [held_site("s0", version=3)], expected=EXPECTED)
    p = w.plan(T0 + 15)
    p = w.plan(T0 + 30)  # past the grace: still the feed's
    assert not any(isinstance(a, Enqueue) for a in p.actions) and feeds(p) == [Feed(("s0",))]


def test_a_retry_whose_message_was_never_marked_is_repaired_under_metering_too():
    w = World(config(2), [retry("s0", version=4), site("s1")], expected=EXPECTED)
    p = w.plan(T0)
    assert not any(isinstance(a, Enqueue) for a in p.actions) and feeds(p) == []
    assert Enqueue("s0", 4) in w.plan(T0 + 15).actions


def test_held_and_watched_sites_are_told_apart():
    assert held(held_site("a")) and not watched(held_site("a"))
    assert watched(retry("a")) and not held(retry("a"))
    assert not held(site("a")) and not watched(site("a"))
    claimed = dataclasses.replace(running("a"), enqueued=False)
    assert watched(claimed) and not held(claimed)


def test_the_site_cache_keeps_the_held_sites_apart_and_lets_go_of_one_once_it_is_sent():
    table = MemoryStateTable()
    for name in ("a", "b"):
        table.create_site(ops.new_site(RUN, name, SiteSpec("https://x.test/"), None))
    cache = SiteCache()
    cache.load(table.read_run(RUN).sites)
    assert cache.held == {"a", "b"} and cache.watch == set()
    ops.mark_enqueued(table, table.get_site(RUN, "a"))
    cache.refresh(table.open_stamps(RUN), lambda names, notes: table.get_sites(RUN, names, notes))
    assert cache.held == {"b"}


def previous_run(table, durations):
    """A finished run the day before, each site COMPLETED after `durations[site]` seconds."""
    table.create_run(RunInfo("2026-11-20", "FINISHED", 1000.0, 9000.0, "20261120"))
    for name, took in durations.items():
        rec = ops.new_site("2026-11-20", name, SiteSpec("https://x.test/"), None)
        table.create_site(rec)
        rec = ops.claim(table, rec, "i-0", 1000.0)
        ops.complete(table, rec, f"{name}/r.json", 1000.0 + took)


def test_a_hub_meters_from_the_previous_run_and_a_restarted_one_feeds_on_in_the_same_order(tmp_path):
    base = loop_config().model_dump(mode="json", exclude={"sites"})
    sites = [{"id": f"s{i}", "start_url": f"http://x.test/{i}"} for i in range(6)]
    rig = Rig(tmp_path, Config.model_validate({**base, "sites": sites}))
    previous_run(rig.table, {"s0": 10.0, "s1": 500.0, "s2": 40.0, "s3": 300.0, "s4": 20.0, "s5": 30.0})
    first = rig.hub()
    first.tick()  # the run and its records; two nodes launched
    assert rig.queue.sent == 0 and all(held(r) for r in rig.table.read_run(RUN).sites)
    first.tick()  # one message for each of the two nodes, the longest two
    assert sorted(r.site for r in rig.table.read_run(RUN).sites if r.enqueued) == ["s1", "s3"]
    taken = [rig.node_takes("i-1"), rig.node_takes("i-2")]
    assert {rec.site for rec, _ in taken} == {"s1", "s3"}
    second = rig.hub()  # the first hub died: the next reads the same durations and goes on in order
    second.tick()
    # Both nodes busy, the next in line expected to take 40 s: one claim in the 5 s to the next look.
    assert [r.site for r in rig.table.read_run(RUN).sites if r.enqueued] == ["s2"] and rig.queue.sent == 3


def test_run_feed_is_metered_unless_set_to_all_and_refuses_anything_else():
    sites = [{"id": "a", "start_url": "https://a.test/"}]
    assert Config.model_validate({"sites": sites}).run.feed == "metered"
    assert Config.model_validate({"run": {"feed": "all"}, "sites": sites}).run.feed == "all"
    with pytest.raises(ValueError, match="feed"):
        Config.model_validate({"run": {"feed": "fifo"}, "sites": sites})
