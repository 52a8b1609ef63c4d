"""IAM against the code: each role's policy in infra/terraform grants every AWS call its code makes, and no
service beyond them.

The calls come from running each role's code against a moto server with a botocore hook on every client
(tests/helpers/iam_scenarios.py). DynamoDB and S3 calls are also checked against the resource they need: the
table's ARN, or for a call on an index, the index's ARN (`<table arn>/index/<name>`), which a grant on the table
does not cover; the bucket's ARN, or for a call on an object, the object's (`<bucket arn>/<key>`), which the
policy's key patterns must cover. What AWS needs on the code's behalf, and so never shows up as a call
(the SSM agent, the EFS mount helper, KMS behind SSE, the Lambda runtime's logs), is listed below, each
with its reason; so is what a role is granted for a code path its scenario does not take yet. A checker that
passed whatever the policy said would be worthless, so the last tests remove each needed action and each
needed resource in turn and expect the checker to name it.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from tests.helpers import iam_eval, iam_scenarios
from tests.infra.test_terraform import SSM_AGENT_ACTIONS

ROOT = Path(__file__).resolve().parents[2]
TF = ROOT / "infra" / "terraform"
ROLES = ("hub", "node", "starter", "watchdog")

#: The state table's and the bucket's ARNs as the policies spell them.
TABLE_ARN = "${aws_dynamodb_table.status.arn}"
BUCKET_ARN = "${aws_s3_bucket.results.arn}"

#: botocore service name -> IAM action prefix, where they differ.
PREFIX = {"efs": "elasticfilesystem"}

#: An operation that IAM authorizes under other actions.
OPERATION_ACTIONS = {
    "s3.HeadObject": {"s3:GetObject"},
    "s3.HeadBucket": {"s3:ListBucket"},
    # A copy is authorized as a PutObject of its destination (the key recorded), with its tags a PutObjectTagging;
    # reading the source is a GetObject the hub has on the whole bucket.
    "s3.CopyObject": {"s3:PutObject", "s3:PutObjectTagging"},
    "s3.ListObjectsV2": {"s3:ListBucket"},
    "sqs.SendMessageBatch": {"sqs:SendMessage"},
    "sqs.DeleteMessageBatch": {"sqs:DeleteMessage"},
    "sqs.ChangeMessageVisibilityBatch": {"sqs:ChangeMessageVisibility"},
    # Launching with tags and an instance profile also needs CreateTags and PassRole.
    "ec2.RunInstances": {"ec2:RunInstances", "ec2:CreateTags", "iam:PassRole"},
    # Tags given to CreateAccessPoint are authorized as TagResource too (EFS's API reference).
    "efs.CreateAccessPoint": {"elasticfilesystem:CreateAccessPoint", "elasticfilesystem:TagResource"},
}

_SSM_AGENT = SSM_AGENT_ACTIONS
_LAMBDA_RUNTIME = {
    "logs:CreateLogStream",
    "logs:PutLogEvents",
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "sqs:SendMessage",
}

#: Needed on the code's behalf, never seen as a call from it: (actions, why).
IMPLIED: dict[str, list[tuple[set[str], str]]] = {
    "hub": [
        ({"kms:Decrypt", "kms:GenerateDataKey"}, "SSE-KMS on the table, queue and bucket"),
        ({"s3:GetObject"}, "the hub's boot script fetches the bundle and its config with `aws s3 cp`"),
        ({"ssm:PutParameter"}, "the hub's boot script puts the Grid secret with `aws ssm put-parameter`"),
        ({"ssm:GetParameter"}, "it reads the parameter first (`aws ssm get-parameter`) and keeps its run's secret"),
        ({"kms:Encrypt", "kms:Decrypt"}, "SSM encrypts and decrypts that SecureString with the stack's key"),
        ({"s3:PutObjectTagging"}, "the results and evidence the hub copies carry the tag the bucket's expiry selects"),
        (_SSM_AGENT, "the SSM agent, through which Session Manager forwards the dashboard's port to the operator"),
    ],
    "node": [
        ({"kms:Decrypt", "kms:GenerateDataKey"}, "SSE-KMS on the table, queue, bucket and EFS"),
        ({"s3:GetObject", "s3:ListBucket"}, "the boot script's `aws s3 cp`; a missing result reads as 404"),
        ({"ssm:GetParameter"}, "the boot script reads the Grid secret with `aws ssm get-parameter --with-decryption`"),
        ({"elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"}, "mount -t efs -o tls,iam"),
        (_SSM_AGENT, "the SSM agent, through which the hub's kill command reaches the node"),
    ],
    "starter": [
        ({"kms:Decrypt"}, "the encrypted environment and the table's CMK"),
        (_LAMBDA_RUNTIME, "the Lambda runtime: its logs, traces and dead-letter queue"),
    ],
    "watchdog": [
        ({"kms:Decrypt"}, "the encrypted environment and the table's CMK"),
        ({"kms:GenerateDataKey"}, "SSE-KMS on the bucket, for the summary of a run it ends"),
        (_LAMBDA_RUNTIME, "the Lambda runtime: its logs, traces and dead-letter queue"),
    ],
}

#: Granted for a code path the role's scenario does not take yet: (actions, the code path). When the code makes
#: the call and the scenario records it, the entry goes (test_granted_ahead_is_not_yet_called says when).
AHEAD: dict[str, list[tuple[set[str], str]]] = {
    "hub": [],
    "node": [],
    "starter": [],
    "watchdog": [],
}


#: What a boot script's AWS CLI command needs, where the action is not the command's name in CamelCase.
CLI_ACTIONS = {"s3 cp": {"s3:GetObject"}}


def boot_script_actions(role: str) -> set[str]:
    """The IAM actions of the AWS CLI commands in the role's rendered boot script."""
    from cloud_init import boot_script, render_hub, render_node
    from tests.unit.test_cloud_init import hub_params, node_params

    script = boot_script(render_hub(hub_params()) if role == "hub" else render_node(node_params()))
    out: set[str] = set()
    for service, command in set(re.findall(r"\baws ([a-z0-9]+) ([a-z][a-z-]+)", script)):
        camel = "".join(w.capitalize() for w in command.split("-"))
        out |= CLI_ACTIONS.get(f"{service} {command}", {f"{service}:{camel}"})
    return out


