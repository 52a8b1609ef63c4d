"""How a node's attempt ends, and what follows when the node ends it itself.

The agent and the simulator's node both turn whatever stopped a crawl (a result, the watchdog, the crawler's
death, a spot notice, a profile held elsewhere, a fenced write) into a `CrawlEnd`, and settle it the same way:
requeue, give the message back, or fail the site.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from fleet.state import Reason, RunStatus, SiteRecord

if TYPE_CHECKING:
    from fleet.protocol import NodeRules

#: A site whose profile was locked elsewhere is offered again after this long.
BUSY_RETRY_S = 30.0


class CrawlEndKind(StrEnum):
    RESULT = "result"  # the crawler reported the site's result
    HANG = "hang"  # the node's watchdog saw no progress on a page for hang_after_s
    ERROR = "error"  # the crawler failed, died, or its browser never started
    FENCED = "fenced"  # the hub moved the record on: the attempt is the hub's to end
    SPOT = "spot"  # a spot interruption notice: the attempt is given back
    BUSY = "busy"  # the site's profile was locked elsewhere: the attempt is given back, tried again later

    @property
    def reason(self) -> Reason | None:
        """The reason the record's attempt ends with when the node ends it (None: a result, or the hub's)."""
        return _REASONS.get(self)


_REASONS = {
    CrawlEndKind.HANG: Reason.HANG,
    CrawlEndKind.ERROR: Reason.ERROR,
    CrawlEndKind.SPOT: Reason.SPOT,
    CrawlEndKind.BUSY: Reason.BUSY,
}


@dataclass
class CrawlEnd:
    kind: CrawlEndKind
    result: dict[str, Any] | None = None
    error: str | None = None
    kill_path: str | None = None
    forced: bool = False  # the crawler was killed: its browser and Grid session must be ended for it
    current: SiteRecord | None = None  # fenced: the record as the hub left it


def exited_end(code: int) -> CrawlEnd:
    """The crawler process ended without reporting a result or an error."""
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    return CrawlEnd(CrawlEndKind.ERROR, error=f"crawler process ended without a result ({how})", forced=True)


def spot_end(notice: object) -> CrawlEnd:
    return CrawlEnd(CrawlEndKind.SPOT, error=f"spot interruption notice: {notice}", forced=True)


def busy_end(site: str, lock_timeout_s: float) -> CrawlEnd:
    return CrawlEnd(CrawlEndKind.BUSY, error=f"profile lock of {site} held elsewhere for {lock_timeout_s:.0f}s")


def refused_end(detail: object) -> CrawlEnd:
    """DynamoDB refused a write of the attempt as invalid: no retry of it can succeed, so the attempt is an error."""
    return CrawlEnd(CrawlEndKind.ERROR, error=f"the table refused a write of this attempt: {detail}", forced=True)


# --- settling an ended attempt --------------------------------------------------------------------------------------


class FollowUp(enum.Enum):
    REQUEUE = "requeue"  # send the next attempt's message, then delete this one
    RELEASE = "release"  # mark the site enqueued and let this message show again after `release_after_s`
    FAIL = "fail"  # the site is FAILED: delete the message


@dataclass(frozen=True)
class Settle:
    follow: FollowUp
    release_after_s: float | None = None


def end_attempt_args(end: CrawlEnd, rules: NodeRules, now: float) -> dict[str, Any]:
    """The keyword arguments of `ops.end_attempt` for an attempt the node ends itself (not a result, not fenced)."""
    reason = end.kind.reason
    if reason is None:
        raise ValueError(f"the node does not end an attempt that ended as {end.kind}")
    return dict(
        reason=reason,
        now=now,
        max_attempts=rules.max_attempts,
        spot_cap=rules.spot_cap,
        kill_path=end.kill_path,
        error=end.error,
    )


def settle(end: CrawlEnd, attempt: int, new: SiteRecord) -> Settle:
    """What follows `ops.end_attempt` of `attempt` that returned `new`. A given-back attempt (spot, busy; under the
    cap) reuses its message: the released message is the next attempt's message."""
    if new.run_status is not RunStatus.QUEUED:
        return Settle(FollowUp.FAIL)
    if new.attempt < attempt:
        return Settle(FollowUp.RELEASE, BUSY_RETRY_S if end.kind is CrawlEndKind.BUSY else 0.0)
    return Settle(FollowUp.REQUEUE)
