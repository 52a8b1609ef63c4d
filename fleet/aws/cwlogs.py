"""CloudWatch Logs: where an instance's log lines go before the instance does, and where they are read back.

A spot node can be gone any minute, and with it its boot, agent, crawler and Grid logs. Each instance therefore
ships its log lines to the stack's group (`/<stack>/hub` or `/<stack>/node`), one stream per instance named
`<run_id>/<instance id>`, and `gridfleet logs` reads a run's streams back. This module is the AWS side of both:
`LogSink` puts lines into a stream and `Offsets` keeps how far each file went; `event_time`, `fit_message` and
`Batch` make lines into events and batches CloudWatch accepts; `run_streams` and `merged_events` read a run back,
`split_stream` checking every stream name read.

`LogSink` sends through watchtower's `CloudWatchLogHandler`, fed records made from the lines and attached to no
logger, so nothing this process logs itself (botocore, watchtower, the shipper's warnings) can reach the stream.
watchtower batches on a thread, retries a failed batch a few times, then drops it with a warning and tells its
caller nothing. So the sink hands watchtower a client that counts what PutLogEvents confirmed, and `flush`
says whether every event put since the last flush was: the shipper keeps the files as its buffer and moves its
offsets only past confirmed lines.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import heapq
import json
import logging
import os
import re
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from botocore.exceptions import ClientError
from watchtower import CloudWatchLogHandler, WatchtowerWarning

from fleet.aws.clients import error_code
from fleet.aws.errors import Kind, aws_failure
from fleet.record.ids import is_instance_id, is_run_id

#: CloudWatch's largest event, counting the 26 bytes it adds to each (watchtower cuts above this, silently).
MAX_EVENT_BYTES = 256 * 1024
EVENT_OVERHEAD_BYTES = 26
#: The largest message this module sends: below watchtower's own cut, which says nothing about what was lost.
MAX_MESSAGE_BYTES = MAX_EVENT_BYTES - 2 * EVENT_OVERHEAD_BYTES
#: PutLogEvents refuses events older than 14 days or more than 2 hours ahead; a line whose own time is beyond
#: these (a margin inside, for the time a batch waits) is sent at the time it was read: its text keeps its time.
OLDEST_S = 13 * 86400.0
AHEAD_S = 3600.0
#: One PutLogEvents call may not span more than 24 hours of event times.
MAX_BATCH_SPAN_S = 23 * 3600.0
#: watchtower's thread sends on its own only past these; the shipper flushes well before them, so a batch is
#: always one flush of the shipper's and never a part of one.
HANDLER_SEND_INTERVAL_S = 3600
HANDLER_MAX_BATCH_BYTES = 1024 * 1024
HANDLER_MAX_BATCH_EVENTS = 10_000

OFFSETS_FILE = "offsets.json"  # in the shipper's --state directory
_LEADING_TIME_RE = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,6})?(?:Z|[+-]\d{2}:?\d{2})?")
_GROUP_RE = re.compile(r"[A-Za-z0-9_./#-]{1,512}")


def split_stream(name: object) -> tuple[str, str] | None:
    """(run id, instance id) of a stream named `<run_id>/<instance id>`, else None (a name read back is checked)."""
    if not isinstance(name, str):
        return None
    run, _, instance = name.partition("/")
    return (run, instance) if is_run_id(run) and is_instance_id(instance) else None


def is_group_name(value: object) -> bool:
    return isinstance(value, str) and _GROUP_RE.fullmatch(value) is not None


# --- lines as events -----------------------------------------------------------------------------------------
def line_time(line: str) -> float | None:
    """The time a line says it was written: the `ts` of a JSON line (fleet.logs), else a leading ISO time."""
    text: Any = None
    if line.startswith("{"):
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        text = obj.get("ts") if isinstance(obj, dict) else None
    else:
        found = _LEADING_TIME_RE.match(line)
        text = found.group(0) if found else None
    if not isinstance(text, str):
        return None
    try:
        when = dt.datetime.fromisoformat(text.replace(",", "."))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


def event_time(line: str, read_at: float) -> float:
    """The time to file a line under: its own when it has one CloudWatch accepts, else when it was read."""
    own = line_time(line)
    return own if own is not None and read_at - OLDEST_S <= own <= read_at + AHEAD_S else read_at


def fit_message(text: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """`text`, cut to what one event holds (`limit` bytes, whole characters) when it is longer."""
    data = text.encode("utf-8")
    return text if len(data) <= limit else data[:limit].decode("utf-8", "ignore")


def event_size(message: str) -> int:
    """What a message counts for in a PutLogEvents batch (1 MB a call)."""
    return len(message.encode("utf-8")) + EVENT_OVERHEAD_BYTES


@dataclass
class Batch:
    """The events put between two flushes: one PutLogEvents call, well inside watchtower's batch limits."""

    MAX_BYTES: ClassVar[int] = 512 * 1024
    MAX_EVENTS: ClassVar[int] = 5000

    count: int = 0
    size: int = 0
    since: float = 0.0  # monotonic seconds, at the first
    lo: float = float("inf")
    hi: float = float("-inf")

    def fits(self, size: int, when: float) -> bool:
        span = max(self.hi, when) - min(self.lo, when)
        return self.count < self.MAX_EVENTS and self.size + size <= self.MAX_BYTES and span <= MAX_BATCH_SPAN_S

    def add(self, size: int, when: float, now: float) -> None:
        self.since = self.since if self.count else now
        self.count, self.size, self.lo, self.hi = (
            self.count + 1,
            self.size + size,
            min(self.lo, when),
            max(self.hi, when),
        )