def unquote(v: str) -> str:
    return v[1:-1] if len(v) >= 2 and v[0] == v[-1] == '"' else v


_SOURCE = re.compile(r"\$\{data\.aws_iam_policy_document\.(\w+)\.json\}")


def policy_statements() -> dict[str, list[dict]]:
    """role -> the Allow statements of its `data.aws_iam_policy_document.<role>` (actions, resources unquoted),
    those of its `source_policy_documents` first, as the provider merges them."""
    import hcl2

    own: dict[str, list[dict]] = {}
    sources: dict[str, list[str]] = {}
    for path in sorted(TF.glob("*.tf")):
        with open(path) as f:
            parsed = hcl2.load(f)
        for block in parsed.get("data", []):
            for kind, named in block.items():
                if unquote(kind) != "aws_iam_policy_document":
                    continue
                for name, body in named.items():
                    sources[unquote(name)] = [
                        _SOURCE.fullmatch(unquote(s))[1] for s in body.get("source_policy_documents", [])
                    ]
                    own[unquote(name)] = [
                        {
                            "actions": {unquote(a) for a in st.get("actions", [])},
                            "resources": [unquote(r) for r in st.get("resources", [])],
                            "conditions": tuple(
                                iam_eval.Condition(
                                    unquote(c["test"]), unquote(c["variable"]), tuple(unquote(v) for v in c["values"])
                                )
                                for c in st.get("condition", [])
                            ),
                        }
                        for st in body.get("statement", [])
                        if unquote(str(st.get("effect", '"Allow"'))) == "Allow"
                    ]
    return {name: [st for s in sources[name] for st in own[s]] + statements for name, statements in own.items()}


