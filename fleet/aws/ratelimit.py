"""Fleet-wide rate limits: every node crawling a site of a group shares one request budget.

A group (`rate_limits: {<group>: {per_s: N}}` in fleet.yaml, `rate_limit: <group>` on a site) holds one
DynamoDB item, `run_id = "#limits"`, `Site = <group>`, with one attribute, `next_at` (N, epoch seconds):
the earliest time the next request to the group may go. A request reserves the next free slot and moves
`next_at` on by `spacing`, in one conditional UpdateItem (GCRA: a virtual schedule, no counters, no
read-modify-write), then sleeps until its slot. Slots of a group are therefore at least `spacing` apart
whichever node took them, so the fleet's requests are paced, never sent in bursts.

Taking a slot, `take(group, per_s, now)`, is one call in the usual case, two at most per round:

1. busy group (`next_at > now`): ``SET next_at = next_at + :spacing`` on condition ``next_at > :now``,
   returning the old value: the slot is the old `next_at`.
2. idle group (no item yet, or `next_at <= now`): ``SET next_at = :now + :spacing`` on condition
   ``attribute_not_exists(next_at) OR next_at <= :now``: the slot is `now`.

Each limiter remembers whether a group looked busy at its last take and tries that call first; a failed
condition means the guess was wrong (or another node moved `next_at` meanwhile) and the other call is
tried, up to `MAX_ROUNDS` rounds.

`now` is the caller's wall clock: nodes are expected to keep their clocks in sync (NTP, as EC2 does);
a node whose clock runs ahead takes idle slots early, by its skew, which `PACE_MARGIN` partly absorbs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from botocore.exceptions import ClientError

from fleet.aws.clients import error_code
from fleet.clock import Clock, SystemClock
from fleet.errors import GridfleetError

#: The partition (`run_id`) of the rate-limit items; the sort key (`Site`) is the group's name.
LIMITS_PARTITION = "#limits"

#: Slots are `PACE_MARGIN / per_s` apart rather than `1 / per_s`. A request does not leave exactly at its
#: slot: the sleep overshoots, the request path (driver, browser, network) adds a varying delay. With a
#: spacing of exactly 1/N, N + 1 consecutive slots span exactly 1 s, so a first request late by a few ms
#: and the (N+1)th on time put N + 1 requests into one second at the target. With 10% headroom, N + 1
#: consecutive slots span 1.1 s: the target sees more than N requests in a second only if one request is
#: delayed 100 ms more than a later one, at the cost of using ~91% of the allowed rate.
PACE_MARGIN = 1.1

#: A request that would leave more than `LATE_S` after its slot takes a new one: a slow answer from the
#: table or a sleep that overshot (a loaded node) would otherwise spend the headroom above alone, and a
#: later request leaving on time would make N + 1 in a second. The late slot is left unused. After
#: `MAX_LATE` late slots in a row the request goes anyway.
LATE_S = (PACE_MARGIN - 1) / 2
MAX_LATE = 5

#: Rounds of (busy call, idle call) before `take` gives up; each lost round means another node changed
#: the group's item between our two calls, so 10 in a row is contention no sane fleet produces.
MAX_ROUNDS = 10


class RateLimitContention(GridfleetError):
    """No slot could be taken in MAX_ROUNDS rounds: the group's item kept changing under us."""


def spacing(per_s: float) -> float:
    """Seconds between two slots of a group limited to `per_s` requests per second."""
    if not per_s > 0:
        raise ValueError(f"per_s must be > 0, got {per_s!r}")
    return PACE_MARGIN / per_s


class RateLimiter(Protocol):
    def take(self, group: str, per_s: float, now: float) -> float:
        """Reserve the next slot of `group` at or after `now`; return it (epoch seconds)."""

    def wait(self, group: str, per_s: float) -> float:
        """Reserve the next slot of `group` and sleep until it; return the slot."""


