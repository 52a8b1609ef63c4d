"""The report's item counts: each site's items, pages and what its attempts left out, the run's totals, and the
chart of items per site against the previous run (SVG user units, drawn by the template).

Read from summaries as defensively as the rest of the report: a summary of an older gridfleet has no counts,
and a site without them shows "-" (never 0, which would read as a site that found nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cli.report.data import as_dict, sites_of
from cli.report.data import whole_count as whole
from fleet.outputs.summary import totals
from fleet.record.state import MAX_COLLIDED

MAX_CHART_ROWS = 40  # sites drawn in the chart (the largest changes first); the rest are counted
DROP_RATIO = 0.5  # a site whose items fell by at least this fraction is marked

# Chart geometry in SVG user units; the picture scales to the page's width.
WIDTH = 1000.0
LABEL_W = 240.0
RIGHT_PAD = 90.0  # room for the counts after the longest bar
TOP = 6.0
ROW_H = 24.0
BAR_H = 9.0
LABEL_CHARS = 34


def site_items(entry: Mapping[str, Any]) -> int | None:
    """A site's items: those of its result (a COMPLETED site of a summary that counts them), else None."""
    return whole(entry.get("items")) if entry.get("run_status") == "COMPLETED" else None


def left_out(entry: Mapping[str, Any]) -> dict[str, Any]:
    """What a site's attempts left out: collisions (the first ids), items without an id and pages robots.txt
    disallowed; and whether its robots.txt was ignored (politeness.robots: false)."""
    collisions = skipped = robots = 0
    ids: list[str] = []
    for raw in entry.get("attempts") or []:
        a = as_dict(raw)
        collisions += whole(a.get("collisions")) or 0
        skipped += whole(a.get("skipped")) or 0
        robots += whole(a.get("robots_skipped")) or 0
        ids += [str(i) for i in a.get("collided") or [] if str(i) not in ids]
    out = {"collisions": collisions, "skipped": skipped, "collided": ids[:MAX_COLLIDED], "robots_skipped": robots}
    return {**out, "robots_ignored": entry.get("robots") is False}


def site_counts(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The sites table's count columns of one site."""
    items, pages = site_items(entry), whole(entry.get("pages"))
    return {
        "items": "-" if items is None else f"{items:,}",
        "pages": "-" if items is None or pages is None else f"{pages:,}",
        "left_out": left_out(entry),
    }


def run_totals(summary: Mapping[str, Any]) -> dict[str, str]:
    """The run's counts for the page's facts, from its sites (so an older summary's count what they can)."""
    return {k: f"{v:,}" for k, v in totals(sites_of(summary)).items()}


def _label(site: str) -> str:
    return site if len(site) <= LABEL_CHARS else site[: LABEL_CHARS - 1] + "\u2026"


@dataclass(frozen=True)
class _Change:
    site: str
    before: int | None
    now: int | None

    @property
    def size(self) -> float:
        """How big the change is, for ordering: a site that gained or lost its count first."""
        if self.before is None or self.now is None:
            return float("inf")
        if self.before == 0:
            return float("inf") if self.now else 0.0
        return abs(self.now - self.before) / self.before

    @property
    def reads(self) -> str:
        if self.before is None or self.now is None:
            return "no count before" if self.before is None else "no result now"
        if self.before == 0:
            return "new items" if self.now else "0"
        return f"{(self.now - self.before) / self.before:+.0%}"

    @property
    def drop(self) -> bool:
        """Its items fell by DROP_RATIO or more (to none, or to no result)."""
        return self.before is not None and self.before > 0 and (self.now or 0) <= self.before * (1 - DROP_RATIO)


def _chart_row(c: _Change, i: int, top: int) -> dict[str, Any]:
    y = TOP + i * ROW_H
    span = WIDTH - LABEL_W - RIGHT_PAD
    bars = []
    for n, (value, css) in enumerate(((c.before, "previous"), (c.now, "current"))):
        w = 0.0 if not value else round(max(1.0, value / top * span), 1)
        by = round(y + 2 + n * (BAR_H + 1), 1)
        text = "-" if value is None else f"{value:,}"
        bars.append({"css": css, "x": LABEL_W, "y": by, "w": w, "h": BAR_H, "text": text, "tx": LABEL_W + w + 4})
    return {
        "y": y,
        "h": ROW_H,
        "stripe": i % 2 == 1,
        "text_y": round(y + ROW_H / 2 + 4, 1),
        "label": _label(c.site),
        "title": f"{c.site}: {bars[0]['text']} items before, {bars[1]['text']} now ({c.reads})",
        "drop": c.drop,
        "bars": bars,
    }


def items_chart(summary: Mapping[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """Items per site, this run's bar under the previous run's, for the sites of both runs that either completed
    with a count; the largest changes first, at most MAX_CHART_ROWS drawn."""
    now, before = sites_of(summary), sites_of(previous or {})
    changes = [
        _Change(site, site_items(before[site]), site_items(now[site])) for site in sorted(now.keys() & before.keys())
    ]
    changes = sorted((c for c in changes if c.before is not None or c.now is not None), key=lambda c: -c.size)
    shown, hidden = changes[:MAX_CHART_ROWS], changes[MAX_CHART_ROWS:]
    top = max([v or 0 for c in shown for v in (c.before, c.now)] + [1])
    rows = [_chart_row(c, i, top) for i, c in enumerate(shown)]
    counted_before = any(site_items(e) is not None for e in before.values())
    return {
        "width": WIDTH,
        "height": TOP + len(shown) * ROW_H + 6,
        "rows": rows,
        "hidden": len(hidden),
        "drops": [c.site for c in changes if c.drop],
        "drawn": bool(rows) and counted_before,
        "counted_before": counted_before,
    }
