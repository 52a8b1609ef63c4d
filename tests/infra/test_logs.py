"""Shipping the hub's and the nodes' logs: the groups the stack makes, and exactly the calls that ship to them.

Two shippers write a stream per instance (`<run id>/<instance id>`): watchtower's `CloudWatchLogHandler` in
`gridfleet ship-logs` (the group exists, so `create_log_group=False`), and the boot script's `aws logs` calls
for a boot that fails before that runs. watchtower is run here against the stack the twin applied
(tests/infra/conftest.py), with every call it makes recorded; the boot scripts' calls are read from their
templates. Each role's grant must be exactly those actions, on the streams of its own group and no other.
"""

from __future__ import annotations

import json
import logging
import re
import time
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest

from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.config.aws import AwsConfig

TEMPLATES = Path(__file__).resolve().parents[2] / "cloud_init" / "templates"
RUN = "2026-11-24"
#: What ships each role's logs: the hub's instance and a node's.
SHIPPERS = {"hub": "i-0123456789abcdef0", "node": "i-0fedcba9876543210"}


def statements(applied, role: str) -> list[dict[str, Any]]:
    return json.loads(applied.outputs.policies[f"aws_iam_role_policy.{role}.policy"])["Statement"]


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def stream_arn(applied, group: str, stream: str) -> str:
    """The ARN IAM authorizes CreateLogStream and PutLogEvents on: the stream's."""
    account = applied.clients.client("sts").get_caller_identity()["Account"]
    return f"arn:aws:logs:{applied.clients.aws.region}:{account}:log-group:{group}:log-stream:{stream}"


def granted(applied, role: str, action: str, arn: str) -> bool:
    return any(
        action in as_list(st["Action"]) and any(fnmatchcase(arn, r) for r in as_list(st["Resource"]))
        for st in statements(applied, role)
        if st["Effect"] == "Allow"
    )


def recording_client(applied, calls: list[tuple[str, str, str]]) -> Any:
    """A logs client on the stack's server that appends each call it makes: (operation, group, stream)."""

    def record(service: str, client: Any) -> None:
        client.meta.events.register(
            "before-parameter-build",
            lambda params, model, **_: calls.append(
                (model.name, params.get("logGroupName", ""), params.get("logStreamName", ""))
            ),
        )

    return AwsClients(applied.clients.aws, credentials=LOCAL_CREDENTIALS, on_client=(record,)).client("logs")


def ship_with_watchtower(applied, group: str, stream: str) -> list[tuple[str, str, str]]:
    """Ship two lines through watchtower's handler as the shipper configures it; every call it made."""
    import watchtower

    calls: list[tuple[str, str, str]] = []
    logs = recording_client(applied, calls)
    handler = watchtower.CloudWatchLogHandler(
        log_group_name=group, log_stream_name=stream, boto3_client=logs, create_log_group=False
    )
    logger = logging.getLogger(f"gridfleet-ship-test.{stream}")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        logger.warning("first line")
        logger.warning("second line")
        handler.flush()
    finally:
        logger.removeHandler(handler)
        handler.close()
    return calls


@pytest.fixture(scope="module")
def shipped(applied) -> dict[str, list[tuple[str, str, str]]]:
    groups = {"hub": applied.outputs.hub_log_group, "node": applied.outputs.node_log_group}
    return {role: ship_with_watchtower(applied, groups[role], f"{RUN}/{iid}") for role, iid in SHIPPERS.items()}


def boot_script_operations() -> set[str]:
    """The CloudWatch Logs operations the boot scripts call with the AWS CLI (`aws logs put-log-events` is
    PutLogEvents)."""
    commands = {m for t in TEMPLATES.glob("*.j2") for m in re.findall(r"\baws logs ([a-z][a-z-]*)", t.read_text())}
    return {"".join(w.capitalize() for w in c.split("-")) for c in commands}


