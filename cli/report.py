"""The run report: one self-contained HTML page about a finished run, built from its summary.json.

summary.json is written for programs. The person who looks at a night's crawl in
the morning wants to see what failed and why, where the time went, what the
fleet cost, how the nodes were used and what changed since the run before. The
page is a single file (inline CSS and SVG, no scripts, no external assets), so it
can be mailed, archived beside the summary and printed.

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
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping

import jinja2

from fleet.aws.archive import RunArchive
from fleet.aws.archive import previous as archive_previous

TEMPLATE = "report.html.j2"

#: Outcomes with a colour of their own in the template's stylesheet; any other is drawn as "other".
OUTCOMES = ("completed", "skipped", "hang", "lost", "error", "deadline", "spot", "killed", "no-nodes", "busy")
UNFINISHED = "unfinished"  # an attempt whose end was never recorded: drawn to the run's end

MAX_ROWS = 40  # node rows drawn in the timeline; the rest are counted, not drawn
MAX_SLOWEST = 10
BIG_CHANGE_RATIO = 0.5  # a final attempt's duration changed by more than this fraction ...
BIG_CHANGE_S = 30.0  # ... and by more than this many seconds

# Timeline geometry in SVG user units; the picture scales to the page's width.
WIDTH = 1000.0
LABEL_W = 240.0
RIGHT_PAD = 24.0
TOP = 6.0
ROW_H = 18.0
BAR_H = 12.0
AXIS_H = 30.0
MIN_BAR_W = 1.5  # a bar stays visible however short its attempt
KILL_R = 4.0  # half the size of the cross that marks a killed attempt
LABEL_CHARS = 34
TICK_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
MAX_TICKS = 8


# --- formatting ---------------------------------------------------------------------------------

def fmt_duration(seconds: float | None) -> str:
    """'42 s' below two minutes, '3 m 05 s' below an hour, else '1 h 02 m'; '-' when unknown."""
    if seconds is None:
        return "-"
    s = max(0, round(seconds))
    if s < 120:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} m {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} m"


def fmt_usd(amount: float) -> str:
    """'$0.0123' below a dollar (small runs cost cents), else '$12.34'."""
    return f"${amount:,.2f}" if amount >= 1 else f"${amount:.4f}"


def fmt_utc(epoch: float | None, fmt: str = "%Y-%m-%dT%H:%M:%SZ") -> str:
    return "-" if epoch is None else datetime.fromtimestamp(epoch, timezone.utc).strftime(fmt)


def _num(value: object) -> float | None:
    """A finite number from JSON, else None (booleans are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _sites(summary: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(name): _dict(entry) for name, entry in _dict(summary.get("sites")).items()}


# --- attempts and nodes -------------------------------------------------------------------------

@dataclass(frozen=True)
class Attempt:
    site: str
    n: int  # position in the site's history, from 1
    instance_id: str
    start: float
    end: float  # the run's end when none was recorded
    outcome: str  # UNFINISHED when none was recorded
    kill_path: str | None
    unfinished: bool

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def css(self) -> str:
        return self.outcome if self.outcome in OUTCOMES or self.outcome == UNFINISHED else "other"

    def describe(self) -> str:
        parts = [f"site {self.site} attempt {self.n}: {self.outcome}"]
        if self.kill_path:
            parts.append(f"killed via {self.kill_path}")
        parts.append(fmt_duration(self.seconds))
        if self.unfinished:
            parts.append("no end recorded")
        return ", ".join(parts)


@dataclass(frozen=True)
class Node:
    instance_id: str
    type: str
    market: str | None
    start: float | None
    end: float | None
    attempts: tuple[Attempt, ...]

    @property
    def seconds(self) -> float:
        return 0.0 if self.start is None or self.end is None else max(0.0, self.end - self.start)


def run_bounds(summary: Mapping[str, Any]) -> tuple[float, float]:
    """The run's start and end; from its attempts where the summary lacks them."""
    times = [t for entry in _sites(summary).values() for a in entry.get("attempts") or []
             for t in (_num(_dict(a).get("start")), _num(_dict(a).get("end"))) if t is not None]
    start = _num(summary.get("started_at"))
    start = min(times, default=0.0) if start is None else start
    end = _num(summary.get("finished_at"))
    end = max(times, default=start) if end is None else end
    return start, max(start, end)


def attempts_of(summary: Mapping[str, Any]) -> list[Attempt]:
    """Every attempt of every site, by site name then history order."""
    _, run_end = run_bounds(summary)
    out = []
    for site, entry in sorted(_sites(summary).items()):
        for n, raw in enumerate(entry.get("attempts") or [], start=1):
            a = _dict(raw)
            start, end = _num(a.get("start")), _num(a.get("end"))
            if start is None:
                continue
            out.append(Attempt(site=site, n=n, instance_id=str(a.get("instance_id") or "?"), start=start,
                               end=max(start, run_end if end is None else end),
                               outcome=str(a.get("outcome") or UNFINISHED),
                               kill_path=str(a["kill_path"]) if a.get("kill_path") else None,
                               unfinished=end is None))
    return out


def nodes_of(summary: Mapping[str, Any], attempts: Iterable[Attempt]) -> list[Node]:
    """The run's nodes by start.

    A node's times fall back to the span of its attempts; a node known to have
    started that made no attempt and has no end counts to the run's end (the
    hub terminates every node when it finishes).
    """
    _, run_end = run_bounds(summary)
    instances = {str(k): _dict(v) for k, v in _dict(summary.get("instances")).items()}
    by_node: dict[str, list[Attempt]] = {}
    for a in attempts:
        by_node.setdefault(a.instance_id, []).append(a)
    nodes = []
    for iid in {**dict.fromkeys(instances), **dict.fromkeys(by_node)}:
        info, mine = instances.get(iid, {}), sorted(by_node.get(iid, []), key=lambda a: a.start)
        start, end = _num(info.get("started_at")), _num(info.get("ended_at"))
        if start is None and mine:
            start = mine[0].start
        if end is None and start is not None:
            end = max(a.end for a in mine) if mine else max(start, run_end)
        nodes.append(Node(iid, str(info.get("type") or "unknown"),
                          str(info["market"]) if info.get("market") else None, start, end, tuple(mine)))
    return sorted(nodes, key=lambda n: (n.start is None, n.start or 0.0, n.instance_id))


def final_seconds(summary: Mapping[str, Any]) -> dict[str, float]:
    """Each attempted site's duration of its last attempt."""
    return {a.site: a.seconds for a in attempts_of(summary)}  # attempts come in history order


# --- the sections -------------------------------------------------------------------------------

def _header(summary: Mapping[str, Any]) -> dict[str, Any]:
    counts = {str(k): int(v) for k, v in _dict(summary.get("counts")).items() if _num(v) is not None}
    if not counts:
        counts = dict(Counter(str(e.get("run_status")) for e in _sites(summary).values()))
    nodes = _dict(summary.get("nodes"))
    started, finished = _num(summary.get("started_at")), _num(summary.get("finished_at"))
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
        "slowest": [{"site": a.site, "final": fmt_duration(a.seconds), "total": fmt_duration(total[a.site]),
                     "attempts": count[a.site]} for a in slowest],
    }


