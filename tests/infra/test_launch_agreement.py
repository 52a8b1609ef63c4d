"""What the code sends in RunInstances and what the Terraform launch templates set must agree.

A launch is the template merged with the call: what the call sets wins. So each field the code relies on
(shutdown behaviour, metadata options, tags, instance profile, network, user-data, market) must come from
exactly one of them, or be the same in both; a template must never be overridden into something else, and
never contradict what the code expects of the instance it starts. The calls are the real ones, made by
`Ec2Provider` (nodes) and `fleet.aws.ec2.run_hub` (hubs, as the starter launches them) on a boto3 client
whose answers are stubbed (botocore's Stubber, which still checks every parameter against EC2's API model):
moto stores a launch template but does not merge it into the instance it starts, which is what is checked here.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from cloud_init.render import TEMPLATES_DIR
from fleet.aws import ec2 as ec2_api
from fleet.config import Config, SiteConfig
from fleet.config.aws import AwsConfig
from fleet.record.tags import ROLE_HUB, ROLE_NODE, TAG_ROLE, TAG_RUN_ID, TAG_STACK
from hub.providers.ec2 import Ec2Provider
from tests.infra.test_terraform import blocks, one
from tests.infra.test_terraform import config as terraform

STACK = "gf-prod"


def recorded_run_instances(launch) -> dict[str, Any]:
    """The parameters of the one RunInstances `launch(client)` makes, checked against EC2's API model."""
    client = boto3.client("ec2", region_name="ap-northeast-2", aws_access_key_id="x", aws_secret_access_key="x")
    sent: list[dict[str, Any]] = []
    client.meta.events.register("before-parameter-build.ec2.RunInstances", lambda params, **_: sent.append(params))
    with Stubber(client) as stub:
        stub.add_response("run_instances", {"Instances": [{"InstanceId": "i-0123456789abcdef0"}]})
        launch(client)
        stub.assert_no_pending_responses()
    assert len(sent) == 1
    return sent[0]


def node_call(market: str = "spot") -> dict[str, Any]:
    """A node launch as the hub makes it, with the aws: section `gridfleet config from-terraform` writes."""
    aws = AwsConfig(
        stack=STACK,
        node_launch_template=f"{STACK}-node",
        hub_launch_template=f"{STACK}-hub",
        subnet_ids=("subnet-0aaa", "subnet-0bbb"),
        security_group_ids=("sg-0node",),
        instance_profile=f"{STACK}-node",
        key_name="ops",
    )
    config = Config(aws=aws, sites=(SiteConfig(id="a", start_url="https://a.example/"),))

    def launch(client: Any) -> None:
        provider = Ec2Provider(client, config, ami="ami-0123", user_data=lambda run: f"#cloud-config\n# {run}\n")
        provider._run("2026-11-24", 1, market, "t3.medium", "subnet-0aaa", "gf-token")

    return recorded_run_instances(launch)


def hub_call() -> dict[str, Any]:
    return recorded_run_instances(
        lambda client: ec2_api.run_hub(client, f"{STACK}-hub", STACK, "2026-11-24", "gf-hub-token")
    )


def template(role: str) -> dict[str, Any]:
    return terraform().resource("aws_launch_template", role)


def tags_of_call(call: dict[str, Any], resource: str) -> dict[str, str]:
    [spec] = [s for s in call.get("TagSpecifications", []) if s["ResourceType"] == resource]
    return {t["Key"]: t["Value"] for t in spec["Tags"]}


def template_tags(lt: dict[str, Any], resource: str) -> dict[str, str]:
    """The stack and role tags the template puts on `resource`, as Terraform expressions."""
    tf = terraform()
    [spec] = [s for s in blocks(lt, "tag_specifications") if s["resource_type"] == resource]
    role = re.search(r'\(local\.tag_role\)\s*=\s*"([^"]+)"', spec["tags"])
    assert role, f"the template tags no role: {spec['tags']}"
    assert "local.launch_tags" in spec["tags"], f"the template tags no stack: {spec['tags']}"
    [(stack_key, stack)] = tf.locals["launch_tags"].items()
    assert stack_key == "${(local.tag_stack)}"
    return {TAG_STACK: stack, TAG_ROLE: role.group(1)}


