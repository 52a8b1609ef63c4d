"""`gridfleet check`: read a finished run back and assert what gridfleet promises.

From the table (site records with their attempt histories, the run item, the
hub's history events), the provider (instances tagged with the run), the queue
and its DLQ, and the results bucket:
- every site is terminal; a site of the config that was never seeded is lost;
- attempts stay within `max_attempts` (spot attempts apart) and none is left open;
- no two attempts of one site overlap in time;
- every COMPLETED site has exactly one result object, and its record names it;
- no instance tagged with the run is pending or running;
- no message of the run is left in the queue;
- what sits in the DLQ is reported;
- every attempt that ended `lost` or `spot` and every node terminated as lost is counted (`false_losses`): a
  node may really die, so these are not violations, but in a run with no injected fault each is a false loss.
On the embedded default it also reads the demo site server's own log of what
was fetched (`/_stats`), counting only the requests made during the run's own
attempts: a page fetched more often than its site had attempts means two crawls
of one site ran at once, or a finished site was crawled again.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fleet.config import Config
from fleet.logs import event
from fleet.outputs.results import ResultStore, result_key
from fleet.outputs.summary import write_json
from fleet.record.messages import BadMessage, SiteMessage, SiteQueue
from fleet.record.state import Attempt, Outcome, Reason, RunStatus, SiteRecord, SiteSpec, SiteStatus
from fleet.record.table import StateTable
from hub.providers.base import ComputeProvider

log = logging.getLogger("gridfleet.hub")

_DEMO_SITE = re.compile(r"/(?:s|api)/([A-Za-z0-9._-]+)/?")  # HTML sites and the JSON API


#: Attempt outcomes that say a node died or was taken away; in a run where no fault was injected there are none.
LOSS_OUTCOMES = frozenset({Outcome.LOST.value, Outcome.SPOT.value})

#: Why the hub terminates a node it takes for dead (`terminate` history lines).
LOSS_TERMINATIONS = frozenset({"node-lost", f"kill {Reason.LOST}"})


@dataclass
class CheckReport:
    run_id: str
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)
    #: Each attempt that ended `lost` or `spot`, and each node the hub terminated as lost. Not a violation (a
    #: node may really die), but in a run with no injected fault every one is a false loss: tests assert zero.
    false_loss_details: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def false_losses(self) -> int:
        return len(self.false_loss_details)

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "violations": self.violations,
            "notes": self.notes,
            "checked": self.checked,
            "false_losses": self.false_losses,
            "false_loss_details": self.false_loss_details,
        }


def check_run(
    run_id: str,
    *,
    table: StateTable,
    queue: SiteQueue,
    results: ResultStore,
    provider: ComputeProvider,
    config: Config | None = None,
    demo_stats: Mapping[str, Any] | None = None,
    demo_url: str | None = None,
) -> CheckReport:
    report = CheckReport(run_id)
    v, note = report.violations.append, report.notes.append
    rows = table.read_run(run_id)
    if rows.run is None:
        v(f"run {run_id}: no run item in the table")
        return report
    if not rows.run.finished:
        v(f"run {run_id}: not finished (status {rows.run.status})")
    max_attempts = config.run.max_attempts if config else 3
    sites = {r.site: r for r in rows.sites}
    if config is not None:
        for s in config.sites:
            if s.id not in sites:
                v(f"{s.id}: in the config but never seeded")

    unread: dict[str, set[str]] = {}  # site -> the attributes of its record that could not be read
    for u in rows.notes.found:
        if u.partition == run_id:
            unread.setdefault(u.key, set()).add(u.attr)
    for _name, r in sorted(sites.items()):
        _check_site(r, max_attempts, rows.run.run_date, results, v, note, unread.get(r.site, set()))
    report.checked["sites"] = len(sites)
    if rows.notes.found:
        note(f"{len(rows.notes.found)} values or items of the run could not be read (summary.json: unreadable)")

    _check_leftovers(run_id, queue, provider, report)

    if demo_stats is not None:
        _check_demo(sites, demo_stats, demo_url, v, note)
    kills = [e for e in rows.history if e.kind == "kill"]
    report.checked["history_events"] = len(rows.history)
    report.checked["kills"] = len(kills)
    report.false_loss_details = losses(sites.values(), rows.history)
    return report


def check_archived(
    summary: Mapping[str, Any],
    *,
    results: ResultStore,
    queue: SiteQueue,
    provider: ComputeProvider,
    config: Config | None = None,
) -> CheckReport:
    """Check a run the table has forgotten (its items expired) from its archived summary: the same promises
    about its sites, results, instances and queue; the hub's history went with the table."""
    run_id = str(summary["run_id"])
    report = CheckReport(run_id)
    v, note = report.violations.append, report.notes.append
    max_attempts = config.run.max_attempts if config else 3
    records = [record_of(run_id, name, entry) for name, entry in sorted(summary["sites"].items())]
    run_date = _run_date(summary, records)
    for r in records:
        _check_site(r, max_attempts, run_date, results, v, note)
    report.checked["sites"] = len(records)
    _check_leftovers(run_id, queue, provider, report)
    note("checked from the archived summary: the table no longer holds this run")
    report.false_loss_details = losses(records, ())
    return report