def policy_actions() -> dict[str, set[str]]:
    return {role: set().union(*(st["actions"] for st in sts)) for role, sts in policy_statements().items()}


_INDEX_CALL = re.compile(iam_scenarios.INDEX_CALL.format(call=r"(?P<call>\S+)", index=r"(?P<index>\S+)"))
_OBJECT_CALL = re.compile(iam_scenarios.OBJECT_CALL.format(call=r"(?P<call>\S+)", key=r"(?P<key>.+)"))


def split_call(call: str) -> tuple[str, str | None]:
    """A recorded call -> (service.Operation, the index it was made on or None); an object's key is dropped."""
    m = _INDEX_CALL.fullmatch(call)
    return (m["call"], m["index"]) if m else (object_call(call)[0], None)


def object_call(call: str) -> tuple[str, str | None]:
    """A recorded call -> (service.Operation, the S3 key it was made on or None)."""
    m = _OBJECT_CALL.fullmatch(call)
    return (m["call"], m["key"]) if m else (call, None)


def operations(calls: set[str]) -> set[str]:
    """The `service.Operation` names of recorded calls, without the index or key they were made on."""
    return {split_call(c)[0] for c in calls}


def needed(calls: set[str]) -> set[str]:
    out: set[str] = set()
    for call in (split_call(c)[0] for c in calls):
        if call in OPERATION_ACTIONS:
            out |= OPERATION_ACTIONS[call]
        else:
            service, op = call.split(".", 1)
            out.add(f"{PREFIX.get(service, service)}:{op}")
    return out


def problems(role: str, calls: set[str], granted: set[str]) -> list[str]:
    """What is wrong with a role's grants, given the calls its code made (empty: nothing)."""
    need = needed(calls)
    implied = set().union(*(a for a, _ in IMPLIED[role] + AHEAD[role]))
    out = [f"{role}: the code calls {a}, which the policy does not grant" for a in sorted(need - granted)]
    allowed_services = {a.split(":")[0] for a in need | implied}
    for a in sorted(granted):
        if a.split(":")[0] not in allowed_services:
            out.append(f"{role}: the policy grants {a}, a service its code never uses")
        if "*" in a:
            out.append(f"{role}: wildcard action {a}")
    return out


def needed_resources(calls: set[str]) -> set[tuple[str, str]]:
    """(action, resource) pairs of the DynamoDB and S3 calls: a call on the table needs the table's ARN, a call
    on an index the index's ARN (and only that: a Query of an index does not also need the table); a call on an
    object the object's ARN, any other S3 call the bucket's."""
    out: set[tuple[str, str]] = set()
    for call in calls:
        op, index = split_call(call)
        if op.startswith("dynamodb."):
            resource = TABLE_ARN if index is None else f"{TABLE_ARN}/index/{index}"
        elif op.startswith("s3."):
            key = object_call(call)[1]
            resource = BUCKET_ARN if key is None else f"{BUCKET_ARN}/{key}"
        else:
            continue
        out |= {(action, resource) for action in needed({op})}
    return out


def _any_user(resource: str) -> str:
    """A resource pattern with its `${aws:userid}` (written `$${...}` in the .tf) matching any writer: which writer's
    prefix a call may use is `condition_problems`' to judge, with the call's own context."""
    return resource.replace("$${aws:userid}", "*").replace("${aws:userid}", "*")


def resource_problems(role: str, calls: set[str], statements: list[dict]) -> list[str]:
    """(action, resource) pairs the code needs that no statement of the role grants (empty: none)."""
    return [
        f"{role}: the code calls {action} on {resource}, which no statement grants"
        for action, resource in sorted(needed_resources(calls))
        if not any(
            action in st["actions"] and any(fnmatchcase(resource, _any_user(r)) for r in st["resources"])
            for st in statements
        )
    ]


