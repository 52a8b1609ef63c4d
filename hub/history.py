"""How long each site took last time: the order of a new run (longest expected first); and how many items it
found, the baseline of its data contract's `max_drop` (`previous_items`).

The hub reads it once, when it seeds a run, from the most recent earlier run
in the table; the simulator reads it from a past run's `summary.json`
(`gridfleet simulate --history FILE`). A site never crawled before has no
entry: the plan orders it as a site of median length.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fleet.errors import UsageError
from fleet.record.codec import count_or_none
from fleet.record.state import Outcome, RunStatus, SiteRecord
from fleet.record.table import StateTable

log = logging.getLogger("gridfleet.hub")

#: Earlier runs looked at (newest first) for one that has durations.
LOOK_BACK_RUNS = 3


def crawl_seconds(attempts: Iterable[Mapping[str, Any]]) -> float | None:
    """Seconds of the attempt that produced the result, if one did."""
    for a in reversed(list(attempts)):
        if a.get("outcome") == str(Outcome.COMPLETED) and a.get("end") is not None and a.get("start") is not None:
            return max(0.0, float(a["end"]) - float(a["start"]))
    return None


def durations_of(sites: Iterable[SiteRecord]) -> dict[str, float]:
    out = {}
    for r in sites:
        d = crawl_seconds({"outcome": a.outcome, "start": a.start, "end": a.end} for a in r.attempts)
        if d is not None:
            out[r.site] = d
    return out


def previous_durations(table: StateTable, run_id: str) -> dict[str, float]:
    """Durations from the newest earlier run that has any (one read of that run's partition)."""
    earlier = [e for e in table.list_runs() if e.run_id != run_id]
    for entry in reversed(earlier[-LOOK_BACK_RUNS:]):
        found = durations_of(table.read_run(entry.run_id).sites)
        if found:
            log.info("expected-durations run_id=%s from=%s sites=%d", run_id, entry.run_id, len(found))
            return found
    return {}


def previous_items(table: StateTable, run_id: str, sites: Iterable[str]) -> dict[str, int]:
    """The items of each of `sites` in its newest earlier COMPLETED run (of the last LOOK_BACK_RUNS runs). A count
    is read back from a record a node wrote: only a count (an int >= 0) is one; a site with none has no entry."""
    wanted, out = set(sites), {}
    earlier = [e for e in table.list_runs() if e.run_id != run_id]
    for entry in reversed(earlier[-LOOK_BACK_RUNS:]):
        for r in table.read_run(entry.run_id).sites:
            if r.site in wanted and r.site not in out and r.run_status is RunStatus.COMPLETED:
                if (n := count_or_none(r.items)) is not None:
                    out[r.site] = n
        if wanted <= out.keys():
            break
    return out


def durations_from_file(path: Path) -> dict[str, float]:
    """Durations from a run's summary.json (`runs/<id>/summary.json`) or a JSON object {site: seconds}."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise UsageError(f"{path}: cannot read the history file: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: line {e.lineno}: not JSON: {e.msg}") from None
    if isinstance(data, dict) and isinstance(data.get("sites"), dict):
        out = {}
        for site, entry in data["sites"].items():
            d = crawl_seconds(entry.get("attempts") or []) if isinstance(entry, dict) else None
            if d is not None:
                out[site] = d
    elif isinstance(data, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in data.values()):
        out = {str(k): float(v) for k, v in data.items() if v >= 0}
    else:
        raise UsageError(f"{path}: expected a summary.json (with 'sites') or an object of site -> seconds")
    if not out:
        raise UsageError(f"{path}: no completed site with a duration in it")
    return out