def test_the_groups_are_named_after_the_stack_as_the_code_derives_them(applied):
    aws = AwsConfig(stack=applied.outputs.name_prefix)
    assert (applied.outputs.hub_log_group, applied.outputs.node_log_group) == (aws.log_group_hub, aws.log_group_node)
    groups = applied.clients.client("logs").describe_log_groups(logGroupNamePrefix=f"/{aws.stack}/")["logGroups"]
    assert {g["logGroupName"] for g in groups} == {aws.log_group_hub, aws.log_group_node, f"/{aws.stack}/vpc-flow-logs"}


@pytest.mark.parametrize("role", SHIPPERS)
def test_watchtower_ships_into_the_stacks_group(applied, shipped, role):
    group = applied.outputs.hub_log_group if role == "hub" else applied.outputs.node_log_group
    stream = f"{RUN}/{SHIPPERS[role]}"
    events = applied.clients.client("logs").get_log_events(logGroupName=group, logStreamName=stream)["events"]
    assert [e["message"] for e in events] == ["first line", "second line"]
    # The stream did not exist: the first put was refused and watchtower made it, then put again.
    assert [op for op, _, _ in shipped[role]] == ["PutLogEvents", "CreateLogStream", "PutLogEvents"]
    assert {(g, s) for _, g, s in shipped[role]} == {(group, stream)}


def test_the_shippers_sink_makes_no_call_beyond_watchtowers(applied, shipped):
    """`gridfleet ship-logs` sends through `fleet.aws.cwlogs.LogSink`, which wraps watchtower's handler: the same
    calls, into a stream of its own here."""
    from fleet.aws.cwlogs import LogSink

    calls: list[tuple[str, str, str]] = []
    sink = LogSink(recording_client(applied, calls), applied.outputs.node_log_group, f"{RUN}/i-0bbbbbbbbbbbbbbbb")
    try:
        sink.put("a line", time.time())
        assert sink.flush().ok
    finally:
        sink.close()
    assert {op for op, _, _ in calls} == {op for op, _, _ in shipped["node"]}


def test_the_boot_scripts_ship_with_the_same_calls(shipped):
    assert boot_script_operations() == {"CreateLogStream", "PutLogEvents"}
    assert boot_script_operations() == {op for op, _, _ in shipped["hub"]}


@pytest.mark.parametrize("role", SHIPPERS)
def test_each_role_may_make_exactly_the_shipping_calls_on_its_own_groups_streams(applied, shipped, role):
    needed = {f"logs:{op}" for op, _, _ in shipped[role]} | {f"logs:{op}" for op in boot_script_operations()}
    logs = [st for st in statements(applied, role) if any(a.startswith("logs:") for a in as_list(st["Action"]))]
    assert [set(as_list(st["Action"])) for st in logs] == [needed], "the shipping calls, and no other logs action"
    own = applied.outputs.hub_log_group if role == "hub" else applied.outputs.node_log_group
    other = applied.outputs.node_log_group if role == "hub" else applied.outputs.hub_log_group
    for op, group, stream in shipped[role]:
        assert granted(applied, role, f"logs:{op}", stream_arn(applied, group, stream)), (op, group, stream)
    for action in needed:
        assert granted(applied, role, action, stream_arn(applied, own, f"{RUN}/i-0aaaaaaaaaaaaaaaa"))
        assert not granted(applied, role, action, stream_arn(applied, other, f"{RUN}/{SHIPPERS[role]}"))
        another_stack = own.replace(f"/{applied.outputs.name_prefix}/", "/gridfleet-other/")
        assert not granted(applied, role, action, stream_arn(applied, another_stack, f"{RUN}/{SHIPPERS[role]}"))
        assert not granted(applied, role, action, stream_arn(applied, own, "").removesuffix(":log-stream:"))


@pytest.mark.parametrize("role", ["starter", "watchdog"])
def test_the_lambdas_write_only_their_own_groups(applied, role):
    for st in statements(applied, role):
        if any(a.startswith("logs:") for a in as_list(st["Action"])):
            assert all(
                f":log-group:/aws/lambda/{applied.outputs.name_prefix}-{role}:" in r for r in as_list(st["Resource"])
            )
