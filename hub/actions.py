"""What `plan()` may ask for. Frozen data: the executor performs them, tests compare them."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.state import Reason, SiteSpec


@dataclass(frozen=True)
class StartRun:
    started_at: float
    deadline_at: float
    run_date: str


@dataclass(frozen=True)
class SeedSites:
    """Create the records of sites not yet in the table, then send their first messages."""

    sites: tuple[tuple[str, SiteSpec], ...]


@dataclass(frozen=True)
class Enqueue:
    """A QUEUED site whose message was never marked sent (a writer crashed): send it."""

    site: str
    version: int


@dataclass(frozen=True)
class KillAttempt:
    """Stop attempt `attempt` of `site` on `instance_id` (kill ladder), then requeue or fail it."""

    site: str
    instance_id: str | None
    attempt: int
    reason: Reason


@dataclass(frozen=True)
class EndAttempt:
    """The attempt's instance is gone: nothing to kill, requeue or fail it."""

    site: str
    attempt: int
    reason: Reason


@dataclass(frozen=True)
class FailSites:
    sites: tuple[str, ...]
    reason: Reason
    error: str | None = None


@dataclass(frozen=True)
class Launch:
    count: int
    target: int | None = None  # live nodes wanted: the provider re-reads what runs and launches only the difference


@dataclass(frozen=True)
class Terminate:
    instance_ids: tuple[str, ...]
    reason: str  # boot-timeout | node-lost | deadline | finish | leak


@dataclass(frozen=True)
class Finish:
    """Every site is terminal: terminate the fleet, verify, write the summary, end the run."""

    reason: str  # done | deadline


Action = StartRun | SeedSites | Enqueue | KillAttempt | EndAttempt | FailSites | Launch | Terminate | Finish


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    wake_at: float  # hub clock: the earliest moment something can change without an event
