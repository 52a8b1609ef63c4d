"""Fixtures shared by every tier of the suite."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from moto.server import ThreadedMotoServer


@pytest.fixture(scope="session")
def moto_endpoint():
    """URL of an in-process moto server on 127.0.0.1 (any free port), up for the whole session."""
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
