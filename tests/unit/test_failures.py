"""Failures by class and each class's retry: the classification the crawler process, the node and the hub share,
`run.retry`'s rules over the defaults, the record's fields, the hub sending a retry once its backoff ends, and a
blocked site's retry leaving the node it was blocked on."""

from __future__ import annotations

import dataclasses
import json
import socket
import ssl
import urllib.error

import pytest

from fleet import protocol
from fleet.config import Config
from fleet.protocol import CrawlEnd, CrawlEndKind, FollowUp, MessageAction, NodeRules
from fleet.record import ops
from fleet.record.blocked import Markers, marker_problem
from fleet.record.codec import item_to_site, site_to_item
from fleet.record.failures import (
    Failure,
    FailureClass,
    RetryPolicy,
    failure_of_event,
    failure_to_event,
    failures_by_class,
    of_exception,
    of_status,
    retry_after,
)
from fleet.record.messages import SiteMessage
from fleet.record.state import Reason, RunStatus, SiteSpec
from hub.actions import Enqueue
from node.crawler import Blocked, CrawlError
from sim.memory import MemoryStateTable
from tests.unit.test_plan import World, config, site

NOW = 1_800_000_000.0
C = FailureClass


# --- the classes ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "cls"),
    [(404, C.HTTP_4XX), (410, C.HTTP_4XX), (400, C.HTTP_4XX), (401, C.BLOCKED), (403, C.BLOCKED), (429, C.BLOCKED)]
    + [(500, C.HTTP_5XX), (503, C.HTTP_5XX)],
)
def test_an_http_status_has_its_class(status, cls):
    assert of_status(status) == Failure(cls, status)


def test_a_success_or_a_redirect_is_no_failure():
    assert of_status(200) is None and of_status(304) is None


@pytest.mark.parametrize(
    ("message", "cls"),
    [
        ("unknown error: net::ERR_NAME_NOT_RESOLVED\n  (Session info: chrome=120)", C.DNS),
        ("unknown error: net::ERR_CONNECTION_REFUSED", C.CONNECT),
        ("unknown error: net::ERR_CONNECTION_RESET", C.CONNECT),
        ("unknown error: net::ERR_ADDRESS_UNREACHABLE", C.CONNECT),
        ("unknown error: net::ERR_CERT_AUTHORITY_INVALID", C.TLS),
        ("unknown error: net::ERR_SSL_PROTOCOL_ERROR", C.TLS),
        ("unknown error: net::ERR_CONNECTION_TIMED_OUT", C.TIMEOUT),
        ("NoSuchElementException: no such element: div.price", C.ERROR),
    ],
)
def test_chromiums_network_errors_are_classed_by_their_code(message, cls):
    assert of_exception(RuntimeError(message)).cls is cls


@pytest.mark.parametrize(
    ("exc", "cls"),
    [
        (urllib.error.URLError(socket.gaierror(-2, "Name or service not known")), C.DNS),
        (urllib.error.URLError(ConnectionRefusedError(111, "refused")), C.CONNECT),
        (urllib.error.URLError(ssl.SSLCertVerificationError("certificate verify failed")), C.TLS),
        (TimeoutError("timed out"), C.TIMEOUT),
        (ConnectionResetError(104, "reset"), C.CONNECT),
    ],
)
def test_pythons_network_errors_are_classed_by_their_type(exc, cls):
    assert of_exception(exc).cls is cls


def test_a_crawl_errors_own_class_and_seleniums_page_timeout_are_kept():
    assert of_exception(Blocked("x", Failure(C.BLOCKED, 403))) == Failure(C.BLOCKED, 403)
    assert of_exception(CrawlError("selector missing")) == Failure(C.ERROR)
    from selenium.common.exceptions import TimeoutException

    assert of_exception(TimeoutException("page load")).cls is C.TIMEOUT


def test_retry_after_is_read_in_seconds_and_a_date_or_garbage_is_none():
    assert retry_after("120") == 120.0 and retry_after(" 7 ") == 7.0
    assert retry_after("Wed, 21 Oct 2026 07:28:00 GMT") is None and retry_after(None) is None
    assert retry_after("-5") is None and retry_after("99999999") == 24 * 3600


