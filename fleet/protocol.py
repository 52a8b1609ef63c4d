"""The node's protocol as pure decisions, so that the agent and the simulator run one protocol, not two copies.

A node receives a message, claims the site's next attempt, crawls it with
heartbeats and its own watchdog, settles the attempt (result, requeue, give
back, or leave it to the hub when fenced) and takes the next message until it
has a reason to stop. Everything here decides and nothing acts: no AWS call,
no clock read (`now` is the epoch, `mono` the monotonic time, both passed in).
The real agent (`node.agent`, blocking, real processes) and the simulator's
nodes (event-driven on virtual time) each execute these decisions with their
own I/O, so what they do cannot drift apart.

Both turn whatever stopped a crawl (a result, the watchdog, the crawler's death,
a spot notice, a profile held elsewhere, a fenced write) into a `CrawlEnd`, and
settle it the same way: requeue, give the message back, or fail the site.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from fleet.outputs.checkpoint import SaveEvery
from fleet.record import ops
from fleet.record.failures import Failure, FailureClass, RetryPolicy
from fleet.record.messages import BadMessage, SiteMessage
from fleet.record.partition import NodeInfo, RunInfo
from fleet.record.state import NodeState, Reason, RunStatus, SiteRecord, SiteStatus

#: AWS errors in a row (after botocore's retries) after which the node gives up and exits.
MAX_AWS_FAILURES = 10

#: How long a claimed site's message stays hidden. The hub owns a claimed site's recovery (it ends a dead or
#: killed attempt and deletes this message by its receipt), so the message only has to stay out of other nodes'
#: way: set once after the claim (SQS's maximum), extended by a heartbeat only when a crawl nears it.
CLAIMED_VISIBILITY_S = 12 * 3600.0


#: A message for an attempt running elsewhere (or for another run) is looked at again after at most this long.
WAIT_HIDE_S = 30.0

#: A message that is not a site message, or names a site that has no record, shows again after this long; it
#: reaches the DLQ after max_receive_count receives (the node never deletes it: the run's summary reports the DLQ).
BAD_MESSAGE_HIDE_S = 1.0


@dataclass(frozen=True)
class NodeRules:
    """The settings the protocol decides by (the agent's own settings add what only a real node needs)."""

    max_attempts: int = 3
    spot_cap: int = 3
    hang_after_s: float = 120
    heartbeat_interval_s: float = 30
    visibility_s: float = 90
    idle_exit_s: float = 20
    sites_per_node: int = 0
    browser_start_timeout_s: float = 120
    node_watchdog: bool = True
    receive_wait_s: float = 5
    claimed_visibility_s: float = CLAIMED_VISIBILITY_S
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # `run.retry`: each failure class's retry
    save_every: SaveEvery = field(default_factory=SaveEvery)  # when staged checkpoints are saved


# --- how an attempt ends --------------------------------------------------------------------------------------------

#: How long a node may take from a hang's deadline to the attempt's end in the table: the crawler's kill, the evidence
#: (its capture has a 5 s budget), the browser's end and the writes. With node watchdogs on, the hub's backup kill of
#: a hang waits this much longer than the node's, so the node's own kill (cheaper, with its evidence) wins.
NODE_HANG_END_S = 12.0

#: A site whose profile was locked elsewhere is offered again after this long.
BUSY_RETRY_S = 30.0


class CrawlEndKind(StrEnum):
    RESULT = "result"  # the crawler reported the site's result
    HANG = "hang"  # the node's watchdog saw no progress on a page for hang_after_s
    ERROR = "error"  # the crawler failed, died, or its browser never started
    FENCED = "fenced"  # the hub moved the record on: the attempt is the hub's to end
    SPOT = "spot"  # a spot interruption notice: the attempt is given back
    BUSY = "busy"  # the site's profile was locked elsewhere: the attempt is given back, tried again later
    ROBOTS = "robots"  # the site's robots.txt disallows its start URL: the site FAILED, not retried
    CONTRACT = "contract"  # the crawler's result broke the site's data contract: quarantined, the site FAILED

    @property
    def reason(self) -> Reason | None:
        """The reason the record's attempt ends with when the node ends it (None: a result, or the hub's)."""
        return _REASONS.get(self)


_REASONS = {
    CrawlEndKind.HANG: Reason.HANG,
    CrawlEndKind.ERROR: Reason.ERROR,
    CrawlEndKind.SPOT: Reason.SPOT,
    CrawlEndKind.BUSY: Reason.BUSY,
    CrawlEndKind.ROBOTS: Reason.ROBOTS,
    CrawlEndKind.CONTRACT: Reason.CONTRACT,
}


@dataclass
class CrawlEnd:
    kind: CrawlEndKind
    result: dict[str, Any] | None = None
    error: str | None = None
    kill_path: str | None = None
    forced: bool = False  # the crawler was killed: its browser and Grid session must be ended for it
    current: SiteRecord | None = None  # fenced: the record as the hub left it
    failure: Failure | None = None  # the attempt's class as the crawler or the node saw it (None: by the reason)


def exited_end(code: int) -> CrawlEnd:
    """The crawler process ended without reporting a result or an error."""
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    return CrawlEnd(
        CrawlEndKind.ERROR,
        error=f"crawler process ended without a result ({how})",
        forced=True,
        failure=Failure(FailureClass.CRASH),
    )


def spot_end(notice: object) -> CrawlEnd:
    return CrawlEnd(CrawlEndKind.SPOT, error=f"spot interruption notice: {notice}", forced=True)


def grid_lost_end(end: CrawlEnd) -> CrawlEnd:
    """A crawl that failed while the Grid hub does not answer (or no longer lists this node): not the site's fault,
    nor the node's (its hub was lost and is being replaced), so the attempt is given back, as for a busy profile."""
    return CrawlEnd(CrawlEndKind.BUSY, error=f"the Grid hub does not answer, so the crawl could not: {end.error}")


def busy_end(site: str, lock_timeout_s: float) -> CrawlEnd:
    return CrawlEnd(CrawlEndKind.BUSY, error=f"profile lock of {site} held elsewhere for {lock_timeout_s:.0f}s")


def refused_end(detail: object) -> CrawlEnd:
    """DynamoDB refused a write of the attempt as invalid: no retry of it can succeed, so the attempt is an error."""
    return CrawlEnd(CrawlEndKind.ERROR, error=f"the table refused a write of this attempt: {detail}", forced=True)


def declared_lost(rec: SiteRecord, attempt: int, instance_id: str) -> bool:
    """Whether the hub ended (or is ending) `attempt` on `instance_id` because it took the node for dead."""
    if rec.kill_reason == str(Reason.LOST) and rec.instance_id == instance_id:
        return True
    return any(a.n == attempt and a.instance_id == instance_id and a.outcome == str(Reason.LOST) for a in rec.attempts)


# --- settling an ended attempt --------------------------------------------------------------------------------------


class FollowUp(enum.Enum):
    REQUEUE = "requeue"  # send the next attempt's message, then delete this one
    DEFER = "defer"  # delete this message: the hub sends the next attempt's when its backoff (`retry_at`) ends
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
        failure=end.failure,
        policy=rules.retry,
    )


