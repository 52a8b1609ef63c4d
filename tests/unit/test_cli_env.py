"""The one environment interface of the command line, and the run and rerun flows written once against it.

Both backends (the local stack, AWS) implement `cli.envs.base.Environment` member for member; `run` and `rerun` are
driven here through an in-memory environment that records what the flow asked of it, which is how each backend
sees the flow. Nothing here starts a stack, a hub or a node.
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from cli.commands import run as run_flow
from cli.envs.aws import AwsEnv
from cli.envs.base import Environment, RunHold
from cli.envs.choose import on_aws
from cli.envs.local import LocalEnv, stack_stops
from fleet.config import Config
from fleet.errors import UsageError
from fleet.record.partition import RunInfo
from fleet.record.state import RunState, RunStatus, SiteRecord, SiteSpec, SiteStatus
from sim.memory import MemoryQueue, MemoryResults, MemoryStateTable

RUN = "r1"
T0 = 1_763_700_000.0

#: Loads the command line, asks for its help and renders the hub's user-data (an AWS command that calls nothing),
#: then names every module of the embedded stack, the simulator or the node agent that came with it.
LOADED = """
import contextlib, io, sys
import cli.main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    cli.main.main(["--help"])
with contextlib.redirect_stdout(io.StringIO()):
    code = cli.main.main(["render", "hub", "--config", sys.argv[1]])
assert code == 0, code
print(sorted(m for m in sys.modules if m.split(".")[0] in ("embedded", "node")))
"""


def test_the_command_line_loads_neither_the_embedded_stack_nor_the_node_agent(tmp_path):
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "import cli.main, sys; assert not [m for m in sys.modules if m.startswith(('embedded', 'node'))]",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stderr
    config = tmp_path / "fleet.yaml"
    config.write_text("sites: [{id: a, start_url: 'http://a.test'}]\n")
    p = subprocess.run([sys.executable, "-c", LOADED, str(config)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def _members() -> dict[str, Any]:
    return {
        name: value
        for name, value in vars(Environment).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }


def _params(fn: Any) -> list[tuple[str, Any]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


def _config() -> Config:
    return Config.model_validate({"sites": [{"id": "a", "start_url": "https://a.test/"}]})


@pytest.mark.parametrize("backend", ["local", "aws"])
def test_each_environment_has_every_member_of_the_interface_with_the_same_signature(backend, tmp_path):
    from fleet.aws.clients import AwsClients

    config = _config()
    env = LocalEnv(config, home=tmp_path) if backend == "local" else AwsEnv(config, AwsClients(config.aws))
    members = _members()
    assert {
        "stores",
        "provider",
        "control",
        "save_run_config",
        "export_node_logs",
        "archive",
        "preflight",
        "hold",
        "rerun_hubs",
        "hand_over",
        "finish",
    } <= set(members)
    for name, member in members.items():
        found = inspect.getattr_static(env, name)  # not evaluated: the local stores exist only while it runs
        if callable(member):
            assert _params(getattr(env, name)) == _params(member)[1:], (backend, name)  # bound: no self
        else:
            assert found is not None or name == "demo_url", (backend, name)


def test_the_simulators_policies_are_the_ones_simulate_offers():
    from cli.commands.simulate import POLICIES as OFFERED
    from sim.run import POLICIES

    assert OFFERED == POLICIES


def test_config_without_local_is_aws_and_anything_else_the_local_stack():
    assert on_aws(argparse.Namespace(config="fleet.yaml", local=False))
    assert not on_aws(argparse.Namespace(config="fleet.yaml", local=True))
    assert not on_aws(argparse.Namespace(config=None, local=False))


@pytest.mark.parametrize(
    "started_here, adopted, ended, stops",
    [
        (True, False, False, True),  # a stack this command started goes with it, however the command ends
        (True, False, True, True),
        (False, True, True, True),  # a crashed hub's stack of this run, once the run reached an end here
        (False, True, False, False),  # ... and kept for the next --resume when the command failed on the way
        (False, False, True, False),  # anybody else's stack is never stopped by a run
        (False, False, False, False),
    ],
)
def test_who_stops_the_local_stack(started_here, adopted, ended, stops):
    assert stack_stops(started_here, adopted, ended) is stops


# --- the flows, through an environment that records what they ask -------------------------------------------
class Reached(Exception):
    """The flow got as far as the environment's step that raises it."""


