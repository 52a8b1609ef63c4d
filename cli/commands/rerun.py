"""`gridfleet rerun`: crawl chosen sites of a run again, through the machinery that ran it.

A rerun reopens the sites in the table (`ops.reopen`: QUEUED, max_attempts
fresh attempts, the attempt history kept), sends their messages, and reopens
the run item if the run had finished (a new deadline and launch budget). Then a
hub finishes the run as it finishes any: on the embedded default this command
drives it against the running stack; on AWS a hub instance is started from the
hub launch template when none runs, and launches the few nodes the reopened
sites need. A hub that still drives the run simply picks the sites up.

A site with a result is not crawled again unless `--force`, which sets the old
result aside (`.../result.replaced-<time>.json`) rather than deleting it. The key
set aside is derived from the site, the run's date and the run id, never taken
from the record (a node writes the record): a record naming any other key stops
the rerun before anything is moved.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from fleet.config import Config
from fleet.errors import StaleWrite, UsageError, quote
from fleet.logs import event
from fleet.outputs.results import ResultStore, checked_result_key
from fleet.record import ops
from fleet.record.messages import SiteQueue
from fleet.record.partition import RunInfo
from fleet.record.state import RunState, RunStatus, SiteRecord
from fleet.record.table import StateTable
from hub.plan import spec_of

log = logging.getLogger("gridfleet.hub")


@dataclass
class Choice:
    sites: list[str] = field(default_factory=list)  # to reopen
    skipped: dict[str, str] = field(default_factory=dict)  # site -> why not


def choose(records: Mapping[str, SiteRecord], names: Iterable[str], *, failed: bool, force: bool) -> Choice:
    """Which sites a rerun reopens. Unknown names are a usage error, listed together."""
    names = list(dict.fromkeys(names))
    unknown = [n for n in names if n not in records]
    if unknown:
        known = ", ".join(quote(s, 24, bare=True) for s in sorted(records)[:8]) + (", ..." if len(records) > 8 else "")
        named = ", ".join(quote(n) for n in unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
        raise UsageError(f"no site {named} in this run (its sites: {known})")
    out = Choice()
    wanted = sorted(n for n, r in records.items() if r.run_status is RunStatus.FAILED) if failed else names
    for name in wanted:
        r = records[name]
        if r.run_status is RunStatus.FAILED:
            out.sites.append(name)
        elif r.run_status is RunStatus.COMPLETED and force:
            out.sites.append(name)
        elif r.run_status is RunStatus.COMPLETED:
            out.skipped[name] = "has a result already; --force crawls it again"
        else:
            out.skipped[name] = f"is still {r.run_status} in this run: the running hub takes care of it"
    return out


def forced_keys(run_id: str, run_date: str, records: Mapping[str, SiteRecord], choice: Choice) -> dict[str, str]:
    """site -> the result key a forced rerun sets aside, for the chosen COMPLETED sites: derived from the site, the
    run's date and the run id. A record that names another key (or an id that is not one) is refused, all in one
    UsageError, before anything is moved."""
    keys, refused = {}, []
    for name in choice.sites:
        rec = records[name]
        if rec.run_status is not RunStatus.COMPLETED:
            continue
        try:
            key = checked_result_key(name, run_date, run_id)
        except ValueError as e:
            refused.append(f"site {quote(name)}: {e}")
            continue
        if rec.result_key is not None and rec.result_key != key:
            refused.append(f"site {quote(name)} names result {quote(rec.result_key)}, not {key!r}")
            continue
        keys[name] = key
    if refused:
        raise UsageError(f"refusing --force, nothing moved: {'; '.join(refused)}")
    return keys


def reopen(
    *,
    run_id: str,
    run: RunInfo,
    records: Mapping[str, SiteRecord],
    choice: Choice,
    table: StateTable,
    queue: SiteQueue,
    results: ResultStore,
    config: Config,
    now: float,
) -> list[str]:
    """Reopen the chosen sites (and the run, if it finished); returns the sites reopened. A forced site whose record
    names a result key other than its own stops everything first (`forced_keys`)."""
    aside_keys = forced_keys(run_id, run.run_date, records, choice)
    if run.finished:
        table.update_run(
            run_id,
            status=RunState.RUNNING,
            deadline_at=now + config.run.deadline_s,
            finished_at=None,
            hub_id=None,
            launch_failures=0,
            launch_error=None,
            launch_retry_at=None,
            reruns=run.reruns + 1,
        )
        event(log, "run-reopened", run_id=run_id, sites=len(choice.sites), rerun=run.reruns + 1)
    done = []
    for name in choice.sites:
        rec = records[name]
        if name in aside_keys:
            aside = results.set_aside(aside_keys[name], f"{int(now)}")
            event(log, "result-set-aside", run_id=run_id, site=name, key=aside_keys[name], moved_to=aside)
        try:
            spec = spec_of(config.site(name), config)  # the config may carry the fix (options, start_url, expect)
            spec = replace(spec, baseline_items=rec.spec.baseline_items)  # the run's baseline, as the hub gave it
        except KeyError:
            spec = None
        try:
            new = ops.reopen(table, rec, now, spec)
            ops.send_next(table, queue, new)
        except StaleWrite:
            log.warning("site %s changed while being reopened; left as it is", name)
            continue
        event(log, "rerun", run_id=run_id, site=name, next_attempt=new.attempt + 1, was=str(rec.run_status))
        done.append(name)
    return done
