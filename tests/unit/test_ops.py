"""Record operations on the in-memory table: claims, fencing, requeue rules, message verdicts."""

import random

import pytest

from fleet.errors import StaleWrite
from fleet.record import ops
from fleet.record.codec import diff_items, site_to_item, site_update
from fleet.record.state import COLLIDED_ID_MAX_CHARS, MAX_COLLIDED, Counts, Reason, RunStatus, SiteSpec, SiteStatus
from sim.memory import MemoryQueue, MemoryStateTable

NOW = 1_800_000_000.0
RUN = "r1"


@pytest.fixture
def table():
    return MemoryStateTable()


def seeded(table, site="s1"):
    r = ops.new_site("r1", site, SiteSpec("http://x.test/"), None)
    assert table.create_site(r)
    return r


def test_seeding_twice_keeps_the_first(table):
    r = seeded(table)
    assert not table.create_site(r)


def test_claim_then_a_second_claim_on_the_same_record_is_refused(table):
    r = seeded(table)
    mine = ops.claim(table, r, "i-1", NOW)
    assert (mine.run_status, mine.attempt, mine.instance_id) == (RunStatus.RUN, 1, "i-1")
    with pytest.raises(StaleWrite) as e:
        ops.claim(table, r, "i-2", NOW)  # computed from the stale record
    assert e.value.current.instance_id == "i-1"


def test_zombie_write_after_the_hub_moved_the_record_is_rejected(table):
    r = ops.claim(table, seeded(table), "i-1", NOW)
    node_view = ops.report(table, r, SiteStatus.RUNNING, NOW)
    ops.request_kill(table, table.get_site("r1", "s1"), Reason.HANG, NOW + 1)
    with pytest.raises(StaleWrite):
        ops.report(table, node_view, SiteStatus.URL_CALL, NOW + 2)
    with pytest.raises(StaleWrite):
        ops.beat(table, node_view, NOW + 2)


def test_heartbeat_does_not_move_the_version_so_the_hub_write_still_lands(table):
    r = ops.claim(table, seeded(table), "i-1", NOW)
    hub_view = table.get_site("r1", "s1")
    ops.beat(table, r, NOW + 5)
    killed = ops.request_kill(table, hub_view, Reason.HANG, NOW + 6)
    assert killed.kill_reason == "hang"


def end(table, r, reason=Reason.ERROR, **kw):
    return ops.end_attempt(table, r, reason=reason, now=NOW, max_attempts=3, spot_cap=1, **kw)


def test_attempts_requeue_until_max_then_fail_with_reason(table):
    r = seeded(table)
    for n in (1, 2):
        r = end(table, ops.claim(table, r, "i-1", NOW), Reason.HANG, kill_path="watchdog")
        assert (r.run_status, r.attempt, r.enqueued) == (RunStatus.QUEUED, n, False)
    r = end(table, ops.claim(table, r, "i-1", NOW), Reason.HANG)
    assert (r.run_status, r.site_status, r.failure_reason, r.attempt) == (
        RunStatus.FAILED,
        SiteStatus.FAILED,
        "hang",
        3,
    )
    assert [a.outcome for a in r.attempts] == ["hang", "hang", "hang"]
    assert r.attempts[0].kill_path == "watchdog"


def test_spot_gives_its_attempt_back_up_to_the_cap(table):
    r = ops.claim(table, seeded(table), "i-1", NOW)
    r = end(table, r, Reason.SPOT)
    assert (r.run_status, r.attempt, r.spot_requeues) == (RunStatus.QUEUED, 0, 1)
    r = end(table, ops.claim(table, r, "i-2", NOW), Reason.SPOT)  # over the cap of 1: it counts
    assert (r.attempt, r.spot_requeues) == (1, 1)


def test_send_next_sends_one_message_for_the_next_attempt_and_marks_it(table):
    q = MemoryQueue()
    r = end(table, ops.claim(table, seeded(table), "i-1", NOW))
    r = ops.send_next(table, q, r)
    assert r.enqueued and q.sent == 1
    assert ops.send_next(table, q, r) is r and q.sent == 1  # already sent: nothing more
    msg = q.receive(0, 30)
    assert (msg.site, msg.attempt) == ("s1", 2)


def test_classify(table):
    r = seeded(table)
    assert ops.classify(r, 1) is ops.Verdict.CLAIM
    assert ops.classify(r, 2) is ops.Verdict.WAIT  # from the future: leave it
    running = ops.claim(table, r, "i-1", NOW)
    assert ops.classify(running, 1) is ops.Verdict.WAIT  # attempt 1 runs elsewhere
    requeued = end(table, running)
    assert ops.classify(requeued, 1) is ops.Verdict.STALE  # attempt 1 is over
    assert ops.classify(requeued, 2) is ops.Verdict.CLAIM
    assert ops.classify(None, 1) is ops.Verdict.STALE


def test_complete_and_fail_now(table):
    r = ops.claim(table, seeded(table), "i-1", NOW)
    done = ops.complete(table, r, "s1/20261121/result.json", NOW + 3)
    assert done.run_status is RunStatus.COMPLETED and done.attempts[-1].outcome == "completed"
    other = seeded(table, "s2")
    failed = ops.fail_now(table, other, Reason.DEADLINE, NOW)
    assert (failed.run_status, failed.failure_reason) == (RunStatus.FAILED, "deadline")


