"""What a fleet's boots push through the stack's NAT instance, and whether that fits in the boot timeout.

On AWS a stock node reaches Debian's mirror through one NAT instance (infra/terraform's `nat_instance_type`, a
t3.micro by default), and every node of a run may boot at once when the run starts: each stock boot runs
`apt-get update` and installs the node's Debian packages (Chromium, a JRE, awscli, ...) through it. A NAT
instance sustains its type's *baseline* bandwidth; it bursts above it only while its network credits last, which
a fleet's boot outlasts, so the estimate takes the baseline. Its figure applies to inbound and outbound traffic
each, and a NAT forwards every byte once each way, so the bytes go through at that rate. A node booted from the
baked image (infra/packer, `aws.node_ami`) has the packages already and fetches nothing from Debian.

The byte counts are measured with real apt on a Debian 12 machine (`twin.instance.debian.measure_boots`), kept
here as constants so that this kernel module stays pure; tests/unit/test_nat.py fails when they drift by more
than 25 % from a fresh measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

# Measured: `.venv/bin/python bench/boot_bytes.py` (real apt, `--print-uris`, Debian 12's lists on a synthesized
# stock EC2 image; see twin/instance/debian.py). Debian's point releases move them a little.
STOCK_NODE_BOOT_BYTES = 262_427_952  # 170 packages: the node's APT_PACKAGES (cloud_init/templates/_node_install.sh.j2)
STOCK_HUB_BOOT_BYTES = 65_120_372  # 42 packages: the hub's APT_PACKAGES (cloud_init/templates/hub-boot.sh.j2)
BAKED_NODE_BOOT_BYTES = 0  # the baked image has every package the node's boot would install
APT_UPDATE_BYTES = 15_769_512  # the `apt-get update` a stock boot runs first: the image's lists are emptied

#: Baseline network bandwidth in Gbit/s of instance types a NAT instance plausibly is, as AWS publishes it: the
#: "Network specifications" tables of the Amazon EC2 Instance Types guide (general purpose, compute optimized),
#: whose "Baseline bandwidth" column the EC2 User Guide's page "Amazon EC2 instance network bandwidth" explains
#: (what a type sustains; its "up to" figure is a burst on credits). For a type not listed, DescribeInstanceTypes
#: gives it as NetworkInfo.NetworkCards[].BaselineBandwidthInGbps.
BASELINE_GBPS: dict[str, float] = {
    **{f"{family}.{size}": gbps for family in ("t3", "t3a", "t4g") for size, gbps in (
        ("nano", 0.032), ("micro", 0.064), ("small", 0.128), ("medium", 0.256), ("large", 0.512),
        ("xlarge", 1.024), ("2xlarge", 2.048))},
    "c6gn.medium": 1.6, "c6gn.large": 3.0, "c7gn.medium": 3.125, "c5n.large": 3.0,
    "m6g.medium": 0.5, "c6g.medium": 0.5, "m7g.medium": 0.52, "c7g.medium": 0.52,
    "m5.large": 0.75, "m5a.large": 0.75, "c5.large": 0.75, "m6g.large": 0.75, "c6g.large": 0.75,
    "m6i.large": 0.781, "m6a.large": 0.781, "c6i.large": 0.781, "c6a.large": 0.781, "m7i.large": 0.781,
    "c7i.large": 0.781, "m7g.large": 0.937, "c7g.large": 0.937,
}  # fmt: skip


@dataclass(frozen=True)
class NatEstimate:
    """`nodes` boots at once through one NAT instance, at its baseline bandwidth."""

    nodes: int
    baked: bool
    nat_instance_type: str
    bytes_total: int  # what the boots fetch from Debian's mirror, together
    baseline_gbps: float | None  # None: the type is not in BASELINE_GBPS
    seconds: float | None  # how long the NAT takes to forward them; None when its bandwidth is unknown
    exceeds_timeout: bool | None  # whether that is past the boot timeout; None when unknown
    advice: str  # one line for the operator


def boot_bytes(baked: bool) -> int:
    """What one node boot fetches from Debian's mirror."""
    return BAKED_NODE_BOOT_BYTES if baked else STOCK_NODE_BOOT_BYTES + APT_UPDATE_BYTES


def estimate(nodes: int, baked: bool, nat_instance_type: str, boot_timeout_s: float) -> NatEstimate:
    """How long `nodes` node boots at once keep the NAT busy, and whether that passes `boot_timeout_s` (the
    fleet's: a node that has not started by then is replaced, and its replacement downloads it all again)."""
    if nodes < 0 or boot_timeout_s <= 0:
        raise ValueError(f"nodes must be >= 0 and boot_timeout_s > 0, not {nodes} and {boot_timeout_s}")
    total = nodes * boot_bytes(baked)
    gbps = BASELINE_GBPS.get(nat_instance_type)
    seconds = 0.0 if total == 0 else None if gbps is None else total * 8 / (gbps * 1e9)
    exceeds = None if seconds is None else seconds > boot_timeout_s
    kind = "baked" if baked else "stock"
    what = f"{nodes} {kind} node boots fetch {total / 1e9:.1f} GB from Debian's mirror through the NAT"
    bake = "boot nodes from the baked image (infra/packer, aws.node_ami), which fetches nothing there"
    if total == 0:
        advice = f"{nodes} {kind} node boots fetch nothing from Debian's mirror: the NAT is no limit to them"
    elif seconds is None:
        advice = f"{what}, whose baseline bandwidth is unknown here ({nat_instance_type}): to be sure, {bake}"
    else:
        rate = f"{what} ({nat_instance_type}, {gbps:g} Gbit/s baseline) in {seconds:,.0f} s"
        over = f", past the {boot_timeout_s:g} s boot timeout: {bake}"
        advice = rate + (over if exceeds else f", within the {boot_timeout_s:g} s boot timeout")
    return NatEstimate(nodes, baked, nat_instance_type, total, gbps, seconds, exceeds, advice)
