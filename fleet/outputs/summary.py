"""The run summary (`runs/<run_id>/summary.json`) and the export of results and of failed attempts' evidence.

`site_entry` is shared with `gridfleet status --json`, so both print sites in
the same shape. The ids that name the exported files are read back from the
table, which nodes write to: each is checked again before it becomes a path, and
a result is read at the key derived from its site, the run's date and the run id,
never at the key its record names (a record naming another key is refused).

An export of a run id replaces an earlier one (`results/`, `evidence/`), and
its reads from the bucket may fail: each directory is written beside the one it
replaces and swapped in only when every read for it succeeded, so a failed
re-export leaves the earlier directory as it was.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fleet.errors import quote
from fleet.outputs.results import (
    EVIDENCE_TYPES,
    LOCAL_ROLE,
    ResultStore,
    RunKeys,
    SiteKeys,
    parse_evidence_key,
)
from fleet.record.failures import failures_by_class
from fleet.record.ids import check_run_id
from fleet.record.partition import RunInfo
from fleet.record.readback import Unread
from fleet.record.state import Attempt, RunStatus, SiteRecord

log = logging.getLogger("gridfleet.hub")


def attempt_entry(a: Attempt) -> dict[str, Any]:
    """One attempt as summaries show it; its counts null when its node recorded none (an older node)."""
    c = a.counts
    out: dict[str, Any] = {"instance_id": a.instance_id, "start": a.start, "end": a.end, "outcome": a.outcome}
    if a.kill_path:
        out["kill_path"] = a.kill_path
    if a.failure_class:
        out.update(failure_class=a.failure_class, http_status=a.http_status)
    out.update(
        items=c.items if c else None,
        pages=c.pages if c else None,
        collisions=c.collisions if c else None,
        skipped=c.skipped if c else None,
        robots_skipped=c.robots_skipped if c else None,
    )
    if c and c.collided:
        out["collided"] = list(c.collided)
    return out


def site_entry(r: SiteRecord) -> dict[str, Any]:
    return {
        "run_status": str(r.run_status),
        "site_status": str(r.site_status),
        "attemptCount": r.attempt,
        "failure_reason": r.failure_reason if r.run_status is not RunStatus.COMPLETED else None,
        "failure_class": r.failure_class if r.run_status is not RunStatus.COMPLETED else None,
        "http_status": r.http_status if r.run_status is not RunStatus.COMPLETED else None,
        "retry_at": r.retry_at if r.run_status is RunStatus.QUEUED else None,  # a retry waiting out its backoff
        "result_key": r.result_key,
        "items": r.items,  # COMPLETED: the items of its result
        "pages": r.pages,  # the pages the crawl got to (COMPLETED: those of its result)
        "attempts": [attempt_entry(a) for a in r.attempts],
        "error": r.error,
        "instance_id": r.instance_id,
        "lastUpdateEpoch": r.last_update,
        "spot_requeues": r.spot_requeues,  # attempts given back (spot, busy profile): not counted
        "attemptBase": r.attempt_base,  # attemptCount when an operator last reran it
        "robots": r.spec.robots,  # false: its robots.txt was ignored (fleet.yaml's politeness.robots)
    }


def counts(sites: Iterable[SiteRecord]) -> dict[str, int]:
    out = {s.value: 0 for s in RunStatus}
    for r in sites:
        out[r.run_status.value] += 1
    return out


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def totals(sites: Mapping[str, Any]) -> dict[str, int]:
    """The run's counts from its sites' entries (`site_entry`; an older summary's lack them, and count 0): the
    items and pages of the COMPLETED sites' results, the pages every attempt fetched (retries included), and the
    items its attempts left out (collisions, items without an id) and the pages robots.txt disallowed."""
    out = {"items": 0, "pages": 0, "pages_fetched": 0, "collisions": 0, "skipped": 0, "robots_skipped": 0}
    for e in sites.values():
        if not isinstance(e, Mapping):
            continue
        if e.get("run_status") == RunStatus.COMPLETED.value:
            out["items"] += _count(e.get("items"))
            out["pages"] += _count(e.get("pages"))
        for a in e.get("attempts") or []:
            if isinstance(a, Mapping):
                out["pages_fetched"] += _count(a.get("pages"))
                out["collisions"] += _count(a.get("collisions"))
                out["skipped"] += _count(a.get("skipped"))
                out["robots_skipped"] += _count(a.get("robots_skipped"))
    return out


def failed_attempts(sites: Mapping[str, Any]) -> dict[str, int]:
    """The run's failed attempts by class (`http_4xx 404`, `blocked 403`, `timeout`), from its sites' entries."""
    pairs = [
        (a.get("failure_class"), a.get("http_status"))
        for e in sites.values()
        if isinstance(e, Mapping)
        for a in e.get("attempts") or []
        if isinstance(a, Mapping)
    ]
    return failures_by_class(pairs)


#: The unreadable values and items `summary.json` lists by name (the rest are counted).
UNREADABLE_LISTED = 20


def unreadable_section(found: Sequence[Unread]) -> dict[str, Any]:
    """What the run's last read could not read (`fleet.record.readback`): values read as absent, items left out (site
    items no hub seeded, node items of no node, ...), and the first of them by name."""
    items = sum(1 for u in found if not u.attr)
    return {
        "values": len(found) - items,
        "items": items,
        "first": [u.line() for u in found[:UNREADABLE_LISTED]],
    }


def build_summary(
    run: RunInfo,
    sites: list[SiteRecord],
    *,
    left_running: int,
    finished_at: float,
    finish_reason: str,
    unreadable: Sequence[Unread] = (),
) -> dict[str, Any]:
    """The run's summary.json. `unreadable`: what the read the sites came from could not read (its `notes.found`);
    its counts are in `unreadable` (0 and 0 when none)."""
    entries = {r.site: site_entry(r) for r in sorted(sites, key=lambda r: r.site)}
    return {
        "run_id": run.run_id,
        "run_date": run.run_date,  # YYYYMMDD of its result keys
        "started_at": run.started_at,
        "finished_at": finished_at,
        "sites": entries,
        "nodes": {"launched": run.nodes_launched, "left_running": left_running},
        "counts": counts(sites),
        "totals": totals(entries),
        "failures": failed_attempts(entries),
        "finish_reason": finish_reason,
        "unreadable": unreadable_section(unreadable),
    }


def instances_section(nodes: Iterable[Any], types: Mapping[str, str | None]) -> dict[str, Any]:
    """Each node of the run: its type and how long its agent ran (start to last heartbeat), for the report's cost."""
    return {
        n.instance_id: {
            "type": types.get(n.instance_id),
            "started_at": n.started_at,
            "ended_at": n.heartbeat,
            "sites_done": n.sites_done,
        }
        for n in sorted(nodes, key=lambda n: n.started_at)
    }


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def export(
    out_dir: Path, summary: dict[str, Any], sites: list[SiteRecord], results: ResultStore, role: str = LOCAL_ROLE
) -> Path:
    """Write summary.json and results/<site>.json of every COMPLETED site; return the summary path.

    Nothing is written outside `<out_dir>/<run_id>/` (the hub may run as root): a run id that is not one raises
    ValueError before anything is written; a site whose id is not one, or whose file would resolve outside the
    run's directory, is logged and left out of results/."""
    try:
        run_id = check_run_id(summary["run_id"])
    except ValueError as e:
        log.error("export-refused error=%s", e)
        raise
    run_dir = (out_dir / run_id).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        keys = RunKeys.of(run_id, str(summary.get("run_date") or ""), role)
    except ValueError as e:  # no key of the run can be made: its summary still is
        log.error("export-skipped run_id=%s why=%s", run_id, e)
        keys = None
    if keys is not None:
        export_results(run_dir, keys, sites, results)
        export_evidence(run_dir, keys, sites, results)
    write_json(run_dir / "summary.json", summary)
    return out_dir / run_id / "summary.json"


