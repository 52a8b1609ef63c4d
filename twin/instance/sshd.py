"""A real OpenSSH server in a twin instance, and the instance's console in moto.

`start_sshd(box, authorized_key, user=...)` does inside the instance what an AMI's sshd does: it uses the host
keys cloud-init's `ssh` module made at the instance's first boot (the guest runs that module: fresh rsa, ecdsa
and ed25519 keys, waited for here), lets `authorized_key` log in as `user` (created when missing, with a
passwordless sudoers line as an AMI's default user has; it counts where sudo is installed), and starts `sshd`
on the instance's address, port 22, with password login off. The host keys reach the console only when
cloud-init's `keys_to_console` module runs, after the user-data's runcmd script has ended (the guest runs the
final stage in Debian's order), not when sshd starts. Everything it writes it writes from inside the instance
(never through a path on the host's side). Differences from an instance: the authorized keys live in
/etc/ssh/authorized_keys/<user> (the instance's private /etc) rather than in a home directory, since /home is
the host's; a created user has no home directory; sshd logs to /var/log/sshd.log; it needs /run/sshd, its
privilege-separation directory, which is the host's /run (created there when missing, as openssh-server itself
would).

moto answers GetConsoleOutput with one fixed text for every instance. `publish_console(ec2_backend,
instance_id, text)` makes it answer with the twin's console text for that instance (base64 of the last 64
KB, as EC2 does); `_install_console_output` is the one patch of moto this needs, installed once on moto's
response class, and any other instance keeps moto's text.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any, Protocol

from twin.instance.cloud_config import TwinError

HOST_KEYS_BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"
HOST_KEYS_END = "-----END SSH HOST KEY KEYS-----"
SSHD = "/usr/sbin/sshd"
CONFIG = "/etc/ssh/sshd_config.twin"
AUTHORIZED_DIR = "/etc/ssh/authorized_keys"
LOG = "/var/log/sshd.log"
CONSOLE_LIMIT = 64 * 1024  # GetConsoleOutput returns at most the last 64 KB
_USER_RE = r"[a-z_][a-z0-9_-]{0,31}"
KEY_TYPES = ("rsa", "ecdsa", "ed25519")  # the host keys cloud-init generates by default


class Instance(Protocol):
    """What `start_sshd` needs of an `InstanceSandbox`."""

    @property
    def address(self) -> str | None: ...

    @property
    def console(self) -> Path: ...

    def run(self, argv: list[str], timeout_s: float = ...) -> subprocess.CompletedProcess[str]: ...

    def host_path(self, guest_path: str) -> Path | None: ...


def _config(address: str, key_files: list[str]) -> str:
    lines = [f"ListenAddress {address}", "Port 22"] + [f"HostKey {k}" for k in key_files]
    lines += [
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "PermitRootLogin prohibit-password",
        f"AuthorizedKeysFile {AUTHORIZED_DIR}/%u",
        "UsePAM no",
        "PidFile none",
        "X11Forwarding no",
        "AllowTcpForwarding no",
    ]
    return "\n".join(lines) + "\n"


def _run(box: Instance, script: str, what: str, *args: str, timeout_s: float = 60.0) -> str:
    """`sh -ec script` inside the instance with `args` as $1...: what it writes, it writes as the instance (never
    through a link the instance could have set on the host's side)."""
    out = box.run(["sh", "-ec", script, "sh", *args], timeout_s=timeout_s)
    if out.returncode != 0:
        raise TwinError(f"{what}: {(out.stderr or out.stdout).strip() or out.returncode}")
    return out.stdout


_NEW_USER = """id -u "$1" >/dev/null 2>&1 || useradd -M -s /bin/bash "$1"
usermod -p '*' "$1"
mkdir -p /etc/sudoers.d
printf '%s ALL=(ALL) NOPASSWD:ALL\\n' "$1" > "/etc/sudoers.d/90-$1"
chmod 0440 "/etc/sudoers.d/90-$1"
"""  # '*', not '!': a locked password ('!') locks the account for key logins too


def authorize(box: Instance, user: str, authorized_key: str) -> None:
    """Let `authorized_key` (one OpenSSH public key line) log in to the instance as `user`, created when missing."""
    key_line = authorized_key.strip()
    if len(key_line.split()) < 2 or "\n" in key_line:
        raise TwinError("authorized_key is not one OpenSSH public key line")
    if not re.fullmatch(_USER_RE, user):
        raise TwinError(f"ssh user {user!r} is not a user name")
    if user != "root":
        _run(box, _NEW_USER, f"user {user}", user)
    target = f'"{AUTHORIZED_DIR}/$1"'
    script = f"install -d -m 0755 {AUTHORIZED_DIR}\nprintf '%s\\n' \"$2\" > {target}\nchmod 0644 {target}"
    _run(box, script, f"authorized key of {user}", user, key_line)


def start_sshd(box: Instance, authorized_key: str, *, user: str = "root", timeout_s: float = 30.0) -> list[str]:
    """Start sshd in the instance as described in the module docstring; the host keys, `<type> <base64>` each."""
    if not box.address:
        raise TwinError("the instance has no address: start it first")
    authorize(box, user, authorized_key)
    files = [f"/etc/ssh/ssh_host_{t}_key.pub" for t in KEY_TYPES]
    wait = (
        'i=0; until [ -s "$1" ] && [ -s "$2" ] && [ -s "$3" ]; do i=$((i+1)); [ $i -lt 300 ] || exit 1; sleep 0.1; done'
    )
    _run(box, wait, "cloud-init's host keys (30 s)", *files)  # the guest's `ssh` module makes them at boot
    pubs = _run(box, " ".join(["cat"] + files), "host keys")
    host_keys = [" ".join(line.split()[:2]) for line in pubs.splitlines() if line.strip()]
    config = _config(box.address, [f"/etc/ssh/ssh_host_{t}_key" for t in KEY_TYPES])
    _run(box, 'printf %s "$2" > "$1"', "sshd config", CONFIG, config)
    _run(box, f"install -d -m 0755 /run/sshd\n{SSHD} -t -f {CONFIG}", "sshd -t")
    _run(box, f"{SSHD} -f {CONFIG} -E {LOG}", "sshd")
    _wait_listening(box, 22, timeout_s)
    return host_keys


#: Connects to the address and port given until it answers, for up to the seconds given; else exits with the error.
_LISTENING = """import socket, sys, time
address, port, timeout_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + timeout_s
while True:
    try:
        socket.create_connection((address, port), timeout=1).close()
        break
    except OSError as e:
        if time.monotonic() >= deadline:
            sys.exit(str(e))
    time.sleep(0.05)  # sshd binds its socket a moment after it daemonizes
"""


def _wait_listening(box: Instance, port: int, timeout_s: float) -> None:
    """Wait for sshd from inside the instance: its own address is reached over its loopback, which no security
    group filters. From the host, the instance's groups drop it (on AWS, only the hub reaches a node's 22)."""
    address = str(box.address)
    out = box.run(["python3", "-I", "-c", _LISTENING, address, str(port), str(timeout_s)], timeout_s=timeout_s + 30)
    if out.returncode != 0:
        raise TwinError(f"sshd does not answer on {address}:{port} after {timeout_s:g}s: {out.stderr.strip()}")


# --- GetConsoleOutput ------------------------------------------------------------------------------
_CONSOLE_ATTR = "twin_console_output"


def publish_console(ec2_backend: Any, instance_id: str, text: str) -> None:
    """Make moto's GetConsoleOutput of `instance_id` return `text` (its last 64 KB) from now on."""
    _install_console_output()
    instance = ec2_backend.get_instance(instance_id)
    data = text.encode("utf-8", errors="replace")[-CONSOLE_LIMIT:]
    setattr(instance, _CONSOLE_ATTR, data.decode("utf-8", errors="ignore"))


def publish_instance_console(ec2_backend: Any, instance_id: str, box: Instance) -> None:
    """`publish_console` with the instance's console as the twin has it now."""
    publish_console(ec2_backend, instance_id, box.console.read_text(errors="replace"))


def _install_console_output() -> None:
    from moto.ec2.responses.general import General

    if getattr(General.get_console_output, "_twin", False):
        return
    moto_own = General.get_console_output

    def get_console_output(self: Any) -> Any:
        from moto.core.responses import ActionResult
        from moto.core.types import Base64EncodedString
        from moto.core.utils import utcnow

        instance = self.ec2_backend.get_instance(self._get_param("InstanceId"))
        text = getattr(instance, _CONSOLE_ATTR, None)
        if text is None:
            return moto_own(self)
        output = Base64EncodedString.from_raw_string(text)
        return ActionResult({"InstanceId": instance.id, "Timestamp": utcnow(), "Output": output})

    get_console_output._twin = True  # type: ignore[attr-defined]
    General.get_console_output = get_console_output  # type: ignore[method-assign]
