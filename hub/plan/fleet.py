"""The fleet: nodes that never booted or went silent, nodes beyond what the open sites need, and launches.

A launch that starts nothing is retried after a backoff that doubles each time;
the run item keeps the count and the moment of the next try (written by the
executor as the `Launch` action told it), so the plan reads both back, and a
restarted hub backs off the same way.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from fleet.config import Config
from fleet.record.state import RunStatus
from hub.actions import Action, Launch, Terminate
from hub.snapshot import NO_SIGN, Snapshot

#: The state a node writes on its item when its bootstrap failed (`gridfleet node report-failure`).
BOOT_FAILED = "boot-failed"

#: The longest wait between two launches that started nothing.
LAUNCH_BACKOFF_MAX_S = 60.0


def launch_backoff_s(failures: int) -> float:
    """The wait before the next launch after `failures` launches in a row started nothing."""
    return min(LAUNCH_BACKOFF_MAX_S, 2.0**failures)


def busy_nodes(s: Snapshot) -> Collection[str | None]:
    """The instances holding a RUN site."""
    if s.busy is not None:
        return s.busy
    return {r.instance_id for n in s.watched if (r := s.sites[n]).run_status is RunStatus.RUN}


def silent_nodes(s: Snapshot, now: float, config: Config) -> tuple[list[str], float]:
    """Live nodes that never showed a sign of life within boot_timeout_s, or stopped for heartbeat_timeout_s while
    holding no attempt (an attempt's own heartbeat rules a busy node), and when the next boot timeout falls."""
    doomed: list[str] = []
    wake = math.inf
    busy = busy_nodes(s)
    node_beat = s.obs.node_beat
    for inst in s.live_instances:
        if inst.id in busy:  # an attempt's own heartbeat rules a busy node (and a booting one holds none)
            continue
        seen = node_beat.get(inst.id)
        if seen is None:
            continue
        booting = seen.value == NO_SIGN
        limit = config.fleet.boot_timeout_s if booting else config.run.heartbeat_timeout_s
        if now - seen.since >= limit:
            doomed.append(inst.id)
        elif booting:  # boot timeouts wake the hub; idle nodes' heartbeats are checked each tick
            wake = min(wake, seen.since + limit)
    return doomed, wake


def node_rules(s: Snapshot, now: float, config: Config) -> tuple[list[Action], list[str], float]:
    """Terminate the nodes that never booted, went silent, or reported a failed boot. Returns the actions, every
    node they end (the fleet's size leaves them out) and the next boot timeout."""
    doomed, wake = silent_nodes(s, now, config)
    actions: list[Action] = []
    boot_dead = tuple(i for i in doomed if s.obs.node_beat[i].value == NO_SIGN)
    if boot_dead:
        actions.append(Terminate(boot_dead, "boot-timeout"))
    beat_dead = tuple(i for i in doomed if s.obs.node_beat[i].value != NO_SIGN)
    if beat_dead:
        actions.append(Terminate(beat_dead, "node-lost"))
    # A node that reported its bootstrap failed is terminated at once (it shuts itself down, too).
    live = {i.id for i in s.live_instances}
    failed_boot = tuple(
        sorted(iid for iid, n in s.nodes.items() if n.state == BOOT_FAILED and iid in live and iid not in doomed)
    )
    if failed_boot:
        actions.append(Terminate(failed_boot, "boot-failed"))
    return actions, doomed + list(failed_boot), wake


def nodes_wanted(config: Config, open_count: int) -> int:
    """The fleet's size for `open_count` open sites: one node each, between min_nodes and max_nodes."""
    return min(config.fleet.max_nodes, max(config.fleet.min_nodes, open_count))


def sizing(s: Snapshot, now: float, config: Config, doomed: list[str], open_count: int) -> tuple[list[Action], float]:
    """One node per open site (queued or running), between min_nodes and max_nodes. Nodes leave by themselves
    when the queue runs dry; nodes still booting beyond what the open sites need are not waited for."""
    live = len(s.live_instances) - len(doomed)
    wanted = nodes_wanted(config, open_count)
    actions: list[Action] = []
    surplus = live - wanted
    if surplus > 0:
        # A node holding an attempt has booted, whatever its node item said when it was read: it claimed between
        # that read and the sites' read, or its first heartbeat is on its way. It is never the one scaled in.
        busy = busy_nodes(s)
        booting = sorted(
            i.id
            for i in s.live_instances
            if i.id not in doomed
            and i.id not in busy
            and (seen := s.obs.node_beat.get(i.id)) is not None
            and seen.value == NO_SIGN
        )
        if booting[:surplus]:
            actions.append(Terminate(tuple(booting[-surplus:]), "scale-in"))
    launch, wake = launch_rule(s, now, config, live, wanted)
    return actions + launch, wake


def launch_rule(s: Snapshot, now: float, config: Config, live: int, wanted: int) -> tuple[list[Action], float]:
    """Launch up to what is wanted, within the launch budget (a new one per operator's rerun), once the backoff
    of the last launch that started nothing is over."""
    run = s.run
    launched = run.nodes_launched if run is not None else 0
    reruns = run.reruns if run is not None else 0
    room = max(0, config.launch_budget * (1 + reruns) - launched)
    if wanted <= live or room == 0:
        return [], math.inf
    retry_at = run.launch_retry_at if run is not None else None
    if retry_at is not None and now < retry_at:
        return [], retry_at  # the last launch started nothing: wait out its backoff
    failures = run.launch_failures if run is not None else 0
    return [
        Launch(min(wanted - live, room), target=wanted, failures=failures, backoff_s=launch_backoff_s(failures + 1))
    ], math.inf