def _cost(nodes: list[Node], prices: Mapping[str, float] | None) -> dict[str, Any]:
    prices = prices or {}
    lines = []
    for type_ in sorted({n.type for n in nodes}):
        seconds = sum(n.seconds for n in nodes if n.type == type_)
        price = _num(prices.get(type_))
        lines.append({"type": type_, "nodes": sum(1 for n in nodes if n.type == type_),
                      "node_seconds": f"{round(seconds):,}", "node_hours": f"{seconds / 3600:.2f}",
                      "price": None if price is None else f"{fmt_usd(price)}/h",
                      "cost": None if price is None else fmt_usd(seconds / 3600 * price),
                      "usd": None if price is None else seconds / 3600 * price})
    return {
        "lines": lines,
        "node_seconds": f"{round(sum(n.seconds for n in nodes)):,}",
        "total": fmt_usd(sum(line["usd"] for line in lines if line["usd"] is not None)),
        "unpriced": [line["type"] for line in lines if line["usd"] is None],
        "prices_given": bool(prices),
    }


@dataclass(frozen=True)
class _Scale:
    t0: float
    t1: float

    def x(self, t: float) -> float:
        span = max(self.t1 - self.t0, 1.0)
        frac = (min(max(t, self.t0), self.t1) - self.t0) / span
        return round(LABEL_W + frac * (WIDTH - LABEL_W - RIGHT_PAD), 1)


