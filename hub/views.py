"""Tables for people: the sites of a run and its counts (rich)."""

from __future__ import annotations

import time
from typing import Any, Mapping

from rich.console import Console
from rich.table import Table

STYLE = {"COMPLETED": "green", "FAILED": "red", "RUN": "yellow", "QUEUED": "cyan"}


def _age(epoch: float | None, now: float) -> str:
    if not epoch:
        return "-"
    s = max(0, int(now - epoch))
    return f"{s}s" if s < 120 else (f"{s // 60}m" if s < 7200 else f"{s // 3600}h")


def sites_table(run_id: str, sites: Mapping[str, Mapping[str, Any]], *, only_notable: bool = False,
                now: float | None = None) -> Table:
    now = time.time() if now is None else now
    t = Table(title=f"run {run_id}", title_justify="left")
    for col in ("site", "run_status", "site_status", "attempt", "node", "updated", "reason"):
        t.add_column(col, no_wrap=col in ("site", "node"))
    for name, s in sorted(sites.items()):
        if only_notable and s["run_status"] == "COMPLETED" and s["attemptCount"] <= 1:
            continue
        st = s["run_status"]
        reason = s.get("failure_reason") or ""
        if s.get("error") and st != "COMPLETED":
            reason = f"{reason}: {s['error'][:60]}" if reason else s["error"][:60]
        t.add_row(name, f"[{STYLE.get(st, '')}]{st}[/]", s["site_status"], str(s["attemptCount"]),
                  s.get("instance_id") or "-", _age(s.get("lastUpdateEpoch"), now), reason)
    return t


def counts_line(counts: Mapping[str, int]) -> str:
    total = sum(counts.values())
    done = counts.get("COMPLETED", 0) + counts.get("FAILED", 0)
    parts = [f"[{STYLE[k]}]{k} {v}[/]" for k, v in counts.items() if v]
    return f"{done}/{total} sites finished: " + ", ".join(parts)


def print_sites(console: Console, run_id: str, sites: Mapping[str, Mapping[str, Any]], counts: Mapping[str, int],
                *, limit_full: int = 30) -> None:
    notable = len(sites) > limit_full
    table = sites_table(run_id, sites, only_notable=notable)
    if table.row_count:
        if notable:
            table.caption = "sites completed on their first attempt are not listed"
        console.print(table)
    console.print(counts_line(counts))
