"""DynamoRateLimiter on moto: the same slots as the in-memory limiter, the item it keeps, the calls it makes,
and real processes sharing one group's rate."""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest

from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.aws.ratelimit import LIMITS_PARTITION, DynamoRateLimiter, MemoryRateLimiter, RateLimiter, spacing
from fleet.clock import FakeClock
from fleet.config.aws import AwsConfig
from tests.adapter.conftest import MOTO_CALLS, REGION
from tests.helpers.windows import max_in_window


def group() -> str:
    return f"g-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=("moto", "memory"))
def make_limiter(request) -> Callable[[FakeClock], RateLimiter]:
    """Limiters of one backend; with moto, each made limiter is another node on the same table."""
    if request.param == "memory":
        shared: list[MemoryRateLimiter] = []

        def memory(clock: FakeClock) -> RateLimiter:
            if not shared:
                shared.append(MemoryRateLimiter(clock))
            return shared[0]

        return memory
    ddb = request.getfixturevalue("shared_clients").client("dynamodb")
    table = request.getfixturevalue("limits_table")
    return lambda clock: DynamoRateLimiter(ddb, table, clock)


def update_calls() -> int:
    return MOTO_CALLS.get("UpdateItem", 0)


# --- the same slots as in memory -------------------------------------------------------------------------------------


def test_idle_group_gives_slot_now(make_limiter):
    clock = FakeClock()
    rl, g = make_limiter(clock), group()
    assert rl.take(g, 5, clock.now()) == pytest.approx(clock.now())
    clock.advance(10)
    assert rl.take(g, 5, clock.now()) == pytest.approx(clock.now())


def test_contended_slots_are_exactly_spacing_apart(make_limiter):
    clock = FakeClock()
    nodes, g = [make_limiter(clock) for _ in range(3)], group()
    t0 = clock.now()
    slots = [nodes[i % 3].take(g, 5, t0) for i in range(15)]  # three nodes asking at one instant
    assert slots == [pytest.approx(t0 + i * spacing(5), abs=1e-6) for i in range(15)]
    assert max_in_window(slots) == 5


def test_no_burst_after_idleness(make_limiter):
    clock = FakeClock()
    a, b, g = make_limiter(clock), make_limiter(clock), group()
    sends = [a.wait(g, 5) for _ in range(8)]
    clock.advance(30)
    sends += [a.take(g, 5, clock.now()), b.take(g, 5, clock.now()), a.take(g, 5, clock.now())]
    sends += [b.wait(g, 5) for _ in range(8)]
    assert max_in_window(sends) <= 5
    ordered = sorted(sends)
    assert min(y - x for x, y in pairwise(ordered)) >= spacing(5) - 1e-6


def test_wait_sleeps_until_the_slot(make_limiter):
    clock = FakeClock()
    rl, g = make_limiter(clock), group()
    t0 = clock.now()
    for i in range(5):
        assert rl.wait(g, 5) == pytest.approx(t0 + i * 0.22, abs=1e-6)
        assert clock.now() == pytest.approx(t0 + i * 0.22, abs=1e-6)


# --- DynamoDB specifics ----------------------------------------------------------------------------------------------


def test_item_layout(shared_clients, limits_table):
    ddb = shared_clients.client("dynamodb")
    clock = FakeClock()
    rl, g = DynamoRateLimiter(ddb, limits_table, clock), group()
    rl.take(g, 4, clock.now())
    rl.take(g, 4, clock.now())
    item = ddb.get_item(
        TableName=limits_table, Key={"run_id": {"S": LIMITS_PARTITION}, "Site": {"S": g}}, ConsistentRead=True
    )["Item"]
    assert set(item) == {"run_id", "Site", "next_at"}
    assert item["run_id"] == {"S": "#limits"} and item["Site"] == {"S": g}
    assert float(item["next_at"]["N"]) == pytest.approx(clock.now() + 2 * spacing(4), abs=1e-6)


def test_one_call_per_request_when_the_guess_is_right(shared_clients, limits_table):
    ddb = shared_clients.client("dynamodb")
    clock = FakeClock()
    rl, g = DynamoRateLimiter(ddb, limits_table, clock), group()
    before = update_calls()
    rl.take(g, 5, clock.now())  # idle, guessed idle
    for _ in range(10):
        rl.take(g, 5, clock.now())  # busy, guessed busy (own reservation pending, then busy last time)
    assert update_calls() - before == 11
    # A node paced at the limit (wait, then ask again right away) stays at one call per request.
    before = update_calls()
    for _ in range(5):
        rl.wait(g, 5)
    assert update_calls() - before == 5
    # Requests slower than the limit: the group is idle at each take, found idle at once.
    clock.advance(60)
    rl.take(g, 5, clock.now())  # wrong guess (busy last time): 2 calls
    before = update_calls()
    for _ in range(5):
        clock.advance(1.0)
        assert rl.take(g, 5, clock.now()) == clock.now()
    assert update_calls() - before == 5


