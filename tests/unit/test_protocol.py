"""The node protocol's decisions, each on its own: plain values in, a decision out, time passed in."""

from __future__ import annotations

import math

import pytest

from fleet import protocol
from fleet.config import Config
from fleet.config.rules import rules_from_config
from fleet.protocol import (
    BUSY_RETRY_S,
    CLAIMED_VISIBILITY_S,
    MAX_AWS_FAILURES,
    CrawlEnd,
    CrawlEndKind,
    FollowUp,
    MessageAction,
    NodeCard,
    NodeRules,
    StopWhy,
    Watch,
)
from fleet.record import ops
from fleet.record.messages import BadMessage, SiteMessage
from fleet.record.partition import RunInfo
from fleet.record.state import NodeState, Reason, RunStatus, SiteSpec, SiteStatus
from sim.memory import MemoryStateTable

RUN = "2026-11-21"
RULES = NodeRules(
    hang_after_s=10,
    heartbeat_interval_s=5,
    visibility_s=90,
    browser_start_timeout_s=20,
    idle_exit_s=3,
    sites_per_node=0,
)


def msg(attempt=1, run_id=RUN, site="s1"):
    return SiteMessage(run_id, site, attempt, receipt="r-1")


def fresh(site="s1"):
    return ops.new_site(RUN, site, SiteSpec("http://x.test/"), None)


def claimed(table, node="i-1", site="s1"):
    rec = fresh(site)
    table.create_site(rec)
    return ops.claim(table, rec, node, 100.0)


# --- messages --------------------------------------------------------------------------------------------------------


def test_a_message_that_is_not_a_site_message_is_released_to_reach_the_dlq():
    bad = BadMessage("not json", "r-1", "m-1", 1, "not JSON")
    assert protocol.record_of(bad) is None
    step = protocol.on_message(bad, None, RUN, RULES)
    assert (step.action, step.visibility_s, step.refused) == (MessageAction.RELEASE, 1.0, "not JSON")


def test_a_message_for_a_site_without_a_record_is_refused_and_released_never_deleted():
    for unknown in (msg(site="nope"), msg(run_id="no-such-run")):  # the hub seeds a record before any message
        step = protocol.on_message(unknown, None, RUN, RULES)
        assert (step.action, step.visibility_s, step.refused) == (MessageAction.RELEASE, 1.0, "no such site in its run")


def test_a_message_for_a_queued_site_is_claimed_and_names_the_record_to_read():
    assert protocol.record_of(msg()) == (RUN, "s1")
    assert protocol.on_message(msg(), fresh(), RUN, RULES).action is MessageAction.CLAIM


def test_a_message_whose_attempt_has_been_and_gone_is_deleted():
    table = MemoryStateTable()
    done = ops.complete(table, claimed(table), "k", 200.0)
    assert protocol.on_message(msg(), done, RUN, RULES).action is MessageAction.DELETE


def test_a_message_for_an_attempt_running_elsewhere_is_hidden_for_at_most_thirty_seconds():
    table = MemoryStateTable()
    running = claimed(table, node="i-other")
    step = protocol.on_message(msg(), running, RUN, RULES)
    assert (step.action, step.visibility_s) == (MessageAction.HIDE, 30.0)
    short = NodeRules(visibility_s=12)
    assert protocol.on_message(msg(), running, RUN, short).visibility_s == 12


def test_a_claimable_message_of_another_run_is_hidden_not_claimed():
    step = protocol.on_message(msg(run_id="another-run"), fresh(), RUN, RULES)
    assert (step.action, step.visibility_s, step.refused) == (MessageAction.HIDE, 30.0, "a message of another run")
    table = MemoryStateTable()
    other = ops.new_site("another-run", "s1", SiteSpec("http://x.test/"), None)
    table.create_site(other)
    done = ops.complete(table, ops.claim(table, other, "i-2", 100.0), "k", 200.0)
    step = protocol.on_message(msg(run_id="another-run"), done, RUN, RULES)  # its attempt over: dropped, as its
    assert step.action is MessageAction.DELETE  # own nodes would drop it


def test_a_lost_claim_race_drops_the_message_only_once_its_attempt_is_over():
    table = MemoryStateTable()
    running = claimed(table, node="i-other")
    assert protocol.on_claim_lost(running, 1).action is MessageAction.KEEP  # the winner may still give it back
    done = ops.complete(table, running, "k", 200.0)
    assert protocol.on_claim_lost(done, 1).action is MessageAction.DELETE
    assert protocol.on_claim_lost(None, 1).action is MessageAction.DELETE


# --- the watchdog, the heartbeat, the message's visibility ------------------------------------------------------------