# --- shipping ------------------------------------------------------------------------------------------------
class _Confirming:
    """The logs client as watchtower gets it: every call passes through, PutLogEvents answers are counted."""

    def __init__(self, client: Any):
        self._client = client
        self._lock = threading.Lock()
        self.confirmed = 0
        self.refused = 0
        self.error: BaseException | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def put_log_events(self, **kwargs: Any) -> Any:
        try:
            answer = self._client.put_log_events(**kwargs)
        except Exception as e:
            self._failed(e)
            raise
        count = len(kwargs["logEvents"])
        with self._lock:
            self.confirmed += count
            self.refused += _refused(answer.get("rejectedLogEventsInfo"), count)
        return answer

    def create_log_stream(self, **kwargs: Any) -> Any:
        try:
            return self._client.create_log_stream(**kwargs)
        except Exception as e:
            if error_code(e) != "ResourceAlreadyExistsException":
                self._failed(e)
            raise

    def _failed(self, e: BaseException) -> None:
        with self._lock:
            self.error = e

    def take(self) -> tuple[int, int, BaseException | None]:
        """What was counted since the last take, and the last error; the counts start again."""
        with self._lock:
            out = (self.confirmed, self.refused, self.error)
            self.confirmed, self.refused, self.error = 0, 0, None
            return out


def _refused(info: Any, count: int) -> int:
    """Events of a batch CloudWatch took but did not keep (too old, expired, too new): sending them again is no use."""
    if not isinstance(info, dict):
        return 0
    old = max(int(info.get("tooOldLogEventEndIndex", -1)), int(info.get("expiredLogEventEndIndex", -1))) + 1
    new = count - int(info.get("tooNewLogEventStartIndex", count))
    return min(count, old + new)


@dataclass(frozen=True)
class Flushed:
    """What became of the events put since the last flush."""

    settled: bool  # False: a batch is still on its way (no answer within the wait)
    ok: bool  # every event was confirmed
    refused: int = 0  # of those, events CloudWatch refused for their time (older than the group's retention)
    error: BaseException | None = None  # when not ok: the last error a call of the batch met


