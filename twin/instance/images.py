"""Baked node images on the EC2 twin, kept as a layer, like an AMI (twin/instance/bake.py makes them).

What a bake left is the image (`BakedImage`): its install and state directories, copied whole, the upper layers of
its /usr and /var/lib/dpkg (what dpkg installed: the SSM agent and amazon-efs-utils), and the accounts it added to
/etc (the crawl user). An instance launched from the image (`InstanceSandbox(image=...)`) starts with those
directories and accounts, and the layers under its own, so its boot script finds the marker, the venv, the
packages and the crawl user as on a node booted from the AMI infra/packer makes.

Not AWS: no snapshot is taken of a disk; Debian's packages are this machine's (the twin's `apt-get` downloads
nothing).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The tags infra/packer's template gives the AMI: a node image, and what it holds beyond Debian's packages.
IMAGE_TAGS = {
    "gridfleet:image": "node",
    "gridfleet:baked": "amazon-ssm-agent amazon-efs-utils",
    "gridfleet:python": "3.11",
}
PACKAGE_LAYERS = ("usr", "dpkg")  # the sandbox's overlays an image carries (its upper layers)
ACCOUNT_FILES = ("passwd", "group", "shadow", "gshadow")
LAYERS = ("install", "state")  # the sandbox's private directories an image carries


@dataclass(frozen=True)
class BakedImage:
    """What a bake left: `dir/install`, `dir/state`, and the lines it added to /etc's account files."""

    dir: Path
    accounts: dict[str, list[str]]  # /etc file name -> the lines of the accounts the bake added
    marker: dict[str, Any]  # the image's image.json
    bake_s: float

    def apply(self, instance_dir: Path) -> None:
        """Lay the image into an instance sandbox's directories (before its boot): the baked install and state
        directories, and the baked accounts appended to its copy of /etc. The install directory (the venv: most
        of the image) is linked file by file rather than copied, as an instance's disk starts from its AMI's
        snapshot without a copy: what the boot writes there (pip, Python's caches) makes new files and replaces
        files by renaming, so the image is never written through a link."""
        for name in LAYERS:
            src = self.dir / name
            if src.is_dir():
                mode = "-al" if name == "install" else "-a"
                subprocess.run(["cp", mode, f"{src}/.", str(instance_dir / name)], check=True, timeout=300)
        # the package layers (usr, dpkg) are not copied: the instance's overlays lay them under its own
        for name, lines in self.accounts.items():
            path = instance_dir / "etc" / name
            if lines and path.exists():
                with path.open("a") as f:
                    f.write("".join(f"{line}\n" for line in lines))
