"""Packages of the twin's own that stand for the two an instance installs from outside Debian.

A Debian 12 AMI has neither Amazon's SSM agent nor amazon-efs-utils, and Debian packages neither. On AWS the
boot scripts install the agent from the region's own agent package in S3 and amazon-efs-utils from a .deb the
operator built (or both are baked into the node image). The twin cannot run either for real, so it builds a
small real Debian package of the same name for each (`dpkg-deb`), which the same boot steps fetch and install
with the same commands; dpkg installs them into the instance's own overlaid /usr and /var/lib/dpkg:

- `amazon-ssm-agent` (amd64 and arm64, at `s3://amazon-ssm-<region>/latest/debian_<arch>/amazon-ssm-agent.deb` in
  the twin's S3, as AWS publishes the real one): a service (`amazon-ssm-agent.service`) whose program records
  its pid in the instance and sleeps. The twin's SSM delivers commands only to instances where it runs.
- `amazon-efs-utils` (amd64): `mount.efs`, which mount(8) calls for `mount -t efs`. For a file system id the
  twin's EFS has (`EFS_IDS`, written per instance at its boot) it binds over the target the twin's shared EFS
  directory (bound at `EFS_SHARE` in every instance, root's alone, as an NFS server's export is no client's),
  or with an access point that directory's subdirectory the access point is rooted at, as the twin's EFS (moto)
  describes it at the mount, so an access point the hub made after the instance booted mounts too: made, when
  missing, with the access point's owner and mode, and entered only if its POSIX user may. It fails as the real
  helper does otherwise (another file system's access point, an unknown one).

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
#: The shared EFS directory inside every instance, which the stand-in mount.efs binds (or a directory of it) over its
#: target; root's alone (0700), as the NFS server's tree is no process's on a node.
EFS_SHARE = "/var/lib/cloud/twin/efs"
#: The EFS file system ids the twin's AWS has, one a line, and its access points (`fsap-... fs-...`), written into
#: each instance at its boot (the stand-in asks the twin's EFS for an access point's root).
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
# For a file system id the twin's AWS has, it binds over TARGET the twin's shared EFS directory, or, with
# `-o accesspoint=FSAP`, that access point's root directory in it, as the twin's EFS describes the access point
# (on AWS what the file system knows, not the node: moto checks no IAM). A missing root directory is made as EFS
# makes it, with the access point's creation info; the access point's POSIX user must be able to enter it.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin  # mount(8) passes no PATH on
spec=$1 target=$2
fs=${{spec%%:*}}
case $fs in fs-*) ;; *) echo "mount.efs: $spec is not a file system id" >&2; exit 32 ;; esac
grep -qx "$fs" {EFS_IDS} 2>/dev/null || {{ echo "mount.efs: Failed to resolve $fs: no such file system" >&2; exit 32; }}
[ -d "$target" ] || {{ echo "mount.efs: $target is not a directory" >&2; exit 32; }}
ap=$(printf '%s' "$*" | sed -n 's/.*accesspoint=\\(fsap-[0-9a-f]*\\).*/\\1/p')
[ -n "$ap" ] || exec mount --bind {EFS_SHARE} "$target"
imds() {{
  t=$(curl -sf -m 5 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' http://169.254.169.254/latest/api/token) &&
    curl -sf -m 5 -H "X-aws-ec2-metadata-token: $t" "http://169.254.169.254/latest/meta-data/$1"
}}
region=${{AWS_DEFAULT_REGION:-$(imds placement/region)}}
query='AccessPoints[0].[FileSystemId,RootDirectory.Path,PosixUser.Uid,PosixUser.Gid'
query="$query,RootDirectory.CreationInfo.OwnerUid,RootDirectory.CreationInfo.OwnerGid,RootDirectory.CreationInfo.Permissions]"
# the file system's own answer, not the node's: asked with the twin's keys, whatever credentials the instance has
if ! info=$(env -u AWS_SESSION_TOKEN AWS_ACCESS_KEY_ID=twin-efs AWS_SECRET_ACCESS_KEY=twin-efs \\
  aws efs describe-access-points --region "$region" --access-point-id "$ap" --output text \\
  --query "$query" 2>&1); then
  echo "mount.efs: access point $ap is not one of $fs's ($(printf '%s' "$info" | tail -n 1))" >&2; exit 32
fi
# shellcheck disable=SC2086  # the answer's words, one a field
set -- $info
if [ "${{1:-}}" != "$fs" ]; then echo "mount.efs: access point $ap is not one of $fs's" >&2; exit 32; fi
path=$2 uid=$3 gid=$4 owner=$5 group=$6 mode=$7
root={EFS_SHARE}$path
if [ ! -d "$root" ]; then
  if [ "$owner" = None ]; then
    echo "mount.nfs4: mounting $spec failed, reason given by server: No such file or directory" >&2; exit 32
  fi
  d={EFS_SHARE}
  for part in $(printf '%s' "$path" | tr / ' '); do
    d=$d/$part
    [ -d "$d" ] || {{ mkdir "$d" && chown "$owner:$group" "$d" && chmod "$mode" "$d"; }} || exit 32
  done
fi
mount --bind "$root" "$target" || exit 32
# EFS judges the access point's root by its POSIX user alone, not by the directories above it: asked at the mount
# (an access point without one lets the client's own user through, root here)
if [ "$uid" != None ] &&
  ! setpriv --reuid="$uid" --regid="$gid" --clear-groups test -r "$target" -a -w "$target" -a -x "$target"; then
  umount "$target"
  echo "mount.nfs4: access denied by server while mounting $spec" >&2; exit 32
fi
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
