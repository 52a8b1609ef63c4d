"""The hub's decisions: a pure function from what it sees to what it should do.

`plan(snapshot, now, config)` reads no clock, calls no AWS and keeps no state;
the executor performs the actions it returns and the loop sleeps until
`Plan.wake_at`, the earliest moment a decision could change on its own (next
possible hang, heartbeat expiry, boot timeout, run deadline), never longer than
`run.watch_interval_s`. The simulator drives this same function.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Mapping

from fleet.config import Config
from fleet.state import Reason, RunStatus, SiteSpec, SiteStatus
from hub.actions import (
    Action, EndAttempt, Enqueue, FailSites, Finish, KillAttempt, Launch, Plan, SeedSites, StartRun, Terminate,
)
from hub.snapshot import NO_SIGN, Snapshot

_DATE_ID = re.compile(r"^(\d{4})-?(\d{2})-?(\d{2})")

#: Launches in a row that started nothing (with backoff between them) before the run gives up.
LAUNCH_GIVE_UP = 5

#: The state a node writes on its item when its bootstrap failed (`gridfleet node report-failure`).
BOOT_FAILED = "boot-failed"

#: Nodes that end before their first heartbeat, with none ever booted, after which the run gives up.
NO_NODES_AFTER = 3

#: With node watchdogs on, the hub is the backup for a hang: it waits this much longer, so the node's own
#: (cheaper, exact) kill normally wins and the two do not race.
BACKUP_GRACE_S = 2.0


def run_date_for(run_id: str, now: float) -> str:
    """YYYYMMDD for result keys: the run id's date if it starts with one, else today (UTC)."""
    m = _DATE_ID.match(run_id)
    if m:
        try:
            return dt.date(int(m[1]), int(m[2]), int(m[3])).strftime("%Y%m%d")
        except ValueError:
            pass
    return dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y%m%d")


def spec_of(site, config: Config) -> SiteSpec:
    limit = config.rate_limits.get(site.rate_limit) if site.rate_limit else None
    return SiteSpec(site.start_url, site.crawler, dict(site.options), site.incremental,
                    site.rate_limit if limit else None, limit.per_s if limit else None)


