"""Static checks of infra/terraform.

No Terraform binary runs here: the configuration is parsed with python-hcl2 and
its structure checked against what gridfleet needs on AWS (network, EFS, queue,
table, bucket, IAM, launch templates, Lambdas, schedules, monitoring, outputs),
then scanned with checkov, which must report no failed check and a reason for
every skipped one.

python-hcl2 8.x keeps the quotes of string literals (`"\"gp3\""`), keeps the
quotes of block labels, and returns expressions as `"${...}"` strings; `clean`
below strips the quotes of literals and labels and drops hcl2's bookkeeping keys.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import hcl2
import pytest

from fleet.aws.bootstrap import OPEN_INDEX_ATTRIBUTES
from fleet.config import FleetConfig, MetricsConfig
from fleet.config.aws import AwsConfig
from fleet.record.codec import OPEN_ATTR, OPEN_INDEX

ROOT = Path(__file__).resolve().parents[2]
TF_DIR = ROOT / "infra" / "terraform"
CHECKOV = ROOT / ".tools" / "checkov" / "bin" / "checkov"

ROLES = ("hub", "node", "starter", "watchdog")
ANYWHERE = {"0.0.0.0/0", "::/0"}

# The keys of fleet.yaml's aws: section that the stack decides.
GRIDFLEET_AWS_KEYS = {
    "node_ami",
    "region",
    "stack",
    "table",
    "queue",
    "queue_fifo",
    "dlq",
    "bucket",
    "efs_id",
    "subnet_ids",
    "security_group_ids",
    "instance_profile",
    "ami",
    "key_name",
    "node_launch_template",
    "hub_launch_template",
}


# Of those, the ones granted on "*" only under a condition: action -> (test, variable, values).
STAR_RESOURCE_CONDITIONS = {
    "cloudwatch:PutMetricData": ("StringEquals", "cloudwatch:namespace", ["${var.metrics_namespace}"]),
}

#: What the SSM agent needs for Run Command and Session Manager, as AWS documents its minimum: the hub's and the
#: nodes' agents alike.
SSM_AGENT_ACTIONS = {
    "ssm:UpdateInstanceInformation",
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
    "ec2messages:AcknowledgeMessage",
    "ec2messages:DeleteMessage",
    "ec2messages:FailMessage",
    "ec2messages:GetEndpoint",
    "ec2messages:GetMessages",
    "ec2messages:SendReply",
}

# Actions that have no resource-level permissions: the only ones granted on "*" (the agent's channels among them).
STAR_RESOURCE_ACTIONS = {
    "ec2:DescribeInstances",
    "ssm:GetCommandInvocation",
    "ssm:CancelCommand",
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "cloudwatch:PutMetricData",
} | (SSM_AGENT_ACTIONS - {"ssm:UpdateInstanceInformation"})

STARTER_ACTIONS = {
    "dynamodb:GetItem",
    "dynamodb:UpdateItem",
    "ec2:DescribeInstances",
    "ec2:RunInstances",
    "ec2:CreateTags",
    "ec2:StartInstances",
    "iam:PassRole",
    "logs:CreateLogStream",
    "logs:PutLogEvents",
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "sqs:SendMessage",
    "kms:Decrypt",
}

EXPECTED_ACTIONS = {
    "hub": {
        "dynamodb:DescribeTable",
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:Query",
        "dynamodb:UpdateItem",
        "dynamodb:BatchGetItem",
        "dynamodb:BatchWriteItem",
        "sqs:GetQueueUrl",
        "sqs:SendMessage",
        "sqs:GetQueueAttributes",
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "s3:ListBucket",
        "s3:GetObject",
        "s3:PutObject",
        "s3:PutObjectTagging",
        "ec2:DescribeInstances",
        "ec2:GetConsoleOutput",
        "ec2:RunInstances",
        "ec2:CreateTags",
        "ec2:TerminateInstances",
        "ssm:SendCommand",
        "ssm:GetCommandInvocation",
        "ssm:CancelCommand",
        "ssm:GetParameter",
        "ssm:PutParameter",
        "elasticfilesystem:CreateAccessPoint",
        "elasticfilesystem:DescribeAccessPoints",
        "elasticfilesystem:TagResource",
        "iam:PassRole",
        "iam:GetInstanceProfile",
        "kms:Decrypt",
        "kms:Encrypt",
        "kms:GenerateDataKey",
        "cloudwatch:PutMetricData",
        "sns:Publish",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        *SSM_AGENT_ACTIONS,
    },
    "node": {
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:Query",
        "sqs:GetQueueUrl",
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:SendMessage",
        "s3:ListBucket",
        "s3:GetObject",
        "s3:PutObject",
        "elasticfilesystem:ClientMount",
        "elasticfilesystem:ClientWrite",
        "elasticfilesystem:DescribeAccessPoints",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        *SSM_AGENT_ACTIONS,
        "ssm:GetParameter",
        "kms:Decrypt",
        "kms:GenerateDataKey",
        "cloudwatch:PutMetricData",
    },
    "starter": STARTER_ACTIONS,
    # Beyond a restart: closing an abandoned run (its sites, their history, its summary in the bucket) and
    # cleaning up instances.
    "watchdog": STARTER_ACTIONS
    | {
        "dynamodb:Query",
        "dynamodb:BatchWriteItem",
        "s3:PutObject",
        "kms:GenerateDataKey",
        "ec2:TerminateInstances",
        "ec2:StopInstances",
        "sns:Publish",
    },
}

#: The stack's tag: every instance of the stack carries gridfleet:stack = var.name_prefix.
STACK_TAG = "gridfleet:stack"
STACK = ["${var.name_prefix}"]
#: Actions on an existing instance: a statement granting one on instances holds only for the stack's. (Tags
#: given at launch, `ec2:CreateAction = RunInstances`, are not on an existing instance: the launch itself must
#: carry the stack's tag.)
INSTANCE_ACTIONS = {
    "ec2:TerminateInstances",
    "ec2:StopInstances",
    "ec2:StartInstances",
    "ec2:CreateTags",
    "ec2:GetConsoleOutput",
    "ssm:SendCommand",
}
#: The condition key that reads an existing resource's tag, per action: EC2's global aws:ResourceTag, but Run
#: Command's own ssm:resourceTag for SendCommand, as its documentation conditions it (a global key on
#: SendCommand would also need aws:ViaAWSService).
RESOURCE_TAG_KEY = {"ssm:SendCommand": "ssm:resourceTag"}


def resource_tag(action: str, tag: str) -> str:
    return f"{RESOURCE_TAG_KEY.get(action, 'aws:ResourceTag')}/{tag}"


# --- reading hcl2's output ------------------------------------------------------------------------


#: hcl2's bookkeeping keys: a body is a block; the comments above and inside it.
HCL2_KEYS = ("__is_block__", "__comments__", "__inline_comments__")


def unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        return value[1:-1]
    return value


def clean(node: Any) -> Any:
    """hcl2's output without its bookkeeping keys, with literal strings and labels unquoted."""
    if isinstance(node, dict):
        return {unquote(k): clean(v) for k, v in node.items() if k not in HCL2_KEYS}
    if isinstance(node, list):
        return [clean(v) for v in node]
    if isinstance(node, str):
        return unquote(node)
    return node


def comments(node: Any) -> Iterator[str]:
    """Every comment hcl2 kept, anywhere below `node`."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("__comments__", "__inline_comments__"):
                yield from (c.get("value", "") for c in v)
            else:
                yield from comments(v)
    elif isinstance(node, list):
        for v in node:
            yield from comments(v)


class Config:
    """All the .tf files of the directory, indexed by block type and name."""

    def __init__(self, directory: Path) -> None:
        self.files: dict[str, dict[str, Any]] = {}
        self.resources: dict[str, dict[str, dict[str, Any]]] = {}
        self.data: dict[str, dict[str, dict[str, Any]]] = {}
        self.variables: dict[str, dict[str, Any]] = {}
        self.outputs: dict[str, dict[str, Any]] = {}
        self.locals: dict[str, Any] = {}
        self.raw_resources: dict[tuple[str, str], dict[str, Any]] = {}
        self.terraform: list[dict[str, Any]] = []
        self.providers: list[dict[str, Any]] = []
        for path in sorted(directory.glob("*.tf")):
            with path.open() as f:
                parsed = hcl2.load(f)
            self.files[path.name] = parsed
            for kind, index in (("resource", self.resources), ("data", self.data)):
                for block in parsed.get(kind, []):
                    for rtype, named in block.items():
                        for name, body in named.items():
                            key = (unquote(rtype), unquote(name))
                            assert key[1] not in index.get(key[0], {}), f"{kind} {key} defined twice"
                            index.setdefault(key[0], {})[key[1]] = clean(body)
                            if kind == "resource":
                                self.raw_resources[key] = body
            for block in parsed.get("variable", []):
                for name, body in block.items():
                    self.variables[unquote(name)] = clean(body)
            for block in parsed.get("output", []):
                for name, body in block.items():
                    self.outputs[unquote(name)] = clean(body)
            for block in parsed.get("locals", []):
                for name, value in clean(block).items():
                    assert name not in self.locals, f"local {name} defined twice"
                    self.locals[name] = value
            self.terraform.extend(clean(parsed.get("terraform", [])))
            for block in parsed.get("provider", []):
                self.providers.append(clean(block))

    def resource(self, rtype: str, name: str) -> dict[str, Any]:
        assert name in self.resources.get(rtype, {}), f"missing resource {rtype}.{name}"
        return self.resources[rtype][name]

    def datum(self, dtype: str, name: str) -> dict[str, Any]:
        assert name in self.data.get(dtype, {}), f"missing data {dtype}.{name}"
        return self.data[dtype][name]

    def default(self, variable: str) -> Any:
        assert variable in self.variables, f"missing variable {variable}"
        return self.variables[variable].get("default")

    def resolve(self, text: str) -> str:
        """`${local.x}` replaced by the local's value where that value is a plain string."""

        def sub(m: re.Match[str]) -> str:
            value = self.locals.get(m.group(1))
            whole_expression = (
                isinstance(value, str) and value.startswith("${") and value.endswith("}") and value.count("${") == 1
            )
            return value if isinstance(value, str) and not whole_expression else m.group(0)

        for _ in range(5):  # locals built from locals
            text = re.sub(r"\$\{local\.([A-Za-z0-9_]+)\}", sub, text)
        return text


@lru_cache(maxsize=1)
def config() -> Config:
    return Config(TF_DIR)


@pytest.fixture(scope="module")
def tf() -> Config:
    return config()