def test_what_a_crawler_process_reports_is_checked_before_it_is_used():
    f = Failure(C.HTTP_5XX, 503, 30.0)
    assert failure_of_event(failure_to_event(f)) == f
    assert failure_of_event({"class": "nonsense"}) is None and failure_of_event("http_4xx") is None
    odd = failure_of_event({"class": "http_4xx", "status": 9999, "retry_after": -1})
    assert odd == Failure(C.HTTP_4XX, None, None)
    assert failure_of_event({"class": "blocked", "status": True, "retry_after": float("inf")}) == Failure(C.BLOCKED)


def test_failed_attempts_are_counted_by_label():
    pairs = [("http_4xx", 404), ("http_4xx", 404), ("timeout", None), ("junk", 1), (None, None), ("blocked", 403)]
    assert failures_by_class(pairs) == {"blocked 403": 1, "http_4xx 404": 2, "timeout": 1}


# --- the rules -----------------------------------------------------------------------------------------------------


def test_the_default_rules():
    p = RetryPolicy()
    assert not p.rule(Failure(C.HTTP_4XX, 404)).retry and not p.rule(Failure(C.HTTP_4XX, 410)).retry
    assert p.rule(Failure(C.HTTP_4XX, 400)).retry
    assert not p.rule(Failure(C.CONTRACT)).retry and not p.rule(Failure(C.ROBOTS)).retry
    blocked = p.rule(Failure(C.BLOCKED, 403))
    assert blocked.retry and blocked.other_node and blocked.backoff_s > 0
    too_many = p.rule(Failure(C.BLOCKED, 429))  # its status's rule comes first: later, from any node
    assert too_many.retry and not too_many.other_node
    assert p.rule(Failure(C.HTTP_5XX, 503)).delay(1, retry_after_s=42.0) == 42.0
    assert p.rule(Failure(C.HANG)).delay(1) == 0 and p.rule(Failure(C.ERROR)).delay(1) == 0


def test_a_backoff_grows_with_each_failure_up_to_its_most():
    rule = RetryPolicy().rule(Failure(C.TIMEOUT))
    assert [rule.delay(n) for n in (1, 2, 3)] == [15, 30, 60]
    assert dataclasses.replace(rule, max_s=20).delay(3) == 20
    assert dataclasses.replace(rule, max_s=20).delay(1, retry_after_s=3600) == 20


def test_run_retry_sets_rules_over_the_defaults():
    c = Config.model_validate(
        {
            "run": {"retry": {"http_404": "retry", "timeout": {"backoff_s": 60}, "contract": "retry", "dns": "fail"}},
            "sites": [{"id": "a", "start_url": "https://a.example/"}],
        }
    )
    p = c.run.retry_policy
    assert p.rule(Failure(C.HTTP_4XX, 404)) == RetryPolicy().rule(Failure(C.HTTP_4XX, 400))  # as its class
    assert p.rule(Failure(C.TIMEOUT)).backoff_s == 60 and p.rule(Failure(C.TIMEOUT)).factor == 2
    assert p.rule(Failure(C.CONTRACT)).retry and not p.rule(Failure(C.DNS)).retry
    assert not p.rule(Failure(C.HTTP_4XX, 410)).retry  # untouched


# --- the record and the follow-up ---------------------------------------------------------------------------------


@pytest.fixture
def table():
    return MemoryStateTable()


def claimed(table, node="i-1"):
    r = ops.new_site("r1", "s1", SiteSpec("http://x.test/"), None)
    table.create_site(r)
    return ops.claim(table, r, node, NOW)


def end(table, r, failure, **kw):
    return ops.end_attempt(table, r, reason=Reason.ERROR, now=NOW, max_attempts=3, spot_cap=1, failure=failure, **kw)