def settle(end: CrawlEnd, attempt: int, new: SiteRecord) -> Settle:
    """What follows `ops.end_attempt` of `attempt` that returned `new`. A given-back attempt (spot, busy; under the
    cap) reuses its message: the released message is the next attempt's message."""
    if new.run_status is not RunStatus.QUEUED:
        return Settle(FollowUp.FAIL)
    if new.attempt < attempt:
        return Settle(FollowUp.RELEASE, BUSY_RETRY_S if end.kind is CrawlEndKind.BUSY else 0.0)
    return Settle(FollowUp.DEFER if new.retry_at is not None else FollowUp.REQUEUE)


# --- a received message ---------------------------------------------------------------------------------------------


class MessageAction(enum.Enum):
    CLAIM = "claim"  # claim the site's next attempt
    DELETE = "delete"  # the attempt has been and gone: drop the message
    HIDE = "hide"  # not now: make the message visible again after `visibility_s`
    RELEASE = "release"  # not a site message: let it show again soon (it ends in the DLQ)
    KEEP = "keep"  # leave the message as it is (another node's claim won the race)


@dataclass(frozen=True)
class MessageStep:
    action: MessageAction
    visibility_s: float | None = None
    step_back_s: float = 0.0  # the node receives nothing for this long (the hidden message shows to others first)
    refused: str = ""  # why the message is none of this node's to act on: said in the node's log, one line each time


