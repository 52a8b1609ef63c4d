"""LocalProvider on real processes: launch, list from registry and process table, terminate, hub liveness."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from fleet import procs
from fleet.clock import FakeClock
from hub.providers.base import LaunchResult
from hub.providers.local import LocalProvider, local_hub_id
from tests.helpers.wait import wait_for

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def sleeper(run_id, instance_id, instance_dir):
    return list(SLEEPER)


class Rig:
    """A stack of our own (unique stack id and run ids) in a temporary instances dir."""

    def __init__(self, tmp_path):
        self.dir = tmp_path / "instances"
        self.stack = "test-stack-" + uuid.uuid4().hex
        self.run = "run-" + uuid.uuid4().hex[:12]
        self.clock = FakeClock()
        self.providers: list[LocalProvider] = []
        self.popens: list[subprocess.Popen] = []

    def provider(self, node_command=sleeper, **kw) -> LocalProvider:
        p = LocalProvider(self.dir, self.stack, node_command, self.clock, **kw)
        self.providers.append(p)
        return p

    def states(self, provider: LocalProvider, run_id: str | None = None) -> dict[str, str]:
        return {i.id: i.state for i in provider.list(run_id or self.run)}

    def entry(self, instance_id: str, run_id: str | None = None) -> dict:
        return json.loads((self.dir / (run_id or self.run) / instance_id / "instance.json").read_text())

    def node_procs(self, instance_id: str | None = None):
        found = procs.find(procs.scan(), GRIDFLEET_STACK=self.stack)
        return [p for p in found if instance_id is None or p.markers.get("GRIDFLEET_INSTANCE") == instance_id]

    def spawn_marked(self, instance_id: str, log_path, **markers) -> subprocess.Popen:
        """A node process whose registry entry was never written (a hub crash between spawn and write)."""
        m = {
            "GRIDFLEET_STACK": self.stack,
            "GRIDFLEET_RUN": self.run,
            "GRIDFLEET_INSTANCE": instance_id,
            "GRIDFLEET_ROLE": "node",
        }
        m.update(markers)
        p = procs.spawn(SLEEPER, markers=m, log_path=log_path)
        self.popens.append(p)
        # Until the new process has exec'd, its environment (the mark) is its parent's: wait to see the mark.
        wait_for(lambda: any(q.pid == p.pid and q.markers == m for q in procs.scan()))
        return p

    def close(self):
        procs.kill_tree(lambda ps: [p for p in ps if p.markers.get("GRIDFLEET_STACK") == self.stack], grace_s=0.5)
        for provider in self.providers:
            provider.list(self.run)  # collects the provider's exited children
        for p in self.popens:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=5)


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path)
    yield r
    r.close()


# --- launch and list ----------------------------------------------------------------------------


def test_launch_starts_instances_that_are_listed_running(rig):
    provider = rig.provider()

    result = provider.launch(rig.run, 2)

    assert isinstance(result, LaunchResult)
    assert result.errors == ()
    assert len(result.launched) == 2
    assert len(set(result.launched)) == 2
    assert all(iid.startswith("i-local-") for iid in result.launched)
    assert rig.states(provider) == {iid: "running" for iid in result.launched}
    for inst in provider.list(rig.run):
        assert inst.role == "node"
        assert inst.tags == {"gridfleet:run_id": rig.run, "gridfleet:role": "node"}
        assert inst.live


def test_launch_writes_a_registry_entry_per_instance(rig):
    provider = rig.provider()
    launched = provider.launch(rig.run, 2).launched

    for iid in launched:
        e = rig.entry(iid)
        assert e["id"] == iid
        assert e["run_id"] == rig.run
        assert e["role"] == "node"
        assert e["state"] == "running"
        assert e["launched_at"] == rig.clock.now()
        (proc,) = rig.node_procs(iid)
        assert e["pid"] == proc.pid
        assert e["start_ticks"] == proc.start_ticks
        assert proc.markers == {
            "GRIDFLEET_STACK": rig.stack,
            "GRIDFLEET_RUN": rig.run,
            "GRIDFLEET_INSTANCE": iid,
            "GRIDFLEET_ROLE": "node",
        }
        assert not (rig.dir / rig.run / iid / "instance.json.tmp").exists()


def test_node_command_gets_the_run_the_instance_and_its_dir_and_logs_there(rig):
    calls = []

    def command(run_id, instance_id, instance_dir):
        calls.append((run_id, instance_id, instance_dir))
        return [sys.executable, "-c", f"print('node for {instance_id}', flush=True)"]

    provider = rig.provider(command)
    (iid,) = provider.launch(rig.run, 1).launched

    assert calls == [(rig.run, iid, rig.dir / rig.run / iid)]
    log = rig.dir / rig.run / iid / "node.log"
    wait_for(lambda: log.exists() and f"node for {iid}" in log.read_text())


def test_launch_passes_extra_env_to_the_node(rig):
    code = "import os; print('extra=' + os.environ.get('GRIDFLEET_TEST_EXTRA', '-'), flush=True)"
    provider = rig.provider(lambda r, i, d: [sys.executable, "-c", code], extra_env={"GRIDFLEET_TEST_EXTRA": "x1"})
    (iid,) = provider.launch(rig.run, 1).launched
    log = rig.dir / rig.run / iid / "node.log"
    wait_for(lambda: log.exists() and "extra=x1" in log.read_text())


def test_list_of_another_run_is_empty(rig):
    provider = rig.provider()
    provider.launch(rig.run, 2)
    assert provider.list("run-" + uuid.uuid4().hex[:12]) == []


def test_launch_of_zero_instances_does_nothing(rig):
    provider = rig.provider()
    assert provider.launch(rig.run, 0) == LaunchResult((), ())
    assert provider.list(rig.run) == []


# --- terminate ----------------------------------------------------------------------------------


def test_terminate_kills_one_instance_and_leaves_the_other_running(rig):
    provider = rig.provider()
    a, b = provider.launch(rig.run, 2).launched
    a_pid, a_ticks = rig.entry(a)["pid"], rig.entry(a)["start_ticks"]
    rig.clock.advance(42)

    provider.terminate([a])

    assert not procs.pid_alive(a_pid, a_ticks)
    assert rig.node_procs(a) == []
    assert len(rig.node_procs(b)) == 1
    assert rig.states(provider) == {a: "terminated", b: "running"}
    e = rig.entry(a)
    assert e["state"] == "terminated"
    assert e["terminated_at"] == rig.clock.now()
    assert rig.entry(b)["state"] == "running"


def test_terminate_kills_descendants_that_dropped_the_markers(rig):
    provider = rig.provider(lambda r, i, d: ["sh", "-c", "env -i sleep 60 & wait"])
    (iid,) = provider.launch(rig.run, 1).launched
    root = rig.entry(iid)["pid"]
    tree = wait_for(lambda: len(t := procs.descendants(procs.scan(), [root])) == 2 and t)
    targets = [(pid, procs.start_ticks(pid)) for pid in tree]

    provider.terminate([iid])

    assert not any(procs.pid_alive(pid, ticks) for pid, ticks in targets)
    assert rig.states(provider) == {iid: "terminated"}


def test_terminate_of_nothing_or_of_unknown_ids_is_harmless(rig):
    provider = rig.provider()
    (iid,) = provider.launch(rig.run, 1).launched
    provider.terminate([])
    provider.terminate(["i-local-unknown"])
    assert rig.states(provider) == {iid: "running"}
    assert not (rig.dir / "_unknown").exists()


def test_terminate_twice_keeps_the_first_termination_time(rig):
    provider = rig.provider()
    (iid,) = provider.launch(rig.run, 1).launched
    provider.terminate([iid])
    first = rig.entry(iid)["terminated_at"]
    rig.clock.advance(10)
    provider.terminate([iid])
    assert rig.entry(iid)["terminated_at"] == first
    assert rig.states(provider) == {iid: "terminated"}


def test_an_instance_that_exits_on_its_own_is_listed_terminated(rig):
    provider = rig.provider(lambda r, i, d: [sys.executable, "-c", "pass"])
    (iid,) = provider.launch(rig.run, 1).launched
    rig.clock.advance(5)

    wait_for(lambda: rig.states(provider) == {iid: "terminated"})

    e = rig.entry(iid)
    assert e["state"] == "terminated"
    assert e["terminated_at"] == rig.clock.now()


# --- registry and process table disagree --------------------------------------------------------


def test_a_marked_process_missing_from_the_registry_is_listed_and_can_be_terminated(rig, tmp_path):
    provider = rig.provider()
    (known,) = provider.launch(rig.run, 1).launched
    ghost = "i-local-" + uuid.uuid4().hex[:8]
    p = rig.spawn_marked(ghost, tmp_path / "ghost.log")
    ticks = procs.start_ticks(p.pid)

    listed = {i.id: i for i in provider.list(rig.run)}
    assert listed[ghost].state == "running"
    assert listed[ghost].tags["gridfleet:run_id"] == rig.run
    assert listed[known].state == "running"

    provider.terminate([ghost])

    assert not procs.pid_alive(p.pid, ticks)
    assert ghost not in rig.states(provider)
    assert rig.states(provider) == {known: "running"}


def test_marked_processes_of_another_stack_or_role_are_not_listed(rig, tmp_path):
    provider = rig.provider()
    rig.spawn_marked("i-local-other-stack", tmp_path / "a.log", GRIDFLEET_STACK=rig.stack + "-other")
    rig.spawn_marked("i-local-not-a-node", tmp_path / "b.log", GRIDFLEET_ROLE="hub")
    assert len(procs.find(procs.scan(), GRIDFLEET_RUN=rig.run)) == 2
    assert provider.list(rig.run) == []


def test_a_pending_entry_without_a_process_is_pending_while_young_then_terminated(rig):
    provider = rig.provider()
    iid = "i-local-pending"
    d = rig.dir / rig.run / iid
    d.mkdir(parents=True)
    (d / "instance.json").write_text(
        json.dumps(
            {
                "id": iid,
                "run_id": rig.run,
                "role": "node",
                "state": "pending",
                "launched_at": rig.clock.now(),
                "pid": None,
            }
        )
    )

    rig.clock.advance(10)
    assert rig.states(provider) == {iid: "pending"}
    assert rig.entry(iid)["state"] == "pending"

    rig.clock.advance(25)
    assert rig.states(provider) == {iid: "terminated"}
    assert rig.entry(iid)["state"] == "terminated"
    assert rig.entry(iid)["terminated_at"] == rig.clock.now()


def test_an_unreadable_registry_entry_is_skipped(rig):
    provider = rig.provider()
    (iid,) = provider.launch(rig.run, 1).launched
    broken = rig.dir / rig.run / "i-local-broken"
    broken.mkdir()
    (broken / "instance.json").write_text("{not json")
    (rig.dir / rig.run / "i-local-empty").mkdir()
    assert rig.states(provider) == {iid: "running"}


def test_a_restarted_hub_lists_what_the_first_one_launched(rig):
    first = rig.provider()
    launched = first.launch(rig.run, 2).launched

    second = rig.provider()

    assert rig.states(second) == {iid: "running" for iid in launched}
    second.terminate([launched[0]])
    assert rig.states(second) == {launched[0]: "terminated", launched[1]: "running"}
    assert rig.states(first) == {launched[0]: "terminated", launched[1]: "running"}


# --- failures -----------------------------------------------------------------------------------


def test_a_node_command_that_cannot_run_ends_in_errors_and_leaves_nothing_running(rig, tmp_path):
    missing = str(tmp_path / "no-such-node-binary")
    provider = rig.provider(lambda r, i, d: [missing, "node"])

    result = provider.launch(rig.run, 2)

    assert result.launched == ()
    assert len(result.errors) == 2
    assert all(e.startswith("i-local-") for e in result.errors)
    assert rig.node_procs() == []
    states = rig.states(provider)
    assert len(states) == 2
    assert set(states.values()) == {"terminated"}
    assert {e.split(":")[0] for e in result.errors} == set(states)
    assert not any(i.live for i in provider.list(rig.run))


# --- hub_alive ----------------------------------------------------------------------------------


def test_local_hub_id_names_this_process():
    kind, pid, ticks = local_hub_id().split(":")
    assert kind == "local"
    assert int(pid) == os.getpid()
    assert int(ticks) == procs.start_ticks(os.getpid())


def test_hub_alive_for_this_process(rig):
    assert rig.provider().hub_alive(local_hub_id())


def test_hub_alive_is_false_for_a_dead_hub(rig, tmp_path):
    provider = rig.provider()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    rig.popens.append(p)
    hub_id = f"local:{p.pid}:{procs.start_ticks(p.pid)}"
    assert provider.hub_alive(hub_id)
    p.kill()
    p.wait(timeout=5)
    assert not provider.hub_alive(hub_id)


def test_hub_alive_is_false_when_the_pid_was_reused(rig):
    me = os.getpid()
    assert not rig.provider().hub_alive(f"local:{me}:{procs.start_ticks(me) + 1}")


@pytest.mark.parametrize(
    "hub_id",
    [
        "",
        "local",
        f"local:{os.getpid()}",
        "local:1:2:3",
        f"ec2:{os.getpid()}:{procs.start_ticks(os.getpid())}",
        "i-0123456789abcdef0",
    ],
    ids=["empty", "kind-only", "no-ticks", "too-many-parts", "other-kind", "ec2-instance-id"],
)
def test_hub_alive_is_false_for_ids_of_the_wrong_shape(rig, hub_id):
    assert rig.provider().hub_alive(hub_id) is False


@pytest.mark.parametrize(
    "hub_id", ["local:abc:1", f"local:{os.getpid()}:None", "local::"], ids=["word-pid", "none-ticks", "empty-parts"]
)
def test_hub_alive_is_false_for_ids_with_non_numeric_parts(rig, hub_id):
    assert rig.provider().hub_alive(hub_id) is False


def test_a_just_spawned_instance_is_running_before_its_markers_show(rig):
    """Between fork and exec a child's /proc environ is still the parent's: the registry's pid must count."""
    p = subprocess.Popen(SLEEPER)  # alive, but carrying none of the instance's markers
    rig.popens.append(p)
    provider = rig.provider()
    provider._write(
        {
            "id": "i-local-fresh",
            "run_id": rig.run,
            "role": "node",
            "state": "running",
            "launched_at": 0.0,
            "pid": p.pid,
            "start_ticks": procs.start_ticks(p.pid),
        }
    )
    (inst,) = provider.list(rig.run)
    assert (inst.id, inst.state) == ("i-local-fresh", "running")
    p.kill()
    p.wait()
    assert provider.list(rig.run)[0].state == "terminated"
