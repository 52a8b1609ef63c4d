"""A real OpenSSH server on 127.0.0.1 for the SSH kill path: its own host key, config and authorized key.

Tests run as root, so the server logs the client in as root with the client
key only (no password, no PAM) and runs commands with the test's filesystem.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleet import procs

SSHD = Path("/usr/sbin/sshd")
SSH_KEYGEN = "ssh-keygen"
PRIVSEP_DIR = Path("/run/sshd")


def keygen(path: Path, key_type: str = "ed25519") -> tuple[str, str]:
    """Make a key pair without passphrase at `path`; return its public key as (type, base64)."""
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", key_type, "-N", "", "-C", path.name, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    kind, blob = (path.parent / (path.name + ".pub")).read_text().split()[:2]
    return kind, blob


@dataclass
class Sshd:
    port: int
    host_key: tuple[str, str]  # (type, base64) of the server's host public key
    client_key: Path  # private key the server accepts for root
    log: Path
    proc: subprocess.Popen

    def stop(self, grace_s: float = 3.0) -> None:
        # Let the per-connection processes finish first, so none is orphaned by the listener's exit.
        end = time.monotonic() + grace_s
        while any(p.ppid == self.proc.pid for p in procs.scan()) and time.monotonic() < end:
            time.sleep(0.05)
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)


def start_sshd(workdir: Path, timeout: float = 10.0) -> Sshd:
    """Start `sshd -D` on a free port of 127.0.0.1 with everything under `workdir`; wait until it accepts."""
    if not SSHD.exists():
        pytest.fail(f"{SSHD} is missing: run `make setup` (it installs openssh-server)")
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    host_key = keygen(workdir / "hostkey")
    keygen(workdir / "client")
    authorized = workdir / "authorized_keys"
    authorized.write_text((workdir / "client.pub").read_text())
    port = procs.free_port()
    config = workdir / "sshd_config"
    config.write_text(
        "\n".join(
            [
                "ListenAddress 127.0.0.1",
                f"Port {port}",
                f"HostKey {workdir / 'hostkey'}",
                f"PidFile {workdir / 'sshd.pid'}",
                f"AuthorizedKeysFile {authorized}",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "PermitRootLogin prohibit-password",
                "LogLevel VERBOSE",
                "",
            ]
        )
    )
    log = workdir / "sshd.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Sshd(port, host_key, workdir / "client", log, proc)
    end = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"sshd exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return server
        except OSError:
            pass
        if time.monotonic() >= end:
            server.stop()
            pytest.fail(
                f"sshd did not accept connections on 127.0.0.1:{port} within {timeout}s: {log.read_text()[-2000:]}"
            )
        time.sleep(0.02)
