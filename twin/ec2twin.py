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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleet.record.tags import TAG_ROLE, TAG_STACK, tags_of

log = logging.getLogger("gridfleet.twin")

LIVE = frozenset({"pending", "running"})
ENDING = frozenset({"stopping", "stopped", "shutting-down", "terminated"})


class Sandbox(Protocol):
    """An instance's processes on this machine."""

    @property
    def shutdown_requested(self) -> str | bool | None:
        """Whether (truthy) the instance ran `shutdown -h` / `poweroff` since it booted."""

    def shutdown_delay_s(self) -> float | None:
        """How long after it was asked the instance's shutdown takes (`shutdown -h +1`: a minute), or None."""

    def stop(self, grace_s: float = 0.0) -> None:
        """End every process of the instance (idempotent), after a SIGTERM and up to `grace_s` for them."""

    def processes(self) -> list[int]:
        """The pids (on this machine) of every process of the instance."""


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
    security_groups: tuple[str, ...] = ()  # the ids of the groups it was launched in

    @property
    def role(self) -> str | None:
        return self.tags.get(TAG_ROLE)


def _groups(instance: dict[str, Any], template: dict[str, Any]) -> tuple[str, ...]:
    """The security groups an instance was launched in. moto starts an instance of a template whose network
    interface names the subnet and groups (the hub's) in its default VPC's default group; EC2 launches it with
    the interface's groups (a call may not name groups beside a template's interface)."""
    nics: list[dict[str, Any]] = template.get("NetworkInterfaces") or []
    named = [g for n in nics if int(n.get("DeviceIndex", 0)) == 0 for g in n.get("Groups") or []]
    if named:
        return tuple(str(g) for g in named)
    # an instance launched without groups is in its VPC's default group: moto says so on its interface only
    own: list[dict[str, Any]] = instance.get("SecurityGroups") or []
    for nic in (instance.get("NetworkInterfaces") or [])[:1]:
        own = own or nic.get("Groups") or []
    return tuple(str(g["GroupId"]) for g in own)


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
    stop_grace_s: float = 0.0  # an instance that shuts down or is stopped or terminated: its processes' SIGTERM grace
    journal: list[str] | None = None  # where each line of `sync` also goes, as it happens (a pass may take a while)
    now: Callable[[], float] = time.time  # the clock a shutdown's delay runs on (the twin's)
    running: dict[str, Running] = field(default_factory=dict)
    shutdowns: dict[str, float] = field(default_factory=dict)  # instance id -> when its asked shutdown is due
    _requests: dict[str, int] = field(default_factory=dict)  # instance id -> shutdown requests seen
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
            security_groups=_groups(instance, template),
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
            if self._shutdown_due(iid, run.sandbox):
                behavior = run.spec.shutdown_behavior
                if behavior == "terminate":
                    self.ec2.terminate_instances(InstanceIds=[iid])
                else:
                    self.ec2.stop_instances(InstanceIds=[iid])
                self._note(done, f"shutdown {iid} -> {behavior}")  # said first: its processes may take a while
                log.info("twin-shutdown instance=%s behavior=%s", iid, behavior)
                self._end(iid)
                ended.add(iid)  # moto saw it running when this pass began; it is not booted again now
            elif iid not in instances or instances[iid]["State"]["Name"] in ENDING:
                self._note(done, f"end {iid}")
                log.info("twin-end instance=%s state=%s", iid, instances.get(iid, {}).get("State", {}).get("Name"))
                self._end(iid)
        for iid, instance in sorted(instances.items()):
            if iid in self.running or iid in ended or instance["State"]["Name"] not in LIVE:
                continue
            spec = self._spec(instance)
            self.boots[iid] = self.boots.get(iid, 0) + 1
            self.running[iid] = Running(spec, self.boot(spec), self.boots[iid])
            self._note(done, f"boot {iid}")
            log.info("twin-boot instance=%s role=%s boot=%d", iid, spec.role, self.boots[iid])
        return done

    def _shutdown_due(self, iid: str, sandbox: Sandbox) -> bool:
        """Whether the instance's own shutdown is due: it asked for one, and its delay (from when the twin saw the
        request, on the twin's clock) has passed. A later request moves it as systemd's would (`shutdown -h now`
        after a pending `+1`: now; `shutdown -c`: cancelled)."""
        said = sandbox.shutdown_requested
        if not said:
            self.shutdowns.pop(iid, None)
            return False
        now, requests = self.now(), said.count("\n") if isinstance(said, str) else 1
        if self._requests.get(iid) != requests:  # a new request: its delay counts from now
            self._requests[iid] = requests
            delay = sandbox.shutdown_delay_s()
            if delay is None:
                self.shutdowns.pop(iid, None)
            else:
                self.shutdowns[iid] = min(self.shutdowns.get(iid, now + delay), now + delay)
        return iid in self.shutdowns and now >= self.shutdowns[iid]

    def _note(self, done: list[str], line: str) -> None:
        done.append(line)
        if self.journal is not None:
            self.journal.append(line)

    def _end(self, iid: str) -> None:
        run = self.running[iid]
        run.sandbox.stop(grace_s=self.stop_grace_s)  # as EC2 shuts an instance's OS down: its services flush
        del self.running[iid]  # once it is down: until then it still runs here
        self.shutdowns.pop(iid, None)
        self._requests.pop(iid, None)

    def stop_all(self) -> None:
        for iid in list(self.running):
            self._end(iid)
