"""The one in-memory SQS queue (`sim.queue`) where the simulator and the unit tests use it apart.

What it shares with SQS is the contract suite's (tests/adapter/test_contract.py, test_fifo_queue.py, against
moto); here: the simulator's hooks (an empty receive that does not wait, `on_send` waking its waiting nodes),
and the FIFO groups over many messages.
"""

from fleet.clock import FakeClock
from fleet.record.messages import QueueDepth, SiteMessage
from sim.memory import MemoryQueue as FakesQueue
from sim.queue import MemoryQueue

RUN = "20270115-0600-ab12"


def test_the_fakes_queue_is_the_simulators():
    assert FakesQueue is MemoryQueue


def test_an_empty_receive_waits_out_its_long_poll_on_the_clock():
    clock = FakeClock()
    start = clock.monotonic()
    assert MemoryQueue(clock).receive(20, 30) is None
    assert clock.monotonic() == start + 20


def test_without_long_poll_an_empty_receive_returns_at_once_and_a_send_or_release_wakes_the_caller():
    clock, woken = FakeClock(), []
    q = MemoryQueue(clock, long_poll=False, on_send=lambda: woken.append("woken"))
    start = clock.monotonic()
    assert q.receive(20, 30) is None and clock.monotonic() == start  # the caller does the waiting
    q.send(RUN, "s1", 1)
    assert woken == ["woken"]
    msg = q.receive(20, 30)
    q.set_visibility(msg, 45)  # hidden longer: nothing to wake for
    assert woken == ["woken"]
    q.set_visibility(msg, 0)  # given back: receivable at once
    assert woken == ["woken"] * 2
    assert q.receive(20, 30).receive_count == 2


def test_a_message_shown_again_by_its_timeout_is_received_after_those_already_waiting():
    clock = FakeClock()
    q = MemoryQueue(clock)
    q.send(RUN, "a", 1)
    first = q.receive(0, 10)
    q.send(RUN, "b", 1)
    clock.advance(10)
    q.send(RUN, "c", 1)
    got = [q.receive(0, 30) for _ in range(3)]
    assert [(m.site, m.receive_count) for m in got] == [("b", 1), ("c", 1), ("a", 2)]
    assert got[2].message_id == first.message_id and got[2].receipt != first.receipt
    q.delete(first)  # an older receipt deletes nothing
    assert q.depth() == QueueDepth(0, 3, 0)


def test_fifo_groups_hold_their_later_messages_and_release_them_in_order():
    clock = FakeClock()
    q = MemoryQueue(clock, fifo=True)
    q.send_many([(RUN, f"s{i}", a) for a in (1, 2, 3) for i in range(50)])  # three attempts of 50 sites
    assert q.depth() == QueueDepth(150, 0, 0)
    seen: dict[str, list[int]] = {}
    for _ in range(3):
        batch = [q.receive(0, 30) for _ in range(50)]
        assert q.receive(0, 30) is None  # every group has its message in flight
        for m in batch:
            assert isinstance(m, SiteMessage)
            seen.setdefault(m.site, []).append(m.attempt)
            q.delete(m)
    assert all(attempts == [1, 2, 3] for attempts in seen.values()) and len(seen) == 50
    assert q.messages == [] and q.depth() == QueueDepth(0, 0, 0)


def test_fifo_a_group_moves_on_when_its_first_message_goes_to_the_dlq():
    q = MemoryQueue(FakeClock(), max_receive_count=1, fifo=True)
    q.send(RUN, "s1", 1)
    q.send(RUN, "s1", 2)
    q.set_visibility(q.receive(0, 30), 0)
    nxt = q.receive(0, 30)  # the first is over its receives: to the DLQ, and the group's next is delivered
    assert isinstance(nxt, SiteMessage) and nxt.attempt == 2
    assert [(m.site, m.attempt) for m in q.peek(dlq=True)] == [("s1", 1)]
    assert q.depth() == QueueDepth(0, 1, 1)


def test_a_group_id_sqs_would_refuse_is_hashed_a_trailing_newline_too():
    """`<run>/<site>` when SQS takes it whole, else its sha256 hex (the rule is matched whole: `$` alone would
    pass a name ending in a newline on to SQS)."""
    from fleet.record.messages import group_id

    assert group_id(RUN, "shop") == f"{RUN}/shop"
    for site in ("shop\n", "s p", "x" * 200):
        gid = group_id(RUN, site)
        assert len(gid) == 64 and set(gid) <= set("0123456789abcdef"), site
