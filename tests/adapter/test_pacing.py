"""DynamoDomainPacer on moto: a domain's slots shared by nodes, its AutoThrottle spacing kept in its item and
shared, and the run's counters the hub reads into summary.json's `pacing`."""

from __future__ import annotations

import uuid

import pytest

from fleet.aws.pacing import UNPACED_FOR_S, DynamoDomainPacer
from fleet.aws.ratelimit import LIMITS_PARTITION
from fleet.aws.table import DynamoStateTable
from fleet.clock import FakeClock
from fleet.crawl.pacing import DOMAIN_PREFIX, FROM_CRAWL_DELAY


@pytest.fixture(scope="module")
def table(limits_table) -> str:
    return limits_table


def domain() -> str:
    return f"d-{uuid.uuid4().hex[:10]}.test:8900"


def item(ddb, table: str, d: str) -> dict:
    key = {"run_id": {"S": LIMITS_PARTITION}, "Site": {"S": DOMAIN_PREFIX + d}}
    return ddb.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item") or {}


def test_two_nodes_share_a_domains_slots_at_its_base_spacing(shared_clients, table):
    ddb, clock, d = shared_clients.client("dynamodb"), FakeClock(), domain()
    a, b = DynamoDomainPacer(ddb, table, clock), DynamoDomainPacer(ddb, table, clock)
    t0 = clock.now()
    slots = [(a, b)[i % 2].take(d, 1.0, t0) for i in range(6)]
    assert slots == [pytest.approx(t0 + i) for i in range(6)]
    assert float(item(ddb, table, d)["next_at"]["N"]) == pytest.approx(t0 + 6)
    clock.advance(60)  # idle: the next request goes at once
    assert b.take(d, 1.0, clock.now()) == pytest.approx(clock.now())


def test_a_domain_paced_by_nothing_costs_no_write(shared_clients, table):
    ddb, clock, d = shared_clients.client("dynamodb"), FakeClock(), domain()
    p = DynamoDomainPacer(ddb, table, clock)
    assert [p.take(d, 0.0, clock.now()) for _ in range(3)] == [clock.now()] * 3
    assert p.answered(d, 0.0, 200) == 0.0
    assert item(ddb, table, d) == {}


def test_a_429_backs_the_domain_off_for_every_node_and_successes_bring_it_back(shared_clients, table):
    ddb, clock, d = shared_clients.client("dynamodb"), FakeClock(), domain()
    a, b = DynamoDomainPacer(ddb, table, clock), DynamoDomainPacer(ddb, table, clock)
    t0 = clock.now()
    assert a.take(d, 1.0, t0) == pytest.approx(t0)
    assert a.answered(d, 1.0, 429) == 2.0
    assert b.answered(d, 1.0, 503) == 4.0  # b read the spacing a wrote, and doubled it
    assert float(item(ddb, table, d)["spacing"]["N"]) == 4.0
    assert b.take(d, 1.0, t0) == pytest.approx(t0 + 1)  # the slot a left; it leaves the next 4 s on
    assert a.take(d, 1.0, t0) == pytest.approx(t0 + 5)
    assert a.answered(d, 1.0, 200) == pytest.approx(3.7)  # from the spacing b left, not the one a wrote
    assert b.answered(d, 1.0, 200) == pytest.approx(3.43)
    assert float(item(ddb, table, d)["spacing"]["N"]) == pytest.approx(3.43)


def test_the_runs_counters_of_each_domain_are_what_the_summary_shows(shared_clients, table):
    ddb, clock, d = shared_clients.client("dynamodb"), FakeClock(), domain()
    a, b = DynamoDomainPacer(ddb, table, clock), DynamoDomainPacer(ddb, table, clock)
    run = f"run-{uuid.uuid4().hex[:8]}"
    base = (1.0, FROM_CRAWL_DELAY)
    for p, status in ((a, 200), (b, 429), (a, 200)):
        p.count(run, d, base, (1, int(status == 429)), p.answered(d, 1.0, status))
    pacing = DynamoStateTable(ddb, table).read_pacing(run)  # spacing: 1, 2 (the 429), then 10% back: 1.9
    assert pacing == {
        d: {"requests": 3, "base_s": 1.0, "base_from": "crawl-delay", "backoffs": 1, "spacing_s": pytest.approx(1.9)}
    }
    assert DynamoStateTable(ddb, table).read_pacing("another-run") == {}


def test_a_request_to_a_domain_never_backed_off_costs_one_read_and_its_answer_none(shared_clients, table):
    ddb, clock, d = shared_clients.client("dynamodb"), FakeClock(), domain()
    calls: list[str] = []

    def record(model, **_):
        calls.append(model.name)

    ddb.meta.events.register("before-call.dynamodb.*", record)
    try:
        p = DynamoDomainPacer(ddb, table, clock)
        p.take(d, 0.0, clock.now())
        assert p.answered(d, 0.0, 200) == 0.0
        assert calls == ["GetItem"]
        assert p.answered(d, 0.0, 429) == 1.0  # a back-off reads and writes
        assert calls == ["GetItem", "GetItem", "UpdateItem"]
    finally:
        ddb.meta.events.unregister("before-call.dynamodb.*", record)


def test_an_unpaced_domain_is_read_once_in_a_while_and_a_back_off_elsewhere_reaches_it(shared_clients, table):
    ddb, clock, d = shared_clients.client("dynamodb"), FakeClock(), domain()
    calls: list[str] = []

    def record(model, **_):
        calls.append(model.name)

    a, b = DynamoDomainPacer(ddb, table, clock), DynamoDomainPacer(ddb, table, clock)
    ddb.meta.events.register("before-call.dynamodb.*", record)
    try:
        for _ in range(5):  # five requests within UNPACED_FOR_S: one read, no wait
            assert a.take(d, 0.0, clock.now()) == clock.now()
            a.answered(d, 0.0, 200)
        assert calls == ["GetItem"]
        b.take(d, 0.0, clock.now())
        assert b.answered(d, 0.0, 429) == 1.0  # another node is told to slow down
        clock.advance(UNPACED_FOR_S)
        t = clock.now()
        first, second = a.take(d, 0.0, t), a.take(d, 0.0, t)
        assert second - first == pytest.approx(1.0)  # read again: the back-off paces this node too
    finally:
        ddb.meta.events.unregister("before-call.dynamodb.*", record)
