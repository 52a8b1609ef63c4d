"""The hub's site cache: after one full read it reads only the open sites' stamps and what moved, and always
agrees with a full read of the table."""

import random

from fleet.record import ops
from fleet.record.state import Reason, RunStatus, SiteSpec, SiteStatus
from hub.snapshot import Observations, SiteCache, observe, observe_changes, watched
from sim.memory import MemoryStateTable

RUN = "2027-01-15"
T = 1_800_000_000.0


class Reads:
    """The table, counting the records the cache asked for by name."""

    def __init__(self, table):
        self.table, self.fetched = table, []

    def refresh(self, cache):
        def fetch(names, notes):
            self.fetched.extend(names)
            return self.table.get_sites(RUN, names, notes)

        cache.refresh(self.table.open_stamps(RUN), fetch)


def seeded(n):
    table = MemoryStateTable()
    for i in range(n):
        assert table.create_site(ops.new_site(RUN, f"s{i:03d}", SiteSpec("https://x.test/"), None))
    return table


def full(table):
    return {r.site: r for r in table.read_run(RUN).sites}


def test_progress_heartbeats_and_enqueued_marks_are_patched_without_reading_records():
    table = seeded(3)
    cache, reads = SiteCache(), Reads(table)
    cache.load(table.read_run(RUN).sites)
    a = ops.claim(table, table.get_site(RUN, "s000"), "i-1", T)
    reads.refresh(cache)
    assert reads.fetched == ["s000"]  # a claim is a transition: the whole record is read
    a = ops.report(table, a, SiteStatus.RUNNING, T + 1)
    a = ops.report(table, a, SiteStatus.URL_CALL, T + 2, url="https://x.test/p/1", pages=0)
    a = ops.beat(table, a, T + 3)
    ops.mark_enqueued(table, table.get_site(RUN, "s001"))
    reads.fetched.clear()
    reads.refresh(cache)
    assert reads.fetched == []
    assert cache.sites == full(table)
    assert cache.sites["s000"].url == "https://x.test/p/1" and cache.sites["s000"].heartbeat == T + 3


def test_a_site_claimed_and_finished_between_two_reads_is_found():
    table = seeded(2)
    cache, reads = SiteCache(), Reads(table)
    cache.load(table.read_run(RUN).sites)
    ops.mark_enqueued(table, table.get_site(RUN, "s001"))  # sent (a node claims only a site whose message it has)
    reads.refresh(cache)
    rec = ops.claim(table, table.get_site(RUN, "s001"), "i-1", T)
    ops.complete(table, rec, "s001/20270115/result.json", T + 5)
    reads.refresh(cache)
    assert reads.fetched == ["s001"]  # it left the open index: read once, then never again
    assert cache.sites["s001"].run_status is RunStatus.COMPLETED and cache.tally["COMPLETED"] == 1
    reads.fetched.clear()
    reads.refresh(cache)
    assert reads.fetched == []


def test_sites_created_and_finished_before_the_first_read_are_found_by_name():
    table = MemoryStateTable()
    cache, reads = SiteCache(), Reads(table)
    cache.expect(["a", "b"])
    cache.load(table.read_run(RUN).sites)  # the run has not started: nothing yet
    for name in ("a", "b"):
        table.create_site(ops.new_site(RUN, name, SiteSpec("https://x.test/"), None))
    rec = ops.claim(table, table.get_site(RUN, "b"), "i-1", T)
    ops.fail_now(table, rec, Reason.DEADLINE, T + 1)
    reads.refresh(cache)
    assert cache.sites == full(table) and cache.unseen == set()


def test_sites_as_seeded_are_not_read_each_tick_and_one_the_hub_ended_is_read_once():
    table = seeded(1000)
    cache, reads = SiteCache(), Reads(table)
    cache.load(table.read_run(RUN).sites)
    assert table.open_stamps(RUN) == {} and table.has_held(RUN)  # the index's Query leaves the held sites out
    reads.refresh(cache)
    assert reads.fetched == [] and len(cache.held) == 1000
    ops.fail_now(table, table.get_site(RUN, "s007"), Reason.DEADLINE, T)  # the hub ends one it held (an end plan)
    cache.recheck(["s007", "s008"])
    reads.refresh(cache)
    assert sorted(reads.fetched) == ["s007", "s008"] and cache.sites == full(table)  # each named one, read once
    assert "s007" not in cache.held and len(cache.held) == 999 and cache.tally["FAILED"] == 1
    reads.fetched.clear()
    reads.refresh(cache)
    assert reads.fetched == []


def test_random_histories_agree_with_a_full_read_every_tick():
    rnd = random.Random(5)
    table = seeded(40)
    cache, reads = SiteCache(), Reads(table)
    cache.load(table.read_run(RUN).sites)
    obs = whole = Observations()
    for tick in range(200):
        for _ in range(rnd.randrange(6)):
            rec = table.get_site(RUN, f"s{rnd.randrange(40):03d}")
            now = T + tick
            if rec.run_status is RunStatus.QUEUED and not rec.enqueued and rnd.random() < 0.1:
                ops.fail_now(table, rec, Reason.DEADLINE, now)  # the hub ends a site it holds, and says so
                cache.recheck([rec.site])
            elif rec.run_status is RunStatus.QUEUED and not rec.enqueued:
                ops.mark_enqueued(table, rec)
            elif rec.run_status is RunStatus.QUEUED:
                ops.claim(table, rec, f"i-{rnd.randrange(3)}", now)
            elif rec.run_status is RunStatus.RUN:
                step = rnd.randrange(5)
                if step == 0:
                    ops.beat(table, rec, now)
                elif step == 1 and rec.site_status is SiteStatus.PENDING:
                    ops.report(table, rec, SiteStatus.RUNNING, now)
                elif step == 1 and rec.site_status is not SiteStatus.URL_CALL:
                    ops.report(table, rec, SiteStatus.URL_CALL, now, url=f"https://x.test/{tick}", pages=rec.pages)
                elif step == 2:
                    ops.complete(table, rec, f"{rec.site}/r.json", now)
                elif step == 3:
                    ops.end_attempt(table, rec, reason=Reason.HANG, now=now, max_attempts=3, spot_cap=3)
                else:
                    ops.request_kill(table, rec, Reason.HANG, now)
            elif rnd.random() < 0.1:
                ops.reopen(table, rec, now)
        reads.refresh(cache)
        truth = full(table)
        assert cache.sites == truth, f"tick {tick}"
        # the hub's observations by delta are those of a look at every watched site
        obs = observe_changes(obs, cache.sites, cache.changed, cache.watch, {}, {}, T + tick, cache.beats)
        whole = observe(whole, truth, {}, {}, T + tick, watch={n for n, r in truth.items() if watched(r)})
        assert (obs.progress, obs.heartbeat, obs.unsent) == (whole.progress, whole.heartbeat, whole.unsent), tick
        assert cache.watch == {n for n, r in truth.items() if watched(r)}
        assert cache.retrying == {n for n in cache.watch if truth[n].run_status is RunStatus.QUEUED}
        running = {r.instance_id for r in truth.values() if r.run_status is RunStatus.RUN}
        assert cache.by_instance.keys() == running and all(cache.by_instance.values())
        assert cache.tally == {s.value: sum(1 for r in truth.values() if r.run_status is s) for s in RunStatus}