def _ticks(scale: _Scale) -> list[dict[str, Any]]:
    span = max(scale.t1 - scale.t0, 1.0)
    step = next((s for s in TICK_STEPS_S if span / s <= MAX_TICKS), None)
    step = step or 86400 * math.ceil(span / 86400 / MAX_TICKS)
    fmt = "%H:%M:%S" if step < 60 else ("%H:%M" if step < 86400 else "%Y-%m-%d")
    first = math.ceil(scale.t0 / step) * step
    return [{"x": scale.x(t), "label": fmt_utc(t, fmt)}
            for t in (first + i * step for i in range(int((scale.t1 - first) // step) + 1))]


def _bar(a: Attempt, scale: _Scale, y: float) -> dict[str, Any]:
    x = scale.x(a.start)
    w = round(max(MIN_BAR_W, scale.x(a.end) - x), 1)
    kill = None
    if a.kill_path:
        cx, cy, r = round(x + w, 1), round(y + BAR_H / 2, 1), KILL_R
        kill = f"M{cx - r},{cy - r}L{cx + r},{cy + r}M{cx + r},{cy - r}L{cx - r},{cy + r}"
    return {"x": x, "y": y, "w": w, "h": BAR_H, "css": a.css, "open": a.unfinished, "title": a.describe(),
            "kill": kill, "kill_path": a.kill_path}


def _label(node: Node) -> str:
    text = f"{node.instance_id} {node.type}"
    return text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 1] + "\u2026"


def _row(node: Node, i: int, scale: _Scale) -> dict[str, Any]:
    y = TOP + i * ROW_H
    bar_y = round(y + (ROW_H - BAR_H) / 2, 1)
    market = f", {node.market}" if node.market else ""
    return {
        "y": y, "h": ROW_H, "stripe": i % 2 == 1, "text_y": round(y + ROW_H / 2 + 4, 1), "label": _label(node),
        "title": f"node {node.instance_id} ({node.type}{market}): {len(node.attempts)} attempts, "
                 f"up {fmt_duration(node.seconds)}",
        "life": None if node.start is None or node.end is None else
        {"x1": scale.x(node.start), "x2": scale.x(node.end), "y": round(y + ROW_H / 2, 1)},
        "bars": [_bar(a, scale, bar_y) for a in node.attempts],
    }


def _timeline(nodes: list[Node], attempts: list[Attempt], bounds: tuple[float, float]) -> dict[str, Any]:
    scale = _Scale(*bounds)
    shown, hidden = nodes[:MAX_ROWS], nodes[MAX_ROWS:]
    axis_y = TOP + len(shown) * ROW_H + 4
    present = {a.css for a in attempts}
    return {
        "width": WIDTH, "height": axis_y + AXIS_H, "axis_y": axis_y, "x0": LABEL_W, "x1": WIDTH - RIGHT_PAD,
        "rows": [_row(n, i, scale) for i, n in enumerate(shown)],
        "ticks": _ticks(scale),
        "legend": [o for o in (*OUTCOMES, UNFINISHED, "other") if o in present],
        "kills": any(a.kill_path for a in attempts),
        "hidden_nodes": len(hidden), "hidden_attempts": sum(len(n.attempts) for n in hidden),
        "drawn": bool(attempts) and bool(shown),
    }


def _site_rows(summary: Mapping[str, Any], attempts: list[Attempt]) -> list[dict[str, Any]]:
    by_site: dict[str, list[Attempt]] = {}
    for a in attempts:
        by_site.setdefault(a.site, []).append(a)
    rows = []
    for name, e in _sites(summary).items():
        mine = by_site.get(name, [])
        status = str(e.get("run_status") or "-")
        reason = e.get("failure_reason")
        error = e.get("error") if status != "COMPLETED" else None  # a completed site's old error is history
        count = e.get("attemptCount")
        rows.append({
            "site": name, "status": status, "failed": status == "FAILED",
            "attempts": count if _num(count) is not None else len(mine),
            "final": fmt_duration(mine[-1].seconds) if mine else "-",
            "total": fmt_duration(sum(a.seconds for a in mine)) if mine else "-",
            "reason": ": ".join(str(p) for p in (reason, error) if p),
            "node": str(e.get("instance_id") or (mine[-1].instance_id if mine else "-")),
        })
    return sorted(rows, key=lambda r: (not r["failed"], r["site"]))


def _diff(summary: Mapping[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if previous is None:
        return None
    now, before = _sites(summary), _sites(previous)
    status_now = {k: e.get("run_status") for k, e in now.items()}
    status_before = {k: e.get("run_status") for k, e in before.items()}
    both = sorted(now.keys() & before.keys())
    dur_now, dur_before = final_seconds(summary), final_seconds(previous)
    changes = []
    for site in both:
        if site in dur_now and site in dur_before:
            a, b = dur_before[site], dur_now[site]
            if abs(b - a) > BIG_CHANGE_S and abs(b - a) > BIG_CHANGE_RATIO * a:
                changes.append({"site": site, "before": fmt_duration(a), "after": fmt_duration(b),
                                "change": f"{(b - a) / a:+.0%}" if a else "new"})
    return {
        "run_id": str(previous.get("run_id") or "?"),
        "started": fmt_utc(_num(previous.get("started_at"))),
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


def render_report(summary: Mapping[str, Any], *, previous: Mapping[str, Any] | None = None,
                  prices: Mapping[str, float] | None = None, generated_at: float | None = None) -> str:
    """The whole HTML document of a run's report.

    `prices` are USD per hour by instance type; `previous` is the summary to
    compare with; `generated_at` (epoch seconds) defaults to now.
    """
    attempts = attempts_of(summary)
    nodes = nodes_of(summary, attempts)
    context = {
        "run": _header(summary),
        "fleet": _fleet(attempts),
        "cost": _cost(nodes, prices),
        "timeline": _timeline(nodes, attempts, run_bounds(summary)),
        "sites": _site_rows(summary, attempts),
        "diff": _diff(summary, previous),
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
    this_start = _num(summary.get("started_at"))
    if this_start is None:
        return None
    best: tuple[float, dict[str, Any]] | None = None
    for path in sorted(runs_dir.glob("*/summary.json")):
        other = _load(path)
        start = None if other is None else _num(other.get("started_at"))
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


def write_report(summary_path: Path, out: Path, *, prices: Mapping[str, float] | None = None,
                 previous: Mapping[str, Any] | None = None) -> Path:
    """Write the report of `summary_path` to `out` and return `out`.

    Without `previous`, the run is compared with the latest earlier run beside
    it (`find_previous` on the summary's runs directory).
    """
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    if not isinstance(summary, dict):
        raise ValueError(f"{summary_path}: not a run summary")
    if previous is None:
        previous = find_previous(summary_path.parent.parent, summary)
    html = render_report(summary, previous=previous or None, prices=prices)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, out)
    return out
