"""AWS as an Environment: clients, preflight checks, the hub's identity, node user-data, provider, kill ladder.

Everything the hub needs that exists only on AWS is made here from the config,
so `gridfleet run` on AWS is the same Hub as the embedded default with other
adapters behind the same seams.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError
from rich.console import Console

from cli.envs.aws_plan import dry_run, missing_line
from cli.envs.base import RunHold, StoresOf
from cli.envs.identity import HubIdentity, identify, same_host_hub_alive, self_stop
from cli.packaging.crawler_ship import installed_config, project_of
from cli.report.check import CheckReport
from cloud_init import NodeUserData, RenderError, render_node
from fleet.aws import ec2 as ec2_api
from fleet.aws.clients import AwsClients, error_code
from fleet.aws.efs import ensure_site_points
from fleet.aws.results import node_role_id
from fleet.clock import Clock, SystemClock
from fleet.config import Config, NotifyConfig
from fleet.config.load import dump_config
from fleet.errors import MissingResource, UsageError
from fleet.record.partition import RunInfo
from hub.control.aws import LadderControl, ec2_node_control
from hub.loop import RunOutcome
from hub.providers.ec2 import Ec2Provider

log = logging.getLogger("gridfleet.hub")


@dataclass
class AwsEnv(StoresOf):
    """A run on AWS. Each client is made when first used, so a command that ends before it needs AWS
    (`run --dry-run` without credentials, `render node`) makes none. Only an environment made for a run
    (`launch`) resolves the AMI and the hub's address, which its provider needs to launch nodes."""

    config: Config
    clients: AwsClients
    source: str = ""  # the fleet.yaml as the command line named it (repeated in what to do next)
    launch: bool = False

    reads_archive = True
    demo_url = None

    @property
    def where(self) -> str:
        return f"in the table {self.config.aws.table}"

    @property
    def ec2(self) -> Any:
        return self.clients.client("ec2")

    # --- before the run ------------------------------------------------------------------------------------
    def can_crawl(self) -> None:
        """Nothing to ask here: each node decides at its boot (and refuses without the sandbox)."""

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

    def dry_run(self, run_id: str, console: Console) -> int:
        return dry_run(self, run_id, console)

    def latest_run(self) -> str | None:
        runs = self.table.list_runs()
        return runs[-1].run_id if runs else None

    def finished_export(self, run_id: str, out: Path) -> dict[str, Any] | None:
        return None  # the table holds its runs; after their items expire a run of the id starts anew

    def stores_up(self) -> bool:
        return True

    @contextmanager
    def hold(self, run_id: str) -> Iterator[RunHold]:
        yield RunHold()  # nothing to start or stop: the table, queue and bucket outlive the command

    def resolve_ami(self) -> str:
        """The nodes' AMI id: aws.node_ami, else aws.ami (an SSM parameter is read)."""
        aws = self.config.aws
        ami, key = (aws.node_ami, "aws.node_ami") if aws.node_ami else (aws.ami, "aws.ami")
        if aws.node_launch_template:
            return ami or ""
        if not ami:
            raise MissingResource(
                "aws.ami is not set (an AMI id, or an SSM parameter name such as "
                "/aws/service/debian/release/12/latest/amd64)"
            )
        if not ami.startswith("/"):
            return ami
        try:
            return self.clients.client("ssm").get_parameter(Name=ami)["Parameter"]["Value"]
        except ClientError as e:
            if error_code(e) in ("ParameterNotFound", "ValidationException"):
                raise MissingResource(
                    f"{key}: there is no SSM parameter {ami!r} in {self.config.aws.region}: {error_code(e)}"
                ) from None
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

    @cached_property
    def ami(self) -> str:
        return self.resolve_ami()

    @cached_property
    def identity(self) -> HubIdentity:
        return identify(self.config.aws.imds_url)

    @cached_property
    def hub_address(self) -> str:
        """The address nodes reach the hub's Selenium Grid at: aws.hub_address, else this EC2 instance's."""
        address = self.config.aws.hub_address or self.identity.address
        if not address:
            raise UsageError(
                "aws.hub_address is not set and this host is not on EC2: nodes need the address of "
                "the hub's Selenium Grid"
            )
        return address

    def run_config_key(self, run_id: str) -> str:
        return self.config.aws.run_config_key_for(run_id)

    def upload_run_config(self, run_id: str) -> str:
        key = self.run_config_key(run_id)
        self.clients.client("s3").put_object(
            Bucket=self.config.aws.bucket,
            Key=key,
            Body=dump_config(self.node_config()).encode(),
            ContentType="application/yaml",
        )
        return key

    def node_config(self) -> Config:
        """The config the nodes get: a crawler project by its identity (the bundle installed it), not by a
        directory of this machine; no `notify` (the run's end is the hub's to tell, and the webhook is a secret)."""
        project = project_of(self.config)
        config = installed_config(self.config, project) if project is not None else self.config
        return config.model_copy(update={"notify": NotifyConfig()})

    def save_run_config(self, run_id: str) -> str:
        self.node_user_data(run_id, self.hub_address)  # renders (and checks) the nodes' user-data before any start
        self.ensure_site_access_points()
        return f"s3://{self.config.aws.bucket}/{self.upload_run_config(run_id)}"

    def ensure_site_access_points(self) -> None:
        """Every site of the config has its own EFS access point before any node starts: a node mounts the one
        of the site it claims, and sees no other site's directory (`fleet.aws.efs`). Made once, reused later."""
        aws = self.config.aws
        if not aws.efs_id:
            raise MissingResource("aws.efs_id is not set: nodes keep their Chrome profiles on EFS")
        sites = [s.id for s in self.config.sites]
        points, made = ensure_site_points(self.clients.client("efs"), aws.efs_id, aws.stack, sites,
                                          self.config.fleet.crawl_uid)  # fmt: skip
        log.info("EFS %s: %d sites have their access point, %d made now", aws.efs_id, len(points), len(made))

    def node_user_data(self, run_id: str, hub_address: str) -> str:
        try:
            return render_node(node_params(self.config, run_id, hub_address))
        except RenderError as e:
            raise UsageError(f"the nodes' user-data cannot be made from this config: {e}") from None

    # --- the hub's seams -----------------------------------------------------------------------------------
    def node_provider(self, ami: str, hub_address: str) -> Ec2Provider:
        """EC2 instances from `ami` whose user-data joins them to the Grid at `hub_address`."""
        return Ec2Provider(
            self.ec2, self.config, ami=ami, user_data=lambda run_id: self.node_user_data(run_id, hub_address)
        )

    def provider(self, run_id: str, clock: Clock) -> Ec2Provider:
        if not self.launch:  # to list and terminate the run's instances: no AMI, no user-data
            return Ec2Provider(self.ec2, self.config, ami="", user_data=lambda r: "")
        return self.node_provider(self.ami, self.hub_address)

    def control(self, run_id: str, clock: Clock) -> LadderControl:
        """SSM, then SSH (with `sudo -n`: the crawler belongs to the crawl user, the SSH user may not signal it), as
        `aws` configures them."""
        return ec2_node_control(self.config.aws, self.clients, clock)

    def hub_id(self) -> str:
        return self.identity.hub_id

    def node_role(self) -> str:
        return node_role_id(self.clients.client("iam"), self.config.aws.instance_profile)

    def hub_alive(self, hub_id: str) -> bool:
        inert = Ec2Provider(self.ec2, self.config, ami="", user_data=lambda r: "")
        return inert.hub_alive(hub_id) or same_host_hub_alive(hub_id)

    def announce(self, run_id: str) -> None:
        aws = self.config.aws
        log.info(
            "run %s on AWS (%s): %d sites, up to %d nodes, Grid at %s:%d, node config s3://%s/%s",
            run_id,
            aws.region,
            len(self.config.sites),
            self.config.fleet.max_nodes,
            self.hub_address,
            aws.grid_port,
            aws.bucket,
            self.run_config_key(run_id),
        )

    # --- after the run -------------------------------------------------------------------------------------
    def export_node_logs(self, run_id: str, out: Path) -> Path | None:
        return None  # a node's logs stay on it (and in its console output)

    def finish(self, outcome: RunOutcome, report: CheckReport) -> int:
        if outcome.left_running == 0:
            log.info("hub self-stop: %s", self_stop(self.config.aws.hub_self_stop, self.identity, self.ec2))
        else:
            log.error("hub stays up: %d nodes could not be terminated", outcome.left_running)
        return outcome.exit_code

    def rerun_hubs(self, run_id: str, run: RunInfo) -> list[str]:
        hubs = ec2_api.live_hub_ids(self.ec2, self.config.aws.stack, run_id)
        if not hubs and not self.config.aws.hub_launch_template:
            raise UsageError(
                "aws.hub_launch_template is not set, and no hub runs this run: a rerun on AWS starts a "
                "hub from that template (`gridfleet config from-terraform` fills it in)"
            )
        return hubs

    def hand_over(self, run_id: str, hubs: list[str], console: Console) -> bool:
        if hubs:
            console.print(f"the run's hub ({', '.join(hubs)}) picks them up")
        else:
            started = self.start_hub(run_id)
            console.print(
                f"hub: {started['action']} {started.get('instance_id') or ''} "
                f"({started.get('reason') or started.get('how')}); it launches the nodes these sites need"
            )
        console.print(f"follow with `gridfleet watch --config {self.source} --run-id {run_id}`")
        return True

    def start_hub(self, run_id: str) -> dict[str, Any]:
        """A hub instance from aws.hub_launch_template for the run, as the starter Lambda starts one."""
        from lambdas.starter import LambdaSettings, start_hub

        aws = self.config.aws
        settings = LambdaSettings(
            region=aws.region,
            table=aws.table,
            stack=aws.stack,
            bucket=aws.bucket,
            endpoint_url=aws.endpoint_url,
            hub_launch_template=aws.hub_launch_template,
        )
        return start_hub(settings, self.ec2, self.table, SystemClock(), run_id)

    def for_run(self) -> AwsEnv:
        return AwsEnv(self.config, self.clients, self.source, launch=True)


