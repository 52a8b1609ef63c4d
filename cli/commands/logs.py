"""`gridfleet ship-logs`, which every instance runs, and `gridfleet logs`, which reads a run's logs back.

ship-logs follows an instance's log files and puts each line into the instance's stream
(`fleet.aws.cwlogs.LogSink`). The files are the buffer: how far each was shipped is kept in --state and moves only
past lines CloudWatch confirmed, so a crash, a restart or a failed batch costs a resend at most (at least once),
and nothing in memory grows with a file: one batch of lines (`cwlogs.Batch`) and one line, cut at CloudWatch's
event size. What the shipper has to say goes to its stderr, never into the stream it ships.

logs merges the run's streams of both groups by time (one page of each stream in memory) and prints them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from rich.console import Console

from fleet.aws import cwlogs
from fleet.aws.clients import AwsClients
from fleet.clock import Clock, SystemClock
from fleet.config.load import load_config
from fleet.errors import UsageError, quote
from fleet.record.ids import SITE_ID_RULE, is_site_id

POLL_S = 1.0
FLUSH_AFTER_S = 5.0  # the longest a line read waits in the shipper before it is sent
PARTIAL_AFTER_S = 10.0  # a last line without newline goes once it has not grown for this long
RETRY_FIRST_S = 5.0  # after a failed batch (no group, no permission, no answer in time): the first wait...
RETRY_MAX_S = 60.0  # ...doubled after each failure up to this (a loaded machine answers late, not never)
READ_CHUNK = 64 * 1024
READ_BUDGET = 1024 * 1024  # per file and poll: one busy file does not hold up the others, nor a signal
LINE_HEAD_BYTES = cwlogs.MAX_MESSAGE_BYTES - 100  # a longer line keeps this much, and a note of its length
SHIP_MAX_RETRIES = 2  # botocore's, per call; watchtower tries each batch 5 times, and the files wait anyway
FLUSH_WAIT_S = 8.0  # how long a flush waits for CloudWatch's answer; twice unanswered, the sink is replaced
#: From SIGTERM, the most the shipper spends on its last lines: inside the unit's TimeoutStopSec (30 s) and the
#: 20 s an instance's processes get from the twin. Half of it goes to the sink in use, the rest to a new one.
STOP_WAIT_S = 15.0

Stopping = Callable[[], bool]
NewSink = Callable[[], cwlogs.LogSink]


class Tail:
    """One followed file: its lines from where shipping stopped, whole, one at a time; `mark`: what is confirmed."""

    def __init__(self, path: Path, mark: cwlogs.Mark | None):
        self.path = path
        self.mark = mark
        self.ident: tuple[int, int] | None = None
        self.pos = 0  # just after the last line the shipper took (put, or skipped as blank)
        self._start = 0  # where the line being read starts
        self.behind = False  # the last read stopped at its budget, not at the end
        self.end: int | None = None  # --once: the size the file had when opened
        self._fh: BinaryIO | None = None
        self._head = bytearray()  # the line being read: its first bytes, and how many more there are
        self._more = 0
        self._grown: tuple[int, float] = (0, 0.0)  # a last line without newline: its size, since when
        self.unreadable: str | None = None  # why the file could not be opened, when it exists

    def open(self, once: bool) -> bool:
        if self._fh is not None:
            return True
        try:
            fh = self.path.open("rb")
        except OSError as e:  # missing (waited for), or unreadable for now
            self.unreadable = None if isinstance(e, FileNotFoundError) else e.strerror
            return False
        st = os.fstat(fh.fileno())
        ident, m = (st.st_dev, st.st_ino), self.mark
        start = m.offset if m is not None and m.ident == ident and st.st_size >= m.offset else 0  # else rotated
        fh.seek(start)
        self._fh, self.ident, self.mark = fh, ident, cwlogs.Mark(ident, start)
        self.pos = self._start = start
        self.end = st.st_size if once else None
        return True

    def lines(self, now: float, final: bool) -> Iterator[tuple[str, int]]:
        """The lines read next (each with the offset just after it), up to READ_BUDGET bytes; at the end, a last
        line without newline too when `final` or when it has not grown for PARTIAL_AFTER_S (`now`: monotonic)."""
        fh, budget, self.behind = self._fh, READ_BUDGET, False
        while fh is not None:
            want = min(READ_CHUNK, budget, (self.end - fh.tell()) if self.end is not None else READ_CHUNK)
            chunk = fh.read(want) if want > 0 else b""
            if not chunk:
                self.behind = budget <= 0
                break
            budget -= len(chunk)
            start = 0
            while (nl := chunk.find(b"\n", start)) >= 0:
                self._take(chunk[start:nl])
                yield self._line(ended=True)
                start = nl + 1
            self._take(chunk[start:])
        size = len(self._head) + self._more
        if size and not self.behind:
            if size != self._grown[0]:
                self._grown = (size, now)
            if final or now - self._grown[1] >= PARTIAL_AFTER_S:
                yield self._line(ended=False)

    def _take(self, piece: bytes) -> None:
        room = max(0, LINE_HEAD_BYTES - len(self._head))
        self._head += piece[:room]
        self._more += max(0, len(piece) - room)

    def _line(self, ended: bool) -> tuple[str, int]:
        size = len(self._head) + self._more
        text = cwlogs.fit_message(self._head.decode("utf-8", "replace").rstrip("\r"), LINE_HEAD_BYTES)
        if self._more:
            text += f" [line cut: {size} bytes, the first {len(self._head)} shipped]"
        self._start += size + ended
        self._head, self._more, self._grown = bytearray(), 0, (0, 0.0)
        return text, self._start

    def moved(self) -> bool:
        """Whether the path is another file now (rotated) or this one shrank (truncated)."""
        if self._fh is None:
            return False
        try:
            st = os.stat(self.path)
        except OSError:
            return False  # gone, not replaced yet: what is left of it is still read
        return (st.st_dev, st.st_ino) != self.ident or st.st_size < self._fh.tell()

    def commit(self) -> bool:
        """Every line handed out arrived: move the mark; whether it moved."""
        if self.ident is None or self.mark == cwlogs.Mark(self.ident, self.pos):
            return False
        self.mark = cwlogs.Mark(self.ident, self.pos)
        return True

    def rewind(self) -> None:
        """Forget what was read past the mark: it is read again."""
        self._head, self._more, self._grown = bytearray(), 0, (0, 0.0)
        if self._fh is not None and self.mark is not None and self.mark.ident == self.ident:
            self._fh.seek(self.mark.offset)
            self.pos = self._start = self.mark.offset
        else:
            self.close()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._fh = None


class NotShipped(Exception):
    """A flush whose events did not all arrive: the files are read again from their marks, later."""


class Shipper:
    """Follows the files (`run`), flushing every FLUSH_AFTER_S, and keeps their marks in step with CloudWatch."""

    def __init__(
        self,
        tails: list[Tail],
        sink: cwlogs.LogSink,
        offsets: cwlogs.Offsets,
        clock: Clock,
        *,
        group: str,
        once: bool,
        say: Callable[[str], None],
        new_sink: NewSink | None = None,
    ):
        self.tails, self.sink, self.offsets, self.clock = tails, sink, offsets, clock
        self.group, self.once, self.say = group, once, say
        self.new_sink = new_sink  # a sink on a new connection, for one whose batch never got an answer
        self.window = cwlogs.Batch()
        self.retry_at: float | None = None
        self.retry_wait = RETRY_FIRST_S  # the wait after the next failure
        self.stop_by: float | None = None  # at a stop: when the shipper gives up on what is not shipped yet
        self.last_try = False  # at a stop, the files get one more try even while shipping fails
        self.problem: str | None = None  # what was said about the current failure, said once
        self.missing: set[Path] = set()

    def run(self, stopping: Stopping) -> int:
        """Exit codes: 0; 1 with --once when lines could not be shipped."""
        while True:
            stop = stopping()
            if stop and self.stop_by is None:
                self.stop_by = self.clock.monotonic() + STOP_WAIT_S
            if self.retry_at is not None:
                if self.once or (stop and self.last_try):
                    if stop:
                        self.say("stopping: the lines not confirmed by now stay in the files, past the offsets kept")
                    return 1 if self.once else 0
                if stop:
                    self.last_try = True  # the instance is going: what is read is worth one more try now
                elif self.clock.monotonic() < self.retry_at:
                    self.clock.sleep(POLL_S)
                    continue
                elif not self.sink.flush().settled:  # a batch of the failed window is still out: it lands first
                    self.retry_at = self.clock.monotonic() + self._wait()
                    continue
                self.retry_at = None
            try:
                behind = self._poll(final=self.once or stop)
                if stop or (self.once and not behind):
                    self._flush()
                    return 0
                if self.window.count and self.clock.monotonic() - self.window.since >= FLUSH_AFTER_S:
                    self._flush()
            except NotShipped:
                continue
            if not behind:
                self.clock.sleep(POLL_S)

    def _poll(self, final: bool) -> bool:
        """Read each file once (to its end or its budget); whether one is left behind its end."""
        behind = False
        for tail in self.tails:
            if not self._open(tail):
                continue
            self._put_all(tail, final)
            if not tail.behind and tail.moved():
                self._put_all(tail, True)  # what the old file gained since, and its last line
                if not tail.behind:
                    self._flush()  # the old file's end arrives before it is left for the new, from its start
                    tail.close()
                    tail.mark = None
                    behind = self._open(tail) or behind
            behind = behind or tail.behind
        return behind

    def _open(self, tail: Tail) -> bool:
        if tail.open(self.once):
            self.missing.discard(tail.path)
            return True
        if tail.path not in self.missing and (self.once or tail.unreadable):
            self.say(f"{tail.path}: {tail.unreadable or 'does not exist'}: nothing shipped from it (yet)")
        self.missing.add(tail.path)
        return False

    def _put_all(self, tail: Tail, final: bool) -> None:
        now, mono = self.clock.now(), self.clock.monotonic()
        for line, after in tail.lines(mono, final):
            if line.strip():  # CloudWatch takes no empty event
                message = cwlogs.fit_message(line)
                when, size = cwlogs.event_time(message, now), cwlogs.event_size(message)
                if self.window.count and not self.window.fits(size, when):
                    self._flush()  # before this line is put: the marks it moves do not pass it
                self.sink.put(message, when)
                self.window.add(size, when, mono)
            tail.pos = after

    def _flush(self) -> None:
        """Send the window and wait for the answer: the marks move when every event arrived, else NotShipped."""
        if self.window.count:
            flushed = self._answer()
            if not flushed.ok:
                self._failed(flushed)
                raise NotShipped
            if flushed.refused:
                self.say(f"CloudWatch Logs refused {flushed.refused} events of {self.group} for their time")
            if self.problem is not None:
                self.say(f"shipping to {self.group} works again")
                self.problem = None
            self.retry_wait = RETRY_FIRST_S
        self.window = cwlogs.Batch()
        if any([t.commit() for t in self.tails]):
            self.offsets.save((t.path, t.mark) for t in self.tails)

    def _answer(self) -> cwlogs.Flushed:
        """The sink's answer to the window. Running, a slow answer is waited for twice (it is not yet a failure);
        at a stop, the first try waits half of the stop's time left and the last try the rest."""
        if self.stop_by is None:
            flushed = self.sink.flush()
            return flushed if flushed.settled else self.sink.flush()
        left = max(0.0, self.stop_by - self.clock.monotonic())
        return self.sink.flush(left if self.last_try else left / 2)

    def _wait(self) -> float:
        """The wait before the next try: doubled after each failure, up to RETRY_MAX_S."""
        wait, self.retry_wait = self.retry_wait, min(RETRY_MAX_S, self.retry_wait * 2)
        return wait

    def _failed(self, flushed: cwlogs.Flushed) -> None:
        then = "the offsets stay where they were" + ("" if self.once else "; trying again, at most a minute apart")
        line = f"{cwlogs.ship_problem(self.group, flushed)}; {then}"
        if line != self.problem:
            self.say(line)
            self.problem = line
        for t in self.tails:
            t.rewind()
        self.window = cwlogs.Batch()
        self.retry_at = self.clock.monotonic() + self._wait()
        if not flushed.settled and self.new_sink is not None:
            # A batch with no answer holds the sink's one thread, and every batch after waits behind it, as long
            # as botocore's timeouts and retries and watchtower's tries allow (minutes, on a connection that went
            # dead). The next try goes through a new sink; were the old batch to land late, its lines are there
            # twice (at least once, as after any failed batch).
            self.sink.abandon()
            self.sink = self.new_sink()


