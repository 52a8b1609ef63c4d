"""The local stack starts although another program takes a port between the stack's choice of it and its
component's listening on it; and a component that ends while starting is said with the reason its log gives.

The race itself is injected at one seam: the port chooser hands the Grid a port this test already listens on
(no timing can make another program bind it in that window on demand). The Grid hub that meets it is real Java,
and fails as it would: `BindException`."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cli.envs.grid_jar import find_grid_jar, grid_jar_candidates
from embedded import stack as stack_mod
from embedded.stack import PREFERRED_PORTS, START_TRIES, LocalStack, exit_cause
from fleet import procs
from fleet.errors import StackError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def held_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def racing_chooser(monkeypatch, taken: int, times: int) -> list[int | None]:
    """Make the first `times` choices of the Grid's port answer `taken`; returns what was asked."""
    real = procs.free_port
    asked: list[int | None] = []

    grid = list(PREFERRED_PORTS).index("grid")  # ports are chosen in this order, one round per start

    def choose(preferred: int | None = None, host: str = "127.0.0.1") -> int:
        n = len(asked)
        asked.append(preferred)
        if n % len(PREFERRED_PORTS) == grid and n // len(PREFERRED_PORTS) < times:
            return taken
        return real(preferred, host)

    monkeypatch.setattr(procs, "free_port", choose)
    return asked


@pytest.mark.e2e
def test_a_port_taken_between_choice_and_listen_is_said_and_the_stack_starts_on_others(
    tmp_path, monkeypatch, held_port
):
    asked = racing_chooser(monkeypatch, held_port, times=1)
    said: list[str] = []
    s = LocalStack(tmp_path / "home", grid_jar=find_grid_jar(grid_jar_candidates(ROOT)), progress=said.append)
    try:
        st = s.up()
        assert s.running() is not None
        assert st.components["grid"].url != f"http://127.0.0.1:{held_port}"
    finally:
        s.down(quiet=True)
    again = [line for line in said if "starting again on other ports" in line]
    assert len(again) == 1, said
    assert again[0].startswith("grid exited while starting (") and "Address already in use" in again[0]
    n = len(PREFERRED_PORTS)
    assert asked[:n] == list(PREFERRED_PORTS.values()) and asked[n:] == [None] * n  # then wherever there is room


@pytest.mark.e2e
def test_a_port_taken_on_every_try_ends_in_one_line_and_leaves_nothing_running(tmp_path, monkeypatch, held_port):
    racing_chooser(monkeypatch, held_port, times=START_TRIES)
    s = LocalStack(tmp_path / "home", grid_jar=find_grid_jar(grid_jar_candidates(ROOT)))
    with pytest.raises(StackError) as e:
        s.up()
    line = str(e.value)
    assert "\n" not in line and line.startswith("grid exited while starting (")
    assert f"(tried {START_TRIES} times)" in line
    assert not procs.find(procs.scan(), GRIDFLEET_STACK=s.stack_id)
    assert not s.state_file.exists()


def test_the_cause_is_the_innermost_error_a_log_names(tmp_path):
    java = tmp_path / "grid.log"
    java.write_text(
        "12:00:00.000 INFO [Hub] - Event bus ready\n"
        "12:00:01.000 ERROR [Bootstrap.runMain] - Error during execution\n"
        "java.lang.reflect.InvocationTargetException\n"
        "\tat java.base/java.lang.reflect.Method.invoke(Method.java:569)\n"
        "Caused by: java.net.BindException: Address already in use\n"
        "\t... 6 more\n"
        "\tSuppressed: java.util.concurrent.CompletionException: Rethrowing promise failure cause\n"
    )
    assert exit_cause(java) == "Caused by: java.net.BindException: Address already in use"
    py = tmp_path / "demo.log"
    py.write_text('Traceback (most recent call last):\n  File "x.py", line 1\nOSError: [Errno 98] Address in use\n')
    assert exit_cause(py) == "OSError: [Errno 98] Address in use"
    plain = tmp_path / "moto.log"
    plain.write_text("starting\n\nkilled\n")
    assert exit_cause(plain) == "killed"
    assert exit_cause(tmp_path / "none.log") == ""
    assert stack_mod.PortTaken.__mro__[1] is StackError
