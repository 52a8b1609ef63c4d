"""Benchmark: gridfleet's scheduling against its baselines, in the simulator, side by side.

Each scenario simulates the same sites (same seed, same crawl times, same
faults drawn) three times: `--policy gridfleet` (longest expected first on a
metered queue, nodes reused until the queue is empty, node watchdogs,
deadline-driven hub), `--policy unmetered` (the same, with every first message
sent at seeding: `run.feed: all`, the policy before the queue was metered) and
`--policy seed` (the original design: FIFO, a fixed 30 s poll, one site per node
then shutdown). Prints the rows, then each baseline over gridfleet (above 1:
gridfleet is better) for makespan, ratio to the lower bound, node-hours, cost
and API calls per site.

Each gridfleet run is read back by `gridfleet check`'s own function (its
violations printed, none expected); the largest scenario runs once more with its
hub replaced halfway through (`--hub-restart-at`), and is checked the same way.
Requests are priced against the fleet (`requests_share`: DynamoDB, S3 and SQS
over EC2).

    .venv/bin/python bench/simulate.py                  # 80/20, 10,000/500 and 100,000/5,000 (about 20 min)
    .venv/bin/python bench/simulate.py --quick          # 80/20 and 1,000/50
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cli.commands.simulate import checked  # noqa: E402
from sim.run import POLICIES, SimParams, SimResult  # noqa: E402

SCENARIOS = {"full": [(80, 20), (10_000, 500), (100_000, 5_000)], "quick": [(80, 20), (1_000, 50)]}
KEYS = (
    "makespan_s",
    "lower_bound_s",
    "ratio",
    "retry_wait_max_s",
    "utilization",
    "node_hours",
    "cost_usd",
    "hang_lag_max_s",
    "tick_cpu_ms_p95",
    "requests_share",
    "wall_s",
)


def row(label: str, policy: str, r: SimResult) -> str:
    return (
        f"{label:>14} {policy:>10} "
        + " ".join(f"{getattr(r, k):>16,}" for k in KEYS)
        + f" {r.api_calls_per_site['total']:>11,}"
    )


def against(name: str, base: SimResult, ours: SimResult) -> str:
    return (
        f"{'':>14} {name + '/ours':>10} makespan {base.makespan_s / ours.makespan_s:.2f}x "
        f"(ratio {base.ratio:.3f} vs {ours.ratio:.3f}), "
        f"node-hours {base.node_hours / ours.node_hours:.2f}x, "
        f"cost {base.cost_usd / max(ours.cost_usd, 1e-9):.2f}x, "
        f"calls/site {base.api_calls_per_site['total'] / ours.api_calls_per_site['total']:.2f}x, "
        f"retry wait max {base.retry_wait_max_s:,.0f} s vs {ours.retry_wait_max_s:,.0f} s"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1,000/50 instead of 10,000/500")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--hang-rate", type=float, default=0.01)
    ap.add_argument("--spot-per-hour", type=float, default=0.05)
    args = ap.parse_args()
    base = SimParams(seed=args.seed, hang_rate=args.hang_rate, spot_per_hour=args.spot_per_hour)
    print(f"{'scenario':>14} {'policy':>10} " + " ".join(f"{k:>16}" for k in KEYS) + f" {'calls/site':>11}")
    scenarios = SCENARIOS["quick" if args.quick else "full"]
    for sites, nodes in scenarios:
        rows = {}
        for policy in POLICIES:
            rows[policy], report = checked(dataclasses.replace(base, sites=sites, nodes=nodes, policy=policy))
            print(row(f"{sites}/{nodes}", policy, rows[policy]) + verdict(report), flush=True)
        ours = rows["gridfleet"]
        for name in POLICIES[1:]:
            print(against(name, rows[name], ours), flush=True)
    sites, nodes = scenarios[-1]
    restart_at = round(rows["gridfleet"].makespan_s / 2)
    again, report = checked(dataclasses.replace(base, sites=sites, nodes=nodes, hub_restart_at=restart_at))
    print(row(f"{sites}/{nodes}", "restarted", again) + verdict(report), flush=True)
    print(
        f"{'':>14} {'':>10} the hub replaced at {restart_at:,} s: makespan {again.makespan_s:,.0f} s against "
        f"{ours.makespan_s:,.0f} s, ratio {again.ratio:.3f}",
        flush=True,
    )
    return 0


def verdict(report) -> str:
    """`gridfleet check` of the simulated run: ok, or its violations (the first named)."""
    if report.ok:
        return "  check ok"
    return f"  check: {len(report.violations)} violations, first: {report.violations[0]}"


if __name__ == "__main__":
    sys.exit(main())