def export_results(run_dir: Path, keys: RunKeys, sites: list[SiteRecord], results: ResultStore) -> None:
    """`<run_dir>/results/<site>.json` of every COMPLETED site whose record names the key its ids derive."""
    with Staged(run_dir, "results") as staged:
        for r in sites:
            if r.run_status is not RunStatus.COMPLETED or not r.result_key:
                continue
            try:
                site = keys.site(r.site)
            except ValueError as e:
                log.error("export-skipped site=%s why=%s", quote(r.site), e)
                continue
            target = (staged.dir / f"{r.site}.json").resolve()
            if target.parent != staged.dir:
                log.error("export-skipped site=%s why=%s is outside %s", r.site, target, staged.final)
                continue
            if r.result_key != site.result:
                log.error(
                    "export-skipped site=%s why=its record names result %r, not %r", r.site, r.result_key, site.result
                )
                continue
            try:
                body = results.get(site.result)
            except Exception as e:  # one unreadable result must not lose the summary
                log.error("export-failed site=%s key=%s error=%s", r.site, site.result, e)
                staged.failed = True
                continue
            target.write_bytes(body)


class Staged:
    """One directory of a run's export (`results/`, `evidence/`) as it is written: in a new directory beside the
    one it replaces (`.<name>.new-*`), swapped in as the `with` block ends, removed if it raises. A read that
    failed (`failed`) keeps an earlier export whole instead; with none, what was read is the export."""

    def __init__(self, run_dir: Path, name: str):
        self.final = run_dir / name
        self.dir = run_dir / f".{name}.new-{uuid.uuid4().hex}"
        self.dir.mkdir()  # as the export always made its directories (mkdtemp's would be private to the hub's user)
        self.failed = False

    def __enter__(self) -> Staged:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None:  # the export broke off: what it wrote goes, an earlier export stays
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            self.finish()

    def finish(self) -> None:
        earlier = self.final.exists() or self.final.is_symlink()
        if self.failed and earlier:
            log.error("export-kept-previous dir=%s why=a read from the bucket failed; export again", self.final)
            shutil.rmtree(self.dir)
            return
        old = self.final.with_name(f".{self.final.name}.old-{uuid.uuid4().hex}")
        if earlier:  # renamed away first and removed last: never a moment with neither export on disk
            self.final.rename(old)  # a symlink is moved as the link, never followed
        if any(self.dir.iterdir()):
            self.dir.rename(self.final)
        else:
            self.dir.rmdir()  # nothing exported: no directory
        if old.is_symlink() or not old.is_dir():
            old.unlink(missing_ok=True)
        else:
            shutil.rmtree(old)