@pytest.mark.parametrize("market", ["spot", "on-demand"])
def test_a_node_launch_leaves_to_the_template_what_the_template_sets(market):
    call, lt = node_call(market), template("node")
    assert call["LaunchTemplate"] == {"LaunchTemplateName": f"{STACK}-node"}
    # the template's image, profile and key are not overridden by the call (they would replace its own)
    for field in ("ImageId", "IamInstanceProfile", "KeyName", "BlockDeviceMappings"):
        assert field not in call, f"the node launch overrides the template's {field}"
    assert "image_id" in lt and "iam_instance_profile" in lt
    # the same shutdown behaviour and metadata options in both: the call cannot turn the template's into others
    assert call["InstanceInitiatedShutdownBehavior"] == lt["instance_initiated_shutdown_behavior"] == "terminate"
    md = one(lt, "metadata_options")
    assert call["MetadataOptions"] == {
        "HttpTokens": md["http_tokens"],
        "HttpEndpoint": md["http_endpoint"],
        "HttpPutResponseHopLimit": md["http_put_response_hop_limit"],
    }
    # the network: the template names security groups only, so the call may choose the subnet per launch
    assert "network_interfaces" not in lt and "subnet_id" not in lt
    assert call["SubnetId"] == "subnet-0aaa" and call["SecurityGroupIds"] == ["sg-0node"]
    assert lt["vpc_security_group_ids"] == ["${aws_security_group.node.id}"]
    # user-data and market are the call's alone
    assert "user_data" not in lt and base64.b64decode(call["UserData"]).startswith(b"#cloud-config")
    assert "instance_market_options" not in lt
    assert ("InstanceMarketOptions" in call) is (market == "spot")


def test_a_hub_launch_names_only_the_template_and_its_tags():
    call, lt = hub_call(), template("hub")
    assert set(call) == {"LaunchTemplate", "MinCount", "MaxCount", "ClientToken", "TagSpecifications"}
    # everything else is the template's: shutdown (a hub from the template ends with its run), metadata, network
    assert lt["instance_initiated_shutdown_behavior"] == "terminate"
    nic = one(lt, "network_interfaces")
    assert nic["subnet_id"] and nic["security_groups"] == ["${aws_security_group.hub.id}"]
    assert lt["user_data"] == "${filebase64(local.hub_user_data_file)}"
    assert one(lt, "metadata_options")["http_tokens"] == "required"


def test_the_hub_template_lets_the_hub_read_the_run_tag_its_boot_script_reads():
    boot = (TEMPLATES_DIR / "hub-boot.sh.j2").read_text()
    assert f"tags/instance/{TAG_RUN_ID}" in boot  # the hub learns its run from its own tag
    assert one(template("hub"), "metadata_options")["instance_metadata_tags"] == "enabled"
    assert TAG_RUN_ID in tags_of_call(hub_call(), "instance")


@pytest.mark.parametrize(("role", "call"), [(ROLE_NODE, node_call), (ROLE_HUB, hub_call)])
def test_the_calls_and_the_templates_tag_the_same_stack_and_role(role, call):
    sent, lt = call(), template(role)
    tf = terraform()
    assert (tf.locals["tag_stack"], tf.locals["tag_role"]) == (TAG_STACK, TAG_ROLE)
    for resource in ("instance", "volume"):
        tags = tags_of_call(sent, resource)
        assert tags[TAG_STACK] == STACK and tags[TAG_ROLE] == role and tags[TAG_RUN_ID] == "2026-11-24"
        from_template = template_tags(lt, resource)
        assert from_template[TAG_ROLE] == role  # the same role: the call's tag replaces the template's with itself
        assert from_template[TAG_STACK] == "${var.name_prefix}"  # the stack the config names (aws.stack)
