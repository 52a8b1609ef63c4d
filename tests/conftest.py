"""Fixtures shared by every tier of the suite, and what keeps two runs of it on one machine apart."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

import pytest

#: The EC2 twin's networks a run of the suite may take (`GRIDFLEET_TWIN_NET`): 1 to 9. Network 0, the default,
#: is left to twins started by hand (`bench/boot.py`, the twin's own commands), which take no lock.
SUITE_TWIN_NETS = range(1, 10)
_TWIN_NET_LOCK = pytest.StashKey[int]()


def _claim_twin_net() -> tuple[int, int]:
    """The first twin network no other run of the suite on this machine holds, and the descriptor of the lock
    that holds it (an flock, released when this process ends, however it ends)."""
    for net in SUITE_TWIN_NETS:
        path = Path(tempfile.gettempdir()) / f"gridfleet-twin-net-{net}.lock"
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return net, fd
    nets = f"{SUITE_TWIN_NETS.start}-{SUITE_TWIN_NETS.stop - 1}"
    raise pytest.UsageError(f"every twin network ({nets}) is held by another run of the suite; set GRIDFLEET_TWIN_NET")


def pytest_configure(config: pytest.Config) -> None:
    """A run of the suite takes a twin network of its own, unless the caller named one: the twin tests remove
    what they find of their network's namespaces and bridge (a crashed run's), which would take down the twin
    of another run on the same network. The workers of a parallel run inherit the controller's choice (it is
    made before they start), and all twin tests of a run go to one worker (tests/twin/conftest.py)."""
    if "GRIDFLEET_TWIN_NET" in os.environ or os.environ.get("PYTEST_XDIST_WORKER") or os.geteuid() != 0:
        return  # named by the caller; inherited from the controller; or no twin (it needs root)
    net, fd = _claim_twin_net()
    config.stash[_TWIN_NET_LOCK] = fd  # kept open (so held) as long as this process runs
    os.environ["GRIDFLEET_TWIN_NET"] = str(net)


#: Under pytest-xdist, the order workers are handed tests in: the long ones first (the twin's group, then the
#: browser tests, then the rest), so that no worker starts a minutes-long test when the others are about to end.
FIRST_WHEN_PARALLEL = ("tests/twin/", "tests/e2e/", "examples/", "tests/infra/", "tests/faults/", "tests/adapter/")


def _rank(item: pytest.Item) -> int:
    where = Path(os.path.relpath(item.path, item.config.rootpath)).as_posix()
    return next((n for n, top in enumerate(FIRST_WHEN_PARALLEL) if where.startswith(top)), len(FIRST_WHEN_PARALLEL))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker of a parallel run, the long tests first (a stable sort: within a directory, collection order)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=_rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """With `--dist loadgroup` (`make test`), the groups of tests/helpers/parallel.py stay on one worker each."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.helpers.parallel import make_scheduler

    return make_scheduler(config, log)


@pytest.fixture(scope="session")
def moto_endpoint():
    """URL of an in-process moto server on 127.0.0.1 (any free port), up for the whole session. moto is imported
    here, not at the top: importing its server takes seconds, and most tests never ask for one."""
    from moto.server import ThreadedMotoServer

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
