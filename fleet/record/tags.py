"""The tags gridfleet puts on every instance it starts, and the filters that find them again.

An instance belongs to a stack (`gridfleet:stack`, the stack's name: Terraform's
name_prefix, fleet.yaml's `aws.stack`), a run (`gridfleet:run_id`) and a role
(`gridfleet:role`: hub or node). Every listing, adoption and termination selects
by the stack first, so two stacks in one account and region never touch each
other's instances; the IAM policies that may terminate or stop instances carry a
condition on the same tag. A site's EFS access point carries the stack's tag and
its site's (`gridfleet:site`): the hub and the nodes find it by the two.
"""

from __future__ import annotations

from typing import Any

TAG_STACK = "gridfleet:stack"
TAG_RUN_ID = "gridfleet:run_id"
TAG_ROLE = "gridfleet:role"
TAG_SITE = "gridfleet:site"
ROLE_HUB = "hub"
ROLE_NODE = "node"

#: EC2 instance states in which an instance runs (and bills for compute).
LIVE_STATES = ("pending", "running")
#: Every state EC2 still reports.
ALL_STATES = ("pending", "running", "shutting-down", "stopping", "stopped", "terminated")


def instance_tags(stack: str, run_id: str, role: str) -> list[dict[str, str]]:
    """The tags of an instance gridfleet starts (also its volumes')."""
    return [
        {"Key": TAG_STACK, "Value": stack},
        {"Key": TAG_RUN_ID, "Value": run_id},
        {"Key": TAG_ROLE, "Value": role},
        {"Key": "Name", "Value": f"{stack}-{role}-{run_id}"},
    ]


def site_tags(stack: str, site: str) -> list[dict[str, str]]:
    """The tags of a site's EFS access point."""
    return [{"Key": TAG_STACK, "Value": stack}, {"Key": TAG_SITE, "Value": site}]


def filters(
    stack: str, *, run_id: str | None = None, role: str | None = None, states: tuple[str, ...] | None = None
) -> list[dict[str, Any]]:
    """DescribeInstances filters for the stack's instances, narrowed by run, role and state."""
    out: list[dict[str, Any]] = [{"Name": f"tag:{TAG_STACK}", "Values": [stack]}]
    if run_id is not None:
        out.append({"Name": f"tag:{TAG_RUN_ID}", "Values": [run_id]})
    if role is not None:
        out.append({"Name": f"tag:{TAG_ROLE}", "Values": [role]})
    if states is not None:
        out.append({"Name": "instance-state-name", "Values": list(states)})
    return out


def tags_of(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