def test_a_404_fails_at_once_with_its_class_on_the_record_and_the_attempt(table):
    new = end(table, claimed(table), Failure(C.HTTP_4XX, 404))
    assert new.run_status is RunStatus.FAILED and new.attempt == 1
    assert (new.failure_class, new.http_status, new.failure_reason) == ("http_4xx", 404, "error")
    assert (new.attempts[-1].failure_class, new.attempts[-1].http_status) == ("http_4xx", 404)
    assert item_to_site(site_to_item(new)) == new


def test_a_503_waits_its_retry_after_and_its_message_is_the_hubs_to_send(table):
    new = end(table, claimed(table), Failure(C.HTTP_5XX, 503, 40.0))
    assert new.run_status is RunStatus.QUEUED and not new.enqueued and new.retry_at == NOW + 40
    end_ = CrawlEnd(CrawlEndKind.ERROR, failure=Failure(C.HTTP_5XX, 503, 40.0))
    assert protocol.settle(end_, 1, new).follow is FollowUp.DEFER
    w = World(config(1), [site("s1", enqueued=False, version=new.version, attempt=1, retry_at=NOW + 40)])
    early = w.plan(NOW + 39)
    assert not any(isinstance(a, Enqueue) for a in early.actions) and early.wake_at <= NOW + 40
    assert Enqueue("s1", new.version) in w.plan(NOW + 40).actions


def test_an_error_or_a_hang_is_retried_at_once_by_the_node_as_before(table):
    new = end(table, claimed(table), None)
    assert new.run_status is RunStatus.QUEUED and new.retry_at is None and new.failure_class == "error"
    assert protocol.settle(CrawlEnd(CrawlEndKind.ERROR), 1, new).follow is FollowUp.REQUEUE


def test_a_lost_node_is_no_failure_of_the_site(table):
    new = ops.end_attempt(table, claimed(table), reason=Reason.LOST, now=NOW, max_attempts=3, spot_cap=1)
    assert new.run_status is RunStatus.QUEUED and new.failure_class is None and new.retry_at is None


def test_a_policy_that_fails_a_class_fails_the_site_with_attempts_left(table):
    policy = RetryPolicy.of({"timeout": {"retry": False}})
    new = end(table, claimed(table), Failure(C.TIMEOUT), policy=policy)
    assert new.run_status is RunStatus.FAILED and new.attempt == 1


def test_a_blocked_retry_leaves_the_node_it_was_blocked_on_for_a_few_receives(table):
    new = end(table, claimed(table, "i-aaaa1111"), Failure(C.BLOCKED, 403))
    assert new.avoid_instance == "i-aaaa1111" and new.retry_at == NOW + 300
    rules = NodeRules()

    def step(node, receives):
        return protocol.on_message(SiteMessage("r1", "s1", 2, "rh", "m", receives), new, "r1", rules, node).action

    left = protocol.on_message(SiteMessage("r1", "s1", 2, "rh", "m", 1), new, "r1", rules, "i-aaaa1111")
    assert left.visibility_s == protocol.AVOID_HIDE_S and left.step_back_s > left.visibility_s  # shows to others
    assert step("i-aaaa1111", 1) is MessageAction.HIDE
    assert step("i-bbbb2222", 1) is MessageAction.CLAIM
    assert step("i-aaaa1111", protocol.AVOID_RECEIVES) is MessageAction.CLAIM  # no other node took it
    again = ops.claim(table, new, "i-bbbb2222", NOW + 300)
    assert again.avoid_instance is None and again.retry_at is None


def test_what_a_node_wrote_in_the_failure_fields_is_checked_when_read_back(table):
    item = site_to_item(end(table, claimed(table), Failure(C.BLOCKED, 403)))
    item.update(failure_class="<script>", http_status=12345, retry_at="soon", avoid_instance=["x"])
    item["attempts"][-1].update(failure_class=7, http_status="403")
    back = item_to_site(item)
    assert (back.failure_class, back.http_status, back.retry_at, back.avoid_instance) == (None, None, None, None)
    assert (back.attempts[-1].failure_class, back.attempts[-1].http_status) == (None, None)


