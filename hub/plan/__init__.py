"""The hub's decisions: a pure function from what it sees to what it should do.

`plan(snapshot, now, config)` reads no clock, calls no AWS and keeps no state
(the `Ending` it returns comes back in the next snapshot); it imports without
boto3. The executor performs the actions it returns and the loop sleeps until
`Plan.wake_at`, the earliest moment a decision could change on its own (next
possible hang, heartbeat expiry, boot timeout, launch backoff, run deadline),
never longer than `run.watch_interval_s`. The simulator drives this same
function. Each family of rules lives in its own module: `start` (the run item
and seeding), `attempts` (hangs, lost nodes, unsent messages), `feed` (the
metered queue's first messages), `fleet` (silent nodes, the fleet's size,
launches) and `end` (the one way a run ends).
"""

from __future__ import annotations

from fleet.config import Config
from fleet.record.state import RunStatus
from hub.actions import Plan
from hub.plan.attempts import BACKUP_GRACE_S, attempt_rules, hang_after_s, kill_ladder
from hub.plan.end import (
    END_WAIT_S,
    LAUNCH_GIVE_UP,
    NO_NODES_AFTER,
    drain_wait_s,
    end_plan,
    ending_of,
    teardown_request,
)
from hub.plan.feed import feed_order, feed_rule, metering, wanted_depth
from hub.plan.fleet import BOOT_FAILED, LAUNCH_BACKOFF_MAX_S, launch_backoff_s, node_rules, nodes_wanted, sizing
from hub.plan.start import missing_sites, run_date_for, seeding_order, spec_of, start_rules
from hub.snapshot import Snapshot

__all__ = [
    "BACKUP_GRACE_S",
    "BOOT_FAILED",
    "END_WAIT_S",
    "LAUNCH_BACKOFF_MAX_S",
    "LAUNCH_GIVE_UP",
    "NO_NODES_AFTER",
    "drain_wait_s",
    "end_plan",
    "feed_order",
    "hang_after_s",
    "kill_ladder",
    "launch_backoff_s",
    "metering",
    "plan",
    "run_date_for",
    "seeding_order",
    "spec_of",
    "teardown_request",
    "wanted_depth",
]


def plan(s: Snapshot, now: float, config: Config) -> Plan:
    wake = now + config.run.watch_interval_s
    if s.run is not None and s.run.finished and s.ending is None:
        return Plan((), wake)  # finished from outside (teardown): the loop stands down
    missing = missing_sites(s, config) if s.ending is None else ()
    actions = start_rules(s, now, config, missing)
    tally = s.counts()
    open_count = tally[RunStatus.QUEUED.value] + tally[RunStatus.RUN.value] + len(missing) + len(s.repairs)
    ending = ending_of(s, now, config, open_count)
    if ending is not None:
        return end_plan(s, now, ending, actions)
    if s.run is not None:
        wake = min(wake, s.run.deadline_at)
    site_actions, site_wake = attempt_rules(s, now, config)
    node_actions, doomed, node_wake = node_rules(s, now, config)
    crawling = open_count - s.saved  # a SAVED site needs the hub only, no node
    fleet_actions, fleet_wake = sizing(s, now, config, doomed, crawling)
    nodes = max(len(s.live_instances) - len(doomed), nodes_wanted(config, crawling))
    feed_actions, feed_wake = feed_rule(s, now, config, nodes)
    wake = min(wake, site_wake, node_wake, fleet_wake, feed_wake)
    return Plan(tuple(actions + site_actions + feed_actions + node_actions + fleet_actions), max(now, wake))
