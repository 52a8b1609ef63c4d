"""The run report: one self-contained HTML page about a finished run, built from its summary.json.

summary.json is written for programs. The person who looks at a night's crawl in
the morning wants to see what failed and why, where the time went, what the
fleet cost, how the nodes were used and what changed since the run before. The
page is a single file (inline CSS and SVG, no scripts, no external assets), so it
can be mailed, archived beside the summary and printed. The one exception: a
failed attempt's evidence (`runs/<run_id>/evidence/`) is linked, with a
thumbnail of its screenshot, by a path relative to the report.

`render_report` is pure: the time of generation is passed in. `find_previous`,
`write_report` and `publish` (which also puts the summary and the report in the
bucket's run archive) are the only functions that touch files. Every value taken
from a summary reaches the page through Jinja's autoescaping, and the template
is strict about undefined names.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections import Counter
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from cli.report.data import (
    Attempt,
    Node,
    as_dict,
    attempts_of,
    evidence_links,
    final_seconds,
    fmt_duration,
    fmt_usd,
    fmt_utc,
    nodes_of,
    num,
    pacing_rows,
    run_bounds,
    sites_of,
)
from cli.report.items import items_chart, run_totals, site_counts
from cli.report.timeline import timeline
from fleet.outputs.archive import RunArchive
from fleet.outputs.archive import previous as archive_previous
from fleet.outputs.summary import failed_attempts
from fleet.record.failures import failure_label

TEMPLATE = "report.html.j2"

MAX_SLOWEST = 10
BIG_CHANGE_RATIO = 0.5  # a final attempt's duration changed by more than this fraction ...
BIG_CHANGE_S = 30.0  # ... and by more than this many seconds


# --- the sections -------------------------------------------------------------------------------


def _header(summary: Mapping[str, Any]) -> dict[str, Any]:
    counts = {str(k): int(v) for k, v in as_dict(summary.get("counts")).items() if num(v) is not None}
    if not counts:
        counts = dict(Counter(str(e.get("run_status")) for e in sites_of(summary).values()))
    nodes = as_dict(summary.get("nodes"))
    started, finished = num(summary.get("started_at")), num(summary.get("finished_at"))
    return {
        "run_id": str(summary.get("run_id") or "?"),
        "started": fmt_utc(started),
        "finished": fmt_utc(finished),
        "duration": fmt_duration(finished - started) if started is not None and finished is not None else "-",
        "finish_reason": str(summary.get("finish_reason") or "-"),
        "completed": counts.get("COMPLETED", 0),
        "failed": counts.get("FAILED", 0),
        "other": sum(v for k, v in counts.items() if k not in ("COMPLETED", "FAILED")),
        "counts": sorted(counts.items()),
        "launched": nodes.get("launched", "-"),
        "left_running": nodes.get("left_running", "-"),
    }


def _p95(sorted_values: list[float]) -> float:
    return sorted_values[max(0, math.ceil(0.95 * len(sorted_values)) - 1)]  # nearest rank


def _fleet(attempts: list[Attempt]) -> dict[str, Any]:
    secs = sorted(a.seconds for a in attempts)
    last = {a.site: a for a in attempts}
    slowest = sorted(last.values(), key=lambda a: (-a.seconds, a.site))[:MAX_SLOWEST]
    total: dict[str, float] = {}
    count: Counter[str] = Counter()
    for a in attempts:
        total[a.site] = total.get(a.site, 0.0) + a.seconds
        count[a.site] += 1
    return {
        "attempts": len(attempts),
        "retries": len(attempts) - len(last),
        "median": fmt_duration(statistics.median(secs)) if secs else "-",
        "p95": fmt_duration(_p95(secs)) if secs else "-",
        "crawl_time": fmt_duration(sum(secs)),
        "kills": sorted(Counter(a.kill_path for a in attempts if a.kill_path).items()),
        "outcomes": Counter(a.outcome for a in attempts).most_common(),
        "slowest": [
            {
                "site": a.site,
                "final": fmt_duration(a.seconds),
                "total": fmt_duration(total[a.site]),
                "attempts": count[a.site],
            }
            for a in slowest
        ],
    }


def _cost(nodes: list[Node], prices: Mapping[str, float] | None) -> dict[str, Any]:
    prices = prices or {}
    lines: list[dict[str, Any]] = []
    for type_ in sorted({n.type for n in nodes}):
        seconds = sum(n.seconds for n in nodes if n.type == type_)
        price = num(prices.get(type_))
        lines.append(
            {
                "type": type_,
                "nodes": sum(1 for n in nodes if n.type == type_),
                "node_seconds": f"{round(seconds):,}",
                "node_hours": f"{seconds / 3600:.2f}",
                "price": None if price is None else f"{fmt_usd(price)}/h",
                "cost": None if price is None else fmt_usd(seconds / 3600 * price),
                "usd": None if price is None else seconds / 3600 * price,
            }
        )
    return {
        "lines": lines,
        "node_seconds": f"{round(sum(n.seconds for n in nodes)):,}",
        "total": fmt_usd(sum(line["usd"] for line in lines if line["usd"] is not None)),
        "unpriced": [line["type"] for line in lines if line["usd"] is None],
        "prices_given": bool(prices),
    }


def _site_rows(
    summary: Mapping[str, Any], attempts: list[Attempt], evidence: Mapping[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    by_site: dict[str, list[Attempt]] = {}
    for a in attempts:
        by_site.setdefault(a.site, []).append(a)
    rows = []
    for name, e in sites_of(summary).items():
        mine = by_site.get(name, [])
        status = str(e.get("run_status") or "-")
        reason = e.get("failure_reason")
        label = failure_label(e.get("failure_class"), e.get("http_status"))
        if reason and label and label != reason:
            reason = f"{reason} ({label})"
        error = e.get("error") if status != "COMPLETED" else None  # a completed site's old error is history
        count = e.get("attemptCount")
        rows.append(
            {
                "site": name,
                "status": status,
                "failed": status == "FAILED",
                "attempts": count if num(count) is not None else len(mine),
                "final": fmt_duration(mine[-1].seconds) if mine else "-",
                "total": fmt_duration(sum(a.seconds for a in mine)) if mine else "-",
                "reason": ": ".join(str(p) for p in (reason, error) if p),
                "node": str(e.get("instance_id") or (mine[-1].instance_id if mine else "-")),
                "evidence": list(evidence.get(name, [])),
                **site_counts(e),
            }
        )
    return sorted(rows, key=lambda r: (not r["failed"], r["site"]))


def _diff(summary: Mapping[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if previous is None:
        return None
    now, before = sites_of(summary), sites_of(previous)
    status_now = {k: e.get("run_status") for k, e in now.items()}
    status_before = {k: e.get("run_status") for k, e in before.items()}
    both = sorted(now.keys() & before.keys())
    dur_now, dur_before = final_seconds(summary), final_seconds(previous)
    changes = []
    for site in both:
        if site in dur_now and site in dur_before:
            a, b = dur_before[site], dur_now[site]
            if abs(b - a) > BIG_CHANGE_S and abs(b - a) > BIG_CHANGE_RATIO * a:
                changes.append(
                    {
                        "site": site,
                        "before": fmt_duration(a),
                        "after": fmt_duration(b),
                        "change": f"{(b - a) / a:+.0%}" if a else "new",
                    }
                )
    return {
        "run_id": str(previous.get("run_id") or "?"),
        "started": fmt_utc(num(previous.get("started_at"))),
        "newly_failing": [s for s in both if status_now[s] == "FAILED" and status_before[s] == "COMPLETED"],
        "newly_fixed": [s for s in both if status_now[s] == "COMPLETED" and status_before[s] == "FAILED"],
        "added": sorted(now.keys() - before.keys()),
        "removed": sorted(before.keys() - now.keys()),
        "changes": changes,
    }


# --- rendering and files ------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).parent)),
        undefined=jinja2.StrictUndefined,
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_report(
    summary: Mapping[str, Any],
    *,
    previous: Mapping[str, Any] | None = None,
    prices: Mapping[str, float] | None = None,
    generated_at: float | None = None,
    evidence: Mapping[str, list[dict[str, Any]]] | None = None,
) -> str:
    """The whole HTML document of a run's report.

    `prices` are USD per hour by instance type; `previous` is the summary to
    compare with; `generated_at` (epoch seconds) defaults to now; `evidence` is
    each site's evidence links (`report_data.evidence_links`).
    """
    attempts = attempts_of(summary)
    nodes = nodes_of(summary, attempts)
    context = {
        "run": _header(summary),
        "fleet": _fleet(attempts),
        "cost": _cost(nodes, prices),
        "timeline": timeline(nodes, attempts, run_bounds(summary)),
        "sites": _site_rows(summary, attempts, evidence or {}),
        "pacing": pacing_rows(summary),
        "failures": sorted(failed_attempts(sites_of(summary)).items(), key=lambda kv: (-kv[1], kv[0])),
        "totals": run_totals(summary),
        "diff": _diff(summary, previous),
        "items_chart": items_chart(summary, previous) if previous is not None else None,
        "generated": fmt_utc(time.time() if generated_at is None else generated_at),
    }
    return _environment().get_template(TEMPLATE).render(context)


def _load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
        return None
    return data if isinstance(data, dict) and isinstance(data.get("sites"), dict) else None


def find_previous(runs_dir: Path, summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """The summary under `runs_dir/*/` that started last before this run; unreadable ones are ignored."""
    this_start = num(summary.get("started_at"))
    if this_start is None:
        return None
    best: tuple[float, dict[str, Any]] | None = None
    for path in sorted(runs_dir.glob("*/summary.json")):
        other = _load(path)
        start = None if other is None else num(other.get("started_at"))
        if other is None or start is None or other.get("run_id") == summary.get("run_id"):
            continue
        if start < this_start and (best is None or start > best[0]):
            best = (start, other)
    return None if best is None else best[1]


def publish(summary_path: Path, archive: RunArchive, *, prices: Mapping[str, float] | None = None) -> Path:
    """A finished run's record, kept where the table's TTL cannot reach it: its summary (with its check) and its
    report, compared with the previous run found in the archive (else beside it on disk), written beside the
    summary and put in the bucket as `runs/<run_id>/summary.json` and `runs/<run_id>/report.html`."""
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    prev = archive_previous(archive, summary) or find_previous(summary_path.parent.parent, summary)
    out = write_report(summary_path, summary_path.parent / "report.html", prices=prices, previous=prev or {})
    archive.put_summary(summary)
    archive.put_report(str(summary["run_id"]), out.read_text(encoding="utf-8"))
    return out


def write_report(
    summary_path: Path,
    out: Path,
    *,
    prices: Mapping[str, float] | None = None,
    previous: Mapping[str, Any] | None = None,
) -> Path:
    """Write the report of `summary_path` to `out` and return `out`.

    Without `previous`, the run is compared with the latest earlier run beside
    it (`find_previous` on the summary's runs directory).
    """
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    if not isinstance(summary, dict):
        raise ValueError(f"{summary_path}: not a run summary")
    if previous is None:
        previous = find_previous(summary_path.parent.parent, summary)
    links = evidence_links(summary_path.parent / "evidence", out.parent)
    html = render_report(summary, previous=previous or None, prices=prices, evidence=links)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, out)
    return out
