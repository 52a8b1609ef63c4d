"""What travels on the site queue, and the queue as the code that uses it sees it (`SiteQueue`); no AWS client.

A message is `{"run_id", "site", "attempt"}`: "attempt N of this site may start". On a FIFO queue each carries a
deterministic deduplication id of its (run, site, attempt) and a message group per site. The SQS adapter is
`fleet.aws.queue`; the tests and the simulator use an in-memory one.

Anyone allowed to send to the queue can send any body (a node whose browser a page took over has the node's role),
so `decode` trusts nothing in one: a site message is one only with ids of their shape (`fleet.record.ids`, checked
before they become a key) and a whole attempt number in range; anything else is a `BadMessage` whose problem is one
short line, whatever the body holds.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from fleet.errors import quote
from fleet.record.ids import RUN_ID_RULE, SITE_ID_RULE, is_run_id, is_site_id


@dataclass(frozen=True)
class SiteMessage:
    run_id: str
    site: str
    attempt: int
    receipt: str
    message_id: str = ""
    receive_count: int = 1


@dataclass(frozen=True)
class BadMessage:
    """A body that is not a site message (a poison message)."""

    body: str  # its first BAD_BODY_KEEP characters
    receipt: str
    message_id: str
    receive_count: int
    problem: str
    size: int = 0  # the whole body's length, in characters


@dataclass(frozen=True)
class QueueDepth:
    visible: int
    in_flight: int
    dlq: int


#: What SQS takes as a MessageGroupId / MessageDeduplicationId: 1 to 128 letters, digits or punctuation.
_SQS_ID_RE = re.compile(r"[!-~]{1,128}")
#: How long SQS remembers a FIFO message's deduplication id.
DEDUP_WINDOW_S = 300.0


def dedup_id(run_id: str, site: str, attempt: int, given_back: int = 0) -> str:
    """The MessageDeduplicationId of attempt `attempt` of `site`: sha256 hex of the three, one per line. An
    attempt given back (spot) is asked for again with the same number: `given_back` (the site's count of them)
    makes that a new id, while a repeated send of the same request keeps its id."""
    key = f"{run_id}\n{site}\n{attempt}" + (f"\n{given_back}" if given_back else "")
    return hashlib.sha256(key.encode()).hexdigest()


def group_id(run_id: str, site: str) -> str:
    """The MessageGroupId of a site's messages: `<run_id>/<site>`, or its sha256 hex if SQS would refuse that."""
    gid = f"{run_id}/{site}"
    return gid if _SQS_ID_RE.fullmatch(gid) else hashlib.sha256(gid.encode()).hexdigest()


def fifo_fields(run_id: str, site: str, attempt: int, given_back: int = 0) -> dict[str, str]:
    return {
        "MessageGroupId": group_id(run_id, site),
        "MessageDeduplicationId": dedup_id(run_id, site, attempt, given_back),
    }


def encode(run_id: str, site: str, attempt: int) -> str:
    return json.dumps({"run_id": run_id, "site": site, "attempt": attempt}, sort_keys=True)


#: The highest attempt a message may name: far above any run's (`run.max_attempts` is at most 100, and an attempt
#: given back keeps its number), and a number every store takes.
MAX_ATTEMPT = 10_000
#: How much of a bad body a BadMessage keeps (the DLQ's report shows it).
BAD_BODY_KEEP = 200


def decode(body: str, receipt: str, message_id: str, receive_count: int) -> SiteMessage | BadMessage:
    """`body` as a site message, or a BadMessage saying in one short line what is wrong with it. Never raises."""
    fields = _fields(body)
    if isinstance(fields, str):
        return BadMessage(body[:BAD_BODY_KEEP], receipt, message_id, receive_count, fields, len(body))
    return SiteMessage(*fields, receipt, message_id, receive_count)


def _fields(body: str) -> tuple[str, str, int] | str:
    """(run id, site, attempt) of a site message's body, else what is wrong with it."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:  # RecursionError: nested deeper than the parser goes (a 256 KB "[[[")
        return f"not JSON ({quote(str(e), bare=True)})"
    if not isinstance(data, dict):
        return f"a JSON {_kind(data)}, not an object"
    missing = [k for k in ("run_id", "site", "attempt") if k not in data]
    if missing:
        return f"no {' and no '.join(missing)}"
    run_id, site, attempt = data["run_id"], data["site"], data["attempt"]
    if not is_run_id(run_id):
        return f"run_id {_shown(run_id)} is not a run id ({RUN_ID_RULE})"
    if not is_site_id(site):
        return f"site {_shown(site)} is not a site id ({SITE_ID_RULE})"
    if type(attempt) is not int:  # a bool is an int to Python, and 1.0 a float: neither is an attempt's number
        return f"attempt {_shown(attempt)} is not a whole number"
    if not 1 <= attempt <= MAX_ATTEMPT:
        return f"attempt {_shown(attempt)} is not from 1 to {MAX_ATTEMPT}"
    return run_id, site, attempt


def _kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


def _shown(value: Any) -> str:
    """A JSON value as a problem quotes it: a string or a number cut (`fleet.errors.quote`), else its kind alone (the
    repr of a deeply nested array could itself fail)."""
    if isinstance(value, (str, int, float)):  # bool too; an int has at most 4300 digits once parsed
        return quote(value)
    return f"(a JSON {_kind(value)})"


class SiteQueue(Protocol):
    def send(self, run_id: str, site: str, attempt: int, given_back: int = 0) -> None: ...
    def send_many(self, items: Iterable[tuple[str, str, int]]) -> int: ...
    def receive(self, wait_s: float, visibility_s: float) -> SiteMessage | BadMessage | None: ...
    def delete(self, msg: SiteMessage | BadMessage) -> None: ...
    def delete_receipt(self, receipt: str) -> None: ...
    def set_visibility(self, msg: SiteMessage | BadMessage, seconds: float) -> None: ...
    def depth(self) -> QueueDepth: ...
    def peek(self, limit: int = 100, dlq: bool = False) -> list[SiteMessage | BadMessage]: ...