def record_of(msg: SiteMessage | BadMessage) -> tuple[str, str] | None:
    """The (run, site) whose record decides what to do with `msg`; None for a bad message, which needs none."""
    return None if isinstance(msg, BadMessage) else (msg.run_id, msg.site)


#: A retry that should avoid a node (a blocked attempt's) is left to others for this many receives, each time hidden
#: for AVOID_HIDE_S while the node it avoids receives nothing for AVOID_STEP_BACK_S more (so the message shows
#: again to the others' polls alone); then that node takes it anyway (there may be no other).
AVOID_RECEIVES = 3
AVOID_HIDE_S = 5.0
AVOID_STEP_BACK_S = 1.0


def on_message(
    msg: SiteMessage | BadMessage, rec: SiteRecord | None, run_id: str, rules: NodeRules, instance_id: str = ""
) -> MessageStep:
    """What to do with a received message, given its site's record (None for a bad message or an unknown site).

    A message no record explains (a bad body; a site its run does not have, or a run there is not) is never the
    node's to delete: the hub creates a site's record before its first message, so no one who seeded a run sent it.
    It shows again soon and SQS moves it to the DLQ. A message of another run whose record is there is left to that
    run's nodes, or dropped when its attempt has been and gone, as they would drop it."""
    if isinstance(msg, BadMessage):
        return MessageStep(MessageAction.RELEASE, BAD_MESSAGE_HIDE_S, refused=msg.problem)
    if rec is None:
        return MessageStep(MessageAction.RELEASE, BAD_MESSAGE_HIDE_S, refused="no such site in its run")
    verdict = ops.classify(rec, msg.attempt)
    if verdict is ops.Verdict.STALE:
        return MessageStep(MessageAction.DELETE)
    if msg.run_id != run_id:
        return MessageStep(MessageAction.HIDE, min(rules.visibility_s, WAIT_HIDE_S), refused="a message of another run")
    if verdict is ops.Verdict.WAIT:
        return MessageStep(MessageAction.HIDE, min(rules.visibility_s, WAIT_HIDE_S))
    if rec is not None and instance_id and rec.avoid_instance == instance_id and msg.receive_count < AVOID_RECEIVES:
        return MessageStep(MessageAction.HIDE, AVOID_HIDE_S, step_back_s=AVOID_HIDE_S + AVOID_STEP_BACK_S)
    return MessageStep(MessageAction.CLAIM)


def on_claim_lost(current: SiteRecord | None, attempt: int) -> MessageStep:
    """Another node claimed the attempt first (a duplicate message): drop the message once its attempt is over."""
    if ops.classify(current, attempt) is ops.Verdict.STALE:
        return MessageStep(MessageAction.DELETE)
    return MessageStep(MessageAction.KEEP)


