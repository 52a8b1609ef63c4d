"""The executor performs what the plan chose, one bounded pass per action, and reports what happened as data."""

import dataclasses
import inspect
import typing

import pytest

from fleet.record import ops
from fleet.record.state import Reason, RunStatus, SiteStatus
from hub import actions
from hub.actions import Action, Drain, FailSites, Finish, KillAttempt, KillLadder, Launch, StartRun
from hub.end_executor import EndExecutor
from hub.executor import Executor, kill_path
from hub.providers.base import LaunchResult
from tests.unit.test_hub_loop import RUN, Rig


def started(tmp_path):
    """A run seeded on two nodes, s0's attempt 1 running on i-1; the hub that did it."""
    rig = Rig(tmp_path)
    hub = rig.hub()
    hub.tick()
    rec, _ = rig.node_takes()
    return rig, hub, rec


@pytest.mark.parametrize(
    "ladder, reachable, path, terminated",
    [
        (KillLadder.FALLBACK, True, "local", False),
        (KillLadder.FALLBACK, False, "terminate", True),
        (KillLadder.TERMINATE, True, "local+terminate", True),
        (KillLadder.TERMINATE, False, "terminate", True),
    ],
)
def test_a_kill_climbs_the_rungs_the_plan_chose(tmp_path, ladder, reachable, path, terminated):
    rig, hub, rec = started(tmp_path)
    rig.control.ok = reachable
    done = hub.executor.execute(KillAttempt(rec.site, "i-1", 1, Reason.HANG, ladder), hub.snapshot(rig.clock.now()))
    assert done.kill_path == path and rig.control.calls == [("i-1", rec.site, 1)]
    assert (rig.provider.instances["i-1"] == "terminated") is terminated
    after = rig.table.get_site(RUN, rec.site)
    assert after.attempts[0].kill_path == path and after.run_status is RunStatus.QUEUED


def test_a_kill_with_no_rungs_only_ends_the_attempt(tmp_path):
    rig, hub, rec = started(tmp_path)
    done = hub.executor.execute(
        KillAttempt(rec.site, None, 1, Reason.HANG, KillLadder.NONE), hub.snapshot(rig.clock.now())
    )
    assert done.kill_path == "none" and rig.control.calls == [] and rig.provider.instances["i-1"] == "running"


def test_kill_paths_name_the_rungs_that_ran():
    from hub.control.base import KillResult

    assert kill_path(None, False) == "none" and kill_path(None, True) == "terminate"
    assert kill_path(KillResult(True, "ssm"), False) == "ssm"
    assert kill_path(KillResult(True, "ssm"), True) == "ssm+terminate"
    assert kill_path(KillResult(False, "ssh"), True) == "terminate"


def test_a_launch_that_starts_nothing_is_recorded_as_the_plan_said(tmp_path):
    rig, hub, _ = started(tmp_path)
    real = rig.provider.launch
    rig.provider.launch = lambda run_id, count, target=None: LaunchResult((), ("InsufficientInstanceCapacity",))
    snap = hub.snapshot(rig.clock.now())
    hub.executor.execute(Launch(1, target=3, failures=2, backoff_s=8.0), snap)
    run = rig.table.get_run(RUN)
    assert (run.launch_failures, run.launch_retry_at) == (3, rig.clock.now() + 8.0)
    assert run.launch_error == "InsufficientInstanceCapacity"
    rig.provider.launch = real
    done = hub.executor.execute(Launch(1, target=3, failures=3, backoff_s=16.0), hub.snapshot(rig.clock.now()))
    assert done.acted_on == ("i-3",) and rig.table.get_run(RUN).launch_failures == 0


def test_a_drain_pass_deletes_the_runs_messages_and_sees_another_runs_once(tmp_path):
    rig, hub, _ = started(tmp_path)  # two of the run's three first messages are still waiting
    rig.queue.send("another-run", "x", 1)
    rig.queue.send_raw("not a site message")
    done = hub.executor.execute(Drain(), hub.snapshot(rig.clock.now()))
    assert sorted(done.acted_on) == ["s1", "s2"]
    (other,) = [m for m in rig.queue.messages if "another-run" in m.body]
    assert other.receives == 1 and other.visible_at <= rig.clock.monotonic()  # left for its own run, visible
    assert [m.body for m in rig.queue.dlq] == ["not a site message"]  # its receives ran out in the pass


def test_a_drain_pass_is_bounded(tmp_path):
    rig, hub, _ = started(tmp_path)
    done = hub.executor.execute(Drain(max_messages=1), hub.snapshot(rig.clock.now()))
    assert len(done.acted_on) == 1 and rig.queue.depth().visible == 1


def test_failing_sites_goes_on_past_one_a_node_just_wrote_to(tmp_path):
    rig, hub, rec = started(tmp_path)
    snap = hub.snapshot(rig.clock.now())
    ops.report(rig.table, rec, SiteStatus.RUNNING, rig.clock.now())  # after the snapshot: its write is stale
    done = hub.executor.execute(FailSites(tuple(sorted(snap.sites)), Reason.DEADLINE), snap)
    assert rec.site not in done.acted_on and len(done.acted_on) == 2 and done.conflicts == 1
    assert rig.table.get_site(RUN, rec.site).run_status is RunStatus.RUN  # the next plan fails it again


# --- which method performs which action --------------------------------------------------------------------------
#: The dataclasses of hub.actions that are not actions: what the executor reports, and what the plan carries.
NOT_ACTIONS = {actions.Done, actions.Plan, actions.Ending}


def handled_by(handler) -> type:
    """The action type a handler's first parameter is annotated with."""
    first = next(iter(inspect.signature(handler).parameters))
    return typing.get_type_hints(handler)[first]


def test_every_action_of_hub_actions_has_exactly_one_handler():
    declared = {c for _, c in inspect.getmembers(actions, dataclasses.is_dataclass) if c.__module__ == actions.__name__}
    assert set(typing.get_args(Action)) == declared - NOT_ACTIONS  # every action is in the Action union
    table = Executor(
        run_id="r",
        table=None,
        provider=None,
        clock=None,
        config=None,
        queue=None,
        control=None,
        hub_id="h",
        expire_at=None,
    ).handlers()
    assert set(table) == set(typing.get_args(Action))  # none without a handler, none for what is not an action
    assert len({h.__func__ for h in table.values()}) == len(table)  # no method performs two kinds
    assert all(handled_by(h) is kind for kind, h in table.items())  # each method is written for its kind


def test_the_end_executor_performs_only_what_ends_a_run(tmp_path):
    end = EndExecutor(run_id="r", table=None, provider=None, clock=None)
    assert set(end.handlers()) == {actions.Terminate, FailSites, Finish}
    assert all(handled_by(h) is kind for kind, h in end.handlers().items())
    with pytest.raises(TypeError, match="EndExecutor performs no StartRun"):
        end.execute(StartRun(0.0, 1.0, "20270101"), None)
