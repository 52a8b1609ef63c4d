"""infra/terraform applied to a moto server by `twin.terraform.apply`, read back through the AWS APIs.

The server is this module's own (ThreadedMotoServer on 127.0.0.1, any free port). The expectations come from
the .tf files as tests/infra reads them (python-hcl2, literals unquoted), from the variables the test passes,
and from what moto answers for the resources they refer to, never from the module under test. One stack (with
overrides of several variables) is applied once for the module; the tests that break the configuration apply
copies of infra/terraform with one change, under names of their own. Nothing is faked.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from moto.server import ThreadedMotoServer

from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.clock import FakeClock
from fleet.config.aws import AwsConfig
from fleet.record.tags import TAG_ROLE, TAG_RUN_ID, TAG_STACK
from tests.helpers.stacks import stack_names
from tests.infra.test_terraform import SSM_AGENT_ACTIONS, TF_DIR, blocks, one, statements_of
from tests.infra.test_terraform import config as terraform
from twin.schedules import Schedules, stack_handlers
from twin.terraform.apply import SKIPPED, StackOutputs, TfError, apply_stack

REGION = "ap-northeast-2"
HUB_USER_DATA = "#cloud-config\nruncmd:\n  - [echo, hub]\n"
HUB_INSTANCE = "i-0123456789abcdef0"


def names() -> dict[str, str]:
    return stack_names("gft")


@pytest.fixture(scope="module")
def endpoint():
    """A moto server of this module's own, so that what the tests count (VPCs, topics) is this module's."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{server.get_host_and_port()[1]}"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def clients(endpoint) -> AwsClients:
    return AwsClients(AwsConfig(endpoint_url=endpoint, region=REGION), credentials=LOCAL_CREDENTIALS)


@pytest.fixture(scope="module")
def ami(clients) -> str:
    return clients.client("ec2").describe_images()["Images"][0]["ImageId"]


@pytest.fixture(scope="module")
def variables() -> dict[str, object]:
    return {**names(), "hub_instance_id": HUB_INSTANCE, "watchdog_schedule": "rate(5 minutes)", "crawl_uid": 2345}


@pytest.fixture(scope="module")
def stack(clients, ami, variables) -> StackOutputs:
    return apply_stack(clients, TF_DIR, variables, hub_user_data=HUB_USER_DATA, ami_id=ami)


def tags(pairs) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in pairs}


def template_data(clients, name: str) -> dict:
    versions = clients.client("ec2").describe_launch_template_versions(LaunchTemplateName=name)
    return versions["LaunchTemplateVersions"][0]["LaunchTemplateData"]


def snake_to_api(block: dict) -> dict:
    return {"".join(p.capitalize() for p in k.split("_")): v for k, v in block.items()}


@pytest.mark.parametrize("role", ["hub", "node"])
def test_launch_templates_hold_what_the_tf_sets(clients, stack, variables, ami, role):
    tf = terraform()
    lt = tf.resource("aws_launch_template", role)
    prefix = variables["name_prefix"]
    data = template_data(clients, f"{prefix}-{role}")

    assert data["InstanceInitiatedShutdownBehavior"] == lt["instance_initiated_shutdown_behavior"] == "terminate"
    assert data["MetadataOptions"] == snake_to_api(one(lt, "metadata_options"))
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["MetadataOptions"]["InstanceMetadataTags"] == ("enabled" if role == "hub" else "disabled")
    assert data["IamInstanceProfile"] == {"Name": f"{prefix}-{role}"}
    assert data["ImageId"] == ami
    assert data["InstanceType"] == tf.default(f"{role}_instance_type")
    assert data["Monitoring"] == {"Enabled": True}
    [disk] = data["BlockDeviceMappings"]
    assert disk["Ebs"]["VolumeSize"] == tf.default(f"{role}_volume_size_gb")
    assert disk["Ebs"]["Encrypted"] is True and disk["Ebs"]["VolumeType"] == "gp3"

    # The instance and its volumes are tagged as the code expects; the template's own tags stay off its data.
    expected = {TAG_STACK: prefix, TAG_ROLE: role, **({"Name": f"{prefix}-hub"} if role == "hub" else {})}
    specs = {s["ResourceType"]: tags(s["Tags"]) for s in data["TagSpecifications"]}
    assert specs == {s["resource_type"]: expected for s in blocks(lt, "tag_specifications")}

    if role == "hub":
        assert base64.b64decode(data["UserData"]).decode() == HUB_USER_DATA
        [nic] = data["NetworkInterfaces"]
        assert nic["SubnetId"] == stack.private_subnet_ids[0]
        assert nic["Groups"] == [stack.hub_security_group_id]
        assert nic["AssociatePublicIpAddress"] is False and nic["DeviceIndex"] == 0
    else:
        assert "UserData" not in data and "NetworkInterfaces" not in data
        assert data["SecurityGroupIds"] == [stack.node_security_group_id]


