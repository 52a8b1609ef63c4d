"""The site record: its statuses, the legal moves between them, and the one place that moves it.

A site of a run has two statuses (field names kept from the original design):
`run_status` is the outcome of the site for the run, `site_status` is what the
crawler of the current attempt is doing. `transition()` is the only way to make a
new record from an old one; it refuses illegal moves and bumps `version`, which
every DynamoDB write is conditional on (see `fleet.record.table`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from fleet.errors import IllegalTransition


class RunStatus(StrEnum):
    QUEUED = "QUEUED"  # waiting for a node; its message is in the queue (or `enqueued` is false: being sent)
    RUN = "RUN"  # a node claimed it: attempt `attemptCount` runs on `instance_id`
    COMPLETED = "COMPLETED"  # its result is in S3; terminal
    FAILED = "FAILED"  # out of attempts, or the run's deadline passed; terminal

    def is_terminal(self) -> bool:
        return self in (RunStatus.COMPLETED, RunStatus.FAILED)


class RunState(StrEnum):
    """The run item's `status`: whether the run as a whole is still going."""

    RUNNING = "RUNNING"  # the hub (or a resumed hub) owns it; sites are being crawled
    FINISHED = "FINISHED"  # every site is terminal, or the run was ended (teardown, deadline); terminal

    def is_terminal(self) -> bool:
        return self is RunState.FINISHED


class NodeState(StrEnum):
    """A node's own account of itself, on its node item."""

    BOOTING = "booting"  # the agent has not reached its loop yet
    IDLE = "idle"  # waiting for a message
    BUSY = "busy"  # an attempt is under way (its site record carries the heartbeats)
    EXITING = "exiting"  # the agent stopped taking work; the instance shuts down next


class SiteStatus(StrEnum):
    PENDING = "PENDING"  # no crawler yet: queued, or claimed and the browser is starting
    RUNNING = "RUNNING"  # the crawler started
    URL_CALL = "URL_CALL"  # a navigation is under way (the only status a hang is detected in)
    CALL_DONE = "CALL_DONE"  # the last navigation returned
    SAVED = "SAVED"  # the node staged the attempt's result (under its own prefix): the hub makes it the site's result
    COMPLETED = "COMPLETED"  # the attempt produced the site's result
    FAILED = "FAILED"  # the site failed for good


class Reason(StrEnum):
    """Why an attempt ended without a result (`failure_reason`)."""

    HANG = "hang"  # URL_CALL unchanged for hang_after_s
    LOST = "lost"  # the node stopped heartbeating, or its instance is gone
    ERROR = "error"  # the crawler raised (HTTP error, selector missing, browser failed to start...)
    DEADLINE = "deadline"  # the run's deadline passed first
    SPOT = "spot"  # the node got a spot interruption notice
    KILLED = "killed"  # an operator tore the run down
    NO_NODES = "no-nodes"  # no node of the run could start, so nothing could crawl it
    BUSY = "busy"  # the site's profile was locked elsewhere (a node cut off but still alive): tried again later
    ROBOTS = "robots"  # the site's robots.txt disallows its start URL for the crawler's user agent: not retried
    CONTRACT = "contract"  # the result broke the site's data contract (`expect`): quarantined, not retried


def known_reason(value: object) -> Reason | None:
    """`value` as a Reason, or None if it is none (a value read back from the table, which nodes write to)."""
    try:
        return Reason(value) if isinstance(value, str) else None
    except ValueError:
        return None


#: Attempts that end for these reasons are given back (not counted), up to `run.spot_requeue_cap`.
GIVEN_BACK = frozenset({Reason.SPOT, Reason.BUSY})


class Outcome(StrEnum):
    """How one attempt ended, in the record's `attempts` history."""

    COMPLETED = "completed"
    SKIPPED = "skipped"  # the result was already in S3
    HANG = "hang"
    LOST = "lost"
    ERROR = "error"
    DEADLINE = "deadline"
    SPOT = "spot"
    KILLED = "killed"
    NO_NODES = "no-nodes"
    BUSY = "busy"
    ROBOTS = "robots"
    CONTRACT = "contract"

    @classmethod
    def of(cls, reason: Reason) -> Outcome:
        """The outcome an attempt ended for `reason` records: every reason is an outcome of the same name."""
        return cls(reason.value)


