"""Benchmark: gridfleet's scheduling against the original design's policy, in the simulator, side by side.

Each scenario simulates the same sites (same seed, same crawl times, same
faults drawn) twice: `--policy gridfleet` (longest expected first, nodes reused
until the queue is empty, node watchdogs, deadline-driven hub) and `--policy
seed` (FIFO, a fixed 30 s poll, one site per node then shutdown). Prints both
rows and the ratios seed / gridfleet (above 1: gridfleet is better), for
makespan, node-hours, cost and API calls per site.

    .venv/bin/python bench/simulate.py                  # 80/20 and 10,000/500
    .venv/bin/python bench/simulate.py --quick          # 80/20 and 1,000/50
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from embedded.sim.run import SimParams, simulate  # noqa: E402

SCENARIOS = {"full": [(80, 20), (10_000, 500)], "quick": [(80, 20), (1_000, 50)]}
KEYS = (
    "makespan_s",
    "lower_bound_s",
    "ratio",
    "utilization",
    "node_hours",
    "cost_usd",
    "hang_lag_max_s",
    "tick_cpu_ms_p95",
    "wall_s",
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1,000/50 instead of 10,000/500")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--hang-rate", type=float, default=0.01)
    ap.add_argument("--spot-per-hour", type=float, default=0.05)
    args = ap.parse_args()
    base = SimParams(seed=args.seed, hang_rate=args.hang_rate, spot_per_hour=args.spot_per_hour)
    print(f"{'scenario':>14} {'policy':>9} " + " ".join(f"{k:>15}" for k in KEYS) + f" {'calls/site':>11}")
    for sites, nodes in SCENARIOS["quick" if args.quick else "full"]:
        rows = {}
        for policy in ("gridfleet", "seed"):
            r = simulate(dataclasses.replace(base, sites=sites, nodes=nodes, policy=policy))
            rows[policy] = r
            print(
                f"{f'{sites}/{nodes}':>14} {policy:>9} "
                + " ".join(f"{getattr(r, k):>15,}" for k in KEYS)
                + f" {r.api_calls_per_site['total']:>11,}",
                flush=True,
            )
        ours, seed = rows["gridfleet"], rows["seed"]
        print(
            f"{'':>14} {'seed/ours':>9} makespan {seed.makespan_s / ours.makespan_s:.2f}x, "
            f"node-hours {seed.node_hours / ours.node_hours:.2f}x, "
            f"cost {seed.cost_usd / max(ours.cost_usd, 1e-9):.2f}x, "
            f"calls/site {seed.api_calls_per_site['total'] / ours.api_calls_per_site['total']:.2f}x, "
            f"hang lag {seed.hang_lag_max_s:.1f} s vs {ours.hang_lag_max_s:.1f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
