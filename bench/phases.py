"""What bench/embedded.py reads besides the run's summary: the nodes' per-phase timings, and a bare browser start.

The nodes log one `completed` line per site with the seconds of each phase (`node/phases.py`); `phase_rows`
turns them into a table (mean and p95 per phase) and `gaps` adds the time a node spends between two sites
(receive, read, claim). `bare_starts` starts chromedriver and Chromium directly, with the crawl's arguments and
no Grid, one at a time: the browser's own start, which the per-site overhead leaves out.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from node.browser import STARTUP_PREFS, browser_name, chrome_args

#: (phase key on the node's log line, what the table calls it), in the order an attempt passes them.
ROWS = (
    ("gap_s", "between sites: receive, read, claim"),
    ("check_s", "result in S3? + node item BUSY"),
    ("lock_s", "profile lock + Singleton clean-up"),
    ("setup_s", "claim -> crawler handed its job"),
    ("browser_s", "crawler handed its job -> browser answers"),
    ("start_s", "crawler process start (job to it)"),
    ("request_s", "Grid session request -> browser answers"),
    ("crawl_s", "pages (checkpoint writes overlap)"),
    ("ckpt_s", "  of which checkpoint writes (agent)"),
    ("save_s", "save: beat, S3 put, COMPLETED, delete"),
    ("close_s", "close: quit the browser, crawler exits"),
    ("release_s", "cleanup, Grid session end, lock release"),
    ("busy_s", "claim -> node free for its next site"),
)


#: The phases nodes logged before `busy_s` (they add up to it): a run of older code is read as well.
OLD_PHASES = ("setup_s", "browser_s", "crawl_s", "close_s", "save_s")


def p95(xs: list[float]) -> float:
    return sorted(xs)[int(0.95 * (len(xs) - 1))]


def node_lines(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Each node's log events, by node directory name."""
    out: dict[str, list[dict[str, Any]]] = {}
    for log in sorted(run_dir.glob("nodes/*/node.log")):
        events = []
        for line in log.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        out[log.parent.name] = events
    return out


def _ts(ev: dict[str, Any]) -> float:
    return datetime.fromisoformat(ev["ts"]).timestamp()


def site_phases(run_dir: Path) -> list[dict[str, float]]:
    """Per completed site: its phases in seconds, those of its `closed` line (a crawl closed while the node went
    on), and `gap_s`, from the node's previous site (its `completed` line) to this claim."""
    rows: dict[tuple[str, Any], dict[str, float]] = {}
    for events in node_lines(run_dir).values():
        last_end: float | None = None
        gap: float | None = None
        for ev in events:
            kind, key = ev.get("event"), (ev.get("site"), ev.get("attempt"))
            if kind == "claim":
                gap = None if last_end is None else _ts(ev) - last_end
            elif kind in ("completed", "closed"):
                row = rows.setdefault(key, {})
                row.update((k, float(v)) for k, v in ev.items() if k.endswith("_s") and _number(v))
                if kind == "completed":
                    last_end = _ts(ev)
                    if gap is not None:
                        row["gap_s"] = gap
    for row in rows.values():
        if "busy_s" not in row and all(k in row for k in OLD_PHASES):  # a node that logged only these
            row["busy_s"] = sum(row[k] for k in OLD_PHASES)
        if "browser_s" in row and "request_s" in row:
            row["start_s"] = max(0.0, row["browser_s"] - row["request_s"])
    return [r for r in rows.values() if "crawl_s" in r]


def _number(v: Any) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


def phase_table(rows: list[dict[str, float]]) -> list[str]:
    lines = [f"{'phase':44s} {'mean s':>7s} {'p95 s':>7s} {'n':>3s}"]
    for key, label in ROWS:
        xs = [r[key] for r in rows if key in r]
        if xs:
            lines.append(f"{label:44s} {statistics.mean(xs):7.2f} {p95(xs):7.2f} {len(xs):3d}")
    return lines


def bare_start(chromium: str, chromedriver: str, profile: Path) -> float:
    """Seconds from asking chromedriver (started now) for a session to the browser answering, no Grid."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in chrome_args(profile, ("--no-sandbox",) if os.geteuid() == 0 else ()):
        opts.add_argument(a)
    opts.add_experimental_option("prefs", STARTUP_PREFS)
    opts.set_capability("browserName", browser_name(chromium))
    t0 = time.monotonic()
    driver = webdriver.Chrome(options=opts, service=Service(chromedriver))
    took = time.monotonic() - t0
    driver.quit()
    return took


def bare_starts(chromium: str, chromedriver: str, n: int, root: Path, at_once: int = 1) -> list[float]:
    """`n` rounds of `at_once` bare starts begun together (as the bench's nodes begin theirs), each on a new
    profile; the seconds of each start."""
    out: list[float] = []
    with ThreadPoolExecutor(at_once) as pool:
        for i in range(n):
            dirs = [Path(tempfile.mkdtemp(prefix=f"bare{i}-{j}-", dir=root)) for j in range(at_once)]
            out += pool.map(lambda d: bare_start(chromium, chromedriver, d), dirs)
    return out