# --- what an attempt found ------------------------------------------------------------------------------------


def test_an_attempt_starts_counting_at_its_claim_and_its_counts_ride_on_heartbeats(table):
    r = ops.claim(table, seeded(table), "i-1", NOW)
    assert r.current_attempt.counts == Counts()
    progress = ops.Progress(SiteStatus.CALL_DONE, NOW + 1, "http://x.test/p2", 2)
    r = ops.beat(table, r, NOW + 2, progress, Counts(items=40, pages=2, collisions=1, collided=("x",)))
    assert table.get_site("r1", "s1").current_attempt.counts == Counts(40, 2, 1, 0, ("x",))
    quiet = ops.beat(table, r, NOW + 3, None, Counts(40, 2, 1, 0, ("x",)))  # unchanged: no version moved
    assert quiet.version == r.version


def test_the_hub_ending_an_attempt_keeps_the_counts_its_node_last_wrote(table):
    r = ops.claim(table, seeded(table), "i-1", NOW)
    ops.beat(table, r, NOW + 2, None, Counts(items=12, pages=3))
    ended = end(table, table.get_site("r1", "s1"), reason=Reason.LOST)  # the hub's end: no counts of its own
    assert ended.attempts[0].outcome == "lost" and ended.attempts[0].counts == Counts(items=12, pages=3)
    again = ops.claim(table, ended, "i-2", NOW + 10)
    mine = end(table, again, counts=Counts(items=5, pages=1, skipped=2))  # the node's own end gives its counts
    assert mine.attempts[1].counts == Counts(5, 1, 0, 2)


def test_a_completed_site_records_its_items_and_pages_and_a_rerun_forgets_them(table):
    r = ops.claim(table, seeded(table), "i-1", NOW)
    done = ops.complete(table, r, "s1/20261121/result.json", NOW + 9, counts=Counts(30, 3), items=30, pages=3)
    assert (done.items, done.pages, done.attempts[0].counts) == (30, 3, Counts(30, 3))
    assert table.get_site("r1", "s1") == done
    reopened = ops.reopen(table, done, NOW + 20)
    assert reopened.items is None


def test_counts_are_bounded_as_a_record_keeps_them(table):
    many = Counts(items=-1, collisions=9, collided=tuple("x" * 300 + str(i) for i in range(9)))
    kept = ops.bounded(many)
    assert kept.items == 0 and len(kept.collided) == MAX_COLLIDED
    assert all(len(i) == COLLIDED_ID_MAX_CHARS for i in kept.collided)


def test_an_update_encodes_only_what_changed_and_is_the_diff_of_the_whole_items():
    """`site_update` encodes the attributes of the fields a write changed; over random histories of every operation
    it is exactly the diff of the two whole items (and a transition writes `enqueued`)."""
    rnd = random.Random(11)
    mem = MemoryStateTable()
    updates = 0
    for n in range(60):
        rec = ops.new_site(RUN, f"s{n}", SiteSpec("https://x.test/", options={"max_pages": n}), expire_at=n or None)
        mem.create_site(rec)
        for step in range(12):
            now = 1000.0 + step * 1.7
            if rec.is_terminal:
                old, rec = rec, ops.reopen(mem, rec, now)
            elif rec.run_status is RunStatus.QUEUED and not rec.enqueued:
                old, rec = rec, ops.mark_enqueued(mem, rec)
            elif rec.run_status is RunStatus.QUEUED:
                old, rec = rec, ops.claim(mem, rec, f"i-{rnd.randrange(3)}", now, receipt=f"r{step}")
            else:
                pick = rnd.randrange(6)
                old = rec
                if pick == 0:
                    rec = ops.beat(mem, rec, now, counts=Counts(items=step, pages=step))
                elif pick == 1:
                    ckpt = {"next": f"p{step}", "pages": step, "items": step, "parts": [[rec.attempt, 1, 1]]}
                    rec = ops.save_checkpoint(mem, rec, now, None, ckpt)
                elif pick == 2:
                    rec = ops.report(mem, rec, SiteStatus.URL_CALL, now, url=f"https://x.test/{step}", pages=step)
                elif pick == 3:
                    rec = ops.complete(mem, rec, f"s{n}/r.json", now, items=step, pages=step)
                elif pick == 4:
                    rec = ops.request_kill(mem, rec, Reason.HANG, now)
                else:
                    rec = ops.end_attempt(mem, rec, reason=Reason.ERROR, now=now, max_attempts=2, spot_cap=1)
            sets, removes = site_update(old, rec)
            whole_sets, whole_removes = diff_items(site_to_item(old), site_to_item(rec))
            if rec.version != old.version:
                whole_sets["enqueued"] = rec.enqueued
            assert (sets, sorted(removes)) == (whole_sets, sorted(whole_removes)), (n, step)
            assert mem.items[(RUN, rec.site)] == site_to_item(rec)  # the table holds what the record encodes
            updates += 1
    assert updates == 60 * 12
