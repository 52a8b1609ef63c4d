"""The EC2 twin's control on moto: instances moto starts are booted, those it stops or terminates end, and an
instance's own shutdown applies its shutdown behaviour in moto.

The sandbox is a recorder at the seam (what boots an instance on this machine is tested on its own); moto is
the real peer for every EC2 call: RunInstances with a launch template, StopInstances, TerminateInstances,
StartInstances and the instance attributes the twin reads back.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import boto3
import pytest

from fleet.record.tags import ROLE_HUB, ROLE_NODE, instance_tags
from twin.ec2twin import Ec2Twin, InstanceSpec

REGION = "ap-northeast-2"


@dataclass
class Recorded:
    """A sandbox that records (a seam: it runs nothing)."""

    spec: InstanceSpec
    shutdown: bool = False
    delay_s: float = 0.0  # of the shutdown asked (`shutdown -h +1`: 60)
    stopped: int = 0
    log: list[str] = field(default_factory=list)

    requests: str = ""  # the shutdown requests' lines, when a test gives them

    @property
    def shutdown_requested(self) -> str | bool:
        return (self.requests or True) if self.shutdown else False

    def shutdown_delay_s(self) -> float | None:
        return self.delay_s if self.shutdown else None

    def stop(self, grace_s: float = 0.0) -> None:
        self.stopped += 1
        self.grace_s = grace_s


@pytest.fixture
def ec2(moto_endpoint):
    return boto3.client(
        "ec2", endpoint_url=moto_endpoint, region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x"
    )


def launch(ec2, stack: str, role: str, *, behavior: str | None = None, template: str | None = None) -> str:
    kwargs = {
        "MinCount": 1,
        "MaxCount": 1,
        "UserData": f"#cloud-config\n# {role}\n",
        "TagSpecifications": [{"ResourceType": "instance", "Tags": instance_tags(stack, "2026-11-24", role)}],
    }
    if template:
        kwargs["LaunchTemplate"] = {"LaunchTemplateName": template}
    else:
        kwargs["ImageId"] = "ami-12c6146b"
    if behavior:
        kwargs["InstanceInitiatedShutdownBehavior"] = behavior
    return ec2.run_instances(**kwargs)["Instances"][0]["InstanceId"]


def state(ec2, iid: str) -> str:
    return ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]


def test_instances_moto_starts_boot_with_their_user_data_and_end_when_moto_ends_them(ec2):
    stack = f"gf{uuid.uuid4().hex[:8]}"
    booted: dict[str, Recorded] = {}
    twin = Ec2Twin(ec2, lambda spec: booted.setdefault(spec.instance_id, Recorded(spec)), stack=stack)
    hub = launch(ec2, stack, ROLE_HUB, behavior="terminate")
    node = launch(ec2, stack, ROLE_NODE, behavior="terminate")
    other = launch(ec2, f"other{stack}", ROLE_NODE)  # another stack's: never booted here
    assert sorted(twin.sync()) == sorted([f"boot {hub}", f"boot {node}"])
    assert other not in booted
    assert booted[hub].spec.user_data == "#cloud-config\n# hub\n" and booted[hub].spec.role == ROLE_HUB
    assert booted[node].spec.shutdown_behavior == "terminate"
    assert twin.sync() == []  # nothing changed: nothing booted twice
    ec2.terminate_instances(InstanceIds=[node])
    assert twin.sync() == [f"end {node}"] and booted[node].stopped == 1
    twin.stop_all()
    assert booted[hub].stopped == 1 and twin.running == {}


@pytest.mark.parametrize("behavior", ["terminate", "stop"])
def test_an_instances_own_shutdown_applies_its_shutdown_behaviour_in_moto(ec2, behavior):
    stack = f"gf{uuid.uuid4().hex[:8]}"
    template = f"{stack}-hub"
    ec2.create_launch_template(
        LaunchTemplateName=template,
        LaunchTemplateData={
            "ImageId": "ami-12c6146b",
            "InstanceInitiatedShutdownBehavior": behavior,
            "MetadataOptions": {"HttpTokens": "required", "InstanceMetadataTags": "enabled"},
        },
    )
    booted: dict[str, Recorded] = {}
    twin = Ec2Twin(ec2, lambda spec: booted.setdefault(spec.instance_id, Recorded(spec)), stack=stack)
    hub = launch(ec2, stack, ROLE_HUB, template=template)  # the behaviour comes from the template
    twin.sync()
    # from the template, which moto does not merge into the instance: the twin does
    assert booted[hub].spec.shutdown_behavior == behavior and booted[hub].spec.metadata_tags
    assert not any(k.startswith("aws:") for k in booted[hub].spec.tags)
    booted[hub].shutdown = True  # the hub's last act: shutdown -h
    assert twin.sync() == [f"shutdown {hub} -> {behavior}"]
    assert booted[hub].stopped == 1
    assert state(ec2, hub) == ("terminated" if behavior == "terminate" else "stopped")
    if behavior == "stop":  # a stopped instance that is started again boots again
        booted.clear()
        ec2.start_instances(InstanceIds=[hub])
        assert twin.sync() == [f"boot {hub}"] and twin.running[hub].boots == 2
        twin.stop_all()


def booted_hub(ec2, now: list[float]) -> tuple[Ec2Twin, str, Recorded]:
    """A twin on the clock `now[0]` with one hub booted (a recording sandbox)."""
    stack = f"gf{uuid.uuid4().hex[:8]}"
    booted: dict[str, Recorded] = {}
    twin = Ec2Twin(ec2, lambda spec: booted.setdefault(spec.instance_id, Recorded(spec)), stack=stack,
                   now=lambda: now[0])  # fmt: skip
    hub = launch(ec2, stack, ROLE_HUB, behavior="terminate")
    twin.sync()
    return twin, hub, booted[hub]


def test_a_shutdown_in_a_minute_waits_its_minute_on_the_twins_clock(ec2):
    """`shutdown -h +1` (the hub's self-stop) leaves the instance a minute, as systemd does; the clock is injected."""
    now = [1000.0]
    twin, hub, box = booted_hub(ec2, now)
    box.shutdown, box.delay_s = True, 60.0
    assert twin.sync() == [] and twin.shutdowns == {hub: 1060.0} and state(ec2, hub) == "running"
    now[0] = 1059.0
    assert twin.sync() == []
    now[0] = 1060.0
    assert twin.sync() == [f"shutdown {hub} -> terminate"] and state(ec2, hub) == "terminated"
    assert twin.shutdowns == {}


def test_a_shutdown_now_after_one_in_a_minute_is_now(ec2):
    """The hub's run asks `shutdown -h +1`, its boot script then ends with `shutdown -h now`: down at once."""
    now = [1000.0]
    twin, hub, box = booted_hub(ec2, now)
    box.shutdown, box.delay_s, box.requests = True, 60.0, "t shutdown -h +1\n"
    assert twin.sync() == [] and twin.shutdowns == {hub: 1060.0}
    now[0] = 1010.0
    box.delay_s, box.requests = 0.0, "t shutdown -h +1\nt shutdown -h now\n"
    assert twin.sync() == [f"shutdown {hub} -> terminate"]