def test_schedules_target_the_functions_as_events_tf_says(clients, stack, variables):
    tf = terraform()
    events, awslambda = clients.client("events"), clients.client("lambda")
    expected_schedule = {"start": tf.default("start_schedule"), "watchdog": variables["watchdog_schedule"]}
    for rule_name, function in (("start", stack.starter_function), ("watchdog", stack.watchdog_function)):
        rule = events.describe_rule(Name=f"{variables['name_prefix']}-{rule_name}")
        assert rule["ScheduleExpression"] == expected_schedule[rule_name]
        assert rule["State"] == "ENABLED"
        [target] = events.list_targets_by_rule(Rule=rule["Name"])["Targets"]
        tf_target = tf.resource("aws_cloudwatch_event_target", rule_name)
        assert target["Id"] == tf_target["target_id"]
        assert target["Arn"] == awslambda.get_function(FunctionName=function)["Configuration"]["FunctionArn"]
        assert target.get("Input") == tf_target.get("input")  # events.tf gives none: the scheduled event
        retry = one(tf_target, "retry_policy")
        assert target["RetryPolicy"] == snake_to_api(retry)


def test_the_lambdas_carry_the_handlers_and_environment_of_lambda_tf(clients, stack, variables):
    tf = terraform()
    prefix = variables["name_prefix"]
    topics = clients.client("sns").list_topics()["Topics"]
    topic = next(t["TopicArn"] for t in topics if t["TopicArn"].endswith(f":{prefix}-runs"))
    expected = {
        "GRIDFLEET_REGION": REGION,
        "GRIDFLEET_STACK": prefix,
        "GRIDFLEET_TABLE": variables["table_name"],
        "GRIDFLEET_BUCKET": variables["bucket_name"],
        "GRIDFLEET_HUB_LAUNCH_TEMPLATE": f"{prefix}-hub",
        "GRIDFLEET_HUB_STALE_S": str(tf.default("hub_stale_s")),
        "GRIDFLEET_RUN_GRACE_S": str(tf.default("run_grace_s")),
        "GRIDFLEET_LOOKBACK_RUNS": str(tf.default("lookback_runs")),
        "GRIDFLEET_NOTIFY_TOPIC_ARN": topic,
        "GRIDFLEET_HUB_INSTANCE_ID": HUB_INSTANCE,  # var.hub_instance_id set: the reusable hub
    }
    assert set(expected) == set(tf.locals["lambda_environment"]) | {"GRIDFLEET_HUB_INSTANCE_ID"}
    for role in ("starter", "watchdog"):
        conf = clients.client("lambda").get_function(FunctionName=f"{prefix}-{role}")["Configuration"]
        assert conf["Environment"]["Variables"] == expected
        assert conf["Handler"] == tf.locals["lambdas"][role]["handler"]
        assert conf["Role"] == clients.client("iam").get_role(RoleName=f"{prefix}-{role}")["Role"]["Arn"]
    assert topic == stack.notify_topic_arn


