"""What travels on the site queue, and the queue as the code that uses it sees it (`SiteQueue`); no AWS client.

A message is `{"run_id", "site", "attempt"}`: "attempt N of this site may start". On a FIFO queue each carries a
deterministic deduplication id of its (run, site, attempt) and a message group per site. The SQS adapter is
`fleet.aws.queue`; the tests and the simulator use an in-memory one.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


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

    body: str
    receipt: str
    message_id: str
    receive_count: int
    problem: str


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


def decode(body: str, receipt: str, message_id: str, receive_count: int) -> SiteMessage | BadMessage:
    try:
        data = json.loads(body)
        msg = SiteMessage(
            str(data["run_id"]), str(data["site"]), int(data["attempt"]), receipt, message_id, receive_count
        )
    except (ValueError, KeyError, TypeError) as e:
        return BadMessage(body[:200], receipt, message_id, receive_count, f"not a site message: {e}")
    if msg.attempt < 1:
        return BadMessage(body[:200], receipt, message_id, receive_count, "attempt must be >= 1")
    return msg


class SiteQueue(Protocol):
    def send(self, run_id: str, site: str, attempt: int, given_back: int = 0) -> None: ...
    def send_many(self, items: Iterable[tuple[str, str, int]]) -> int: ...
    def receive(self, wait_s: float, visibility_s: float) -> SiteMessage | BadMessage | None: ...
    def delete(self, msg: SiteMessage | BadMessage) -> None: ...
    def delete_receipt(self, receipt: str) -> None: ...
    def set_visibility(self, msg: SiteMessage | BadMessage, seconds: float) -> None: ...
    def depth(self) -> QueueDepth: ...
    def peek(self, limit: int = 100, dlq: bool = False) -> list[SiteMessage | BadMessage]: ...
