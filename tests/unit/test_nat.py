"""The NAT estimate of cli/envs/nat.py, and its measured figures against a fresh measurement with real apt."""

from __future__ import annotations

import pytest

from cli.envs import nat
from cli.envs.nat import BASELINE_GBPS, estimate
from twin.instance.debian import BootBytes, measure_boots, template_packages


@pytest.fixture(scope="module")
def measured() -> BootBytes:
    return measure_boots()


def test_500_stock_nodes_through_a_t3_micro_take_hours_and_the_advice_is_the_baked_image() -> None:
    e = estimate(500, baked=False, nat_instance_type="t3.micro", boot_timeout_s=600)
    assert e.bytes_total == 500 * (nat.STOCK_NODE_BOOT_BYTES + nat.APT_UPDATE_BYTES)
    assert e.baseline_gbps == 0.064
    assert e.seconds == pytest.approx(e.bytes_total * 8 / 64e6)
    assert e.seconds > 3600 and e.exceeds_timeout is True
    assert "infra/packer" in e.advice and "aws.node_ami" in e.advice and "600 s" in e.advice
    assert "\n" not in e.advice


def test_baked_nodes_fetch_nothing_whatever_the_nat() -> None:
    for nat_type in ("t3.nano", "no.such-type"):
        e = estimate(500, baked=True, nat_instance_type=nat_type, boot_timeout_s=600)
        assert (e.bytes_total, e.seconds, e.exceeds_timeout) == (0, 0.0, False)
        assert "infra/packer" not in e.advice


def test_a_small_fleet_through_a_fast_nat_fits_the_timeout() -> None:
    e = estimate(2, baked=False, nat_instance_type="c7gn.medium", boot_timeout_s=600)
    assert e.exceeds_timeout is False and e.seconds is not None and e.seconds < 5
    assert "within the 600 s boot timeout" in e.advice and "infra/packer" not in e.advice


def test_time_grows_with_nodes_and_shrinks_with_bandwidth() -> None:
    micro = estimate(100, False, "t3.micro", 600).seconds
    assert estimate(200, False, "t3.micro", 600).seconds == pytest.approx(2 * micro)
    assert estimate(100, False, "t3.small", 600).seconds == pytest.approx(micro / 2)
    # the boot timeout decides, nothing else: the same fleet fits a timeout past its time
    assert micro is not None and estimate(100, False, "t3.micro", micro + 1).exceeds_timeout is False


def test_an_unknown_instance_type_says_so_without_failing() -> None:
    e = estimate(500, baked=False, nat_instance_type="x9z.mega", boot_timeout_s=600)
    assert (e.baseline_gbps, e.seconds, e.exceeds_timeout) == (None, None, None)
    assert "unknown" in e.advice and "x9z.mega" in e.advice and "infra/packer" in e.advice


def test_nonsense_is_refused() -> None:
    with pytest.raises(ValueError):
        estimate(-1, False, "t3.micro", 600)
    with pytest.raises(ValueError):
        estimate(1, False, "t3.micro", 0)


def test_burstable_baselines_double_with_each_size() -> None:
    sizes = ("nano", "micro", "small", "medium", "large", "xlarge", "2xlarge")
    for family in ("t3", "t3a", "t4g"):
        gbps = [BASELINE_GBPS[f"{family}.{size}"] for size in sizes]
        assert gbps[0] == 0.032 and all(b == 2 * a for a, b in zip(gbps, gbps[1:], strict=False))
    assert BASELINE_GBPS["c6gn.medium"] == 1.6 and BASELINE_GBPS["m5.large"] == 0.75


def test_the_measurement_reads_each_templates_packages() -> None:
    assert template_packages("_node_install.sh.j2")[:2] == ("chromium", "chromium-driver")
    assert "chromium" not in template_packages("hub-boot.sh.j2")


@pytest.mark.slow
def test_the_kept_figures_agree_with_a_fresh_measurement(measured: BootBytes) -> None:
    """cli/envs/nat.py's constants within 25 % of what real apt says now: `bench/boot_bytes.py` gives new ones."""
    for kept, fresh in (
        (nat.STOCK_NODE_BOOT_BYTES, measured.node.bytes),
        (nat.STOCK_HUB_BOOT_BYTES, measured.hub.bytes),
        (nat.APT_UPDATE_BYTES, measured.apt_update_bytes),
    ):
        assert fresh > 0 and abs(kept - fresh) <= 0.25 * fresh, (kept, fresh)
    assert measured.node.bytes > measured.hub.bytes  # Chromium is the node's, not the hub's
    assert any(f.startswith("chromium_") for f in measured.node.files)
    assert (len(measured.baked_node.files), measured.baked_node.bytes) == (0, nat.BAKED_NODE_BOOT_BYTES)
