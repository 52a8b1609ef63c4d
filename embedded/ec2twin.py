"""The EC2 twin's control: what moto says of a stack's instances, made true on this machine, and back.

moto answers EC2's API and runs nothing. One `sync()` pass of `Ec2Twin` compares moto's instances of the stack
with the instances it runs here: an instance moto has started (pending or running) and the twin does not run is
booted (`boot`, given its user-data, tags, address and metadata options); one that moto says is stopping,
stopped, shutting down or terminated (`StopInstances`, `TerminateInstances`) has its processes ended; and an
instance whose own `shutdown -h` the twin saw gets its `InstanceInitiatedShutdownBehavior` applied in moto
(stop or terminate) before its processes end, as EC2 does. A stopped instance that is started again boots
again. What boots an instance (its sandbox) is passed in, so this control is the same whatever runs it.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleet.aws.tags import TAG_ROLE, TAG_STACK, tags_of

log = logging.getLogger("gridfleet.twin")

LIVE = frozenset({"pending", "running"})
ENDING = frozenset({"stopping", "stopped", "shutting-down", "terminated"})


class Sandbox(Protocol):
    """An instance's processes on this machine."""

    @property
    def shutdown_requested(self) -> str | bool | None:
        """Whether (truthy) the instance ran `shutdown -h` / `poweroff` since it booted."""

    def stop(self) -> None:
        """End every process of the instance (idempotent)."""


@dataclass(frozen=True)
class InstanceSpec:
    """What a boot needs to know of the instance moto started."""

    instance_id: str
    user_data: str
    tags: dict[str, str]
    private_ip: str | None
    instance_type: str | None
    metadata_tags: bool  # instance metadata tags enabled: IMDS serves tags/instance/<key>
    shutdown_behavior: str  # "stop" or "terminate"
    instance_profile: str | None = None  # its name
    availability_zone: str | None = None
    image_id: str | None = None

    @property
    def role(self) -> str | None:
        return self.tags.get(TAG_ROLE)


def _profile_name(profile: dict[str, Any]) -> str | None:
    """The name of an instance profile given by name or ARN (`arn:aws:iam::<account>:instance-profile/<name>`)."""
    if profile.get("Name"):
        return str(profile["Name"])
    arn = str(profile.get("Arn") or "")
    return arn.rsplit("/", 1)[1] if "/" in arn else None


Boot = Callable[[InstanceSpec], Sandbox]


@dataclass
class Running:
    spec: InstanceSpec
    sandbox: Sandbox
    boots: int = 1


@dataclass
class Ec2Twin:
    ec2: Any
    boot: Boot
    stack: str | None = None  # only this stack's instances (gridfleet:stack); None: every instance
    running: dict[str, Running] = field(default_factory=dict)
    boots: dict[str, int] = field(default_factory=dict)

    def _instances(self) -> dict[str, dict[str, Any]]:
        filters = [{"Name": f"tag:{TAG_STACK}", "Values": [self.stack]}] if self.stack else []
        out: dict[str, dict[str, Any]] = {}
        for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page.get("Reservations", []):
                for instance in reservation.get("Instances", []):
                    out[instance["InstanceId"]] = instance
        return out

    def _spec(self, instance: dict[str, Any]) -> InstanceSpec:
        iid = instance["InstanceId"]
        raw = self.ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData").get("UserData") or {}
        user_data = base64.b64decode(raw["Value"]).decode() if raw.get("Value") else ""
        behavior = self.ec2.describe_instance_attribute(InstanceId=iid, Attribute="instanceInitiatedShutdownBehavior")
        tags = tags_of(instance)
        template = self._template_data(tags)
        shutdown = (behavior.get("InstanceInitiatedShutdownBehavior") or {}).get("Value") or "stop"
        metadata_tags = (instance.get("MetadataOptions") or {}).get("InstanceMetadataTags") or "disabled"
        # moto does not merge the launch template into the instance it starts (EC2 does): where the instance
        # shows moto's default, the template's value is the instance's
        if shutdown == "stop":
            shutdown = template.get("InstanceInitiatedShutdownBehavior") or shutdown
        profile = _profile_name(instance.get("IamInstanceProfile") or template.get("IamInstanceProfile") or {})
        if metadata_tags == "disabled":
            metadata_tags = (template.get("MetadataOptions") or {}).get("InstanceMetadataTags") or metadata_tags
        return InstanceSpec(
            instance_id=iid,
            user_data=user_data,
            tags={k: v for k, v in tags.items() if not k.startswith("aws:")},
            private_ip=instance.get("PrivateIpAddress"),
            instance_type=instance.get("InstanceType"),
            metadata_tags=metadata_tags == "enabled",
            shutdown_behavior=shutdown,
            instance_profile=profile,
            availability_zone=(instance.get("Placement") or {}).get("AvailabilityZone"),
            image_id=instance.get("ImageId"),
        )

    def _template_data(self, tags: dict[str, str]) -> dict[str, Any]:
        """The launch template version the instance was started from (EC2's own tags name it), or {}."""
        template_id = tags.get("aws:ec2launchtemplate:id")
        if not template_id:
            return {}
        version = tags.get("aws:ec2launchtemplate:version") or "$Default"
        out = self.ec2.describe_launch_template_versions(LaunchTemplateId=template_id, Versions=[version])
        versions = out.get("LaunchTemplateVersions") or [{}]
        return dict(versions[0].get("LaunchTemplateData") or {})

    def sync(self) -> list[str]:
        """One pass; returns what it did, one line each (`boot i-…`, `shutdown i-… -> terminate`, `end i-…`)."""
        done: list[str] = []
        instances = self._instances()
        ended: set[str] = set()
        for iid, run in list(self.running.items()):
            if run.sandbox.shutdown_requested:
                behavior = run.spec.shutdown_behavior
                if behavior == "terminate":
                    self.ec2.terminate_instances(InstanceIds=[iid])
                else:
                    self.ec2.stop_instances(InstanceIds=[iid])
                self._end(iid)
                ended.add(iid)  # moto saw it running when this pass began; it is not booted again now
                done.append(f"shutdown {iid} -> {behavior}")
                log.info("twin-shutdown instance=%s behavior=%s", iid, behavior)
            elif iid not in instances or instances[iid]["State"]["Name"] in ENDING:
                self._end(iid)
                done.append(f"end {iid}")
                log.info("twin-end instance=%s state=%s", iid, instances.get(iid, {}).get("State", {}).get("Name"))
        for iid, instance in sorted(instances.items()):
            if iid in self.running or iid in ended or instance["State"]["Name"] not in LIVE:
                continue
            spec = self._spec(instance)
            self.boots[iid] = self.boots.get(iid, 0) + 1
            self.running[iid] = Running(spec, self.boot(spec), self.boots[iid])
            done.append(f"boot {iid}")
            log.info("twin-boot instance=%s role=%s boot=%d", iid, spec.role, self.boots[iid])
        return done

    def _end(self, iid: str) -> None:
        run = self.running.pop(iid)
        run.sandbox.stop()

    def stop_all(self) -> None:
        for iid in list(self.running):
            self._end(iid)
