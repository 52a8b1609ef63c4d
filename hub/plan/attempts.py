"""The running attempts: hangs, lost nodes, kills a hub did not finish, and messages never sent.

Only the watched sites (running, or QUEUED without their message) can need anything: the rest wait in
the queue or are done. Each rule also says when it could next fire, so the hub sleeps until then.
"""

from __future__ import annotations

import math

from fleet import protocol
from fleet.config import Config
from fleet.record.state import Reason, RunStatus, SiteRecord, SiteStatus, known_reason
from hub.actions import Action, EndAttempt, Enqueue, KillAttempt, KillLadder, Promote, Repair
from hub.plan.feed import metering
from hub.snapshot import Observations, Snapshot

#: With node watchdogs on, the hub is the backup for a hang: it waits as long more as the node's own kill may take
#: to reach the table (evidence included), so the node's kill wins and the two do not race.
BACKUP_GRACE_S = protocol.NODE_HANG_END_S

#: What one watched site needs now (if anything), and the earliest moment it could need something else.
Verdict = tuple[Action | None, float]

NOTHING: Verdict = (None, math.inf)


def hang_after_s(config: Config) -> float:
    """How long a navigation may stay unchanged before the hub kills the attempt."""
    return config.run.hang_after_s + (BACKUP_GRACE_S if config.fleet.node_watchdog else 0.0)


def kill_ladder(instance_id: str | None, reason: Reason) -> KillLadder:
    """The rungs for a kill: a node whose agent stopped heartbeating is sick, so its instance goes whatever the
    node control manages; any other node is terminated only when the node control cannot reach it."""
    if instance_id is None:
        return KillLadder.NONE
    return KillLadder.TERMINATE if reason is Reason.LOST else KillLadder.FALLBACK


def kill(r: SiteRecord, reason: Reason) -> KillAttempt:
    return KillAttempt(r.site, r.instance_id, r.attempt, reason, kill_ladder(r.instance_id, reason))


def attempt_rules(s: Snapshot, now: float, config: Config) -> tuple[list[Action], float]:
    """What the watched sites need, in name order, and when the next of them could need something. Held sites are
    the feed's while it meters the queue; otherwise one is a seeding a hub did not finish: unsent, as any."""
    actions: list[Action] = []
    wake = math.inf
    if s.held and not metering(config, s.expected):
        names = sorted([*s.watched, *s.held])
    elif s.attend is not None and config.fleet.node_watchdog:  # the hub's: those that can need something now
        names = sorted(s.attend)
    else:
        names = s.watched
    for name in names:
        action, at = watch_site(s, s.sites[name], now, config)
        if action is not None:
            actions.append(action)
        wake = min(wake, at)
    actions.extend(Repair(name) for name in sorted(s.repairs))  # records no one can read: made whole again
    return actions, wake


def watch_site(s: Snapshot, r: SiteRecord, now: float, config: Config) -> Verdict:
    if r.run_status is RunStatus.QUEUED and not r.enqueued:
        return unsent(s, r, now, config)
    if r.run_status is not RunStatus.RUN:
        return NOTHING
    if r.site_status is SiteStatus.SAVED:  # its result is staged: made the site's before anything else is looked at
        return Promote(r.site, r.attempt), math.inf
    marked = known_reason(r.kill_reason)  # nodes write the site's item too: a mark that is no reason is none
    if marked is not None:  # a kill a hub marked and did not finish (it died in between): finish it
        return kill(r, marked), math.inf
    inst = s.instances.get(r.instance_id or "")
    if inst is None or not inst.live:  # reclaimed by EC2 before its node could say so: not its fault
        return EndAttempt(r.site, r.attempt, Reason.SPOT if inst and inst.interrupted else Reason.LOST), math.inf
    return running(s, r, now, config)


def unsent(s: Snapshot, r: SiteRecord, now: float, config: Config) -> Verdict:
    """A QUEUED site whose message is not marked sent: a writer may be sending it, so wait a grace first. A retry
    with a backoff (`retry_at`: its failure's rule in `run.retry`) is the hub's to send, once the backoff ends."""
    if r.retry_at is not None:
        return (Enqueue(r.site, r.version), math.inf) if now >= r.retry_at else (None, r.retry_at)
    seen = s.obs.unsent.get(r.site)
    if seen is None:
        return NOTHING
    grace = config.run.enqueue_grace_s
    if now - seen.since >= grace:
        return Enqueue(r.site, r.version), math.inf
    return None, seen.since + grace


def recheck_at(obs: Observations, r: SiteRecord, config: Config) -> float:
    """When a running site whose record and node do not change could next need something (`running`): its hang, or
    its heartbeat's timeout. Until then, with node watchdogs on, the plan need not look at it (`Snapshot.attend`)."""
    at = math.inf
    progress = obs.progress.get(r.site)
    if r.site_status is SiteStatus.URL_CALL and progress is not None:
        at = progress.since + hang_after_s(config)
    beat = obs.heartbeat.get(r.site)
    if beat is not None:
        at = min(at, beat.since + config.run.heartbeat_timeout_s)
    return at


def running(s: Snapshot, r: SiteRecord, now: float, config: Config) -> Verdict:
    """A hang (a navigation unchanged for too long) or a lost node (its heartbeat on the attempt stopped)."""
    wake = math.inf
    progress = s.obs.progress.get(r.site)
    if r.site_status is SiteStatus.URL_CALL and progress is not None:
        hang_after = hang_after_s(config)
        if now - progress.since >= hang_after:
            return kill(r, Reason.HANG), math.inf
        if not config.fleet.node_watchdog:  # with watchdogs, nodes end hangs on time: check them each tick
            wake = progress.since + hang_after
    beat = s.obs.heartbeat.get(r.site)
    if beat is not None and now - beat.since >= config.run.heartbeat_timeout_s:
        return kill(r, Reason.LOST), wake
    # No wake-up for a heartbeat: they are checked every tick, at most one watch interval late.
    return None, wake
