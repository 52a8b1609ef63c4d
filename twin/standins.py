"""Packages of the twin's own that stand for the two an instance installs from outside Debian.

A Debian 12 AMI has neither Amazon's SSM agent nor amazon-efs-utils, and Debian packages neither. On AWS the
boot scripts install the agent from the region's own agent package in S3 and amazon-efs-utils from a .deb the
operator built (or both are baked into the node image). The twin cannot run either for real, so it builds a
small real Debian package of the same name for each (`dpkg-deb`), which the same boot steps fetch and install
with the same commands; dpkg installs them into the instance's own overlaid /usr and /var/lib/dpkg:

- `amazon-ssm-agent` (amd64 and arm64, at `s3://amazon-ssm-<region>/latest/debian_<arch>/amazon-ssm-agent.deb` in
  the twin's S3, as AWS publishes the real one): a service (`amazon-ssm-agent.service`) whose program records
  its pid in the instance and sleeps. The twin's SSM delivers commands only to instances where it runs.
- `amazon-efs-utils` (amd64): `mount.efs`, which mount(8) calls for `mount -t efs`. It mounts the twin's shared
  EFS directory (bound at `EFS_SHARE` in every instance) over the target, for a file system id the twin's EFS has
  and an access point of it (`EFS_IDS`, written per instance), and fails as the real helper does otherwise.

Without them an instance has no agent (SendCommand answers InvalidInstanceId, as AWS does) and no mount helper
(`mount -t efs` fails: unknown filesystem type), which is what the twin must show.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

SSM_AGENT = "amazon-ssm-agent"
EFS_UTILS = "amazon-efs-utils"
#: Where the stand-in agent says it runs (the instance's own /var/lib/cloud: a baked image does not carry it).
AGENT_PID_FILE = "/var/lib/cloud/twin/ssm-agent.pid"
#: The shared EFS directory inside every instance, which the stand-in mount.efs binds over its target.
EFS_SHARE = "/var/lib/cloud/twin/efs"
#: The EFS file system ids the twin's AWS has, one a line, and its access points (`fsap-... fs-...`), written into
#: each instance at its boot.
EFS_IDS = "/var/lib/cloud/twin/efs-ids"
VERSION = "0.0.0+twin1"

_AGENT = f"""#!/bin/sh
# amazon-ssm-agent of the EC2 twin: it stands for Amazon's agent. The twin delivers SSM commands to an instance
# only while this runs (it says so in {AGENT_PID_FILE}).
mkdir -p "$(dirname {AGENT_PID_FILE})"
echo $$ > {AGENT_PID_FILE}
exec sleep infinity
"""

_AGENT_UNIT = """[Unit]
Description=amazon-ssm-agent (the EC2 twin's stand-in)
After=network-online.target

[Service]
Type=simple
ExecStart=/usr/bin/amazon-ssm-agent
Restart=always

[Install]
WantedBy=multi-user.target
"""

_MOUNT_EFS = f"""#!/bin/sh
# mount.efs of the EC2 twin (amazon-efs-utils stand-in): mount(8) runs it as `mount.efs FS_ID:/ TARGET -o OPTS`.
# It binds the twin's shared EFS directory over TARGET when the twin's AWS has FS_ID, and the access point
# `-o accesspoint=FSAP` names, when one does, is one of FS_ID's.
spec=$1 target=$2
fs=${{spec%%:*}}
case $fs in fs-*) ;; *) echo "mount.efs: $spec is not a file system id" >&2; exit 32 ;; esac
grep -qx "$fs" {EFS_IDS} 2>/dev/null || {{ echo "mount.efs: Failed to resolve $fs: no such file system" >&2; exit 32; }}
ap=$(printf '%s' "$*" | sed -n 's/.*accesspoint=\\(fsap-[0-9a-f]*\\).*/\\1/p')
if [ -n "$ap" ] && ! grep -qx "$ap $fs" {EFS_IDS}; then
  echo "mount.efs: access point $ap is not one of $fs's" >&2; exit 32
fi
[ -d "$target" ] || {{ echo "mount.efs: $target is not a directory" >&2; exit 32; }}
exec mount --bind {EFS_SHARE} "$target"
"""


def _build(out: Path, package: str, arch: str, files: dict[str, tuple[str, int]], depends: str = "") -> Path:
    """A Debian package `out` holding `files` (path -> (text, mode)), built with dpkg-deb."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for path, (text, mode) in files.items():
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            target.chmod(mode)
        control = [
            f"Package: {package}",
            f"Version: {VERSION}",
            f"Architecture: {arch}",
            "Maintainer: gridfleet <gridfleet@localhost>",
            "Description: the EC2 twin's stand-in for " + package,
        ]
        if depends:
            control.insert(3, f"Depends: {depends}")
        (root / "DEBIAN").mkdir()
        (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)],
            check=True,
            capture_output=True,
            timeout=60,
        )
    return out


def ssm_agent_deb(out_dir: Path, arch: str = "amd64") -> Path:
    files = {"/usr/bin/amazon-ssm-agent": (_AGENT, 0o755), "/usr/lib/systemd/system/amazon-ssm-agent.service": (
        _AGENT_UNIT, 0o644)}  # fmt: skip
    return _build(out_dir / f"{SSM_AGENT}_{arch}.deb", SSM_AGENT, arch, files)


def efs_utils_deb(out_dir: Path) -> Path:
    files = {"/usr/sbin/mount.efs": (_MOUNT_EFS, 0o755)}
    return _build(out_dir / f"{EFS_UTILS}_amd64.deb", EFS_UTILS, "amd64", files, depends="nfs-common")


def agent_key(arch: str) -> str:
    """The key of the agent's package in its region's bucket, as AWS publishes it."""
    return f"latest/debian_{arch}/amazon-ssm-agent.deb"


def agent_bucket(region: str) -> str:
    return f"amazon-ssm-{region}"


def publish_ssm_agent(s3: object, region: str, out_dir: Path) -> list[str]:
    """The stand-in agent's packages in the twin's S3, where the boot scripts fetch the real one; their URLs."""
    bucket = agent_bucket(region)
    create = {"Bucket": bucket}
    if region != "us-east-1":
        create["CreateBucketConfiguration"] = {"LocationConstraint": region}  # type: ignore[assignment]
    s3.create_bucket(**create)  # type: ignore[attr-defined]
    urls = []
    for arch in ("amd64", "arm64"):
        deb, public = str(ssm_agent_deb(out_dir, arch)), {"ACL": "public-read"}  # AWS's is read anonymously
        s3.upload_file(deb, bucket, agent_key(arch), ExtraArgs=public)  # type: ignore[attr-defined]
        urls.append(f"s3://{bucket}/{agent_key(arch)}")
    return urls