def test_the_schedules_reader_finds_the_stack_and_fires_its_handlers(clients, stack, variables):
    called: list[tuple[str, dict]] = []
    handlers = {
        "lambdas.starter.handler": lambda event, env: called.append(("starter", dict(env))),
        "lambdas.watchdog.handler": lambda event, env: called.append(("watchdog", dict(env))),
    }
    schedules = Schedules(clients.client("events"), clients.client("lambda"), handlers)
    timers = schedules.load(0.0, prefix=variables["name_prefix"])
    assert sorted(t.function for t in timers) == sorted([stack.starter_function, stack.watchdog_function])
    schedules.fire_due(301.0)  # rate(5 minutes) from 0
    assert [name for name, _ in called] == ["watchdog"]
    assert called[0][1]["GRIDFLEET_STACK"] == variables["name_prefix"]


def test_no_access_point_is_the_stacks_and_every_private_subnet_has_a_mount_target(clients, stack):
    """The stack makes the file system and its mount targets; each site's access point is the hub's to make, at
    the start of a run (fleet.aws.efs), so the apply makes none (one rooted above the sites would open them all)."""
    efs = clients.client("efs")
    assert efs.describe_access_points(FileSystemId=stack.efs_id)["AccessPoints"] == []
    targets = efs.describe_mount_targets(FileSystemId=stack.efs_id)["MountTargets"]
    assert sorted(t["SubnetId"] for t in targets) == sorted(stack.private_subnet_ids)
    for t in targets:
        groups = efs.describe_mount_target_security_groups(MountTargetId=t["MountTargetId"])["SecurityGroups"]
        assert groups == [efs_group(clients, stack)]


def efs_group(clients, stack) -> str:
    filters = [
        {"Name": "vpc-id", "Values": [stack.vpc_id]},
        {"Name": "group-name", "Values": [f"{stack.name_prefix}-efs"]},
    ]
    return clients.client("ec2").describe_security_groups(Filters=filters)["SecurityGroups"][0]["GroupId"]


def statements(tf, name: str) -> list[dict]:
    """A document's statements as the provider merges them: its source_policy_documents' first."""
    return statements_of(tf, name)


@pytest.mark.parametrize("role", ["hub", "node", "starter", "watchdog"])
def test_each_role_has_the_inline_policy_iam_tf_writes(clients, stack, variables, role):
    tf = terraform()
    iam = clients.client("iam")
    prefix = variables["name_prefix"]
    [policy_name] = iam.list_role_policies(RoleName=f"{prefix}-{role}")["PolicyNames"]
    assert policy_name == f"{prefix}-{role}"
    document = iam.get_role_policy(RoleName=f"{prefix}-{role}", PolicyName=policy_name)["PolicyDocument"]
    assert re.search(r"\$\{(?!aws:)", json.dumps(document)) is None  # every reference resolved; IAM's own stay
    got = document["Statement"]
    want = statements(tf, role)
    assert [s["Sid"] for s in got] == [s["sid"] for s in want]
    for g, w in zip(got, want, strict=True):
        assert set(as_list(g["Action"])) == set(w["actions"]), g["Sid"]
        assert g["Effect"] == w.get("effect", "Allow")
        assert all(r == "*" or r.startswith("arn:aws:") for r in as_list(g["Resource"])), g["Sid"]
        # every condition block of the tf, as one key under its operator in the document
        got_conditions = Counter(test for test, keys in g.get("Condition", {}).items() for _ in keys)
        assert got_conditions == Counter(c["test"] for c in blocks(w, "condition")), g["Sid"]

    table_arn = clients.client("dynamodb").describe_table(TableName=variables["table_name"])["Table"]["TableArn"]
    by_sid = {s["Sid"]: s for s in got}
    assert by_sid["AttemptAndNodeWrites" if role == "node" else "StateTable"]["Resource"] == table_arn
    if role in ("hub", "node"):
        assert by_sid["FleetMetrics"]["Condition"] == {
            "StringEquals": {"cloudwatch:namespace": tf.default("metrics_namespace")}
        }
    if role == "hub":
        assert by_sid["PassNodeRole"]["Resource"] == iam.get_role(RoleName=f"{prefix}-node")["Role"]["Arn"]
        assert by_sid["RunNodeInstances"]["Condition"]["StringEquals"][f"aws:RequestTag/{TAG_STACK}"] == prefix
        assert by_sid["NotifyRunEnd"]["Resource"] == stack.notify_topic_arn


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def role_policy(clients, prefix: str, role: str) -> list[dict]:
    return clients.client("iam").get_role_policy(RoleName=f"{prefix}-{role}", PolicyName=f"{prefix}-{role}")[
        "PolicyDocument"
    ]["Statement"]