class LogSink:
    """One stream of a group, through watchtower: `put` lines, then `flush` to learn whether they all arrived."""

    def __init__(self, client: Any, group: str, stream: str, *, flush_wait_s: float = 8.0):
        self._client = _Confirming(client)
        self._pending = 0
        self.flush_wait_s = flush_wait_s
        self.handler = CloudWatchLogHandler(
            log_group_name=group,
            log_stream_name=stream.replace("{", "{{").replace("}", "}}"),  # watchtower formats it with str.format
            boto3_client=self._client,  # a client in all but its class
            create_log_group=False,  # the stack's group, with its retention and key; the stream is made on demand
            send_interval=HANDLER_SEND_INTERVAL_S,
            max_batch_size=HANDLER_MAX_BATCH_BYTES,
            max_batch_count=HANDLER_MAX_BATCH_EVENTS,
        )

    def put(self, message: str, when: float) -> None:
        """Queue one event (a non-empty message) filed at `when` (seconds since the epoch)."""
        record = logging.makeLogRecord(
            {"name": "gridfleet.shipped", "levelno": logging.INFO, "levelname": "INFO", "msg": message, "args": None}
        )
        record.created = (round(when * 1000) + 0.5) / 1000  # watchtower truncates to ms: float error takes none off
        self.handler.handle(record)
        self._pending += 1

    def flush(self, wait_s: float | None = None) -> Flushed:
        """Send what is queued and wait (up to `wait_s`, else `flush_wait_s`) for the answer."""
        wait = self.flush_wait_s if wait_s is None else wait_s
        self.handler.FLUSH_TIMEOUT = wait  # type: ignore[assignment]  # typed int; a Condition waits any number
        self.handler.flush()
        if any(q.unfinished_tasks for q in self.handler.queues.values()):
            return Flushed(settled=False, ok=False)
        confirmed, refused, error = self._client.take()
        ok, self._pending = confirmed >= self._pending, 0
        return Flushed(settled=True, ok=ok, refused=refused, error=None if ok else error)

    def close(self) -> None:
        self.handler.close()

    def abandon(self) -> None:
        """Give up on this sink, waiting for nothing: its thread ends once the batch still out has its answer or
        its last error, and the sink goes with it."""
        self.flush_wait_s = 0.0
        self.handler.FLUSH_TIMEOUT = 0
        self.handler.close()


# --- where shipping stopped -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mark:
    """How far one file was shipped: every line before `offset` of the file `ident` (device, inode)."""

    ident: tuple[int, int]
    offset: int


class Offsets:
    """The marks of every file shipped with this state directory, in one JSON file replaced whole."""

    def __init__(self, state_dir: Path, say: Callable[[str], None]):
        self.path = state_dir / OFFSETS_FILE
        self._say = say
        self._kept: dict[str, dict[str, int]] = {}

    def load(self) -> dict[str, Mark]:
        try:
            self._kept = dict(json.loads(self.path.read_text())["files"])
            return {k: Mark((int(v["dev"]), int(v["ino"])), int(v["offset"])) for k, v in self._kept.items()}
        except FileNotFoundError:
            return {}
        except (ValueError, KeyError, TypeError, AttributeError) as e:  # whatever is in it, the shipper goes on
            self._say(f"{self.path} cannot be read ({e!r}): every file is shipped from its start")
            self._kept = {}
            return {}

    def save(self, marks: Iterable[tuple[Path, Mark | None]]) -> None:
        for path, m in marks:
            if m is not None:
                self._kept[str(path)] = {"dev": m.ident[0], "ino": m.ident[1], "offset": m.offset}
        tmp = self.path.with_name(f".{OFFSETS_FILE}.tmp")
        with tmp.open("w") as f:
            json.dump({"files": self._kept}, f)
            f.flush()
            os.fsync(f.fileno())  # a crash leaves the old file or the new, whole
        os.replace(tmp, self.path)


