"""The real user-data of a node and of the hub, rendered by `cloud_init` and booted in the twin as far as this
machine lets them go: each reads its instance's metadata inside the instance, reaches the step that installs
packages, and, when it stops (no AWS endpoint is wired to the instance yet), reports the failed step and
powers off through the twin's `shutdown`. Root only (see conftest)."""

from __future__ import annotations

import base64
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from cloud_init import HubUserData, NodeUserData, render_hub, render_node
from cloud_init.render import HUB_BOOT_SCRIPT, NODE_BOOT_SCRIPT, NODE_ENV_FILE
from tests.helpers.wait import wait_for

COMMON = dict(region="ap-northeast-2", bucket="gridfleet-artifacts", bundle_key="bundle/gridfleet-bundle.tar.gz")


@pytest.fixture(scope="module")
def booted(twin_ok):
    """A node and the hub, booted side by side (each spends about 40 s on the script's apt-get retries)."""
    from embedded.twin import InstanceSandbox

    root = Path(tempfile.mkdtemp(prefix="gridfleet-twin-"))
    node = InstanceSandbox(
        "i-0000000000000a101",
        render_node(
            NodeUserData(
                run_id="twin-run-1",
                config_key="runs/twin-run-1/fleet.yaml",
                efs_id="fs-0123456789abcdef0",
                hub_address="10.77.0.1",
                boot_timeout_s=60,
                **COMMON,
            )
        ),
        root,
    )
    hub = InstanceSandbox(
        "i-0000000000000a102",
        render_hub(HubUserData(hub_config_key="config/fleet.yaml", **COMMON)),
        root,
        tags={"gridfleet:run_id": "twin-run-2"},
    )
    try:
        yield node.start(), hub.start()
    finally:
        node.stop()
        hub.stop()
        shutil.rmtree(root, ignore_errors=True)


def steps(log: str) -> list[str]:
    return re.findall(r"gridfleet: step: (\S+)", log)


def test_a_rendered_node_boots_its_real_script_up_to_the_packages(booted):
    box = booted[0]
    result = box.wait_boot(120)
    log = (box.var_log / "gridfleet-boot.log").read_text()
    assert steps(log)[:2] == ["imds", "install-packages"], log
    assert f"instance {box.instance_id}, private IP {box.address}" in log
    assert result.exit_code != 0 and "node bootstrap failed at" in log  # nothing past the packages is wired yet
    assert box.console.read_text() == log  # the script's console output stays the instance's
    rendered = next(f for f in box.plan["write_files"] if f["path"] == NODE_BOOT_SCRIPT)
    assert box.host_path(NODE_BOOT_SCRIPT).read_bytes() == base64.b64decode(rendered["data_b64"])
    assert "GRIDFLEET_RUN_ID=twin-run-1" in box.host_path(NODE_ENV_FILE).read_text()
    assert not Path(NODE_BOOT_SCRIPT).exists() and not Path(NODE_ENV_FILE).exists()
    assert box.shutdown_requested.split()[1:] == ["shutdown", "-h", "now"]


def test_a_rendered_hub_starts_through_systemctl_and_reads_its_run_id_tag(booted):
    box = booted[1]
    assert box.wait_boot(30).exit_code == 0  # systemctl enable --now --no-block: the unit runs on
    wait_for(lambda: box.shutdown_requested, timeout=120)
    log = (box.var_log / "gridfleet-boot.log").read_text()
    assert steps(log)[:3] == ["imds", "run-id", "install-packages"], log
    assert "run id twin-run-2, from the instance tag gridfleet:run_id" in log
    assert "self_stop=shutdown: shutting down" in log
    assert box.host_path(HUB_BOOT_SCRIPT).exists() and not Path(HUB_BOOT_SCRIPT).exists()
