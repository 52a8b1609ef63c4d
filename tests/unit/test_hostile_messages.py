"""Hostile bodies on the site queue: `decode` refuses each in one short line and never raises; the node agent, on
the in-memory queue and table (tests.helpers.fake_node's Rig, a scripted crawl), says one bounded line per receive
of each, keeps going, never deletes one (they end in the DLQ) and crawls the honest message queued behind them."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.logs import JsonFormatter
from fleet.record import ops
from fleet.record.ids import is_run_id, is_site_id
from fleet.record.messages import MAX_ATTEMPT, BadMessage, SiteMessage, decode
from fleet.record.state import RunStatus, SiteSpec
from sim.memory import MemoryQueue
from tests.helpers.fake_node import RUN, Rig, pages_script, spied
from tests.helpers.hostile import HOSTILE, NO_RECORD, NOT_SITE_MESSAGES

#: The longest line the node logs for a refused message, in either format.
LINE_MAX = 1024


# --- decode ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(NOT_SITE_MESSAGES))
def test_a_body_that_is_no_site_message_is_a_bad_message_with_a_short_problem(name):
    body = NOT_SITE_MESSAGES[name]
    msg = decode(body, "rh", "m-1", 3)
    assert isinstance(msg, BadMessage), msg
    assert (msg.receipt, msg.message_id, msg.receive_count, msg.size) == ("rh", "m-1", 3, len(body))
    assert msg.problem and "\n" not in msg.problem and len(msg.problem) <= 200, msg.problem
    assert len(msg.body) <= 200


def test_the_problem_names_what_is_wrong():
    def problem(body: str) -> str:
        msg = decode(body, "rh", "m", 1)
        assert isinstance(msg, BadMessage)
        return msg.problem

    assert problem(NOT_SITE_MESSAGES["a list"]) == "a JSON array, not an object"
    assert problem(NOT_SITE_MESSAGES["no attempt"]) == "no attempt"
    assert problem(NOT_SITE_MESSAGES["attempt a bool"]) == "attempt True is not a whole number"
    assert problem(NOT_SITE_MESSAGES["attempt 0"]) == f"attempt 0 is not from 1 to {MAX_ATTEMPT}"
    assert problem(NOT_SITE_MESSAGES["numbers for ids"]).startswith("run_id 20261121 is not a run id (")
    assert problem(NOT_SITE_MESSAGES["a body of 256 KB"]).startswith("site 'ssss")
    assert "…' (262094 characters) is not a site id" in problem(NOT_SITE_MESSAGES["a body of 256 KB"])
    assert problem(NOT_SITE_MESSAGES["nested 256 KB deep"]).startswith("not JSON (maximum recursion depth")
    assert problem(NOT_SITE_MESSAGES["a site id ending in a newline"]).startswith("site 's1\\n' is not a site id")


def test_a_site_message_of_the_id_shape_decodes_whatever_records_there_are():
    for body in NO_RECORD.values():
        assert isinstance(decode(body, "rh", "m", 1), SiteMessage)  # the record decides: the node looks it up
    msg = decode('{"run_id": "2026-11-21", "site": "s1", "attempt": 2, "extra": [1]}', "rh", "m", 1)
    assert msg == SiteMessage("2026-11-21", "s1", 2, "rh", "m", 1)  # a key it does not know is no harm


def _fits(msg: SiteMessage | BadMessage) -> None:
    if isinstance(msg, SiteMessage):
        assert is_run_id(msg.run_id) and is_site_id(msg.site)
        assert type(msg.attempt) is int and 1 <= msg.attempt <= MAX_ATTEMPT
    else:
        assert isinstance(msg.problem, str) and len(msg.problem) <= 200 and "\n" not in msg.problem


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_decode_of_any_text_never_raises_and_returns_a_site_message_only_when_it_is_one(text):
    _fits(decode(text, "rh", "m", 1))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=200),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
FIELD = JSON | st.sampled_from(["2026-11-21", "s1", "a" * 200, "s1\n", ""]) | st.integers(-3, MAX_ATTEMPT + 3)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(["run_id", "site", "attempt", "other"]), FIELD))
def test_decode_of_any_json_object_of_those_keys_never_raises_and_checks_each(fields):
    msg = decode(json.dumps(fields), "rh", "m", 1)
    _fits(msg)
    valid = (
        is_run_id(fields.get("run_id"))
        and is_site_id(fields.get("site"))
        and type(fields.get("attempt")) is int
        and 1 <= fields["attempt"] <= MAX_ATTEMPT
    )
    assert isinstance(msg, SiteMessage) is bool(valid)


# --- the agent ------------------------------------------------------------------------------------------------------


def refusals(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) in ("bad-message", "refused-message")]


def line_lengths(record: logging.LogRecord) -> tuple[int, int]:
    """The record's line as a terminal shows it and as a log pipeline gets it (JSON)."""
    return len(record.getMessage()), len(JsonFormatter().format(record))


