"""Benchmark: what node and hub boots download from Debian's mirror, and what that costs a fleet through its NAT.

Measured with real apt in this run (`twin.instance.debian.measure_boots`: `apt-get install --print-uris` of each
template's APT_PACKAGES onto a synthesized stock Debian 12 EC2 image, Debian's own lists of this machine only), so
it needs a Debian 12 machine with its package lists (`make setup`). Prints packages and MB per stock node boot,
stock hub boot and baked node boot; then `--nodes` stock and baked node boots at once through one NAT instance of
`--nat` type at its baseline bandwidth, against the boot timeout, with the ratios; then the figures
cli/envs/nat.py keeps, over this run's.

    .venv/bin/python bench/boot_bytes.py
    .venv/bin/python bench/boot_bytes.py --nodes 50 --nat t3.small --boot-timeout-s 900
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cli.envs import nat  # noqa: E402
from twin.instance.debian import BootBytes, Fetch, measure_boots  # noqa: E402

COMPARED = ("t3.micro", "t3.small", "t3.medium", "c6gn.medium", "c7gn.medium")
MB = 1e6


def boot_row(label: str, fetch: Fetch, update: int) -> str:
    extra = f"  (+ {update / MB:.1f} MB of apt-get update first)" if update else ""
    return f"  {label:<16} {len(fetch.files):>4} packages {fetch.bytes / MB:>8.1f} MB{extra}"


def fleet_rows(m: BootBytes, nodes: int, nat_type: str, timeout_s: float) -> list[str]:
    gbps = nat.BASELINE_GBPS.get(nat_type)
    if gbps is None:
        return [f"  {nat_type}: its baseline bandwidth is not in cli/envs/nat.py's BASELINE_GBPS"]
    stock = nodes * (m.node.bytes + m.apt_update_bytes)
    baked = nodes * m.baked_node.bytes
    stock_s, baked_s = stock * 8 / (gbps * 1e9), baked * 8 / (gbps * 1e9)
    rows = [
        f"{nodes} node boots at once through one {nat_type} NAT ({gbps:g} Gbit/s baseline), boot timeout "
        f"{timeout_s:g} s:",
        f"  stock image  {stock / 1e9:>8.1f} GB {stock_s:>10,.0f} s  ({stock_s / 3600:.1f} h)",
        f"  baked image  {baked / 1e9:>8.1f} GB {baked_s:>10,.0f} s",
    ]
    over = f"{stock / baked:.1f}x" if baked else "no finite ratio: a baked boot fetches 0 bytes"
    rows.append(f"  ratio stock/baked = {over}; stock time / boot timeout = {stock_s / timeout_s:.1f}x")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=500, help="node boots at once (default 500)")
    ap.add_argument("--nat", default="t3.micro", help="the NAT instance's type (default t3.micro)")
    ap.add_argument("--boot-timeout-s", type=float, default=600.0, help="fleet.boot_timeout_s (default 600)")
    args = ap.parse_args()
    m = measure_boots()
    print(f"downloads from Debian's mirror per boot (real apt; a stock image of {m.image_packages} packages)")
    print(boot_row("stock node boot", m.node, m.apt_update_bytes))
    print(boot_row("stock hub boot", m.hub, m.apt_update_bytes))
    print(boot_row("baked node boot", m.baked_node, 0))
    print("\n".join(fleet_rows(m, args.nodes, args.nat, args.boot_timeout_s)))
    for other in COMPARED:
        gbps = nat.BASELINE_GBPS[other]
        seconds = args.nodes * (m.node.bytes + m.apt_update_bytes) * 8 / (gbps * 1e9)
        print(f"  stock through {other:<12} {gbps:>6g} Gbit/s {seconds:>10,.0f} s")
    print(nat.estimate(args.nodes, False, args.nat, args.boot_timeout_s).advice)
    kept = (
        (nat.STOCK_NODE_BOOT_BYTES, m.node.bytes),
        (nat.STOCK_HUB_BOOT_BYTES, m.hub.bytes),
        (nat.APT_UPDATE_BYTES, m.apt_update_bytes),
    )
    print(
        "cli/envs/nat.py keeps / this run: node {:.3f}x, hub {:.3f}x, apt-get update {:.3f}x".format(
            *(k / max(fresh, 1) for k, fresh in kept)
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