def test_the_hub_and_the_nodes_grant_their_ssm_agents_the_same_and_the_hub_commands_by_ssm_tags(
    clients, stack, variables
):
    """Both roles carry the agent's statements, written once in iam.tf; the hub's SendCommand on instances holds
    only for the stack's nodes, by Run Command's own tag keys."""
    prefix = variables["name_prefix"]
    account = clients.client("sts").get_caller_identity()["Account"]
    agent = {
        role: [s for s in role_policy(clients, prefix, role) if s["Sid"].startswith("SsmAgent")]
        for role in ("hub", "node")
    }
    assert agent["hub"] == agent["node"] and len(agent["hub"]) == 2
    assert {a for s in agent["hub"] for a in as_list(s["Action"])} == SSM_AGENT_ACTIONS
    [registration] = [s for s in agent["hub"] if "ssm:UpdateInstanceInformation" in as_list(s["Action"])]
    assert registration["Resource"] == f"arn:aws:ec2:{REGION}:{account}:instance/*"
    assert not [s for r in ("starter", "watchdog") for s in role_policy(clients, prefix, r) if "SsmAgent" in s["Sid"]]
    [on_nodes] = [
        s
        for s in role_policy(clients, prefix, "hub")
        if "ssm:SendCommand" in as_list(s["Action"]) and ":instance/" in str(s["Resource"])
    ]
    assert on_nodes["Condition"] == {
        "StringEquals": {f"ssm:resourceTag/{TAG_ROLE}": "node", f"ssm:resourceTag/{TAG_STACK}": prefix}
    }


def test_the_log_groups_carry_the_stacks_name_and_its_retention(clients, stack, variables):
    tf = terraform()
    prefix = variables["name_prefix"]
    logs = clients.client("logs")
    groups = {g["logGroupName"]: g for g in logs.describe_log_groups(logGroupNamePrefix=f"/{prefix}/")["logGroups"]}
    assert set(groups) == {f"/{prefix}/hub", f"/{prefix}/node", f"/{prefix}/vpc-flow-logs"}
    key = clients.client("kms").describe_key(KeyId=f"alias/{prefix}")["KeyMetadata"]["Arn"]
    for g in groups.values():
        assert (g["retentionInDays"], g["kmsKeyId"]) == (tf.default("log_retention_days"), key), g["logGroupName"]
    aws = AwsConfig(stack=prefix)
    assert (stack.hub_log_group, stack.node_log_group) == (aws.log_group_hub, aws.log_group_node)


def test_the_lambdas_reserve_concurrency_only_when_the_variable_sets_it(clients, stack, west):
    awslambda = clients.client("lambda")
    for function in (stack.starter_function, stack.watchdog_function):  # the default: none reserved
        assert "ReservedConcurrentExecutions" not in awslambda.get_function_concurrency(FunctionName=function)
    west_clients, out, _ = west
    for function in (out.starter_function, out.watchdog_function):
        concurrency = west_clients.client("lambda").get_function_concurrency(FunctionName=function)
        assert concurrency["ReservedConcurrentExecutions"] == 1


