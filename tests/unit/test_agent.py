"""The node agent on fakes with an injected clock: claims, results, its watchdog, fencing, requeues, stopping."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from fleet.protocol import CLAIMED_VISIBILITY_S
from fleet.record import ops
from fleet.record.state import Reason, RunState, RunStatus, SiteStatus
from tests.helpers.fake_node import HANG, RUN, Rig, pages_script, spied, status


def test_a_healthy_crawl_writes_the_result_then_completed_then_deletes_the_message(tmp_path):
    rig = Rig(tmp_path, [pages_script(3)])
    rig.seed()
    assert rig.agent.run() == 0  # idles out once the queue is empty
    rec = rig.site()
    assert (rec.run_status, rec.site_status, rec.attempt, rec.pages) == (
        RunStatus.COMPLETED,
        SiteStatus.COMPLETED,
        1,
        3,
    )
    body = json.loads(rig.results.get("s1/20261121/result.json"))
    assert body["attempt"] == 1 and len(body["items"]) == 3
    assert rig.queue.messages == [] and rig.queue.sent == 1
    assert rig.crawls[0].job["profile_dir"].endswith("profiles/s1")
    assert rig.crawls[0].closed_with and rig.crawls[0].closed_with > 0  # it may close its own browser
    assert rig.cleanups == [("s1", "sess-1", False)]


def test_an_existing_result_means_done_without_a_crawl(tmp_path):
    rig = Rig(tmp_path, [])
    rig.results.put_new("s1/20261121/result.json", b"{}")
    rig.seed()
    rig.agent.run()
    rec = rig.site()
    assert rec.run_status is RunStatus.COMPLETED and rec.attempts[-1].outcome == "skipped"
    assert rig.crawls == [] and rig.queue.messages == []


def test_watchdog_kills_a_hang_at_hang_after_s_and_requeues(tmp_path):
    script = pages_script(1)[:3] + [HANG]  # session, RUNNING, URL_CALL, then nothing
    rig = Rig(tmp_path, [script, pages_script(2)])
    rig.seed()
    rig.agent.run()
    first = rig.crawls[0]
    assert first.killed and first.closed_with == 0
    rec = rig.site()
    assert rec.run_status is RunStatus.COMPLETED and rec.attempt == 2
    a1 = rec.attempts[0]
    assert (a1.outcome, a1.kill_path) == ("hang", "watchdog")
    lag = (a1.end - a1.start) - (0.61 + 10)  # URL_CALL at 0.61 s, hang_after_s 10
    assert -0.01 <= lag < 1.01  # killed within the next wake-up after the threshold (epochs kept to ms)
    assert rig.cleanups[0] == ("s1", "sess-1", True)  # forced: the browser of a killed crawl is ended for it
    assert rig.queue.sent == 2 and rig.queue.messages == []


def test_a_site_that_always_hangs_fails_with_reason_hang_after_three_attempts(tmp_path):
    hang = pages_script(1)[:3] + [HANG]
    rig = Rig(tmp_path, [hang, hang, hang])
    rig.seed()
    rig.agent.run()
    rec = rig.site()
    assert (rec.run_status, rec.failure_reason, rec.attempt) == (RunStatus.FAILED, "hang", 3)
    assert rig.queue.messages == [] and rig.queue.sent == 3


def test_slow_but_alive_is_not_killed(tmp_path):
    rig = Rig(tmp_path, [pages_script(8, step=9)])  # 9 s a page (< 10), 72 s in all (> 10)
    rig.seed()
    rig.agent.run()
    rec = rig.site()
    assert rec.run_status is RunStatus.COMPLETED and rec.attempt == 1
    assert rig.crawls[0].closed_with > 0  # ended by its own result, never by the watchdog


def test_crawler_error_requeues_then_succeeds(tmp_path):
    err = [(0.5, status("RUNNING")), (0.6, {"event": "error", "message": "HTTP 500 from http://x.test/"})]
    rig = Rig(tmp_path, [err, pages_script(1)])
    rig.seed()
    rig.agent.run()
    rec = rig.site()
    assert rec.run_status is RunStatus.COMPLETED and [a.outcome for a in rec.attempts] == ["error", "completed"]


def hub_marks_before_each_beat(rig, reason, site="s1"):
    """The hub's kill mark lands just before each heartbeat of the node's attempt on `site` (a write that moves
    heartbeatEpoch), through the fake table's `write` seam: the beat it precedes is fenced."""
    write = rig.table.write
    hub = SimpleNamespace(write=write)  # the hub's own writes do not go through this seam

    def mark_then_write(old, new):
        if old.site == site and old.run_status is RunStatus.RUN and new.heartbeat != old.heartbeat:
            cur = rig.site(site)
            if cur.run_status is RunStatus.RUN and not cur.kill_reason:
                ops.request_kill(hub, cur, reason, rig.clock.now())
        return write(old, new)

    rig.table.write = mark_then_write