def test_a_browser_that_does_not_start_in_time_ends_the_attempt_as_an_error():
    w = Watch.start(RULES, 100.0)
    assert w.watchdog_at == 120.0 and w.timed_out(119.9) is None
    end = w.timed_out(120.0)
    assert end is not None and (end.kind, end.kill_path, end.forced) == (CrawlEndKind.ERROR, "watchdog", True)
    assert end.error == "browser session did not start in 20s"


def test_a_page_without_progress_for_hang_after_s_is_a_hang():
    w = Watch.start(RULES, 100.0).stepped(SiteStatus.URL_CALL, "http://x.test/p/2", 1, 1_000.0, 103.0)
    assert w.watchdog_at == 113.0 and w.timed_out(112.99) is None
    end = w.timed_out(113.0)
    assert end is not None and (end.kind, end.kill_path, end.forced) == (CrawlEndKind.HANG, "watchdog", True)
    assert end.error == "no progress on http://x.test/p/2 for 10s"
    assert end.kind.reason is Reason.HANG


def test_only_a_navigation_under_way_is_watched_and_only_with_node_watchdogs():
    w = Watch.start(RULES, 100.0)
    done = w.stepped(SiteStatus.CALL_DONE, "http://x.test/", 1, 1_000.0, 101.0)
    assert done.watchdog_at is None and done.timed_out(10**6) is None
    hub_times = Watch.start(NodeRules(node_watchdog=False, hang_after_s=10), 100.0)
    call = hub_times.stepped(SiteStatus.URL_CALL, "http://x.test/", 0, 1_000.0, 101.0)
    assert call.watchdog_at is None and call.writes_each_step and not w.writes_each_step


def test_a_step_is_kept_as_the_progress_the_next_heartbeat_writes():
    w = Watch.start(RULES, 100.0).stepped(SiteStatus.URL_CALL, "http://x.test/", 2, 1_234.0, 101.0)
    assert w.progress == ops.Progress(SiteStatus.URL_CALL, 1_234.0, "http://x.test/", 2)
    assert (w.status, w.since) == (SiteStatus.URL_CALL, 101.0)


def test_the_node_wakes_for_the_next_heartbeat_or_its_watchdog_whichever_is_first():
    w = Watch.start(RULES, 100.0)  # beat due at 105, browser watchdog at 120
    assert w.wake_at == 105.0 and not w.beat_due(104.9) and w.beat_due(105.0)
    beaten = w.beaten(105.0)
    assert beaten.next_beat == 110.0
    hanging = beaten.stepped(SiteStatus.URL_CALL, "u", 0, 0.0, 106.0).beaten(115.0)  # watchdog 116, beat 120
    assert hanging.wake_at == 116.0


def test_the_claimed_message_is_hidden_at_once_then_only_when_it_could_show_before_two_more_beats():
    w = Watch.start(RULES, 100.0)
    assert w.hide_due(100.0)
    hidden = w.hidden(100.0)
    assert hidden.hidden_until == 100.0 + CLAIMED_VISIBILITY_S
    assert not hidden.hide_due(100.0 + CLAIMED_VISIBILITY_S - 10.01)  # 2 beats of 5 s still fit
    assert hidden.hide_due(100.0 + CLAIMED_VISIBILITY_S - 10.0)
    short = Watch.start(NodeRules(heartbeat_interval_s=5, claimed_visibility_s=20), 0.0).hidden(0.0)
    assert not short.hide_due(9.9) and short.hide_due(10.0)


# --- how an attempt ends and what follows -----------------------------------------------------------------------------


def test_a_crawler_that_died_is_an_error_that_says_how():
    assert protocol.exited_end(-9).error == "crawler process ended without a result (killed by signal 9)"
    assert protocol.exited_end(3).error == "crawler process ended without a result (exit code 3)"
    assert protocol.exited_end(0).kind is CrawlEndKind.ERROR and protocol.exited_end(0).forced


def test_only_ends_the_node_settles_itself_name_a_reason():
    assert {k: k.reason for k in CrawlEndKind} == {
        CrawlEndKind.RESULT: None,
        CrawlEndKind.HANG: Reason.HANG,
        CrawlEndKind.ERROR: Reason.ERROR,
        CrawlEndKind.FENCED: None,
        CrawlEndKind.SPOT: Reason.SPOT,
        CrawlEndKind.ROBOTS: Reason.ROBOTS,
        CrawlEndKind.CONTRACT: Reason.CONTRACT,
        CrawlEndKind.BUSY: Reason.BUSY,
    }
    args = protocol.end_attempt_args(protocol.spot_end({"action": "terminate"}), RULES, 500.0)
    assert args == dict(
        reason=Reason.SPOT,
        now=500.0,
        max_attempts=3,
        spot_cap=3,
        kill_path=None,
        error="spot interruption notice: {'action': 'terminate'}",
        failure=None,
        policy=RULES.retry,
    )
    for kind in (CrawlEndKind.RESULT, CrawlEndKind.FENCED):
        with pytest.raises(ValueError):
            protocol.end_attempt_args(CrawlEnd(kind), RULES, 500.0)


