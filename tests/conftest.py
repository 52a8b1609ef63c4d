"""Fixtures shared by every tier of the suite, and what keeps two runs of it on one machine apart."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers import parallel

_TWIN_NET_LOCK = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    """Each process that runs tests takes a twin network of its own, unless the caller named one (see
    tests/helpers/parallel.py). Without root there is no twin, so nothing to take."""
    if "GRIDFLEET_TWIN_NET" in os.environ or os.geteuid() != 0 or not parallel.runs_tests(config):
        return
    net, fd = parallel.claim_twin_net()
    config.stash[_TWIN_NET_LOCK] = fd  # kept open (so held) as long as this process runs
    os.environ["GRIDFLEET_TWIN_NET"] = str(net)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker of a parallel run, the long tests first (a stable sort: within a directory, collection order)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: parallel.rank(Path(os.path.relpath(item.path, config.rootpath)).as_posix()))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """With `--dist loadgroup` (`make test`), the groups of tests/helpers/parallel.py stay on one worker each."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return parallel.make_scheduler(config, log)


@pytest.fixture(autouse=True)
def _unreadable_logged_afresh():
    """What could not be read is logged once per process (`fleet.record.readback`): each test sees its own lines."""
    from fleet.record import readback

    readback.forget()


@pytest.fixture(scope="session")
def moto_endpoint():
    """URL of an in-process moto server on 127.0.0.1 (any free port), up for the whole session. moto is imported
    here, not at the top: importing its server takes seconds, and most tests never ask for one."""
    from moto.server import ThreadedMotoServer

    from embedded.moto_server import make_dynamodb_writes_atomic

    make_dynamodb_writes_atomic()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def open_dir():
    """A directory other users can traverse (pytest's tmp_path lies under one only its owner may enter): for
    what the crawl user, whom a root run's Grid node and Chromium run as, must reach."""
    d = Path(tempfile.mkdtemp(prefix="gridfleet-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)
