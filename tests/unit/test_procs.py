"""fleet.procs on real processes: detached spawns with markers, finding them again, killing whole trees."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

from fleet import procs
from tests.helpers.wait import wait_for

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def run_marker():
    """A run id of our own; every process a test starts carries it and is killed at teardown."""
    marker = "test-procs-" + uuid.uuid4().hex
    popens: list[subprocess.Popen] = []
    yield marker, popens
    procs.kill_tree(lambda ps: [p for p in ps if p.markers.get("GRIDFLEET_RUN") == marker], grace_s=0.5)
    for p in popens:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=5)


def spawn(run_marker, cmd, tmp_path, **markers):
    marker, popens = run_marker
    marks = {"GRIDFLEET_RUN": marker, **markers}
    p = procs.spawn(cmd, markers=marks, log_path=tmp_path / "logs" / "proc.log")
    popens.append(p)
    # Until the new process has exec'd, its environment (the mark) is its parent's: wait to see it (or its end).
    wait_for(lambda: p.poll() is not None or any(q.pid == p.pid and q.markers == marks for q in procs.scan()))
    return p


def tree_of(pid: int) -> set[int]:
    return procs.descendants(procs.scan(), [pid])


def all_dead(pids_with_ticks) -> bool:
    return not any(procs.pid_alive(pid, ticks) for pid, ticks in pids_with_ticks)


def with_ticks(pids):
    return [(pid, procs.start_ticks(pid)) for pid in pids]


# --- spawn and find -----------------------------------------------------------------------------


def test_spawn_sets_markers_and_find_returns_the_process(run_marker, tmp_path):
    marker, _ = run_marker
    p = spawn(run_marker, SLEEPER, tmp_path, GRIDFLEET_STACK="s-1", GRIDFLEET_INSTANCE="i-1", GRIDFLEET_ROLE="node")

    found = procs.find(procs.scan(), GRIDFLEET_RUN=marker)
    assert [f.pid for f in found] == [p.pid]
    assert found[0].markers == {
        "GRIDFLEET_RUN": marker,
        "GRIDFLEET_STACK": "s-1",
        "GRIDFLEET_INSTANCE": "i-1",
        "GRIDFLEET_ROLE": "node",
    }
    assert found[0].alive
    assert found[0].start_ticks == procs.start_ticks(p.pid)
    assert [f.pid for f in procs.find(procs.scan(), GRIDFLEET_RUN=marker, GRIDFLEET_INSTANCE="i-1")] == [p.pid]
    assert procs.find(procs.scan(), GRIDFLEET_RUN=marker, GRIDFLEET_INSTANCE="i-2") == []


def test_spawn_detaches_into_its_own_session(run_marker, tmp_path):
    p = spawn(run_marker, SLEEPER, tmp_path)
    assert os.getsid(p.pid) == p.pid
    assert os.getpgid(p.pid) == p.pid
    assert os.getsid(p.pid) != os.getsid(0)


def test_spawn_writes_stdout_and_stderr_to_the_log(run_marker, tmp_path):
    code = "import sys; print('to stdout', flush=True); print('to stderr', file=sys.stderr, flush=True)"
    p = spawn(run_marker, [sys.executable, "-c", code], tmp_path)
    assert p.wait(timeout=10) == 0
    log = (tmp_path / "logs" / "proc.log").read_text()
    assert "to stdout" in log
    assert "to stderr" in log


def test_spawn_appends_to_an_existing_log(run_marker, tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "proc.log").write_text("earlier line\n")
    p = spawn(run_marker, [sys.executable, "-c", "print('later line')"], tmp_path)
    p.wait(timeout=10)
    assert (tmp_path / "logs" / "proc.log").read_text().splitlines() == ["earlier line", "later line"]


def test_spawn_does_not_pass_on_markers_of_the_spawning_process(run_marker, tmp_path, monkeypatch):
    marker, _ = run_marker
    monkeypatch.setenv("GRIDFLEET_INSTANCE", "i-inherited")
    monkeypatch.setenv("GRIDFLEET_ROLE", "hub")
    p = spawn(run_marker, SLEEPER, tmp_path, GRIDFLEET_ROLE="node")

    found = wait_for(lambda: procs.find(procs.scan(), GRIDFLEET_RUN=marker))
    assert found[0].pid == p.pid
    assert found[0].markers == {"GRIDFLEET_RUN": marker, "GRIDFLEET_ROLE": "node"}


def test_spawn_passes_extra_env(run_marker, tmp_path):
    marker, popens = run_marker
    code = "import os; print(os.environ['GRIDFLEET_TEST_EXTRA'])"
    p = procs.spawn(
        [sys.executable, "-c", code],
        markers={"GRIDFLEET_RUN": marker},
        log_path=tmp_path / "extra.log",
        extra_env={"GRIDFLEET_TEST_EXTRA": "extra-value"},
    )
    popens.append(p)
    assert p.wait(timeout=10) == 0
    assert (tmp_path / "extra.log").read_text().strip() == "extra-value"


def test_children_inherit_markers(run_marker, tmp_path):
    marker, _ = run_marker
    root = spawn(run_marker, ["sh", "-c", "sleep 60 & wait"], tmp_path)
    found = wait_for(
        lambda: len(procs.find(procs.scan(), GRIDFLEET_RUN=marker)) == 2
        and procs.find(procs.scan(), GRIDFLEET_RUN=marker)
    )
    assert {f.pid for f in found} == tree_of(root.pid)


# --- kill_tree ----------------------------------------------------------------------------------


def test_kill_tree_kills_the_selected_root_with_all_its_children(run_marker, tmp_path):
    root = spawn(run_marker, ["sh", "-c", "sleep 60 & sleep 60 & wait"], tmp_path)
    tree = wait_for(lambda: len(tree_of(root.pid)) == 3 and tree_of(root.pid))
    targets = with_ticks(tree)

    started = time.monotonic()
    killed = procs.kill_tree(lambda ps: [p for p in ps if p.pid == root.pid], grace_s=10.0)

    assert killed == 3
    assert all_dead(targets)
    assert time.monotonic() - started < 5.0  # SIGTERM was enough; no need to wait for the grace


def test_kill_tree_kills_a_descendant_that_cleared_its_environment(run_marker, tmp_path):
    marker, _ = run_marker
    root = spawn(run_marker, ["sh", "-c", "env -i sleep 60 & wait"], tmp_path)
    tree = wait_for(lambda: len(tree_of(root.pid)) == 2 and tree_of(root.pid))
    (child,) = tree - {root.pid}
    # the child is not marked any more: only the parent is found by marker
    wait_for(
        lambda: procs.find(procs.scan(), GRIDFLEET_RUN=marker)
        and [p.pid for p in procs.find(procs.scan(), GRIDFLEET_RUN=marker)] == [root.pid]
    )
    assert {p.pid: p for p in procs.scan()}[child].markers == {}
    targets = with_ticks(tree)

    procs.kill_tree(lambda ps: procs.find(ps, GRIDFLEET_RUN=marker), grace_s=3.0)

    assert all_dead(targets)


def test_kill_tree_escalates_to_sigkill_after_the_grace(run_marker, tmp_path):
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    p = spawn(run_marker, [sys.executable, "-c", code], tmp_path)
    wait_for(lambda: "ready" in (tmp_path / "logs" / "proc.log").read_text())
    ticks = procs.start_ticks(p.pid)

    started = time.monotonic()
    killed = procs.kill_tree(lambda ps: [x for x in ps if x.pid == p.pid], grace_s=0.5)
    elapsed = time.monotonic() - started

    assert killed == 1
    assert not procs.pid_alive(p.pid, ticks)
    assert 0.5 <= elapsed < 5.0


def test_kill_tree_tries_sigterm_first(run_marker, tmp_path):
    # kill_tree reaps its own children, so the exit status is not reliable: the stand-in reports the signal
    code = (
        "import signal, sys, time\n"
        "def on_term(signum, frame):\n"
        "    print('got SIGTERM', flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    p = spawn(run_marker, [sys.executable, "-c", code], tmp_path)
    log = tmp_path / "logs" / "proc.log"
    wait_for(lambda: "ready" in log.read_text())
    ticks = procs.start_ticks(p.pid)

    started = time.monotonic()
    procs.kill_tree(lambda ps: [x for x in ps if x.pid == p.pid], grace_s=10.0)

    assert time.monotonic() - started < 5.0
    assert not procs.pid_alive(p.pid, ticks)
    assert "got SIGTERM" in log.read_text()


def test_kill_tree_sends_sigterm_before_it_escalates(run_marker, tmp_path):
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: print('got SIGTERM', flush=True))\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    time.sleep(0.01)\n"
    )
    p = spawn(run_marker, [sys.executable, "-c", code], tmp_path)
    log = tmp_path / "logs" / "proc.log"
    wait_for(lambda: "ready" in log.read_text())
    ticks = procs.start_ticks(p.pid)

    procs.kill_tree(lambda ps: [x for x in ps if x.pid == p.pid], grace_s=0.3)

    assert not procs.pid_alive(p.pid, ticks)
    assert "got SIGTERM" in log.read_text()


def test_kill_tree_with_nothing_selected_returns_zero(run_marker):
    marker, _ = run_marker
    assert procs.kill_tree(lambda ps: procs.find(ps, GRIDFLEET_RUN=marker), grace_s=0.1) == 0


def test_kill_tree_never_kills_the_calling_process():
    assert procs.kill_tree(lambda ps: [p for p in ps if p.pid == os.getpid()], grace_s=0.1) == 0


# --- descendants, pid_alive, start_ticks, scan -----------------------------------------------------


def _proc(pid, ppid):
    return procs.Proc(pid, ppid, "S", 0, {}, ())


def test_descendants_walks_the_whole_tree_from_the_roots():
    table = [_proc(10, 1), _proc(11, 10), _proc(12, 11), _proc(13, 10), _proc(20, 1), _proc(21, 20), _proc(30, 1)]
    assert procs.descendants(table, [10]) == {10, 11, 12, 13}
    assert procs.descendants(table, [11, 20]) == {11, 12, 20, 21}
    assert procs.descendants(table, []) == set()
    assert procs.descendants(table, [99]) == {99}


def test_descendants_survives_a_cycle_in_the_table():
    # the table is read process by process, so a reused pid can make it inconsistent
    assert procs.descendants([_proc(5, 6), _proc(6, 5)], [5]) == {5, 6}


def test_pid_alive_for_this_process():
    me = os.getpid()
    assert procs.pid_alive(me)
    assert procs.pid_alive(me, procs.start_ticks(me))


def test_pid_alive_is_false_for_different_start_ticks():
    me = os.getpid()
    assert not procs.pid_alive(me, procs.start_ticks(me) + 1)


def test_pid_alive_is_false_for_a_dead_pid(run_marker, tmp_path):
    p = spawn(run_marker, [sys.executable, "-c", "pass"], tmp_path)
    p.wait(timeout=10)
    assert not procs.pid_alive(p.pid)
    assert procs.start_ticks(p.pid) is None


def test_a_zombie_counts_as_dead(run_marker, tmp_path):
    marker, _ = run_marker
    p = spawn(run_marker, [sys.executable, "-c", "pass"], tmp_path)
    # not reaped: the exited child stays in the table as a zombie
    zombie = wait_for(lambda: next((x for x in procs.scan() if x.pid == p.pid and x.state == "Z"), None), 60)
    assert not zombie.alive
    assert not procs.pid_alive(p.pid)
    assert procs.find([zombie], GRIDFLEET_RUN=marker) == []
    assert procs.find(procs.scan(), GRIDFLEET_RUN=marker) == []


def test_find_skips_marked_processes_that_are_not_alive():
    marked = {"GRIDFLEET_RUN": "r-1"}
    table = [
        procs.Proc(1, 0, "S", 0, marked, ()),
        procs.Proc(2, 0, "Z", 0, marked, ()),
        procs.Proc(3, 0, "X", 0, marked, ()),
        procs.Proc(4, 0, "R", 0, {"GRIDFLEET_RUN": "r-2"}, ()),
    ]
    assert [p.pid for p in procs.find(table, GRIDFLEET_RUN="r-1")] == [1]
    assert [p.pid for p in procs.find(table)] == [1, 4]


def test_pid_alive_is_false_for_pids_that_never_existed():
    assert not procs.pid_alive(0)
    assert not procs.pid_alive(-1)
    assert not procs.pid_alive(2**31 - 1)


def test_scan_reads_cmdline_only_when_asked(run_marker, tmp_path):
    p = spawn(run_marker, SLEEPER, tmp_path)
    plain = {x.pid: x for x in procs.scan()}[p.pid]
    full = {x.pid: x for x in procs.scan(with_cmdline=True)}[p.pid]
    assert plain.cmdline == ()
    assert full.cmdline == tuple(SLEEPER)
    assert full.ppid == os.getpid()


# --- free_port ----------------------------------------------------------------------------------


def test_free_port_returns_the_preferred_port_when_it_is_free():
    port = procs.free_port()
    assert 0 < port < 65536
    assert procs.free_port(port) == port


def test_free_port_returns_another_port_when_the_preferred_one_is_taken():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        other = procs.free_port(port)
        assert other != port
        assert 0 < other < 65536
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", other))  # and it really is free
