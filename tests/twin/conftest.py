"""Fixtures of the EC2 twin's tests: they create network namespaces and bind mounts, so they need root and
`ip netns`; elsewhere they are skipped with the reason."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest


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
    from embedded.twin import cleanup_leftovers

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
    from embedded.twin import InstanceSandbox

    made = []

    def make(instance_id, user_data, **kw):
        box = InstanceSandbox(instance_id, user_data, twin_root, **kw)
        made.append(box)
        return box.start()

    yield make
    for box in made:
        box.stop()
