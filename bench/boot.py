"""A node's boot on the EC2 twin: RunInstances to its first claim, from a baked node image and from the stock one.

One stack is deployed on the twin (`twin`, root only) with a node image baked for it (infra/packer's
bake script, run once). The starter's schedule starts a run whose nodes boot the baked image; then the node
launch template's image is switched to the stock one (a new default version, as an operator would) and the
next day's run, with the same sites, boots stock nodes. For each node: RunInstances to its first claim, and
its boot's phases from its boot log (`step: ...` lines; the log's clock has one-second steps). Use
`GRIDFLEET_TWIN_NET` to keep apart from other twins on this machine.

    sudo .venv/bin/python bench/boot.py [--nodes 2] [--sites 6]
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from twin.day import TwinDay, wait_until  # noqa: E402

STEP_RE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) gridfleet: step: (\S+)$")


def phases(log_text: str) -> dict[str, float]:
    """Seconds per step of a boot log, each step up to the next (the last, start-agent, is left out)."""
    steps = []
    for line in log_text.splitlines():
        m = STEP_RE.match(line.strip())
        if m:
            steps.append((m.group(2), dt.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()))
    out: dict[str, float] = {}
    for (name, at), (_, nxt) in zip(steps, steps[1:], strict=False):
        out[name] = out.get(name, 0.0) + nxt - at
    return out


def run_day(day: TwinDay, sites: dict[str, str]) -> dict[str, Any]:
    """One run by the schedule; each of its nodes' launch-to-first-claim and boot phases."""
    first = len(day.twin.boots)
    day.put_config(sites)
    run_id = day.start_by_schedule()
    wait_until(lambda: day.stack_idle() and day.summary(run_id), 600, f"run {run_id} archived and the stack idle")
    boots = day.twin.boots[first:]
    claims: dict[str, float] = {}
    for s in (day.summary(run_id) or {}).get("sites", {}).values():
        for a in s["attempts"]:
            claims[a["instance_id"]] = min(claims.get(a["instance_id"], a["start"]), a["start"])
    nodes = [b for b in boots if b.role == "node" and b.instance_id in claims]
    return {
        "run_id": run_id,
        "baked": sorted({b.baked for b in nodes}),
        "to_claim": [claims[b.instance_id] - b.instance_offset - b.launched_at for b in nodes],
        "boot_to_claim": [claims[b.instance_id] - b.instance_offset - b.booted_at for b in nodes],
        "phases": [phases((b.sandbox.var_log / "gridfleet-boot.log").read_text()) for b in nodes],
    }


def use_stock_image(day: TwinDay) -> str:
    """The node launch template's default version now names the stock AMI (the stack's ami_parameter's)."""
    stock = day.twin.client("ec2").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    day.launch_from("node", stock)
    return stock


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def report(baked: dict[str, Any], stock: dict[str, Any], bake_s: float) -> None:
    b, s = mean(baked["to_claim"]), mean(stock["to_claim"])
    print("node boot on the EC2 twin, RunInstances -> first claim (the same stack and sites; one run each)")
    for name, run, m in (("stock image", stock, s), ("baked image", baked, b)):
        worst = max(run["to_claim"], default=float("nan"))
        print(f"  {name} : mean {m:6.1f} s, max {worst:6.1f} s over {len(run['to_claim'])} nodes (run {run['run_id']})")
    print(f"  ratio stock/baked = {s / b:.2f}x    (the bake, once per image: {bake_s:.1f} s)")
    bs, bb = mean(stock["boot_to_claim"]), mean(baked["boot_to_claim"])
    print(f"  from the boot's start (the twin's sandbox made): stock {bs:.1f} s, baked {bb:.1f} s, {bs / bb:.2f}x")
    names = list(dict.fromkeys([*(k for p in stock["phases"] for k in p), *(k for p in baked["phases"] for k in p)]))
    print("  boot phases, mean s (stock -> baked):")
    for name in names:
        st = mean([p.get(name, 0.0) for p in stock["phases"]])
        bk = mean([p.get(name, 0.0) for p in baked["phases"]])
        print(f"    {name:18s} {st:6.1f} -> {bk:6.1f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--nodes", type=int, default=2, help="nodes per run (default 2)")
    ap.add_argument("--sites", type=int, default=6, help="demo sites per run (default 6)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/boot.py: the EC2 twin needs root", file=sys.stderr)
        return 2
    if not 1 <= args.nodes <= 8 or not 1 <= args.sites <= 50:
        print("bench/boot.py: --nodes is 1 to 8 and --sites 1 to 50", file=sys.stderr)
        return 2
    fleet = {
        "run": {"deadline_s": 900, "watch_interval_s": 2, "max_attempts": 2},
        "fleet": {"max_nodes": args.nodes, "min_nodes": args.nodes, "idle_exit_s": 10, "boot_timeout_s": 600},
    }
    sites = {f"s{i:02d}": f"/s/s{i:02d}/?pages=2&delay_s=1" for i in range(args.sites)}  # work for every node
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    with tempfile.TemporaryDirectory(prefix="gridfleet-boot-") as tmp:
        with TwinDay(Path(tmp), "gfboot", fleet, sites, node_image=True) as day:
            image = next(iter(day.twin.images.values()))
            baked = run_day(day, sites)  # first: a cold page cache counts against the baked image, not for it
            use_stock_image(day)
            stock = run_day(day, sites)
    assert baked["baked"] == [True] and stock["baked"] == [False], (baked["baked"], stock["baked"])
    report(baked, stock, image.bake_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