def test_hub_fencing_stops_the_crawl_and_leaves_the_requeue_to_the_hub(tmp_path):
    rig = Rig(tmp_path, [pages_script(1)[:3] + [HANG]], node_watchdog=False, hang_after_s=1000)
    rig.seed()
    hub_marks_before_each_beat(rig, Reason.HANG)
    rig.agent.run()
    rec = rig.site()
    assert rec.run_status is RunStatus.RUN and rec.kill_reason == "hang"  # untouched by the node
    assert rig.crawls[0].killed
    assert rig.queue.messages == []  # its message deleted; the hub sends the next one
    assert rig.results.objects == {}


def test_a_message_for_an_attempt_in_progress_elsewhere_is_left_for_later(tmp_path):
    rig = Rig(tmp_path, [])
    rig.seed()
    msg = rig.queue.receive(0, 30)
    ops.claim(rig.table, rig.site(), "i-other", rig.clock.now())
    rig.queue.set_visibility(msg, 0)
    rig.agent.s = rig.agent.s.__class__(**{**rig.agent.s.__dict__, "idle_exit_s": 1})
    assert rig.agent.handle(rig.queue.receive(0, 30)) is False
    assert len(rig.queue.messages) == 1 and rig.site().instance_id == "i-other"


def test_a_duplicate_message_is_dropped_once_its_attempt_ended(tmp_path):
    rig = Rig(tmp_path, [pages_script(1)])
    rig.seed()
    rig.queue.send(RUN, "s1", 1)  # the same attempt twice (at-least-once delivery)
    rig.agent.run()
    assert rig.site().attempt == 1 and rig.queue.messages == [] and len(rig.crawls) == 1


def test_a_poison_message_is_not_deleted_and_reaches_the_dlq(tmp_path):
    rig = Rig(tmp_path, [], idle_exit_s=30)
    rig.queue.max_receive_count = 3
    rig.queue.send_raw("not json")
    rig.agent.run()
    assert rig.queue.messages == [] and len(rig.queue.dlq) == 1


def test_a_profile_locked_elsewhere_gives_the_attempt_back_and_retries_later(tmp_path):
    import subprocess
    import sys
    import time

    lock = tmp_path / "efs" / "locks" / "s1.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import fasteners, sys, time; l = fasteners.InterProcessLock(sys.argv[1]); l.acquire(); "
                "print('held', flush=True); time.sleep(60)"
            ),
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        rig = Rig(tmp_path, [], max_attempts=1, idle_exit_s=1)
        rig.seed()
        # The node would stay for the site it gave back (it is QUEUED): stop it once it has been given back.
        rig.agent.healthy = lambda: "stopped after the give-back" if rig.site().spot_requeues else None
        rig.agent.run()
        rec = rig.site()  # not the site's fault (a node cut off mid-crawl may hold it): not counted
        assert (rec.run_status, rec.attempt, rec.spot_requeues) == (RunStatus.QUEUED, 0, 1)
        assert rec.attempts[0].outcome == "busy" and "lock" in rec.error
        assert len(rig.queue.messages) == 1 and rig.queue.sent == 1  # the same message, offered again later
        assert rig.queue.messages[0].visible_at > rig.clock.monotonic() - 1
    finally:
        holder.kill()
        holder.wait()
        time.sleep(0)


def test_sites_per_node_one_exits_after_one_site(tmp_path):
    rig = Rig(tmp_path, [pages_script(1), pages_script(1)], sites_per_node=1)
    rig.seed("s1")
    rig.seed("s2")
    rig.agent.run()
    done = [s for s in ("s1", "s2") if rig.site(s).run_status is RunStatus.COMPLETED]
    assert len(done) == 1 and len(rig.crawls) == 1