def ended(end: CrawlEnd, *, attempts_before: int = 0, max_attempts: int = 3, spot_cap: int = 3):
    """The record `ops.end_attempt` returns for `end` of a site's attempt after `attempts_before` failed ones."""
    table, rec = MemoryStateTable(), fresh()
    table.create_site(rec)
    rules = NodeRules(max_attempts=max_attempts, spot_cap=spot_cap)
    for _ in range(attempts_before):
        rec = ops.claim(table, rec, "i-1", 100.0)
        rec = ops.end_attempt(table, rec, **protocol.end_attempt_args(CrawlEnd(CrawlEndKind.ERROR), rules, 101.0))
    rec = ops.claim(table, rec, "i-1", 200.0)
    return rec.attempt, ops.end_attempt(table, rec, **protocol.end_attempt_args(end, rules, 300.0))


def test_a_hang_or_error_with_attempts_left_sends_the_next_attempts_message():
    attempt, new = ended(CrawlEnd(CrawlEndKind.HANG, kill_path="watchdog"))
    assert protocol.settle(CrawlEnd(CrawlEndKind.HANG), attempt, new).follow is FollowUp.REQUEUE


def test_the_last_attempt_failing_deletes_the_message():
    attempt, new = ended(CrawlEnd(CrawlEndKind.ERROR), attempts_before=2)
    assert new.run_status is RunStatus.FAILED
    assert protocol.settle(CrawlEnd(CrawlEndKind.ERROR), attempt, new).follow is FollowUp.FAIL


def test_a_given_back_attempt_releases_its_message_at_once_after_a_spot_notice_and_later_when_busy():
    spot = protocol.spot_end("notice")
    attempt, new = ended(spot)
    step = protocol.settle(spot, attempt, new)
    assert (step.follow, step.release_after_s) == (FollowUp.RELEASE, 0.0)
    busy = protocol.busy_end("s1", 60)
    attempt, new = ended(busy)
    step = protocol.settle(busy, attempt, new)
    assert (step.follow, step.release_after_s) == (FollowUp.RELEASE, BUSY_RETRY_S)
    assert busy.error == "profile lock of s1 held elsewhere for 60s"


def test_a_give_back_over_the_spot_cap_is_an_ordinary_requeue():
    spot = protocol.spot_end("notice")
    attempt, new = ended(spot, spot_cap=0)
    assert new.attempt == attempt
    assert protocol.settle(spot, attempt, new).follow is FollowUp.REQUEUE


# --- declared lost ---------------------------------------------------------------------------------------------------


def test_a_node_is_declared_lost_by_the_kill_mark_on_its_instance_or_by_its_attempts_outcome():
    table = MemoryStateTable()
    rec = claimed(table, node="i-1")
    marked = ops.request_kill(table, rec, Reason.LOST, 150.0)
    assert protocol.declared_lost(marked, 1, "i-1") and not protocol.declared_lost(marked, 1, "i-2")
    # the hub already ended the attempt: the mark is gone, the attempt's outcome says it
    over = ops.end_attempt(table, marked, reason=Reason.LOST, now=160.0, max_attempts=3, spot_cap=3)
    assert over.kill_reason is None
    assert protocol.declared_lost(over, 1, "i-1")
    assert not protocol.declared_lost(over, 2, "i-1") and not protocol.declared_lost(over, 1, "i-2")
    stop = protocol.stop_when_fenced(over, 1, "i-1")
    assert stop is not None and stop.why is StopWhy.LOST
    assert protocol.stop_when_fenced(None, 1, "i-1") is None


def test_a_hang_kill_is_not_a_loss():
    table = MemoryStateTable()
    marked = ops.request_kill(table, claimed(table, node="i-1"), Reason.HANG, 150.0)
    assert not protocol.declared_lost(marked, 1, "i-1") and protocol.stop_when_fenced(marked, 1, "i-1") is None


# --- when to stop taking work -----------------------------------------------------------------------------------------


def test_a_node_that_cannot_crawl_or_reach_aws_is_sick():
    assert protocol.sick(None, MAX_AWS_FAILURES - 1) is None
    stop = protocol.sick(None, MAX_AWS_FAILURES)
    assert stop is not None and stop.why is StopWhy.SICK and "10 tries in a row" in stop.detail
    grid = protocol.sick("the Grid node exited with code 1", 0)
    assert grid is not None and grid.detail == "the Grid node exited with code 1"