def test_the_hub_reads_public_and_own_ami_parameters_by_their_arns(clients, stack, variables, west):
    """An AWS public parameter's ARN has no account; a parameter of the account's own has its id."""
    [param] = [s for s in role_policy(clients, variables["name_prefix"], "hub") if s["Sid"] == "AmiParameter"]
    public = terraform().default("ami_parameter")
    assert param["Resource"] == f"arn:aws:ssm:{REGION}::parameter{public}"  # node_ami_parameter: the same one
    west_clients, out, _ = west
    account = west_clients.client("sts").get_caller_identity()["Account"]
    [param] = [s for s in role_policy(west_clients, out.name_prefix, "hub") if s["Sid"] == "AmiParameter"]
    assert param["Resource"] == [
        f"arn:aws:ssm:{WEST}::parameter{public}",
        f"arn:aws:ssm:{WEST}:{account}:parameter{NODE_AMI_PARAMETER}",
    ]


@pytest.mark.parametrize(("role", "service"), [("hub", "ec2"), ("node", "ec2"), ("starter", "lambda")])
def test_roles_trust_the_service_that_runs_them(clients, stack, variables, role, service):
    trust = clients.client("iam").get_role(RoleName=f"{variables['name_prefix']}-{role}")["Role"]
    [statement] = trust["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": f"{service}.amazonaws.com"}
    assert statement["Action"] == "sts:AssumeRole"
    profile = f"{variables['name_prefix']}-{role}"
    if service == "ec2":
        roles = clients.client("iam").get_instance_profile(InstanceProfileName=profile)["InstanceProfile"]["Roles"]
        assert [r["RoleName"] for r in roles] == [profile]
    else:
        account = clients.client("sts").get_caller_identity()["Account"]
        assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": account}}


def test_security_groups_admit_only_the_fleets_own_peers(clients, stack):
    ec2 = clients.client("ec2")
    groups = ec2.describe_security_groups(Filters=[{"Name": "vpc-id", "Values": [stack.vpc_id]}])["SecurityGroups"]
    by_name = {g["GroupName"]: g for g in groups}
    for g in groups:
        for perm in g["IpPermissions"]:
            assert all(r["CidrIp"] != "0.0.0.0/0" for r in perm.get("IpRanges", [])), g["GroupName"]
    assert by_name["default"]["IpPermissions"] == [] and by_name["default"]["IpPermissionsEgress"] == []
    efs_sg = by_name[f"{stack.name_prefix}-efs"]
    assert efs_sg["IpPermissionsEgress"] == []  # the allow-all rule EC2 adds is gone, as Terraform removes it
    [nfs] = efs_sg["IpPermissions"]
    assert (nfs["FromPort"], [p["GroupId"] for p in nfs["UserIdGroupPairs"]]) == (2049, [stack.node_security_group_id])
    node_in = {
        (p["FromPort"], p["UserIdGroupPairs"][0]["GroupId"])
        for p in by_name[f"{stack.name_prefix}-node"]["IpPermissions"]
    }
    assert node_in == {(5555, stack.hub_security_group_id), (22, stack.hub_security_group_id)}
    subnets = ec2.describe_subnets(SubnetIds=list(stack.private_subnet_ids))["Subnets"]
    assert sorted(s["CidrBlock"] for s in subnets) == [
        "10.42.16.0/20",
        "10.42.32.0/20",
    ]  # cidrsubnet(vpc_cidr, 4, i + 1)


def test_applying_a_stack_again_is_refused_and_makes_nothing(clients, stack, variables, ami):
    ec2 = clients.client("ec2")
    before = len(ec2.describe_vpcs()["Vpcs"])
    with pytest.raises(TfError) as e:
        apply_stack(clients, TF_DIR, variables, hub_user_data=HUB_USER_DATA, ami_id=ami)
    assert str(e.value) == (
        f"stack {stack.name_prefix} is already applied on this endpoint "
        f"({stack.vpc_id} has {TAG_STACK}={stack.name_prefix})"
    )
    assert len(ec2.describe_vpcs()["Vpcs"]) == before


