"""Per-domain pacing on the state table (`fleet.crawl.pacing` says what a domain and its pace are).

A domain holds one item beside the rate limit groups', `run_id = "#limits"`, `Site = "domain:<host[:port]>"`, with
`next_at` (N, epoch seconds: the earliest time its next request may go) and, once it was backed off, `spacing`
(N, seconds: its AutoThrottle spacing). A request reads the item (strongly consistent), spaces its slot by the
larger of its base spacing and the item's `spacing`, and moves `next_at` on in one UpdateItem conditional on
`next_at` being what it read; an answer reads the item again and writes the new `spacing` (when it changes)
conditional on the one read. A failed condition means another node moved first: read again, up to `MAX_ROUNDS`.
A domain with no base spacing and no back-off is read at most once every `UNPACED_FOR_S` by a process, and
never written.

The answers also add to the run's counters of the domain (a crawler process sends them in batches, `node.pacing`),
an item in the partition `#pacing:<run_id>` (`Site` the domain): `requests` and `backoffs` (ADD), `base_s`,
`base_from` and `spacing_s` (SET), which the hub reads into summary.json's `pacing` when the run ends
(`DynamoStateTable.read_pacing`).
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from fleet.aws.clients import error_code
from fleet.aws.ratelimit import LIMITS_PARTITION, MAX_ROUNDS, RateLimitContention, wait_for_slot
from fleet.clock import Clock, SystemClock
from fleet.crawl.pacing import DOMAIN_PREFIX, PACING_PARTITION_PREFIX, backs_off, spacing_read_back, throttled


def _number(attr: object) -> float | None:
    """A stored N attribute as a float (None: absent, or not a number)."""
    try:
        return float(attr["N"]) if isinstance(attr, dict) and "N" in attr else None
    except (TypeError, ValueError):
        return None


def _n(x: float) -> dict[str, str]:
    return {"N": repr(float(x))}


#: A domain this process found unpaced (no base spacing, never backed off) is not read again for this long: its
#: requests then cost no call and no wait, so a site's group slot is not delayed by a read. A back-off another node
#: wrote reaches this one within it.
UNPACED_FOR_S = 5.0


class DynamoDomainPacer:
    """The slots and the AutoThrottle spacing of each domain, shared by every node using the same table."""

    def __init__(self, client: Any, table_name: str, clock: Clock | None = None):
        self._c = client
        self.name = table_name
        self.clock = clock or SystemClock()
        #: Per domain: its `spacing` as last read or written (None: never backed off).
        self.seen: dict[str, float | None] = {}
        #: The domains whose item this process read for the slot of the request now waiting for its answer.
        self.slotted: set[str] = set()
        #: Per domain: when this process last read its item (the clock's `monotonic`).
        self.read_at: dict[str, float] = {}

    def _key(self, domain: str) -> dict[str, Any]:
        return {"run_id": {"S": LIMITS_PARTITION}, "Site": {"S": DOMAIN_PREFIX + domain}}

    def _read(self, domain: str) -> tuple[float | None, float | None]:
        """The domain's `next_at` and `spacing` (each None while the item has none)."""
        got = self._c.get_item(TableName=self.name, Key=self._key(domain), ConsistentRead=True).get("Item") or {}
        self.read_at[domain] = self.clock.monotonic()
        next_at = float(got["next_at"]["N"]) if "next_at" in got else None
        self.seen[domain] = spacing_read_back(_number(got.get("spacing")))
        return next_at, self.seen[domain]

    def take(self, domain: str, base: float, now: float) -> float:
        """Reserve the domain's next slot at or after `now` for a request of base spacing `base`; return it. An
        unpaced domain read less than UNPACED_FOR_S ago is not read again: its slot is `now`."""
        self.slotted.add(domain)
        read_at = self.read_at.get(domain)
        fresh = read_at is not None and self.clock.monotonic() - read_at < UNPACED_FOR_S
        if base <= 0 and fresh and domain in self.seen and self.seen[domain] is None:
            return now
        for _ in range(MAX_ROUNDS):
            next_at, stored = self._read(domain)
            step = max(base, stored or 0.0)
            if step <= 0:
                return now
            slot = now if next_at is None else max(now, next_at)
            cond, values = "next_at = :old", {":old": _n(next_at or 0)}
            if next_at is None:
                cond, values = "attribute_not_exists(next_at)", {}
            if self._update(domain, "SET next_at = :next", cond, {":next": _n(slot + step), **values}):
                return slot
        raise RateLimitContention(
            f"domain {domain!r}: no slot after {MAX_ROUNDS} rounds of conditional updates "
            f"(table {self.name!r}, item {LIMITS_PARTITION}/{DOMAIN_PREFIX}{domain})"
        )

    def wait(self, domain: str, base: float) -> float:
        """Reserve the domain's next slot and sleep until it; a slot missed by more than LATE_S is taken again."""
        return wait_for_slot(lambda now: self.take(domain, base, now), self.clock)

    def answered(self, domain: str, base: float, status: int | None) -> float:
        """The domain's spacing after an answer of `status`, written to its item when it changes. An answer that
        does not back off, to a domain that was not backed off when this request took its slot, changes nothing:
        it costs no call."""
        slotted = domain in self.slotted
        self.slotted.discard(domain)
        if slotted and not backs_off(status) and self.seen.get(domain, 0.0) is None:
            return base
        stored = self._read(domain)[1]
        for _ in range(MAX_ROUNDS):
            now = max(stored or 0.0, base)
            new = throttled(now, base, status)
            if new == now:
                return new
            values = {":new": _n(new)}
            cond = "attribute_not_exists(spacing)"
            if stored is not None:
                cond, values[":old"] = "spacing = :old", _n(stored)
            if self._update(domain, "SET spacing = :new", cond, values):
                self.seen[domain] = new
                return new
            stored = self._read(domain)[1]
        raise RateLimitContention(f"domain {domain!r}: its spacing kept changing under {MAX_ROUNDS} updates")

    def count(
        self, run_id: str, domain: str, base: tuple[float, str], answers: tuple[int, int], spacing_s: float
    ) -> None:
        """Add `answers` (requests, of which back-offs) to the run's counters of the domain. No expiry: the node role
        may not write `expireAt`; the hub gives the run's pacing items theirs when the run ends."""
        values = {
            ":one": _n(answers[0]),
            ":b": _n(answers[1]),
            ":base": _n(base[0]),
            ":from": {"S": base[1]},
            ":sp": _n(max(spacing_s, base[0])),
        }
        update = "ADD requests :one, backoffs :b SET base_s = :base, base_from = :from, spacing_s = :sp"
        self._c.update_item(
            TableName=self.name,
            Key={"run_id": {"S": PACING_PARTITION_PREFIX + run_id}, "Site": {"S": domain}},
            UpdateExpression=update,
            ExpressionAttributeValues=values,
        )

    def _update(self, domain: str, update: str, cond: str, values: dict[str, Any]) -> bool:
        try:
            self._c.update_item(
                TableName=self.name,
                Key=self._key(domain),
                UpdateExpression=update,
                ConditionExpression=cond,
                ExpressionAttributeValues=values,
            )
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                return False
            raise
        return True


__all__ = ["DynamoDomainPacer"]
