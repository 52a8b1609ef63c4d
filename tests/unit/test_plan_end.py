"""The end of a run, one path for every end: tick by tick from the snapshot and the hub's clock, no I/O."""

import dataclasses

from fleet.record.messages import QueueDepth
from fleet.record.state import Reason, RunState, RunStatus, SiteStatus
from hub.actions import Drain, Ending, FailSites, Finish, Launch, Terminate
from hub.plan import END_WAIT_S, drain_wait_s, end_plan, plan, teardown_request
from hub.snapshot import Instance, Observations, Snapshot
from tests.unit.test_plan import RUN, T0, config, running, site

DONE = dataclasses.replace(site("s0"), run_status=RunStatus.COMPLETED, site_status=SiteStatus.COMPLETED)
EMPTY = QueueDepth(0, 0, 0)


def snap(sites=(DONE,), live=(), gone=(), run=RUN, queue=EMPTY, ending=None):
    instances = {i: Instance(i, "running") for i in live} | {i: Instance(i, "terminated") for i in gone}
    return Snapshot("r1", run, {s.site: s for s in sites}, {}, instances, Observations(), queue=queue, ending=ending)


def test_a_done_run_terminates_its_nodes_first_and_finishes_once_they_are_gone():
    cfg = config(1)
    first = plan(snap(live=("i-1",), queue=None), T0, cfg)
    assert first.actions == (Terminate(("i-1",), "finish"),)
    assert first.ending == Ending("done", T0, drain_s=drain_wait_s(cfg))
    later = plan(snap(gone=("i-1",), ending=first.ending), T0 + 1, cfg)
    assert later.actions == (Finish("done"),)


def test_instances_that_will_not_go_are_terminated_again_until_the_wait_is_over_then_counted():
    ending = Ending("deadline", T0, Reason.DEADLINE, drain_s=35.0)
    waiting = end_plan(snap(live=("i-1",)), T0 + END_WAIT_S - 1, ending)
    assert waiting.actions == (Terminate(("i-1",), "deadline"),) and waiting.wake_at == T0 + END_WAIT_S - 0.5
    over = end_plan(snap(live=("i-1",)), T0 + END_WAIT_S, ending)
    assert over.actions == (Terminate(("i-1",), "deadline"), Finish("deadline", left_running=1))


def test_the_queue_is_drained_until_nothing_of_the_run_is_in_flight():
    ending = Ending("done", T0, drain_s=35.0)
    unread = end_plan(snap(queue=None), T0, ending)  # the first tick of the end read no depths yet
    assert unread.actions == (Drain(),)
    held = end_plan(snap(queue=QueueDepth(0, 2, 0)), T0 + 1, ending)
    assert held.actions == () and held.wake_at == T0 + 3  # dead nodes' messages: wait for them to come back
    back = end_plan(snap(queue=QueueDepth(2, 0, 0)), T0 + 20, ending)
    assert back.actions == (Drain(), Finish("done"))


def test_messages_in_flight_are_waited_for_no_longer_than_the_drain_wait():
    ending = Ending("done", T0, drain_s=35.0)
    assert Finish("done") not in end_plan(snap(queue=QueueDepth(0, 1, 0)), T0 + 34.9, ending).actions
    assert end_plan(snap(queue=QueueDepth(0, 1, 0)), T0 + 35, ending).actions == (Finish("done"),)


def test_an_end_keeps_the_reason_it_was_decided_for():
    cfg = config(1)
    short = dataclasses.replace(RUN, deadline_at=T0 + 1)
    first = plan(snap(live=("i-1",), run=short), T0, cfg)
    assert first.ending is not None and first.ending.why == "done"
    # The deadline passes while the end waits: the run still finished because every site was done.
    assert plan(snap(gone=("i-1",), run=short, ending=first.ending), T0 + 2, cfg).actions == (Finish("done"),)


def test_a_done_end_is_called_off_when_an_operator_reopens_a_site():
    cfg = config(1)
    ending = Ending("done", T0, drain_s=35.0)
    p = plan(snap(sites=(site("s0"),), ending=ending), T0 + 1, cfg)
    assert p.ending is None and Launch(1, target=1) in p.actions


def test_a_teardown_request_ends_everything_with_killed_and_does_not_drain():
    cfg = config(2)
    request = teardown_request(T0)
    sites = (running("s0"), site("s1"))
    first = plan(snap(sites=sites, live=("i-1",), queue=None, ending=request), T0, cfg)
    assert first.actions == (
        Terminate(("i-1",), "teardown"),
        FailSites(("s0", "s1"), Reason.KILLED, "torn down by an operator"),
    )
    failed = [dataclasses.replace(r, run_status=RunStatus.FAILED, site_status=SiteStatus.FAILED) for r in sites]
    assert plan(snap(sites=failed, gone=("i-1",), queue=None, ending=request), T0 + 1, cfg).actions == (
        Finish("teardown"),
    )


def test_a_finished_run_is_left_alone_unless_it_is_torn_down():
    cfg = config(1)
    finished = dataclasses.replace(RUN, status=RunState.FINISHED)
    assert plan(snap(live=("i-9",), run=finished), T0, cfg).actions == ()
    # A teardown of a finished run still ends what it left running.
    torn = plan(snap(live=("i-9",), run=finished, ending=teardown_request(T0)), T0, cfg)
    assert torn.actions == (Terminate(("i-9",), "teardown"),)


def test_a_site_a_node_keeps_writing_to_is_failed_again_each_tick_of_the_end():
    ending = Ending("deadline", T0, Reason.DEADLINE, drain_s=35.0)
    p = end_plan(snap(sites=(running("s0"),)), T0 + 5, ending)
    assert p.actions == (FailSites(("s0",), Reason.DEADLINE),) and Finish("deadline") not in p.actions
