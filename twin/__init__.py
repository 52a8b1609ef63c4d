"""The EC2 twin: a real boot of an instance's user-data on this machine, in its own namespaces (root only).

`cloud_config` reads a ``#cloud-config`` document into a plan, `guest` carries the plan out inside the
instance, `network` owns the bridge and the instances' network namespaces, `imds` serves each instance's
metadata inside its namespace, and `sandbox.InstanceSandbox` puts them together for one instance.
"""

from twin.cloud_config import TwinError, plan_user_data
from twin.sandbox import BootResult, InstanceSandbox, cleanup_leftovers

__all__ = ["BootResult", "InstanceSandbox", "TwinError", "cleanup_leftovers", "plan_user_data"]
