"""The launch templates, the Lambdas and their schedules, made on moto as infra/terraform declares them.

Registered with `resources.creates` like the rest. A launch template's data is the .tf's blocks in EC2's
names, field for field. A function's code is the object the .tf names (`s3_bucket`, `s3_key`,
`s3_object_version`); the twin calls the handlers in this process, so what that object holds is never run.
moto keeps no dead-letter configuration of a function; the call still carries the .tf's.
"""

from __future__ import annotations

import io
import zipfile
from typing import Any

from twin.terraform.resources import Ctx, creates, pascal, single

#: Nested blocks of a launch template that are lists in EC2's API (the others are one member each).
_TEMPLATE_LISTS = frozenset({"network_interfaces", "block_device_mappings", "tag_specifications", "tags"})


def placeholder_package() -> bytes:
    """A Lambda package that is never run: the twin calls the handlers in this process."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("README.txt", "Placeholder: the EC2 twin calls the handlers in-process.\n")
    return buf.getvalue()


_TEMPLATE_RENAMES = {"security_groups": "Groups", "vpc_security_group_ids": "SecurityGroupIds"}
_TEMPLATE_DATA = (
    "image_id instance_type key_name instance_initiated_shutdown_behavior user_data iam_instance_profile "
    "network_interfaces vpc_security_group_ids metadata_options block_device_mappings monitoring tag_specifications"
)


def template_data(a: dict[str, Any]) -> dict[str, Any]:
    """The LaunchTemplateData of a template's arguments (pure: the tests compare moto's copy with it)."""
    data = {k: a[k] for k in _TEMPLATE_DATA.split() if a.get(k) not in (None, [])}
    specs = [
        {**s, "tags": [{"Key": k, "Value": v} for k, v in s["tags"].items()]} for s in a.get("tag_specifications", [])
    ]
    if specs:
        data["tag_specifications"] = specs
    return pascal(data, _TEMPLATE_LISTS, _TEMPLATE_RENAMES)


@creates("aws_launch_template", "name description tags " + _TEMPLATE_DATA, "update_default_version")
def _launch_template(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    ec2 = ctx.clients.client("ec2")
    lt = ec2.create_launch_template(
        LaunchTemplateName=a["name"],
        VersionDescription=a.get("description") or "",
        LaunchTemplateData=template_data(a),
    )["LaunchTemplate"]
    lid = lt["LaunchTemplateId"]
    # Tagged apart: moto copies a create call's launch-template tags into the template's data, EC2 does not.
    ec2.create_tags(Resources=[lid], Tags=ctx.tag_list(a))
    arn = f"arn:{ctx.partition}:ec2:{ctx.region}:{ctx.account_id}:launch-template/{lid}"
    return {"id": lid, "arn": arn, "latest_version": lt["LatestVersionNumber"]}


@creates(
    "aws_lambda_function",
    "function_name description role runtime handler timeout memory_size s3_bucket s3_key s3_object_version "
    "reserved_concurrent_executions kms_key_arn environment tracing_config dead_letter_config",
)
def _function(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    awslambda = ctx.clients.client("lambda")
    code = {"S3Bucket": a["s3_bucket"], "S3Key": a["s3_key"]}
    if a.get("s3_object_version"):
        code["S3ObjectVersion"] = a["s3_object_version"]
    environment = single(a, "environment") or {}
    options = pascal(
        {k: a.get(k) for k in ("description", "timeout", "memory_size", "tracing_config", "dead_letter_config")}
    )
    fn = awslambda.create_function(
        FunctionName=a["function_name"],
        Role=a["role"],
        Runtime=a["runtime"],
        Handler=a["handler"],
        Code=code,
        KMSKeyArn=a["kms_key_arn"],
        Environment={"Variables": environment.get("variables") or {}},
        **options,
    )
    if a.get("reserved_concurrent_executions") is not None:
        awslambda.put_function_concurrency(
            FunctionName=a["function_name"], ReservedConcurrentExecutions=a["reserved_concurrent_executions"]
        )
    return {"id": a["function_name"], "arn": fn["FunctionArn"], "invoke_arn": fn["FunctionArn"]}


@creates("aws_lambda_permission", "statement_id action function_name principal source_arn")
def _permission(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    ctx.clients.client("lambda").add_permission(
        FunctionName=a["function_name"],
        StatementId=a["statement_id"],
        Action=a["action"],
        Principal=a["principal"],
        SourceArn=a["source_arn"],
    )
    return {"id": a["statement_id"]}


@creates("aws_cloudwatch_event_rule", "name description schedule_expression event_pattern state tags")
def _rule(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    fields = pascal({k: a.get(k) for k in ("name", "description", "schedule_expression", "event_pattern", "state")})
    arn = ctx.clients.client("events").put_rule(**fields, Tags=ctx.tag_list(a))["RuleArn"]
    return {"id": a["name"], "arn": arn}


@creates("aws_cloudwatch_event_target", "rule target_id arn input retry_policy")
def _target(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    target = pascal(
        {"id": a["target_id"], "arn": a["arn"], "input": a.get("input"), "retry_policy": a.get("retry_policy")}
    )
    answer = ctx.clients.client("events").put_targets(Rule=a["rule"], Targets=[target])
    if answer.get("FailedEntryCount"):
        raise ValueError(f"put_targets refused {a['target_id']}: {answer['FailedEntries']}")
    return {"id": f"{a['rule']}-{a['target_id']}"}
