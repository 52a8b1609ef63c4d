"""fleet.aws.ec2 against moto server: listings by the stack's tags over every page, lookups by id, terminate in
batches past ids EC2 no longer knows, and the ids EC2 answers with checked before use.

moto answers DescribeInstances 100 reservations a page, and each RunInstances call here is one reservation, so
more than 100 launches make a listing of two pages.
"""

from __future__ import annotations

import uuid
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from fleet.aws import ec2 as ec2_api
from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.config import AwsConfig
from fleet.record.tags import ROLE_HUB, ROLE_NODE, TAG_ROLE, TAG_RUN_ID, instance_tags

UNKNOWN = "i-0000000000000dead"


@pytest.fixture(scope="module")
def ec2(moto_endpoint):
    return AwsClients(AwsConfig(endpoint_url=moto_endpoint), credentials=LOCAL_CREDENTIALS).client("ec2")


@pytest.fixture(scope="module")
def ami(ec2) -> str:
    return ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]


@pytest.fixture
def stack() -> str:
    return "gf-" + uuid.uuid4().hex[:8]


class Calls:
    """The EC2 calls made through a client, by operation, with their parameters."""

    def __init__(self, client: Any):
        self.made: list[tuple[str, dict[str, Any]]] = []
        client.meta.events.register("before-parameter-build.ec2", self._record)
        self._client = client

    def _record(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.made.append((model.name, dict(params)))

    def of(self, operation: str) -> list[dict[str, Any]]:
        return [p for name, p in self.made if name == operation]

    def close(self) -> None:
        self._client.meta.events.unregister("before-parameter-build.ec2", self._record)


@pytest.fixture
def calls(ec2):
    c = Calls(ec2)
    yield c
    c.close()


def launch(ec2, ami: str, stack: str | None, run_id: str = "r1", role: str | None = ROLE_NODE, n: int = 1) -> list[str]:
    """`n` instances, one RunInstances (one reservation) each, tagged as gridfleet tags them (without a stack or a
    role tag when that is None)."""
    tags = [t for t in instance_tags(stack or "", run_id, role or "") if t["Value"]]
    spec = [{"ResourceType": "instance", "Tags": tags}]
    return [
        ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, TagSpecifications=spec)["Instances"][0]["InstanceId"]
        for _ in range(n)
    ]


def states(ec2, ids: list[str]) -> dict[str, str]:
    out = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    return {i["InstanceId"]: i["State"]["Name"] for r in out for i in r["Instances"]}


# --- reads ------------------------------------------------------------------------------------------------------
def test_describe_sees_only_the_stack_narrowed_by_run_role_and_state(ec2, ami, stack):
    nodes = launch(ec2, ami, stack, "r1", ROLE_NODE, 2)
    [hub] = launch(ec2, ami, stack, "r1", ROLE_HUB)
    [other_run] = launch(ec2, ami, stack, "r2", ROLE_NODE)
    launch(ec2, ami, stack + "-other", "r1", ROLE_NODE)  # another stack, same run id
    ec2.stop_instances(InstanceIds=[other_run])

    assert {i.id for i in ec2_api.describe(ec2, stack)} == {*nodes, hub, other_run}
    assert {i.id for i in ec2_api.describe(ec2, stack, run_id="r1", role=ROLE_NODE)} == set(nodes)
    assert [i.id for i in ec2_api.describe(ec2, stack, states=("stopping", "stopped"))] == [other_run]
    [seen] = ec2_api.describe(ec2, stack, role=ROLE_HUB)
    assert (seen.id, seen.role, seen.run_id, seen.stack, seen.live) == (hub, ROLE_HUB, "r1", stack, True)
    assert seen.tags[TAG_RUN_ID] == "r1" and seen.launched_at and seen.private_ip and seen.instance_type
    assert ec2_api.live_hub_ids(ec2, stack, "r1") == [hub] and ec2_api.live_hub_ids(ec2, stack, "r2") == []


def test_describe_reads_every_page(ec2, ami, stack, calls):
    ids = launch(ec2, ami, stack, n=105)
    calls.made.clear()

    found = ec2_api.describe(ec2, stack, run_id="r1")

    assert sorted(i.id for i in found) == sorted(ids)
    pages = calls.of("DescribeInstances")
    assert len(pages) == 2 and "NextToken" in pages[1]


def test_terminate_goes_in_batches_of_the_documented_size(ec2, ami, stack, calls):
    ids = launch(ec2, ami, stack, n=ec2_api.TERMINATE_BATCH + 5)
    calls.made.clear()

    ec2_api.terminate(ec2, ids + ids[:3])  # a repeated id is terminated once

    assert [len(c["InstanceIds"]) for c in calls.of("TerminateInstances")] == [ec2_api.TERMINATE_BATCH, 5]
    assert set(states(ec2, ids).values()) <= {"shutting-down", "terminated"}


