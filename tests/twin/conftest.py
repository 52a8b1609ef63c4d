"""Fixtures of the EC2 twin's tests: they create network namespaces and bind mounts, so they need root and
`ip netns`; elsewhere they are skipped with the reason."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test of this directory is marked `twin` (`make test-fast` leaves them out). The hook sees every item
    of the run; only those under this directory are marked. (How twin tests run in parallel, each process on a
    twin network of its own: tests/helpers/parallel.py.)"""
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.twin)


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "the EC2 twin needs root (network and mount namespaces)"
    for tool in ("ip", "unshare", "nsenter", "curl"):
        if shutil.which(tool) is None:
            return f"the EC2 twin needs {tool}"
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if out.returncode != 0:
        return f"`ip netns` is not available: {out.stderr.strip()}"
    return None


@pytest.fixture(scope="session")
def twin_ok():
    why = _why_not()
    if why:
        pytest.skip(why)
    from twin.instance.sandbox import cleanup_leftovers

    cleanup_leftovers()  # a crashed earlier run's namespaces, veths and bridge
    yield
    cleanup_leftovers()


@pytest.fixture
def twin_root(twin_ok):
    """The twin's directory: the instances' private directories and the shared EFS directory."""
    d = Path(tempfile.mkdtemp(prefix="gridfleet-twin-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def sandboxes(twin_root):
    """Make sandboxes with `make(instance_id, user_data, **kw)`; each is stopped at the end of the test."""
    from twin.instance.sandbox import InstanceSandbox

    made = []

    def make(instance_id, user_data, **kw):
        box = InstanceSandbox(instance_id, user_data, twin_root, **kw)
        made.append(box)
        return box.start()

    yield make
    for box in made:
        box.stop()


#: The stack the day and the week share (one deployment: the Terraform apply and the bundle are made once).
DAY_FLEET = {
    "run": {"deadline_s": 600, "watch_interval_s": 2, "hang_after_s": 8, "max_attempts": 3, "heartbeat_timeout_s": 600},
    "fleet": {"max_nodes": 2, "min_nodes": 2, "node_watchdog": False, "idle_exit_s": 15, "boot_timeout_s": 300},
    "aws": {"ssm_timeout_s": 30},
}
DAY_SITES = {
    "plain": "/s/plain/?pages=2",
    "hang": "/s/hang/?pages=2&hang_page=1&hang_attempts=1",
    "spot": "/s/spot/?pages=6&delay_s=1.5",
}


@pytest.fixture(scope="session")
def twin_stack(twin_ok, tmp_path_factory):
    """A stack deployed on the twin (stack `gftwin`, the day's sites), its schedules firing, the watchdog's
    `hub_stale_s` 90 s; every instance runs sshd for the key `ssh_private_key`. Its nodes boot a node image baked
    for it (infra/packer's bake script), its hubs the stock image, so both boot paths run (the week then boots
    its hubs from the baked one)."""
    from twin.day import TwinDay

    root = tmp_path_factory.mktemp("twin-stack")
    # the twin's thread logs as long as the tests run, also after the capture of the test that made a log handler closed
    logging.raiseExceptions = False
    # 90 s: a stock image's hub installs the bundle and starts its Grid before it writes its run item, which a busy
    # machine stretches past 30 s; the watchdog ends an instance whose run has no item after hub_stale_s
    variables = {"hub_stale_s": 90}
    with TwinDay(root, "gftwin", DAY_FLEET, DAY_SITES, variables=variables, ssh_user="admin", node_image=True) as d:
        yield d