def check_export(summary: Mapping[str, Any], run_dir: Path, nodes: ComputeProvider | None = None) -> CheckReport:
    """Check a finished run from its export alone (`runs/<run_id>/`: a local run once its stack has stopped and
    moto forgot it): the same promises about its sites, against the results exported beside the summary; a node
    of the run still running (`nodes`: the local provider, which needs no stack); and, as they were found at the
    run's end, what only the stores could show then (the queue and the DLQ, instances, the demo server's count
    of fetches, the hub's history), taken from the `check` the run wrote into its summary."""
    run_id = str(summary["run_id"])
    report = CheckReport(run_id)
    v, note = report.violations.append, report.notes.append
    if not summary.get("finished_at"):
        v(f"run {run_id}: not finished ({run_dir / 'summary.json'} has no finished_at)")
    max_attempts = summary.get("max_attempts")
    if not isinstance(max_attempts, int):
        max_attempts = 10**6
        note("attempts not bounded by max_attempts: the summary does not record it (an older run's)")
    records = [record_of(run_id, name, entry) for name, entry in sorted((summary.get("sites") or {}).items())]
    run_date = _run_date(summary, records)
    results = ExportedResults(run_dir, run_date, run_id)
    for r in records:
        _check_site(r, max_attempts, run_date, results, v, note)
    report.checked["sites"] = len(records)
    if nodes is not None:
        live = sorted(i.id for i in nodes.list(run_id) if i.live)
        if live:
            v(f"nodes of the run still running: {', '.join(live)}")
    at_end = summary.get("check")
    if isinstance(at_end, Mapping):
        seen = set(report.violations)
        for text in at_end.get("violations") or []:
            if text not in seen:
                v(f"at the run's end: {text}")
        for text in at_end.get("notes") or []:
            note(f"at the run's end: {text}")
        report.false_loss_details = [str(t) for t in at_end.get("false_loss_details") or []]
        for key in ("instances", "history_events", "kills"):
            if key in (at_end.get("checked") or {}):
                report.checked[key] = int(at_end["checked"][key])
    else:
        note("the run wrote no check of its own at its end: its queue and instances went unchecked")
        report.false_loss_details = losses(records, ())
    note(f"checked from {run_dir}: the stores went with the local stack")
    return report


class ExportedResults:
    """The results a run exported (`<run_dir>/results/<site>.json`), seen under the keys they had in the bucket:
    what `_check_site` asks of a result store."""

    def __init__(self, run_dir: Path, run_date: str, run_id: str):
        self.dir = run_dir / "results"
        self.run_id = run_id
        self.run_date = run_date

    def keys(self, prefix: str) -> list[str]:
        site = prefix.split("/", 1)[0]
        key = result_key(site, self.run_date, self.run_id)
        return [key] if key.startswith(prefix) and (self.dir / f"{site}.json").is_file() else []


