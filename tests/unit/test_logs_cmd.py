"""The log shipper's parts that need no AWS: event times, stream names, batches, reading files, offsets, and the
follower's loop against a sink that answers late."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cli.commands import logs as logs_cmd
from cli.commands.logs import FLUSH_AFTER_S, POLL_S, Shipper, Tail
from fleet.aws import cwlogs
from fleet.clock import FakeClock

NOW = 1_795_000_000.0  # 2026-11-18


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("2026-11-27T06:52:07Z boot: starting", 1_795_762_327.0),  # the boot script's lines
        ("2026-11-27T06:52:07.250+09:00 x", 1_795_762_327.25 - 9 * 3600),
        ("2026-11-27 06:52:07 naive is UTC", 1_795_762_327.0),
        ('{"ts": "2026-11-27T06:52:07.123+00:00", "event": "claim"}', 1_795_762_327.123),  # fleet.logs' JSON
        ('{"event": "claim"}', None),
        ("{not json", None),
        ("06:52:07.123 INFO [LocalNode.<init>] - the Grid's lines carry no date", None),
        ("2026-13-45T06:52:07Z not a date", None),
    ],
)
def test_line_time(line, expected):
    got = cwlogs.line_time(line)
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_a_line_is_filed_at_its_own_time_only_within_what_cloudwatch_takes():
    at = "2026-11-18T00:00:00Z"
    base = cwlogs.line_time(at + " x")
    assert base is not None
    assert cwlogs.event_time(at + " x", base + 60) == base
    assert cwlogs.event_time(at + " x", base + 14 * 86400) == base + 14 * 86400  # too old: when it was read
    assert cwlogs.event_time(at + " x", base - 3 * 3600) == base - 3 * 3600  # too far ahead
    assert cwlogs.event_time("no time", NOW) == NOW


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("2026-11-27/i-0123456789abcdef0", ("2026-11-27", "i-0123456789abcdef0")),
        ("demo-1/i-1234abcd", ("demo-1", "i-1234abcd")),
        ("2026-11-27/i-0123456789ABCDEF0", None),
        ("2026-11-27/i-0123456789abcdef", None),  # 16 digits
        ("2026-11-27/i-0123456789abcdef0/x", None),
        ("-bad/i-1234abcd", None),
        ("2026-11-27", None),
        (None, None),
    ],
)
def test_stream_names_read_back_are_checked(name, expected):
    assert cwlogs.split_stream(name) == expected


def test_a_line_is_about_a_site_by_its_json_field_or_a_whole_word():
    assert cwlogs.is_about('{"site": "alpha", "event": "claim"}', "alpha")
    assert not cwlogs.is_about('{"site": "alphabet", "msg": "site=alpha"}', "alpha")
    assert cwlogs.is_about("kill site=alpha attempt=2", "alpha")
    assert cwlogs.is_about("site=alpha", "alpha")
    assert not cwlogs.is_about("kill site=alpha.b website=alpha site=alphabet", "alpha")
    assert not cwlogs.is_about("site=a.b", "a-b")  # the id is matched as it is, not as a pattern


def test_a_batch_holds_what_one_call_takes():
    b = cwlogs.Batch()
    assert b.fits(cwlogs.MAX_EVENT_BYTES, NOW)
    b.add(100, NOW, 5.0)
    b.add(100, NOW + 3600, 6.0)
    assert b.since == 5.0 and b.count == 2
    assert b.fits(100, NOW - 3600)
    assert not b.fits(100, NOW + cwlogs.MAX_BATCH_SPAN_S + 1)
    assert not b.fits(cwlogs.Batch.MAX_BYTES, NOW)
    b.count = cwlogs.Batch.MAX_EVENTS
    assert not b.fits(1, NOW)


def test_a_message_is_cut_to_one_event_on_a_character_boundary():
    text = "é" * cwlogs.MAX_MESSAGE_BYTES
    cut = cwlogs.fit_message(text)
    assert len(cut.encode()) <= cwlogs.MAX_MESSAGE_BYTES and set(cut) == {"é"}
    assert cwlogs.fit_message("short") == "short"


def test_refused_events_are_counted_from_the_answer():
    assert cwlogs._refused(None, 10) == 0
    assert cwlogs._refused({"tooOldLogEventEndIndex": 2}, 10) == 3
    assert cwlogs._refused({"expiredLogEventEndIndex": 4, "tooOldLogEventEndIndex": 1}, 10) == 5
    assert cwlogs._refused({"tooNewLogEventStartIndex": 7}, 10) == 3


def test_an_unanswered_flush_is_worded_as_such():
    line = cwlogs.ship_problem("/s/node", cwlogs.Flushed(settled=False, ok=False))
    assert line.startswith("cannot ship logs to /s/node: CloudWatch Logs did not answer in time")


def test_printed_messages_cannot_steer_the_terminal():
    assert logs_cmd._printable("a\tb\x1b[2Jc\nd\x9b") == "a\tb\\x1b[2Jc\\x0ad\\x9b"


# --- reading files -------------------------------------------------------------------------------------------------
def read(tail: Tail, now: float = 0.0, final: bool = False) -> list[tuple[str, int]]:
    got = list(tail.lines(now, final))
    if got:
        tail.pos = got[-1][1]
    return got


def test_a_tail_holds_one_cut_line_however_long_and_says_its_length(tmp_path, monkeypatch):
    monkeypatch.setattr(logs_cmd, "READ_BUDGET", 1 << 30)
    log = tmp_path / "a.log"
    log.write_bytes(b"first\r\n" + b"y" * 5_000_000 + b"\nlast\n")
    tail = Tail(log, None)
    assert tail.open(once=False)
    held: list[int] = []
    real_take = tail._take

    def take(piece: bytes) -> None:
        real_take(piece)
        held.append(len(tail._head))

    tail._take = take  # type: ignore[method-assign]
    got = read(tail)
    assert [t[:5] for t, _ in got] == ["first", "yyyyy", "last"]
    assert got[1][0].endswith(f" [line cut: 5000000 bytes, the first {logs_cmd.LINE_HEAD_BYTES} shipped]")
    assert [after for _, after in got] == [7, 5_000_008, 5_000_013]
    assert max(held) == logs_cmd.LINE_HEAD_BYTES  # never more than the head of one line


def test_a_cut_line_of_bytes_that_are_not_utf8_keeps_its_note(tmp_path):
    log = tmp_path / "a.log"
    log.write_bytes(b"\xff" * 300_000 + b"\n")
    tail = Tail(log, None)
    tail.open(once=False)
    [(text, after)] = read(tail)
    assert text.endswith(f" [line cut: 300000 bytes, the first {logs_cmd.LINE_HEAD_BYTES} shipped]")
    assert after == 300_001
    assert len(text.encode()) <= cwlogs.MAX_MESSAGE_BYTES


def test_a_last_line_without_newline_waits_until_it_stops_growing(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("whole\npart")
    tail = Tail(log, None)
    tail.open(once=False)
    assert read(tail, now=0.0) == [("whole", 6)]
    with log.open("a") as f:
        f.write("ial")
    assert read(tail, now=5.0) == []  # it grew at 5 s
    assert read(tail, now=5.0 + logs_cmd.PARTIAL_AFTER_S - 1) == []
    assert read(tail, now=5.0 + logs_cmd.PARTIAL_AFTER_S) == [("partial", 13)]


def test_a_tail_reads_a_budget_a_poll(tmp_path, monkeypatch):
    monkeypatch.setattr(logs_cmd, "READ_BUDGET", 10)
    monkeypatch.setattr(logs_cmd, "READ_CHUNK", 4)
    log = tmp_path / "a.log"
    log.write_text("0123\n5678\nabcd\nend")
    tail = Tail(log, None)
    tail.open(once=False)
    assert [t for t, _ in read(tail, final=True)] == ["0123", "5678"] and tail.behind
    assert [t for t, _ in read(tail, final=True)] == ["abcd", "end"] and not tail.behind


def test_offsets_survive_a_restart_and_a_broken_file_is_said_once(tmp_path):
    said: list[str] = []
    offsets = cwlogs.Offsets(tmp_path, said.append)
    assert offsets.load() == {}
    offsets.save([(tmp_path / "a.log", cwlogs.Mark((1, 2), 30)), (tmp_path / "b.log", None)])
    assert cwlogs.Offsets(tmp_path, said.append).load() == {str(tmp_path / "a.log"): cwlogs.Mark((1, 2), 30)}
    (tmp_path / "offsets.json").write_text('{"files": {"x": {"dev": "?"}}}')
    assert cwlogs.Offsets(tmp_path, said.append).load() == {}
    assert len(said) == 1 and "every file is shipped from its start" in said[0]
    assert json.loads((tmp_path / "offsets.json").read_text())  # left as it was, to look at


# --- the follower against a sink that answers late ---------------------------------------------------------------
class LateSink:
    """Answers its first two flushes only with `not settled`, as when CloudWatch is slow to answer."""

    def __init__(self) -> None:
        self.puts: list[str] = []
        self.answers = [cwlogs.Flushed(settled=False, ok=False)] * 2

    def put(self, message: str, when: float) -> None:
        self.puts.append(message)

    def flush(self, wait_s: float | None = None) -> cwlogs.Flushed:
        return self.answers.pop(0) if self.answers else cwlogs.Flushed(settled=True, ok=True)


class WedgedSink:
    """A sink whose first batch never gets an answer, as on a connection that went dead: every flush after waits
    behind it. Each flush takes the time it waits on `clock` (FLUSH_WAIT_S unless told)."""

    def __init__(self, clock: FakeClock, *, wedged: bool = True) -> None:
        self.clock, self.wedged = clock, wedged
        self.puts: list[str] = []
        self.waits: list[float] = []
        self.abandoned = False

    def put(self, message: str, when: float) -> None:
        self.puts.append(message)

    def flush(self, wait_s: float | None = None) -> cwlogs.Flushed:
        assert not self.abandoned, "a sink given up on is flushed no more"
        wait = logs_cmd.FLUSH_WAIT_S if wait_s is None else wait_s
        self.waits.append(wait)
        if self.wedged:
            self.clock.advance(wait)
            return cwlogs.Flushed(settled=False, ok=False)
        return cwlogs.Flushed(settled=True, ok=True)

    def abandon(self) -> None:
        self.abandoned = True

    def close(self) -> None:
        pass


class Polls(FakeClock):
    def __init__(self, polls: int):
        super().__init__(time.time())
        self.left = polls

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        self.left -= 1


def test_a_flush_left_unanswered_is_retried_from_the_offsets(tmp_path: Path):
    log = tmp_path / "a.log"
    log.write_text("l-1\n")
    said: list[str] = []
    sink, clock = LateSink(), Polls(80)
    tails = [Tail(log, None)]
    offsets = cwlogs.Offsets(tmp_path, said.append)
    shipper = Shipper(tails, sink, offsets, clock, group="/s/node", once=False, say=said.append)  # type: ignore[arg-type]
    assert shipper.run(lambda: clock.left <= 0) == 0
    assert sink.puts == ["l-1", "l-1"]  # put again after the retry, from the offset
    assert len(said) == 2 and "did not answer in time" in said[0] and "at most a minute apart" in said[0]
    assert said[1] == "shipping to /s/node works again"
    assert cwlogs.Offsets(tmp_path, said.append).load()[str(log)].offset == 4


def test_at_a_stop_the_lines_read_get_one_more_try_even_while_shipping_fails(tmp_path: Path):
    """An instance shuts down while CloudWatch answered late: its last lines are tried once more, not dropped."""
    log = tmp_path / "a.log"
    log.write_text("l-1\n")
    said: list[str] = []
    sink, clock = LateSink(), Polls(1000)
    shipper = Shipper([Tail(log, None)], sink, cwlogs.Offsets(tmp_path, said.append), clock, group="/s/node",
                      once=False, say=said.append)  # type: ignore[arg-type]  # fmt: skip
    first = clock.monotonic()
    stop_after_failure = lambda: shipper.retry_at is not None  # noqa: E731 - stop as soon as a flush has failed
    assert shipper.run(stop_after_failure) == 0
    # tried again at once: no wait beyond the first flush's (after FLUSH_AFTER_S)
    assert sink.puts == ["l-1", "l-1"] and clock.monotonic() - first <= FLUSH_AFTER_S + POLL_S
    assert cwlogs.Offsets(tmp_path, said.append).load()[str(log)].offset == 4


def test_a_sink_whose_batch_never_gets_an_answer_is_replaced_and_the_lines_go_through_the_new_one(tmp_path: Path):
    """Without a new sink, every try would wait behind the batch that has no answer, for as long as the run."""
    log = tmp_path / "a.log"
    log.write_text("l-1\nl-2\n")
    said: list[str] = []
    clock = Polls(80)
    wedged, made = WedgedSink(clock), []

    def new_sink() -> WedgedSink:
        made.append(WedgedSink(clock, wedged=False))
        return made[-1]

    shipper = Shipper([Tail(log, None)], wedged, cwlogs.Offsets(tmp_path, said.append), clock, group="/s/hub",  # type: ignore[arg-type]
                      once=False, say=said.append, new_sink=new_sink)  # type: ignore[arg-type]  # fmt: skip
    assert shipper.run(lambda: clock.left <= 0) == 0
    assert wedged.abandoned and wedged.waits == [logs_cmd.FLUSH_WAIT_S] * 2  # a slow answer is waited for twice
    assert len(made) == 1 and made[0].puts == ["l-1", "l-2"] and not made[0].abandoned
    assert shipper.sink is made[0]
    assert cwlogs.Offsets(tmp_path, said.append).load()[str(log)].offset == len("l-1\nl-2\n")
    assert said[-1] == "shipping to /s/hub works again"


def test_at_a_stop_the_last_lines_take_at_most_the_stop_time_and_a_new_sink_when_the_old_one_is_wedged(tmp_path):
    """SIGTERM while the sink in use has a batch with no answer: half of STOP_WAIT_S for it, the rest for a new
    one, which ships the lines; the offsets move past them."""
    log = tmp_path / "a.log"
    log.write_text("l-1\n")
    said: list[str] = []
    clock = Polls(1000)
    wedged, fresh = WedgedSink(clock), WedgedSink(clock, wedged=False)
    shipper = Shipper([Tail(log, None)], wedged, cwlogs.Offsets(tmp_path, said.append), clock, group="/s/hub",  # type: ignore[arg-type]
                      once=False, say=said.append, new_sink=lambda: fresh)  # type: ignore[arg-type,return-value]  # fmt: skip
    first = clock.monotonic()
    assert shipper.run(lambda: True) == 0
    assert wedged.waits == [logs_cmd.STOP_WAIT_S / 2] and wedged.abandoned
    assert fresh.puts == ["l-1"] and fresh.waits == [pytest.approx(logs_cmd.STOP_WAIT_S / 2)]
    assert clock.monotonic() - first <= logs_cmd.STOP_WAIT_S
    assert cwlogs.Offsets(tmp_path, said.append).load()[str(log)].offset == 4


def test_at_a_stop_lines_no_sink_confirms_are_given_up_within_the_stop_time_and_said(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("l-1\n")
    said: list[str] = []
    clock = Polls(1000)
    sinks = [WedgedSink(clock), WedgedSink(clock), WedgedSink(clock)]
    shipper = Shipper([Tail(log, None)], sinks[0], cwlogs.Offsets(tmp_path, said.append), clock, group="/s/hub",  # type: ignore[arg-type]
                      once=False, say=said.append, new_sink=lambda: sinks.pop(1))  # type: ignore[arg-type,return-value]  # fmt: skip
    first = clock.monotonic()
    assert shipper.run(lambda: True) == 0
    assert clock.monotonic() - first <= logs_cmd.STOP_WAIT_S + 1e-6
    assert said[-1].startswith("stopping: the lines not confirmed by now stay in the files")
    assert not (tmp_path / "offsets.json").exists()  # nothing confirmed, no offset moved


def test_the_wait_between_tries_doubles_up_to_a_minute(tmp_path: Path):
    shipper = Shipper([], LateSink(), cwlogs.Offsets(tmp_path, print), FakeClock(0.0), group="/s/node", once=False,
                      say=print)  # type: ignore[arg-type]  # fmt: skip
    assert [shipper._wait() for _ in range(6)] == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