# Legal moves of run_status; every edge says who takes it and why.
RUN_TRANSITIONS: dict[RunStatus, dict[RunStatus, str]] = {
    RunStatus.QUEUED: {
        RunStatus.QUEUED: "hub/node: bookkeeping on a queued site (message sent)",
        RunStatus.RUN: "node: claimed the site's message; an attempt starts",
        RunStatus.FAILED: "hub: deadline or teardown before any node took it",
    },
    RunStatus.RUN: {
        RunStatus.RUN: "node: crawler progress / heartbeat; hub: kill requested",
        RunStatus.QUEUED: "node or hub: the attempt ended without a result and attempts remain (or spot)",
        RunStatus.COMPLETED: "hub: the attempt's staged result (SAVED) is now the site's result (or one was there)",
        RunStatus.FAILED: "node or hub: the last attempt ended without a result, or deadline",
    },
    RunStatus.COMPLETED: {},
    RunStatus.FAILED: {},
}

# Terminal is terminal for hub and nodes. Only an operator's rerun (`transition(..., reopen=True)`, through
# `ops.reopen` alone) opens a site again, with max_attempts fresh attempts.
REOPEN_TRANSITIONS: dict[RunStatus, dict[RunStatus, str]] = {
    RunStatus.COMPLETED: {RunStatus.QUEUED: "operator: `rerun --force` (the old result is set aside)"},
    RunStatus.FAILED: {RunStatus.QUEUED: "operator: `rerun` (the site failed for good)"},
}

# Legal moves of site_status within an attempt; a new attempt always restarts at PENDING.
SITE_TRANSITIONS: dict[SiteStatus, frozenset[SiteStatus]] = {
    SiteStatus.PENDING: frozenset({SiteStatus.RUNNING, SiteStatus.SAVED, SiteStatus.FAILED}),
    SiteStatus.RUNNING: frozenset({SiteStatus.URL_CALL, SiteStatus.SAVED, SiteStatus.FAILED}),
    SiteStatus.URL_CALL: frozenset({SiteStatus.CALL_DONE, SiteStatus.SAVED, SiteStatus.FAILED}),
    SiteStatus.CALL_DONE: frozenset({SiteStatus.URL_CALL, SiteStatus.SAVED, SiteStatus.FAILED}),
    SiteStatus.SAVED: frozenset({SiteStatus.COMPLETED, SiteStatus.FAILED}),
    SiteStatus.COMPLETED: frozenset(),
    SiteStatus.FAILED: frozenset(),
}


def _closure(edges: dict[SiteStatus, frozenset[SiteStatus]]) -> dict[SiteStatus, frozenset[SiteStatus]]:
    out = {}
    for start in edges:
        seen: set[SiteStatus] = set()
        todo = list(edges[start])
        while todo:
            s = todo.pop()
            if s not in seen:
                seen.add(s)
                todo.extend(edges[s])
        out[start] = frozenset(seen)
    return out


#: Where a site_status can get to in one or more steps: a node that writes its progress with its heartbeat
#: (not each step) moves the record along a path of SITE_TRANSITIONS in one write, never back.
SITE_REACHABLE = _closure(SITE_TRANSITIONS)

#: What site_status must be once run_status is (or becomes) a given value.
SITE_FOR_RUN = {
    RunStatus.QUEUED: {SiteStatus.PENDING},
    RunStatus.RUN: {
        SiteStatus.PENDING,
        SiteStatus.RUNNING,
        SiteStatus.URL_CALL,
        SiteStatus.CALL_DONE,
        SiteStatus.SAVED,
    },
    RunStatus.COMPLETED: {SiteStatus.COMPLETED},
    RunStatus.FAILED: {SiteStatus.FAILED},
}


