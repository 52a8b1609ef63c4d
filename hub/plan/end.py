"""The end of a run: the one path by which every run ends, whatever ended it.

A run ends when every site is terminal ("done"), at its deadline, when no node
can ever crawl it ("no-nodes"), or when an operator tears it down. From the
tick that decides it, the plan terminates the run's instances and fails its open
sites, tick after tick until they are gone (or `END_WAIT_S` has passed); then
drains the run's messages from the queue until none is in flight (or the drain
wait has passed), and finishes. Each tick's plan carries the `Ending` to the
next one, so why and since when stay as first decided.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.config import Config
from fleet.record.state import Reason
from hub.actions import Action, Drain, Ending, FailSites, Finish, Plan, Repair, Terminate
from hub.plan.fleet import BOOT_FAILED
from hub.snapshot import Snapshot

#: Launches in a row that started nothing (with backoff between them) before the run gives up.
LAUNCH_GIVE_UP = 5

#: Nodes that end before their first heartbeat (not reclaimed by EC2), with none ever booted, after which the run
#: gives up.
NO_NODES_AFTER = 3

#: How long the end waits for the run's instances to leave pending/running, and its open sites to fail.
END_WAIT_S = 60.0

#: How soon the plan looks again while instances are still going.
TERMINATE_POLL_S = 0.5

#: How soon the plan looks again while messages of the run are still in flight.
DRAIN_POLL_S = 2.0

#: What the sites of a torn-down run record.
TEARDOWN_ERROR = "torn down by an operator"


def drain_wait_s(config: Config) -> float:
    """How long after the end began messages still in flight are waited for: every node is gone, so nobody holds
    them any more, and each comes back within a visibility timeout (a node extends it with its heartbeat)."""
    return max(30.0, config.run.heartbeat_timeout_s) + 5.0


def teardown_request(now: float, reason: Reason = Reason.KILLED, error: str = TEARDOWN_ERROR) -> Ending:
    """An operator's end of a run (`gridfleet teardown`): everything open fails with `reason`. The queue is not
    drained: the command does not wait for messages in flight, and a hub still on the run stands down."""
    return Ending("teardown", now, reason, error)


def no_nodes_error(s: Snapshot) -> str | None:
    """Why no node will ever crawl this run (a broken install, a bad image, launches refused), if none will."""
    if s.run is None or any(n.state != BOOT_FAILED for n in s.nodes.values()):
        return None  # a node booted once: this run can run
    if s.run.launch_failures >= LAUNCH_GIVE_UP and not s.live_instances:
        return f"no node could be launched ({s.run.launch_failures} tries): {s.run.launch_error}"
    # A spot instance EC2 reclaimed while it booted says nothing of the install: at 5,000 spot nodes a few are
    # reclaimed in the first seconds of a healthy run.
    never_booted = [
        i.id
        for i in s.instances.values()
        if not i.live and not i.interrupted and (i.id not in s.nodes or s.nodes[i.id].state == BOOT_FAILED)
    ]
    if len(never_booted) < NO_NODES_AFTER:
        return None
    why = next((s.nodes[i].error for i in never_booted if i in s.nodes and s.nodes[i].error), None)
    return (
        f"no node could start: {len(never_booted)} ended before their first heartbeat "
        f"(e.g. {never_booted[0]}: {why or 'see its log'})"
    )


def ending_of(s: Snapshot, now: float, config: Config, open_count: int) -> Ending | None:
    """Whether the run ends, and why. An end decided before stands, except a "done" one when a site is open again
    (an operator's rerun)."""
    if s.ending is not None:
        return None if s.ending.why == "done" and open_count else s.ending
    if s.run is None:
        return None
    drain_s = drain_wait_s(config)
    if now >= s.run.deadline_at:
        return Ending("deadline", now, Reason.DEADLINE, drain_s=drain_s)
    error = no_nodes_error(s)
    if error is not None:  # give up now rather than at the deadline
        return Ending("no-nodes", now, Reason.NO_NODES, error, drain_s)
    if open_count == 0:
        return Ending("done", now, drain_s=drain_s)
    return None


def end_plan(s: Snapshot, now: float, ending: Ending, before: Sequence[Action] = ()) -> Plan:
    """The actions of one tick of the end (after `before`): terminate what is live and fail what is open until
    nothing is, then drain the queue until nothing of the run is in flight, then finish."""
    live = tuple(sorted(i.id for i in s.instances.values() if i.live))
    open_sites = tuple(sorted(n for n, r in s.sites.items() if not r.is_terminal))
    actions = list(before)
    if live:
        actions.append(Terminate(live, "finish" if ending.why == "done" else ending.why))
    if open_sites and ending.reason is not None:
        actions.append(FailSites(open_sites, ending.reason, ending.error))
    actions.extend(Repair(n) for n in sorted(s.repairs))  # readable again first, then failed with the rest
    waited = now - ending.since
    if (live or open_sites or s.repairs) and waited < END_WAIT_S:
        return Plan(tuple(actions), now + TERMINATE_POLL_S, ending)
    if ending.drain_s is None:
        return Plan((*actions, Finish(ending.why, len(live))), now + 1.0, ending)
    depth = s.queue
    if depth is None or depth.visible:
        actions.append(Drain())
    if depth is not None and (depth.in_flight == 0 or waited >= ending.drain_s):
        return Plan((*actions, Finish(ending.why, len(live))), now + 1.0, ending)
    return Plan(tuple(actions), now + DRAIN_POLL_S, ending)