def test_the_claimed_message_is_hidden_once_not_at_every_heartbeat(tmp_path):
    rig = spied(Rig(tmp_path, [pages_script(10, step=8)]))  # 80 s crawl, visibility 30 s, beats every 5 s
    rig.seed()
    rig.agent.run()
    assert rig.site().run_status is RunStatus.COMPLETED
    assert rig.queue.sent == 1  # never redelivered to anyone: nothing resent, nothing duplicated
    assert [args[1] for args in rig.queue_spy.named("set_visibility")] == [CLAIMED_VISIBILITY_S]


def test_a_crawl_longer_than_the_claimed_visibility_is_extended_before_it_shows(tmp_path):
    rig = spied(Rig(tmp_path, [pages_script(10, step=8)], claimed_visibility_s=20.0))  # 80 s crawl: 20 s at a time
    rig.seed()
    rig.agent.run()
    assert rig.site().run_status is RunStatus.COMPLETED and rig.site().attempt == 1
    assert rig.queue.sent == 1 and len(rig.queue_spy.named("set_visibility")) >= 4


def test_with_node_watchdogs_progress_rides_on_the_heartbeat(tmp_path):
    """Ten pages in ten seconds: one write per heartbeat (5 s) carries the latest step, not two per page."""
    rig = spied(Rig(tmp_path, [pages_script(10, step=1)]))
    rig.seed()
    rig.agent.run()
    rec = rig.site()
    assert rec.run_status is RunStatus.COMPLETED and rec.pages == 10  # the last step arrived with the final beat
    writes = rig.table_spy.named("write")
    assert len(writes) <= 6  # claim, two beats, the beat before the result, complete
    busy = [args for args in rig.table_spy.named("put_node") if args[0].state == "busy"]
    assert len(rig.table_spy.named("put_node")) == 4 and len(busy) == 1  # idle, busy, idle, exiting


def test_without_node_watchdogs_each_step_is_written_at_once(tmp_path):
    """The hub is then the hang detector: it sees every URL_CALL when it happens."""
    rig = spied(Rig(tmp_path, [pages_script(10, step=1)], node_watchdog=False))
    rig.seed()
    rig.agent.run()
    reports = [args for args in rig.table_spy.named("write") if args[1].site_status is not args[0].site_status]
    assert len(reports) >= 21  # RUNNING, then URL_CALL and CALL_DONE for each page (and COMPLETED)


@pytest.mark.parametrize("finished", [True])
def test_the_agent_exits_when_the_run_is_finished(tmp_path, finished):
    rig = Rig(tmp_path, [], idle_exit_s=1000)
    rig.table.update_run(RUN, status="FINISHED")
    assert rig.agent.run() == 0


def test_the_agent_stops_taking_sites_when_its_grid_node_is_gone(tmp_path):
    rig = Rig(tmp_path, [pages_script(1)])
    rig.seed()
    rig.agent.healthy = lambda: "the Grid node exited with code 1"
    assert rig.agent.run() == 1
    assert rig.site().run_status is RunStatus.QUEUED and rig.crawls == []  # nothing claimed, nothing burned


def test_node_items_expire_with_the_run_by_the_hubs_hand(tmp_path):
    """The node role may not write `expireAt`: a node item carries none until the hub stamps the run's items with
    the run's expiry as the run ends (`StateTable.stamp_expiry`), which leaves items that have one alone."""
    rig = Rig(tmp_path, [])
    rig.table.update_run(RUN, expire_at=1_900_000_000)
    rig.agent.run()
    (node,) = rig.table.read_run(RUN).nodes
    assert node.expire_at is None and node.state == "exiting"
    assert rig.table.stamp_expiry(RUN, 1_900_000_000) == 1
    (node,) = rig.table.read_run(RUN).nodes
    assert node.expire_at == 1_900_000_000
    assert rig.table.stamp_expiry(RUN, 1_000) == 0


def test_a_spot_notice_mid_crawl_gives_the_attempt_back_and_releases_the_message(tmp_path):
    rig = Rig(tmp_path, [pages_script(1)[:3] + [HANG]], spot_cap=3)
    rig.seed()
    notices = {"on": False}
    rig.agent.spot_notice = lambda: notices["on"] and {"action": "terminate"}
    start = rig.agent.start_crawl

    def start_and_notice(job, log_path):  # EC2 announces the interruption once the crawl is running
        notices["on"] = True
        return start(job, log_path)

    rig.agent.start_crawl = start_and_notice
    assert rig.agent.run() == 0
    rec = rig.site()
    assert (rec.run_status, rec.attempt, rec.spot_requeues, rec.enqueued) == (RunStatus.QUEUED, 0, 1, True)
    assert rec.attempts[0].outcome == "spot"
    assert rig.crawls[0].killed
    assert len(rig.queue.messages) == 1 and rig.queue.sent == 1  # the same message, visible again, no new one
    msg = rig.queue.receive(0, 30)
    assert (msg.site, msg.attempt) == ("s1", 1)  # attempt 1 again: the spot attempt did not count
    assert ops.classify(rec, msg.attempt) is ops.Verdict.CLAIM


