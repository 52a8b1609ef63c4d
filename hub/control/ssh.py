"""Node control over SSH (paramiko): the kill ladder's second remote rung, and whose host keys it trusts.

Nodes are ephemeral: each boot generates fresh host keys, so there is no
known_hosts the hub could pin beforehand, and blindly accepting whatever key
answers on the node's address would let anything able to intercept the hub's
traffic to that address run the session (and learn nothing harmful, but fake a
successful kill). `ConsoleHostKeys` (the default, `aws.ssh_host_keys:
console`) closes that gap with a channel the node cannot be impersonated on:
cloud-init prints the new host public keys to the serial console at boot,
between `-----BEGIN SSH HOST KEY KEYS-----` and `-----END SSH HOST KEY
KEYS-----`, and the hub reads that output through the EC2 API
(`GetConsoleOutput`), which is authenticated and answered by AWS, not by the
network path to the node. Only a key listed there is trusted; any other key
fails the connection with a detail naming the key. Writing to the console
needs root on the node itself, and whoever has that already is the node.
The cost: the keys must still be in the console buffer (the most recent 64 KB
on Nitro instances with `Latest`, or what was buffered after the last state
change otherwise); a node that has flooded its console since boot cannot be
reached by SSH, and the ladder goes on to terminate it, which is safe.

`AcceptNewHostKeys` (`aws.ssh_host_keys: accept-new`) trusts any key. It is
weaker and meant only for VPCs where the nodes' security group admits SSH
solely from the hub, so that nothing else can answer on a node's address.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Callable
from typing import Any, Protocol

import paramiko
from botocore.exceptions import ClientError

from fleet.aws import ec2 as ec2_api
from hub.control.base import KillResult
from hub.control.command import error_detail, kill_command, output_tail

HOST_KEYS_BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"
HOST_KEYS_END = "-----END SSH HOST KEY KEYS-----"


def host_keys_from_console(text: str) -> list[tuple[str, str]]:
    """(key type, base64 blob) of every host key cloud-init printed between the BEGIN/END SSH HOST KEY KEYS lines.

    Lines may carry a prefix (a timestamp, `cloud-init[...]:`) before the key,
    and blocks may repeat (one per boot); keys outside a block are ignored.
    """
    keys: list[tuple[str, str]] = []
    inside = False
    for line in text.splitlines():
        if HOST_KEYS_BEGIN in line:
            inside = True
            continue
        if HOST_KEYS_END in line:
            inside = False
            continue
        if not inside:
            continue
        tokens = line.split()
        for i, tok in enumerate(tokens[:-1]):
            if _is_key_type(tok) and _is_key_blob(tokens[i + 1], tok):
                if (tok, tokens[i + 1]) not in keys:
                    keys.append((tok, tokens[i + 1]))
                break
    return keys


def _is_key_type(token: str) -> bool:
    return token.startswith(("ssh-", "ecdsa-sha2-", "sk-ssh-", "sk-ecdsa-"))


def _is_key_blob(token: str, key_type: str) -> bool:
    """A base64 public key blob whose embedded type name is `key_type`."""
    try:
        raw = base64.b64decode(token, validate=True)
    except (binascii.Error, ValueError):
        return False
    name = key_type.encode()
    return raw[:4] == len(name).to_bytes(4, "big") and raw[4 : 4 + len(name)] == name


def console_text(output: str | None) -> str:
    """The console output as text: GetConsoleOutput returns it base64-encoded; accept plain text too."""
    if not output:
        return ""
    if HOST_KEYS_BEGIN in output:
        return output
    try:
        return base64.b64decode("".join(output.split()), validate=True).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError):
        return output


class HostKeyPolicy(Protocol):
    """Which server host keys SshControl accepts for one instance."""

    def for_instance(self, instance_id: str) -> paramiko.MissingHostKeyPolicy: ...


class _ListedKeysOnly(paramiko.MissingHostKeyPolicy):
    """Accept a server key only if it is one of the keys the instance published on its console."""

    def __init__(self, instance_id: str, load: Callable[[str], list[tuple[str, str]]]):
        self.instance_id = instance_id
        self.load = load

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        listed = self.load(self.instance_id)
        offered = key.asbytes()
        if any(base64.b64decode(blob) == offered for _, blob in listed):
            client.get_host_keys().add(hostname, key.get_name(), key)
            return
        if not listed:
            raise paramiko.SSHException(
                f"host key of {self.instance_id} cannot be verified: no SSH host keys in its EC2 console output"
            )
        raise paramiko.SSHException(
            f"host key {key.get_name()} {key.fingerprint} of {self.instance_id} at {hostname} is not among "
            f"the {len(listed)} host keys in its EC2 console output"
        )


class ConsoleHostKeys:
    """Trust the host keys an instance printed to its EC2 console output at boot (see the module docstring)."""

    def __init__(self, ec2_client: Any):
        self.ec2 = ec2_client
        self._known: dict[str, list[tuple[str, str]]] = {}

    def for_instance(self, instance_id: str) -> paramiko.MissingHostKeyPolicy:
        return _ListedKeysOnly(instance_id, self.keys_of)

    def keys_of(self, instance_id: str) -> list[tuple[str, str]]:
        """The instance's host keys from its console output (cached once found; host keys do not change)."""
        if instance_id in self._known:
            return self._known[instance_id]
        keys: list[tuple[str, str]] = []
        # The live serial console first (Nitro instances only), then what EC2 buffered after the instance's
        # last state change, which also holds the boot messages.
        for latest in (True, False):
            try:
                output = ec2_api.console_output(self.ec2, instance_id, latest=latest)
            except ClientError:
                continue
            keys = host_keys_from_console(console_text(output))
            if keys:
                self._known[instance_id] = keys
                break
        return keys


