"""The commands the twin puts first on an instance's PATH (its own /usr/local/sbin) in place of real ones.

`apt-get` installs nothing: `update` succeeds, `install` succeeds only for packages this machine has
already (so a boot script's install of what the image has is a no-op, as on a baked AMI) and fails like
apt for any other. `shutdown`, `poweroff`, `halt` and `reboot` only write the marker `SHUTDOWN_MARKER`,
which the twin reads to apply the instance's shutdown behaviour. `systemctl` knows `daemon-reload` and
`enable`/`start` of a unit file in /etc/systemd/system, whose ExecStart it runs (in the background with
`--no-block`), enough for the hub's template; there is no systemd in the instance. `mount.efs` stands for
amazon-efs-utils: the twin has bound the shared EFS directory over the mount point already, so it succeeds
when its target is a mount point (the node's script then finds EFS mounted and mounts nothing). `aws` (made per
instance, `aws_shim`) is the real AWS CLI on the twin's endpoint.
"""

from __future__ import annotations

import shlex

SHUTDOWN_MARKER = "/var/lib/cloud/twin/shutdown"

APT_GET = r"""#!/bin/sh
# apt-get of the twin: installs nothing; see embedded/twin/shims.py.
cmd= pkgs=
while [ $# -gt 0 ]; do
  case $1 in
    -o | -c | -t) shift; [ $# -gt 0 ] && shift; continue ;;
    -*) shift; continue ;;
  esac
  if [ -z "$cmd" ]; then cmd=$1; else pkgs="$pkgs $1"; fi
  shift
done
case $cmd in
  update | clean | autoclean) exit 0 ;;
  install)
    for p in $pkgs; do
      case $p in
        */* | *.deb) echo "E: the twin installs no package file: $p" >&2; exit 100 ;;
      esac
      [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] ||
        { echo "E: Unable to locate package $p (the twin installs nothing)" >&2; exit 100; }
    done
    exit 0 ;;
  *) echo "E: the twin's apt-get does not do: $cmd" >&2; exit 100 ;;
esac
"""

SHUTDOWN = f"""#!/bin/sh
# shutdown of the twin: writes the marker the twin reads; see embedded/twin/shims.py.
mkdir -p "$(dirname {SHUTDOWN_MARKER})"
printf '%s %s %s\\n' "$(date -u +%FT%TZ)" "$(basename "$0")" "$*" >> {SHUTDOWN_MARKER}
exit 0
"""

SYSTEMCTL = r"""#!/bin/sh
# systemctl of the twin: no systemd; see embedded/twin/shims.py.
now=0 block=1 cmd= units=
for a in "$@"; do
  case $a in
    --now) now=1 ;;
    --no-block) block=0 ;;
    -*) ;;
    *) if [ -z "$cmd" ]; then cmd=$a; else units="$units $a"; fi ;;
  esac
done
[ "$cmd" = start ] && now=1
case $cmd in
  daemon-reload) exit 0 ;;
  enable | start)
    [ $now = 1 ] || exit 0
    for u in $units; do
      f=/etc/systemd/system/$u
      exe=$(sed -n 's/^ExecStart=//p' "$f" 2>/dev/null | head -n 1)
      [ -n "$exe" ] || { echo "Failed to $cmd $u: Unit $u not found." >&2; exit 5; }
      if [ $block = 1 ]; then
        sh -c "$exe" || exit 1
      else
        setsid sh -c "$exe" >> "/var/log/$u.log" 2>&1 < /dev/null &
      fi
    done
    exit 0 ;;
  *) echo "systemctl of the twin: $cmd is not supported" >&2; exit 1 ;;
esac
"""

MOUNT_EFS = r"""#!/bin/sh
# mount.efs of the twin: EFS is bound at boot; see embedded/twin/shims.py.
mountpoint -q "$2" && exit 0
echo "mount.efs of the twin: $2 is not where the twin bound EFS" >&2
exit 32
"""


def aws_shim(endpoint: str) -> str:
    """The AWS CLI of an instance, pointed at the twin's AWS: Debian's awscli 2.9 reads no endpoint from the
    environment, so every call gets `--endpoint-url`; the rest (credentials from the instance's IMDS, the
    region, the command) is the real CLI's."""
    return f"""#!/bin/sh
# aws of the twin: the real CLI, on the twin's endpoint; see embedded/twin/shims.py.
exec /usr/bin/aws --endpoint-url {shlex.quote(endpoint)} "$@"
"""


SHIMS = {
    "apt-get": APT_GET,
    "shutdown": SHUTDOWN,
    "poweroff": SHUTDOWN,
    "halt": SHUTDOWN,
    "reboot": SHUTDOWN,
    "systemctl": SYSTEMCTL,
    "mount.efs": MOUNT_EFS,
}