@dataclass(frozen=True)
class SiteSpec:
    """What to crawl; copied onto the record at seeding so nodes need only the table."""

    start_url: str
    crawler: str = "links"
    options: Mapping[str, Any] = field(default_factory=dict)
    incremental: bool = False  # keep a high-water mark; the crawler stops at items already seen
    rate_limit: str | None = None  # the fleet-wide rate limit group its requests count against
    per_s: float | None = None  # that group's requests per second
    robots: bool = True  # honour the site's robots.txt (fleet.yaml's `politeness: {robots: false}` turns it off)
    expect: Mapping[str, Any] = field(default_factory=dict)  # the data contract (`fleet.crawl.contract`); empty: none
    baseline_items: int | None = None  # the items of the site's previous COMPLETED run, for `max_drop` (the hub's)
    blocked_markers: tuple[str, ...] = ()  # the site's own markers of a blocked page (`fleet.record.blocked`)
    # requests per second to its domain, fleet-wide (`fleet.crawl.pacing`); None: none
    per_domain_s: float | None = None


#: Collided item ids an attempt's counts list (the rest are counted), and the characters kept of each.
MAX_COLLIDED = 5
COLLIDED_ID_MAX_CHARS = 200


@dataclass(frozen=True)
class Counts:
    """What one attempt found: the items it saved (not those of the checkpoint it resumed from), the pages it
    fetched, the items it did not emit because another of the same id and other content came first
    (`collisions`, the first ids in `collided`), those it did not emit for want of an id (`skipped`), and the
    pages it did not fetch because the site's robots.txt disallows them (`robots_skipped`)."""

    items: int = 0
    pages: int = 0
    collisions: int = 0
    skipped: int = 0
    collided: tuple[str, ...] = ()
    robots_skipped: int = 0


@dataclass(frozen=True)
class Attempt:
    n: int
    instance_id: str
    start: float
    end: float | None = None
    outcome: str | None = None
    kill_path: str | None = None
    counts: Counts | None = None  # None: not recorded (an attempt of an older node)
    failure_class: str | None = None  # why it failed, by class (`fleet.record.failures`); None: it did not fail
    http_status: int | None = None  # the HTTP status it failed on, if it failed on one

    def finished(
        self,
        now: float,
        outcome: Outcome,
        kill_path: str | None = None,
        counts: Counts | None = None,
        failure: tuple[str | None, int | None] = (None, None),
    ) -> Attempt:
        """The attempt ended; its counts as the node last wrote them unless `counts` are given; `failure` is its
        (class, HTTP status) if it failed."""
        kept = self.counts if counts is None else counts
        return dataclasses.replace(
            self,
            end=now,
            outcome=str(outcome),
            kill_path=kill_path,
            counts=kept,
            failure_class=failure[0],
            http_status=failure[1],
        )


@dataclass(frozen=True)
class SiteRecord:
    run_id: str
    site: str
    spec: SiteSpec
    run_status: RunStatus = RunStatus.QUEUED
    site_status: SiteStatus = SiteStatus.PENDING
    attempt: int = 0  # attemptCount: attempts started (claims), spot requeues given back
    instance_id: str | None = None
    version: int = 0
    last_update: float | None = None  # lastUpdateEpoch, by the writer's clock
    heartbeat: float | None = None  # heartbeatEpoch, by the node's clock
    enqueued: bool = False  # the message for the next attempt is in the queue
    failure_reason: str | None = None
    failure_class: str | None = None  # the class of the last failed attempt (`fleet.record.failures.FailureClass`)
    http_status: int | None = None  # the HTTP status it failed on, if any
    retry_at: float | None = None  # QUEUED after a failure: the next attempt's message is not sent before this
    avoid_instance: str | None = None  # QUEUED after a blocked attempt: the instance the next one should not use
    error: str | None = None
    result_key: str | None = None
    url: str | None = None  # the page of the current URL_CALL/CALL_DONE
    pages: int = 0  # pages the crawl got to (a resumed attempt counts its checkpoint's); COMPLETED: the result's
    items: int | None = None  # COMPLETED: the items of its result (None: not known, or not COMPLETED)
    #: SAVED: the claim version the node staged its result under (`fleet.outputs.results.staged_result_key`); 0: the
    #: run's result was already at its key (a retry found it), so nothing was staged. None otherwise.
    staged: int | None = None
    kill_reason: str | None = None  # set by the hub before it kills the current attempt
    kill_path: str | None = None  # how the last kill was done: watchdog, local, ssm, ssh, terminate
    receipt: str | None = None  # the SQS receipt handle of the current attempt's message (to delete it)
    spot_requeues: int = 0  # attempts given back (spot interruption, profile busy), capped
    attempt_base: int = 0  # attemptCount when an operator last reran the site: max_attempts counts from here
    attempts: tuple[Attempt, ...] = ()
    expire_at: int | None = None
    checkpoint: Mapping[str, Any] | None = None  # where the crawl got to (`fleet.outputs.checkpoint`); a retry resumes
    mark: tuple[str, ...] | None = None  # incremental: the newest item ids of the last successful crawl

    @property
    def is_terminal(self) -> bool:
        return self.run_status.is_terminal()

    @property
    def current_attempt(self) -> Attempt | None:
        if self.attempts and self.attempts[-1].n == self.attempt and self.attempts[-1].end is None:
            return self.attempts[-1]
        return None

    def fence(self) -> str:
        return f"attempt {self.attempt} on {self.instance_id or '-'} at version {self.version}"