def as_evaluated(statements: list[dict]) -> list[iam_eval.Statement]:
    """The statements as tests.helpers.iam_eval evaluates them (Allow, with their conditions)."""
    return [  # `$${` is how a .tf writes IAM's own `${`: a policy variable
        iam_eval.Statement(
            "Allow", tuple(st["actions"]), tuple(r.replace("$${", "${") for r in st["resources"]), st["conditions"]
        )  # fmt: skip
        for st in statements
    ]


def condition_problems(role: str, requests: list[tuple[str, dict]], statements: list[dict]) -> list[str]:
    """The table and bucket calls of `requests` that no statement allows with its conditions (dynamodb:Attributes,
    s3:if-none-match, ...) evaluated on the call's request context."""
    evaluated = as_evaluated(statements)
    out = set()
    for call, context in requests:
        for action, resource in needed_resources({call}):
            if not iam_eval.allowed(evaluated, iam_eval.Request(action, resource, context)):
                out.add(f"{role}: the code calls {action} on {resource} with {context}, which no statement allows")
    return sorted(out)


@pytest.fixture(scope="module")
def scenarios(moto_endpoint, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("iam")
    node_requests: list[tuple[str, dict]] = []
    calls = {
        "hub": iam_scenarios.hub_calls(moto_endpoint, tmp / "hub"),
        "node": iam_scenarios.node_calls(moto_endpoint, tmp / "node", node_requests),
    }
    calls.update(iam_scenarios.lambda_calls(moto_endpoint, tmp / "lambdas"))
    return calls, node_requests


@pytest.fixture(scope="module")
def recorded(scenarios):
    return scenarios[0]


@pytest.fixture(scope="module")
def granted():
    if not TF.is_dir():
        pytest.fail(f"{TF} is missing")
    docs = policy_actions()
    missing = [r for r in ROLES if r not in docs]
    assert not missing, f"no data.aws_iam_policy_document for {missing}"
    return docs


@pytest.mark.slow
def test_the_scenarios_exercise_each_roles_code(recorded):
    assert {
        "ec2.RunInstances",
        "ec2.TerminateInstances",
        "ssm.SendCommand",
        "sqs.SendMessageBatch",
        "s3.GetObject",
        "s3.PutObject",
        "cloudwatch.PutMetricData",
        "dynamodb.Query",
        "dynamodb.BatchGetItem",
        "dynamodb.BatchWriteItem",
        "sns.Publish",
    } <= operations(recorded["hub"])
    assert "dynamodb.Query on index/open" in recorded["hub"]
    for role in ("hub", "node"):  # `gridfleet ship-logs`: the stream made on the first refused put
        assert {"logs.PutLogEvents", "logs.CreateLogStream"} <= operations(recorded[role]), role
    assert {
        "sqs.ReceiveMessage",
        "sqs.DeleteMessage",
        "sqs.SendMessage",
        "s3.PutObject",
        "cloudwatch.PutMetricData",
    } <= operations(recorded["node"])
    assert {"ec2.RunInstances", "ec2.CreateTags", "ec2.StartInstances"} <= recorded["starter"]
    assert {
        "dynamodb.Query",
        "dynamodb.UpdateItem",
        "ec2.RunInstances",
        "ec2.CreateTags",
        "ec2.StartInstances",
        "ec2.StopInstances",
        "ec2.TerminateInstances",
        "s3.PutObject",
        "sns.Publish",
    } <= operations(recorded["watchdog"])
    # The objects are recorded with their keys, which the policies' key patterns must cover.
    assert {
        "s3.PutObject on object/runs/iam-hub/fleet.yaml",
        "s3.PutObject on object/runs/iam-hub/summary.json",
        "s3.PutObject on object/runs/iam-hub/report.html",
    } <= recorded["hub"]
    assert any(re.fullmatch(r"s3\.PutObject on object/runs/[^/]+/summary\.json", c) for c in recorded["watchdog"])
    assert any(
        re.fullmatch(r"s3\.PutObject on object/staging/[^/]+/.+/result/\d+-\d+\.json", c) for c in recorded["node"]
    )
    assert any(re.fullmatch(r"s3\.CopyObject on object/.+/result\.json", c) for c in recorded["hub"])
    assert any(re.fullmatch(r"s3\.PutObject on object/.+/evidence/\d+/evidence\.json", c) for c in recorded["node"])
    assert any(re.fullmatch(r"s3\.PutObject on object/.+/parts/\d+-\d+/\d+\.json", c) for c in recorded["node"])


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.slow
def test_each_role_is_granted_what_its_code_calls_and_no_other_service(role, recorded, granted):
    assert problems(role, recorded[role], granted[role]) == []


@pytest.mark.parametrize("role", ROLES)
def test_implied_grants_are_in_the_policy(role, granted):
    for actions, why in IMPLIED[role] + AHEAD[role]:
        assert actions <= granted[role], f"{role}: {sorted(actions - granted[role])} ({why})"


@pytest.mark.parametrize("role", ["hub", "node"])
def test_the_boot_scripts_aws_commands_are_listed_and_granted(role, granted):
    """The boot scripts run the AWS CLI, which no scenario records: each of their commands is in IMPLIED and in the
    role's policy (the Grid secret's `ssm get-parameter` and `ssm put-parameter` on the hub, `ssm get-parameter` on
    the nodes)."""
    actions = boot_script_actions(role)
    assert {"hub": {"ssm:GetParameter", "ssm:PutParameter"}, "node": {"ssm:GetParameter"}}[role] <= actions
    implied = set().union(*(a for a, _ in IMPLIED[role]))
    # the shipper's, and report-failure's (an update-item of the node item)
    recorded_too = {"logs:CreateLogStream", "logs:PutLogEvents", "dynamodb:PutItem", "dynamodb:UpdateItem"}
    assert actions - implied <= recorded_too, role
    assert actions <= granted[role], sorted(actions - granted[role])


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.slow
def test_granted_ahead_is_not_yet_called(role, recorded):
    """An action granted ahead of its code leaves AHEAD once the scenario records the call: from then on the
    check covers it like any other (and fails when it is removed)."""
    called = needed(recorded[role])
    for actions, path in AHEAD[role]:
        assert not actions & called, f"{role}: {sorted(actions & called)} is called now ({path}): drop it from AHEAD"


def test_pass_role_is_granted_only_where_a_role_is_passed(granted):
    assert {r for r in ROLES if "iam:PassRole" in granted[r]} == {"hub", "starter", "watchdog"}
    statements = policy_statements()
    passed = (("hub", "aws_iam_role.node"), ("starter", "aws_iam_role.hub"), ("watchdog", "aws_iam_role.hub"))
    for doc, target in passed:
        passes = [st for st in statements[doc] if "iam:PassRole" in st["actions"]]
        assert passes and all(st["actions"] == {"iam:PassRole"} for st in passes), f"{doc}: PassRole alone"
        assert all(st["resources"] == [f"${{{target}.arn}}"] for st in passes), (doc, passes)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.slow
def test_the_check_fails_when_any_needed_action_is_removed(role, recorded, granted):
    for action in sorted(needed(recorded[role])):
        found = problems(role, recorded[role], granted[role] - {action})
        assert any(action in p for p in found), f"removing {action} from {role} went unnoticed"


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.slow
def test_each_role_is_granted_its_table_and_bucket_calls_on_their_resources(role, recorded):
    assert resource_problems(role, recorded[role], policy_statements()[role]) == []


def test_an_object_call_is_recorded_with_its_key_and_needs_the_objects_arn():
    calls = {
        "s3.PutObject on object/runs/r1/summary.json",
        "s3.HeadObject on object/a/20261121/result.json",
        "s3.HeadBucket",
    }
    assert needed(calls) == {"s3:PutObject", "s3:GetObject", "s3:ListBucket"}
    assert needed_resources(calls) == {
        ("s3:PutObject", f"{BUCKET_ARN}/runs/r1/summary.json"),
        ("s3:GetObject", f"{BUCKET_ARN}/a/20261121/result.json"),
        ("s3:ListBucket", BUCKET_ARN),
    }
    reads = {"actions": {"s3:GetObject"}, "resources": [f"{BUCKET_ARN}/*"]}
    listing = {"actions": {"s3:ListBucket"}, "resources": [BUCKET_ARN]}
    for put in (f"{BUCKET_ARN}/runs/*", f"{BUCKET_ARN}/runs/*/summary.json", f"{BUCKET_ARN}/*"):
        assert resource_problems("r", calls, [reads, listing, {"actions": {"s3:PutObject"}, "resources": [put]}]) == []
    # A write pattern that does not cover the key is named.
    results_only = {"actions": {"s3:PutObject"}, "resources": [f"{BUCKET_ARN}/*/result.json"]}
    assert resource_problems("r", calls, [reads, listing, results_only]) == [
        f"r: the code calls s3:PutObject on {BUCKET_ARN}/runs/r1/summary.json, which no statement grants"
    ]


def test_an_index_call_is_recorded_apart_and_needs_the_index_arn():
    calls = {"dynamodb.Query", "dynamodb.Query on index/open", "dynamodb.GetItem"}
    assert needed(calls) == {"dynamodb:Query", "dynamodb:GetItem"}
    assert needed_resources(calls) == {
        ("dynamodb:Query", TABLE_ARN),
        ("dynamodb:GetItem", TABLE_ARN),
        ("dynamodb:Query", f"{TABLE_ARN}/index/open"),
    }
    on_table = [{"actions": {"dynamodb:Query", "dynamodb:GetItem"}, "resources": [TABLE_ARN]}]
    assert resource_problems("r", calls, on_table) == [
        f"r: the code calls dynamodb:Query on {TABLE_ARN}/index/open, which no statement grants"
    ]
    for index_arn in (f"{TABLE_ARN}/index/open", f"{TABLE_ARN}/index/*"):
        with_index = on_table + [{"actions": {"dynamodb:Query"}, "resources": [index_arn]}]
        assert resource_problems("r", calls, with_index) == []
    # ...and a grant on the index ARN does not cover the table.
    index_only = [{"actions": {"dynamodb:Query", "dynamodb:GetItem"}, "resources": [f"{TABLE_ARN}/index/*"]}]
    assert len(resource_problems("r", calls, index_only)) == 2


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.slow
def test_the_resource_check_fails_when_any_needed_resource_is_removed(role, recorded):
    statements = policy_statements()[role]
    for action, resource in sorted(needed_resources(recorded[role])):
        cut = [
            {**st, "resources": [r for r in st["resources"] if not fnmatchcase(resource, _any_user(r))]}
            if action in st["actions"]
            else st
            for st in statements
        ]
        found = resource_problems(role, recorded[role], cut)
        assert any(action in p and resource in p for p in found), f"removing {resource} from {action} went unnoticed"


@pytest.mark.slow
def test_the_nodes_table_and_bucket_calls_meet_the_policys_conditions(scenarios):
    """The node's statements carry conditions (which attributes an UpdateItem may name, that a result is put only as
    a new object): every table and bucket call the node's code made is evaluated with its request context."""
    requests = scenarios[1]
    assert any(ctx.get("s3:if-none-match") == "*" for call, ctx in requests if "/result/" in call)
    assert any(call == "dynamodb.UpdateItem" for call, _ in requests)
    statements = policy_statements()["node"]
    assert condition_problems("node", requests, statements) == []
    # ...and the check sees a condition the code does not meet: without the node item's `stats`, its write is named.
    cut = [
        {
            **st,
            "conditions": tuple(
                iam_eval.Condition(c.operator, c.key, tuple(v for v in c.values if v != "stats"))
                for c in st["conditions"]
            ),
        }
        for st in statements
    ]
    assert any("dynamodb:UpdateItem" in p and "stats" in p for p in condition_problems("node", requests, cut))
