"""What a run report is made of, read from a run's summary.json: its attempts, its nodes and their times.

A summary is written for programs and may be old, partial or hand-edited: every value is read defensively
(a number that is not one is unknown, a mapping that is not one is empty), never trusted to have a shape.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fleet.record.ids import is_site_id

#: Outcomes with a colour of their own in the template's stylesheet; any other is drawn as "other".
OUTCOMES = ("completed", "skipped", "hang", "lost", "error", "deadline", "spot", "killed", "no-nodes", "busy", "robots")
UNFINISHED = "unfinished"  # an attempt whose end was never recorded: drawn to the run's end


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
    return "-" if epoch is None else datetime.fromtimestamp(epoch, UTC).strftime(fmt)


def num(value: object) -> float | None:
    """A finite number from JSON, else None (booleans are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def whole_count(value: object) -> int | None:
    """A count from JSON: a whole number of at least 0, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def as_dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def sites_of(summary: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(name): as_dict(entry) for name, entry in as_dict(summary.get("sites")).items()}


def pacing_rows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """summary.json's `pacing` as the report's rows, by domain: requests, base spacing and where it came from,
    back-offs, final spacing (a value that is not what it should be is shown unknown)."""
    rows = []
    for domain, entry in sorted(as_dict(summary.get("pacing")).items()):
        e = as_dict(entry)
        base, final = num(e.get("base_s")), num(e.get("spacing_s"))
        rows.append(
            {
                "domain": str(domain),
                "requests": whole_count(e.get("requests")),
                "base": "-" if base is None else f"{base:g} s",
                "base_from": str(e.get("base_from") or "-"),
                "backoffs": whole_count(e.get("backoffs")),
                "final": "-" if final is None else f"{final:g} s",
            }
        )
    return rows


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
    items: int | None = None  # what the attempt found (None: a summary of an older gridfleet)
    pages: int | None = None

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
        if self.items is not None:
            parts.append(f"{self.items:,} items from {self.pages or 0:,} pages")
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
    times = [
        t
        for entry in sites_of(summary).values()
        for a in entry.get("attempts") or []
        for t in (num(as_dict(a).get("start")), num(as_dict(a).get("end")))
        if t is not None
    ]
    start = num(summary.get("started_at"))
    start = min(times, default=0.0) if start is None else start
    end = num(summary.get("finished_at"))
    end = max(times, default=start) if end is None else end
    return start, max(start, end)


def attempts_of(summary: Mapping[str, Any]) -> list[Attempt]:
    """Every attempt of every site, by site name then history order."""
    _, run_end = run_bounds(summary)
    out = []
    for site, entry in sorted(sites_of(summary).items()):
        for n, raw in enumerate(entry.get("attempts") or [], start=1):
            a = as_dict(raw)
            start, end = num(a.get("start")), num(a.get("end"))
            if start is None:
                continue
            out.append(
                Attempt(
                    site=site,
                    n=n,
                    instance_id=str(a.get("instance_id") or "?"),
                    start=start,
                    end=max(start, run_end if end is None else end),
                    outcome=str(a.get("outcome") or UNFINISHED),
                    kill_path=str(a["kill_path"]) if a.get("kill_path") else None,
                    unfinished=end is None,
                    items=whole_count(a.get("items")),
                    pages=whole_count(a.get("pages")),
                )
            )
    return out


def nodes_of(summary: Mapping[str, Any], attempts: Iterable[Attempt]) -> list[Node]:
    """The run's nodes by start.

    A node's times fall back to the span of its attempts; a node known to have
    started that made no attempt and has no end counts to the run's end (the
    hub terminates every node when it finishes).
    """
    _, run_end = run_bounds(summary)
    instances = {str(k): as_dict(v) for k, v in as_dict(summary.get("instances")).items()}
    by_node: dict[str, list[Attempt]] = {}
    for a in attempts:
        by_node.setdefault(a.instance_id, []).append(a)
    nodes = []
    for iid in {**dict.fromkeys(instances), **dict.fromkeys(by_node)}:
        info, mine = instances.get(iid, {}), sorted(by_node.get(iid, []), key=lambda a: a.start)
        start, end = num(info.get("started_at")), num(info.get("ended_at"))
        if start is None and mine:
            start = mine[0].start
        if end is None and start is not None:
            end = max(a.end for a in mine) if mine else max(start, run_end)
        nodes.append(
            Node(
                iid,
                str(info.get("type") or "unknown"),
                str(info["market"]) if info.get("market") else None,
                start,
                end,
                tuple(mine),
            )
        )
    return sorted(nodes, key=lambda n: (n.start is None, n.start or 0.0, n.instance_id))


def final_seconds(summary: Mapping[str, Any]) -> dict[str, float]:
    """Each attempted site's duration of its last attempt."""
    return {a.site: a.seconds for a in attempts_of(summary)}  # attempts come in history order


# --- evidence of failed attempts ------------------------------------------------------------------


def evidence_links(evidence_dir: Path, page_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Each site's evidence records under `evidence_dir/<site>/<attempt>/` (as the run's export writes them), by
    attempt: the links to its screenshot and its record, relative to the report's directory `page_dir`. A name
    that is not a site id or an attempt number is passed over."""
    out: dict[str, list[dict[str, Any]]] = {}
    if not evidence_dir.is_dir():
        return out
    for site_dir in sorted(p for p in evidence_dir.iterdir() if p.is_dir() and is_site_id(p.name)):
        numbered = [p for p in site_dir.iterdir() if p.is_dir() and p.name.isdigit() and p.name.isascii()]
        for attempt_dir in sorted(numbered, key=lambda p: int(p.name)):
            shot, record = attempt_dir / "screenshot.png", attempt_dir / "evidence.json"
            if not (shot.is_file() or record.is_file()):
                continue
            try:
                answered = json.loads(record.read_text(encoding="utf-8")).get("answered") is True
            except (OSError, ValueError, AttributeError):
                answered = shot.is_file()
            out.setdefault(site_dir.name, []).append(
                {
                    "attempt": int(attempt_dir.name),
                    "shot": _href(shot, page_dir) if shot.is_file() else None,
                    "href": _href(shot if shot.is_file() else record, page_dir),
                    "note": "screenshot" if shot.is_file() else ("no screenshot" if answered else "no answer"),
                }
            )
    return out


def _href(path: Path, page_dir: Path) -> str:
    return quote(Path(os.path.relpath(path.resolve(), page_dir.resolve())).as_posix())