def transition(old: SiteRecord, *, bump: bool = True, reopen: bool = False, **changes: Any) -> SiteRecord:
    """The new record after `changes`, if the move is legal; raises IllegalTransition if not.

    `bump=False` is for writes that change no status (heartbeats, the `enqueued`
    mark): they stay fenced by version but do not move it, so they never make a
    concurrent state write of the hub or a claim fail.
    """
    if bump:
        if "version" in changes:
            raise IllegalTransition(old.site, "version", old.version, changes["version"])
        changes["version"] = old.version + 1
    new = _replaced(old, changes)
    if new.run_status != old.run_status or new.site_status != old.site_status:
        if not bump:
            raise IllegalTransition(old.site, "status change without a version bump", old.run_status, new.run_status)
        if reopen:
            if new.run_status not in REOPEN_TRANSITIONS.get(old.run_status, {}):
                raise IllegalTransition(old.site, "reopen", old.run_status, new.run_status)
        else:
            _check(old, new)
    if new.site_status not in SITE_FOR_RUN[new.run_status]:
        raise IllegalTransition(old.site, "run_status/site_status pair", new.run_status, new.site_status)
    if new.attempt < 0 or (
        new.attempt != old.attempt and new.run_status is RunStatus.RUN and old.run_status is RunStatus.RUN
    ):
        raise IllegalTransition(old.site, "attemptCount during an attempt", old.attempt, new.attempt)
    if not bump and new.version != old.version:
        raise IllegalTransition(old.site, "version", old.version, new.version)
    return new


_RECORD_FIELDS = frozenset(f.name for f in dataclasses.fields(SiteRecord))


def _replaced(old: SiteRecord, changes: dict[str, Any]) -> SiteRecord:
    """`dataclasses.replace(old, **changes)` without running the constructor again (a record has no checks of its
    own in it: `transition` makes them), a few times faster: nodes write a record on every heartbeat."""
    unknown = changes.keys() - _RECORD_FIELDS
    if unknown:
        raise TypeError(f"SiteRecord has no field {sorted(unknown)[0]!r}")
    new = object.__new__(SiteRecord)
    new.__dict__.update(old.__dict__)
    new.__dict__.update(changes)
    return new


def _check(old: SiteRecord, new: SiteRecord) -> None:
    if new.run_status not in RUN_TRANSITIONS[old.run_status]:
        raise IllegalTransition(old.site, "run_status", old.run_status, new.run_status)
    starting = old.run_status is not RunStatus.RUN and new.run_status is RunStatus.RUN
    if starting:
        if new.attempt != old.attempt + 1 or new.site_status is not SiteStatus.PENDING:
            raise IllegalTransition(old.site, "claim", f"attempt {old.attempt}", f"attempt {new.attempt}")
        return
    if new.site_status != old.site_status and new.run_status is RunStatus.RUN:
        if new.site_status not in SITE_REACHABLE[old.site_status]:
            raise IllegalTransition(old.site, "site_status", old.site_status, new.site_status)