@pytest.mark.parametrize("fifo", [False, True], ids=["standard", "fifo"])
def test_hostile_messages_are_refused_one_line_each_never_deleted_and_the_honest_one_behind_them_is_crawled(
    tmp_path, caplog, fifo
):
    rig = spied(Rig(tmp_path, [pages_script(2)]))
    rig.queue = MemoryQueue(clock=rig.clock, max_receive_count=3, fifo=fifo)
    rig.agent.queue = rig.queue_spy = type(rig.queue_spy)(rig.queue)
    for body in HOSTILE.values():
        rig.queue.send_raw(body)
    rig.seed()  # the honest message, queued behind them all

    with caplog.at_level(logging.INFO, logger="gridfleet.node"):
        assert rig.agent.run() == 0  # it idles out once nothing is left: nothing crashed it

    rec = rig.site()
    assert (rec.run_status, rec.attempt, len(rig.crawls)) == (RunStatus.COMPLETED, 1, 1)
    assert rig.queue.messages == [] and len(rig.queue.dlq) == len(HOSTILE)  # each received 3 times, then moved
    deleted = [args[0] for args in rig.queue_spy.named("delete")]
    assert all(isinstance(m, SiteMessage) and (m.run_id, m.site) == (RUN, "s1") for m in deleted), deleted
    looked_up = {tuple(args) for args in rig.table_spy.named("get_site")}  # only ids of their shape became keys
    assert looked_up <= {(RUN, "s1"), (RUN, "nope"), ("another-run", "s1")}

    said = refusals(caplog)
    assert len(said) == 3 * len(HOSTILE)  # one line per receive
    assert all(r.levelno == logging.WARNING for r in said)
    for r in said:
        text, as_json = line_lengths(r)
        assert text < LINE_MAX and as_json < LINE_MAX, r.getMessage()[:300]
    no_record = [r for r in said if r.event == "refused-message"]
    assert {(r.fields["run_id"], r.fields["site"]) for r in no_record} == {(RUN, "nope"), ("another-run", "s1")}
    assert {r.fields["why"] for r in no_record} == {"no such site in its run"}


def test_a_bad_messages_line_shows_its_problem_and_the_start_of_its_body_escaped(tmp_path, caplog):
    rig = Rig(tmp_path, [], idle_exit_s=3)
    rig.queue.max_receive_count = 1
    rig.queue.send_raw(HOSTILE["a site id with a terminal escape"])
    with caplog.at_level(logging.INFO, logger="gridfleet.node"):
        rig.agent.run()
    (line,) = refusals(caplog)
    assert line.fields["problem"].startswith("site '\\x1b[2J\\x1b[31ms1' is not a site id")
    assert line.fields["body"].startswith('\'{"run_id"') and "\x1b" not in line.getMessage()
    assert line.fields["chars"] == len(HOSTILE["a site id with a terminal escape"])


def test_a_message_of_another_run_is_left_in_the_queue_for_its_nodes(tmp_path, caplog):
    rig = Rig(tmp_path, [pages_script(1)])
    other = ops.new_site("another-run", "s1", SiteSpec("http://x.test/"), None)
    rig.table.create_site(other)
    ops.send_next(rig.table, rig.queue, other)
    before = rig.table.get_site("another-run", "s1")
    rig.seed()

    with caplog.at_level(logging.INFO, logger="gridfleet.node"):
        assert rig.agent.run() == 0

    assert rig.site().run_status is RunStatus.COMPLETED and len(rig.crawls) == 1
    assert rig.table.get_site("another-run", "s1") == before  # not claimed
    (left,) = rig.queue.messages  # not deleted: hidden, for that run's nodes
    assert json.loads(left.body)["run_id"] == "another-run"
    (line,) = refusals(caplog)
    assert (line.levelno, line.fields["why"], line.fields["run_id"]) == (
        logging.INFO,
        "a message of another run",
        "another-run",
    )
