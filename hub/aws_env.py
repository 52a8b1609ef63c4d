"""Wiring of a run on AWS: clients, preflight checks, the hub's identity, node user-data, provider, kill ladder.

Everything the hub needs that exists only on AWS is made here from the config,
so `gridfleet run` on AWS is the same Hub as the embedded default with other
adapters behind the same seams.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError, NoCredentialsError, NoRegionError

from cloud_init import NodeUserData, RenderError, render_node
from fleet.aws import AwsClients, error_code
from fleet.clock import Clock
from fleet.config import Config
from fleet.config_load import dump_config
from fleet.errors import GridfleetError, MissingResource, UsageError
from fleet.imds import Imds, ImdsError
from fleet.local import procs
from fleet.queue import SqsSiteQueue
from fleet.results import S3ResultStore
from fleet.table import DynamoStateTable
from hub.control.aws import LadderControl, ec2_node_control
from hub.providers.ec2 import Ec2Provider

log = logging.getLogger("gridfleet.hub")


@dataclass
class AwsEnv:
    config: Config
    clients: AwsClients
    table: DynamoStateTable
    queue: SqsSiteQueue
    results: S3ResultStore

    @property
    def ec2(self) -> Any:
        return self.clients.client("ec2")

    def preflight(self) -> None:
        """Exit 1 naming exactly what is missing (credentials, table, queue, DLQ, bucket), before any launch."""
        try:
            missing = []
            for check in (self.table.check_exists, self.queue.check_exists, self.results.check_exists):
                try:
                    check()
                except MissingResource as e:
                    missing.append(str(e))
        except NoCredentialsError:
            raise MissingResource("no AWS credentials: configure a profile, environment variables or an "
                                  "instance role") from None
        except NoRegionError:
            raise MissingResource("no AWS region: set aws.region") from None
        except ClientError as e:
            raise GridfleetError(f"AWS refused the preflight checks: {error_code(e)}: {e}") from None
        if missing:
            raise MissingResource("; ".join(missing) + " (create them with Terraform, or `gridfleet aws bootstrap`)")

    def resolve_ami(self) -> str:
        ami = self.config.aws.ami
        if self.config.aws.node_launch_template:
            return ami or ""
        if not ami:
            raise MissingResource("aws.ami is not set (an AMI id, or an SSM parameter name such as "
                                  "/aws/service/debian/release/12/latest/amd64)")
        if not ami.startswith("/"):
            return ami
        try:
            return self.clients.client("ssm").get_parameter(Name=ami)["Parameter"]["Value"]
        except ClientError as e:
            raise MissingResource(f"aws.ami: SSM parameter {ami!r} cannot be read: {error_code(e)}") from None

    def upload_run_config(self, run_id: str) -> str:
        key = self.run_config_key(run_id)
        self.clients.client("s3").put_object(Bucket=self.config.aws.bucket, Key=key,
                                             Body=dump_config(self.config).encode(), ContentType="application/yaml")
        return key

    def run_config_key(self, run_id: str) -> str:
        return self.config.aws.run_config_key.format(run_id=run_id)

    def node_user_data(self, run_id: str, hub_address: str) -> str:
        try:
            return render_node(node_params(self.config, run_id, hub_address))
        except RenderError as e:
            raise UsageError(f"the nodes' user-data cannot be made from this config: {e}") from None

    def provider(self, ami: str, hub_address: str) -> Ec2Provider:
        return Ec2Provider(self.ec2, self.config, ami=ami,
                           user_data=lambda run_id: self.node_user_data(run_id, hub_address))

    def control(self, clock: Clock) -> LadderControl:
        """SSM, then SSH (with `sudo -n`: the crawler belongs to root), as `aws` configures them."""
        return ec2_node_control(self.config.aws, self.clients, clock)


def connect(config: Config, clients: AwsClients | None = None) -> AwsEnv:
    clients = clients or AwsClients(config.aws)
    aws = config.aws
    return AwsEnv(config, clients, DynamoStateTable(clients.client("dynamodb"), aws.table),
                  SqsSiteQueue(clients.client("sqs"), aws.queue_name, aws.dlq_name),
                  S3ResultStore(clients.client("s3"), aws.bucket))


def node_params(config: Config, run_id: str, hub_address: str) -> NodeUserData:
    aws = config.aws
    if not aws.efs_id:
        raise MissingResource("aws.efs_id is not set: nodes keep their Chrome profiles on EFS")
    return NodeUserData(
        run_id=run_id, region=aws.region, bucket=aws.bucket, bundle_key=aws.bundle_key,
        config_key=aws.run_config_key.format(run_id=run_id), efs_id=aws.efs_id, hub_address=hub_address,
        grid_port=aws.grid_port, grid_publish_port=aws.grid_publish_port, grid_subscribe_port=aws.grid_subscribe_port,
        node_port=aws.node_port, install_dir=aws.install_dir, state_dir=aws.state_dir, efs_mount=aws.efs_mount,
        boot_timeout_s=int(config.fleet.boot_timeout_s),  # nodes use EC2's own metadata service
        efs_access_point_id=aws.efs_access_point_id,
    )


EC2_IMDS = "http://169.254.169.254"


@dataclass(frozen=True)
class HubIdentity:
    hub_id: str  # ec2:<instance id> on EC2, host:<hostname>:<pid>:<start ticks> elsewhere
    address: str | None  # the private IPv4 nodes reach the Grid on
    instance_id: str | None
    real_ec2: bool = False  # the metadata came from EC2 itself, not from an emulator


def identify(imds_url: str) -> HubIdentity:
    try:
        imds = Imds(imds_url, timeout_s=1.0)
        iid = imds.instance_id()
        return HubIdentity(f"ec2:{iid}", imds.local_ipv4(), iid, imds_url.rstrip("/") == EC2_IMDS)
    except ImdsError:
        pid = os.getpid()
        return HubIdentity(f"host:{socket.gethostname()}:{pid}:{procs.start_ticks(pid)}", None, None)


def same_host_hub_alive(hub_id: str) -> bool:
    """For hubs run off EC2 (`host:<name>:<pid>:<ticks>`): alive if it is this host's live process."""
    parts = hub_id.split(":")
    if len(parts) != 4 or parts[0] != "host" or parts[1] != socket.gethostname():
        return False
    try:
        return procs.pid_alive(int(parts[2]), int(parts[3]))
    except ValueError:
        return False


def self_stop(how: str, identity: HubIdentity, ec2: Any) -> str:
    """What the hub instance does to itself once the run is over and no node is left."""
    if how == "none" or identity.instance_id is None:
        return "not stopping: " + ("hub_self_stop is none" if how == "none" else "not on EC2")
    if how == "terminate":
        ec2.terminate_instances(InstanceIds=[identity.instance_id])
        return f"terminating {identity.instance_id}"
    if not identity.real_ec2:  # never shut down a machine whose "instance" came from an emulator
        return f"not shutting down: instance metadata is not EC2's own ({identity.hub_id})"
    subprocess.run(["shutdown", "-h", "+1", "gridfleet: the run is over"], check=False)
    return "shutting down in one minute"