# --- blocked pages ---------------------------------------------------------------------------------------------------


def test_challenge_pages_of_common_defences_are_blocked_and_ordinary_pages_are_not():
    m = Markers()
    assert m.match("Just a moment...\n<html><head><title>Just a moment...</title>") is not None
    assert m.match("x\n<script src='https://ct.captcha-delivery.com/c.js'></script>") is not None
    assert m.match("Shop\n<html><title>Shop</title><body>Access to our catalogue</body>") is None
    own = Markers([r"please verify you are (a )?human"])
    assert own.match("Hi\n<p>Please verify you are human</p>") == r"please verify you are (a )?human"


def test_a_marker_that_is_no_regular_expression_is_refused():
    assert marker_problem("div\\[") is None
    assert "not a regular expression" in (marker_problem("(unclosed") or "")
    assert marker_problem("") and marker_problem("x" * 201) and marker_problem(3)


def test_markers_travel_on_the_record_and_bad_ones_are_dropped_on_the_way_back(table):
    spec = SiteSpec("http://x.test/", blocked_markers=("verify you are human",))
    r = ops.new_site("r1", "s2", spec, None)
    item = site_to_item(r)
    assert item_to_site(item).spec.blocked_markers == ("verify you are human",)
    item["spec"]["blocked_markers"] = ["(bad", "ok", 5]
    assert item_to_site(item).spec.blocked_markers == ("ok",)


def test_the_site_configs_markers_are_checked_at_load():
    with pytest.raises(ValueError, match="not a regular expression"):
        Config.model_validate({"sites": [{"id": "a", "start_url": "https://a.example/", "blocked_markers": ["(x"]}]})


# --- shown -------------------------------------------------------------------------------------------------------


def test_the_summary_and_the_report_count_failed_attempts_by_class(table):
    from cli.report.page import render_report
    from fleet.outputs.summary import build_summary
    from fleet.record.partition import RunInfo
    from fleet.record.state import RunState

    gone = end(table, claimed(table), Failure(C.HTTP_4XX, 404))
    r = ops.new_site("r1", "s2", SiteSpec("http://y.test/"), None)
    table.create_site(r)
    b = end(table, ops.claim(table, r, "i-1", NOW), Failure(C.BLOCKED, 403))
    b = end(table, ops.claim(table, b, "i-2", NOW + 300), Failure(C.BLOCKED, 403))
    run = RunInfo("r1", RunState.FINISHED, NOW, NOW + 3600, "20261121")
    summary = build_summary(run, [gone, b], left_running=0, finished_at=NOW + 400, finish_reason="all sites done")
    assert summary["failures"] == {"blocked 403": 2, "http_4xx 404": 1}
    assert summary["sites"]["s1"]["failure_class"] == "http_4xx" and summary["sites"]["s1"]["http_status"] == 404
    assert summary["sites"]["s2"]["retry_at"] == NOW + 600  # the second blocked attempt waits twice as long
    assert [a["failure_class"] for a in summary["sites"]["s2"]["attempts"]] == ["blocked", "blocked"]
    page = render_report(json.loads(json.dumps(summary)), generated_at=NOW + 500)
    failures = page[page.index('id="failures"') : page.index('id="pacing"')]
    assert ">blocked 403<" in failures and ">http_4xx 404<" in failures
    assert "error (http_4xx 404)" in page


def test_run_retry_survives_the_run_configs_round_trip_to_the_nodes(tmp_path):
    from fleet.config.load import dump_config, load_config

    c = Config.model_validate(
        {"run": {"retry": {"blocked": {"backoff_s": 1}}}, "sites": [{"id": "a", "start_url": "https://a.example/"}]}
    )
    path = tmp_path / "run.yaml"
    path.write_text(dump_config(c))
    back = load_config(path).run.retry_policy.rule(Failure(C.BLOCKED, 403))
    assert back == c.run.retry_policy.rule(Failure(C.BLOCKED, 403))
    assert back.other_node and back.backoff_s == 1  # what was not set keeps its default, after the trip too