class AcceptNewHostKeys:
    """Trust whatever host key the node presents. Weaker: only where nothing but the node can answer on its address."""

    def for_instance(self, instance_id: str) -> paramiko.MissingHostKeyPolicy:
        return paramiko.AutoAddPolicy()


def host_key_policy(kind: str, ec2_client: Any) -> HostKeyPolicy:
    """The policy for `aws.ssh_host_keys` ("console" or "accept-new")."""
    if kind == "console":
        return ConsoleHostKeys(ec2_client)
    if kind == "accept-new":
        return AcceptNewHostKeys()
    raise ValueError(f"unknown ssh_host_keys policy {kind!r}")


class SshControl:
    """Kill by running the command over SSH (paramiko) on the node's private address."""

    path = "ssh"

    def __init__(
        self,
        address_of: Callable[[str], str | None],
        *,
        user: str,
        key_path: str,
        host_keys: HostKeyPolicy,
        port: int = 22,
        timeout_s: float = 20.0,
        command: Callable[[str, int], str] = kill_command,
    ):
        self.address_of = address_of
        self.user = user
        self.key_path = key_path
        self.host_keys = host_keys
        self.port = port
        self.timeout_s = timeout_s
        self.command = command

    def kill(self, instance_id: str, site: str, attempt: int) -> KillResult:
        try:
            address = self.address_of(instance_id)
        except Exception as e:
            return KillResult(False, self.path, f"no address: {error_detail(e)}")
        if not address:
            return KillResult(False, self.path, "no address")
        client = paramiko.SSHClient()
        try:
            key = paramiko.PKey.from_path(self.key_path)
            client.set_missing_host_key_policy(self.host_keys.for_instance(instance_id))
            client.connect(
                address,
                port=self.port,
                username=self.user,
                pkey=key,
                look_for_keys=False,
                allow_agent=False,
                timeout=self.timeout_s,
                banner_timeout=self.timeout_s,
                auth_timeout=self.timeout_s,
                channel_timeout=self.timeout_s,
            )
            status, out, err = self._run(client, self.command(site, attempt))
        except Exception as e:  # paramiko and socket errors, a bad key file: this rung failed, never raise
            return KillResult(False, self.path, f"{type(e).__name__}: {e}")
        finally:
            client.close()
        if status == 0:
            return KillResult(True, self.path, output_tail(out) or "exit status 0")
        shown = output_tail(err) or output_tail(out) or "no output"
        return KillResult(False, self.path, f"exit status {status}: {shown}")

    def _run(self, client: paramiko.SSHClient, command: str) -> tuple[int, bytes, bytes]:
        """Run `command`, collecting its output, within timeout_s; return (exit status, stdout, stderr)."""
        transport = client.get_transport()
        if transport is None:
            raise paramiko.SSHException("not connected")
        chan = transport.open_session(timeout=self.timeout_s)
        try:
            chan.settimeout(self.timeout_s)
            chan.exec_command(command)
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + self.timeout_s
            while True:
                busy = False
                if chan.recv_ready():
                    out += chan.recv(65536)
                    busy = True
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    busy = True
                if busy:
                    continue
                if chan.exit_status_ready():
                    return chan.recv_exit_status(), bytes(out), bytes(err)
                if chan.closed or time.monotonic() >= deadline:
                    raise TimeoutError(f"command did not finish within {self.timeout_s:g}s")
                time.sleep(0.02)
        finally:
            chan.close()


def private_address(ec2_client: Any) -> Callable[[str], str | None]:
    """`address_of` for SshControl: the instance's private IPv4 by DescribeInstances (None if it has none)."""

    def address_of(instance_id: str) -> str | None:
        found = [i for i in ec2_api.describe_ids(ec2_client, [instance_id]) if i.id == instance_id]
        return found[0].private_ip if found else None

    return address_of