# --- while the attempt runs -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Watch:
    """Where the running attempt stands for the node's timers: the crawler's latest step and since when (for the
    watchdog), when the next heartbeat is due, and until when the claimed message is hidden. Monotonic times."""

    rules: NodeRules
    status: SiteStatus = SiteStatus.PENDING
    since: float = 0.0
    next_beat: float = 0.0
    hidden_until: float = 0.0
    progress: ops.Progress | None = None  # the crawler's latest step, written with the next heartbeat

    @classmethod
    def start(cls, rules: NodeRules, mono: float) -> Watch:
        """Just claimed: no browser yet, the first beat one interval away, the message not hidden for long yet."""
        return cls(rules, since=mono, next_beat=mono + rules.heartbeat_interval_s)

    def stepped(self, status: SiteStatus, url: str | None, pages: int | None, now: float, mono: float) -> Watch:
        # built field by field, not with dataclasses.replace: the simulator makes hundreds of thousands of these
        return Watch(self.rules, status, mono, self.next_beat, self.hidden_until, ops.Progress(status, now, url, pages))

    @property
    def writes_each_step(self) -> bool:
        """Without node watchdogs the hub times each step, so it needs every step at once; with them the latest step
        rides on the next heartbeat (one write per interval, however many pages)."""
        return not self.rules.node_watchdog

    def beat_due(self, mono: float) -> bool:
        return mono >= self.next_beat

    def beaten(self, mono: float) -> Watch:
        """A heartbeat (or a checkpoint, which is one) was written at `mono`."""
        return Watch(
            self.rules,
            self.status,
            self.since,
            mono + self.rules.heartbeat_interval_s,
            self.hidden_until,
            self.progress,
        )

    def hide_due(self, mono: float) -> bool:
        """Whether the claimed message could show again before the next two beats: hide it for long again."""
        return mono + 2 * self.rules.heartbeat_interval_s >= self.hidden_until

    def hidden(self, mono: float) -> Watch:
        return Watch(
            self.rules, self.status, self.since, self.next_beat, mono + self.rules.claimed_visibility_s, self.progress
        )

    @property
    def watchdog_at(self) -> float | None:
        """When the node kills the crawl unless it moves on: a page that never returns, a browser that never starts."""
        if self.status is SiteStatus.URL_CALL and self.rules.node_watchdog:
            return self.since + self.rules.hang_after_s
        if self.status is SiteStatus.PENDING:
            return self.since + self.rules.browser_start_timeout_s
        return None

    @property
    def wake_at(self) -> float:
        """The next time the node must act without news from the crawler: a heartbeat or its watchdog."""
        dog = self.watchdog_at
        return self.next_beat if dog is None else min(self.next_beat, dog)

    def timed_out(self, mono: float) -> CrawlEnd | None:
        """The end of an attempt whose watchdog fired by `mono` (None: it has not)."""
        dog = self.watchdog_at
        if dog is None or mono < dog:
            return None
        if self.status is SiteStatus.URL_CALL:
            url = self.progress.url if self.progress else "?"
            return CrawlEnd(
                CrawlEndKind.HANG,
                error=f"no progress on {url} for {self.rules.hang_after_s:.0f}s",
                kill_path="watchdog",
                forced=True,
            )
        return CrawlEnd(
            CrawlEndKind.ERROR,
            kill_path="watchdog",
            forced=True,
            error=f"browser session did not start in {self.rules.browser_start_timeout_s:.0f}s",
            failure=Failure(FailureClass.CRASH),
        )


@dataclass(frozen=True, slots=True)
class NodeCard:
    """What the node's own item says (its state, the attempt it is busy with) and when it is due again: at once after
    a change of state, else once per heartbeat interval (an idle node's liveness is read from it; a busy node's from
    its attempt's heartbeat, so the drivers write it only when they poll the queue)."""

    state: NodeState = NodeState.BOOTING
    site: str | None = None
    attempt: int | None = None
    due_at: float = -math.inf  # monotonic

    def moved(self, state: NodeState, busy_with: SiteRecord | None = None) -> NodeCard:
        if busy_with is None:
            return NodeCard(state)
        return NodeCard(state, busy_with.site, busy_with.attempt)

    def due(self, mono: float) -> bool:
        return mono >= self.due_at

    def written(self, mono: float, rules: NodeRules) -> NodeCard:
        return NodeCard(self.state, self.site, self.attempt, mono + rules.heartbeat_interval_s)

    def item(
        self, run_id: str, instance_id: str, now: float, started_at: float, sites_done: int, **extra: Any
    ) -> NodeInfo:
        return NodeInfo(run_id, instance_id, self.state, now, started_at, self.site, self.attempt, sites_done, **extra)


