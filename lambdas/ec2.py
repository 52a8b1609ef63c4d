"""The stack's instances as the Lambdas see them, and the few EC2 calls they make.

Every read selects by the stack's tag (`fleet.aws.tags.filters`), so a Lambda never sees, let alone touches, an
instance of another stack. What is read becomes an `Instance`, the plain value the pure decisions of the starter
and the watchdog work on; the writes below are all the EC2 changes either program makes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from fleet.aws.clients import error_code
from fleet.tags import LIVE_STATES, ROLE_HUB, TAG_ROLE, TAG_RUN_ID, TAG_STACK, filters, instance_tags, tags_of

#: States of an instance that is not running but still exists (and bills for its volumes).
STOPPED_STATES = ("stopping", "stopped")

TERMINATE_BATCH = 100  # instance ids per TerminateInstances call


@dataclass(frozen=True)
class Instance:
    """One EC2 instance: its id, state, tags and launch time (epoch seconds)."""

    id: str
    state: str
    tags: Mapping[str, str] = field(default_factory=dict)
    launched_at: float | None = None

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def stopped(self) -> bool:
        return self.state in STOPPED_STATES

    @property
    def run_id(self) -> str | None:
        return self.tags.get(TAG_RUN_ID)

    @property
    def role(self) -> str | None:
        return self.tags.get(TAG_ROLE)

    @property
    def stack(self) -> str | None:
        return self.tags.get(TAG_STACK)


def of_ec2(raw: Mapping[str, Any]) -> Instance:
    launch = raw.get("LaunchTime")
    return Instance(
        raw["InstanceId"],
        raw.get("State", {}).get("Name", ""),
        tags_of(dict(raw)),
        launch.timestamp() if launch is not None else None,
    )


def _describe(ec2: Any, **kwargs: Any) -> Iterator[Instance]:
    for page in ec2.get_paginator("describe_instances").paginate(**kwargs):
        for reservation in page.get("Reservations", []):
            yield from (of_ec2(raw) for raw in reservation.get("Instances", []))


def stack_instances(ec2: Any, stack: str, states: tuple[str, ...]) -> list[Instance]:
    """The stack's instances in `states`."""
    return list(_describe(ec2, Filters=filters(stack, states=states)))


def hub_instances(ec2: Any, run_id: str, stack: str) -> list[Instance]:
    """Every hub instance of the stack tagged with the run, in any state."""
    return list(_describe(ec2, Filters=filters(stack, run_id=run_id, role=ROLE_HUB)))


def live_hub_ids(ec2: Any, run_id: str, stack: str) -> list[str]:
    """The run's hub instances that are pending or running."""
    return sorted(i.id for i in hub_instances(ec2, run_id, stack) if i.live)


def describe_one(ec2: Any, instance_id: str) -> Instance | None:
    """The instance, whichever stack it is of (the caller checks), or None if EC2 does not know it."""
    try:
        found = list(_describe(ec2, InstanceIds=[instance_id]))
    except ClientError as e:
        if error_code(e) in ("InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"):
            return None
        raise
    return found[0] if found else None


def tag_and_start(ec2: Any, instance_id: str, run_id: str) -> None:
    """Give a stopped hub of the stack the run to resume, then start it."""
    ec2.create_tags(
        Resources=[instance_id], Tags=[{"Key": TAG_RUN_ID, "Value": run_id}, {"Key": TAG_ROLE, "Value": ROLE_HUB}]
    )
    ec2.start_instances(InstanceIds=[instance_id])


def run_hub(ec2: Any, template: str, stack: str, run_id: str, client_token: str) -> str:
    """A hub instance from the launch template, it and its volumes tagged with the stack, run and role."""
    tags = instance_tags(stack, run_id, ROLE_HUB)
    out = ec2.run_instances(
        LaunchTemplate={"LaunchTemplateName": template},
        MinCount=1,
        MaxCount=1,
        ClientToken=client_token,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}, {"ResourceType": "volume", "Tags": tags}],
    )
    return str(out["Instances"][0]["InstanceId"])


def terminate(ec2: Any, instance_ids: list[str]) -> None:
    for i in range(0, len(instance_ids), TERMINATE_BATCH):
        ec2.terminate_instances(InstanceIds=instance_ids[i : i + TERMINATE_BATCH])


def stop(ec2: Any, instance_ids: list[str]) -> None:
    if instance_ids:
        ec2.stop_instances(InstanceIds=instance_ids)
