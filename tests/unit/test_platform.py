"""The instances' platform: the architecture of instance types and AMI parameters, and the wheels that fit them."""

from __future__ import annotations

import json

import pytest

from fleet.config.bundle import platform_of
from fleet.config.load import parse_config
from fleet.platform import (
    PLATFORM_FILE,
    S3_METADATA,
    BundlePlatform,
    ami_parameter_arch,
    deb_arch,
    fleet_arch,
    instance_type_arch,
    uname_machine,
)

GRAVITON = ["a1.large", "t4g.medium", "m6g.large", "m6gd.xlarge", "m7g.large", "c6gn.2xlarge", "c7gn.large"]
GRAVITON += ["r8g.large", "x2gd.medium", "im4gn.large", "is4gen.medium", "g5g.xlarge", "hpc7g.16xlarge"]
GRAVITON += ["c7g.metal", "m8gd.48xlarge"]
X86 = ["t3.medium", "t3a.medium", "g4dn.xlarge", "m6a.large", "m7i-flex.large", "inf2.xlarge", "c5n.18xlarge"]
X86 += ["i3en.large", "g4ad.xlarge", "gr6.4xlarge", "u-6tb1.metal", "c7i.metal-24xl", "hpc6a.48xlarge", "m5zn.large"]


@pytest.mark.parametrize("instance_type", GRAVITON)
def test_graviton_families_are_arm64(instance_type):
    assert instance_type_arch(instance_type) == "arm64"


@pytest.mark.parametrize("instance_type", X86)
def test_other_families_are_x86_64(instance_type):
    assert instance_type_arch(instance_type) == "x86_64"


@pytest.mark.parametrize("bad", ["t3", "", "t3.", ".medium", "T3.medium", "t3.medium ", "t3..medium", "t3 .large"])
def test_a_name_that_is_not_family_dot_size_is_refused(bad):
    with pytest.raises(ValueError, match="is not an EC2 instance type"):
        instance_type_arch(bad)


def test_a_fleet_has_one_architecture_and_mixed_types_are_named_by_architecture():
    assert fleet_arch(["t4g.medium", "m7g.large"]) == "arm64"
    assert fleet_arch(("t3.medium", "t3a.medium")) == "x86_64"
    with pytest.raises(ValueError) as e:
        fleet_arch(["t3.medium", "t4g.medium", "t3a.medium", "c7gn.large"])
    assert "arm64 (t4g.medium, c7gn.large)" in str(e.value) and "x86_64 (t3.medium, t3a.medium)" in str(e.value)
    with pytest.raises(ValueError):
        fleet_arch([])


@pytest.mark.parametrize(
    "name, arch",
    [
        ("/aws/service/debian/release/12/latest/amd64", "x86_64"),
        ("/aws/service/debian/release/12/latest/arm64", "arm64"),
        ("/aws/service/debian/daily/12/latest/arm64/", "arm64"),
        ("/my/images/x86_64", "x86_64"),
        ("/my/images/aarch64", "arm64"),
        ("/gridfleet/node-ami", None),
        ("/aws/service/canonical/ubuntu/server/22.04/stable/current/arm64/hvm/ebs-gp2/ami-id", None),
        ("/images/arm64-node", None),
        ("ami-0123456789abcdef0", None),
    ],
)
def test_an_ami_parameter_says_its_architecture_by_its_last_path_part(name, arch):
    assert ami_parameter_arch(name) == arch


def test_the_three_vocabularies():
    assert [uname_machine("x86_64"), uname_machine("arm64")] == ["x86_64", "aarch64"]
    assert [deb_arch("x86_64"), deb_arch("arm64")] == ["amd64", "arm64"]


def test_a_platform_round_trips_through_json_in_the_format_the_boot_scripts_read():
    p = BundlePlatform("aarch64", "3.11")
    assert json.loads(p.to_json()) == {"format": 1, "machine": "aarch64", "python": "3.11"}
    assert BundlePlatform.from_json(p.to_json()) == p
    assert BundlePlatform.from_json(p.to_json().encode() + b"\n") == p
    assert p.describe() == "linux aarch64, CPython 3.11"
    assert PLATFORM_FILE == "platform.json" and S3_METADATA == ("gridfleet-machine", "gridfleet-python")


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "not JSON"),
        ("{", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        ("[1]", "not a JSON object"),
        ('"aarch64"', "not a JSON object"),
        ('{"machine": "aarch64", "python": "3.11"}', "format None is not 1"),
        ('{"format": 2, "machine": "aarch64", "python": "3.11"}', "format 2 is not 1"),
        ('{"format": true, "machine": "aarch64", "python": "3.11"}', "format True is not 1"),
        ('{"format": 1, "python": "3.11"}', "has keys"),
        ('{"format": 1, "machine": "aarch64", "python": "3.11", "glibc": "2.36"}', "has keys"),
        ('{"format": 1, "machine": "arm64", "python": "3.11"}', "machine 'arm64' is not one of x86_64, aarch64"),
        ('{"format": 1, "machine": ["x86_64"], "python": "3.11"}', "machine ['x86_64'] is not one of"),
        ('{"format": 1, "machine": "x86_64", "python": 3.11}', "python 3.11 is not a Python version"),
        ('{"format": 1, "machine": "x86_64", "python": "3.11\\n"}', "is not a Python version"),
        ('{"format": 1, "machine": "x86_64", "python": "2.7.1"}', "is not a Python version"),
    ],
)
def test_from_json_refuses_what_is_not_a_platform_with_a_clear_message(text, says):
    with pytest.raises(ValueError, match="^bundle platform: ") as e:
        BundlePlatform.from_json(text)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_pip_args_name_every_manylinux_platform_debian_12_runs_newest_first():
    args = BundlePlatform("aarch64", "3.11").pip_args()
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    # pip widens no manylinux_2_X tag to older glibc versions: each one a wheel may be built for is named
    assert platforms[0] == "manylinux_2_36_aarch64" and "manylinux_2_28_aarch64" in platforms
    assert platforms[-2:] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]  # the oldest aarch64 has
    assert not any("x86_64" in p or "manylinux1" in p for p in platforms)
    assert args[-7:] == ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--only-binary=:all:"]
    x86 = BundlePlatform("x86_64", "3.12").pip_args()
    assert {"manylinux_2_36_x86_64", "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(x86)
    assert "cp312" in x86 and "manylinux_2_37_x86_64" not in x86


def test_the_platform_of_a_config_is_its_instance_types_and_image_python():
    site = "sites: [{id: a, start_url: 'http://a.test'}]\n"
    assert platform_of(parse_config(site)) == BundlePlatform("x86_64", "3.11")
    graviton = parse_config("fleet: {instance_types: [t4g.medium, m7g.large]}\naws: {image_python: '3.12'}\n" + site)
    assert platform_of(graviton) == BundlePlatform("aarch64", "3.12")
