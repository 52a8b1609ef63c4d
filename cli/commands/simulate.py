"""`gridfleet simulate`: the command line of the simulator (see `sim.run`).

The simulator is imported by the command when it runs, not with the parser: `gridfleet --help` and every other
command stay without it (its policy names are repeated here for `--policy`'s choices, and a test holds them equal).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from fleet.config.load import load_config
from fleet.errors import UsageError
from hub.history import durations_from_file

if TYPE_CHECKING:
    from cli.report.check import CheckReport
    from sim.run import SimParams, SimResult

#: The simulator's policies (sim.run.POLICIES).
POLICIES = ("gridfleet", "unmetered", "seed")

#: The figures we aim for (reported next to what a run reaches; see docs/architecture/simulator.md).
TARGETS = {
    "ratio": ("<=", 1.10),
    "hang_lag_max_s": ("<=", 2.0),
    "utilization": (">=", 0.85),
    "calls_per_site": ("<=", 8.0),
    "tick_cpu_ms_p95": ("<=", 20.0),
}


def _count(lo: int, hi: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            n = lo - 1
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"{value!r}: a whole number from {lo} to {hi:,}")
        return n

    return parse


def _number(lo: float, hi: float | None, what: str, above: bool = False) -> Callable[[str], float]:
    """An argparse type for a number in [lo, hi] (above lo, with `above`)."""

    def parse(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            x = float("nan")
        if not ((x > lo if above else x >= lo) and (hi is None or x <= hi)):
            raise argparse.ArgumentTypeError(f"{value!r}: {what}")
        return x

    return parse


_rate = _number(0, 1, "a fraction from 0 to 1")


def _class_share(value: str) -> tuple[str, float]:
    """CLASS=FRACTION, CLASS as `sim.workload.failure_for` reads it (the simulator, imported only when the command
    is given one)."""
    from sim.workload import failure_for

    key, sep, share = value.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{value!r}: CLASS=FRACTION, e.g. http_404=0.05")
    try:
        failure_for(key)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    try:
        return key, _rate(share)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{value!r}: the fraction is one from 0 to 1") from None


_nonneg = _number(0, None, "a number of 0 or more")
_pos = _number(0, None, "a number above 0", above=True)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "simulate",
        help="a whole run in virtual time on the hub's own plan(): makespan, cost, API calls",
        description="A discrete-event simulation of a run: the real hub (plan, executor, site cache) on an "
        "in-memory table, nodes making the agent's decisions, a simulated EC2 (boot times, spot "
        "interruptions, capacity errors) and simulated crawls (heavy-tailed times, hangs). Nothing "
        "is launched. --policy unmetered sends every first message at seeding (run.feed: all); --policy seed "
        "runs the original design's policy for comparison: FIFO order, a fixed 30 s poll, one site per node "
        "then shutdown.",
        epilog="Figures: makespan_s (start to the last site done), lower_bound_s = max(boot + longest site, "
        "boot + total work / nodes), ratio, hang_lag_*_s (a hang's end beyond hang_after_s), utilization "
        "(busy / billed node-seconds), node_hours, cost_usd (fleet.hourly_price), api_calls_per_site, "
        "tick_cpu_ms_* (the hub's own work per tick, apart from its reads), wall_s.",
    )
    p.add_argument("--sites", type=_count(1, 100_000), help="sites in the run (default 80, or the history's)")
    p.add_argument("--nodes", type=_count(1, 10_000), default=20, help="fleet.max_nodes (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="random seed: the same seed, the same run (default: 1)")
    p.add_argument("--policy", choices=POLICIES, default="gridfleet", help="default: %(default)s")
    p.add_argument(
        "--history",
        type=Path,
        metavar="FILE",
        help="crawl times of a past run: its runs/<id>/summary.json, or a JSON object {site: seconds}",
    )
    p.add_argument("--config", metavar="FILE", help="take run: and fleet: settings from this fleet.yaml")
    p.add_argument("--boot-s", type=_pos, default=60.0, help="mean boot time of a node (default: %(default)s)")
    p.add_argument("--site-s", type=_pos, default=300.0, help="median crawl time (default: %(default)s)")
    p.add_argument(
        "--sigma",
        type=_nonneg,
        default=0.8,
        help="spread of crawl times (lognormal; 0 = all equal) (default: %(default)s)",
    )
    p.add_argument("--page-s", type=_pos, default=30.0, help="seconds per page (default: %(default)s)")
    _add_faults(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _add_faults(p: argparse.ArgumentParser) -> None:
    """The faults the run meets: hangs, failures by class, spot interruptions, capacity errors."""
    p.add_argument("--hang-rate", type=_rate, default=0.01, help="chance an attempt hangs (default: %(default)s)")
    p.add_argument(
        "--fail-rate",
        type=_class_share,
        action="append",
        default=[],
        metavar="CLASS=FRACTION",
        help="chance an attempt fails with CLASS on one of its pages, repeatable; CLASS is dns, connect, tls, "
        "timeout, blocked (a challenge page), error, crash, or http_<status> (http_503; http_403 is blocked 403), "
        "and run.retry decides what follows",
    )
    p.add_argument(
        "--fail-sites",
        type=_class_share,
        action="append",
        default=[],
        metavar="CLASS=FRACTION",
        help="share of the sites that fail every attempt with CLASS on their first page (http_404=0.05: sites gone "
        "today), repeatable; the shares add up to 1 at most",
    )
    p.add_argument(
        "--spot-per-hour",
        type=_nonneg,
        default=0.05,
        help="spot interruptions per instance-hour (default: %(default)s)",
    )
    p.add_argument(
        "--hub-restart-at",
        type=_nonneg,
        default=None,
        metavar="SECONDS",
        help="the hub dies this many seconds into the run and a new one takes over from the table (default: never)",
    )
    p.add_argument(
        "--capacity-errors",
        type=_rate,
        default=0.02,
        help="chance a launch of one instance type finds no capacity (default: %(default)s)",
    )


def params_from(args: argparse.Namespace) -> SimParams:
    from sim.run import SimParams
    from sim.workload import check_shares

    failing_sites = dict(args.fail_sites)
    try:
        check_shares(failing_sites, "failing sites")
    except ValueError as e:
        raise UsageError(f"--fail-sites: {e}") from None
    history = durations_from_file(args.history) if args.history else None
    config = load_config(args.config) if args.config else None
    sites = args.sites or (len(history) if history else 80)
    return SimParams(
        sites=sites,
        nodes=args.nodes,
        seed=args.seed,
        policy=args.policy,
        boot_s=args.boot_s,
        site_s=args.site_s,
        sigma=args.sigma,
        page_s=args.page_s,
        hang_rate=args.hang_rate,
        failure_rates=dict(args.fail_rate),
        failing_sites=failing_sites,
        spot_per_hour=args.spot_per_hour,
        capacity_error_rate=args.capacity_errors,
        history=history,
        config=config,
        hub_restart_at=args.hub_restart_at,
    )


def checked(p: SimParams) -> tuple[SimResult, CheckReport]:
    """Simulate, then read the run back as `gridfleet check` reads a real one: what gridfleet promises of it."""
    from cli.report.check import check_run
    from sim.run import Sim

    sim = Sim(p)
    r = sim.run()
    report = check_run(
        sim.run_id, table=sim.table, queue=sim.queue, results=sim.results, provider=sim.cloud, config=sim.config
    )
    return r, report


def cmd_simulate(args: argparse.Namespace, console: Console) -> int:
    p = params_from(args)
    err = Console(stderr=True)
    if not args.json and err.is_terminal:
        with err.status(f"simulating {p.sites:,} sites on {p.nodes:,} nodes ({p.policy})..."):
            r, report = checked(p)
    else:
        r, report = checked(p)
    if args.json:
        print(json.dumps({**r.to_json(), "check": report.as_json()}, sort_keys=False))
    else:
        console.print(result_table(r, report))
    return 0


def _mark(key: str, value: float) -> str:
    op, limit = TARGETS[key]
    ok = value <= limit if op == "<=" else value >= limit
    return f"{'ok' if ok else 'over' if op == '<=' else 'under'} (target {op} {limit:g})"


def result_table(r: SimResult, report: CheckReport | None = None) -> Table:
    t = Table(title=f"simulated run: {r.sites:,} sites, {r.nodes:,} nodes, policy {r.policy}, seed {r.seed}")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_column("", style="dim")
    calls = r.api_calls_per_site
    rows = [
        ("makespan (run's end)", f"{r.makespan_s:,.0f} s", f"{r.makespan_s / 3600:.2f} h after its start"),
        ("lower bound", f"{r.lower_bound_s:,.0f} s", "max(boot + longest, boot + work / nodes)"),
        ("ratio", f"{r.ratio:.3f}", _mark("ratio", r.ratio)),
        (
            "hang lag max / p95",
            f"{r.hang_lag_max_s:.1f} / {r.hang_lag_p95_s:.1f} s",
            f"{r.hangs} hangs; " + _mark("hang_lag_max_s", r.hang_lag_max_s),
        ),
        (
            "retries: wait p95 / max",
            f"{r.retry_wait_p95_s:,.0f} / {r.retry_wait_max_s:,.0f} s",
            f"{r.late_sites:,} sites ended past the lower bound, {r.late_retried:,} of them retried",
        ),
        ("utilization", f"{r.utilization:.3f}", _mark("utilization", r.utilization)),
        ("node-hours / cost", f"{r.node_hours:,.1f} h / ${r.cost_usd:,.2f}", f"{r.instances_launched:,} instances"),
        (
            "API calls per site",
            f"{calls['total']:.1f}",
            ", ".join(f"{k} {v:g}" for k, v in calls.items() if k != "total")
            + "; "
            + _mark("calls_per_site", calls["total"]),
        ),
        ("  of which the hub's", f"{r.hub_calls_per_site:.2f}", ""),
        (
            "  of which heartbeats",
            f"{r.heartbeat_calls_per_site:.2f}",
            f"one write per {r.heartbeat_interval_s:g} s of crawl; "
            f"without them {calls['total'] - r.heartbeat_calls_per_site:.1f}",
        ),
        (
            "  of which checkpoints",
            f"{r.checkpoint_calls_per_site:.2f}",
            "one save per run.checkpoint_pages pages or run.checkpoint_s s (a retry resumes there); without these "
            f"and heartbeats {calls['total'] - r.heartbeat_calls_per_site - r.checkpoint_calls_per_site:.1f}",
        ),
        (
            "requests / EC2 spend",
            f"${r.requests_usd:,.2f} / ${r.cost_usd:,.2f}",
            f"{100 * r.requests_share:.1f}%: DynamoDB units, S3 and SQS requests at on-demand prices",
        ),
        (
            "hub work per tick p95 / max",
            f"{r.tick_cpu_ms_p95:.1f} / {r.tick_cpu_ms_max:.1f} ms",
            f"{r.ticks} ticks, {r.hub_restarts} hub restarts; " + _mark("tick_cpu_ms_p95", r.tick_cpu_ms_p95),
        ),
        *_site_rows(r),
        ("left running", str(r.left_running), ""),
        *([_check_row(report)] if report is not None else []),
        ("wall time", f"{r.wall_s:.1f} s", f"{r.sim_events:,} events"),
    ]
    for row in rows:
        t.add_row(*row)
    return t


def _check_row(report: CheckReport) -> tuple[str, str, str]:
    """What `gridfleet check` finds of the simulated run: its violations (none: every promise held)."""
    if report.ok:
        return ("gridfleet check", "ok", f"{report.checked.get('sites', 0):,} sites, no violation")
    first = report.violations[0]
    return ("gridfleet check", f"{len(report.violations)} violations", first)


def _site_rows(r: SimResult) -> list[tuple[str, str, str]]:
    """How the sites ended, and the failed attempts by class (summary.json's `failures`)."""
    return [
        (
            "sites",
            f"{r.completed:,} COMPLETED / {r.failed:,} FAILED",
            ", ".join(f"{k} {v}" for k, v in sorted(r.attempts.items())) + " (attempt ends)",
        ),
        (
            "failed attempts by class",
            f"{sum(r.failures.values()):,}",
            ", ".join(f"{k} {v}" for k, v in r.failures.items()) or "none",
        ),
    ]