#: Attempt outcomes that leave no evidence (the others may: errors, hangs, kills).
CLEAN_OUTCOMES = frozenset({"completed", "skipped", "spot", "busy"})


def export_evidence(run_dir: Path, keys: RunKeys, sites: list[SiteRecord], results: ResultStore) -> None:
    """`<run_dir>/evidence/<site>/<attempt>/<file>` for every attempt that did not end cleanly, read from the prefix of
    the node that held it (its writer id: the run's role and the attempt's node), and stored again in the bucket
    beside the run's result as the hub's copy (`evidence_headers`: the page's HTML, or anything a browser would open
    as a page, as text to download), which the report links; a quarantined result likewise. What a node wrote is
    never served as it wrote it. Keys are parsed back to (attempt, one of EVIDENCE_FILES), so nothing lands outside
    `evidence/`."""
    with Staged(run_dir, "evidence") as staged:
        for r in sites:
            try:
                site = keys.site(r.site)
            except ValueError as e:
                log.error("evidence-skipped site=%s why=%s", quote(r.site), e)
                continue
            for a in r.attempts:
                if a.outcome not in CLEAN_OUTCOMES:
                    _attempt_evidence(staged, site, a, results)


def _attempt_evidence(staged: Staged, site: SiteKeys, a: Attempt, results: ResultStore) -> None:
    """One attempt's evidence (and quarantined result) from its node's prefix, to the export and the hub's copy."""
    try:
        writer = site.writer(a.instance_id)
        prefix = site.staged_evidence_prefix(writer, a.n)
        keys = results.keys(prefix)
    except ValueError as e:
        log.error("evidence-skipped site=%s attempt=%d why=%s", site.site, a.n, e)
        return
    except Exception as e:  # evidence is a help: one unreadable listing must not lose the summary
        log.error("evidence-failed site=%s error=%s", site.site, e)
        staged.failed = True
        return
    for key in keys:
        parsed = parse_evidence_key(prefix[: -len(f"{a.n}/")], key)
        if parsed is None or parsed[0] != a.n:
            continue
        name = parsed[1]
        try:
            body = results.get(key)
            results.put_evidence(site.evidence(a.n, name), body, EVIDENCE_TYPES[name])
        except Exception as e:
            log.error("evidence-failed site=%s key=%s error=%s", site.site, key, e)
            staged.failed = True
            continue
        target = staged.dir / site.site / str(a.n) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(body)
    if a.outcome == "contract":
        _quarantined(site, a, writer, results)


def _quarantined(site: SiteKeys, a: Attempt, writer: str, results: ResultStore) -> None:
    """The hub's copy of a result an attempt kept in quarantine, beside the run's result (`quarantine_key`)."""
    try:
        body = results.get(site.staged_quarantine(writer, a.n))
        results.put_new(site.quarantine(a.n), body)
    except Exception as e:  # noqa: BLE001 - a quarantined result is a help to the crawler's authors, not the run's
        log.warning("quarantine-not-copied site=%s attempt=%d error=%s", site.site, a.n, e)