def test_an_id_ec2_no_longer_knows_does_not_stop_the_others(ec2, ami, stack, calls):
    ids = launch(ec2, ami, stack, n=3)
    calls.made.clear()

    ec2_api.terminate(ec2, [ids[0], UNKNOWN, *ids[1:]])

    batches = [c["InstanceIds"] for c in calls.of("TerminateInstances")]
    assert batches == [[ids[0], UNKNOWN, *ids[1:]], [ids[0]], [UNKNOWN], [ids[1]], [ids[2]]]
    assert set(states(ec2, ids).values()) <= {"shutting-down", "terminated"}


def test_find_answers_any_stack_and_none_for_what_ec2_does_not_know(ec2, ami, stack, calls):
    [iid] = launch(ec2, ami, None, role=None)  # untagged: no stack, no role
    found = ec2_api.find(ec2, iid)
    assert found is not None and found.id == iid and found.stack is None and found.role is None
    assert ec2_api.find(ec2, UNKNOWN) is None
    calls.made.clear()
    assert ec2_api.find(ec2, "i-1") is None and ec2_api.find(ec2, "i-0abc; rm") is None
    assert calls.made == []  # not an instance id: EC2 is not asked


def test_run_hub_tags_the_hub_and_its_volumes(ec2, stack):
    template = f"lt-{stack}"
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2.create_launch_template(LaunchTemplateName=template, LaunchTemplateData={"ImageId": image})
    iid = ec2_api.run_hub(ec2, template, stack, "r9", "gf-token-" + stack)
    [hub] = ec2_api.describe(ec2, stack, run_id="r9")
    assert hub.id == iid and hub.role == ROLE_HUB and hub.tags["Name"] == f"{stack}-hub-r9"


def test_tag_and_start_gives_a_stopped_hub_the_run(ec2, ami, stack):
    [iid] = launch(ec2, ami, stack, "old", ROLE_HUB)
    ec2_api.stop(ec2, [iid])
    assert states(ec2, [iid])[iid] in ("stopping", "stopped")
    ec2_api.tag_and_start(ec2, iid, "new")
    found = ec2_api.find(ec2, iid)
    assert found is not None and found.run_id == "new" and found.role == ROLE_HUB and found.live


# --- what EC2 answers is checked ---------------------------------------------------------------------------------
def stubbed(operation: str, response: dict[str, Any] | None = None, error: str | None = None) -> Any:
    """A client whose one call of `operation` answers `response`, or fails with the error code `error`."""
    client = boto3.client("ec2", region_name="ap-northeast-2", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    if error:
        stub.add_client_error(operation, error, http_status_code=400)
    else:
        stub.add_response(operation, response or {})
    stub.activate()
    return client


@pytest.mark.parametrize("bad", ["i-1", "i-0123456789ABCDEF0", "../i-0123456789abcdef0", ""])
def test_an_instance_id_read_back_that_is_not_one_is_refused(bad):
    listed = stubbed("describe_instances", {"Reservations": [{"Instances": [{"InstanceId": bad}]}]})
    with pytest.raises(ValueError, match="not an EC2 instance id"):
        ec2_api.describe(listed, "gf")
    started = stubbed("run_instances", {"Instances": [{"InstanceId": bad}]})
    with pytest.raises(ValueError, match="not an EC2 instance id"):
        ec2_api.run_hub(started, "lt", "gf", "r1", "token")


def test_a_reclaimed_spot_instance_reads_as_interrupted():
    raw = {
        "InstanceId": "i-0123456789abcdef0",
        "State": {"Name": "terminated"},
        "StateReason": {"Code": ec2_api.SPOT_RECLAIMED},
        "Tags": [{"Key": TAG_ROLE, "Value": ROLE_NODE}],
    }
    inst = ec2_api.of_ec2(raw)
    assert inst.interrupted and not inst.live and inst.role == ROLE_NODE and inst.launched_at is None


def test_terminate_raises_what_is_not_an_unknown_id():
    refused = stubbed("terminate_instances", error="UnauthorizedOperation")
    with pytest.raises(ClientError, match="UnauthorizedOperation"):
        ec2_api.terminate(refused, ["i-0123456789abcdef0", "i-0123456789abcdef1"])  # no one-by-one retry after it
    with pytest.raises(ValueError, match="not an EC2 instance id"):
        ec2_api.terminate(stubbed("terminate_instances"), ["i-0123456789abcdef0", "not-an-id"])