def _run_date(summary: Mapping[str, Any], records: list[SiteRecord]) -> str:
    """The run's YYYYMMDD: the summary's, else (a summary written before it kept one) read off a result key."""
    run_date = str(summary.get("run_date") or "")
    if not run_date:
        keys = [r.result_key for r in records if r.result_key]
        run_date = keys[0].split("/")[1] if keys else ""
    return run_date


def record_of(run_id: str, site: str, entry: Mapping[str, Any]) -> SiteRecord:
    """A site record rebuilt from its summary entry (what the checks read of it)."""
    attempts = tuple(
        Attempt(
            n,
            str(a.get("instance_id")),
            float(a["start"]),
            None if a.get("end") is None else float(a["end"]),
            a.get("outcome"),
            a.get("kill_path"),
        )
        for n, a in enumerate(entry.get("attempts") or [], start=1)
    )
    return SiteRecord(
        run_id=run_id,
        site=site,
        spec=SiteSpec(""),
        run_status=RunStatus(entry["run_status"]),
        site_status=SiteStatus(entry["site_status"]),
        attempt=int(entry.get("attemptCount") or 0),
        failure_reason=entry.get("failure_reason"),
        result_key=entry.get("result_key"),
        spot_requeues=int(entry.get("spot_requeues") or 0),
        attempt_base=int(entry.get("attemptBase") or 0),
        attempts=attempts,
    )


def losses(records: Iterable[SiteRecord], history: Iterable[Any]) -> list[str]:
    """Attempts that ended because their node was taken for dead or reclaimed, and nodes terminated as lost."""
    out = [
        f"{r.site}: attempt {a.n} on {a.instance_id} ended {a.outcome}"
        for r in sorted(records, key=lambda r: r.site)
        for a in r.attempts
        if a.outcome in LOSS_OUTCOMES
    ]
    for e in history:
        if e.kind == "terminate" and e.fields.get("why") in LOSS_TERMINATIONS:
            nodes = e.fields.get("nodes") or []
            out.append(f"node {', '.join(map(str, nodes))} terminated ({e.fields.get('why')})")
    return out


def _check_leftovers(run_id: str, queue: SiteQueue, provider: ComputeProvider, report: CheckReport) -> None:
    """No instance of the run pending or running, no message of the run in the queue; the DLQ reported."""
    v, note = report.violations.append, report.notes.append
    instances = provider.list(run_id)
    live = sorted(i.id for i in instances if i.live)
    if live:
        v(f"instances of the run still pending or running: {', '.join(live)}")
    report.checked["instances"] = len(instances)
    left = [m for m in queue.peek(limit=200) if isinstance(m, SiteMessage) and m.run_id == run_id]
    for m in left:
        v(f"{m.site}: a message of the run is still in the queue (attempt {m.attempt})")
    for dead in queue.peek(limit=200, dlq=True):
        if isinstance(dead, BadMessage):
            note(f"DLQ: a message that is not a site message ({dead.problem}): {dead.body[:80]!r}")
        else:
            note(f"DLQ: {dead.site} attempt {dead.attempt} of run {dead.run_id} (received {dead.receive_count} times)")


class Keys(Protocol):
    """What the check asks of a result store: the keys under a prefix."""

    def keys(self, prefix: str) -> list[str]: ...


