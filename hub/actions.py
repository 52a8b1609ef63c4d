"""What `plan()` may ask for, and what the executor reports back. Frozen data: the executor performs actions,
tests compare them; nothing here decides anything."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from fleet.record.state import Reason, SiteSpec


@dataclass(frozen=True)
class StartRun:
    started_at: float
    deadline_at: float
    run_date: str


@dataclass(frozen=True)
class SeedSites:
    """Create the records of sites not yet in the table, then send their first messages (unless `send` is false:
    a metered queue sends them later, by `Feed`)."""

    sites: tuple[tuple[str, SiteSpec], ...]
    send: bool = True


@dataclass(frozen=True)
class Feed:
    """Send the first messages of these held sites (QUEUED, never sent, never attempted), in this order."""

    sites: tuple[str, ...]


@dataclass(frozen=True)
class Enqueue:
    """A QUEUED site whose message was never marked sent (a writer crashed): send it."""

    site: str
    version: int


class KillLadder(StrEnum):
    """The rungs the executor climbs to stop an attempt, as the plan chose them. The node's own watchdog is the
    rung below all of these: the hub only kills what it did not end by itself."""

    NONE = "none"  # no instance holds the attempt: there is nothing to stop, only the attempt to end
    FALLBACK = "fallback"  # the node control (local, SSM, SSH); the instance is terminated only if that fails
    TERMINATE = "terminate"  # the node control, then the instance is terminated whatever it did (the node is sick)


@dataclass(frozen=True)
class KillAttempt:
    """Stop attempt `attempt` of `site` on `instance_id` by `ladder`, then requeue or fail it."""

    site: str
    instance_id: str | None
    attempt: int
    reason: Reason
    ladder: KillLadder = KillLadder.FALLBACK


@dataclass(frozen=True)
class EndAttempt:
    """The attempt's instance is gone: nothing to kill, requeue or fail it."""

    site: str
    attempt: int
    reason: Reason


@dataclass(frozen=True)
class Promote:
    """The attempt's node staged the site's result (SAVED): make it the site's result (the hub's copy to the key the
    site, date and run derive), then COMPLETED; the staged result missing ends the attempt as an error."""

    site: str
    attempt: int


@dataclass(frozen=True)
class Repair:
    """A site whose record no one can read (a node wrote what is no status or fence into it): put a record the
    fleet can work with over it, its attempt in progress ended as an error (`hub.executor`)."""

    site: str


@dataclass(frozen=True)
class FailSites:
    sites: tuple[str, ...]
    reason: Reason
    error: str | None = None


@dataclass(frozen=True)
class Launch:
    """Start nodes. `failures` and `backoff_s` are the plan's answer, given in advance, to a launch that starts
    nothing: the run item then records failures + 1 such launches in a row and no launch before `backoff_s`
    from now (the plan reads both back and waits, or gives up)."""

    count: int
    target: int | None = None  # live nodes wanted: the provider re-reads what runs and launches only the difference
    failures: int = 0  # launches in a row that started nothing before this one
    backoff_s: float = 2.0


@dataclass(frozen=True)
class Terminate:
    instance_ids: tuple[str, ...]
    reason: str  # boot-timeout | node-lost | boot-failed | scale-in | deadline | no-nodes | finish | teardown


@dataclass(frozen=True)
class Drain:
    """One pass over the queue at the end of a run: delete this run's messages, leave other runs' alone."""

    max_messages: int = 1000


@dataclass(frozen=True)
class Finish:
    """The run is over: its instances are gone (or `left_running` of them would not go), every site is terminal and
    the queue is drained. The hub writes the summary and marks the run finished."""

    reason: str  # done | deadline | no-nodes | teardown
    left_running: int = 0


Action = (
    StartRun
    | SeedSites
    | Feed
    | Enqueue
    | KillAttempt
    | EndAttempt
    | Promote
    | Repair
    | FailSites
    | Launch
    | Terminate
    | Drain
    | Finish
)


@dataclass(frozen=True)
class Ending:
    """A run on its way out, from the tick the plan decided it (hub memory, carried from one plan to the next
    through the snapshot; a restarted hub decides again). `since` is on the hub's clock."""

    why: str  # the finish reason: done | deadline | no-nodes | teardown
    since: float
    reason: Reason | None = None  # what the sites still open fail with (None: none should be open)
    error: str | None = None  # the error those sites record
    drain_s: float | None = None  # how long to wait for messages still in flight (None: the queue is not drained)


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    wake_at: float  # hub clock: the earliest moment something can change without an event
    ending: Ending | None = None  # the run is ending: the next snapshot carries this back to the plan


@dataclass(frozen=True)
class Done:
    """What the executor did for one action, as data: the instances or sites it acted on, how an attempt was
    killed, the writes that lost to a newer one (the next snapshot shows why; the next plan decides again)."""

    action: Action
    acted_on: tuple[str, ...] = ()
    kill_path: str | None = None
    conflicts: int = 0


def action_sites(action: Action) -> tuple[str, ...]:
    """The sites an action writes (none for one about the run or the fleet)."""
    sites = getattr(action, "sites", None)
    if sites is not None:
        return tuple(x if isinstance(x, str) else x[0] for x in sites)  # SeedSites holds (site, spec) pairs
    site = getattr(action, "site", None)
    return (site,) if isinstance(site, str) else ()
