"""Node control on EC2: SSM SendCommand first, SSH second (the hub terminates the node if both fail).

Both rungs run the same command on the node (`hub.control.command`), so a kill that arrives late, or twice,
never touches the next crawl. Neither rung raises: every error becomes a failed `KillResult`, so the executor
always gets an answer and can move on to `TerminateInstances`. The rungs live in `hub.control.ssm` and
`hub.control.ssh`; their names are exported here too, as the one place EC2 node control is taken from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleet.clock import Clock
from fleet.config.aws import AwsConfig
from hub.control.base import KillResult, NodeControl
from hub.control.command import DEFAULT_GRIDFLEET_BIN, DEFAULT_STATE_DIR, kill_command
from hub.control.ssh import (
    AcceptNewHostKeys,
    ConsoleHostKeys,
    HostKeyPolicy,
    SshControl,
    console_text,
    host_key_policy,
    host_keys_from_console,
    private_address,
)
from hub.control.ssm import SsmControl

__all__ = [
    "DEFAULT_GRIDFLEET_BIN",
    "DEFAULT_STATE_DIR",
    "AcceptNewHostKeys",
    "ConsoleHostKeys",
    "HostKeyPolicy",
    "LadderControl",
    "SshControl",
    "SsmControl",
    "console_text",
    "ec2_node_control",
    "host_key_policy",
    "host_keys_from_console",
    "kill_command",
    "private_address",
]


class LadderControl:
    """Try each rung in order; the first that ends the crawl wins."""

    def __init__(self, rungs: Sequence[NodeControl]):
        if not rungs:
            raise ValueError("a kill ladder needs at least one rung")
        self.rungs = tuple(rungs)

    def kill(self, instance_id: str, site: str, attempt: int) -> KillResult:
        failures: list[str] = []
        path = ""
        for rung in self.rungs:
            try:
                result = rung.kill(instance_id, site, attempt)
            except Exception as e:  # a rung should not raise; if one does, it failed
                result = KillResult(False, getattr(rung, "path", type(rung).__name__), f"{type(e).__name__}: {e}")
            if result.ok:
                return result
            path = result.path
            failures.append(f"{result.path}: {result.detail}")
        return KillResult(False, path, "; ".join(failures))


def ec2_node_control(aws: AwsConfig, clients: Any, clock: Clock) -> LadderControl:
    """The kill ladder's middle rungs for EC2 nodes as `aws` configures them: SSM, then SSH if a key is set.

    `clients` is an `AwsClients` (SSM, and EC2 for addresses and console
    output). The SSH user is not root on stock AMIs, so its command runs under
    `sudo -n` (the crawler and crawler.json belong to root).
    """
    gridfleet_bin = f"{aws.install_dir.rstrip('/')}/venv/bin/gridfleet"

    def command(site: str, attempt: int) -> str:
        return kill_command(site, attempt, gridfleet_bin=gridfleet_bin, state_dir=aws.state_dir)

    rungs: list[NodeControl] = [SsmControl(clients.client("ssm"), clock, timeout_s=aws.ssm_timeout_s, command=command)]
    if aws.ssh_key_path:
        ec2 = clients.client("ec2")
        ssh_command = command if aws.ssh_user == "root" else (lambda site, attempt: "sudo -n " + command(site, attempt))
        rungs.append(
            SshControl(
                private_address(ec2),
                user=aws.ssh_user,
                key_path=aws.ssh_key_path,
                host_keys=host_key_policy(aws.ssh_host_keys, ec2),
                command=ssh_command,
            )
        )
    return LadderControl(rungs)
