"""EC2: every call gridfleet makes to it, for the hub, the Lambdas and the command line.

Listings select by the stack's tag (`fleet.record.tags.filters`), so no program ever sees an instance of another
stack; lookups by id (the hub's own instance, a configured hub, a node to reach) answer whatever EC2 knows and
leave the stack check to the caller. Every instance read becomes a `fleet.record.instance.Instance`, its id checked
(`fleet.record.ids.check_instance_id`) before anything uses it; the ids RunInstances answers with are checked too.
Errors are EC2's own `ClientError`s: what a caller does with them (capacity fallbacks, a missing hub, a rung
that fails) stays with the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from botocore.exceptions import ClientError

from fleet.aws.clients import error_code
from fleet.record.ids import check_instance_id, is_instance_id
from fleet.record.instance import STOPPED_STATES, Instance
from fleet.record.tags import ROLE_HUB, TAG_ROLE, TAG_RUN_ID, filters, instance_tags, tags_of

__all__ = [
    "Instance",
    "SPOT_RECLAIMED",
    "STOPPED_STATES",
    "TERMINATE_BATCH",
    "console_output",
    "describe",
    "describe_ids",
    "find",
    "live_hub_ids",
    "of_ec2",
    "run_hub",
    "run_instances",
    "stop",
    "tag_and_start",
    "terminate",
]

#: Instance ids per TerminateInstances call. EC2 takes up to 1000 and recommends smaller batches; a call that
#: fails terminates none of its instances (one unknown id, one instance the caller may not terminate), so a
#: batch well under the limit keeps what one bad id holds up, and the one-by-one retry after it, small.
TERMINATE_BATCH = 100

#: EC2's StateReason of a spot instance it reclaimed.
SPOT_RECLAIMED = "Server.SpotInstanceTermination"

#: The answers of an instance id EC2 does not know (gone long enough, or never one).
_UNKNOWN_ID = ("InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed")


# --- reads -----------------------------------------------------------------------------------------------------
def of_ec2(raw: Mapping[str, Any]) -> Instance:
    """An instance as DescribeInstances reports it (ValueError if its id is not an instance id)."""
    tags = tags_of(dict(raw))
    launch = raw.get("LaunchTime")
    return Instance(
        check_instance_id(raw.get("InstanceId"), "instance id from DescribeInstances"),
        raw.get("State", {}).get("Name", ""),
        tags.get(TAG_ROLE),
        tags,
        raw.get("InstanceType"),
        interrupted=raw.get("StateReason", {}).get("Code", "") == SPOT_RECLAIMED,
        launched_at=launch.timestamp() if launch is not None else None,
        private_ip=raw.get("PrivateIpAddress") or None,
    )


def _read(ec2: Any, **kwargs: Any) -> Iterator[Instance]:
    """Every instance DescribeInstances answers `kwargs` with, over all its pages."""
    for page in ec2.get_paginator("describe_instances").paginate(**kwargs):
        for reservation in page.get("Reservations", []):
            yield from (of_ec2(raw) for raw in reservation.get("Instances", []))


def describe(
    ec2: Any,
    stack: str,
    *,
    run_id: str | None = None,
    role: str | None = None,
    states: tuple[str, ...] | None = None,
) -> list[Instance]:
    """The stack's instances, narrowed by run, role and state (None: any)."""
    return list(_read(ec2, Filters=filters(stack, run_id=run_id, role=role, states=states)))


def describe_ids(ec2: Any, instance_ids: Iterable[str]) -> list[Instance]:
    """The instances of these ids, whichever stack they are of; EC2's errors (an unknown id) are raised."""
    return list(_read(ec2, InstanceIds=list(instance_ids)))


def find(ec2: Any, instance_id: str) -> Instance | None:
    """The instance, whichever stack it is of (the caller checks), or None if EC2 does not know it."""
    if not is_instance_id(instance_id):
        return None  # EC2 would answer InvalidInstanceID.Malformed
    try:
        found = describe_ids(ec2, [instance_id])
    except ClientError as e:
        if error_code(e) in _UNKNOWN_ID:
            return None
        raise
    return found[0] if found else None


def live_hub_ids(ec2: Any, stack: str, run_id: str) -> list[str]:
    """The run's hub instances of the stack that are pending or running."""
    return sorted(i.id for i in describe(ec2, stack, run_id=run_id, role=ROLE_HUB) if i.live)


def console_output(ec2: Any, instance_id: str, *, latest: bool = False) -> str | None:
    """The instance's console output as GetConsoleOutput returns it (base64), or None if it has none yet.

    `latest` reads the live serial console (Nitro instances only); without it, EC2 returns what it buffered
    after the instance's last state change."""
    out = ec2.get_console_output(InstanceId=instance_id, **({"Latest": True} if latest else {}))
    return out.get("Output")


# --- writes ----------------------------------------------------------------------------------------------------
def run_instances(
    ec2: Any, *, stack: str, run_id: str, role: str, count: int, client_token: str, **params: Any
) -> list[str]:
    """Start 1 to `count` instances (RunInstances `params` besides the counts, token and tags), they and their
    volumes tagged with the stack, run and role; the ids of those started."""
    tags = instance_tags(stack, run_id, role)
    out = ec2.run_instances(
        MinCount=1,
        MaxCount=count,
        ClientToken=client_token,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}, {"ResourceType": "volume", "Tags": tags}],
        **params,
    )
    return [check_instance_id(i.get("InstanceId"), "instance id from RunInstances") for i in out.get("Instances", [])]


def run_hub(ec2: Any, template: str, stack: str, run_id: str, client_token: str) -> str:
    """A hub instance from the launch template (everything else is the template's)."""
    [iid] = run_instances(
        ec2,
        stack=stack,
        run_id=run_id,
        role=ROLE_HUB,
        count=1,
        client_token=client_token,
        LaunchTemplate={"LaunchTemplateName": template},
    )
    return iid


def tag_and_start(ec2: Any, instance_id: str, run_id: str) -> None:
    """Give a stopped hub of the stack the run to resume, then start it."""
    ec2.create_tags(
        Resources=[instance_id], Tags=[{"Key": TAG_RUN_ID, "Value": run_id}, {"Key": TAG_ROLE, "Value": ROLE_HUB}]
    )
    ec2.start_instances(InstanceIds=[instance_id])


def terminate(ec2: Any, instance_ids: Iterable[str]) -> None:
    """Terminate the instances, in batches of TERMINATE_BATCH. An id EC2 no longer knows does not stop the others:
    its batch is retried one id at a time, and the unknown ids are passed over. Any other error is raised."""
    ids = [check_instance_id(i) for i in dict.fromkeys(instance_ids)]
    for start in range(0, len(ids), TERMINATE_BATCH):
        batch = ids[start : start + TERMINATE_BATCH]
        try:
            ec2.terminate_instances(InstanceIds=batch)
        except ClientError as e:
            if error_code(e) != "InvalidInstanceID.NotFound":
                raise
            for iid in batch:
                try:
                    ec2.terminate_instances(InstanceIds=[iid])
                except ClientError as one:
                    if error_code(one) != "InvalidInstanceID.NotFound":
                        raise


def stop(ec2: Any, instance_ids: Iterable[str]) -> None:
    """Stop the instances (their volumes stay, and bill)."""
    ids = [check_instance_id(i) for i in instance_ids]
    if ids:
        ec2.stop_instances(InstanceIds=ids)