def changed_copy(tmp_path: Path, file: str, old: str, new: str) -> Path:
    copy = tmp_path / "terraform"
    shutil.copytree(TF_DIR, copy, ignore=shutil.ignore_patterns("*.tfvars*", "*.yaml"))
    text = (copy / file).read_text()
    assert old in text
    (copy / file).write_text(text.replace(old, new, 1))
    return copy


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_an_expression_the_evaluator_does_not_know_fails_with_one_line(clients, ami, tmp_path):
    old = 'description            = "gridfleet node: Selenium Grid node and Chromium"'
    tf_dir = changed_copy(tmp_path, "launch_templates.tf", old, 'description            = upper("node")')
    with pytest.raises(TfError) as e:
        apply_stack(clients, tf_dir, names(), hub_user_data=HUB_USER_DATA, ami_id=ami)
    line = line_of(tf_dir / "launch_templates.tf", 'upper("node")')
    assert str(e.value) == (
        f"launch_templates.tf:{line}: aws_launch_template.node: the twin does not evaluate the function upper() "
        f'(in upper("node"))'
    )
    assert "\n" not in str(e.value)


def test_an_argument_the_twin_does_not_apply_stops_the_apply(clients, ami, tmp_path):
    old = "  # A node's last act is to shut itself down, which ends it."
    tf_dir = changed_copy(tmp_path, "launch_templates.tf", old, "  ebs_optimized = true\n" + old)
    with pytest.raises(TfError, match=r"aws_launch_template\.node: the twin does not apply ebs_optimized$"):
        apply_stack(clients, tf_dir, names(), hub_user_data=HUB_USER_DATA, ami_id=ami)


def test_a_reference_to_a_skipped_resource_fails_naming_it(clients, ami, tmp_path):
    old = "GRIDFLEET_REGION              = var.region"
    tf_dir = changed_copy(tmp_path, "lambda.tf", old, "GRIDFLEET_REGION = aws_eip.nat.public_ip")
    assert "aws_eip" in SKIPPED
    with pytest.raises(TfError, match=r"^network\.tf:\d+: aws_eip\.nat is needed but not made \(.+\)$"):
        apply_stack(clients, tf_dir, names(), hub_user_data=HUB_USER_DATA, ami_id=ami)


def test_bad_variables_fail_with_one_line(clients, ami):
    with pytest.raises(TfError, match=r"^variables\.tf:\d+: variable bucket_name has no default and was not given$"):
        apply_stack(clients, TF_DIR, {}, hub_user_data=HUB_USER_DATA, ami_id=ami)
    with pytest.raises(TfError, match=r"no variable nodes_max is declared$"):
        apply_stack(clients, TF_DIR, {**names(), "nodes_max": 3}, hub_user_data=HUB_USER_DATA, ami_id=ami)


def test_without_the_ami_parameter_or_an_ami_id_the_apply_says_which_parameter(clients):
    missing = r"data\.aws_ssm_parameter\.(hub_|node_)?ami: parameter /aws/service/debian/.* is not on"
    with pytest.raises(TfError, match=missing):
        apply_stack(clients, TF_DIR, names(), hub_user_data=HUB_USER_DATA)


# --- the evaluator alone, on small modules of its own (no endpoint) -------------------------------------------