def cmd_ship_logs(
    args: argparse.Namespace, console: Console, *, clock: Clock | None = None, stopping: Stopping | None = None
) -> int:
    """Follow the files into the stream until SIGTERM or SIGINT, then send what was read; --once: what they hold."""
    if not cwlogs.is_group_name(args.group):
        raise UsageError(f"--group {quote(args.group)} is not a log group name, e.g. /gridfleet/node")
    if cwlogs.split_stream(args.stream) is None:
        raise UsageError(
            f"--stream {quote(args.stream)} is not <run_id>/<instance id>, e.g. 2026-11-27/i-0123456789abcdef0"
        )
    config = load_config(args.config)
    state: Path = args.state
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--state {state}: {e.strerror}") from e
    paths = list(dict.fromkeys(Path(os.path.abspath(f)) for f in args.files))
    _keep_own_lines_out(paths, state)

    def say(line: str) -> None:
        print(f"gridfleet ship-logs: {line}", file=sys.stderr, flush=True)

    aws = config.aws.model_copy(update={"max_retries": min(config.aws.max_retries, SHIP_MAX_RETRIES)})

    def new_sink() -> cwlogs.LogSink:
        return cwlogs.LogSink(AwsClients(aws).client("logs"), args.group, args.stream, flush_wait_s=FLUSH_WAIT_S)

    offsets = cwlogs.Offsets(state, say)
    marks = offsets.load()
    tails = [Tail(p, marks.get(str(p))) for p in paths]
    shipper = Shipper(tails, new_sink(), offsets, clock or SystemClock(), group=args.group, once=args.once, say=say,
                      new_sink=new_sink)  # fmt: skip
    with _stop_signals() as stopped, cwlogs.handler_warnings_off():
        try:
            return shipper.run(stopping or stopped.is_set)
        finally:
            shipper.sink.close()
            for t in tails:
                t.close()