def test_wrong_guesses_cost_one_extra_call(shared_clients, limits_table):
    ddb = shared_clients.client("dynamodb")
    clock = FakeClock()
    a, b, g = DynamoRateLimiter(ddb, limits_table, clock), DynamoRateLimiter(ddb, limits_table, clock), group()
    a.take(g, 5, clock.now())
    before = update_calls()
    assert b.take(g, 5, clock.now()) == pytest.approx(clock.now() + 0.22, abs=1e-6)  # b guessed idle: 2 calls
    assert update_calls() - before == 2
    clock.advance(5)
    before = update_calls()
    assert b.take(g, 5, clock.now()) == clock.now()  # b guessed busy, the group went idle: 2 calls
    assert update_calls() - before == 2


def test_other_errors_are_not_swallowed(shared_clients):
    rl = DynamoRateLimiter(shared_clients.client("dynamodb"), f"no-such-{uuid.uuid4().hex}", FakeClock())
    with pytest.raises(Exception) as e:
        rl.take(group(), 5, 1.0)
    assert "ResourceNotFound" in str(e.value)


# --- processes sharing a group's rate ---------------------------------------------------------------------------------


def _node(endpoint: str, table: str, grp: str, per_s: float, start: Any, run_s: float, out: Any) -> None:
    """One node: its own boto3 client; once all nodes are ready, takes slots and 'sends' at each for run_s."""
    clients = AwsClients(AwsConfig(endpoint_url=endpoint, region=REGION), credentials=LOCAL_CREDENTIALS)
    rl = DynamoRateLimiter(clients.client("dynamodb"), table)  # the system clock
    ddb_calls = [0]
    clients.client("dynamodb").meta.events.register(
        "after-call.dynamodb.UpdateItem", lambda **_: ddb_calls.__setitem__(0, ddb_calls[0] + 1)
    )
    start.wait(timeout=30)
    start_at = time.time()
    granted: list[tuple[float, float]] = []
    while time.time() < start_at + run_s:
        slot = rl.wait(grp, per_s)
        granted.append((slot, time.time()))  # the slot, and when the request would leave
    out.put((granted, ddb_calls[0]))


def test_processes_share_the_rate(moto_endpoint, limits_table):
    per_s, nodes, run_s = 5.0, 3, 2.5
    ctx = multiprocessing.get_context("spawn")  # no fork of a process running the moto server's threads
    out = ctx.Queue()
    g = group()
    start = ctx.Barrier(nodes)  # the nodes start together, once each has its client
    procs = [
        ctx.Process(target=_node, args=(moto_endpoint, limits_table, g, per_s, start, run_s, out)) for _ in range(nodes)
    ]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=20) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    # Judged on the slots the table granted, not on the clock of processes a busy machine may pause between the
    # grant and the send: the grants are what the limiter promises, and no request leaves before its slot.
    slots = sorted(slot for g, _ in results for slot, _ in g)
    per_node = [len(g) for g, _ in results]
    calls = sum(c for _, c in results)
    gaps = [b - a for a, b in pairwise(slots)]
    median_gap = sorted(gaps)[len(gaps) // 2]
    print(
        f"\n{nodes} processes, per_s={per_s}: {len(slots)} slots {per_node} in {slots[-1] - slots[0]:.2f}s, "
        f"most in any 1s window {max_in_window(slots)}, closest slots {min(gaps) * 1000:.0f} ms apart, median "
        f"{median_gap * 1000:.0f} ms (spacing {spacing(per_s) * 1000:.0f} ms), {calls / len(slots):.2f} UpdateItem "
        "calls per request"
    )
    assert all(n > 0 for n in per_node), per_node  # every node got its share
    assert all(sent >= slot for g, _ in results for slot, sent in g)  # no request before its slot
    assert min(gaps) >= spacing(per_s) - 1e-6  # no two grants closer than the spacing, whichever process
    assert max_in_window(slots) <= per_s
    assert median_gap <= 1.5 * spacing(per_s)  # and the limiter keeps pace: queued requests go one spacing apart
