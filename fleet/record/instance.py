"""One instance as a compute provider reports it: the value the hub plans on and the Lambdas decide on.

EC2 instances come from `fleet.aws.ec2`, which fills every field from DescribeInstances; the local provider
and the simulator fill what they know (an id, a state, the role "node"). Nothing here loads boto3: the hub's
planning imports this module and must run without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fleet.record.tags import LIVE_STATES, ROLE_NODE, TAG_RUN_ID, TAG_STACK

#: States of an instance that is not running but still exists (and bills for its volumes).
STOPPED_STATES = ("stopping", "stopped")


@dataclass(frozen=True)
class Instance:
    id: str
    state: str  # pending | running | shutting-down | stopping | stopped | terminated
    role: str | None = ROLE_NODE  # its gridfleet:role tag (None: an instance without one, such as a NAT)
    tags: Mapping[str, str] = field(default_factory=dict)
    instance_type: str | None = None
    interrupted: bool = False  # EC2 reclaimed it (spot interruption)
    launched_at: float | None = None  # epoch seconds
    private_ip: str | None = None

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
    def stack(self) -> str | None:
        return self.tags.get(TAG_STACK)