@contextlib.contextmanager
def handler_warnings_off() -> Iterator[None]:
    """watchtower warns on stderr at each batch it fails; the shipper says what is wrong once, in its own words."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WatchtowerWarning)
        yield


def ship_problem(group: str, flushed: Flushed) -> str:
    """One line: why the events did not arrive, and what to do about it."""
    failure = aws_failure(flushed.error) if flushed.error is not None else None
    off = "or set aws.ship_logs: false"
    if not flushed.settled:
        reason = "CloudWatch Logs did not answer in time: check the network and aws.endpoint_url"
    elif error_code(flushed.error or Exception()) == "ResourceNotFoundException":
        reason = f"the log group does not exist: apply infra/terraform (it makes the stack's log groups), {off}"
    elif failure is not None and failure.kind is Kind.ACCESS_DENIED:
        reason = (
            f"{failure.problem}: allow logs:CreateLogStream and logs:PutLogEvents on the group to this instance's "
            f"role (infra/terraform's roles do), {off}"
        )
    elif failure is not None:
        reason = failure.line()
    else:
        reason = "CloudWatch Logs did not confirm every event"
    return f"cannot ship logs to {group}: {reason}"


# --- reading back --------------------------------------------------------------------------------------------
def stream_names(client: Any, group: str, prefix: str) -> Iterator[str]:
    """The names of the streams of `group` that start with `prefix`, every page."""
    for page in client.get_paginator("describe_log_streams").paginate(logGroupName=group, logStreamNamePrefix=prefix):
        for stream in page.get("logStreams", []):
            name = stream.get("logStreamName")
            if isinstance(name, str):
                yield name


def stream_events(client: Any, group: str, stream: str) -> Iterator[tuple[int, str]]:
    """The events of one stream, oldest first, as (milliseconds since the epoch, message), a page at a time."""
    token: str | None = None
    while True:
        ask: dict[str, Any] = {"logGroupName": group, "logStreamName": stream, "startFromHead": True}
        if token:
            ask["nextToken"] = token
        page = client.get_log_events(**ask)
        for event in page.get("events", []):
            yield int(event.get("timestamp", 0)), str(event.get("message", ""))
        following = page.get("nextForwardToken")
        if not following or following == token:  # the same token back: the end of the stream
            return
        token = following


@dataclass(frozen=True)
class RunStream:
    role: str  # hub | node
    group: str
    name: str
    instance: str


def run_streams(
    client: Any, groups: dict[str, str], run_id: str, node: str | None
) -> tuple[list[RunStream], int, list[str]]:
    """The run's streams in each group (`role: group`), of one instance with `node`; how many names read back were
    not `<run_id>/<instance id>` (skipped); the groups that do not exist."""
    found: list[RunStream] = []
    skipped = 0
    missing: list[str] = []
    for role, group in groups.items():
        try:
            for name in stream_names(client, group, f"{run_id}/{node or ''}"):
                parts = split_stream(name)
                if parts is None or parts[0] != run_id:
                    skipped += 1
                elif node is None or parts[1] == node:  # a prefix of 8 hex digits also finds a 17-digit id
                    found.append(RunStream(role, group, name, parts[1]))
        except ClientError as e:
            if error_code(e) != "ResourceNotFoundException":
                raise
            missing.append(group)
    return found, skipped, missing


def merged_events(client: Any, streams: list[RunStream]) -> Iterator[tuple[int, RunStream, str]]:
    """Every event of the streams, oldest first: a k-way merge holding one page of each stream."""

    def tagged(s: RunStream) -> Iterator[tuple[int, RunStream, str]]:
        for ms, message in stream_events(client, s.group, s.name):
            yield ms, s, message

    return heapq.merge(*(tagged(s) for s in streams), key=lambda e: e[0])


def is_about(message: str, site: str) -> bool:
    """Whether a line is about `site`: a JSON line's `site` (fleet.logs), or `site=<site>` as a word of a text line."""
    if message.startswith("{"):
        try:
            obj = json.loads(message)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            return obj.get("site") == site
    return re.search(rf"(?<!\S)site={re.escape(site)}(?!\S)", message) is not None
