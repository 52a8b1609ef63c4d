"""`gridfleet aws preflight` against the session's moto server: a ready account, then each check failing once.

The fixture `ready` makes an account ready for a small fleet (4 nodes of 2 vCPUs, stock image): the table, queue
and DLQ, the bucket with a bundle whose metadata says the config's platform and the amazon-efs-utils .deb, the
region's SSM agent package readable anonymously, EFS with an access point, a subnet and a security group, the
instance profile, the hub's launch template, images with architectures, the Lambdas, the log groups with a
retention, the Spot service-linked role and a NAT instance (a t3.micro: 4 stock boots take ~139 s of it, within
the 240 s boot timeout). Every test gets fresh names and a fresh stack, as moto's state lasts the session.

What moto 5.2.5 does not answer, the test environment provides, through a botocore hook on every client the
command makes (`fleet.aws.clients.CLIENT_HOOKS`; the `Aws` class below):
- Service Quotas: moto knows VPC's quotas only. Asked for EC2's, its GetServiceQuota answers
  NoSuchResourceException, which is what AWS answers when it holds no applied value for a quota; the check then
  asks GetAWSDefaultServiceQuota, as AWS documents, which moto does not implement (HTTP 500). The hook answers
  that call with `Aws.default_quotas`, and GetServiceQuota with `Aws.applied_quotas` where a test sets one.
- Lambda's GetAccountSettings: moto has no route for it (HTTP 404). The hook answers it with `Aws.lambda_limit`:
  by default 1000 concurrent executions, the account quota moto's own PutFunctionConcurrency models.
Other gaps are worked around in the fixture: moto's RegisterImage keeps no architecture, so images are copies of
moto's own Amazon images of the architecture wanted (CopyImage keeps it); moto names the role that
CreateServiceLinkedRole makes for spot.amazonaws.com otherwise than AWS, so the role is made by AWS's name.
"""

from __future__ import annotations

import io
import json
import os
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from botocore.awsrequest import AWSResponse

from cli.main import main
from fleet.aws import clients as fleet_aws
from fleet.aws.bootstrap import ensure_resources
from fleet.config.aws import AwsConfig
from tests.adapter.conftest import REGION, NamedClients, fresh_names
from twin.instance.images import IMAGE_TAGS

READ_ONLY = ("Describe", "Get", "List", "Head")
AGENT_BUCKET, AGENT_KEY = f"amazon-ssm-{REGION}", "latest/debian_amd64/amazon-ssm-agent.deb"
SPOT_ROLE = "AWSServiceRoleForEC2Spot"
SPOT, ON_DEMAND = "L-34B43A08", "L-1216C47A"
CHECKS = (
    "credentials",
    "stack",
    "image",
    "bundle",
    "efs-utils",
    "ssm-agent",
    "spot-vcpus",
    "on-demand-vcpus",
    "lambda",
    "spot-role",
    "log-groups",
    "nat",
)


class _Raw:
    def __init__(self, body: bytes):
        self.body = body

    def stream(self, **_: Any):
        yield self.body


