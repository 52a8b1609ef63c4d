"""Two stacks in one account and region (production beside staging) never touch each other's instances.

Both run the day's run under the same run id, on one moto server: each stack's provider lists, adopts and
terminates only its own nodes; an operator's teardown of one leaves the other's running; one stack's
watchdog cleans up after its own finished run and its own stopped instances, never the other's. And
infra/terraform itself applies twice side by side: nothing it names (log groups included) is the account's
rather than the stack's.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import pytest

from fleet.aws.bootstrap import ensure_resources
from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.aws.table import DynamoStateTable
from fleet.clock import FakeClock
from fleet.config import Config
from fleet.config.aws import AwsConfig
from fleet.record.partition import RunInfo
from fleet.record.tags import TAG_STACK
from hub.providers.ec2 import Ec2Provider
from hub.teardown import teardown_run
from lambdas.settings import LambdaSettings
from lambdas.watchdog import watch
from tests.helpers.stacks import stack_names
from tests.infra.conftest import HUB_USER_DATA, REGION, TF_DIR
from twin.terraform.apply import apply_stack

from .conftest import NamedClients

RUN = "2026-11-24"  # both stacks run the day's run under the same id


@dataclass
class Stack:
    name: str
    config: Config
    provider: Ec2Provider
    table: DynamoStateTable


@pytest.fixture(scope="module")
def clients(moto_endpoint) -> AwsClients:
    return AwsClients(AwsConfig(endpoint_url=moto_endpoint), credentials=LOCAL_CREDENTIALS)


def make_stack(clients: AwsClients, name: str) -> Stack:
    ec2 = clients.client("ec2")
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    tag = uuid.uuid4().hex[:8]
    config = Config.model_validate(
        {
            "fleet": {"max_nodes": 4, "instance_types": ["t3.medium"], "spot": False},
            "aws": {
                "stack": name,
                "endpoint_url": clients.aws.endpoint_url,
                "table": f"t-{tag}",
                "queue": f"q-{tag}",
                "bucket": f"b-{tag}",
            },
            "sites": [{"id": "a", "start_url": "https://a.test/"}],
        }
    )
    ensure_resources(NamedClients(clients, config.aws), visibility_timeout_s=30)
    table = DynamoStateTable(clients.client("dynamodb"), config.aws.table)
    return Stack(name, config, Ec2Provider(ec2, config, ami=ami, user_data=lambda r: "#cloud-config\n"), table)


def fill(stack: Stack, target: int) -> set[str]:
    """Launch until the stack's provider sees `target` live nodes of the run (moto starts one per call)."""
    for _ in range(target):
        stack.provider.launch(RUN, target, target=target)
    return live(stack)


def live(stack: Stack) -> set[str]:
    return {i.id for i in stack.provider.list(RUN) if i.live}


def test_two_stacks_side_by_side_neither_touches_the_other(clients):
    suffix = uuid.uuid4().hex[:6]
    prod, staging = make_stack(clients, f"prod-{suffix}"), make_stack(clients, f"staging-{suffix}")
    ec2 = clients.client("ec2")

    prod_nodes = fill(prod, 2)
    # Staging wants 2 nodes for the same run id: it must launch its own, not count prod's as its.
    staging_nodes = fill(staging, 2)
    assert len(prod_nodes) == len(staging_nodes) == 2 and not prod_nodes & staging_nodes
    assert live(prod) == prod_nodes and live(staging) == staging_nodes
    tags = {
        i["InstanceId"]: {t["Key"]: t["Value"] for t in i["Tags"]}
        for r in ec2.describe_instances(InstanceIds=[*prod_nodes, *staging_nodes])["Reservations"]
        for i in r["Instances"]
    }
    assert {tags[i][TAG_STACK] for i in prod_nodes} == {prod.name}
    assert {tags[i][TAG_STACK] for i in staging_nodes} == {staging.name}

    # An operator tears staging's run down: prod's nodes keep running.
    now = time.time()
    for s in (prod, staging):
        assert s.table.create_run(RunInfo(RUN, "RUNNING", now, now + 3600, "20261124"))
    teardown_run(RUN, staging.table, staging.provider, FakeClock(start=now))
    assert live(staging) == set() and live(prod) == prod_nodes

    # Staging's watchdog, with staging's run FINISHED and a stopped staging hub lying around, cleans up only
    # what is staging's; prod's stopped hub and its running nodes are not its business.
    staging_hub = staging.provider.launch(RUN, 1).launched[0]
    prod_hub = prod.provider.launch(RUN, 1).launched[0]
    ec2.stop_instances(InstanceIds=[staging_hub, prod_hub])
    settings = LambdaSettings(
        region=staging.config.aws.region,
        table=staging.config.aws.table,
        stack=staging.name,
        hub_launch_template="unused",
    )
    out = watch(settings, ec2, staging.table, FakeClock(start=now))
    assert {e["instance_id"] for e in out["terminated"]} == {staging_hub}
    states = {
        i["InstanceId"]: i["State"]["Name"]
        for r in ec2.describe_instances(InstanceIds=[prod_hub, *prod_nodes])["Reservations"]
        for i in r["Instances"]
    }
    assert states == {prod_hub: "stopped", **{n: "running" for n in prod_nodes}}


def test_two_stacks_apply_side_by_side_each_with_its_own_log_groups(clients):
    """infra/terraform applied twice in one account and region (the twin's apply, on one moto server): the second
    apply makes everything the first did under its own names, the hub's, nodes' and flow logs' groups too."""
    regional = AwsClients(
        AwsConfig(endpoint_url=clients.aws.endpoint_url, region=REGION), credentials=LOCAL_CREDENTIALS
    )
    ami = regional.client("ec2").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    applied = [
        apply_stack(regional, TF_DIR, stack_names("gfi"), hub_user_data=HUB_USER_DATA, ami_id=ami) for _ in range(2)
    ]
    logs = regional.client("logs")
    for out in applied:
        aws = AwsConfig(stack=out.name_prefix)
        groups = logs.describe_log_groups(logGroupNamePrefix=f"/{out.name_prefix}/")["logGroups"]
        assert {g["logGroupName"] for g in groups} == {
            aws.log_group_hub,
            aws.log_group_node,
            f"/{aws.stack}/vpc-flow-logs",
        }
        assert (out.hub_log_group, out.node_log_group) == (aws.log_group_hub, aws.log_group_node)
    assert applied[0].vpc_id != applied[1].vpc_id
