"""The `aws:` section of fleet.yaml: the AWS resources a run uses, where nodes find the hub and the code, and how
the hub kills a crawl on a node. Validated with the rest of the config (`fleet.config.Config`), which it is part of."""

from __future__ import annotations

import posixpath
import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from fleet.errors import quote
from fleet.platform import Arch, ami_parameter_arch, deb_arch, uname_machine
from fleet.record.ids import check_run_id

AMI_PATTERN = r"^(ami-[0-9a-f]{8,17}|/[A-Za-z0-9_./-]{1,2047})$"  # an AMI id, or an SSM parameter name

#: The rules of the values that reach a node's user-data as they are, each matched whole (`fullmatch`: a trailing
#: newline is not valid), so that `validate` refuses what rendering would. `cloud_init.render` checks them again as
#: it renders; a package that imports nothing of the project, it keeps copies, which a test holds to these
#: (tests/unit/test_aws_values.py). Each rule: (pattern, what a value must be).
REGION_RE = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]+")
EFS_ID_RE = re.compile(r"fs-[0-9a-f]{8,40}")
HOST_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")  # a DNS name or an IPv4 address
USER_DATA_RULES: dict[str, tuple[re.Pattern[str], str]] = {
    "region": (REGION_RE, "an AWS region (e.g. ap-northeast-2)"),
    "efs_id": (EFS_ID_RE, "an EFS file system id (fs-<hex>)"),
    "hub_address": (HOST_RE, "a DNS name or an IPv4 address"),
}

#: The one placeholder of `aws.run_config_key`, replaced by the run's id (as plain text: no `str.format`).
RUN_ID_PLACEHOLDER = "{run_id}"
_BRACED = re.compile(r"\{[^{}]*\}")


