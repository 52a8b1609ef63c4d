"""Nodes on EC2: one-time spot instances over several types and subnets, on-demand when spot runs out.

Launches never trust memory: `launch` re-reads EC2 by the run's tag and starts
only the difference to the target, so a hub that crashed mid-launch and came
back does not double the fleet (EC2's ClientToken helps on AWS; moto ignores
it, so the re-read is what counts). Capacity errors move on to the next
instance type / subnet, then to on-demand; any other error stops the launch and
is returned as data for the next plan, never raised.
"""

from __future__ import annotations

import builtins
import hashlib
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from botocore.exceptions import ClientError

from fleet.aws import ec2 as ec2_api
from fleet.aws.clients import error_code
from fleet.aws.ec2 import Instance
from fleet.config import Config
from fleet.record.tags import ALL_STATES
from hub.providers.base import LaunchResult

log = logging.getLogger("gridfleet.hub")

#: Errors that mean "not here, not now": try another type, subnet or market.
CAPACITY_ERRORS = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "Unsupported",
        "InsufficientFreeAddressesInSubnet",
        "SpotCapacityNotAvailable",
    }
)


class Ec2Provider:
    def __init__(self, ec2: Any, config: Config, *, ami: str, user_data: Callable[[str], str], role: str = "node"):
        self.ec2 = ec2
        self.config = config
        self.ami = ami
        self.user_data = user_data
        self.role = role
        self._rotation = itertools.count()

    # --- what runs ---------------------------------------------------------------
    def list(self, run_id: str) -> list[Instance]:
        """The run's instances of this role in this stack (`aws.stack`): another stack's are never seen."""
        return ec2_api.describe(self.ec2, self.config.aws.stack, run_id=run_id, role=self.role, states=ALL_STATES)

    # --- launch -----------------------------------------------------------------------
    def launch(self, run_id: str, count: int, target: int | None = None) -> LaunchResult:
        instances = self.list(run_id)
        live = sum(1 for i in instances if i.live)
        if target is not None:
            count = min(count, max(0, target - live))
        if count <= 0:
            return LaunchResult()
        fleet, aws = self.config.fleet, self.config.aws
        subnets: list[str | None] = [*aws.subnet_ids] or [None]
        start = next(self._rotation) % len(subnets)  # spread launches over the subnets (AZs)
        subnets = subnets[start:] + subnets[:start]
        markets = (["spot"] if fleet.spot else []) + (
            ["on-demand"] if (not fleet.spot or fleet.on_demand_fallback) else []
        )
        launched: list[str] = []
        errors: list[str] = []
        remaining = count
        for market, itype, subnet in ((m, t, s) for m in markets for t in fleet.instance_types for s in subnets):
            if remaining <= 0:
                break
            token = self._token(run_id, len(instances), market, itype, subnet)
            try:
                ids = self._run(run_id, remaining, market, itype, subnet, token)
            except ClientError as e:
                code = error_code(e) or "Error"
                errors.append(
                    f"{market} {itype} in {subnet or 'default subnet'}: {code}: "
                    f"{e.response.get('Error', {}).get('Message', '')}"
                )
                if code in CAPACITY_ERRORS:
                    continue
                break  # a configuration or permission error: other types will not fare better
            launched.extend(ids)
            remaining -= len(ids)
            log.info(
                "ec2-launch run_id=%s market=%s type=%s subnet=%s count=%d", run_id, market, itype, subnet, len(ids)
            )
        return LaunchResult(tuple(launched), tuple(errors))

    def _token(self, run_id: str, seen: int, market: str, itype: str, subnet: str | None) -> str:
        """Same launch after a crash -> same token (EC2 returns the earlier instances instead of new ones)."""
        raw = f"{self.config.aws.stack}|{run_id}|{self.role}|{seen}|{market}|{itype}|{subnet}"
        return "gf-" + hashlib.sha256(raw.encode()).hexdigest()[:48]

    def _run(
        self, run_id: str, count: int, market: str, itype: str, subnet: str | None, token: str
    ) -> builtins.list[str]:
        aws = self.config.aws
        kwargs: dict[str, Any] = {
            "InstanceType": itype,
            "UserData": self.user_data(run_id),
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
            "InstanceInitiatedShutdownBehavior": "terminate",
        }
        if aws.node_launch_template:
            kwargs["LaunchTemplate"] = {"LaunchTemplateName": aws.node_launch_template}
        else:
            kwargs["ImageId"] = self.ami
            if aws.instance_profile:
                kwargs["IamInstanceProfile"] = {"Name": aws.instance_profile}
            if aws.key_name:
                kwargs["KeyName"] = aws.key_name
        if subnet:
            kwargs["SubnetId"] = subnet
        if aws.security_group_ids:
            kwargs["SecurityGroupIds"] = list(aws.security_group_ids)
        if market == "spot":
            kwargs["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        return ec2_api.run_instances(
            self.ec2, stack=aws.stack, run_id=run_id, role=self.role, count=count, client_token=token, **kwargs
        )

    # --- terminate -------------------------------------------------------------------
    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Terminate the instances; one EC2 no longer knows does not stop the others (`fleet.aws.ec2.terminate`)."""
        ec2_api.terminate(self.ec2, instance_ids)

    def hub_alive(self, hub_id: str) -> bool:
        """Hub ids on EC2 are `ec2:<instance id>`: alive while that instance is pending or running."""
        if not hub_id.startswith("ec2:"):
            return False
        try:
            hub = ec2_api.find(self.ec2, hub_id[4:])
        except ClientError:
            return False
        return hub is not None and hub.live