EXPRESSIONS = r"""
variable "azs" { default = ["za", "zb", "zc"] }
variable "fifo" { default = false }
variable "missing" { default = null }
locals {
  index   = { for i, az in var.azs : az => i if az != "zb" }
  names   = [for az in var.azs : upper_free("${az}-x")]
  picked  = var.fifo ? "${trimsuffix("q.fifo", ".fifo")}.fifo" : format("%s-%d", "q", 2 + 3 * 4)
  merged  = merge({ a = 1, (var.azs[0]) = 2 }, { a = 3 })
  list    = concat(var.azs, ["zd"])
  attr    = { a = 1 }.b
  json    = jsonencode({ b = [1, true, null], a = "x" })
  nothing = coalesce(var.missing, "fallback")
  doc     = <<-EOT
    first ${var.azs[1]}
      $${kept}
  EOT
  net     = cidrsubnet("10.42.0.0/16", 4, length(var.azs))
  splat   = [for o in [{ id = "a" }, { id = "b" }] : o][*].id
  sure    = !var.fifo && length(var.azs) >= 3
  directive = "%{ if true }x%{ endif }"
  escaped = "tab\there \"q\" \\n"
  unicode = "caf\u00e9"
  plus    = "a" + "b"
}
"""


@pytest.fixture
def evaluate(tmp_path):
    from twin.terraform.expressions import Evaluator, TfModule, Where

    (tmp_path / "main.tf").write_text(EXPRESSIONS)
    module = TfModule(tmp_path)
    variables = {"azs": ["za", "zb", "zc"], "fifo": False, "missing": None}
    ev = Evaluator(module, {"var": variables})

    def value(name: str):
        file, tree = module.locals[name]
        return ev.evaluate(tree, Where(file, f"local.{name}"))

    return value


def test_the_evaluator_computes_what_terraform_would(evaluate):
    assert evaluate("index") == {"za": 0, "zc": 2}
    assert evaluate("picked") == "q-14"
    assert evaluate("merged") == {"a": 3, "za": 2}
    assert evaluate("json") == '{"a":"x","b":[1,true,null]}'  # object keys sorted, as Terraform writes them
    assert evaluate("nothing") == "fallback"
    assert evaluate("doc") == "first zb\n  ${kept}\n"
    assert evaluate("net") == "10.42.48.0/20"
    assert evaluate("splat") == ["a", "b"]
    assert evaluate("sure") is True
    assert evaluate("list") == ["za", "zb", "zc", "zd"]
    assert evaluate("escaped") == 'tab\there "q" \\n'


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "names",
            r"^main\.tf:\d+: local\.names: the twin does not evaluate the function upper_free\(\) \(in upper_free",
        ),
        ("attr", r"^main\.tf:\d+: local\.attr: no attribute 'b' here \(has: a\) \(in \.b\)$"),
        ("directive", r"^main\.tf:\d+: local\.directive: template directives .* are not evaluated by the twin"),
        ("unicode", r"^main\.tf:\d+: local\.unicode: the escape \\u is not evaluated by the twin"),
        ("plus", r"^main\.tf:\d+: local\.plus: \+ takes numbers \(Terraform joins strings only by interpolation\)"),
    ],
)
def test_what_the_evaluator_cannot_do_fails_naming_the_place(evaluate, name, message):
    with pytest.raises(TfError, match=message):
        evaluate(name)


def test_locals_that_refer_to_each_other_fail_naming_the_cycle(clients, tmp_path):
    prefix = names()["name_prefix"]
    (tmp_path / "main.tf").write_text(
        f'variable "region" {{ default = "{REGION}" }}\n'
        f'variable "name_prefix" {{ default = "{prefix}" }}\n'
        'locals {\n  tag_stack = "gridfleet:stack"\n  a = "${local.b}-x"\n  b = local.a\n}\n'
        'resource "aws_vpc" "main" { cidr_block = local.a }\n'
    )
    with pytest.raises(TfError, match=r"^local\.a: refers to itself: local\.a -> local\.b -> local\.a$"):
        apply_stack(clients, tmp_path, {})


WEST = "us-west-2"
NODE_AMI_PARAMETER = "/gridfleet/node-ami"