class FakeEnv:
    """An Environment on in-memory stores; `calls` is what the flow asked of it, in order."""

    where = "in the fake"
    reads_archive = False
    demo_url = None

    def __init__(
        self,
        *,
        up: bool = True,
        export: dict[str, Any] | None = None,
        hubs: list[str] | None = None,
        takes_over: bool = True,
        alive: tuple[str, ...] = (),
    ) -> None:
        self.config = Config.model_validate(
            {"sites": [{"id": s, "start_url": f"https://{s}.test/"} for s in ("a", "b")]}
        )
        self.table, self.queue, self.results = MemoryStateTable(), MemoryQueue(), MemoryResults()
        self.calls: list[str] = []
        self.up, self.export, self.hubs, self.takes_over, self.alive = up, export, hubs or [], takes_over, alive
        self.holds: list[RunHold] = []
        self.next: FakeEnv | None = None

    def preflight(self) -> None:
        self.calls.append("preflight")

    def can_crawl(self) -> None:
        pass

    def dry_run(self, run_id: str, console: Console) -> int:
        self.calls.append("dry_run")
        return 0

    def latest_run(self) -> str | None:
        runs = self.table.list_runs()
        return runs[-1].run_id if runs else None

    def finished_export(self, run_id: str, out: Path) -> dict[str, Any] | None:
        return self.export

    def node_role(self) -> str:
        return "local"

    def stores_up(self) -> bool:
        return self.up

    @contextmanager
    def hold(self, run_id: str) -> Iterator[RunHold]:
        self.calls.append("hold")
        self.holds.append(RunHold())
        yield self.holds[-1]

    def provider(self, run_id: str, clock: Any) -> Any:
        return object()

    def hub_id(self) -> str:
        return "me"

    def hub_alive(self, hub_id: str) -> bool:
        return hub_id in self.alive

    def save_run_config(self, run_id: str) -> str:
        raise Reached("save_run_config")  # past every check: the hub would start now

    def rerun_hubs(self, run_id: str, run: RunInfo) -> list[str]:
        self.calls.append("rerun_hubs")
        return self.hubs

    def hand_over(self, run_id: str, hubs: list[str], console: Console) -> bool:
        self.calls.append(f"hand_over {hubs}")
        return self.takes_over

    def for_run(self) -> FakeEnv:
        assert self.next is not None
        return self.next

    # seeding
    def seed(self, status: RunState, *, hub_id: str | None = None, failed: tuple[str, ...] = ("b",)) -> None:
        self.table.create_run(
            RunInfo(
                RUN,
                status,
                T0,
                T0 + 3600,
                "20251121",
                hub_id=hub_id,
                finished_at=T0 + 60 if status is RunState.FINISHED else None,
            )
        )
        for s in ("a", "b"):
            st = RunStatus.FAILED if s in failed else RunStatus.COMPLETED
            self.table.create_site(
                SiteRecord(
                    RUN,
                    s,
                    SiteSpec(f"https://{s}.test/"),
                    run_status=st,
                    site_status=SiteStatus.FAILED if s in failed else SiteStatus.COMPLETED,
                    attempt=1,
                    failure_reason="error" if s in failed else None,
                )
            )


def run_args(tmp_path: Path, **kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"dry_run": False, "resume": False, "out": tmp_path / "runs", "full": False, **kw})


def console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200), out


def test_a_dry_run_asks_the_environment_for_its_plan_and_nothing_else(tmp_path):
    env = FakeEnv()
    assert run_flow.run(env, run_args(tmp_path, dry_run=True), RUN, console()[0]) == 0
    assert env.calls == ["dry_run"]


@pytest.mark.parametrize("failed, code", [(0, 0), (1, 3)])
def test_a_finished_run_its_stores_forgot_is_reported_from_its_export_without_holding_anything(tmp_path, failed, code):
    export = {"run_id": RUN, "finished_at": T0, "sites": {}, "counts": {"COMPLETED": 1 - failed, "FAILED": failed}}
    env = FakeEnv(up=False, export=export)
    c, out = console()
    assert run_flow.run(env, run_args(tmp_path, resume=True), RUN, c) == code
    assert env.calls == ["preflight"] and "had already finished; nothing to resume" in out.getvalue()
    with pytest.raises(UsageError, match="already finished"):
        run_flow.run(env, run_args(tmp_path), RUN, c)


