"""Ec2Provider against moto server: spot launches, IMDSv2, tags, idempotent re-reads, capacity fallbacks."""

from __future__ import annotations

import base64
import uuid

import pytest
from botocore.exceptions import ClientError

from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.config import Config
from fleet.config.aws import AwsConfig
from hub.providers.ec2 import Ec2Provider


@pytest.fixture(scope="module")
def ec2(moto_endpoint):
    return AwsClients(AwsConfig(endpoint_url=moto_endpoint), credentials=LOCAL_CREDENTIALS).client("ec2")


@pytest.fixture(scope="module")
def net(ec2):
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{k}.0/24", AvailabilityZone=f"ap-northeast-2{z}")["Subnet"][
            "SubnetId"
        ]
        for k, z in ((1, "a"), (2, "c"))
    ]
    sg = ec2.create_security_group(GroupName=f"nodes-{uuid.uuid4().hex[:6]}", Description="nodes", VpcId=vpc)
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    return {"subnets": subnets, "sg": sg["GroupId"], "ami": ami}


def config(net, **fleet):
    return Config.model_validate(
        {
            "fleet": {"max_nodes": 10, "instance_types": ["t3.medium", "t3a.medium"], **fleet},
            "aws": {"subnet_ids": net["subnets"], "security_group_ids": [net["sg"]], "instance_profile": None},
            "sites": [{"id": "a", "start_url": "https://a.test/"}],
        }
    )


def run_id():
    return "r-" + uuid.uuid4().hex[:8]


def describe(ec2, ids):
    return [i for r in ec2.describe_instances(InstanceIds=list(ids))["Reservations"] for i in r["Instances"]]


def test_nodes_are_one_time_spot_with_imdsv2_terminate_on_shutdown_and_run_tags(ec2, net):
    rid = run_id()
    p = Ec2Provider(ec2, config(net), ami=net["ami"], user_data=lambda r: f"#cloud-config\n# run {r}\n")
    result = p.launch(rid, 3)
    assert len(result.launched) == 3 and result.errors == (), result
    for i in describe(ec2, result.launched):
        assert i["InstanceLifecycle"] == "spot"
        assert i["MetadataOptions"]["HttpTokens"] == "required"
        tags = {t["Key"]: t["Value"] for t in i["Tags"]}
        assert tags["gridfleet:run_id"] == rid and tags["gridfleet:role"] == "node"
        # (moto starts one spot instance per call whatever MaxCount says, so a launch may use several types)
        assert i["SubnetId"] in net["subnets"] and i["InstanceType"] in ("t3.medium", "t3a.medium")
        attr = ec2.describe_instance_attribute(
            InstanceId=i["InstanceId"], Attribute="instanceInitiatedShutdownBehavior"
        )
        assert attr["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
        ud = ec2.describe_instance_attribute(InstanceId=i["InstanceId"], Attribute="userData")["UserData"]["Value"]
        assert base64.b64decode(ud).decode() == f"#cloud-config\n# run {rid}\n"
    assert {i.id for i in p.list(rid) if i.live} == set(result.launched)
    assert p.list(run_id()) == []


def test_launch_to_a_target_re_reads_ec2_and_starts_only_the_difference(ec2, net):
    rid = run_id()
    p = Ec2Provider(ec2, config(net), ami=net["ami"], user_data=lambda r: "#cloud-config\n")
    first = p.launch(rid, 2, target=2)
    again = Ec2Provider(ec2, config(net), ami=net["ami"], user_data=lambda r: "#cloud-config\n")  # a new hub
    assert again.launch(rid, 2, target=2).launched == ()  # nothing: two already run
    assert len(again.launch(rid, 5, target=3).launched) == 1
    p.terminate(list(first.launched) + ["i-0000000000000dead"])  # unknown ids do not stop the others
    states = {i.id: i.state for i in p.list(rid)}
    assert all(states[i] in ("shutting-down", "terminated") for i in first.launched)


def test_launches_spread_over_the_subnets(ec2, net):
    rid = run_id()
    p = Ec2Provider(ec2, config(net), ami=net["ami"], user_data=lambda r: "#cloud-config\n")
    subnets = {describe(ec2, p.launch(rid, 1).launched)[0]["SubnetId"] for _ in range(2)}
    assert subnets == set(net["subnets"])


class CapacityLimited:
    """The real EC2 client, except that RunInstances fails with a capacity error for chosen (market, type).

    moto always has capacity; this seam is the only way to exercise the fallbacks here.
    """

    def __init__(self, ec2, refuse: dict[tuple[str, str], str]):
        self._ec2, self.refuse, self.calls = ec2, refuse, []

    def __getattr__(self, name):
        return getattr(self._ec2, name)

    def run_instances(self, **kw):
        market = "spot" if "InstanceMarketOptions" in kw else "on-demand"
        self.calls.append((market, kw["InstanceType"], kw.get("SubnetId")))
        code = self.refuse.get((market, kw["InstanceType"]))
        if code:
            raise ClientError({"Error": {"Code": code, "Message": "no capacity"}}, "RunInstances")
        return self._ec2.run_instances(**kw)


def test_capacity_errors_move_to_other_types_then_to_on_demand(ec2, net):
    rid = run_id()
    limited = CapacityLimited(
        ec2, {("spot", "t3.medium"): "InsufficientInstanceCapacity", ("spot", "t3a.medium"): "SpotMaxPriceTooLow"}
    )
    p = Ec2Provider(limited, config(net), ami=net["ami"], user_data=lambda r: "#cloud-config\n")
    result = p.launch(rid, 2)
    assert len(result.launched) == 2  # no site is left without a node
    assert [c[0] for c in limited.calls[:4]] == ["spot"] * 4  # every spot type in every subnet first
    assert limited.calls[-1][:2] == ("on-demand", "t3.medium")
    assert any("InsufficientInstanceCapacity" in e for e in result.errors)
    assert all(i.get("InstanceLifecycle") != "spot" for i in describe(ec2, result.launched))


def test_no_on_demand_fallback_when_it_is_off(ec2, net):
    limited = CapacityLimited(
        ec2,
        {("spot", "t3.medium"): "InsufficientInstanceCapacity", ("spot", "t3a.medium"): "InsufficientInstanceCapacity"},
    )
    p = Ec2Provider(limited, config(net, on_demand_fallback=False), ami=net["ami"], user_data=lambda r: "x")
    result = p.launch(run_id(), 1)
    assert result.launched == () and len(result.errors) == 4
    assert {c[0] for c in limited.calls} == {"spot"}


def test_a_non_capacity_error_stops_the_launch_and_is_reported(ec2, net):
    limited = CapacityLimited(ec2, {("spot", "t3.medium"): "UnauthorizedOperation"})
    p = Ec2Provider(limited, config(net), ami=net["ami"], user_data=lambda r: "x")
    result = p.launch(run_id(), 1)
    assert result.launched == () and len(limited.calls) == 1 and "UnauthorizedOperation" in result.errors[0]


def test_hub_alive_reads_the_hub_instance(ec2, net):
    p = Ec2Provider(ec2, config(net), ami=net["ami"], user_data=lambda r: "x")
    hub = ec2.run_instances(ImageId=net["ami"], MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    assert p.hub_alive(f"ec2:{hub}")
    ec2.terminate_instances(InstanceIds=[hub])
    assert not p.hub_alive(f"ec2:{hub}") and not p.hub_alive("host:x:1:2")