def seeding_order(sites: tuple[tuple[str, SiteSpec], ...], expected: Mapping[str, float], order: str
                  ) -> tuple[tuple[str, SiteSpec], ...]:
    """Longest expected crawl first (longest-processing-time order: the long ones do not end the run alone);
    a site with no history counts as a median one. `order: config` keeps the order of the config."""
    if order != "longest_first" or not expected:
        return sites
    known = sorted(expected.values())
    median = known[len(known) // 2]
    return tuple(sorted(sites, key=lambda item: -expected.get(item[0], median)))  # stable: ties keep config order


def plan(s: Snapshot, now: float, config: Config) -> Plan:
    run_cfg, fleet_cfg = config.run, config.fleet
    hang_after = run_cfg.hang_after_s + (BACKUP_GRACE_S if fleet_cfg.node_watchdog else 0.0)
    actions: list[Action] = []
    wake = now + run_cfg.watch_interval_s

    def soon(t: float) -> None:
        nonlocal wake
        wake = min(wake, t)

    if s.run is None:
        actions.append(StartRun(now, now + run_cfg.deadline_s, run_date_for(s.run_id, now)))
    elif s.run.finished:
        return Plan((), wake)

    missing = tuple((site.id, spec_of(site, config)) for site in config.sites if site.id not in s.sites)
    if missing:
        actions.append(SeedSites(seeding_order(missing, s.expected, run_cfg.order)))

    # The run's deadline ends everything still open.
    if s.run is not None and now >= s.run.deadline_at:
        open_sites = tuple(sorted(n for n, r in s.sites.items() if not r.is_terminal))
        live = tuple(sorted(i.id for i in s.live_instances))
        if live:
            actions.append(Terminate(live, "deadline"))
        if open_sites:
            actions.append(FailSites(open_sites, Reason.DEADLINE))
        actions.append(Finish("deadline"))
        return Plan(tuple(actions), now + 1.0)
    if s.run is not None:
        soon(s.run.deadline_at)

    # Sites: hangs, lost attempts, interrupted kills, messages never sent. Only the watched ones (running, or
    # QUEUED without their message) can need anything: the rest wait in the queue or are done.
    watch_hangs = not fleet_cfg.node_watchdog  # with watchdogs, nodes end hangs on time: check them each tick
    for name in s.watched:
        r = s.sites[name]
        if r.run_status is RunStatus.QUEUED and not r.enqueued:
            seen = s.obs.unsent.get(name)
            if seen is not None and now - seen.since >= run_cfg.enqueue_grace_s:
                actions.append(Enqueue(name, r.version))
            elif seen is not None:
                soon(seen.since + run_cfg.enqueue_grace_s)
            continue
        if r.run_status is not RunStatus.RUN:
            continue
        inst = s.instances.get(r.instance_id or "")
        if r.kill_reason:
            actions.append(KillAttempt(name, r.instance_id, r.attempt, Reason(r.kill_reason)))
            continue
        if inst is None or not inst.live:  # reclaimed by EC2 before its node could say so: not its fault
            actions.append(EndAttempt(name, r.attempt, Reason.SPOT if inst and inst.interrupted else Reason.LOST))
            continue
        progress = s.obs.progress.get(name)
        if r.site_status is SiteStatus.URL_CALL and progress is not None:
            if now - progress.since >= hang_after:
                actions.append(KillAttempt(name, r.instance_id, r.attempt, Reason.HANG))
                continue
            if watch_hangs:
                soon(progress.since + hang_after)
        beat = s.obs.heartbeat.get(name)
        if beat is not None and now - beat.since >= run_cfg.heartbeat_timeout_s:
            # No wake-up for this one: heartbeats are checked every tick, at most one watch interval late.
            actions.append(KillAttempt(name, r.instance_id, r.attempt, Reason.LOST))
            continue

    # Nodes: never booted, or stopped heartbeating while idle.
    doomed: list[str] = []
    busy = {s.sites[n].instance_id for n in s.watched if s.sites[n].run_status is RunStatus.RUN}
    for inst in s.live_instances:
        seen = s.obs.node_beat.get(inst.id)
        if seen is None:
            continue
        booting = seen.value == NO_SIGN
        limit = fleet_cfg.boot_timeout_s if booting else run_cfg.heartbeat_timeout_s
        if now - seen.since >= limit and inst.id not in busy:
            doomed.append(inst.id)
        elif booting:  # boot timeouts wake the hub; idle nodes' heartbeats are checked each tick
            soon(seen.since + limit)
    boot_dead = tuple(i for i in doomed if s.obs.node_beat[i].value == NO_SIGN)
    if boot_dead:
        actions.append(Terminate(boot_dead, "boot-timeout"))
    beat_dead = tuple(i for i in doomed if s.obs.node_beat[i].value != NO_SIGN)
    if beat_dead:
        actions.append(Terminate(beat_dead, "node-lost"))

    # A node that reported its bootstrap failed is terminated at once (it shuts itself down, too).
    failed_boot = tuple(sorted(i.id for i in s.live_instances if getattr(s.nodes.get(i.id), "state", None)
                               == BOOT_FAILED and i.id not in doomed))
    if failed_boot:
        actions.append(Terminate(failed_boot, "boot-failed"))
        doomed.extend(failed_boot)

    # No node can start (a broken install, a bad image): give up now rather than at the deadline.
    booted = [n for n in s.nodes.values() if n.state != BOOT_FAILED]
    never_booted = [i.id for i in s.instances.values()
                    if not i.live and (i.id not in s.nodes or s.nodes[i.id].state == BOOT_FAILED)]
    cannot_launch = (s.run is not None and s.run.launch_failures >= LAUNCH_GIVE_UP and not booted
                     and not s.live_instances)
    if s.run is not None and not booted and (len(never_booted) >= NO_NODES_AFTER or cannot_launch):
        open_sites = tuple(sorted(n for n, r in s.sites.items() if not r.is_terminal))
        live = tuple(sorted(i.id for i in s.live_instances))
        if live:
            actions.append(Terminate(live, "no-nodes"))
        if open_sites:
            if cannot_launch:
                error = f"no node could be launched ({s.run.launch_failures} tries): {s.run.launch_error}"
            else:
                why = next((s.nodes[i].error for i in never_booted if i in s.nodes and s.nodes[i].error), None)
                error = (f"no node could start: {len(never_booted)} ended before their first heartbeat "
                         f"(e.g. {never_booted[0]}: {why or 'see its log'})")
            actions.append(FailSites(open_sites, Reason.NO_NODES, error))
        actions.append(Finish("no-nodes"))
        return Plan(tuple(actions), now + 1.0)

    # Done?
    all_seeded = not missing and s.run is not None
    tally = s.counts()
    open_count = tally[RunStatus.QUEUED.value] + tally[RunStatus.RUN.value] + len(missing)
    if all_seeded and open_count == 0:
        actions.append(Finish("done"))
        return Plan(tuple(actions), now + 1.0)

    # Fleet size: one node per open site (queued or running), between min_nodes and max_nodes. Nodes leave by
    # themselves when the queue runs dry; nodes still booting beyond what the open sites need are not waited for.
    live = len(s.live_instances) - len(doomed)
    wanted = min(fleet_cfg.max_nodes, max(fleet_cfg.min_nodes, open_count))
    surplus = live - wanted
    if surplus > 0:
        booting = sorted(i.id for i in s.live_instances if i.id not in doomed
                         and (seen := s.obs.node_beat.get(i.id)) is not None and seen.value == NO_SIGN)
        if booting[:surplus]:
            actions.append(Terminate(tuple(booting[-surplus:]), "scale-in"))
    launched = s.run.nodes_launched if s.run is not None else 0
    reruns = s.run.reruns if s.run is not None else 0
    room = max(0, config.launch_budget * (1 + reruns) - launched)
    retry_at = s.run.launch_retry_at if s.run is not None else None
    if wanted > live and room > 0:
        if retry_at is not None and now < retry_at:
            soon(retry_at)  # the last launch started nothing: wait out its backoff
        else:
            actions.append(Launch(min(wanted - live, room), target=wanted))
    return Plan(tuple(actions), max(now, wake))