def _keep_own_lines_out(paths: list[Path], state: Path) -> None:
    """The shipper's own lines go to stderr, unless stderr is a file it ships: there each would be shipped and make
    more (a loop), so stderr (Python's warnings and logging with it) becomes <state>/ship-logs.err."""
    try:
        mine = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):  # not a file (a test's capture)
        return
    for p in paths:
        if p.exists() and os.path.samestat(os.stat(p), mine):
            with (state / "ship-logs.err").open("a") as elsewhere:
                os.dup2(elsewhere.fileno(), sys.stderr.fileno())
            print(f"gridfleet ship-logs: stderr is {p}, which is shipped: this file has its lines", file=sys.stderr)
            return


@contextlib.contextmanager
def _stop_signals() -> Iterator[threading.Event]:
    """SIGTERM (the service's stop, the instance's shutdown) and SIGINT end shipping as a clean stop: what was read
    is sent, the offsets are saved, exit 0."""
    stopped = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stopped  # signals reach the main thread only; a caller elsewhere passes `stopping`
        return
    before = {s: signal.signal(s, lambda *_: stopped.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stopped
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


# --- gridfleet logs --------------------------------------------------------------------------------------------
def cmd_logs(args: argparse.Namespace, console: Console) -> int:
    """Print a run's log lines from the hub's and the nodes' groups, oldest first; exit 1 when there are none."""
    node, site = args.node, args.site
    if node is not None and not cwlogs.is_instance_id(node):
        raise UsageError(f"--node {quote(node)} is not an instance id (i- and 8 or 17 hex digits)")
    if site is not None and not is_site_id(site):
        raise UsageError(f"--site {quote(site)} is not a site id ({SITE_ID_RULE})")
    config = load_config(args.config)
    client = AwsClients(config.aws).client("logs")
    prefix = f"{args.run_id}/{node}" if node else f"{args.run_id}/"
    groups = {"hub": config.aws.log_group_hub, "node": config.aws.log_group_node}
    streams, skipped, missing = cwlogs.run_streams(client, groups, args.run_id, node)
    if skipped:
        print(f"gridfleet: skipped {skipped} log streams not named <run_id>/<instance id>", file=sys.stderr)
    try:
        printed = _print_events(client, streams, site, sys.stdout)
    except BrokenPipeError:  # the reader left (`| head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if printed:
        return 0
    about = f" about site {site}" if site else ""
    absent = f" ({' and '.join(missing)}: no such group; apply infra/terraform)" if missing else ""
    where = " or ".join(groups.values())
    print(f"gridfleet: no log lines{about} in the streams {prefix}* of {where}{absent}", file=sys.stderr)
    return 1


def _print_events(client: object, streams: list[cwlogs.RunStream], site: str | None, out: TextIO) -> int:
    """The streams merged by time, printed as they come; how many lines were printed."""
    printed = 0
    for ms, stream, message in cwlogs.merged_events(client, streams):
        if site is None or cwlogs.is_about(message, site):
            out.write(f"{_utc(ms)} {stream.role} {stream.instance} {_printable(message)}\n")
            printed += 1
    out.flush()
    return printed


_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def _printable(message: str) -> str:
    """A message as one line that cannot steer the terminal (a page's console text is in the logs)."""
    return _CONTROL_RE.sub(lambda m: f"\\x{ord(m.group()):02x}", message)


def _utc(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