@dataclass
class Aws:
    """What the hook answers in moto's stead, the calls the command's clients made, and the calls it denies."""

    default_quotas: dict[str, float] = field(default_factory=lambda: {SPOT: 32.0, ON_DEMAND: 32.0})
    applied_quotas: dict[str, float] = field(default_factory=dict)
    lambda_limit: tuple[int, int] = (1000, 1000)  # ConcurrentExecutions, UnreservedConcurrentExecutions
    deny: dict[str, str] = field(default_factory=dict)  # operation name -> the IAM action AccessDenied names
    calls: list[str] = field(default_factory=list)

    def answer(self, operation: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        code = params.get("QuotaCode", "")
        if operation in self.deny:
            message = f"User: arn:aws:iam::123456789012:user/ops is not authorized to perform: {self.deny[operation]}"
            return 403, {"Error": {"Code": "AccessDenied", "Message": message}}
        if operation == "GetServiceQuota" and code in self.applied_quotas:
            return 200, {"Quota": {"QuotaCode": code, "Value": self.applied_quotas[code]}}
        if operation == "GetAWSDefaultServiceQuota" and code in self.default_quotas:
            return 200, {"Quota": {"QuotaCode": code, "Value": self.default_quotas[code]}}
        if operation == "GetAccountSettings":
            total, free = self.lambda_limit
            return 200, {"AccountLimit": {"ConcurrentExecutions": total, "UnreservedConcurrentExecutions": free}}
        return None

    def hook(self, service: str, client: Any) -> None:
        label = str(client.meta.service_model.service_id)

        def keep(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
            context["api_params"] = dict(params)  # before-call gets the serialized request, not these

        def before(model: Any, context: dict[str, Any], **_: Any) -> Any:
            self.calls.append(f"{label} {model.name}")
            answered = self.answer(model.name, context.get("api_params", {}))
            if answered is None:
                return None
            status, parsed = answered
            parsed["ResponseMetadata"] = {"HTTPStatusCode": status, "RetryAttempts": 0}
            return AWSResponse("https://aws.invalid/", status, {}, _Raw(b"")), parsed

        client.meta.events.register("before-parameter-build", keep)
        client.meta.events.register("before-call", before)


@dataclass
class Ready:
    """A ready account, the config that names it (`config`, written by `write`) and the clients that made it."""

    admin: Any  # NamedClients on the moto server
    config: dict[str, Any]
    path: Path
    stack: str
    names: dict[str, str]
    images: dict[str, str]  # "x86_64", "arm64", "baked" -> AMI id
    aws: Aws = field(default_factory=Aws)

    def client(self, service: str) -> Any:
        return self.admin.client(service)

    def write(self) -> Path:
        self.path.write_text(yaml.safe_dump(self.config))
        return self.path


@pytest.fixture(scope="module")
def source_images(shared_clients) -> dict[str, str]:
    """One of moto's own Amazon images per architecture, to copy (a copy keeps its architecture, and is ours to tag)."""
    ec2 = shared_clients.client("ec2")
    found = {}
    for arch in ("x86_64", "arm64"):
        filters = [{"Name": "architecture", "Values": [arch]}]
        found[arch] = ec2.describe_images(Owners=["amazon"], Filters=filters)["Images"][0]["ImageId"]
    return found


def _image(ec2: Any, source: str, name: str, tags: dict[str, str] | None = None) -> str:
    ami = ec2.copy_image(SourceImageId=source, SourceRegion=REGION, Name=name)["ImageId"]
    if tags:
        ec2.create_tags(Resources=[ami], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
    return str(ami)


def _shared(admin: Any) -> None:
    """What the whole account holds once, not per stack: the Spot service-linked role and Amazon's agent package.
    Made anew (a test takes one of them away) before each test and after it."""
    iam, s3 = admin.client("iam"), admin.client("s3")
    try:
        iam.get_role(RoleName=SPOT_ROLE)
    except iam.exceptions.NoSuchEntityException:
        iam.create_role(RoleName=SPOT_ROLE, Path="/aws-service-role/spot.amazonaws.com/", AssumeRolePolicyDocument="{}")
    try:
        s3.head_bucket(Bucket=AGENT_BUCKET)
    except s3.exceptions.ClientError:
        s3.create_bucket(Bucket=AGENT_BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.put_object(Bucket=AGENT_BUCKET, Key=AGENT_KEY, Body=b"!<arch>\n", ACL="public-read")


def _network(ec2: Any, stack: str, image: str) -> dict[str, str]:
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
    sg = ec2.create_security_group(GroupName=f"{stack}-node", Description="nodes", VpcId=vpc)["GroupId"]
    ec2.create_launch_template(
        LaunchTemplateName=f"{stack}-hub", LaunchTemplateData={"ImageId": image, "InstanceType": "t3.small"}
    )
    return {"subnet": subnet, "sg": sg}


def launch_nat(ready: Ready, instance_type: str = "t3.micro") -> None:
    tags = [{"Key": "gridfleet:stack", "Value": ready.stack}, {"Key": "Name", "Value": f"{ready.stack}-nat"}]
    ready.client("ec2").run_instances(
        ImageId=ready.images["x86_64"],
        InstanceType=instance_type,
        MinCount=1,
        MaxCount=1,
        SubnetId=ready.names["subnet"],
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )


def _bucket(s3: Any, bucket: str) -> None:
    """The bundle, its platform in its metadata as `gridfleet bundle --upload` puts it, and amazon-efs-utils."""
    platform = {"gridfleet-machine": "x86_64", "gridfleet-python": "3.11"}
    s3.put_object(Bucket=bucket, Key="bundle/gridfleet-bundle.tar.gz", Body=b"bundle", Metadata=platform)
    s3.put_object(Bucket=bucket, Key="bundle/amazon-efs-utils.deb", Body=b"!<arch>\n")


def _log_groups(logs: Any, stack: str) -> None:
    for group in (f"/{stack}/hub", f"/{stack}/node"):
        logs.create_log_group(logGroupName=group)
        logs.put_retention_policy(logGroupName=group, retentionInDays=30)


def _lambdas(admin: Any, stack: str) -> None:
    role = admin.client("iam").create_role(RoleName=f"{stack}-lambda", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as z:
        z.writestr("handler.py", "def handler(event, context):\n    return None\n")
    for name in ("starter", "watchdog"):
        admin.client("lambda").create_function(
            FunctionName=f"{stack}-{name}",
            Runtime="python3.11",
            Role=role,
            Handler="handler.handler",
            Code={"ZipFile": code.getvalue()},
        )


@pytest.fixture
def ready(shared_clients, moto_endpoint, source_images, tmp_path) -> Any:
    stack = f"s{uuid.uuid4().hex[:12]}"
    names = fresh_names()
    admin = NamedClients(shared_clients, AwsConfig(endpoint_url=moto_endpoint, region=REGION, **names))
    ensure_resources(admin, visibility_timeout_s=30)
    _shared(admin)
    ec2 = admin.client("ec2")
    images = {arch: _image(ec2, src, f"{stack}-{arch}") for arch, src in source_images.items()}
    images["baked"] = _image(ec2, source_images["x86_64"], f"{stack}-baked", IMAGE_TAGS)
    for what in ("ami", "arm", "baked"):
        ami = images[{"ami": "x86_64", "arm": "arm64"}.get(what, what)]
        admin.client("ssm").put_parameter(Name=f"/gridfleet/{stack}/{what}", Type="String", Value=ami)
    names.update(_network(ec2, stack, images["x86_64"]))
    _bucket(admin.client("s3"), names["bucket"])
    efs = admin.client("efs")
    fs = efs.create_file_system(CreationToken=stack)["FileSystemId"]
    admin.client("iam").create_instance_profile(InstanceProfileName=f"{stack}-node")
    _lambdas(admin, stack)
    _log_groups(admin.client("logs"), stack)
    aws = {
        "region": REGION,
        "endpoint_url": moto_endpoint,
        "stack": stack,
        "max_retries": 0,
        **{k: names[k] for k in ("table", "queue", "bucket")},
        "efs_id": fs,
        "subnet_ids": [names["subnet"]],
        "security_group_ids": [names["sg"]],
        "instance_profile": f"{stack}-node",
        "ami": f"/gridfleet/{stack}/ami",
        "hub_launch_template": f"{stack}-hub",
        "hub_address": "10.0.0.10",  # for the dry run: this host is not the hub
        "imds_url": "http://127.0.0.1:9",
    }
    config = {
        "fleet": {"max_nodes": 4, "instance_types": ["t3.medium", "t3a.medium"], "boot_timeout_s": 240},
        "aws": aws,
        "sites": [{"id": "alpha", "start_url": "https://alpha.test/"}],
    }
    made = Ready(admin, config, tmp_path / "fleet.yaml", stack, names, images)
    launch_nat(made)
    made.write()
    yield made
    _shared(admin)


@pytest.fixture
def gridfleet(tmp_path, monkeypatch, capsys) -> Callable[..., tuple[int, str, str]]:
    """Run `gridfleet ARGS...` in this process with `ready.aws` hooked into its clients: (exit code, stdout, stderr)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRIDFLEET_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")

    def run(argv: list[str], aws: Aws) -> tuple[int, str, str]:
        fleet_aws.CLIENT_HOOKS.append(aws.hook)
        try:
            code = main([str(a) for a in argv])
        finally:
            fleet_aws.CLIENT_HOOKS.remove(aws.hook)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def lines_of(out: str) -> dict[str, tuple[str, str]]:
    """The preflight's check lines: name -> (status, detail)."""
    found = {}
    for line in out.splitlines():
        status, _, rest = line.partition(" ")
        name, _, detail = rest.strip().partition(": ")
        if status in ("ok", "FAIL", "skipped") and name in CHECKS:
            found[name] = (status, detail)
    return found


def preflight(gridfleet, ready: Ready, *extra: Any) -> tuple[int, dict[str, tuple[str, str]], str, str]:
    code, out, err = gridfleet(["aws", "preflight", "--config", ready.write(), *extra], ready.aws)
    return code, lines_of(out), out, err


# --- a ready account ----------------------------------------------------------------------------------------------
def test_a_ready_account_is_ready_and_only_read(gridfleet, ready):
    code, checks, out, err = preflight(gridfleet, ready)
    assert code == 0, out + err
    assert set(checks) == set(CHECKS) and all(status == "ok" for status, _ in checks.values()), out
    assert checks["credentials"][1] == f"account 123456789012 (arn:aws:sts::123456789012:user/moto), region {REGION}"
    assert f"nodes {ready.images['x86_64']} (x86_64; aws.ami /gridfleet/{ready.stack}/ami)" in checks["image"][1]
    assert "default value) is 32 vCPUs; the fleet needs 8 (4 nodes x 2 vCPUs)" in checks["spot-vcpus"][1]
    assert "needs 12 (4 nodes x 2 vCPUs + the hub (t3.small, 2) + the NAT instance (t3.micro, 2))" in out
    assert "4 stock node boots fetch 1.1 GB" in checks["nat"][1] and "within the 240 s boot timeout" in out
    assert out.splitlines()[-1] == f"ready: {len(CHECKS)} checks ok" and err == ""
    assert ready.aws.calls and all(c.rsplit(" ", 1)[1].startswith(READ_ONLY) for c in ready.aws.calls), ready.aws.calls


def test_checks_the_config_does_not_need_are_skipped(gridfleet, ready):
    ready.config["fleet"]["spot"] = False
    ready.config["aws"]["ship_logs"] = False
    code, checks, out, _ = preflight(gridfleet, ready)
    assert code == 0, out
    assert {n for n, (status, _) in checks.items() if status == "skipped"} == {"spot-vcpus", "spot-role", "log-groups"}
    assert checks["spot-role"][1] == "fleet.spot is false: no spot launches"
    assert "needs 12 (4 nodes x 2 vCPUs" in checks["on-demand-vcpus"][1]
    assert out.splitlines()[-1] == f"ready: {len(CHECKS) - 3} checks ok, 3 skipped"


# --- each check failing once --------------------------------------------------------------------------------------
def _no_spot_role(ready: Ready) -> None:
    ready.client("iam").delete_role(RoleName=SPOT_ROLE)


def _private_agent(ready: Ready) -> None:
    ready.client("s3").put_object_acl(Bucket=AGENT_BUCKET, Key=AGENT_KEY, ACL="private")


def _bundle_without_platform(ready: Ready) -> None:
    ready.client("s3").put_object(Bucket=ready.names["bucket"], Key="bundle/gridfleet-bundle.tar.gz", Body=b"b")


def _arm_image(ready: Ready) -> None:
    ssm = ready.client("ssm")
    ssm.put_parameter(Name=f"/gridfleet/{ready.stack}/ami", Value=ready.images["arm64"], Type="String", Overwrite=True)


def _no_nat(ready: Ready) -> None:
    ec2 = ready.client("ec2")
    filters = [{"Name": "tag:Name", "Values": [f"{ready.stack}-nat"]}]
    ids = [i["InstanceId"] for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]
    ec2.terminate_instances(InstanceIds=ids)


def _slow_nat(ready: Ready) -> None:
    _no_nat(ready)
    launch_nat(ready, "t3.nano")


def _no_dlq(ready: Ready) -> None:
    sqs = ready.client("sqs")
    sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName=f"{ready.names['queue']}-dlq")["QueueUrl"])


def _no_efs_utils(ready: Ready) -> None:
    ready.client("s3").delete_object(Bucket=ready.names["bucket"], Key="bundle/amazon-efs-utils.deb")


def _watchdog_reserves_0(ready: Ready) -> None:
    lam = ready.client("lambda")
    lam.put_function_concurrency(FunctionName=f"{ready.stack}-watchdog", ReservedConcurrentExecutions=0)


def _node_logs_kept_forever(ready: Ready) -> None:
    ready.client("logs").delete_retention_policy(logGroupName=f"/{ready.stack}/node")


#: check -> (what takes it away, what its FAIL line says)
BREAK: dict[str, tuple[Callable[[Ready], Any], str]] = {
    "stack": (_no_dlq, "SQS queue '{queue}-dlq' does not exist: run `gridfleet aws bootstrap` or apply"),
    "image": (_arm_image, "the nodes' and the hub's image {arm64} (aws.ami /gridfleet/{stack}/ami) is arm64, but"),
    "bundle": (_bundle_without_platform, "has no platform in its metadata (gridfleet-machine, gridfleet-python)"),
    "efs-utils": (_no_efs_utils, "s3://{bucket}/bundle/amazon-efs-utils.deb does not exist, and the nodes boot the "
                                 "stock image {x86_64}, which has no amazon-efs-utils"),
    "ssm-agent": (_private_agent, f"s3://{AGENT_BUCKET}/{AGENT_KEY} cannot be read anonymously (HTTP 403)"),
    "spot-vcpus": (lambda r: r.aws.applied_quotas.update({SPOT: 5}),
                   f"All Standard Spot Instance Requests ({SPOT}, applied value) is 5 vCPUs; the fleet needs 8"),
    "on-demand-vcpus": (lambda r: r.aws.default_quotas.update({ON_DEMAND: 10}),
                        f"--quota-code {ON_DEMAND} --desired-value 12`, or lower fleet.max_nodes"),
    "lambda": (_watchdog_reserves_0, "{stack}-watchdog: reserved concurrency 0, so it never runs"),
    "spot-role": (_no_spot_role, "`aws iam create-service-linked-role --aws-service-name spot.amazonaws.com`"),
    "log-groups": (_node_logs_kept_forever, "/{stack}/node has no retention (its logs are kept forever)"),
    "nat": (_slow_nat, "in 278 s, past the 240 s boot timeout: boot nodes from the baked image"),
}  # fmt: skip


@pytest.mark.parametrize("broken", list(BREAK))
def test_each_check_fails_alone_when_its_one_thing_is_taken_away(broken, gridfleet, ready):
    take_away, says = BREAK[broken]
    take_away(ready)
    code, checks, out, err = preflight(gridfleet, ready)
    assert code == 1 and "Traceback" not in out + err, out + err
    assert checks[broken][0] == "FAIL", out
    expect = says.format(stack=ready.stack, **ready.names, **ready.images)
    assert expect in checks[broken][1], (expect, checks[broken][1])
    assert all(status == "ok" for name, (status, _) in checks.items() if name != broken), out
    assert out.splitlines()[-1] == f"not ready: 1 check(s) FAIL: {broken}"


# --- no credentials, bad input, --tf-output -----------------------------------------------------------------------
def no_credentials(monkeypatch, tmp_path: Path) -> None:
    """No credentials anywhere botocore looks (the environment, the files, the instance metadata)."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_without_credentials_one_fail_and_every_other_check_skipped(gridfleet, ready, monkeypatch, tmp_path):
    no_credentials(monkeypatch, tmp_path)
    code, checks, out, err = preflight(gridfleet, ready)
    assert code == 1 and "Traceback" not in out + err, out + err
    status, detail = checks.pop("credentials")
    assert status == "FAIL" and detail.startswith("no AWS credentials (STS GetCallerIdentity): configure a profile")
    assert checks and all(c == ("skipped", "not asked: no AWS credentials") for c in checks.values()), out
    assert ready.aws.calls == ["STS GetCallerIdentity"]  # nothing was sent: botocore found no credentials to sign with


def test_a_bad_config_is_one_line_and_exit_2(gridfleet, ready):
    ready.config["fleet"]["max_nodes"] = 0
    ready.config["aws"]["region"] = 5
    code, out, err = gridfleet(["aws", "preflight", "--config", ready.write()], ready.aws)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"gridfleet: error: {ready.path}:") and "(and 1 more problem(s) in it)" in err, err
    assert ready.aws.calls == []


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "not the JSON of `terraform output -json`"),
        ('{"other": {"value": 1}}', "no output 'gridfleet_aws'"),
    ],
)
def test_a_bad_tf_output_file_is_one_line_and_exit_2(text, says, gridfleet, ready, tmp_path):
    (tmp_path / "tf.json").write_text(text)
    code, out, err = gridfleet(
        ["aws", "preflight", "--config", ready.write(), "--tf-output", tmp_path / "tf.json"], ready.aws
    )
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"gridfleet: error: {tmp_path / 'tf.json'}: {says}"), err


def tf_output(ready: Ready, path: Path, **change: Any) -> Path:
    """`terraform output -json` of a stack that made this account: the keys of `gridfleet_aws`, as infra/terraform
    names them (the DLQ by name, though the config leaves it to its default)."""
    aws = ready.config["aws"]
    keys = (
        "region",
        "stack",
        "table",
        "queue",
        "bucket",
        "efs_id",
        "subnet_ids",
        "security_group_ids",
        "instance_profile",
        "ami",
        "hub_launch_template",
    )
    value = {k: aws[k] for k in keys} | {"queue_fifo": False, "dlq": f"{aws['queue']}-dlq", "node_ami": aws["ami"]}
    value |= {"key_name": None, "node_launch_template": None, **change}
    path.write_text(json.dumps({"gridfleet_aws": {"sensitive": False, "type": "object", "value": value}}))
    return path


def test_the_stack_outputs_equal_to_the_config_are_ok(gridfleet, ready, tmp_path):
    code, checks, out, _ = preflight(gridfleet, ready, "--tf-output", tf_output(ready, tmp_path / "tf.json"))
    assert code == 0, out
    assert checks["stack"] == (
        "ok",
        f"the 16 keys of gridfleet_aws in {tmp_path / 'tf.json'} are the config's aws: section",
    )


def test_stack_outputs_that_differ_from_the_config_fail_naming_each_key(gridfleet, ready, tmp_path):
    other = tf_output(ready, tmp_path / "tf.json", bucket="someone-elses", subnet_ids=["subnet-0123456789abcdef0"])
    code, checks, out, _ = preflight(gridfleet, ready, "--tf-output", other)
    assert code == 1 and checks["stack"][0] == "FAIL", out
    detail = checks["stack"][1]
    assert f"aws.bucket is '{ready.names['bucket']}', Terraform's 'someone-elses'" in detail
    assert f"aws.subnet_ids is ('{ready.names['subnet']}',), Terraform's ('subnet-0123456789abcdef0',)" in detail
    assert "`terraform output -json | gridfleet config from-terraform`" in detail
    assert all(status == "ok" for name, (status, _) in checks.items() if name != "stack"), out


# --- the baked image, Lambda's quota, a denied call, no NAT instance -----------------------------------------------
def test_nodes_from_a_baked_template_need_no_efs_utils_package_and_nothing_through_the_nat(gridfleet, ready):
    """The node launch template's image (a `resolve:ssm:` parameter, as infra/terraform may set it) is a baked node
    image: no amazon-efs-utils .deb is needed, the hub alone needs the agent's package, and the NAT carries nothing
    of the nodes' boots, even a t3.nano's."""
    data = {"ImageId": f"resolve:ssm:/gridfleet/{ready.stack}/baked", "InstanceType": "t3.medium"}
    ready.client("ec2").create_launch_template(LaunchTemplateName=f"{ready.stack}-node", LaunchTemplateData=data)
    ready.config["aws"]["node_launch_template"] = f"{ready.stack}-node"
    _no_efs_utils(ready)
    _slow_nat(ready)
    code, checks, out, _ = preflight(gridfleet, ready)
    assert code == 0, out
    baked = ready.images["baked"]
    assert checks["efs-utils"] == (
        "ok",
        f"the nodes' image {baked} is a baked gridfleet node image with amazon-efs-utils",
    )
    assert checks["ssm-agent"][1].endswith("readable anonymously, for the stock image of the hub")
    assert f"nodes {baked} (x86_64, baked; launch template {ready.stack}-node /gridfleet/{ready.stack}/baked)" in out
    assert "4 baked node boots fetch nothing from Debian's mirror" in checks["nat"][1]


def test_a_small_lambda_quota_is_fine_until_the_functions_reserve(gridfleet, ready):
    ready.aws.lambda_limit = (10, 10)  # a new account's quota
    code, checks, out, _ = preflight(gridfleet, ready)
    assert code == 0 and checks["lambda"][1].endswith("none reserved; the account's concurrency is 10 (10 unreserved)")
    for name in ("starter", "watchdog"):
        ready.client("lambda").put_function_concurrency(
            FunctionName=f"{ready.stack}-{name}", ReservedConcurrentExecutions=1
        )
    ready.aws.lambda_limit = (10, 8)
    code, checks, out, _ = preflight(gridfleet, ready)
    assert code == 1 and checks["lambda"][0] == "FAIL", out
    assert (
        "2 reserved; the account's concurrency is 10 (8 unreserved): AWS keeps 100 executions unreserved, so the "
        "stack cannot apply lambda_reserved_concurrency" in checks["lambda"][1]
    )
    assert "to 102 or more, or set lambda_reserved_concurrency = null" in checks["lambda"][1]


def test_a_denied_call_fails_its_check_naming_the_call_and_the_permission(gridfleet, ready):
    ready.aws.deny = {"GetRole": "iam:GetRole"}
    code, checks, out, _ = preflight(gridfleet, ready)
    assert code == 1, out
    assert checks["spot-role"] == (
        "FAIL",
        "access denied to iam:GetRole (IAM GetRole, AccessDenied): allow iam:GetRole in the IAM policy of the identity "
        "these credentials belong to (infra/terraform's roles grant what each gridfleet program needs)",
    )
    assert all(status == "ok" for name, (status, _) in checks.items() if name != "spot-role"), out


def test_no_nat_instance_is_said_and_not_a_failure(gridfleet, ready):
    _no_nat(ready)
    code, checks, out, _ = preflight(gridfleet, ready)
    assert code == 0, out
    assert checks["nat"][1].startswith(
        f"no NAT instance of the stack (gridfleet:stack={ready.stack}, Name={ready.stack}-nat)"
    )
    assert "needs 10 (4 nodes x 2 vCPUs + the hub (t3.small, 2))" in checks["on-demand-vcpus"][1]


# --- the dry run shares the efs-utils check -----------------------------------------------------------------------
def dry_run(gridfleet, ready: Ready) -> tuple[int, str, str]:
    return gridfleet(["run", "--config", ready.write(), "--dry-run", "--run-id", "r1"], ready.aws)


def test_the_dry_run_refuses_a_stock_boot_without_the_efs_utils_package(gridfleet, ready):
    code, out, err = dry_run(gridfleet, ready)
    deb = f"s3://{ready.names['bucket']}/bundle/amazon-efs-utils.deb"
    assert code == 0 and f"  efs-utils:  {deb} is there, for a stock node image to install" in out, out + err
    _no_efs_utils(ready)
    code, out, err = dry_run(gridfleet, ready)
    assert code == 1 and f"  efs-utils:  MISSING: {deb} does not exist, and the nodes boot the stock image" in out
    assert err.startswith(f"gridfleet: error: dry run: {deb} does not exist") and len(err.strip().splitlines()) == 1


def test_the_dry_run_without_credentials_leaves_the_efs_utils_package_not_resolved(
    gridfleet, ready, monkeypatch, tmp_path
):
    no_credentials(monkeypatch, tmp_path)
    code, out, err = dry_run(gridfleet, ready)
    assert code == 0 and "  efs-utils:  not resolved: no AWS credentials" in out, out + err
    assert "the bucket, whether the nodes have amazon-efs-utils, whether run r1 exists (no AWS credentials" in out
    assert ready.aws.calls == []
