"""SIGTERM to a hub: on AWS it is the hub's instance shutting down (systemd stops its service), so the hub ends
and leaves the fleet to the next hub; on the embedded default it ends the run as Ctrl-C does. Real signals, sent
to this process while the hub runs."""

from __future__ import annotations

import os
import signal

import pytest

from cli.commands.run import HubStopped, _drive


class _Executor:
    def __init__(self) -> None:
        self.teardowns: list[str] = []

    def teardown(self, why: str) -> None:
        self.teardowns.append(why)


class _Hub:
    """What `_drive` needs of a hub: a run that gets SIGTERM halfway, an executor, no dashboard."""

    def __init__(self) -> None:
        self.executor = _Executor()
        self.config = type("C", (), {"hub": type("H", (), {"http": False})()})()

    def run(self) -> None:
        try:  # as the hub's loop does: a broad except that logs and goes on
            os.kill(os.getpid(), signal.SIGTERM)
        except Exception:  # noqa: BLE001
            pass
        raise AssertionError("the hub went on after SIGTERM")


@pytest.fixture(autouse=True)
def _keep_sigterm():
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def test_on_aws_sigterm_ends_the_hub_and_leaves_the_nodes_to_the_next_one():
    hub = _Hub()
    with pytest.raises(HubStopped, match="the run's nodes go on"):
        _drive(hub, local=False)  # type: ignore[arg-type]
    assert hub.executor.teardowns == []  # no node terminated: the watchdog's next hub resumes the run


def test_on_the_embedded_default_sigterm_tears_the_run_down_as_ctrl_c_does():
    hub = _Hub()
    with pytest.raises(KeyboardInterrupt):
        _drive(hub, local=True)  # type: ignore[arg-type]
    assert hub.executor.teardowns == ["interrupted"]