def _check_site(
    r: SiteRecord,
    max_attempts: int,
    run_date: str,
    results: Keys,
    v,
    note,
    unread: set[str] | frozenset[str] = frozenset(),
) -> None:
    name = r.site
    if not r.is_terminal:
        v(f"{name}: not terminal ({r.run_status}/{r.site_status})")
    counted = len(r.attempts) - r.spot_requeues  # attempts given back (spot, busy profile) do not count
    if unread & {"attempts", "spot_requeues", "attemptBase"}:  # a node wrote what no history is: not judged by it
        note(f"{name}: its attempt history could not be read ({', '.join(sorted(unread))}): not judged")
    elif r.attempt - r.attempt_base > max_attempts or counted - r.attempt_base > max_attempts:
        v(f"{name}: {counted} attempts counted (attemptCount {r.attempt}), more than max_attempts {max_attempts}")
    elif counted != r.attempt:
        v(f"{name}: {len(r.attempts)} attempts, {r.spot_requeues} given back, but attemptCount is {r.attempt}")
    spans = sorted((a.start, a.end if a.end is not None else float("inf"), a.n, a.instance_id) for a in r.attempts)
    for (_s1, e1, n1, i1), (s2, _, n2, i2) in zip(spans, spans[1:], strict=False):
        if e1 > s2:
            v(f"{name}: attempts {n1} ({i1}) and {n2} ({i2}) overlap in time")
    if r.is_terminal and any(a.end is None for a in r.attempts):
        v(f"{name}: {r.run_status} with an attempt never closed")
    key = result_key(name, run_date, r.run_id)
    folder = key.rpartition("/")[0] + "/"
    # This run's own result only: other runs of the date keep theirs beside it, in folders of their own.
    found = [k for k in results.keys(folder) if k.rpartition("/")[0] + "/" == folder and k.endswith("/result.json")]
    if r.run_status is RunStatus.COMPLETED:
        if found != [key]:
            v(f"{name}: COMPLETED but {len(found)} result objects in {folder} (want exactly {key})")
        if r.result_key != key:
            v(f"{name}: COMPLETED, but its record names result {r.result_key!r}, not {key!r}")
    elif found:
        note(f"{name}: {r.run_status} but a result exists ({found[0]}), written by a node that was fenced off")


#: Seconds around an attempt within which the demo server's log counts a request as the attempt's own.
WINDOW_SLACK_S = 1.0


def demo_hits(site_stats: Mapping[str, Any], r: SiteRecord) -> dict[int, int]:
    """Fetches per page of `r`'s demo site made by this run: requests logged within one of its attempts (a run
    is judged by what it did, never by another run's traffic on the same demo server). A server without the
    request log gives its all-time counts."""
    requests = site_stats.get("requests")
    if requests is None:
        return {int(p): n for p, n in site_stats.get("hits", {}).items() if str(p).isdigit()}
    windows = [
        (a.start - WINDOW_SLACK_S, (a.end if a.end is not None else float("inf")) + WINDOW_SLACK_S)
        for a in r.attempts
        if a.outcome != Outcome.SKIPPED.value
    ]
    hits: dict[int, int] = {}
    for at, page in requests:
        if not str(page).isdigit():  # a news site's pages (`p1`, `p1/a2`) of the same name: not this site's
            continue
        if any(lo <= at <= hi for lo, hi in windows):
            hits[int(page)] = hits.get(int(page), 0) + 1
    return hits


def _check_demo(sites: Mapping[str, SiteRecord], stats: Mapping[str, Any], demo_url: str | None, v, note) -> None:
    for name, r in sorted(sites.items()):
        url = r.spec.start_url
        if demo_url and not url.startswith(demo_url):
            continue
        m = _DEMO_SITE.search(url)
        if not m:
            continue
        hits = demo_hits(stats.get(m.group(1), {}), r)
        attempts = len([a for a in r.attempts if a.outcome != Outcome.SKIPPED.value])
        for page, n in sorted(hits.items()):
            if n > attempts:
                v(
                    f"{name}: page {page} was fetched {n} times by {attempts} attempts (/_stats): two crawls at once, "
                    "or a finished site crawled again"
                )
        if r.run_status is RunStatus.COMPLETED and r.pages:
            missing = [p for p in range(1, r.pages + 1) if hits.get(p, 0) < 1]
            if missing and attempts:
                v(f"{name}: COMPLETED with {r.pages} pages, but /_stats never saw page(s) {missing}")


def attach(report: CheckReport, summary_path: Path) -> None:
    """Put the check into the run's summary.json (and log what broke)."""
    data = json.loads(summary_path.read_text())
    data["check"] = report.as_json()
    write_json(summary_path, data)
    for text in report.violations:
        event(log, "check-violation", logging.ERROR, run_id=report.run_id, violation=text)
    event(
        log,
        "check",
        run_id=report.run_id,
        ok=report.ok,
        violations=len(report.violations),
        notes=len(report.notes),
        false_losses=report.false_losses,
    )
