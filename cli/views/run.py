"""Views for people: the sites of a run, its counts, and `watch`'s live view (rich).

Every value shown comes from the table or a summary file, which nodes and their crawlers fill: each is shown as
plain text (a `Text` with control characters spelled out, or escaped where it joins markup of ours), never read
as rich markup or passed to the terminal as its own escape sequences.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.views.plain import markup as _markup
from cli.views.plain import text as _text
from fleet.outputs.summary import totals
from fleet.record.failures import failure_label

STYLE = {"COMPLETED": "green", "FAILED": "red", "RUN": "yellow", "QUEUED": "cyan"}


def _age(epoch: float | None, now: float) -> str:
    if not epoch:
        return "-"
    s = max(0, int(now - epoch))
    return f"{s}s" if s < 120 else (f"{s // 60}m" if s < 7200 else f"{s // 3600}h")


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def items_of(s: Mapping[str, Any]) -> str:
    """A site's items: its result's when COMPLETED, the current attempt's so far while it runs, else "-"."""
    items = _whole(s.get("items"))
    if items is not None:
        return str(items)
    attempts = s.get("attempts") or []
    last = attempts[-1] if attempts and isinstance(attempts[-1], Mapping) else {}
    now = _whole(last.get("items"))
    return f"{now} so far" if s.get("run_status") == "RUN" and now is not None else "-"


def left_out(s: Mapping[str, Any]) -> str:
    """The items a site's attempts left out: collisions (same id, other content) and items without an id; the
    pages its robots.txt disallowed, or that it was ignored."""
    collisions = skipped = robots = 0
    for a in s.get("attempts") or []:
        if isinstance(a, Mapping):
            collisions += _whole(a.get("collisions")) or 0
            skipped += _whole(a.get("skipped")) or 0
            robots += _whole(a.get("robots_skipped")) or 0
    parts = [f"{collisions} collisions" if collisions else "", f"{skipped} no id" if skipped else ""]
    parts.append(f"{robots} pages robots.txt disallows" if robots else "")
    parts.append("robots.txt ignored" if s.get("robots") is False else "")
    return ", ".join(p for p in parts if p)


def sites_table(
    run_id: str, sites: Mapping[str, Mapping[str, Any]], *, only_notable: bool = False, now: float | None = None
) -> Table:
    now = time.time() if now is None else now
    t = Table(title=_text(f"run {run_id}"), title_justify="left")
    for col in ("site", "run_status", "site_status", "attempt", "items", "pages", "node", "updated", "reason"):
        t.add_column(col, no_wrap=col in ("site", "node"), justify="right" if col in ("items", "pages") else "left")
    for name, s in sorted(sites.items()):
        if only_notable and s["run_status"] == "COMPLETED" and s["attemptCount"] <= 1 and not left_out(s):
            continue
        st = str(s["run_status"])
        reason = str(s.get("failure_reason") or "")
        label = failure_label(s.get("failure_class"), s.get("http_status"))
        if label and label != reason:
            reason = f"{reason} ({label})" if reason else label
        if isinstance(s.get("retry_at"), int | float):
            reason += f", retry in {max(0, round(s['retry_at'] - now))}s"
        error = str(s.get("error") or "")[:60]
        if error and st != "COMPLETED":
            reason = f"{reason}: {error}" if reason else error
        lost = left_out(s)
        if lost:
            reason = f"{reason}; {lost}" if reason else lost
        pages = _whole(s.get("pages"))
        t.add_row(
            _text(name),
            _text(st, STYLE.get(st, "")),
            _text(s["site_status"]),
            _text(s["attemptCount"]),
            _text(items_of(s)),
            _text(pages if pages else "-"),
            _text(s.get("instance_id") or "-"),
            _age(s.get("lastUpdateEpoch"), now),
            _text(reason),
        )
    return t


