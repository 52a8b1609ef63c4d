"""The node's rules (`fleet.protocol.NodeRules`) as a run's config sets them."""

from __future__ import annotations

from typing import Any

from fleet.config import Config
from fleet.outputs.checkpoint import SaveEvery
from fleet.protocol import NodeRules


def rule_fields(c: Config) -> dict[str, Any]:
    """The rules of a run's config, as keyword arguments (for NodeRules or a settings class built on it)."""
    return dict(
        max_attempts=c.run.max_attempts,
        spot_cap=c.run.spot_requeue_cap,
        hang_after_s=c.run.hang_after_s,
        # three beats fit in the hub's heartbeat timeout: one lost write does not make a node look dead
        heartbeat_interval_s=max(0.5, c.run.heartbeat_timeout_s / 3),
        visibility_s=max(30.0, c.run.heartbeat_timeout_s),
        idle_exit_s=c.fleet.idle_exit_s,
        sites_per_node=c.fleet.sites_per_node,
        browser_start_timeout_s=c.run.browser_start_timeout_s,
        node_watchdog=c.fleet.node_watchdog,
        receive_wait_s=min(5.0, c.fleet.idle_exit_s),
        retry=c.run.retry_policy,
        save_every=SaveEvery(c.run.checkpoint_pages, c.run.checkpoint_s),
    )


def rules_from_config(c: Config) -> NodeRules:
    return NodeRules(**rule_fields(c))