def wait_for_slot(take: Callable[[float], float], clock: Clock) -> float:
    """Take a slot (`take(now)` reserves one at or after `now`) and sleep until it; taken again while the caller
    would leave more than `LATE_S` after it (`MAX_LATE` times). Returns the slot."""
    slot = clock.now()
    for _ in range(MAX_LATE):
        slot = take(clock.now())
        delay = slot - clock.now()
        if delay > 0:
            clock.sleep(delay)
        if clock.now() - slot <= LATE_S:
            break
    return slot


class _Waiting:
    clock: Clock

    def take(self, group: str, per_s: float, now: float) -> float:
        raise NotImplementedError

    def wait(self, group: str, per_s: float) -> float:
        return wait_for_slot(lambda now: self.take(group, per_s, now), self.clock)


class MemoryRateLimiter(_Waiting):
    """The same slots as `DynamoRateLimiter`, for one process (fakes, unit tests). Thread-safe."""

    def __init__(self, clock: Clock | None = None):
        self.clock = clock or SystemClock()
        self._lock = threading.Lock()
        #: next_at by group, as the DynamoDB item holds it.
        self.next_at: dict[str, float] = {}

    def take(self, group: str, per_s: float, now: float) -> float:
        step = spacing(per_s)
        with self._lock:
            pending = self.next_at.get(group)
            slot = pending if pending is not None and pending > now else now
            self.next_at[group] = slot + step
            return slot


def _n(x: float) -> dict[str, str]:
    return {"N": repr(float(x))}


class DynamoRateLimiter(_Waiting):
    """Slots of each group in the state table, shared by every node using the same table.

    Safe to share between threads (boto3 clients are; the busy guesses are only hints).
    """

    def __init__(self, client: Any, table_name: str, clock: Clock | None = None):
        self._c = client
        self.name = table_name
        self.clock = clock or SystemClock()
        #: Per group: did our last take find it busy?
        self._busy: dict[str, bool] = {}
        #: Per group: `next_at` as our last take left it (slot + spacing).
        self._left: dict[str, float] = {}

    def _key(self, group: str) -> dict[str, Any]:
        return {"run_id": {"S": LIMITS_PARTITION}, "Site": {"S": group}}

    def take(self, group: str, per_s: float, now: float) -> float:
        step = spacing(per_s)
        # Busy if it was at our last take, or if our own last reservation still holds it.
        busy = self._busy.get(group, False) or now < self._left.get(group, float("-inf"))
        for _ in range(MAX_ROUNDS):
            if busy:
                slot = self._take_queued(group, step, now)
                if slot is not None:
                    self._busy[group], self._left[group] = True, slot + step
                    return slot
            slot = self._take_idle(group, step, now)
            if slot is not None:
                self._busy[group], self._left[group] = False, slot + step
                return slot
            busy = True
        raise RateLimitContention(
            f"rate limit {group!r}: no slot after {MAX_ROUNDS} rounds of conditional updates "
            f"(table {self.name!r}, item {LIMITS_PARTITION}/{group})"
        )

    def _take_queued(self, group: str, step: float, now: float) -> float | None:
        """The slot after the last one taken, if the group is busy; None if it is idle."""
        try:
            out = self._c.update_item(
                TableName=self.name,
                Key=self._key(group),
                UpdateExpression="SET next_at = next_at + :spacing",
                ConditionExpression="next_at > :now",
                ExpressionAttributeValues={":spacing": _n(step), ":now": _n(now)},
                ReturnValues="UPDATED_OLD",
            )
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                return None
            raise
        return float(out["Attributes"]["next_at"]["N"])

    def _take_idle(self, group: str, step: float, now: float) -> float | None:
        """`now`, if the group is idle (no item, or its next slot has passed); None if it is busy."""
        try:
            self._c.update_item(
                TableName=self.name,
                Key=self._key(group),
                UpdateExpression="SET next_at = :next",
                ConditionExpression="attribute_not_exists(next_at) OR next_at <= :now",
                ExpressionAttributeValues={":next": _n(now + step), ":now": _n(now)},
            )
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                return None
            raise
        return now


__all__ = [
    "LIMITS_PARTITION",
    "MAX_ROUNDS",
    "PACE_MARGIN",
    "DynamoRateLimiter",
    "MemoryRateLimiter",
    "RateLimitContention",
    "RateLimiter",
    "spacing",
]
