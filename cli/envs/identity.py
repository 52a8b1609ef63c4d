"""Who the hub is, and how its instance ends once the run is over.

On EC2 the hub is its instance (`ec2:<instance id>`, its private IPv4 is the Grid's address); off EC2 it is a
process on this host (`host:<name>:<pid>:<start ticks>`), which a later hub can tell alive or gone.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from typing import Any

from fleet import procs
from fleet.aws import ec2 as ec2_api
from fleet.aws.imds import Imds, ImdsError

EC2_IMDS = "http://169.254.169.254"


@dataclass(frozen=True)
class HubIdentity:
    hub_id: str  # ec2:<instance id> on EC2, host:<hostname>:<pid>:<start ticks> elsewhere
    address: str | None  # the private IPv4 nodes reach the Grid on
    instance_id: str | None
    real_ec2: bool = False  # the metadata came from EC2 itself, not from an emulator


def identify(imds_url: str) -> HubIdentity:
    try:
        imds = Imds(imds_url, timeout_s=1.0)
        iid = imds.instance_id()
        return HubIdentity(f"ec2:{iid}", imds.local_ipv4(), iid, imds_url.rstrip("/") == EC2_IMDS)
    except ImdsError:
        pid = os.getpid()
        return HubIdentity(f"host:{socket.gethostname()}:{pid}:{procs.start_ticks(pid)}", None, None)


def same_host_hub_alive(hub_id: str) -> bool:
    """For hubs run off EC2 (`host:<name>:<pid>:<ticks>`): alive if it is this host's live process."""
    parts = hub_id.split(":")
    if len(parts) != 4 or parts[0] != "host" or parts[1] != socket.gethostname():
        return False
    try:
        return procs.pid_alive(int(parts[2]), int(parts[3]))
    except ValueError:
        return False


def self_stop(how: str, identity: HubIdentity, ec2: Any) -> str:
    """What the hub instance does to itself once the run is over and no node is left."""
    if how == "none" or identity.instance_id is None:
        return "not stopping: " + ("hub_self_stop is none" if how == "none" else "not on EC2")
    if how == "terminate":
        ec2_api.terminate(ec2, [identity.instance_id])
        return f"terminating {identity.instance_id}"
    if not identity.real_ec2:  # never shut down a machine whose "instance" came from an emulator
        return f"not shutting down: instance metadata is not EC2's own ({identity.hub_id})"
    subprocess.run(["shutdown", "-h", "+1", "gridfleet: the run is over"], check=False)
    return "shutting down in one minute"