class AwsConfig(BaseModel):
    """The AWS resources a run uses, where nodes find the hub and the code, and how the hub kills a crawl."""

    # allow_inf_nan: as every section of the config (fleet.config._Model)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    region: str = Field("ap-northeast-2", description="the AWS region of every resource and call")
    stack: str = Field(
        "gridfleet",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,31}$",
        description="the stack's name (Terraform's name_prefix): every instance is tagged gridfleet:stack=<stack>, "
        "and nothing of another stack in the account is listed, adopted or terminated",
    )
    endpoint_url: str | None = Field(None, description="the endpoint of every AWS call (a moto server); default AWS's")
    table: str = Field("TrendlyzeStatus", description="the DynamoDB table of the runs' sites, nodes and history")
    queue: str = Field("trendlyze-sites", description="the SQS queue of the site messages, one per attempt")
    queue_fifo: bool = Field(
        False,
        description="a FIFO queue: each (run, site, attempt) message is sent at most once within SQS's "
        "5-minute deduplication window, even if a restarted hub sends it again",
    )
    dlq: str | None = Field(None, description="dead-letter queue name; default <queue>-dlq")
    max_receive_count: int = Field(10, ge=2, description="receives before a message goes to the DLQ")
    bucket: str = Field(
        "trendlyze-results", description="the S3 bucket of results, evidence, the code bundle, configs and summaries"
    )
    efs_id: str | None = Field(
        None, description="EFS file system of the sites' profiles: each site has its own access point on it"
    )
    subnet_ids: tuple[str, ...] = Field((), description="subnets nodes launch in, in turn; none: the default subnet")
    security_group_ids: tuple[str, ...] = Field((), description="security groups of the nodes")
    instance_profile: str | None = Field(
        None, description="the nodes' IAM instance profile (its role names their writer id)"
    )
    ami: str | None = Field(None, pattern=AMI_PATTERN, description="an AMI id, or an SSM parameter holding one")
    node_ami: str | None = Field(None, pattern=AMI_PATTERN, description="nodes' AMI (a baked image); default aws.ami")
    key_name: str | None = Field(None, description="the EC2 key pair nodes launch with")
    node_launch_template: str | None = Field(
        None, description="launch nodes from this template (type, subnet, market and user-data overridden)"
    )
    hub_launch_template: str | None = Field(
        None, description="`gridfleet rerun` on AWS starts a hub from this template when none runs"
    )
    result_ttl_days: int = Field(1, ge=1, description="expireAt = run end + this many days")
    max_retries: int = Field(8, ge=0, description="botocore 'standard' retry attempts per call")
    # Where nodes find the hub, the code and the run's config.
    hub_address: str | None = Field(
        None, description="address nodes reach the hub's Grid on; default the hub's private IPv4 from IMDS"
    )
    grid_port: int = Field(4444, ge=1, le=65535, description="the port of the hub's Selenium Grid")
    grid_publish_port: int = Field(4442, ge=1, le=65535, description="the Grid's event bus: its publish port")
    grid_subscribe_port: int = Field(4443, ge=1, le=65535, description="the Grid's event bus: its subscribe port")
    node_port: int = Field(5555, ge=1, le=65535, description="the port each node's Grid node listens on")
    bundle_key: str = Field("bundle/gridfleet-bundle.tar.gz", description="S3 key of the code bundle")
    hub_config_key: str = Field(
        "hub/fleet.yaml",
        description="S3 key of the config the hub instance runs (with its secrets: under hub/, which no node may read)",
    )
    run_config_key: str = Field(
        "runs/{run_id}/fleet.yaml",
        description="S3 key of a run's config, for its nodes: {run_id}, its one placeholder, is the run's id",
    )
    install_dir: str = Field("/opt/gridfleet", description="where hub and nodes install the bundle (and its venv/)")
    state_dir: str = Field("/var/lib/gridfleet", description="the hub's and the nodes' working directory: state, logs")
    efs_mount: str = Field("/efs", description="where a node mounts each site it claimed, at <efs_mount>/<site>")
    # How the hub kills a crawl on a node (SSM, then SSH, then TerminateInstances).
    ssm_timeout_s: float = Field(60, gt=0, description="longest wait for an SSM kill command to finish")
    ssh_user: str = Field("admin", description="the user the hub's SSH kill logs in as (sudo -n unless root)")
    ssh_key_path: str | None = Field(None, description="private key the hub uses for SSH to nodes; none: no SSH")
    ssh_host_keys: Literal["console", "accept-new"] = Field(
        "console", description="console: trust only the host keys the node printed to its EC2 console output"
    )
    hub_self_stop: Literal["shutdown", "terminate", "none"] = Field(
        "shutdown", description="what the hub instance does to itself once the run is over and the fleet is gone"
    )
    imds_url: str = Field("http://169.254.169.254", description="instance metadata service (IMDSv2)")
    image_python: str = Field(
        "3.11",
        pattern=r"^3\.(1[1-9]|[2-9][0-9])$",  # gridfleet needs 3.11 or newer
        description="the Python 3.<minor> of the hub's and nodes' image (Debian 12's: 3.11), the bundle's wheels'",
    )
    ship_logs: bool = Field(
        True,
        description="ship the hub's and the nodes' logs (boot, agent, crawler, Grid) to the stack's CloudWatch Logs "
        "groups /<stack>/hub and /<stack>/node, one stream per instance (<run_id>/<instance id>)",
    )

    @property
    def efs_utils_key(self) -> str:
        """Where the amazon-efs-utils .deb a stock node installs lies: beside the bundle (the node's boot script
        derives the same key from the bundle's)."""
        return posixpath.join(posixpath.dirname(self.bundle_key), "amazon-efs-utils.deb")

    @property
    def log_group_hub(self) -> str:
        """The hub's CloudWatch Logs group (infra/terraform names it after the stack)."""
        return f"/{self.stack}/hub"

    @property
    def log_group_node(self) -> str:
        """The nodes' CloudWatch Logs group."""
        return f"/{self.stack}/node"

    @property
    def grid_secret_parameter(self) -> str:
        """The SSM SecureString the hub puts the Grid's secret in and the nodes read it from (infra/terraform
        grants the two roles that parameter alone)."""
        return f"/{self.stack}/grid-secret"

    @property
    def kms_key_alias(self) -> str:
        """The stack's own KMS key (infra/terraform names its alias after the stack): it encrypts that secret."""
        return f"alias/{self.stack}"

    @property
    def queue_name(self) -> str:
        """The site queue's name: `queue`, plus the `.fifo` a FIFO queue's name must end with."""
        return self.queue if not self.queue_fifo or self.queue.endswith(".fifo") else f"{self.queue}.fifo"

    @property
    def dlq_name(self) -> str:
        """`dlq`, default <queue>-dlq; a FIFO queue's DLQ is a FIFO queue too (queue x.fifo: DLQ x-dlq.fifo)."""
        if not self.queue_fifo:
            return self.dlq or f"{self.queue}-dlq"
        name = self.dlq or f"{self.queue.removesuffix('.fifo')}-dlq"
        return name if name.endswith(".fifo") else f"{name}.fifo"

    def run_config_key_for(self, run_id: str) -> str:
        """The S3 key of run `run_id`'s config: `run_config_key` with {run_id} replaced (checked at load: the key
        has it and no other brace)."""
        return self.run_config_key.replace(RUN_ID_PLACEHOLDER, check_run_id(run_id))

    @field_validator(*USER_DATA_RULES)
    @classmethod
    def _user_data_value(cls, v: str | None, info: ValidationInfo) -> str | None:
        """A value the nodes' user-data carries: of its rule, as `cloud_init.render` will check it (None: not set)."""
        pattern, expected = USER_DATA_RULES[str(info.field_name)]
        if v is not None and not pattern.fullmatch(v):
            raise ValueError(f"{quote(v)} is not {expected}")
        return v

    @field_validator("run_config_key")
    @classmethod
    def _one_placeholder(cls, v: str) -> str:
        """{run_id} and nothing else in braces: each run's nodes read their own run's config, and no key can make
        the substitution fail (a `{0}` or a lone `{`) when a run starts."""
        rest = v.replace(RUN_ID_PLACEHOLDER, "")
        other = _BRACED.search(rest)
        if other:
            raise ValueError(
                f"placeholder {quote(other[0])} is not {RUN_ID_PLACEHOLDER}, the only one it takes "
                f"(e.g. runs/{RUN_ID_PLACEHOLDER}/fleet.yaml)"
            )
        if "{" in rest or "}" in rest:
            brace = "{" if "{" in rest else "}"
            raise ValueError(
                f"{quote(v)} has a {brace!r} outside {RUN_ID_PLACEHOLDER}, its only placeholder "
                f"(e.g. runs/{RUN_ID_PLACEHOLDER}/fleet.yaml)"
            )
        if RUN_ID_PLACEHOLDER not in v:
            raise ValueError(
                f"{quote(v)} has no {RUN_ID_PLACEHOLDER}: every run would read one config "
                f"(e.g. runs/{RUN_ID_PLACEHOLDER}/fleet.yaml)"
            )
        return v

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and urlsplit(v).scheme not in ("http", "https"):
            raise ValueError("must be an http(s) URL")
        return v


def image_problem(key: str, parameter: str | None, arch: Arch) -> str | None:
    """Why the image `key` names does not fit instances of `arch`, when its SSM parameter's name says so."""
    said = ami_parameter_arch(parameter) if parameter and parameter.startswith("/") else None
    if not parameter or said in (None, arch):
        return None
    head, _, word = parameter.rstrip("/").rpartition("/")
    fit = deb_arch(arch) if word in ("amd64", "arm64") else uname_machine(arch)  # in the parameter's own words
    kind = f"{arch} (Graviton)" if arch == "arm64" else arch
    return f"{key} {parameter} is an {said} image; fleet.instance_types are {kind}: use {head}/{fit}"
