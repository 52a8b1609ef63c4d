"""The bake of a node image on the EC2 twin: infra/packer's bake script run once in a sandbox of its own.

`bake()` runs the real bake script (`cloud_init.render_bake`, the file infra/packer/bake.sh) as the runcmd of
an instance sandbox of its own, from a stock image (the host's crawl user removed from its /etc, as
`TwinStack.stock_users` says), with a code bundle and the amazon-efs-utils package staged in its /root (the SSM
agent it fetches from the twin's S3, as on AWS), and keeps what it left as a `BakedImage` (twin/instance/images.py).
`register()` gives the image an AMI id in moto (RegisterImage, x86_64) with the tags infra/packer gives it and an
SSM parameter holding it, which the stack's `node_ami_parameter` names.
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from twin.instance.cloud_config import TwinError
from twin.instance.images import ACCOUNT_FILES, IMAGE_TAGS, LAYERS, PACKAGE_LAYERS, BakedImage
from twin.instance.sandbox import InstanceSandbox

BAKE_SCRIPT = "/usr/local/sbin/gridfleet-bake"
STAGED_BUNDLE = "/root/gridfleet-bundle.tar.gz"
STAGED_EFS_UTILS = "/root/amazon-efs-utils.deb"


def _bake_user_data(script: str) -> str:
    doc = {
        "write_files": [{"path": BAKE_SCRIPT, "owner": "root:root", "permissions": "0755", "content": script}],
        "runcmd": [[BAKE_SCRIPT, STAGED_BUNDLE, STAGED_EFS_UTILS]],
    }
    return "#cloud-config\n" + yaml.safe_dump(doc, sort_keys=False)


def _names(path: Path) -> set[str]:
    return {line.split(":", 1)[0] for line in path.read_text().splitlines() if line} if path.exists() else set()


def bake(
    root: Path,
    bundle: Path,
    efs_utils: Path,
    *,
    endpoint: str,
    region: str,
    stock_users: tuple[str, ...] = (),
    timeout_s: float = 900.0,
) -> BakedImage:
    """Run the bake script on `bundle` and the `efs_utils` package in a sandbox under `root`, whose AWS is at
    `endpoint` in `region`; the image it left (in `root/images/<id>`). TwinError with the bake's log when it
    fails."""
    from cloud_init import render_bake

    box_id = "i-0ba4e" + secrets.token_hex(6)
    image_dir = root / "images" / box_id
    stage = image_dir / "stage"
    stage.mkdir(parents=True)
    shutil.copyfile(bundle, stage / Path(STAGED_BUNDLE).name)
    shutil.copyfile(efs_utils, stage / Path(STAGED_EFS_UTILS).name)
    box = InstanceSandbox(
        box_id,
        _bake_user_data(render_bake()),
        root,
        stock_users=stock_users,
        boot_timeout_s=timeout_s,
        layers={"root-home": stage},
        aws_endpoint=endpoint,
        metadata={"placement/region": region},
    )
    started = time.monotonic()
    try:
        box.start()
        before = {name: _names(box.dir / "etc" / name) for name in ACCOUNT_FILES}
        result = box.wait_boot(timeout_s + 30)
        if result is None or result.exit_code != 0:
            log = box.boot_log.read_text(errors="replace")[-4000:]
            raise TwinError(f"the bake failed ({result}):\n{log}")
    finally:
        box.stop()
    bake_s = time.monotonic() - started
    for name in LAYERS:
        shutil.copytree(box.dir / name, image_dir / name, symlinks=True)
    for name in PACKAGE_LAYERS:  # moved whole: an overlay's upper layer may hold whiteouts, which a copy loses
        shutil.move(box.dir / f"{name}-upper", image_dir / name)
    accounts = {}
    for name in ACCOUNT_FILES:
        path = box.dir / "etc" / name
        lines = path.read_text().splitlines() if path.exists() else []
        accounts[name] = [line for line in lines if line and line.split(":", 1)[0] not in before[name]]
    shutil.rmtree(stage)
    marker = json.loads((image_dir / "install" / "image.json").read_text())
    return BakedImage(image_dir, accounts, marker, round(bake_s, 1))


def register(ec2: Any, ssm: Any, name: str, parameter: str, backend: Any) -> str:
    """An AMI id for a baked image in moto (RegisterImage, x86_64, with infra/packer's tags), and the SSM parameter
    `parameter` holding it. moto keeps no architecture of a registered image: it is set in `backend`, moto's
    EC2 backend of the twin, as EC2 records it."""
    made = ec2.register_image(Name=name, Description="gridfleet node image (twin)", Architecture="x86_64")
    ami = str(made["ImageId"])
    ec2.create_tags(Resources=[ami], Tags=[{"Key": k, "Value": v} for k, v in IMAGE_TAGS.items()])
    backend.amis[ami].architecture = "x86_64"
    ssm.put_parameter(Name=parameter, Value=ami, Type="String", Overwrite=True)
    return ami