def test_before_each_receive_a_spot_notice_comes_first_then_a_pending_stop_then_sites_per_node():
    pending = protocol.Stop(StopWhy.LOST, "the hub declared this node lost")
    notice = protocol.before_receive(pending, {"action": "terminate"}, 0, RULES)
    assert notice is not None and notice.why is StopWhy.SPOT
    assert protocol.before_receive(pending, None, 0, RULES) is pending
    one = NodeRules(sites_per_node=1)
    assert protocol.before_receive(None, None, 0, one) is None
    done = protocol.before_receive(None, None, 1, one)
    assert done is not None and done.why is StopWhy.SITES_DONE
    assert protocol.before_receive(None, None, 10**6, RULES) is None  # 0: no limit


def test_an_empty_receive_stops_an_idle_node_or_one_whose_run_is_over():
    asked: list[int] = []

    def none_queued() -> bool:
        asked.append(1)
        return False

    assert protocol.idle_stop(2.9, RULES, none_queued) is None and not asked  # the Query only once idle is over
    idle = protocol.idle_stop(3.0, RULES, none_queued)
    assert idle is not None and idle.why is StopWhy.IDLE and idle.detail == "no work for 3s"
    assert protocol.idle_stop(3.0, RULES, lambda: True) is None  # a QUEUED site: its message is on its way
    assert protocol.idle_restarts(3.0, RULES) and not protocol.idle_restarts(2.9, RULES)
    held: list[bool] = []
    assert protocol.has_queued({"a": (1, "i-1", "RUN"), "b": (0, None, "QUEUED")}, lambda: held.append(True) or True)
    assert not held  # a QUEUED stamp is enough: the held range is not asked
    assert not protocol.has_queued({"a": (1, "i-1", "RUN")}, lambda: False)
    assert protocol.has_queued({"a": (1, "i-1", "RUN")}, lambda: True)  # a site the hub still holds
    running = RunInfo(RUN, "RUNNING", 0.0, 3600.0, "20261121")
    assert protocol.run_stop(running) is None
    for over in (None, RunInfo(RUN, "FINISHED", 0.0, 3600.0, "20261121")):
        stop = protocol.run_stop(over)
        assert stop is not None and stop.why is StopWhy.RUN_OVER


def test_a_spot_end_stops_the_node_whatever_its_settling_does():
    stop = protocol.stop_after(protocol.spot_end("x"))
    assert stop is not None and stop.why is StopWhy.SPOT
    assert all(protocol.stop_after(CrawlEnd(k)) is None for k in CrawlEndKind if k is not CrawlEndKind.SPOT)


# --- the node item and the rules --------------------------------------------------------------------------------------


def test_the_node_item_is_written_at_once_on_a_change_of_state_then_once_per_heartbeat_interval():
    card = NodeCard()
    assert card.due(-1e9) and card.due_at == -math.inf
    written = card.moved(NodeState.IDLE).written(100.0, RULES)
    assert not written.due(104.9) and written.due(105.0)
    busy = written.moved(NodeState.BUSY, fresh())
    assert busy.due(100.0) and (busy.state, busy.site, busy.attempt) == (NodeState.BUSY, "s1", 0)
    item = busy.item(RUN, "i-1", 1_000.0, 900.0, 4, expire_at=123)
    assert (item.state, item.site, item.heartbeat, item.started_at, item.sites_done, item.expire_at) == (
        "busy",
        "s1",
        1_000.0,
        900.0,
        4,
        123,
    )
    assert busy.moved(NodeState.IDLE).site is None


def test_the_rules_of_a_config():
    c = Config.model_validate(
        {
            "run": {"heartbeat_timeout_s": 60, "max_attempts": 5},
            "fleet": {"idle_exit_s": 2, "sites_per_node": 7},
            "sites": [{"id": "x", "start_url": "https://x.test/"}],
        }
    )
    r = rules_from_config(c)
    assert (r.heartbeat_interval_s, r.visibility_s, r.receive_wait_s, r.idle_exit_s) == (20.0, 60.0, 2.0, 2)
    assert (r.max_attempts, r.sites_per_node, r.claimed_visibility_s) == (5, 7, CLAIMED_VISIBILITY_S)
    tiny = rules_from_config(
        Config.model_validate(
            {"run": {"heartbeat_timeout_s": 1}, "sites": [{"id": "x", "start_url": "https://x.test/"}]}
        )
    )
    assert (tiny.heartbeat_interval_s, tiny.visibility_s, tiny.receive_wait_s) == (0.5, 30.0, 5.0)