def test_a_finished_run_the_stores_hold_is_exported_again_and_the_hold_told_the_run_ended(tmp_path):
    env = FakeEnv()
    env.seed(RunState.FINISHED)
    c, out = console()
    assert run_flow.run(env, run_args(tmp_path, resume=True), RUN, c) == 3
    assert env.calls == ["preflight", "hold"] and env.holds[0].ended
    assert json.loads((tmp_path / "runs" / RUN / "summary.json").read_text())["counts"]["FAILED"] == 1
    assert f"run {RUN} had already finished; summary:" in out.getvalue()


def test_an_existing_run_is_refused_without_resume_and_the_hold_is_not_told_it_ended(tmp_path):
    env = FakeEnv()
    env.seed(RunState.RUNNING)
    with pytest.raises(UsageError, match="already exists; pass --resume"):
        run_flow.run(env, run_args(tmp_path), RUN, console()[0])
    assert not env.holds[0].ended  # a stack adopted from a crashed hub of this run stays up


def test_a_run_held_by_a_live_hub_is_refused_and_one_held_by_a_dead_hub_or_by_this_one_is_resumed(tmp_path):
    env = FakeEnv(alive=("other",))
    env.seed(RunState.RUNNING, hub_id="other")
    with pytest.raises(UsageError, match=r"held by a hub that is still running \(other\)"):
        run_flow.run(env, run_args(tmp_path, resume=True), RUN, console()[0])
    for hub in ("gone", "me"):
        env = FakeEnv(alive=("other",))
        env.seed(RunState.RUNNING, hub_id=hub)
        with pytest.raises(Reached):
            run_flow.run(env, run_args(tmp_path, resume=True), RUN, console()[0])


def rerun_args(tmp_path: Path, **kw: Any) -> argparse.Namespace:
    return run_args(tmp_path, **{"sites": [], "failed": True, "force": False, "run_id": None, **kw})


def test_a_rerun_of_a_run_that_is_not_there_names_where_it_looked(tmp_path):
    with pytest.raises(UsageError, match=r"there is no run \(none yet\) in the fake"):
        run_flow.rerun(FakeEnv(), rerun_args(tmp_path), console()[0])
    with pytest.raises(UsageError, match="there is no run r9 in the fake"):
        run_flow.rerun(FakeEnv(), rerun_args(tmp_path, run_id="r9"), console()[0])


def test_a_rerun_that_a_hub_takes_over_reopens_the_sites_and_ends_here(tmp_path):
    env = FakeEnv(hubs=["ec2:i-hub"])
    env.seed(RunState.FINISHED)
    c, out = console()
    assert run_flow.rerun(env, rerun_args(tmp_path), c) == 0
    assert env.calls == ["rerun_hubs", "hand_over ['ec2:i-hub']"]
    assert env.table.get_site(RUN, "b").run_status is RunStatus.QUEUED
    assert env.table.get_run(RUN).status is RunState.RUNNING and env.table.get_run(RUN).reruns == 1
    assert f"run {RUN}: 1 site(s) queued again: b" in out.getvalue()


def test_a_rerun_nobody_takes_over_is_driven_here_as_run_resume(tmp_path):
    env = FakeEnv(takes_over=False)
    env.seed(RunState.FINISHED)
    env.next = FakeEnv()  # the environment as a run needs it: the same run, seen through it
    env.next.table = env.table
    with pytest.raises(Reached):
        run_flow.rerun(env, rerun_args(tmp_path, dry_run=True), console()[0])  # a rerun is never a dry run
    assert env.calls == ["rerun_hubs", "hand_over []"]
    assert env.next.calls == ["preflight", "hold"]  # resumed: the reopened run exists, and is not refused


def test_a_rerun_with_nothing_to_rerun_asks_for_no_hub(tmp_path):
    env = FakeEnv()
    env.seed(RunState.FINISHED, failed=())
    c, out = console()
    assert run_flow.rerun(env, rerun_args(tmp_path), c) == 0
    assert env.calls == [] and "nothing to rerun (no FAILED site)" in out.getvalue()


def test_a_rerun_that_no_hub_could_finish_is_refused_before_anything_is_reopened(tmp_path):
    env = FakeEnv()
    env.seed(RunState.FINISHED)

    def refuse(run_id: str, run: RunInfo) -> list[str]:
        raise UsageError("no hub")

    env.rerun_hubs = refuse  # type: ignore[method-assign]
    with pytest.raises(UsageError, match="no hub"):
        run_flow.rerun(env, rerun_args(tmp_path), console()[0])
    assert env.table.get_site(RUN, "b").run_status is RunStatus.FAILED
    assert env.table.get_run(RUN).status is RunState.FINISHED