def blocks(body: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """The nested blocks `key` of a body (hcl2 gives a list of bodies, or one dict)."""
    value = body.get(key, [])
    if isinstance(value, dict):
        return [value]
    return [v for v in value if isinstance(v, dict)]


def one(body: dict[str, Any], key: str) -> dict[str, Any]:
    found = blocks(body, key)
    assert len(found) == 1, f"expected one {key} block, got {len(found)}"
    return found[0]


def as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def ref(expr: str) -> str:
    """The inside of a `${...}` expression."""
    assert isinstance(expr, str) and expr.startswith("${") and expr.endswith("}"), f"not an expression: {expr!r}"
    return expr[2:-1]


# --- files ------------------------------------------------------------------------------------------


def test_every_tf_file_parses_and_the_directory_is_complete(tf):
    assert {"versions.tf", "variables.tf", "outputs.tf"} <= set(tf.files)
    assert (TF_DIR / "terraform.tfvars.example").is_file()
    assert (TF_DIR / "README.md").is_file()


def test_versions_and_default_tags(tf):
    (terraform,) = tf.terraform
    assert ">= 1.6" in terraform["required_version"]
    aws = one(terraform, "required_providers")["aws"]
    assert aws["source"] == "hashicorp/aws"
    assert aws["version"].startswith("~> 5.")
    (provider,) = [p["aws"] for p in tf.providers]
    assert provider["region"] == "${var.region}"
    assert one(provider, "default_tags")["tags"]


def test_variables_have_types_and_descriptions(tf):
    for name, var in tf.variables.items():
        assert var.get("type"), f"variable {name} has no type"
        assert var.get("description"), f"variable {name} has no description"
    assert tf.default("region") == "ap-northeast-2"
    assert tf.default("name_prefix") == "gridfleet"
    assert tf.default("max_nodes") == 20
    assert tf.default("table_name") == "TrendlyzeStatus"
    assert tf.default("queue_name") == "trendlyze-sites"
    assert tf.default("log_retention_days") == 30
    assert tf.default("result_retention_days") == 90
    assert tf.default("key_name") is None
    assert "bucket_name" in tf.variables


def test_tfvars_example_sets_only_declared_variables(tf):
    text = (TF_DIR / "terraform.tfvars.example").read_text()
    parsed = clean(hcl2.loads(text))
    assert set(parsed) <= set(tf.variables), set(parsed) - set(tf.variables)
    assert "bucket_name" in parsed


# --- network ----------------------------------------------------------------------------------------


def test_vpc_and_subnets_in_every_zone(tf):
    vpc = tf.resource("aws_vpc", "main")
    assert vpc["cidr_block"] == "${var.vpc_cidr}"
    azs = tf.default("azs")
    assert len(azs) >= 2 and len(set(azs)) == len(azs)
    assert "length(var.azs) >= 2" in one(tf.variables["azs"], "validation")["condition"]
    assert "var.azs" in tf.locals["az_index"]
    for tier in ("public", "private"):
        subnet = tf.resource("aws_subnet", tier)
        assert subnet["for_each"] == "${local.az_index}", f"{tier} subnets are not one per zone of var.azs"
        assert subnet["availability_zone"] == "${each.key}"
        assert subnet["vpc_id"] == "${aws_vpc.main.id}"
        assert subnet["map_public_ip_on_launch"] is False
    tf.resource("aws_internet_gateway", "main")


def test_nat_instance(tf):
    nat = tf.resource("aws_instance", "nat")
    assert nat["source_dest_check"] is False
    assert "aws_subnet.public" in nat["subnet_id"]
    assert one(nat, "metadata_options")["http_tokens"] == "required"
    root = one(nat, "root_block_device")
    assert root["encrypted"] is True and "aws_kms_key.main" in root["kms_key_id"]
    user_data = tf.locals[ref(nat["user_data"]).removeprefix("local.")]
    assert "ip_forward" in user_data and "MASQUERADE" in user_data
    assert nat["instance_type"] == "${var.nat_instance_type}"
    eip = tf.resource("aws_eip", "nat")
    assert eip["instance"] == "${aws_instance.nat.id}"
    assert eip["domain"] == "vpc"


def test_private_default_route_goes_through_the_nat_interface(tf):
    routes = [r for r in tf.resources["aws_route"].values() if "aws_route_table.private" in r["route_table_id"]]
    assert routes, "no route in the private route table"
    default = [r for r in routes if r.get("destination_cidr_block") == "0.0.0.0/0"]
    assert len(default) == 1
    assert default[0]["network_interface_id"] == "${aws_instance.nat.primary_network_interface_id}"
    assoc = tf.resource("aws_route_table_association", "private")
    assert assoc["for_each"] == "${aws_subnet.private}"
    assert assoc["route_table_id"] == "${aws_route_table.private.id}"
    public = tf.resource("aws_route_table_association", "public")
    assert public["route_table_id"] == "${aws_route_table.public.id}"


def test_flow_logs_and_default_security_group(tf):
    flow = tf.resource("aws_flow_log", "vpc")
    assert flow["vpc_id"] == "${aws_vpc.main.id}"
    assert flow["log_destination_type"] == "cloud-watch-logs"
    default_sg = tf.resource("aws_default_security_group", "default")
    assert "ingress" not in default_sg and "egress" not in default_sg


# --- security groups ---------------------------------------------------------------------------------


def ingress_rules(tf: Config) -> list[tuple[str, dict[str, Any]]]:
    """Every ingress rule, whatever resource type declares it."""
    rules = [
        (f"aws_vpc_security_group_ingress_rule.{n}", r)
        for n, r in tf.resources.get("aws_vpc_security_group_ingress_rule", {}).items()
    ]
    rules += [
        (f"aws_security_group_rule.{n}", r)
        for n, r in tf.resources.get("aws_security_group_rule", {}).items()
        if r.get("type") == "ingress"
    ]
    for n, sg in tf.resources.get("aws_security_group", {}).items():
        rules += [(f"aws_security_group.{n} (inline)", r) for r in blocks(sg, "ingress")]
    return rules


def rule_ports(tf: Config, rule: dict[str, Any]) -> set[int]:
    """The ports a rule opens, expanding `for_each = local.<map>` with `from_port = each.value`."""
    if rule.get("from_port") == "${each.value}":
        values = tf.locals[ref(rule["for_each"]).removeprefix("local.")]
        return set(values.values())
    assert rule.get("from_port") == rule.get("to_port"), f"port range in {rule}"
    return {rule["from_port"]}


def ingress_of(tf: Config, group: str) -> list[dict[str, Any]]:
    return [r for _, r in ingress_rules(tf) if r.get("security_group_id") == f"${{aws_security_group.{group}.id}}"]


def test_no_ingress_from_anywhere(tf):
    rules = ingress_rules(tf)
    assert rules
    for name, rule in rules:
        sources = set()
        for key in ("cidr_ipv4", "cidr_ipv6", "cidr_blocks", "ipv6_cidr_blocks"):
            sources |= set(as_list(rule.get(key)))
        assert not sources & ANYWHERE, f"{name} admits traffic from anywhere"


def test_hub_ingress_grid_ports_from_nodes_only(tf):
    rules = ingress_of(tf, "hub")
    assert rules
    ports = set()
    for rule in rules:
        assert rule.get("referenced_security_group_id") == "${aws_security_group.node.id}"
        assert "cidr_ipv4" not in rule
        ports |= rule_ports(tf, rule)
    assert ports == {4444, 4442, 4443}


def test_node_ingress_from_hub_only(tf):
    rules = ingress_of(tf, "node")
    ports = set()
    for rule in rules:
        assert rule.get("referenced_security_group_id") == "${aws_security_group.hub.id}"
        ports |= rule_ports(tf, rule)
    assert ports == {5555, 22}


def test_efs_ingress_nfs_from_nodes_only(tf):
    rules = ingress_of(tf, "efs")
    assert {r.get("referenced_security_group_id") for r in rules} == {"${aws_security_group.node.id}"}
    assert all(rule_ports(tf, r) == {2049} for r in rules)


def test_the_hub_has_no_path_to_efs(tf):
    """The hub never mounts EFS: no NFS egress from its group, no client permission of EFS in its policy (it makes
    the sites' access points: test_the_hub_makes_the_sites_access_points_of_the_stacks_file_system_only), nothing
    for it in the file system's."""
    hub_egress = [
        r
        for r in tf.resources["aws_vpc_security_group_egress_rule"].values()
        if r["security_group_id"] == "${aws_security_group.hub.id}"
    ]
    assert hub_egress
    assert all(r.get("referenced_security_group_id") != "${aws_security_group.efs.id}" for r in hub_egress)
    assert all(2049 not in rule_ports(tf, r) for r in hub_egress)
    assert not [a for s in statements_of(tf, "hub") for a in s["actions"] if a.startswith("elasticfilesystem:Client")]
    efs_policy = str(tf.datum("aws_iam_policy_document", "efs"))
    assert "aws_iam_role.hub" not in efs_policy


def test_nat_ingress_from_private_subnets_only(tf):
    rules = ingress_of(tf, "nat")
    assert rules
    for rule in rules:
        assert rule["for_each"] == "${aws_subnet.private}"
        assert rule["cidr_ipv4"] == "${each.value.cidr_block}"
    egress = [
        r
        for r in tf.resources["aws_vpc_security_group_egress_rule"].values()
        if r["security_group_id"] == "${aws_security_group.nat.id}"
    ]
    assert egress and all(r["cidr_ipv4"] == "0.0.0.0/0" for r in egress)


def test_node_egress_web_ports(tf):
    egress = [
        r
        for r in tf.resources["aws_vpc_security_group_egress_rule"].values()
        if r["security_group_id"] == "${aws_security_group.node.id}" and r.get("cidr_ipv4") == "0.0.0.0/0"
    ]
    ports = set().union(*(rule_ports(tf, r) for r in egress))
    assert ports == {80, 443}


# --- KMS, EFS ------------------------------------------------------------------------------------------


def test_kms_key(tf):
    key = tf.resource("aws_kms_key", "main")
    assert key["enable_key_rotation"] is True
    policy = key["policy"]
    assert ":root" in policy
    assert "logs.${var.region}.amazonaws.com" in policy
    assert "sns.amazonaws.com" in policy


def test_the_spot_service_linked_role_is_made_unless_the_account_has_it_and_the_readme_says_so(tf):
    """A first spot launch needs the account's EC2 Spot service-linked role, which the key policy names; creating
    it where it exists fails the apply, so the operator must know the variable."""
    role = tf.resource("aws_iam_service_linked_role", "spot")
    assert role["aws_service_name"] == "spot.amazonaws.com"
    assert role["count"] == "${var.create_spot_service_linked_role ? 1 : 0}"
    assert tf.default("create_spot_service_linked_role") is True
    readme = " ".join((TF_DIR / "README.md").read_text().split())
    assert "EC2 Spot service-linked role" in readme and "`create_spot_service_linked_role`" in readme


def test_efs(tf):
    fs = tf.resource("aws_efs_file_system", "main")
    assert fs["encrypted"] is True and fs["kms_key_id"] == "${aws_kms_key.main.arn}"
    mt = tf.resource("aws_efs_mount_target", "private")
    assert mt["for_each"] == "${aws_subnet.private}" and mt["subnet_id"] == "${each.value.id}"
    assert mt["security_groups"] == ["${aws_security_group.efs.id}"]
    # no access point of the stack's own: each site's is the hub's to make (fleet.aws.efs), none above the sites
    assert "aws_efs_access_point" not in tf.resources
    assert one(tf.resource("aws_efs_backup_policy", "main"), "backup_policy")["status"] == "ENABLED"

    fs_policy = tf.resource("aws_efs_file_system_policy", "main")
    assert fs_policy["policy"] == "${data.aws_iam_policy_document.efs.json}"
    statements = blocks(tf.datum("aws_iam_policy_document", "efs"), "statement")
    deny = [s for s in statements if s.get("effect") == "Deny"]
    assert any(
        c["variable"] == "aws:SecureTransport" and c["values"] == ["false"]
        for s in deny
        for c in blocks(s, "condition")
    )
    allow = [s for s in statements if s.get("effect", "Allow") == "Allow"]
    # No ClientRootAccess: the access point's POSIX user is the crawl user, never root.
    assert {a for s in allow for a in s["actions"]} == {
        "elasticfilesystem:ClientMount",
        "elasticfilesystem:ClientWrite",
    }
    for s in allow:
        conditions = {c["variable"]: c["values"] for c in blocks(s, "condition")}
        assert conditions["elasticfilesystem:AccessPointArn"] == ["${local.efs_access_point_arns}"]
        assert [c["test"] for c in blocks(s, "condition") if c["variable"] == "elasticfilesystem:AccessPointArn"] == [
            "ArnLike"
        ]
        principals = one(s, "principals")["identifiers"]
        assert principals == ["${aws_iam_role.node.arn}"]


def test_every_sites_access_point_is_the_crawl_users():
    """A site's access point, as the hub makes it (fleet.aws.efs): every request through it is the crawl user's
    (not root's), in a directory of that site alone that EFS creates as that user's, 0700; its tags are the stack's
    and the site's, the ones the hub's policy lets it create with (TagKeys)."""
    from fleet.aws import efs
    from fleet.record.tags import TAG_SITE, TAG_STACK

    calls: list[dict] = []

    class Efs:
        def describe_access_points(self, **kw):
            return {"AccessPoints": []}

        def create_access_point(self, **kw):
            calls.append(kw)
            return {"AccessPointId": "fsap-0123456789abcdef0"}

    efs.ensure_site_points(Efs(), "fs-0123456789abcdef0", "gf", ["shop"], 2000)
    [call] = calls
    assert call["PosixUser"] == {"Uid": 2000, "Gid": 2000}
    assert call["RootDirectory"] == {
        "Path": "/gridfleet/sites/shop",
        "CreationInfo": {"OwnerUid": 2000, "OwnerGid": 2000, "Permissions": "0700"},
    }
    assert call["Tags"] == [{"Key": TAG_STACK, "Value": "gf"}, {"Key": TAG_SITE, "Value": "shop"}]


def test_crawl_uid_variable_matches_the_config(tf):
    """var.crawl_uid is fleet.yaml's fleet.crawl_uid: the same default, the same bounds, and it says so."""
    var = tf.variables["crawl_uid"]
    assert var["type"] == "number"
    field = FleetConfig.model_fields["crawl_uid"]
    bounds = {type(m).__name__: m for m in field.metadata}
    low, high = bounds["Ge"].ge, bounds["Le"].le
    assert (low, high) == (1000, 60000)
    assert tf.default("crawl_uid") == FleetConfig().crawl_uid == 2000
    condition = one(var, "validation")["condition"]
    assert f"var.crawl_uid >= {low}" in condition and f"var.crawl_uid <= {high}" in condition
    assert "fleet.crawl_uid" in var["description"]


# --- SQS, DynamoDB ----------------------------------------------------------------------------------------


def test_site_queue_and_dlq(tf):
    queue = tf.resource("aws_sqs_queue", "sites")
    dlq = tf.resource("aws_sqs_queue", "sites_dlq")
    assert queue["name"] == "${local.queue_name}"
    assert dlq["name"] == "${local.dlq_name}"
    # Standard queues by default; FIFO (both, names ending in .fifo) with var.queue_fifo.
    assert tf.variables["queue_fifo"]["type"] == "bool" and tf.default("queue_fifo") is False
    base = '"${trimsuffix(var.queue_name, ".fifo")}'
    assert tf.locals["queue_name"] == "${var.queue_fifo ? " + base + '.fifo" : var.queue_name}'
    assert tf.locals["dlq_name"] == "${var.queue_fifo ? " + base + '-dlq.fifo" : "${var.queue_name}-dlq"}'
    for q in (queue, dlq):
        assert q["fifo_queue"] == "${var.queue_fifo}" and q["content_based_deduplication"] is False
    assert queue["visibility_timeout_seconds"] == 90
    assert dlq["message_retention_seconds"] == 14 * 24 * 3600
    for q in (queue, dlq):
        assert q.get("kms_master_key_id") or q.get("sqs_managed_sse_enabled") is True
    redrive = queue["redrive_policy"]
    assert "aws_sqs_queue.sites_dlq.arn" in redrive
    m = re.search(r"maxReceiveCount\s*=\s*([^\s,}]+)", redrive)
    assert m, redrive
    count = m.group(1)
    if count == "var.max_receive_count":
        count = tf.default("max_receive_count")
        assert "var.max_receive_count >= 2" in one(tf.variables["max_receive_count"], "validation")["condition"]
    assert int(count) >= 2
    assert tf.default("max_receive_count") == 10


def test_status_table(tf):
    table = tf.resource("aws_dynamodb_table", "status")
    assert table["name"] == "${var.table_name}"
    assert table["hash_key"] == "run_id" and table["range_key"] == "Site"
    assert {(a["name"], a["type"]) for a in blocks(table, "attribute")} == {
        ("run_id", "S"),
        ("Site", "S"),
        (OPEN_ATTR, "S"),
    }
    # The sparse index of the open sites with the attributes of a stamp, as fleet.aws.bootstrap makes it.
    (lsi,) = blocks(table, "local_secondary_index")
    assert (lsi["name"], lsi["range_key"], lsi["projection_type"]) == (OPEN_INDEX, OPEN_ATTR, "INCLUDE")
    assert sorted(lsi["non_key_attributes"]) == sorted(OPEN_INDEX_ATTRIBUTES)
    assert "global_secondary_index" not in table
    ttl = one(table, "ttl")
    assert ttl["attribute_name"] == "expireAt" and ttl["enabled"] is True
    assert one(table, "point_in_time_recovery")["enabled"] is True
    sse = one(table, "server_side_encryption")
    assert sse["enabled"] is True and sse["kms_key_arn"] == "${aws_kms_key.main.arn}"
    assert table["billing_mode"] == "PAY_PER_REQUEST"
    assert table["deletion_protection_enabled"] is True


# --- S3 ---------------------------------------------------------------------------------------------------------------


def test_results_bucket(tf):
    assert tf.resource("aws_s3_bucket", "results")["bucket"] == "${var.bucket_name}"
    pab = tf.resource("aws_s3_bucket_public_access_block", "results")
    for key in ("block_public_acls", "block_public_policy", "ignore_public_acls", "restrict_public_buckets"):
        assert pab[key] is True, key
    rule = one(tf.resource("aws_s3_bucket_server_side_encryption_configuration", "results"), "rule")
    default = one(rule, "apply_server_side_encryption_by_default")
    assert default["sse_algorithm"] == "aws:kms" and default["kms_master_key_id"] == "${aws_kms_key.main.arn}"
    assert rule["bucket_key_enabled"] is True
    versioning = tf.resource("aws_s3_bucket_versioning", "results")
    assert one(versioning, "versioning_configuration")["status"] == "Enabled"

    lifecycle = tf.resource("aws_s3_bucket_lifecycle_configuration", "results")
    rules = {unquote(r["id"]): r for r in blocks(lifecycle, "rule")}
    assert set(rules) == {"expire-results", "expire-staging", "housekeeping"}
    assert all(r["status"] == "Enabled" for r in rules.values())
    # only results (with their evidence, by their tag) and what nodes write (under staging/) expire: the bundle and
    # configs share the bucket
    tag = one(one(rules["expire-results"], "filter"), "tag")
    assert (unquote(tag["key"]), unquote(tag["value"])) == ("gridfleet", "result")
    assert one(rules["expire-results"], "expiration")["days"] == "${var.result_retention_days}"
    assert unquote(one(rules["expire-staging"], "filter")["prefix"]) == "staging/"
    assert one(rules["expire-staging"], "expiration")["days"] == "${var.checkpoint_part_retention_days}"
    house = rules["housekeeping"]
    assert one(house, "noncurrent_version_expiration")["noncurrent_days"] == 30
    assert one(house, "abort_incomplete_multipart_upload")["days_after_initiation"] == 7

    policy = tf.resource("aws_s3_bucket_policy", "results")
    assert policy["policy"] == "${data.aws_iam_policy_document.results_bucket.json}"
    statements = blocks(tf.datum("aws_iam_policy_document", "results_bucket"), "statement")
    assert any(
        s.get("effect") == "Deny"
        and any(c["variable"] == "aws:SecureTransport" and c["values"] == ["false"] for c in blocks(s, "condition"))
        for s in statements
    )
    for rtype in (
        "aws_s3_bucket_public_access_block",
        "aws_s3_bucket_versioning",
        "aws_s3_bucket_server_side_encryption_configuration",
        "aws_s3_bucket_lifecycle_configuration",
        "aws_s3_bucket_policy",
        "aws_s3_bucket_logging",
    ):
        assert tf.resource(rtype, "results")["bucket"] == "${aws_s3_bucket.results.id}", rtype


def test_only_results_expire_and_runs_records_are_kept(tf):
    """runs/<run_id>/summary.json and report.html outlive the table's items: the only rules that expire a
    current object select the result tag, which nothing under runs/ carries, and the staging/ prefix."""
    rules = blocks(tf.resource("aws_s3_bucket_lifecycle_configuration", "results"), "rule")
    expiring = [r for r in rules if blocks(r, "expiration") or blocks(r, "transition")]
    assert [unquote(r["id"]) for r in expiring] == ["expire-results", "expire-staging"]
    (by_tag,) = blocks(expiring[0], "filter")
    assert set(by_tag) == {"tag"}, f"the results' expiry selects more than its tag: {by_tag}"
    (by_prefix,) = blocks(expiring[1], "filter")
    assert by_prefix == {"prefix": '"staging/"'} or unquote(by_prefix.get("prefix", "")) == "staging/", by_prefix
    # The variables say what they keep.
    description = tf.variables["result_retention_days"]["description"]
    assert "gridfleet=result" in description and "runs/" in description
    assert "staging/" in tf.variables["checkpoint_part_retention_days"]["description"]


# --- IAM --------------------------------------------------------------------------------------------------------------


def statements_of(tf: Config, role: str) -> list[dict[str, Any]]:
    """A document's statements, those of its source_policy_documents first (as the provider merges them)."""
    doc = tf.datum("aws_iam_policy_document", role)
    sources = [
        re.fullmatch(r"data\.aws_iam_policy_document\.(\w+)\.json", ref(s))[1]
        for s in as_list(doc.get("source_policy_documents"))
    ]
    return [st for s in sources for st in statements_of(tf, s)] + blocks(doc, "statement")


def with_action(statements: list[dict[str, Any]], action: str) -> list[dict[str, Any]]:
    return [s for s in statements if action in s["actions"]]


def conditions(tf: Config, statement: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    return {(c["test"], tf.resolve(c["variable"])): c["values"] for c in blocks(statement, "condition")}


def test_roles_profiles_and_one_inline_policy_each(tf):
    trust = {"hub": "ec2_trust", "node": "ec2_trust", "starter": "lambda_trust", "watchdog": "lambda_trust"}
    for role in ROLES:
        r = tf.resource("aws_iam_role", role)
        assert r["assume_role_policy"] == f"${{data.aws_iam_policy_document.{trust[role]}.json}}"
        assert "managed_policy_arns" not in r and "inline_policy" not in r
        policies = [
            p
            for p in tf.resources["aws_iam_role_policy"].values()
            if p["role"] == f"${{aws_iam_role.{role}.id}}" or p["role"] == f"${{aws_iam_role.{role}.name}}"
        ]
        assert len(policies) == 1, f"{role}: {len(policies)} inline policies"
        assert policies[0]["policy"] == f"${{data.aws_iam_policy_document.{role}.json}}"
    services = {
        name: one(one(tf.datum("aws_iam_policy_document", name), "statement"), "principals")["identifiers"]
        for name in ("ec2_trust", "lambda_trust")
    }
    assert services == {"ec2_trust": ["ec2.amazonaws.com"], "lambda_trust": ["lambda.amazonaws.com"]}
    for profile in ("hub", "node"):
        assert tf.resource("aws_iam_instance_profile", profile)["role"] == f"${{aws_iam_role.{profile}.name}}"
    for banned in ("aws_iam_role_policy_attachment", "aws_iam_policy_attachment", "aws_iam_policy"):
        assert banned not in tf.resources, f"{banned}: permissions come only from the inline policies"


def test_statements_are_literal_scoped_and_commented(tf):
    for role in ROLES:
        statements = statements_of(tf, role)
        assert statements
        sids = [s.get("sid") for s in statements]
        assert all(sids) and len(set(sids)) == len(sids), f"{role}: missing or repeated sid"
        for s in statements:
            assert s.get("effect", "Allow") == "Allow"
            actions = s["actions"]
            assert isinstance(actions, list) and actions, f"{role}/{s['sid']}: actions must be a literal list"
            for action in actions:
                assert not action.startswith("${"), f"{role}/{s['sid']}: {action} is an expression"
                assert "*" not in action, f"{role}/{s['sid']}: wildcard action {action}"
                assert re.fullmatch(r"[a-z0-9]+:[A-Za-z0-9]+", action), action
            assert "not_actions" not in s and "not_resources" not in s
            if "*" in as_list(s["resources"]):
                assert s["resources"] == ["*"], f"{role}/{s['sid']}: '*' beside other resources"
                assert set(actions) <= STAR_RESOURCE_ACTIONS, f"{role}/{s['sid']}: {actions} on '*'"
                for action in set(actions) & set(STAR_RESOURCE_CONDITIONS):
                    test, variable, values = STAR_RESOURCE_CONDITIONS[action]
                    assert actions == [action], f"{role}/{s['sid']}: {action} shares its condition"
                    assert conditions(tf, s) == {(test, variable): values}, f"{role}/{s['sid']}: {action} unbounded"


def test_each_statement_has_a_comment(tf):
    """Every statement of the four role policies is preceded by a comment saying what needs it."""
    text = (TF_DIR / "iam.tf").read_text()
    for role in (*ROLES, "ssm_agent"):
        start = text.index(f'data "aws_iam_policy_document" "{role}"')
        body = text[start : text.index("\n}\n", start)].splitlines()
        for i, line in enumerate(body):
            if line.strip() == "statement {":
                assert body[i - 1].strip().startswith("#"), f"{role}: no comment above {body[i + 1].strip()}"


def test_each_role_gets_exactly_its_actions(tf):
    for role, expected in EXPECTED_ACTIONS.items():
        granted = {a for s in statements_of(tf, role) for a in s["actions"]}
        assert granted == expected, f"{role}: extra {granted - expected}, missing {expected - granted}"


def test_pass_role_only_where_needed(tf):
    passes = {}
    for name in ("hub", "node", "starter", "watchdog"):  # each role's document, its sources merged in
        for s in statements_of(tf, name):
            if "iam:PassRole" in s["actions"]:
                passes.setdefault(name, []).append(s)
    assert set(passes) == {"hub", "starter", "watchdog"}
    written = [n for n, doc in tf.data["aws_iam_policy_document"].items() for s in blocks(doc, "statement")
               if "iam:PassRole" in s["actions"]]  # fmt: skip
    assert sorted(written) == ["hub", "start_hub"]  # the starter's and the watchdog's, written once
    expected = {
        "hub": "${aws_iam_role.node.arn}",
        "starter": "${aws_iam_role.hub.arn}",
        "watchdog": "${aws_iam_role.hub.arn}",
    }
    for name, statements in passes.items():
        assert len(statements) == 1
        (s,) = statements
        assert s["actions"] == ["iam:PassRole"]
        assert s["resources"] == [expected[name]], f"{name} passes {s['resources']}"
        assert conditions(tf, s)[("StringEquals", "iam:PassedToService")] == ["ec2.amazonaws.com"]


def test_hub_ec2_and_ssm_are_tag_scoped(tf):
    hub = statements_of(tf, "hub")
    (terminate,) = with_action(hub, "ec2:TerminateInstances")
    assert set(conditions(tf, terminate)[("StringEquals", "aws:ResourceTag/gridfleet:role")]) == {"node", "hub"}
    (console,) = with_action(hub, "ec2:GetConsoleOutput")
    assert conditions(tf, console)[("StringEquals", "aws:ResourceTag/gridfleet:role")] == ["node"]

    send = with_action(hub, "ssm:SendCommand")
    on_instances = [s for s in send if "${local.instance_arns}" in s["resources"]]
    assert len(on_instances) == 1
    assert conditions(tf, on_instances[0]) == {
        ("StringEquals", "ssm:resourceTag/gridfleet:role"): ["node"],
        ("StringEquals", f"ssm:resourceTag/{STACK_TAG}"): STACK,
    }
    documents = [s for s in send if s not in on_instances]
    assert documents and all(r.endswith("::document/AWS-RunShellScript") for s in documents for r in s["resources"])

    run = with_action(hub, "ec2:RunInstances")
    on_instance = [s for s in run if "${local.instance_arns}" in as_list(s["resources"])]
    assert len(on_instance) == 1
    assert conditions(tf, on_instance[0])[("StringEquals", "aws:RequestTag/gridfleet:role")] == ["node"]
    others = " ".join(str(s["resources"]) for s in run if s not in on_instance)
    assert "aws_launch_template.node.arn" in others and "aws_security_group.node.arn" in others
    assert "aws_launch_template.hub" not in others

    (tags,) = with_action(hub, "ec2:CreateTags")
    assert conditions(tf, tags)[("StringEquals", "ec2:CreateAction")] == ["RunInstances"]
    (profile,) = with_action(hub, "iam:GetInstanceProfile")  # the dry run's question, on the nodes' profile only
    assert profile["actions"] == ["iam:GetInstanceProfile"]
    assert profile["resources"] == ["${aws_iam_instance_profile.node.arn}"]
    # aws.ami's and aws.node_ami's (test_ami_arns.py), and the Grid secret (below)
    param, secret = sorted(with_action(hub, "ssm:GetParameter"), key=lambda s: str(s["resources"]))
    assert param["resources"] == "${local.ami_parameter_arns}" and secret["resources"] == ["${local.grid_secret_arn}"]
    for s in with_action(hub, "kms:Decrypt"):
        assert ("StringEquals", "kms:ViaService") in conditions(tf, s)


def test_lambda_ec2_permissions_are_tag_scoped(tf):
    for role in ("starter", "watchdog"):
        statements = statements_of(tf, role)
        run = with_action(statements, "ec2:RunInstances")
        on_instance = [s for s in run if "${local.instance_arns}" in as_list(s["resources"])]
        assert len(on_instance) == 1
        assert conditions(tf, on_instance[0])[("StringEquals", "aws:RequestTag/gridfleet:role")] == ["hub"]
        others = " ".join(str(s["resources"]) for s in run if s not in on_instance)
        assert "aws_launch_template.hub.arn" in others and "aws_security_group.hub.arn" in others
        tags = with_action(statements, "ec2:CreateTags")
        assert len(tags) == 2
        at_launch = [s for s in tags if ("StringEquals", "ec2:CreateAction") in conditions(tf, s)]
        assert len(at_launch) == 1
        assert conditions(tf, at_launch[0])[("StringEquals", "ec2:CreateAction")] == ["RunInstances"]
        (reuse,) = [s for s in tags if s not in at_launch]
        assert conditions(tf, reuse)[("StringEquals", "aws:ResourceTag/gridfleet:role")] == ["hub"]
        (start,) = with_action(statements, "ec2:StartInstances")
        assert conditions(tf, start)[("StringEquals", "aws:ResourceTag/gridfleet:role")] == ["hub"]
        (logs,) = with_action(statements, "logs:PutLogEvents")
        assert f'aws_cloudwatch_log_group.this["{role}"]' in logs["resources"][0]
    watchdog = statements_of(tf, "watchdog")
    (terminate,) = with_action(watchdog, "ec2:TerminateInstances")
    assert conditions(tf, terminate)[("StringEquals", "aws:ResourceTag/gridfleet:role")] == ["node", "hub"]
    (stop,) = with_action(watchdog, "ec2:StopInstances")
    assert conditions(tf, stop)[("StringEquals", "aws:ResourceTag/gridfleet:role")] == ["hub"]
    assert not with_action(statements_of(tf, "starter"), "ec2:TerminateInstances")


def test_no_statement_touches_another_stacks_instances(tf):
    """Two stacks in one account: whatever acts on an existing instance (terminate, stop, start, tag, command,
    console) does so only on instances tagged gridfleet:stack = var.name_prefix, and every launch must tag its
    instance so."""
    assert tf.locals["tag_stack"] == STACK_TAG
    checked = set()
    for role in ROLES:
        for s in statements_of(tf, role):
            on_instances = "${local.instance_arns}" in as_list(s["resources"])
            cond = conditions(tf, s)
            if not on_instances:
                continue
            if "ec2:RunInstances" in s["actions"]:
                assert cond.get(("StringEquals", f"aws:RequestTag/{STACK_TAG}")) == STACK, f"{role}/{s['sid']}"
                checked.add((role, "ec2:RunInstances"))
            at_launch = cond.get(("StringEquals", "ec2:CreateAction")) == ["RunInstances"]
            for action in set(s["actions"]) & INSTANCE_ACTIONS:
                if at_launch:
                    continue
                assert cond.get(("StringEquals", resource_tag(action, STACK_TAG))) == STACK, (
                    f"{role}/{s['sid']}: {action} on instances of any stack"
                )
                checked.add((role, action))
    assert {
        ("hub", "ec2:RunInstances"),
        ("hub", "ec2:TerminateInstances"),
        ("hub", "ssm:SendCommand"),
        ("hub", "ec2:GetConsoleOutput"),
        ("starter", "ec2:RunInstances"),
        ("starter", "ec2:CreateTags"),
        ("starter", "ec2:StartInstances"),
        ("watchdog", "ec2:RunInstances"),
        ("watchdog", "ec2:CreateTags"),
        ("watchdog", "ec2:StartInstances"),
        ("watchdog", "ec2:StopInstances"),
        ("watchdog", "ec2:TerminateInstances"),
    } == checked


def test_instances_are_terminated_only_as_the_stacks_hubs_and_nodes(tf):
    """The stack's tag alone is not enough: default_tags put it on every resource, the NAT instance too. Whoever
    terminates (the hub, the watchdog: orphans and stopped instances) may end only the stack's hubs and nodes."""
    for role in ("hub", "watchdog"):
        (terminate,) = with_action(statements_of(tf, role), "ec2:TerminateInstances")
        assert terminate["actions"] == ["ec2:TerminateInstances"]
        assert conditions(tf, terminate) == {
            ("StringEquals", "aws:ResourceTag/gridfleet:role"): ["node", "hub"],
            ("StringEquals", f"aws:ResourceTag/{STACK_TAG}"): STACK,
        }, role
    nat_tags = str(tf.resource("aws_instance", "nat").get("tags", ""))
    assert "tag_role" not in nat_tags and "gridfleet:role" not in nat_tags


def test_a_reusable_hub_keeps_its_stack_tag(tf):
    """A Lambda may tag a reusable hub with its run id and role, never with another stack's name."""
    for role in ("starter", "watchdog"):
        (reuse,) = [
            s
            for s in with_action(statements_of(tf, role), "ec2:CreateTags")
            if ("StringEquals", "ec2:CreateAction") not in conditions(tf, s)
        ]
        keys = conditions(tf, reuse)[("ForAllValues:StringEquals", "aws:TagKeys")]
        assert STACK_TAG not in {tf.resolve(k) for k in keys} and "${local.tag_stack}" not in keys


def test_service_principals_act_for_this_account_only(tf):
    """Every grant to an AWS service principal is bound to this account (aws:SourceAccount) or to this stack's
    resources, so the service cannot be made to use it for another account (confused deputy)."""
    #: Principals bound otherwise, with the reason.
    bound_otherwise = {
        "ec2.amazonaws.com": "instance profile trust: EC2 assumes the role only for instances this account "
        "launches with the profile, and sets no source account",
        "logs.${var.region}.amazonaws.com": "held to this account's log groups by the encryption context ARN",
    }
    found = []
    for name, doc in tf.data["aws_iam_policy_document"].items():
        for s in blocks(doc, "statement"):
            for p in blocks(s, "principals"):
                if p["type"] != "Service":
                    continue
                for service in p["identifiers"]:
                    found.append(service)
                    if service in bound_otherwise:
                        continue
                    cond = conditions(tf, s)
                    assert cond.get(("StringEquals", "aws:SourceAccount")) == ["${local.account_id}"], (
                        f"{name}/{s.get('sid')}: {service} without aws:SourceAccount"
                    )
    key_policy = tf.resource("aws_kms_key", "main")["policy"]
    for statement in key_policy_statements(key_policy):
        m = re.search(r"Principal = \{Service = (\[[^\]]*\]|\"[^\"]*\")\}", statement)
        if not m:
            continue
        services = re.findall(r'"([^"]+)"', m.group(1))
        found += services
        for service in services:
            if service in bound_otherwise:
                continue
            assert re.search(r'"aws:SourceAccount" = local\.account_id', statement), (
                f"key policy: {service} without aws:SourceAccount: {statement}"
            )
    assert {"cloudwatch.amazonaws.com", "sns.amazonaws.com", "lambda.amazonaws.com"} <= set(found)


def key_policy_statements(policy: str) -> list[str]:
    """The statement objects of the key's `jsonencode({... Statement = [{...}, ...]})` policy, as text."""
    body = policy[policy.index("Statement = [") + len("Statement = [") :]
    out, depth, start = [], 0, None
    for i, ch in enumerate(body):
        if ch == "{":
            depth += 1
            if depth == 1:
                start = i
        elif ch == "}":
            depth -= 1
            if depth == 0 and start is not None:
                out.append(body[start : i + 1])
                start = None
        elif ch == "]" and depth == 0:
            break
    assert out, policy
    return out


def test_metrics_are_put_into_the_fleet_namespace_only(tf):
    for role in ("hub", "node"):
        (put,) = with_action(statements_of(tf, role), "cloudwatch:PutMetricData")
        assert put["actions"] == ["cloudwatch:PutMetricData"] and put["resources"] == ["*"]
        assert conditions(tf, put) == {("StringEquals", "cloudwatch:namespace"): ["${var.metrics_namespace}"]}
    for role in ("starter", "watchdog"):
        assert not with_action(statements_of(tf, role), "cloudwatch:PutMetricData")
    # fleet.yaml's default namespace is the stack's, so the defaults publish where the roles may.
    assert tf.default("metrics_namespace") == MetricsConfig().namespace


def test_state_table_reads_of_the_hub(tf):
    """The hub alone batch-reads site records; the hub and the node (an idle node looks for QUEUED sites before
    it leaves) query the index `open`, and only that index. Batch writes (history lines) are the hub's and the
    watchdog's (closing an abandoned run), on the table."""
    index_arn = f"${{aws_dynamodb_table.status.arn}}/index/{OPEN_INDEX}"
    for role in ROLES:
        statements = statements_of(tf, role)
        on_index = [s for s in statements if any("/index/" in r for r in as_list(s["resources"]))]
        batch = with_action(statements, "dynamodb:BatchGetItem")
        batch_writes = with_action(statements, "dynamodb:BatchWriteItem")
        if role in ("node", "starter"):
            assert not batch_writes, role
        assert all(s["resources"] == ["${aws_dynamodb_table.status.arn}"] for s in batch_writes), role
        if role == "node":
            (index,) = on_index
            assert index["actions"] == ["dynamodb:Query"] and index["resources"] == [index_arn] and not batch
            continue
        if role != "hub":
            assert not on_index and not batch, role
            continue
        assert with_action(statements, "dynamodb:BatchWriteItem") == batch  # the same statement, the same table
        (index,) = on_index
        assert index["actions"] == ["dynamodb:Query"] and index["resources"] == [index_arn]
        (batch,) = batch
        assert batch["resources"] == ["${aws_dynamodb_table.status.arn}"]


def test_hub_writes_the_bucket_under_runs_and_beside_results_only(tf):
    """The hub puts runs/<run_id>/fleet.yaml, summary.json and report.html, and its copies of what nodes staged
    (results, evidence, quarantined results) where readers take them from; it may replace nothing else: the
    bundle and config/ are installed as root by every later hub and node."""
    hub = statements_of(tf, "hub")
    bucket = "${aws_s3_bucket.results.arn}"
    writes = {
        s["sid"]: s for s in hub if {"s3:PutObject", "s3:PutObjectTagging", "s3:DeleteObject"} & set(s["actions"])
    }
    assert set(writes) == {"RunRecordsWrite", "ResultCopies"}
    assert writes["RunRecordsWrite"]["actions"] == ["s3:PutObject"]
    assert [tf.resolve(r) for r in writes["RunRecordsWrite"]["resources"]] == [f"{bucket}/runs/*"]
    assert writes["ResultCopies"]["actions"] == ["s3:PutObject", "s3:PutObjectTagging"]
    copies = [tf.resolve(r) for r in writes["ResultCopies"]["resources"]]
    assert copies == [f"{bucket}/*/result.json", f"{bucket}/*/evidence/*", f"{bucket}/*/quarantine/*"]
    (read,) = with_action(hub, "s3:GetObject")
    assert read["actions"] == ["s3:GetObject"] and read["resources"] == [f"{bucket}/*"]


def test_watchdog_closes_an_abandoned_run_with_the_least_it_needs(tf):
    """The watchdog writes one kind of object, runs/<run_id>/summary.json, and its table actions on the table."""
    watchdog = statements_of(tf, "watchdog")
    bucket = "${aws_s3_bucket.results.arn}"
    s3 = [s for s in watchdog if any(a.startswith("s3:") for a in s["actions"])]
    (put,) = s3
    assert put["actions"] == ["s3:PutObject"]
    assert [tf.resolve(r) for r in put["resources"]] == [f"{bucket}/runs/*/summary.json"]
    table = [s for s in watchdog if any(a.startswith("dynamodb:") for a in s["actions"])]
    assert {a for s in table for a in s["actions"]} == {
        "dynamodb:Query",
        "dynamodb:GetItem",
        "dynamodb:UpdateItem",
        "dynamodb:BatchWriteItem",
    }
    assert all(s["resources"] == ["${aws_dynamodb_table.status.arn}"] for s in table)
    assert not [s for s in statements_of(tf, "starter") if any(a.startswith("s3:") for a in s["actions"])]


def test_key_is_used_through_named_services_only(tf):
    """Every role's KMS grant holds only through the services that use the key for it (kms:ViaService): the
    Lambdas' Decrypt through Lambda (their environment) and DynamoDB, the watchdog's summary through S3."""
    via = {
        name: tf.resolve(f"${{local.{name}}}")
        for name in ("via_lambda", "via_dynamodb", "via_s3", "via_sqs", "via_efs")
    }
    assert via["via_lambda"] == "lambda.${local.region}.amazonaws.com"
    for role in ROLES:
        kms = [s for s in statements_of(tf, role) if any(a.startswith("kms:") for a in s["actions"])]
        assert kms, role
        for s in kms:
            assert s["resources"] == ["${aws_kms_key.main.arn}"], (role, s["sid"])
            assert ("StringEquals", "kms:ViaService") in conditions(tf, s), f"{role}/{s['sid']}: no kms:ViaService"
    for role in ("starter", "watchdog"):
        (decrypt,) = with_action(statements_of(tf, role), "kms:Decrypt")
        assert decrypt["actions"] == ["kms:Decrypt"]
        assert conditions(tf, decrypt)[("StringEquals", "kms:ViaService")] == [
            "${local.via_lambda}",
            "${local.via_dynamodb}",
        ]
    (generate,) = with_action(statements_of(tf, "watchdog"), "kms:GenerateDataKey")
    assert generate["actions"] == ["kms:GenerateDataKey"]
    assert conditions(tf, generate)[("StringEquals", "kms:ViaService")] == ["${local.via_s3}"]
    assert not with_action(statements_of(tf, "starter"), "kms:GenerateDataKey")


def test_node_permissions(tf):
    node = statements_of(tf, "node")
    (efs,) = with_action(node, "elasticfilesystem:ClientMount")
    assert efs["resources"] == ["${aws_efs_file_system.main.arn}"]  # the stack's file system, through an access point
    assert conditions(tf, efs)[("ArnLike", "elasticfilesystem:AccessPointArn")] == ["${local.efs_access_point_arns}"]
    (read,) = with_action(node, "elasticfilesystem:DescribeAccessPoints")  # the site-mount helper's look-up
    assert read["resources"] == ["${aws_efs_file_system.main.arn}"]
    assert not with_action(node, "elasticfilesystem:CreateAccessPoint") + with_action(
        node, "elasticfilesystem:TagResource"
    )
    # everything it writes under its own prefix alone (its aws:userid), as new objects, untagged
    (put,) = with_action(node, "s3:PutObject")
    assert put["resources"] == ["${aws_s3_bucket.results.arn}/staging/$${aws:userid}/*"]
    assert conditions(tf, put) == {("StringEquals", "s3:if-none-match"): ["*"]}
    assert not with_action(node, "s3:PutObjectTagging") + with_action(node, "s3:DeleteObject")
    (kms,) = [s for s in with_action(node, "kms:Decrypt") if s["sid"] == "KeyThroughFleetServices"]
    assert "${local.via_efs}" in conditions(tf, kms)[("StringEquals", "kms:ViaService")]


def test_the_hub_makes_the_sites_access_points_of_the_stacks_file_system_only(tf):
    """The hub lists the access points of the stack's file system, creates them there only with the stack's tag and
    a site's (and no other), and tags only at that creation (EFS authorizes a creation's tags as TagResource)."""
    hub = statements_of(tf, "hub")
    fs = ["${aws_efs_file_system.main.arn}"]
    (read,) = with_action(hub, "elasticfilesystem:DescribeAccessPoints")
    (create,) = with_action(hub, "elasticfilesystem:CreateAccessPoint")
    (tag,) = with_action(hub, "elasticfilesystem:TagResource")
    assert read["resources"] == fs and create["resources"] == fs
    assert [s["actions"] for s in (read, create, tag)] == [
        ["elasticfilesystem:DescribeAccessPoints"],
        ["elasticfilesystem:CreateAccessPoint"],
        ["elasticfilesystem:TagResource"],
    ]
    keys = ["${local.tag_stack}", "${local.tag_site}"]
    for s in (create, tag):
        assert conditions(tf, s)[("StringEquals", "aws:RequestTag/gridfleet:stack")] == ["${var.name_prefix}"]
        assert conditions(tf, s)[("ForAllValues:StringEquals", "aws:TagKeys")] == keys
    assert conditions(tf, create)[("Null", "aws:RequestTag/gridfleet:site")] == ["false"]
    assert conditions(tf, tag)[("StringEquals", "elasticfilesystem:CreateAction")] == ["CreateAccessPoint"]
    assert tag["resources"] == ["${local.efs_access_point_arns}"]
    assert not [s for s in hub if any(a.startswith("elasticfilesystem:Client") for a in s["actions"])]  # never mounts


def test_the_grid_secret_is_put_by_the_hub_and_read_by_the_nodes_alone(tf):
    """The Grid's secret, /<stack>/grid-secret (fleet.config.aws): the hub may read and put it (a hub that boots for
    a run whose secret is there keeps it) and the nodes read it, that parameter only; the stack's key encrypts and
    decrypts it for the hub and decrypts it for the nodes through SSM, for that parameter only (SSM names it in the
    encryption context)."""
    arn = tf.resolve("${local.grid_secret_arn}")
    assert arn == (
        "arn:${local.partition}:ssm:${local.region}:${local.account_id}:parameter/${var.name_prefix}/grid-secret"
    )
    assert AwsConfig(stack="s").grid_secret_parameter == "/s/grid-secret" and AwsConfig(stack="s").kms_key_alias == (
        tf.resource("aws_kms_alias", "main")["name"].replace("${var.name_prefix}", "s")
    )
    grants = (
        ("hub", ["ssm:GetParameter", "ssm:PutParameter"], ["kms:Decrypt", "kms:Encrypt"]),
        ("node", ["ssm:GetParameter"], ["kms:Decrypt"]),
    )
    for role, actions, uses in grants:
        statements = statements_of(tf, role)
        (grant,) = [s for s in statements if s["resources"] == ["${local.grid_secret_arn}"]]
        assert sorted(grant["actions"]) == actions, role
        (key,) = [s for s in with_action(statements, uses[0]) if s["sid"] == "KeyForGridSecret"]
        assert sorted(key["actions"]) == uses and key["resources"] == ["${aws_kms_key.main.arn}"], role
        assert conditions(tf, key) == {
            ("StringEquals", "kms:ViaService"): ["${local.via_ssm}"],
            ("StringEquals", "kms:EncryptionContext:PARAMETER_ARN"): ["${local.grid_secret_arn}"],
        }, role
    for role in ("starter", "watchdog"):
        assert not [s for s in statements_of(tf, role) if "${local.grid_secret_arn}" in as_list(s["resources"])]


# --- launch templates -----------------------------------------------------------------------------------------


def test_launch_templates(tf):
    ami = tf.datum("aws_ssm_parameter", "ami")
    assert ami["name"] == "${var.ami_parameter}"
    assert tf.default("ami_parameter") == "/aws/service/debian/release/12/latest/amd64"
    assert "data.aws_ami.base.id" in tf.locals["ami_id"]
    assert "data.aws_ssm_parameter.ami" in str(tf.datum("aws_ami", "base"))
    # the nodes' image: node_ami_parameter (a baked node image, infra/packer), by default the stack's own
    assert tf.default("node_ami_parameter") is None
    assert tf.locals["node_ami_parameter"] == "${coalesce(var.node_ami_parameter, var.ami_parameter)}"
    assert tf.datum("aws_ssm_parameter", "node_ami")["name"] == "${local.node_ami_parameter}"
    assert "data.aws_ssm_parameter.node_ami" in str(tf.datum("aws_ami", "node"))
    assert "data.aws_ami.node.id" in tf.locals["node_ami_id"]
    # the hubs' image: hub_ami_parameter (a baked node image boots a hub without downloads), by default the stack's
    assert tf.default("hub_ami_parameter") is None
    assert tf.locals["hub_ami_parameter"] == "${coalesce(var.hub_ami_parameter, var.ami_parameter)}"
    assert tf.datum("aws_ssm_parameter", "hub_ami")["name"] == "${local.hub_ami_parameter}"
    assert "data.aws_ami.hub.id" in tf.locals["hub_ami_id"]
    images = {"hub": "${local.hub_ami_id}", "node": "${local.node_ami_id}"}
    disks = {"hub": "${local.hub_root_device_name}", "node": "${local.node_root_device_name}"}
    profiles = {"hub": "aws_iam_instance_profile.hub", "node": "aws_iam_instance_profile.node"}
    for role in ("hub", "node"):
        lt = tf.resource("aws_launch_template", role)
        assert lt["image_id"] == images[role]
        assert one(lt, "block_device_mappings")["device_name"] == disks[role]
        md = one(lt, "metadata_options")
        assert md["http_tokens"] == "required"
        assert md["http_put_response_hop_limit"] == 1
        assert md["http_endpoint"] == "enabled"
        ebs = one(one(lt, "block_device_mappings"), "ebs")
        assert ebs["encrypted"] is True and ebs["volume_type"] == "gp3"
        assert ebs["kms_key_id"] == "${aws_kms_key.main.arn}"
        assert profiles[role] in one(lt, "iam_instance_profile")["name"]
        assert one(lt, "monitoring")["enabled"] is True
        tagged = {spec["resource_type"]: spec["tags"] for spec in blocks(lt, "tag_specifications")}
        assert set(tagged) == {"instance", "volume"}
        for tags in tagged.values():
            assert re.search(rf'\(local\.tag_role\)\s*=\s*"{role}"', tags), tags
    assert tf.locals["tag_role"] == "gridfleet:role"
    hub = tf.resource("aws_launch_template", "hub")
    node = tf.resource("aws_launch_template", "node")
    assert one(hub, "metadata_options")["instance_metadata_tags"] == "enabled"
    assert node["instance_initiated_shutdown_behavior"] == "terminate"
    assert hub["user_data"] == "${filebase64(local.hub_user_data_file)}"
    assert "path.module" in tf.locals["hub_user_data_file"]
    assert "hub-user-data.yaml" in tf.locals["hub_user_data_file"]
    assert "gridfleet render hub" in tf.variables["hub_user_data_file"]["description"]
    assert "user_data" not in node
    assert one(hub, "network_interfaces")["security_groups"] == ["${aws_security_group.hub.id}"]
    assert node["vpc_security_group_ids"] == ["${aws_security_group.node.id}"]


def test_a_hub_from_the_template_ends_with_its_run(tf):
    """The starter launches a hub from the template for each run, and the hub ends with `shutdown -h`: it must
    terminate, not leave a stopped instance and its volume behind each day."""
    hub = tf.resource("aws_launch_template", "hub")
    assert hub["instance_initiated_shutdown_behavior"] == "terminate"
    assert one(one(hub, "block_device_mappings"), "ebs")["delete_on_termination"] is True
    # A reusable hub is the operator's own instance, which keeps stop: the docs say so where they name it.
    for doc in ("README.md", "terraform.tfvars.example"):
        paragraphs = re.split(r"\n\s*\n", (TF_DIR / doc).read_text())
        naming = [p for p in paragraphs if "GRIDFLEET_HUB_INSTANCE_ID" in p]
        assert any(
            re.search(r"shutdown behaviour,? [`\"]stop[`\"]|[`\"]stop[`\"] as its shutdown", p) for p in naming
        ), f"{doc}: the reusable hub's shutdown behaviour (stop) is not stated"


def test_every_launch_template_tags_the_stack(tf):
    """The templates tag every instance and volume gridfleet:stack = var.name_prefix."""
    assert tf.locals["launch_tags"] == {"${(local.tag_stack)}": "${var.name_prefix}"}
    for role in ("hub", "node"):
        for spec in blocks(tf.resource("aws_launch_template", role), "tag_specifications"):
            assert "local.launch_tags" in spec["tags"], (role, spec["resource_type"])


# --- Lambdas and schedules ---------------------------------------------------------------------------------------


def test_lambdas(tf):
    handlers = {"starter": "lambdas.starter.handler", "watchdog": "lambdas.watchdog.handler"}
    env_keys = {
        "GRIDFLEET_REGION",
        "GRIDFLEET_STACK",
        "GRIDFLEET_TABLE",
        "GRIDFLEET_BUCKET",
        "GRIDFLEET_HUB_LAUNCH_TEMPLATE",
        "GRIDFLEET_HUB_STALE_S",
        "GRIDFLEET_RUN_GRACE_S",
        "GRIDFLEET_LOOKBACK_RUNS",
        "GRIDFLEET_NOTIFY_TOPIC_ARN",
    }
    env = tf.locals["lambda_environment"]
    assert set(env) == env_keys
    assert env["GRIDFLEET_HUB_LAUNCH_TEMPLATE"] == "${aws_launch_template.hub.name}"
    # The Lambdas act on this stack's instances only, and the watchdog puts a closed run's summary in the bucket.
    assert env["GRIDFLEET_STACK"] == "${var.name_prefix}"
    assert env["GRIDFLEET_BUCKET"] == "${aws_s3_bucket.results.id}"
    assert tf.default("hub_stale_s") == 600 and tf.default("run_grace_s") == 3600
    assert tf.default("lookback_runs") == 7
    assert tf.locals["lambda_zip_key"] == "bundle/gridfleet-lambda.zip"
    for name, handler in handlers.items():
        fn = tf.resource("aws_lambda_function", name)
        assert fn["runtime"] == "python3.11"
        assert tf.resolve(fn["handler"]) in (handler, f"${{local.lambdas.{name}.handler}}")
        assert tf.locals["lambdas"][name]["handler"] == handler
        assert fn["role"] == f"${{aws_iam_role.{name}.arn}}"
        assert fn["s3_bucket"] == "${aws_s3_bucket.results.id}"
        assert fn["s3_key"] == "${local.lambda_zip_key}"
        assert one(fn, "environment")["variables"] == (
            "${merge(local.lambda_environment, local.reusable_hub_environment)}"
        )
        assert fn["kms_key_arn"] == "${aws_kms_key.main.arn}"
        assert fn["timeout"] == 60
        assert fn["reserved_concurrent_executions"] == "${var.lambda_reserved_concurrency}"
        assert one(fn, "tracing_config")["mode"] == "Active"
        assert f'aws_sqs_queue.lambda_dlq["{name}"]' in one(fn, "dead_letter_config")["target_arn"]


def test_the_end_of_run_topic(tf):
    """The stack's topic (or var.notify_topic_arn's), encrypted with the AWS-managed key; the hub and the
    watchdog may publish to it and to no other topic; the watchdog is told it, the operator reads it."""
    topic = tf.resource("aws_sns_topic", "runs")
    assert topic["count"] == "${var.notify_topic_arn == null ? 1 : 0}"
    assert topic["kms_master_key_id"] == "alias/aws/sns"
    assert tf.default("notify_topic_arn") is None
    assert tf.locals["notify_topic_arn"] == "${coalesce(var.notify_topic_arn, one(aws_sns_topic.runs[*].arn))}"
    assert "var.notify_topic_arn == null" in one(tf.variables["notify_topic_arn"], "validation")["condition"]
    for role in ("hub", "watchdog"):
        (publish,) = with_action(statements_of(tf, role), "sns:Publish")
        assert publish["actions"] == ["sns:Publish"] and publish["resources"] == ["${local.notify_topic_arn}"]
    for role in ("node", "starter"):
        assert not with_action(statements_of(tf, role), "sns:Publish")
    assert tf.locals["lambda_environment"]["GRIDFLEET_NOTIFY_TOPIC_ARN"] == "${local.notify_topic_arn}"
    assert tf.outputs["notify_topic_arn"]["value"] == "${local.notify_topic_arn}"


def test_a_reusable_hub_is_configured_by_a_variable(tf):
    """var.hub_instance_id, when set, is the Lambdas' GRIDFLEET_HUB_INSTANCE_ID; unset, they have none."""
    assert tf.default("hub_instance_id") is None
    assert tf.locals["reusable_hub_environment"] == (
        "${var.hub_instance_id == null ? {} : {GRIDFLEET_HUB_INSTANCE_ID = var.hub_instance_id}}"
    )
    assert "hub_instance_id == null" in one(tf.variables["hub_instance_id"], "validation")["condition"]
    description = tf.variables["hub_instance_id"]["description"]
    assert "GRIDFLEET_HUB_INSTANCE_ID" in description and "gridfleet:stack" in description and "stop" in description


def test_schedules(tf):
    rules = tf.resources["aws_cloudwatch_event_rule"]
    assert rules["start"]["schedule_expression"] == "${var.start_schedule}"
    assert tf.default("start_schedule") == "cron(0 1 * * ? *)"
    description = tf.variables["start_schedule"]["description"]
    assert "rate(3 days)" in description or "*/3" in description
    watchdog = rules["watchdog"]["schedule_expression"]
    if watchdog == "${var.watchdog_schedule}":
        watchdog = tf.default("watchdog_schedule")
    assert watchdog == "rate(2 minutes)"
    for rule, fn in (("start", "starter"), ("watchdog", "watchdog")):
        target = tf.resource("aws_cloudwatch_event_target", rule)
        assert target["rule"] == f"${{aws_cloudwatch_event_rule.{rule}.name}}"
        assert target["arn"] == f"${{aws_lambda_function.{fn}.arn}}"
        permission = tf.resource("aws_lambda_permission", rule)
        assert permission["principal"] == "events.amazonaws.com"
        assert permission["source_arn"] == f"${{aws_cloudwatch_event_rule.{rule}.arn}}"
        assert permission["function_name"] == f"${{aws_lambda_function.{fn}.function_name}}"
    assert all("event_pattern" not in r for r in rules.values()), "no event rule: nodes watch their own spot notice"


# --- monitoring -------------------------------------------------------------------------------------------------------


def test_log_groups(tf):
    groups = tf.resources["aws_cloudwatch_log_group"]
    assert groups
    names = set()
    for group in groups.values():
        assert group["retention_in_days"] == "${var.log_retention_days}"
        assert group["kms_key_id"] == "${aws_kms_key.main.arn}"
        if group["name"] == "${each.value}":
            names |= {tf.resolve(v) for v in tf.locals[ref(group["for_each"]).removeprefix("local.")].values()}
        else:
            names.add(group["name"])
    # Named after the stack, so that stacks share an account and region, as fleet.yaml derives them from aws.stack.
    assert {"/${var.name_prefix}/hub", "/${var.name_prefix}/node", "/${var.name_prefix}/vpc-flow-logs"} <= names
    assert all("${var.name_prefix}" in n for n in names), names
    aws = AwsConfig(stack="prod")
    assert (aws.log_group_hub, aws.log_group_node) == ("/prod/hub", "/prod/node")
    assert {"/aws/lambda/gridfleet-starter", "/aws/lambda/gridfleet-watchdog"} <= {
        n.replace("${var.name_prefix}", "gridfleet") for n in names
    }
    for role in ("hub", "node"):
        assert tf.outputs[f"{role}_log_group"]["value"] == f'${{aws_cloudwatch_log_group.this["{role}"].name}}'


def test_dashboard(tf):
    dashboard = tf.resource("aws_cloudwatch_dashboard", "fleet")
    body = str(dashboard["dashboard_body"]) + str(tf.locals["dashboard_widgets"])
    for metric in (
        "ApproximateNumberOfMessagesVisible",
        "ApproximateNumberOfMessagesNotVisible",
        "ActiveNodes",
        "SitesQueued",
        "SitesRunning",
        "SitesCompleted",
        "SitesFailed",
        "RunProgress",
        "Kills",
        "JobsCompleted",
        "JobErrors",
        "JobDuration",
        "Heartbeat",
    ):
        assert metric in body, metric
    assert "aws_sqs_queue.sites_dlq.name" in body
    assert "var.metrics_namespace" in body
    assert tf.default("metrics_namespace") == "gridfleet"
    for w in tf.locals["dashboard_widgets"]:  # what jsonencode makes of it must be a widget CloudWatch reads
        assert w["title"] and w["stat"] and w["metrics"], w
        ids = []
        for entry in w["metrics"]:
            assert isinstance(entry, list) and entry, (w["title"], entry)
            if isinstance(entry[0], dict):  # an expression: [{expression, id, label}]
                assert len(entry) == 1 and {"expression", "id"} <= set(entry[0]), (w["title"], entry)
                ids.append(entry[0]["id"])
            else:  # [namespace, name, (dimension, value)..., {options}]
                plain = [e for e in entry if not isinstance(e, dict)]
                assert len(plain) % 2 == 0 and all(isinstance(e, str) for e in plain), (w["title"], entry)
                assert all(isinstance(e, dict) for e in entry[len(plain) :]), (w["title"], entry)
        assert len(ids) == len(set(ids)), f"{w['title']}: repeated expression id"


# --- what the code publishes, against what the dashboard and the alarms read --------------------------------------

#: The modules that publish gridfleet's CloudWatch metrics: every `Datum(...)` of theirs.
PUBLISHERS = ("hub/monitor.py", "fleet/aws/metrics.py")
#: Metrics the hub publishes as a count per publish; every other metric of the hub's is a gauge (a current value).
PER_PUBLISH_COUNTS = {"Kills"}
#: Published but not drawn, with the reason.
NOT_DRAWN = {"QueueVisible", "QueueInFlight", "QueueDlq"}  # the SQS widget reads the same depths from SQS

SEARCH_RE = re.compile(
    r"""SEARCH\('\{\$\{local\.search_namespace\},([A-Za-z,]+)\} MetricName=\\?"(\w+)\\?"', '(\w+)', 300\)"""
)


def _dims(node: ast.expr | None, env: dict[str, tuple[str, ...]]) -> tuple[str, ...] | None:
    """The dimension names of a `dims` argument: literal pairs, names bound to them, and their sums."""
    if node is None:
        return ()
    if isinstance(node, ast.Name):
        return env.get(node.id)
    if isinstance(node, ast.Tuple):
        names = [
            e.elts[0].value
            for e in node.elts
            if isinstance(e, ast.Tuple)
            and e.elts
            and isinstance(e.elts[0], ast.Constant)
            and isinstance(e.elts[0].value, str)
        ]
        return tuple(names) if len(names) == len(node.elts) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _dims(node.left, env), _dims(node.right, env)
        return None if left is None or right is None else left + right
    return None


def published_metrics() -> dict[str, dict[str, set[frozenset[str]]]]:
    """module -> metric name -> the dimension-name sets the code publishes it with (read from its source)."""
    out: dict[str, dict[str, set[frozenset[str]]]] = {}
    for module in PUBLISHERS:
        tree = ast.parse((ROOT / module).read_text())
        found = out.setdefault(module, {})
        for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            env: dict[str, tuple[str, ...]] = {}
            for node in ast.walk(func):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    dims = _dims(node.value, env)
                    if dims is not None:
                        env[node.targets[0].id] = dims
            for node in ast.walk(func):
                if not (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Datum"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                ):
                    continue
                arg = next(
                    (k.value for k in node.keywords if k.arg == "dims"), node.args[3] if len(node.args) > 3 else None
                )
                dims = _dims(arg, env)
                assert dims is not None, f"{module}:{node.lineno}: dims of {node.args[0].value} not read"
                found.setdefault(node.args[0].value, set()).add(frozenset(dims))
    return out


def custom_metrics_read(tf: Config) -> list[tuple[str, str, frozenset[str], str]]:
    """(where, metric, dimension names, statistic) of every read of metrics_namespace in widgets and alarms."""
    ns = "${var.metrics_namespace}"
    assert tf.locals["search_namespace"].replace('\\"', '"') == f'"{ns}"'
    out = []
    for w in tf.locals["dashboard_widgets"]:
        for entry in w["metrics"]:
            if isinstance(entry[0], dict):
                expression = entry[0]["expression"]
                if "search_namespace" not in expression and ns not in expression:
                    continue
                m = SEARCH_RE.fullmatch(expression)
                assert m, f"{w['title']}: an expression over the fleet's namespace that is not a SEARCH: {expression}"
                out.append((w["title"], m.group(2), frozenset(m.group(1).split(",")), m.group(3)))
            elif entry[0] == ns:
                plain = [e for e in entry if not isinstance(e, dict)]
                options = next((e for e in entry if isinstance(e, dict)), {})
                out.append((w["title"], plain[1], frozenset(plain[2::2]), options.get("stat", w["stat"])))
    for name, alarm in tf.resources["aws_cloudwatch_metric_alarm"].items():
        if alarm.get("namespace") == ns:
            out.append(
                (f"alarm {name}", alarm["metric_name"], frozenset(alarm.get("dimensions") or {}), alarm["statistic"])
            )
    return out


def test_published_metrics_are_read_from_the_code():
    found = published_metrics()
    assert {"ActiveNodes", "SitesCompleted", "RunProgress", "Kills"} <= set(found["hub/monitor.py"])
    assert frozenset({"KillPath"}) in found["hub/monitor.py"]["Kills"]
    assert found["fleet/aws/metrics.py"]["JobErrors"] == {frozenset({"WorkerId", "ErrorType"})}


def test_widgets_and_alarms_read_only_metrics_the_code_publishes(tf):
    found = published_metrics()
    published: dict[str, set[frozenset[str]]] = {}
    for metrics in found.values():
        for name, dims in metrics.items():
            published.setdefault(name, set()).update(dims)
    read = custom_metrics_read(tf)
    assert read
    for where, metric, dims, _ in read:
        assert metric in published, f"{where}: {metric} is not a metric gridfleet publishes"
        assert dims in published[metric], (
            f"{where}: {metric} by {sorted(dims)}, "
            f"but the code publishes it by {[sorted(d) for d in published[metric]]}"
        )
    drawn = {metric for where, metric, _, _ in read if not where.startswith("alarm ")}
    assert set(published) - drawn == NOT_DRAWN, "a published metric is neither drawn nor listed in NOT_DRAWN"
    gauges = set(found["hub/monitor.py"]) - PER_PUBLISH_COUNTS
    for where, metric, _, stat in read:
        if metric in gauges:  # a Sum of a gauge adds the same count up once per publish
            assert stat in ("Maximum", "Minimum", "Average"), f"{where}: {metric} is a gauge, read with {stat}"


def test_alarms(tf):
    topic = tf.resource("aws_sns_topic", "alarms")
    assert topic["kms_master_key_id"] == "${aws_kms_key.main.arn}"
    sub = tf.resource("aws_sns_topic_subscription", "alarm_email")
    assert "var.alarm_email" in sub["count"] and sub["endpoint"] == "${var.alarm_email}"
    alarms = tf.resources["aws_cloudwatch_metric_alarm"]
    by_metric = {a["metric_name"]: a for a in alarms.values()}
    assert set(by_metric) == {"ApproximateNumberOfMessagesVisible", "ApproximateAgeOfOldestMessage", "ActiveNodes"}
    for alarm in alarms.values():
        assert "${aws_sns_topic.alarms.arn}" in alarm["alarm_actions"]
    assert by_metric["ApproximateNumberOfMessagesVisible"]["threshold"] == "${var.queue_depth_alarm_threshold}"
    overdue = by_metric["ApproximateAgeOfOldestMessage"]
    assert overdue["threshold"] == "${var.run_overdue_s}" and tf.default("run_overdue_s") == 21600
    ceiling = by_metric["ActiveNodes"]
    assert ceiling["namespace"] == "${var.metrics_namespace}"
    assert ceiling["threshold"] == "${var.max_nodes}"
    assert ceiling["treat_missing_data"] == "notBreaching"
    assert overdue["treat_missing_data"] == "notBreaching"


# --- outputs ----------------------------------------------------------------------------------------------------------


def test_outputs(tf):
    for name in (
        "region",
        "table",
        "queue",
        "dlq",
        "bucket",
        "efs_id",
        "private_subnet_ids",
        "node_security_group_ids",
        "node_instance_profile",
        "hub_instance_profile",
        "ami_parameter",
        "node_launch_template",
        "hub_launch_template",
        "nat_public_ip",
        "alarms_topic_arn",
        "notify_topic_arn",
    ):
        assert name in tf.outputs, f"missing output {name}"
    value = tf.outputs["gridfleet_aws"]["value"]
    assert set(value) == GRIDFLEET_AWS_KEYS
    assert GRIDFLEET_AWS_KEYS <= set(AwsConfig.model_fields), "every key must be an aws: key of fleet.yaml"
    assert "aws_subnet.private" in value["subnet_ids"]
    assert value["security_group_ids"] == ["${aws_security_group.node.id}"]
    assert value["instance_profile"] == "${aws_iam_instance_profile.node.name}"
    assert value["ami"] == "${var.ami_parameter}"
    assert value["node_ami"] == "${local.node_ami_parameter}"
    assert value["key_name"] == "${var.key_name}"
    assert value["node_launch_template"] == "${aws_launch_template.node.name}"
    assert value["stack"] == "${var.name_prefix}"  # the tag every instance of the stack carries


def test_the_output_is_a_valid_aws_section():
    """`gridfleet config from-terraform` accepts the output as Terraform would print it for the defaults."""
    from cli.commands.tf_config import OUTPUT, aws_section

    tf = config()
    value = {}
    for key, expr in tf.outputs[OUTPUT]["value"].items():
        if isinstance(expr, str) and re.fullmatch(r"\$\{var\.\w+\}", expr):  # a variable: its default
            value[key] = tf.default(ref(expr).removeprefix("var."))
        elif key == "queue_fifo":
            value[key] = False
        elif key == "node_ami":  # local.node_ami_parameter: an SSM parameter's name, by default ami_parameter's
            value[key] = tf.default("ami_parameter")
        elif key in ("subnet_ids", "security_group_ids"):  # lists of ids
            value[key] = [f"{key[:-4]}-0123456789abcdef0"]
        elif key == "efs_id":  # an id of the shape EFS gives (the config checks it as rendering does)
            value[key] = "fs-0123456789abcdef0"
        else:  # a resource's name or id
            value[key] = f"{key}-example"
    section = aws_section(json.dumps({OUTPUT: {"value": value}}))
    assert AwsConfig.model_validate(section["aws"]).stack == section["aws"]["stack"] == tf.default("name_prefix")


def test_every_name_prefix_is_a_valid_stack():
    """var.name_prefix becomes fleet.yaml's aws.stack: what the variable accepts, the config must accept."""
    condition = one(config().variables["name_prefix"], "validation")["condition"]
    m = re.search(r'regex\("(.+?)", var\.name_prefix\)', condition)
    assert m, condition
    accepted = re.compile(m.group(1))
    stack = re.compile(AwsConfig.model_json_schema()["properties"]["stack"]["pattern"])
    names = ["gridfleet", "ab", "a" * 31, "crawl-prod-2", "a-", "a--b", "z9"]
    assert all(accepted.fullmatch(n) for n in names)
    for name in names:
        assert stack.fullmatch(name), f"name_prefix {name!r} is not a valid aws.stack"
    for name in ("a", "a" * 32, "9abc", "Ab", "a_b", "a.b", "-ab"):  # refused by the variable already
        assert not accepted.fullmatch(name), name


# --- checkov ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkov_report() -> dict[str, Any]:
    if not CHECKOV.exists():
        pytest.fail(f"checkov is not installed at {CHECKOV}: run make setup")
    proc = subprocess.run(
        [str(CHECKOV), "-d", str(TF_DIR), "--framework", "terraform", "-o", "json", "--skip-download"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert proc.returncode in (0, 1), f"checkov failed to run (status {proc.returncode}):\n{proc.stderr[-3000:]}"
    report = json.loads(proc.stdout)
    if isinstance(report, list):  # one entry per framework
        (report,) = [r for r in report if r.get("check_type") == "terraform"]
    return report


@pytest.mark.slow
def test_checkov_has_no_failed_check(checkov_report):
    summary = checkov_report["summary"]
    failed = checkov_report["results"].get("failed_checks", [])
    listing = "\n".join(f"{c['check_id']} {c['resource']} ({c['file_path']})" for c in failed)
    assert summary["failed"] == 0 and not failed, f"checkov failures:\n{listing}"
    assert summary["parsing_errors"] == 0
    assert summary["passed"] > 100


@pytest.mark.slow
def test_every_checkov_skip_has_a_reason_and_is_documented(checkov_report):
    skipped = checkov_report["results"].get("skipped_checks", [])
    readme = (TF_DIR / "README.md").read_text()
    for check in skipped:
        reason = (check.get("check_result") or {}).get("suppress_comment", "").strip()
        assert len(reason) > 20, f"{check['check_id']} on {check['resource']} is skipped without a reason"
        assert check["check_id"] in readme, f"{check['check_id']} is skipped but not explained in the README"


def test_skip_comments_are_inline_with_reasons(tf):
    for (rtype, name), body in tf.raw_resources.items():
        for comment in comments(body):
            m = re.match(r"\s*checkov:skip=([A-Z0-9_]+)(?::(.*))?$", comment)
            if m:
                assert m.group(2) and len(m.group(2).strip()) > 20, f"{rtype}.{name}: {m.group(1)} has no reason"
