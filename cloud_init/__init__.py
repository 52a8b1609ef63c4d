"""Cloud-init user-data for gridfleet's hub and node instances on AWS, rendered by pure functions."""

from cloud_init.render import (
    USER_DATA_LIMIT,
    HubUserData,
    NodeUserData,
    RenderError,
    boot_script,
    environment,
    render_bake,
    render_hub,
    render_node,
)

__all__ = [
    "USER_DATA_LIMIT",
    "HubUserData",
    "NodeUserData",
    "RenderError",
    "boot_script",
    "environment",
    "render_bake",
    "render_hub",
    "render_node",
]