def counts_line(counts: Mapping[str, int]) -> str:
    total = sum(counts.values())
    done = counts.get("COMPLETED", 0) + counts.get("FAILED", 0)
    parts = [f"[{STYLE[k]}]{k} {v}[/]" if k in STYLE else f"{_markup(k)} {v}" for k, v in counts.items() if v]
    return f"{done}/{total} sites finished: " + ", ".join(parts)


def totals_line(sites: Mapping[str, Mapping[str, Any]]) -> str:
    """The run's counts in one line (`fleet.outputs.summary.totals`): items and pages of the results, pages fetched,
    and the items left out."""
    t = totals(sites)
    line = f"items {t['items']:,} from {t['pages']:,} pages (pages fetched, retries included: {t['pages_fetched']:,})"
    line += f"; left out: {t['collisions']:,} collisions, {t['skipped']:,} without an id"
    line += f", {t['robots_skipped']:,} pages robots.txt disallows" if t.get("robots_skipped") else ""
    return line


def print_sites(
    console: Console,
    run_id: str,
    sites: Mapping[str, Mapping[str, Any]],
    counts: Mapping[str, int],
    *,
    limit_full: int = 30,
) -> None:
    notable = len(sites) > limit_full
    table = sites_table(run_id, sites, only_notable=notable)
    if table.row_count:
        if notable:
            table.caption = "sites completed on their first attempt, leaving no item out, are not listed"
        console.print(table)
    console.print(counts_line(counts))
    console.print(totals_line(sites), highlight=False)


class WatchView:
    """What `watch` draws on a terminal: a progress bar of finished sites, then the sites still open or retried."""

    def __init__(self, console: Console, data: dict[str, Any]):
        self.bar = Progress(
            TextColumn("[bold]run {task.fields[run_id]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            console=console,
        )
        total = max(1, len(data["sites"]))
        self.task = self.bar.add_task("sites", total=total, run_id=_markup(data["run_id"]), counts="")

    def render(self, d: dict[str, Any]) -> Group:
        c = d["counts"]
        self.bar.update(
            self.task,
            total=max(1, len(d["sites"])),
            completed=c.get("COMPLETED", 0) + c.get("FAILED", 0),
            counts=counts_line(c).split(": ", 1)[-1],
        )
        open_sites = {
            k: v
            for k, v in d["sites"].items()
            if v["run_status"] in ("RUN", "QUEUED") or v["attemptCount"] > 1 or v["run_status"] == "FAILED"
        }
        table = sites_table(d["run_id"], dict(list(sorted(open_sites.items()))[:40]))
        table.title = _text(f"run {d['run_id']}: sites running, retried or failed")
        return Group(self.bar.get_renderable(), table)


def watch(
    fetch: Callable[[], dict[str, Any]],
    console: Console,
    *,
    interval_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
    max_polls: int | None = None,
) -> int:
    """Follow a run until it finishes: a progress bar of finished sites, the counts and the sites still open.

    `fetch` returns the `status --json` shape plus `finished`. On a terminal the view
    refreshes in place; otherwise a line is printed each time the counts change. Returns
    0 when every site COMPLETED, 3 when the run finished with FAILED sites.
    """
    data = fetch()
    view = WatchView(console, data)
    render = view.render
    last_line = None
    polls = 0

    live = console.is_terminal
    ctx = Live(render(data), console=console, refresh_per_second=4, transient=False) if live else None
    if ctx is not None:
        ctx.start()
    try:
        while True:
            if ctx is not None:
                ctx.update(render(data))
            else:
                line = f"run {_markup(data['run_id'])}: {counts_line(data['counts'])}"
                if line != last_line:
                    console.print(line, highlight=False)
                    last_line = line
            polls += 1
            if data.get("finished") or (max_polls is not None and polls >= max_polls):
                break
            sleep(interval_s)
            data = fetch()
    finally:
        if ctx is not None:
            ctx.stop()
    if not data.get("finished"):
        return 1
    return 3 if data["counts"].get("FAILED") else 0
