"""The site queue enqueued once: a FIFO queue (`aws.queue_fifo`) with deterministic deduplication ids.

Each message carries MessageDeduplicationId = sha256 of its (run, site, attempt) and MessageGroupId = its
run/site, so a second send of the same attempt (a restarted hub seeding again) is dropped by SQS within its
5-minute window, while different attempts and different sites are all delivered.

The queue tests run against a FIFO queue on the moto server ("moto") and against `MemoryQueue(fifo=True)`
("memory"), like the contract suite. Only the memory queue is tested past the window (moto measures it in
real time) and for a re-send after the first message was deleted (moto only compares a new message with those
still in the queue; SQS remembers a deduplication id for the whole window, as the memory queue does).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from cli.commands.tf_config import aws_section
from fleet.aws.bootstrap import ensure_resources
from fleet.aws.queue import SqsSiteQueue
from fleet.clock import FakeClock
from fleet.config.aws import AwsConfig
from fleet.record.messages import DEDUP_WINDOW_S, QueueDepth, SiteMessage, dedup_id, group_id
from sim.memory import MemoryQueue

from .conftest import NamedClients, moto_clients

RUN = "20270115-0600-ab12"


def queue_attributes(sqs: Any, name: str) -> dict[str, str]:
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]


def drain(queue: Any) -> list[tuple[str, str, int]]:
    """Receive and delete every message, in the order received: (run, site, attempt) each."""
    out: list[tuple[str, str, int]] = []
    while (msg := queue.receive(0, 30)) is not None:
        assert isinstance(msg, SiteMessage)
        out.append((msg.run_id, msg.site, msg.attempt))
        queue.delete(msg)
    return out


class Fifo:
    """A FIFO site queue of one backend, and how to get another handle on the same queue (a restarted hub)."""

    def __init__(self, name: str, reopen: Callable[[], Any]):
        self.name = name
        self.reopen = reopen
        self.queue = reopen()


@pytest.fixture(params=["moto", "memory"])
def fifo(request, shared_clients, aws_config) -> Fifo:
    if request.param == "moto":
        aws = aws_config(queue_fifo=True)
        ensure_resources(NamedClients(shared_clients, aws), visibility_timeout_s=30)
        sqs = shared_clients.client("sqs")
        return Fifo("moto", lambda: SqsSiteQueue(sqs, aws.queue_name, aws.dlq_name))
    memory = MemoryQueue(clock=FakeClock(), fifo=True)
    return Fifo("memory", lambda: memory)  # the queue outlives the hub: a new hub sends to the same one


# --- ids ---------------------------------------------------------------------------------------------------------


def test_dedup_and_group_ids_are_deterministic_and_within_the_sqs_limits():
    assert dedup_id(RUN, "s1", 2) == hashlib.sha256(f"{RUN}\ns1\n2".encode()).hexdigest()
    assert dedup_id(RUN, "s1", 2) == dedup_id(RUN, "s1", 2)
    assert len({dedup_id(RUN, "s1", 1), dedup_id(RUN, "s1", 2), dedup_id(RUN, "s2", 1), dedup_id("r2", "s1", 1)}) == 4
    assert group_id(RUN, "s1") == f"{RUN}/s1"
    # Longest run id (64) and site id (128): 193 characters, more than SQS takes; hashed instead.
    long_run, long_site = "r" * 64, "s" * 128
    assert group_id(long_run, long_site) == hashlib.sha256(f"{long_run}/{long_site}".encode()).hexdigest()
    assert group_id(long_run, long_site) != group_id(long_run, "s" * 127)


def test_sends_carry_the_ids_on_fifo_only(aws_config, shared_clients):
    """What goes over the wire: MessageGroupId and MessageDeduplicationId on FIFO, neither on a standard queue."""
    fifo_aws, std_aws = aws_config(queue_fifo=True), aws_config()
    for aws in (fifo_aws, std_aws):
        ensure_resources(NamedClients(shared_clients, aws), visibility_timeout_s=30)
    sqs = moto_clients(fifo_aws).client("sqs")  # its own client: the hook stays off the shared ones
    calls: list[tuple[str, dict[str, Any]]] = []
    sqs.meta.events.register(
        "provide-client-params.sqs", lambda params, model, **_: calls.append((model.name, dict(params)))
    )

    SqsSiteQueue(sqs, fifo_aws.queue_name, fifo_aws.dlq_name).send(RUN, "s1", 3)
    SqsSiteQueue(sqs, fifo_aws.queue_name, fifo_aws.dlq_name).send_many([(RUN, "s2", 1)])
    SqsSiteQueue(sqs, std_aws.queue_name, std_aws.dlq_name).send(RUN, "s1", 3)
    SqsSiteQueue(sqs, std_aws.queue_name, std_aws.dlq_name).send_many([(RUN, "s2", 1)])

    sends = [(name, p) for name, p in calls if name in ("SendMessage", "SendMessageBatch")]
    assert [name for name, _ in sends] == ["SendMessage", "SendMessageBatch"] * 2
    (_, one), (_, batch), (_, std_one), (_, std_batch) = sends
    assert one["MessageGroupId"] == f"{RUN}/s1" and one["MessageDeduplicationId"] == dedup_id(RUN, "s1", 3)
    (entry,) = batch["Entries"]
    assert entry["MessageGroupId"] == f"{RUN}/s2" and entry["MessageDeduplicationId"] == dedup_id(RUN, "s2", 1)
    assert "DelaySeconds" not in one and "DelaySeconds" not in entry  # refused on FIFO queues
    assert set(std_one) == {"QueueUrl", "MessageBody"}
    assert set(std_batch["Entries"][0]) == {"Id", "MessageBody"}


# --- deduplication -----------------------------------------------------------------------------------------------


def test_the_same_attempt_sent_twice_is_one_message(fifo):
    fifo.queue.send(RUN, "s1", 1)
    fifo.queue.send(RUN, "s1", 1)
    assert fifo.queue.depth() == QueueDepth(1, 0, 0)
    assert drain(fifo.queue) == [(RUN, "s1", 1)]


def test_send_many_twice_is_one_message_per_attempt(fifo):
    items = [(RUN, f"s{i:02}", 1) for i in range(12)]  # two batches of SendMessageBatch
    fifo.queue.send_many(items)
    fifo.queue.send_many(items + [(RUN, "s00", 1)])
    fifo.queue.send(RUN, "s05", 1)
    assert fifo.queue.depth().visible == 12
    assert sorted(drain(fifo.queue)) == items


def test_a_restarted_hub_seeding_again_enqueues_nothing_twice(fifo):
    first = fifo.queue
    first.send_many([(RUN, "a", 1), (RUN, "b", 1), (RUN, "c", 1)])
    first.send(RUN, "b", 2)  # b's first attempt was requeued before the restart

    restarted = fifo.reopen()  # a new process: nothing in memory of what the first one sent
    restarted.send_many([(RUN, "a", 1), (RUN, "b", 1), (RUN, "c", 1)])
    restarted.send(RUN, "b", 2)
    restarted.send(RUN, "c", 1)

    assert sorted(drain(restarted)) == [(RUN, "a", 1), (RUN, "b", 1), (RUN, "b", 2), (RUN, "c", 1)]


def test_different_attempts_of_a_site_are_both_delivered_in_order(fifo):
    fifo.queue.send(RUN, "s1", 1)
    fifo.queue.send(RUN, "s1", 2)
    first = fifo.queue.receive(0, 30)
    assert isinstance(first, SiteMessage) and first.attempt == 1
    # One group per site: its next message waits while the first is in flight.
    assert fifo.queue.receive(0, 30) is None
    fifo.queue.delete(first)
    assert drain(fifo.queue) == [(RUN, "s1", 2)]


def test_sites_do_not_block_each_other(fifo):
    fifo.queue.send_many([(RUN, "a", 1), (RUN, "b", 1)])
    first = fifo.queue.receive(0, 30)
    second = fifo.queue.receive(0, 30)  # while the first is in flight
    assert isinstance(first, SiteMessage) and isinstance(second, SiteMessage)
    assert {first.site, second.site} == {"a", "b"}
    assert fifo.queue.depth() == QueueDepth(0, 2, 0)


def test_a_released_message_comes_back(fifo):
    """A node giving a message back (visibility 0: a spot notice) makes it receivable again, group and all."""
    fifo.queue.send(RUN, "s1", 1)
    msg = fifo.queue.receive(0, 30)
    assert isinstance(msg, SiteMessage)
    fifo.queue.set_visibility(msg, 0)
    again = fifo.queue.receive(0, 30)
    assert isinstance(again, SiteMessage) and (again.site, again.attempt, again.receive_count) == ("s1", 1, 2)


def test_long_run_and_site_ids_are_accepted(fifo):
    run, site = "r" * 64, "s" * 128
    fifo.queue.send(run, site, 1)
    fifo.queue.send_many([(run, site, 1), (run, site, 2)])
    assert drain(fifo.queue) == [(run, site, 1), (run, site, 2)]


# --- the memory queue past what moto shows ------------------------------------------------------------------------


def test_memory_fifo_forgets_a_dedup_id_after_the_window():
    clock = FakeClock()
    q = MemoryQueue(clock=clock, fifo=True)
    q.send(RUN, "s1", 1)
    clock.advance(DEDUP_WINDOW_S - 1)
    q.send(RUN, "s1", 1)  # within the window (counted from the first send): dropped
    assert (q.sent, q.deduplicated, len(q.messages)) == (1, 1, 1)
    clock.advance(1)
    q.send(RUN, "s1", 1)  # 300 s after the first send: a new message
    assert (q.sent, q.deduplicated, len(q.messages)) == (2, 1, 2)


def test_memory_fifo_drops_a_resend_after_the_first_was_deleted():
    """As SQS does (moto does not: it compares only with the messages still in the queue)."""
    clock = FakeClock()
    q = MemoryQueue(clock=clock, fifo=True)
    q.send(RUN, "s1", 1)
    assert drain(q) == [(RUN, "s1", 1)]
    clock.advance(60)
    q.send(RUN, "s1", 1)
    assert q.messages == [] and q.deduplicated == 1


def test_memory_queue_default_is_unchanged():
    q = MemoryQueue(clock=FakeClock())
    assert q.fifo is False
    q.send(RUN, "s1", 1)
    q.send_many([(RUN, "s1", 1), (RUN, "s1", 2)])
    assert (q.sent, q.deduplicated) == (3, 0)
    a, b = q.receive(0, 30), q.receive(0, 30)  # no groups: the second of the site is not held back
    assert isinstance(a, SiteMessage) and isinstance(b, SiteMessage) and (a.attempt, b.attempt) == (1, 1)


# --- a standard queue --------------------------------------------------------------------------------------------


def test_a_standard_queue_still_delivers_duplicates(aws_config, shared_clients):
    aws = aws_config()
    assert (aws.queue_fifo, aws.queue_name, aws.dlq_name) == (False, aws.queue, f"{aws.queue}-dlq")
    ensure_resources(NamedClients(shared_clients, aws), visibility_timeout_s=30)
    queue = SqsSiteQueue(shared_clients.client("sqs"), aws.queue_name, aws.dlq_name)
    assert queue.fifo is False
    queue.send(RUN, "s1", 1)
    queue.send(RUN, "s1", 1)
    queue.send_many([(RUN, "s1", 1), (RUN, "s2", 1)])
    assert queue.depth().visible == 4
    a, b = queue.receive(0, 30), queue.receive(0, 30)  # no groups: both of s1 at once
    assert isinstance(a, SiteMessage) and isinstance(b, SiteMessage)
    assert sorted(drain(queue) + [(RUN, a.site, a.attempt), (RUN, b.site, b.attempt)]) == [
        (RUN, "s1", 1),
        (RUN, "s1", 1),
        (RUN, "s1", 1),
        (RUN, "s2", 1),
    ]


# --- bootstrap and config ----------------------------------------------------------------------------------------


def test_bootstrap_creates_fifo_queues_with_the_dlq_redrive(aws_config):
    aws = aws_config(queue_fifo=True, max_receive_count=2)
    clients = moto_clients(aws)

    created = ensure_resources(clients, visibility_timeout_s=45)

    assert created == [
        f"DynamoDB table {aws.table}",
        f"SQS queue {aws.queue}-dlq.fifo",
        f"SQS queue {aws.queue}.fifo (DLQ {aws.queue}-dlq.fifo)",
        f"S3 bucket {aws.bucket}",
    ]
    sqs = clients.client("sqs")
    main, dlq = queue_attributes(sqs, f"{aws.queue}.fifo"), queue_attributes(sqs, f"{aws.queue}-dlq.fifo")
    for attrs in (main, dlq):
        assert (attrs["FifoQueue"], attrs["ContentBasedDeduplication"]) == ("true", "false")
    assert main["VisibilityTimeout"] == "45"
    assert dlq["MessageRetentionPeriod"] == "1209600"
    redrive = json.loads(main["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == dlq["QueueArn"] and int(redrive["maxReceiveCount"]) == 2
    assert ensure_resources(moto_clients(aws), visibility_timeout_s=45) == []  # idempotent

    # The redrive works: after max_receive_count receives the message is in the DLQ.
    queue = SqsSiteQueue(sqs, aws.queue_name, aws.dlq_name)
    queue.check_exists()
    queue.send(RUN, "s1", 1)
    for _ in range(2):
        msg = queue.receive(0, 30)
        assert isinstance(msg, SiteMessage)
        queue.set_visibility(msg, 0)
    assert queue.receive(0, 30) is None
    assert [(m.site, m.attempt) for m in queue.peek(dlq=True) if isinstance(m, SiteMessage)] == [("s1", 1)]


def test_fifo_queue_names():
    assert (AwsConfig(queue="q", queue_fifo=True).queue_name, AwsConfig(queue="q", queue_fifo=True).dlq_name) == (
        "q.fifo",
        "q-dlq.fifo",
    )
    named = AwsConfig(queue="q.fifo", queue_fifo=True)
    assert (named.queue_name, named.dlq_name) == ("q.fifo", "q-dlq.fifo")  # never .fifo.fifo
    assert AwsConfig(queue="q", dlq="dead", queue_fifo=True).dlq_name == "dead.fifo"
    assert AwsConfig(queue="q", dlq="dead.fifo", queue_fifo=True).dlq_name == "dead.fifo"
    assert (AwsConfig(queue="q").queue_name, AwsConfig(queue="q").dlq_name) == ("q", "q-dlq")  # standard: as before
    assert AwsConfig().queue_fifo is False


def test_terraform_output_carries_queue_fifo():
    hx = uuid.uuid4().hex
    value = {"region": "ap-northeast-2", "queue": f"q-{hx}.fifo", "queue_fifo": True, "dlq": f"q-{hx}-dlq.fifo"}
    section = aws_section(json.dumps({"gridfleet_aws": {"value": value}}))
    aws = AwsConfig.model_validate(section["aws"])
    assert (aws.queue_name, aws.dlq_name) == (f"q-{hx}.fifo", f"q-{hx}-dlq.fifo")


def test_an_attempt_given_back_is_asked_for_again_under_a_new_id():
    """A spot interruption gives its attempt back: the next message has the same (run, site, attempt) as the
    deleted one, and must not be dropped as a duplicate; a repeated send of that request still is."""
    from fleet.clock import FakeClock
    from fleet.record import ops
    from fleet.record.state import Reason, SiteSpec
    from sim.memory import MemoryStateTable

    clock = FakeClock()
    table, q = MemoryStateTable(), MemoryQueue(clock=clock, fifo=True)
    rec = ops.new_site("r", "s1", SiteSpec("http://x.test/"), None)
    table.create_site(rec)
    rec = ops.send_next(table, q, rec)
    msg = q.receive(0, 30)
    rec = ops.claim(table, table.get_site("r", "s1"), "i-1", clock.now())
    q.delete(msg)
    rec = ops.end_attempt(table, rec, reason=Reason.SPOT, now=clock.now(), max_attempts=3, spot_cap=3)
    assert rec.attempt == 0 and rec.spot_requeues == 1
    ops.send_next(table, q, rec)
    q.send("r", "s1", 1, rec.spot_requeues)  # the same request again (a repaired enqueue): dropped
    again = q.receive(0, 30)
    assert (again.site, again.attempt) == ("s1", 1) and q.receive(0, 30) is None
    assert q.deduplicated == 1
