"""The machine the fleet's instances are: which architecture the instance types are, and which wheels fit them.

The code bundle is built once, on whatever machine runs `gridfleet bundle`, and installed by every hub and node
with `pip --no-index`: its binary wheels must be those of the instances, not of the machine that built it. The
instances boot Debian 12 (glibc 2.36, CPython 3.11 by default) on x86_64, or on aarch64 for Graviton instance
types. What EC2 calls the architecture (`x86_64`, `arm64`) is what `uname -m` says as `x86_64`, `aarch64`, and
Debian as `amd64`, `arm64`: the three vocabularies meet here.

Pure: the standard library only, so the config validates with it and a boot script's checks can share it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from fleet.errors import quote

#: An EC2 architecture, as DescribeImages' `Architecture` and DescribeInstanceTypes name them.
Arch = Literal["x86_64", "arm64"]

#: The bundle's record of its target, at the top of the unpacked bundle (`$INSTALL_DIR/platform.json`).
PLATFORM_FILE = "platform.json"
#: The bundle object's S3 metadata keys: its target's `uname -m` and Python.
S3_METADATA = ("gridfleet-machine", "gridfleet-python")

_FORMAT = 1
#: Debian 12's glibc: the newest manylinux wheels its instances can run.
_GLIBC_MINOR = 36
#: The oldest glibc of manylinux wheels per machine (no manylinux1 or manylinux2010 wheel was ever built for
#: aarch64), and the legacy names PEP 600 keeps for some glibc versions.
_OLDEST_GLIBC_MINOR = {"x86_64": 5, "aarch64": 17}
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}

_INSTANCE_TYPE = re.compile(r"(?P<family>[a-z][a-z0-9]*(?:-[a-z0-9]+)*)\.(?P<size>[a-z0-9]+(?:-[a-z0-9]+)*)")
#: Graviton families: a generation number followed by `g` and attribute letters (t4g, m6gd, c7gn, im4gn, ...);
#: a1 is the first Graviton and breaks the rule. A `-flex` or other suffixed family is never Graviton.
_GRAVITON_FAMILY = re.compile(r"a1|[a-z]+\d+g[a-z]*")
_PARAMETER_ARCH: dict[str, Arch] = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "arm64", "aarch64": "arm64"}
_MACHINE: dict[Arch, str] = {"x86_64": "x86_64", "arm64": "aarch64"}
_DEB_ARCH: dict[Arch, str] = {"x86_64": "amd64", "arm64": "arm64"}
_PYTHON = re.compile(r"3\.\d{1,3}")


def instance_type_arch(instance_type: str) -> Arch:
    """The architecture of an EC2 instance type (`family.size`), from its family's name alone.

    Read from the name rather than asked of DescribeInstanceTypes so that a config validates without credentials.
    """
    m = _INSTANCE_TYPE.fullmatch(instance_type) if isinstance(instance_type, str) else None
    if m is None:
        raise ValueError(f"{quote(instance_type)} is not an EC2 instance type (family.size, e.g. t3.medium)")
    return "arm64" if _GRAVITON_FAMILY.fullmatch(m.group("family")) else "x86_64"


def fleet_arch(instance_types: Iterable[str]) -> Arch:
    """The one architecture of a fleet's instance types; ValueError when they mix two, since the nodes install
    one bundle, built for one."""
    by_arch: dict[Arch, list[str]] = {}
    for t in instance_types:
        by_arch.setdefault(instance_type_arch(t), []).append(t)
    if not by_arch:
        raise ValueError("no instance types")
    if len(by_arch) > 1:
        kinds = " and ".join(f"{arch} ({', '.join(types)})" for arch, types in sorted(by_arch.items()))
        raise ValueError(f"instance types of two architectures, {kinds}: the nodes install one bundle, built for one")
    (arch,) = by_arch
    return arch


def ami_parameter_arch(name: str) -> Arch | None:
    """The architecture an SSM parameter's name says by its last path part (Debian's
    `/aws/service/debian/release/12/latest/amd64`), else None: the name alone does not tell."""
    return _PARAMETER_ARCH.get(name.rstrip("/").rsplit("/", 1)[-1])


def uname_machine(arch: Arch) -> str:
    """What `uname -m` (and a manylinux wheel's platform tag) calls the architecture."""
    return _MACHINE[arch]


def deb_arch(arch: Arch) -> str:
    """What Debian (`dpkg --print-architecture`, its AMIs' SSM parameters) calls the architecture."""
    return _DEB_ARCH[arch]


@dataclass(frozen=True)
class BundlePlatform:
    """The platform a bundle's wheels are for: Linux (Debian 12's glibc) on `machine`, CPython `python`."""

    machine: str  # uname -m: x86_64 | aarch64
    python: str  # "3.11"

    def __post_init__(self) -> None:
        # Checked here as well as in from_json: S3 metadata gives the two values without the JSON around them.
        if not isinstance(self.machine, str) or self.machine not in _OLDEST_GLIBC_MINOR:
            raise ValueError(f"bundle platform: machine {self.machine!r} is not one of x86_64, aarch64")
        if not isinstance(self.python, str) or not _PYTHON.fullmatch(self.python):
            raise ValueError(f"bundle platform: python {self.python!r} is not a Python version 3.<minor>")

    def to_json(self) -> str:
        return json.dumps({"format": _FORMAT, "machine": self.machine, "python": self.python})

    @classmethod
    def from_json(cls, text: str | bytes) -> BundlePlatform:
        """A platform as `to_json` wrote it; ValueError saying what is wrong with anything else (it is read
        back from a file or an object someone else may have written)."""
        try:
            data: Any = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"bundle platform: not JSON ({e})") from None
        if not isinstance(data, dict):
            raise ValueError("bundle platform: not a JSON object")
        if data.get("format") != _FORMAT or isinstance(data.get("format"), bool):
            raise ValueError(f"bundle platform: format {data.get('format')!r} is not {_FORMAT}")
        keys = {"format", "machine", "python"}
        if set(data) != keys:
            raise ValueError(f"bundle platform: has keys {sorted(data)}, not {sorted(keys)}")
        return cls(machine=data["machine"], python=data["python"])  # checked there, whatever JSON type they are

    def pip_args(self) -> list[str]:
        """The options of `pip download` that select wheels for this platform.

        pip does not widen a `--platform manylinux_2_36_<machine>` to the older glibc versions those systems
        also run (it does so only for manylinux2014 and manylinux2010), and most wheels are built for an old
        glibc, so every compatible platform is named, newest first: pip prefers the earlier ones.
        """
        platforms: list[str] = []
        for minor in range(_GLIBC_MINOR, _OLDEST_GLIBC_MINOR[self.machine] - 1, -1):
            platforms.append(f"manylinux_2_{minor}_{self.machine}")
            if minor in _LEGACY_MANYLINUX:
                platforms.append(f"{_LEGACY_MANYLINUX[minor]}_{self.machine}")
        version = self.python.replace(".", "")
        return [
            *(arg for p in platforms for arg in ("--platform", p)),
            "--python-version",
            self.python,
            "--implementation",
            "cp",
            "--abi",
            f"cp{version}",
            "--only-binary=:all:",
        ]

    def describe(self) -> str:
        return f"linux {self.machine}, CPython {self.python}"