def test_a_spot_notice_between_sites_stops_the_node_taking_work(tmp_path):
    rig = Rig(tmp_path, [pages_script(1)])
    rig.seed()
    rig.agent.spot_notice = lambda: {"action": "terminate"}
    assert rig.agent.run() == 0
    assert rig.site().run_status is RunStatus.QUEUED and rig.crawls == []


def test_a_node_the_hub_declared_lost_takes_no_more_work(tmp_path):
    rig = Rig(tmp_path, [pages_script(1)[:3] + [HANG], pages_script(1)], node_watchdog=False, hang_after_s=1000)
    rig.seed("s1")
    rig.seed("s2")
    hub_marks_before_each_beat(rig, Reason.LOST, site="s1")  # "this node is dead"
    assert rig.agent.run() == 0
    assert len(rig.crawls) == 1  # s2 was left for a node the hub believes in
    assert rig.site("s2").run_status is RunStatus.QUEUED


def test_an_idle_node_stays_while_a_site_of_its_run_waits_and_takes_it_when_its_message_shows_again(tmp_path):
    # A long poll that died with its node (terminated mid-receive) took the message: it is out of sight for the
    # visibility timeout. Leaving after idle_exit_s would only have the hub launch another node in its place.
    rig = Rig(tmp_path, [pages_script(1)], idle_exit_s=3)
    rig.seed()
    start = rig.clock.monotonic()
    ghost = rig.queue.receive(0, 20)
    assert ghost is not None and rig.queue.receive(0, 20) is None
    rig.agent.run()
    assert rig.site().run_status is RunStatus.COMPLETED and rig.clock.monotonic() >= start + 20
    assert [a.outcome for a in rig.site().attempts] == ["completed"]


def test_an_idle_node_leaves_when_no_site_of_its_run_waits(tmp_path):
    rig = Rig(tmp_path, [], idle_exit_s=3)
    start = rig.clock.monotonic()
    assert rig.agent.run() == 0 and rig.clock.monotonic() < start + 10


def test_a_crawl_that_fails_while_its_grid_hub_is_lost_is_given_back_and_the_node_waits_for_a_new_hub(tmp_path, caplog):
    """Every command of a crawl goes through the Grid hub's router: a hub lost mid-run fails every crawl under way.
    That is no fault of the site's: the attempt is given back, not spent, and the node takes no site until a hub's
    Grid lists it again (the watchdog replaces the hub; the node's Grid node registers with it by itself)."""
    fail = [(0.5, {"event": "session", "id": "sess-1"}), (1.0, {"event": "error", "message": "Connection refused"})]
    rig = Rig(tmp_path, [fail, pages_script(1)], spot_cap=3)
    down = {"until": None}

    def grid_up() -> bool:
        if rig.crawls and down["until"] is None:
            down["until"] = rig.clock.monotonic() + 60  # the hub goes with the first crawl's error
        return down["until"] is None or rig.clock.monotonic() >= down["until"]

    rig.agent.grid_up = grid_up
    rig.seed()
    with caplog.at_level(logging.INFO, logger="gridfleet.node"):
        assert rig.agent.run() == 0
    rec = rig.site()
    assert rec.run_status is RunStatus.COMPLETED and [a.outcome for a in rec.attempts] == ["busy", "completed"]
    assert rec.spot_requeues == 1 and rec.attempt == 1  # given back: no attempt spent on it
    lines = [r.getMessage() for r in caplog.records]
    assert any("grid-lost" in m for m in lines) and any("grid-back" in m for m in lines)
    assert rig.crawls[1].started >= down["until"]  # no site taken while no hub listed the node


def test_a_node_waiting_for_a_grid_hub_leaves_once_the_run_is_over(tmp_path):
    rig = Rig(tmp_path, [])
    rig.agent.grid_up = lambda: False
    rig.table.update_run(RUN, status=RunState.FINISHED)
    assert rig.agent.run() == 0
