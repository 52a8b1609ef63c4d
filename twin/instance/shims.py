"""The commands the twin puts first on an instance's PATH (its own /usr/local/sbin) in place of real ones.

`apt-get` installs nothing from the network: Debian 12's own packages that this machine has are there already
(as on a baked image), a name Debian does not have fails as apt fails, and a package file (`./x.deb`) is
installed by the real dpkg into the instance's own overlaid /usr and /var/lib/dpkg (`twin.instance.debian`).
`shutdown`, `poweroff`, `halt` and `reboot` only write the marker `SHUTDOWN_MARKER`, which the twin reads to
apply the instance's shutdown behaviour. `systemctl` (there is no systemd in an instance) knows
`daemon-reload`, and `enable --now` / `start` of a unit file in /etc/systemd/system, /usr/lib/systemd/system or
/lib/systemd/system: it runs the unit's ExecStart (in the background with `--no-block`, or for any unit that is
not `Type=oneshot`), its output to the unit's `StandardOutput=append:`/`file:` path (else /var/log/<unit>.log),
then its ExecStopPost with systemd's SERVICE_RESULT and EXIT_STATUS; a service inherits the environment of the
command that started it, and is not restarted. `aws` (made per instance, `aws_shim`) is the real AWS CLI on
the twin's endpoint. There is no `mount.efs`: an instance has one only once it installed amazon-efs-utils.
"""

from __future__ import annotations

import shlex

from twin.instance.debian import apt_get_shim

SHUTDOWN_MARKER = "/var/lib/cloud/twin/shutdown"

SHUTDOWN = f"""#!/bin/sh
# shutdown of the twin: writes the marker the twin reads; see twin/instance/shims.py.
mkdir -p "$(dirname {SHUTDOWN_MARKER})"
printf '%s %s %s\\n' "$(date -u +%FT%TZ)" "$(basename "$0")" "$*" >> {SHUTDOWN_MARKER}
exit 0
"""

SYSTEMCTL = r"""#!/bin/sh
# systemctl of the twin: no systemd; see twin/instance/shims.py.
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
unit_file() {
  for d in /etc/systemd/system /usr/lib/systemd/system /lib/systemd/system; do
    [ -f "$d/$1" ] && { echo "$d/$1"; return 0; }
  done
  return 1
}
key() { sed -n "s/^$1=//p" "$2" | head -n 1; }
case $cmd in
  daemon-reload) exit 0 ;;
  enable | start)
    [ $now = 1 ] || exit 0
    for u in $units; do
      case $u in *.*) ;; *) u=$u.service ;; esac
      f=$(unit_file "$u") || { echo "Failed to $cmd $u: Unit $u not found." >&2; exit 5; }
      exe=$(key ExecStart "$f") post=$(key ExecStopPost "$f") out=$(key StandardOutput "$f")
      [ -n "$exe" ] || { echo "Failed to $cmd $u: no ExecStart" >&2; exit 5; }
      case $out in append:* | file:*) log=${out#*:} ;; *) log=/var/log/$u.log ;; esac
      run='sh -c "$1" >>"$3" 2>&1; rc=$?
           [ $rc = 0 ] && r=success || r=exit-code
           [ -z "$2" ] || SERVICE_RESULT=$r EXIT_CODE=exited EXIT_STATUS=$rc sh -c "$2" >>"$3" 2>&1
           exit $rc'
      if [ $block = 1 ] && [ "$(key Type "$f")" = oneshot ]; then
        sh -c "$run" "$u" "$exe" "$post" "$log" || exit 1
      else
        setsid sh -c "$run" "$u" "$exe" "$post" "$log" </dev/null >/dev/null 2>&1 &
      fi
    done
    exit 0 ;;
  *) echo "systemctl of the twin: $cmd is not supported" >&2; exit 1 ;;
esac
"""


def shutdown_delay(said: str) -> float | None:
    """How long after it was asked a shutdown takes, by the last line `SHUTDOWN` wrote (`said`), as systemd's
    `shutdown` reads its time: `now` at once, `+MINUTES`, none (or a time of the clock, which the twin does not
    wait for) a minute; `poweroff`, `halt`, `reboot` at once; None when nothing is asked, or the last request was
    `shutdown -c` (cancelled)."""
    lines = said.strip().splitlines()
    words = lines[-1].split()[1:] if lines else []  # the last request: its command, then its arguments
    if not words:
        return None
    if words[0] != "shutdown":
        return 0.0
    if "-c" in words[1:]:
        return None
    when = next((w for w in words[1:] if w == "now" or w.startswith("+") or ":" in w), None)
    if when == "now":
        return 0.0
    if when is not None and when.startswith("+") and when[1:].isdigit():
        return 60.0 * int(when[1:])
    return 60.0


def aws_shim(endpoint: str) -> str:
    """The AWS CLI of an instance, pointed at the twin's AWS: Debian's awscli 2.9 reads no endpoint from the
    environment, so every call gets `--endpoint-url`; the rest (credentials from the instance's IMDS, the
    region, the command) is the real CLI's."""
    return f"""#!/bin/sh
# aws of the twin: the real CLI, on the twin's endpoint; see twin/instance/shims.py.
exec /usr/bin/aws --endpoint-url {shlex.quote(endpoint)} "$@"
"""


SHIMS = {
    "apt-get": apt_get_shim(),
    "shutdown": SHUTDOWN,
    "poweroff": SHUTDOWN,
    "halt": SHUTDOWN,
    "reboot": SHUTDOWN,
    "systemctl": SYSTEMCTL,
}
