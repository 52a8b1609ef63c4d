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
from functools import cached_property
from typing import Any

from botocore.exceptions import ClientError

from cloud_init import NodeUserData, RenderError, render_node
from fleet.aws.clients import AwsClients, error_code
from fleet.aws.errors import CREATE_ADVICE
from fleet.clock import Clock
from fleet.config import Config
from fleet.config_load import dump_config
from fleet.errors import MissingResource, UsageError
from fleet.aws.imds import Imds, ImdsError
from fleet import procs
from fleet.aws.queue import SqsSiteQueue
from fleet.aws.results import S3ResultStore
from fleet.aws.table import DynamoStateTable
from hub.control.aws import LadderControl, ec2_node_control
from hub.providers.ec2 import Ec2Provider

log = logging.getLogger("gridfleet.hub")


@dataclass
class AwsEnv:
    """The run's AWS adapters. Each client is made when first used, so a command that ends before it needs AWS
    (`run --dry-run` without credentials, `render node`) makes none."""

    config: Config
    clients: AwsClients

    @cached_property
    def table(self) -> DynamoStateTable:
        return DynamoStateTable(self.clients.client("dynamodb"), self.config.aws.table)

    @cached_property
    def queue(self) -> SqsSiteQueue:
        return SqsSiteQueue(self.clients.client("sqs"), self.config.aws.queue_name, self.config.aws.dlq_name)

    @cached_property
    def results(self) -> S3ResultStore:
        return S3ResultStore(self.clients.client("s3"), self.config.aws.bucket)

    @property
    def ec2(self) -> Any:
        return self.clients.client("ec2")

    def preflight(self) -> None:
        """Exit 1 naming exactly what is missing (table, queue, DLQ, bucket), before any launch.

        Any other AWS failure (no credentials, access denied, ...) propagates: the command line's outer edge
        words it (fleet.aws.errors)."""
        missing = []
        for check in (self.table.check_exists, self.queue.check_exists, self.results.check_exists):
            try:
                check()
            except MissingResource as e:
                missing.append(str(e))
        if missing:
            raise MissingResource(missing_line(missing))

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
            if error_code(e) in ("ParameterNotFound", "ValidationException"):
                raise MissingResource(f"aws.ami: there is no SSM parameter {ami!r} in {self.config.aws.region}: "
                                      f"{error_code(e)}") from None
            raise

    def check_instance_profile(self) -> None:
        """The nodes' instance profile exists (IAM GetInstanceProfile); MissingResource if not."""
        name = self.config.aws.instance_profile
        try:
            self.clients.client("iam").get_instance_profile(InstanceProfileName=name)
        except ClientError as e:
            if error_code(e) == "NoSuchEntity":
                raise MissingResource(f"IAM instance profile {name!r} (aws.instance_profile) does not exist") from None
            raise

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
        """SSM, then SSH (with `sudo -n`: the crawler belongs to the crawl user, the SSH user may not signal it), as
        `aws` configures them."""
        return ec2_node_control(self.config.aws, self.clients, clock)


def connect(config: Config, clients: AwsClients | None = None) -> AwsEnv:
    return AwsEnv(config, clients or AwsClients(config.aws))


def missing_line(missing: list[str]) -> str:
    """One line for the fleet's resources that do not exist."""
    return "; ".join(missing) + f": {CREATE_ADVICE}"


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
        crawl_user=config.fleet.crawl_user, crawl_uid=config.fleet.crawl_uid,
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
