"""What `gridfleet aws preflight` asks an AWS account: one small function per check, and the account they ask.

A check reads the account through the fleet's own clients (Describe/Get/List/Head calls only) and answers with a
status and one line: what it found, or what is wrong and what to do. What an answer shows is not ready is raised
as `NotReady` deep in a lookup (an image that does not exist) or returned as a FAIL; an AWS error the check did
not expect is left to its caller, which words it with `fleet.aws.errors` (cli.commands.preflight turns it into
the FAIL of that check; the dry run asks `efs_utils_ready` as one of its questions). Everything read back from
AWS that is printed or used is checked first, since a line on the operator's terminal should never carry what
AWS did not mean to say.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import Any, TypeGuard

from botocore.exceptions import ClientError

from cli.envs.nat import estimate
from fleet.aws import ec2 as ec2_api
from fleet.aws.clients import AwsClients, error_code
from fleet.config import Config
from fleet.config.bundle import platform_of
from fleet.errors import MissingResource
from fleet.platform import S3_METADATA, Arch, BundlePlatform, deb_arch, fleet_arch
from fleet.record.tags import TAG_STACK

AMI_ID = re.compile(r"ami-[0-9a-f]{8,17}")
INSTANCE_TYPE = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9-]+")
ARCHES: tuple[Arch, ...] = ("x86_64", "arm64")
#: What infra/packer tags a baked node image with (twin.instance.images.IMAGE_TAGS gives the twin's the same).
TAG_IMAGE, TAG_BAKED = "gridfleet:image", "gridfleet:baked"
BAKED_PACKAGES = frozenset({"amazon-efs-utils", "amazon-ssm-agent"})
_NO_OBJECT = ("404", "NoSuchKey", "NotFound")


class Status(Enum):
    OK = "ok"
    FAIL = "FAIL"
    SKIPPED = "skipped"  # not asked: the config does not need it, or AWS cannot be asked


Answer = tuple[Status, str]


class NotReady(MissingResource):
    """An answer shows something is not ready (missing, or not usable as it is); its text is the check's line.
    A MissingResource, so the dry run words it as it words its other questions."""


def ok(detail: str) -> Answer:
    return Status.OK, detail


def fail(detail: str) -> Answer:
    return Status.FAIL, detail


def skipped(detail: str) -> Answer:
    return Status.SKIPPED, detail


@dataclass(frozen=True)
class Image:
    ami: str
    via: str  # how the config leads to it: "aws.ami /aws/service/...", "launch template gridfleet-node"
    arch: Arch | None  # None: not one gridfleet runs on (x86_64, arm64)
    tags: dict[str, str]

    @property
    def baked(self) -> bool:
        """A gridfleet node image with the SSM agent and amazon-efs-utils in it (infra/packer's tags say so)."""
        return self.tags.get(TAG_IMAGE) == "node" and BAKED_PACKAGES <= set(self.tags.get(TAG_BAKED, "").split())

    def describe(self) -> str:
        return f"{self.ami} ({self.arch or 'architecture unknown'}{', baked' if self.baked else ''}; {self.via})"


@dataclass
class Account:
    """The account as the config names it, each answer that several checks share asked once."""

    config: Config
    clients: AwsClients
    source: str = "fleet.yaml"  # the config as the command line named it, for the commands a line suggests

    def client(self, service: str) -> Any:
        return self.clients.client(service)

    @cached_property
    def node_image(self) -> Image:
        """The image nodes boot: the node launch template's (the provider passes no ImageId with one), else
        aws.node_ami, else aws.ami."""
        aws = self.config.aws
        if aws.node_launch_template:
            ref = self.template_data(aws.node_launch_template).get("ImageId")
            return self.image(ref, f"launch template {aws.node_launch_template}")
        ref, key = (aws.node_ami, "aws.node_ami") if aws.node_ami else (aws.ami, "aws.ami")
        if not ref:
            raise NotReady(
                "aws.ami is not set: an AMI id, or an SSM parameter such as /aws/service/debian/release/12/latest/amd64"
            )
        return self.image(ref, key)

    @cached_property
    def hub_image(self) -> Image | None:
        """The hub's image: aws.ami, else the hub launch template's; None when the config names neither."""
        aws = self.config.aws
        if aws.ami:
            return self.image(aws.ami, "aws.ami")
        if aws.hub_launch_template:
            ref = self.template_data(aws.hub_launch_template).get("ImageId")
            return self.image(ref, f"launch template {aws.hub_launch_template}")
        return None

    def image(self, ref: Any, via: str) -> Image:
        """The image `ref` names (an AMI id, an SSM parameter, a template's `resolve:ssm:` reference)."""
        if not isinstance(ref, str) or not ref:
            raise NotReady(f"{via} names no image")
        if ref.startswith("resolve:ssm:"):
            ref = ref.removeprefix("resolve:ssm:")
        ami = self.parameter(ref, via) if ref.startswith("/") else ref
        if not AMI_ID.fullmatch(ami):
            raise NotReady(f"{via}: {ref[:80]!r} is not an AMI id")
        label = f"{via} {ref}" if ref != ami else via
        try:
            found = self.client("ec2").describe_images(ImageIds=[ami])["Images"]
        except ClientError as e:
            if not error_code(e) or not str(error_code(e)).startswith("InvalidAMIID"):
                raise
            found = []
        if not found:
            raise NotReady(
                f"AMI {ami} ({label}) does not exist in {self.config.aws.region} or is not shared with this account"
            )
        arch = found[0].get("Architecture")  # the image check says so when it is none gridfleet runs on
        tags = {t["Key"]: t["Value"] for t in found[0].get("Tags") or () if all(isinstance(v, str) for v in t.values())}
        return Image(ami, label, arch if arch in ARCHES else None, tags)

    def parameter(self, name: str, via: str) -> str:
        try:
            value = self.client("ssm").get_parameter(Name=name)["Parameter"]["Value"]
        except ClientError as e:
            if error_code(e) in ("ParameterNotFound", "ValidationException"):
                raise NotReady(f"{via}: there is no SSM parameter {name!r} in {self.config.aws.region}") from None
            raise
        if not isinstance(value, str) or not AMI_ID.fullmatch(value):
            raise NotReady(f"{via}: the SSM parameter {name} holds no AMI id")
        return value

    def template_data(self, name: str) -> dict[str, Any]:
        """The default version's data of launch template `name` (what RunInstances with the template uses)."""
        try:
            versions = self.client("ec2").describe_launch_template_versions(
                LaunchTemplateName=name, Versions=["$Default"]
            )["LaunchTemplateVersions"]
        except ClientError as e:
            if str(error_code(e)).startswith("InvalidLaunchTemplateName"):
                raise NotReady(f"launch template {name!r} does not exist: apply infra/terraform") from None
            raise
        data = versions[0].get("LaunchTemplateData") if versions else None
        return data if isinstance(data, dict) else {}

    def head(self, bucket: str, key: str) -> dict[str, Any] | None:
        """HeadObject's answer, or None when there is no such object (or bucket)."""
        try:
            return dict(self.client("s3").head_object(Bucket=bucket, Key=key))
        except ClientError as e:
            if error_code(e) in _NO_OBJECT:
                return None
            raise

    @property
    def anonymous_s3(self) -> Any:
        """An S3 client that signs nothing, as a stock boot reads the SSM agent's package (`--no-sign-request`)."""
        return self.clients.anonymous("s3")

    def vcpus(self, types: set[str]) -> dict[str, int]:
        """Each instance type's default vCPUs (DescribeInstanceTypes)."""
        try:
            found = self.client("ec2").describe_instance_types(InstanceTypes=sorted(types))["InstanceTypes"]
        except ClientError as e:
            if error_code(e) != "InvalidInstanceType":
                raise
            found = []
        out = {t.get("InstanceType"): (t.get("VCpuInfo") or {}).get("DefaultVCpus") for t in found}
        counts: dict[str, int] = {k: v for k, v in out.items() if k in types and whole(v) and v > 0}
        if set(counts) != types:
            raise NotReady(
                f"{', '.join(sorted(types - set(counts)))}: not instance types EC2 offers in {self.config.aws.region}"
            )
        return counts

    @cached_property
    def nat(self) -> tuple[str, str, str] | None:
        """The stack's NAT instance (infra/terraform tags it Name=<stack>-nat): its id, type and state."""
        stack = self.config.aws.stack
        states = ("pending", "running", "stopping", "stopped")
        found = [
            i
            for i in ec2_api.describe(self.client("ec2"), stack, states=states)
            if i.tags.get("Name") == f"{stack}-nat"
        ]
        for i in sorted(found, key=lambda i: i.state != "running"):
            if i.instance_type and INSTANCE_TYPE.fullmatch(i.instance_type):
                return i.id, i.instance_type, i.state
        return None

    @property
    def arch(self) -> Arch:
        return fleet_arch(self.config.fleet.instance_types)

    @property
    def deb_arch(self) -> str:
        return deb_arch(self.arch)


def whole(v: Any) -> TypeGuard[int]:
    """A whole number as JSON gives it (not a bool)."""
    return isinstance(v, int) and not isinstance(v, bool)


def quota_value(v: Any) -> float | None:
    """A quota's value as Service Quotas gives it, or None when it is no usable number."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        return None
    return float(v)


# --- what the nodes and the hub boot ------------------------------------------------------------------------------
def image(acct: Account) -> Answer:
    """The nodes' and the hub's images are of the instance types' architecture: both install the one bundle."""
    want, types = acct.arch, ", ".join(acct.config.fleet.instance_types)
    node, hub = acct.node_image, acct.hub_image
    by_image: dict[str, list[str]] = {}
    for who, img in (("nodes'", node), ("hub's", hub)):
        if img is not None and img.arch != want:
            arch = img.arch or "of an architecture gridfleet does not run on"
            by_image.setdefault(f"image {img.ami} ({img.via}) is {arch}", []).append(who)
    wrong = [f"the {' and the '.join(whose)} {what}" for what, whose in by_image.items()]
    if wrong:
        return fail(
            f"{'; '.join(wrong)}, but fleet.instance_types ({types}) are {want} and the bundle is built for "
            f"them: use an {want} image (e.g. /aws/service/debian/release/12/latest/{acct.deb_arch})"
        )
    return ok(f"nodes {node.describe()}; hub {hub.describe() if hub else 'not named (no aws.ami)'}: {want}, as {types}")


def bundle(acct: Account) -> Answer:
    """The code bundle is in the bucket, built for the instances' platform (its S3 metadata says which)."""
    aws, want = acct.config.aws, platform_of(acct.config)
    where, upload = f"s3://{aws.bucket}/{aws.bundle_key}", f"`gridfleet bundle --config {acct.source} --upload`"
    head = acct.head(aws.bucket, aws.bundle_key)
    if head is None:
        return fail(f"{where} does not exist: build and upload it: {upload}")
    meta = head.get("Metadata") or {}
    if not all(isinstance(meta.get(k), str) for k in S3_METADATA):
        return fail(
            f"{where} has no platform in its metadata ({', '.join(S3_METADATA)}): it was built before the "
            f"bundle recorded its platform: build and upload it again: {upload}"
        )
    try:
        found = BundlePlatform(*(meta[k] for k in S3_METADATA))
    except ValueError as e:
        return fail(f"{where}: its metadata is no platform ({e}): build and upload it again: {upload}")
    if found != want:
        return fail(
            f"{where} is built for {found.describe()}, the fleet's instances are {want.describe()}: "
            f"build and upload it again with this config: {upload}"
        )
    return ok(f"{where}, built for {want.describe()}")


def efs_utils(acct: Account) -> Answer:
    """Nodes mount EFS with amazon-efs-utils: its .deb beside the bundle, or baked into their image. The .deb is
    asked first, so that the dry run, which the hub may run, needs no more than it reads anyway when it is there."""
    aws = acct.config.aws
    where = f"s3://{aws.bucket}/{aws.efs_utils_key}"
    if acct.head(aws.bucket, aws.efs_utils_key) is not None:
        return ok(f"{where} is there, for a stock node image to install")
    node = acct.node_image
    if node.baked:
        return ok(f"the nodes' image {node.ami} is a baked gridfleet node image with amazon-efs-utils")
    return fail(
        f"{where} does not exist, and the nodes boot the stock image {node.ami}, which has no "
        "amazon-efs-utils (Debian does not package it): every node would fail to mount EFS. Build its "
        f".deb and upload it (`gridfleet bundle --config {acct.source} --upload --efs-utils-deb FILE`), "
        "or boot the nodes from the baked node image (infra/packer, aws.node_ami)"
    )


def efs_utils_ready(config: Config, clients: AwsClients) -> str:
    """The efs-utils check as one of the dry run's questions: its line when ready, NotReady with it when not."""
    status, detail = efs_utils(Account(config, clients))
    if status is Status.FAIL:
        raise NotReady(detail)
    return detail


def ssm_agent(acct: Account) -> Answer:
    """A stock image has no SSM agent: its boot reads the region's agent package anonymously, so it must be there."""
    images = (("nodes", acct.node_image), ("hub", acct.hub_image))
    stock = [who for who, img in images if img is not None and not img.baked]
    if not stock:
        return ok("the nodes' and the hub's images are baked with amazon-ssm-agent")
    whose = f"the stock image of the {' and the '.join(stock)}"
    region = acct.config.aws.region
    bucket, key = f"amazon-ssm-{region}", f"latest/debian_{acct.deb_arch}/amazon-ssm-agent.deb"
    try:
        acct.anonymous_s3.head_object(Bucket=bucket, Key=key)
    except ClientError as e:
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status not in (403, 404):
            raise
        return fail(
            f"s3://{bucket}/{key} cannot be read anonymously (HTTP {status}), and {whose} "
            "downloads the SSM agent from there without signing: the kills through SSM "
            "and the dashboard's port forwarding need it. Check aws.region ({region}), or bake the agent "
            "into the image (infra/packer)"
        )
    return ok(f"s3://{bucket}/{key} is readable anonymously, for {whose}")


def nat(acct: Account) -> Answer:
    """Every stock node's boot fetches its packages through the stack's one NAT instance: in time, or not."""
    fleet, stack = acct.config.fleet, acct.config.aws.stack
    if acct.nat is None:
        return ok(
            f"no NAT instance of the stack ({TAG_STACK}={stack}, Name={stack}-nat): the nodes reach the "
            "internet another way (a NAT gateway?), which this estimate does not cover"
        )
    iid, itype, state = acct.nat
    if state in ("stopping", "stopped"):
        return fail(f"the NAT instance {iid} ({itype}) is {state}: the nodes have no way out; start it")
    guess = estimate(
        fleet.max_nodes, baked=acct.node_image.baked, nat_instance_type=itype, boot_timeout_s=fleet.boot_timeout_s
    )
    return (fail if guess.exceeds_timeout else ok)(f"NAT instance {iid}: {guess.advice}")
