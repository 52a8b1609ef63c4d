"""The report's timeline: one row per node, one bar per attempt, laid out in SVG user units.

The picture scales to the page's width; the geometry here only places things relative to each other, and the
template draws them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cli.report.data import OUTCOMES, UNFINISHED, Attempt, Node, fmt_duration, fmt_utc

MAX_ROWS = 40  # node rows drawn in the timeline; the rest are counted, not drawn

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
    return [
        {"x": scale.x(t), "label": fmt_utc(t, fmt)}
        for t in (first + i * step for i in range(int((scale.t1 - first) // step) + 1))
    ]


def _bar(a: Attempt, scale: _Scale, y: float) -> dict[str, Any]:
    x = scale.x(a.start)
    w = round(max(MIN_BAR_W, scale.x(a.end) - x), 1)
    kill = None
    if a.kill_path:
        cx, cy, r = round(x + w, 1), round(y + BAR_H / 2, 1), KILL_R
        kill = f"M{cx - r},{cy - r}L{cx + r},{cy + r}M{cx + r},{cy - r}L{cx - r},{cy + r}"
    return {
        "x": x,
        "y": y,
        "w": w,
        "h": BAR_H,
        "css": a.css,
        "open": a.unfinished,
        "title": a.describe(),
        "kill": kill,
        "kill_path": a.kill_path,
    }


def _label(node: Node) -> str:
    text = f"{node.instance_id} {node.type}"
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "\u2026"


def _row(node: Node, i: int, scale: _Scale) -> dict[str, Any]:
    y = TOP + i * ROW_H
    bar_y = round(y + (ROW_H - BAR_H) / 2, 1)
    market = f", {node.market}" if node.market else ""
    return {
        "y": y,
        "h": ROW_H,
        "stripe": i % 2 == 1,
        "text_y": round(y + ROW_H / 2 + 4, 1),
        "label": _label(node),
        "title": f"node {node.instance_id} ({node.type}{market}): {len(node.attempts)} attempts, "
        f"up {fmt_duration(node.seconds)}",
        "life": None
        if node.start is None or node.end is None
        else {"x1": scale.x(node.start), "x2": scale.x(node.end), "y": round(y + ROW_H / 2, 1)},
        "bars": [_bar(a, scale, bar_y) for a in node.attempts],
    }


def timeline(nodes: list[Node], attempts: list[Attempt], bounds: tuple[float, float]) -> dict[str, Any]:
    scale = _Scale(*bounds)
    shown, hidden = nodes[:MAX_ROWS], nodes[MAX_ROWS:]
    axis_y = TOP + len(shown) * ROW_H + 4
    present = {a.css for a in attempts}
    return {
        "width": WIDTH,
        "height": axis_y + AXIS_H,
        "axis_y": axis_y,
        "x0": LABEL_W,
        "x1": WIDTH - RIGHT_PAD,
        "rows": [_row(n, i, scale) for i, n in enumerate(shown)],
        "ticks": _ticks(scale),
        "legend": [o for o in (*OUTCOMES, UNFINISHED, "other") if o in present],
        "kills": any(a.kill_path for a in attempts),
        "hidden_nodes": len(hidden),
        "hidden_attempts": sum(len(n.attempts) for n in hidden),
        "drawn": bool(attempts) and bool(shown),
    }
