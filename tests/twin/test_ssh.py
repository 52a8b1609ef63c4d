"""The hub's SSH rung (paramiko) against a real OpenSSH sshd inside a booted twin instance, trusting only the
host keys cloud-init printed to its console (once its runcmd ended), read back through a real moto server's
GetConsoleOutput.
Root only (see conftest); one instance for the module. Nothing is faked (the node's kill command in the
instance is this checkout's, through a launcher at the node's path: node_kill.py)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import boto3
import pytest

from hub.control.ssh import SshControl, host_key_policy, host_keys_from_console
from tests.twin.node_kill import install_gridfleet, running, start_crawl
from twin.instance import network
from twin.instance.sshd import (
    CONFIG,
    HOST_KEYS_BEGIN,
    HOST_KEYS_END,
    SSHD,
    authorize,
    publish_console,
    publish_instance_console,
    start_sshd,
)

ACCOUNT, REGION = "123456789012", "us-east-1"
STAY_UP = '#cloud-config\nruncmd:\n  - "true"\n'
STATE = "/var/lib/gridfleet"


def keygen(directory: Path, name: str) -> Path:
    path = directory / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30)
    return path


@pytest.fixture(scope="module")
def twin(twin_ok):
    """A moto server on the bridge; an instance moto launched, booted in the twin, with sshd; the hub's key."""
    from moto.ec2.models import ec2_backends
    from moto.server import ThreadedMotoServer

    from twin.instance.sandbox import InstanceSandbox

    network.ensure_bridge()
    server = ThreadedMotoServer(ip_address=network.HOST_ADDRESS, port=0, verbose=False)
    server.start()
    root = Path(tempfile.mkdtemp(prefix="gridfleet-twin-ssh-"))
    box = None
    try:
        kw = {"region_name": REGION, "aws_access_key_id": "t", "aws_secret_access_key": "t"}
        ec2 = boto3.client("ec2", endpoint_url="http://{}:{}".format(*server.get_host_and_port()), **kw)
        ids = [i["InstanceId"] for i in ec2.run_instances(ImageId="ami-12c6146b", MinCount=2, MaxCount=2)["Instances"]]
        box = InstanceSandbox(ids[0], STAY_UP, root / "twin").start()
        assert box.wait_boot(30).exit_code == 0
        key = keygen(root, "hub_key")
        host_keys = start_sshd(box, (root / "hub_key.pub").read_text(), user="root")
        publish_instance_console(ec2_backends[ACCOUNT][REGION], box.instance_id, box)
        yield {"box": box, "ec2": ec2, "key": str(key), "host_keys": host_keys, "other_id": ids[1], "root": root}
    finally:
        if box is not None:
            box.stop()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def ssh(t, command: str, *, user: str = "root", address_of=None) -> SshControl:
    return SshControl(
        address_of or (lambda i: t["box"].address),
        user=user,
        key_path=t["key"],
        host_keys=host_key_policy("console", t["ec2"]),
        timeout_s=10,
        command=lambda site, attempt: command,
    )


def test_host_keys_reach_the_console_and_get_console_output(twin):
    console = twin["box"].console.read_text()
    assert HOST_KEYS_BEGIN in console and HOST_KEYS_END in console
    types = {k.split()[0] for k in twin["host_keys"]}
    assert {"ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa"} <= types
    policy = host_key_policy("console", twin["ec2"])
    assert sorted(" ".join(k) for k in policy.keys_of(twin["box"].instance_id)) == sorted(twin["host_keys"])
    other = twin["ec2"].get_console_output(InstanceId=twin["other_id"])["Output"]
    assert host_keys_from_console(other) == []  # an instance the twin has no console for keeps moto's text


def test_the_nodes_kill_command_runs_over_ssh_when_the_host_key_is_on_the_console(twin):
    box = twin["box"]
    install_gridfleet(box)
    pid = start_crawl(box, "example.org", 1)
    assert running(box, pid)
    ladder = SshControl(
        lambda i: box.address, user="root", key_path=twin["key"], host_keys=host_key_policy("console", twin["ec2"])
    )  # the hub's own kill command
    result = ladder.kill(box.instance_id, "example.org", 1)
    assert (result.ok, result.path, result.detail) == (True, "ssh", f"ok: killed process group {pid}")
    assert not running(box, pid)


def test_a_host_key_not_on_the_console_is_refused(twin):
    from moto.ec2.models import ec2_backends

    box, root = twin["box"], twin["root"]
    keygen(root, "stranger")
    blob = " ".join((root / "stranger.pub").read_text().split()[:2])
    publish_console(ec2_backends[ACCOUNT][REGION], twin["other_id"], f"{HOST_KEYS_BEGIN}\n{blob}\n{HOST_KEYS_END}\n")
    # the other instance's console lists a key this sshd does not have: whoever answers on the address is refused
    result = ssh(twin, f"touch {STATE}/ran", address_of=lambda i: box.address).kill(twin["other_id"], "example.org", 1)
    assert not result.ok and "is not among the 1 host keys in its EC2 console output" in result.detail
    assert not box.host_path(f"{STATE}/ran").exists()


def test_a_named_user_is_created_and_passwords_are_off(twin):
    box = twin["box"]
    authorize(box, "crawl-admin", (twin["root"] / "hub_key.pub").read_text())
    result = ssh(twin, "id -un", user="crawl-admin").kill(box.instance_id, "example.org", 1)
    assert (result.ok, result.detail) == (True, "crawl-admin")
    assert not Path("/etc/ssh/authorized_keys/crawl-admin").exists()  # the instance's /etc, not the host's
    effective = box.run([SSHD, "-T", "-f", CONFIG]).stdout
    assert "passwordauthentication no" in effective and f"listenaddress {box.address}:22" in effective