# --- when to stop taking work ---------------------------------------------------------------------------------------


class StopWhy(StrEnum):
    SICK = "sick"  # the node cannot crawl (its Grid node died, AWS keeps failing): exit with an error
    SPOT = "spot"
    LOST = "lost"
    SITES_DONE = "sites-done"
    IDLE = "idle"
    RUN_OVER = "run-over"


@dataclass(frozen=True)
class Stop:
    why: StopWhy
    detail: str


def sick(health: str | None, aws_failures: int) -> Stop | None:
    """`health` is None when the node can crawl, else why not."""
    if health:
        return Stop(StopWhy.SICK, health)
    if aws_failures >= MAX_AWS_FAILURES:
        return Stop(StopWhy.SICK, f"AWS failing for {aws_failures} tries in a row")
    return None


def before_receive(pending: Stop | None, notice: object, sites_done: int, rules: NodeRules) -> Stop | None:
    """Whether to stop before taking another message: a spot notice, a stop an attempt's end asked for, or
    sites_per_node reached."""
    if notice:
        return Stop(StopWhy.SPOT, f"spot interruption notice: {notice}")
    if pending is not None:
        return pending
    if rules.sites_per_node and sites_done >= rules.sites_per_node:
        return Stop(StopWhy.SITES_DONE, "sites_per_node reached")
    return None


def idle_stop(idle_s: float, rules: NodeRules, site_queued: Callable[[], bool]) -> Stop | None:
    """After an empty receive: idle for idle_exit_s is enough (waiting out AWS errors is not idling), unless a site
    of the run is QUEUED (asked only then: one Query). Its message can be out of sight for a while (taken by a long
    poll that died with its node, released later after a busy profile, being resent): the node stays for it rather
    than leave and have the hub launch another in its place."""
    if idle_s >= rules.idle_exit_s and not site_queued():
        return Stop(StopWhy.IDLE, f"no work for {idle_s:.0f}s")
    return None


def idle_restarts(idle_s: float, rules: NodeRules) -> bool:
    """An idle node that stayed for a QUEUED site counts its idleness again from now."""
    return idle_s >= rules.idle_exit_s


def has_queued(stamps: Mapping[str, tuple], held: Callable[[], bool]) -> bool:
    """Whether one of the run's open sites is QUEUED: one of `stamps` (the index `open`, which leaves out the sites
    as seeded), else `held()` (one of those: the hub holds it until its feed sends it)."""
    return any(stamp[2] == str(RunStatus.QUEUED) for stamp in stamps.values()) or held()


def run_stop(run: RunInfo | None) -> Stop | None:
    """After an empty receive that did not idle the node out: a run that is finished or gone has no work left."""
    if run is None or run.finished:
        return Stop(StopWhy.RUN_OVER, "run finished")
    return None


def stop_after(end: CrawlEnd) -> Stop | None:
    """A stop the end of an attempt asks for, whatever its settling does: a spot notice ends the node's work."""
    if end.kind is CrawlEndKind.SPOT:
        return Stop(StopWhy.SPOT, end.error or "spot interruption notice")
    return None


def stop_when_fenced(current: SiteRecord | None, attempt: int, instance_id: str) -> Stop | None:
    """A fenced attempt whose record shows the hub took this node for dead: it has terminated the instance (or is
    about to), so the node takes no more work."""
    if current is not None and declared_lost(current, attempt, instance_id):
        return Stop(StopWhy.LOST, "the hub declared this node lost")
    return None