def connect(config: Config, clients: AwsClients | None = None, *, source: str = "", launch: bool = False) -> AwsEnv:
    return AwsEnv(config, clients or AwsClients(config.aws), source, launch)


def for_run(config: Config, source: str) -> AwsEnv:
    """A run on AWS: its provider launches nodes (the AMI and the hub's address resolved when first needed)."""
    return connect(config, source=source, launch=True)


def node_params(config: Config, run_id: str, hub_address: str) -> NodeUserData:
    aws = config.aws
    if not aws.efs_id:
        raise MissingResource("aws.efs_id is not set: nodes keep their Chrome profiles on EFS")
    return NodeUserData(
        run_id=run_id,
        region=aws.region,
        bucket=aws.bucket,
        bundle_key=aws.bundle_key,
        config_key=aws.run_config_key_for(run_id),
        efs_id=aws.efs_id,
        hub_address=hub_address,
        grid_secret_parameter=aws.grid_secret_parameter,
        grid_port=aws.grid_port,
        grid_publish_port=aws.grid_publish_port,
        grid_subscribe_port=aws.grid_subscribe_port,
        node_port=aws.node_port,
        install_dir=aws.install_dir,
        state_dir=aws.state_dir,
        efs_mount=aws.efs_mount,
        boot_timeout_s=int(config.fleet.boot_timeout_s),  # nodes use EC2's own metadata service
        crawl_user=config.fleet.crawl_user,
        crawl_uid=config.fleet.crawl_uid,
        table=aws.table,
        log_group=aws.log_group_node if aws.ship_logs else "",
    )
