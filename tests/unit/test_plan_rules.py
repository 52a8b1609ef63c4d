"""Decisions the executor used to take, now the plan's: the launch backoff and the rungs of a kill."""

import dataclasses

from fleet.record.state import Reason, SiteStatus
from hub.actions import KillAttempt, KillLadder, Launch
from hub.plan import LAUNCH_BACKOFF_MAX_S, kill_ladder, launch_backoff_s
from tests.unit.test_plan import RUN, T0, World, config, running, site


def test_the_launch_backoff_doubles_up_to_its_cap():
    assert [launch_backoff_s(n) for n in range(1, 8)] == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert launch_backoff_s(50) == LAUNCH_BACKOFF_MAX_S


def test_a_launch_carries_what_to_record_if_it_starts_nothing():
    fresh = World(config(1), [site("s0")], instances=(), nodes={})
    assert Launch(1, target=1, failures=0, backoff_s=2.0) in fresh.plan(T0).actions
    run = dataclasses.replace(RUN, launch_failures=3, launch_error="x", launch_retry_at=T0 - 1)
    again = World(config(1), [site("s0")], instances=(), nodes={}, run=run)
    assert Launch(1, target=1, failures=3, backoff_s=16.0) in again.plan(T0).actions


def test_the_plan_chooses_the_rungs_of_each_kill():
    assert kill_ladder("i-1", Reason.HANG) is KillLadder.FALLBACK  # terminate only if the node cannot be reached
    assert kill_ladder("i-1", Reason.LOST) is KillLadder.TERMINATE  # a node that stopped heartbeating is sick
    assert kill_ladder(None, Reason.HANG) is KillLadder.NONE


def test_an_interrupted_kill_is_finished_with_the_rungs_of_its_recorded_reason():
    w = World(config(1), [running("s0", kill_reason="lost")])
    assert KillAttempt("s0", "i-1", 1, Reason.LOST, KillLadder.TERMINATE) in w.plan(T0).actions
    w = World(config(1), [running("s0", node=None, site_status=SiteStatus.URL_CALL, kill_reason="hang")])
    assert KillAttempt("s0", None, 1, Reason.HANG, KillLadder.NONE) in w.plan(T0).actions


def test_a_kill_mark_that_names_no_reason_is_no_mark():
    """Nodes write the site's item too: a `kill_reason` that is no Reason neither kills nor stops the plan."""
    marked = World(config(1), [running("s0", kill_reason="bogus")]).plan(T0)
    plain = World(config(1), [running("s0")]).plan(T0)
    assert not [a for a in marked.actions if isinstance(a, KillAttempt)]
    assert marked.actions == plain.actions