@pytest.fixture(scope="module")
def west(endpoint, tmp_path_factory) -> tuple[AwsClients, StackOutputs, Path]:
    """A FIFO stack in another region, with the hub's user-data in a file, no reusable hub, reserved concurrency
    for its Lambdas and a node image of the account's own (node_ami_parameter, which moto does not hold: the
    AMI id stands in)."""
    clients = AwsClients(AwsConfig(endpoint_url=endpoint, region=WEST), credentials=LOCAL_CREDENTIALS)
    ami = clients.client("ec2").describe_images()["Images"][0]["ImageId"]
    user_data = tmp_path_factory.mktemp("west") / "hub-user-data.yaml"
    user_data.write_text(HUB_USER_DATA + "# from a file\n")
    variables = {
        **names(),
        "queue_fifo": True,
        "region": WEST,
        "azs": [f"{WEST}a", f"{WEST}b"],
        "lambda_reserved_concurrency": 1,
        "node_ami_parameter": NODE_AMI_PARAMETER,
    }
    return clients, apply_stack(clients, TF_DIR, variables, hub_user_data=user_data, ami_id=ami), user_data


def test_a_fifo_stack_with_the_user_data_in_a_file(west):
    clients, out, user_data = west
    tf = terraform()
    queue_name = out.queue.removesuffix(".fifo")
    assert base64.b64decode(template_data(clients, out.hub_launch_template)["UserData"]) == user_data.read_bytes()
    assert (out.queue, out.dlq) == (f"{queue_name}.fifo", f"{queue_name}-dlq.fifo")
    assert out.gridfleet_aws["queue_fifo"] is True
    sqs = clients.client("sqs")
    queue = sqs.get_queue_attributes(
        QueueUrl=sqs.get_queue_url(QueueName=out.queue)["QueueUrl"], AttributeNames=["All"]
    )
    dlq_url = sqs.get_queue_url(QueueName=out.dlq)["QueueUrl"]
    dlq = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["All"])["Attributes"]
    attributes = queue["Attributes"]
    assert attributes["FifoQueue"] == dlq["FifoQueue"] == "true"
    assert json.loads(attributes["RedrivePolicy"]) == {
        "deadLetterTargetArn": dlq["QueueArn"],
        "maxReceiveCount": tf.default("max_receive_count"),
    }
    assert attributes["VisibilityTimeout"] == str(tf.resource("aws_sqs_queue", "sites")["visibility_timeout_seconds"])


def test_the_starter_on_its_schedule_launches_the_hub_from_the_stacks_template(endpoint, west):
    """The real starter, called by the schedule the stack's rule holds, with the environment its function holds,
    on the stack's table and template."""
    clients, out, _ = west
    start = dt.datetime(2026, 11, 24, 0, 59, tzinfo=dt.UTC).timestamp()  # the default schedule: 01:00 UTC

    def factory(settings):
        aws = AwsConfig(endpoint_url=endpoint, region=settings.region, table=settings.table)
        return AwsClients(aws, credentials=LOCAL_CREDENTIALS)

    handlers = stack_handlers(factory, FakeClock(start + 60))
    handlers["lambdas.watchdog.handler"] = lambda event, env: None  # the watchdog's passes are not this test's
    schedules = Schedules(clients.client("events"), clients.client("lambda"), handlers)
    schedules.load(start, prefix=out.name_prefix)
    fired = [f for f in schedules.fire_due(start + 60) if f.function == out.starter_function]
    assert [f.error for f in fired] == [None]

    filters = [
        {"Name": f"tag:{TAG_STACK}", "Values": [out.name_prefix]},
        {"Name": f"tag:{TAG_ROLE}", "Values": ["hub"]},
    ]
    reservations = clients.client("ec2").describe_instances(Filters=filters)["Reservations"]
    [hub] = [i for r in reservations for i in r["Instances"]]
    assert tags(hub["Tags"])["aws:ec2launchtemplate:id"] == out.hub_launch_template_id
    assert tags(hub["Tags"])[TAG_RUN_ID] == "2026-11-24"  # the day's run, by the clock the schedule fired on
    # moto does not merge the template into the instance (its subnet, groups, profile, metadata options): the
    # EC2 twin reads the template the instance's tags name, as checked above.
