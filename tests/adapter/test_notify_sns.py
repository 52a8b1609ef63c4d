"""The end-of-run message through SNS on a moto server: the hub's finish path publishes it to the topic, and an
SQS queue subscribed to the topic receives it.

The hub runs a whole (small) run on the moto table; its queue, provider and nodes are the fakes of the hub loop
tests (the message needs only the table, the bucket and SNS to be real).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from fleet.aws.archive import S3RunArchive
from fleet.aws.bootstrap import ensure_resources
from fleet.aws.notify import notify_overdue, previous_summary
from fleet.aws.table import DynamoStateTable
from fleet.config import Config
from fleet.record import ops
from fleet.record.partition import RunInfo
from fleet.record.state import Reason
from tests.unit.test_hub_loop import RUN, Rig, config

from .conftest import NamedClients

PREVIOUS = "2026-11-20"


def subscribed_queue(clients: Any) -> tuple[str, str]:
    """A new SNS topic and the URL of an SQS queue subscribed to it."""
    sns, sqs = clients.client("sns"), clients.client("sqs")
    topic = sns.create_topic(Name=f"runs-{uuid.uuid4().hex[:12]}")["TopicArn"]
    url = sqs.create_queue(QueueName=f"notes-{uuid.uuid4().hex[:12]}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)
    return topic, url


def received(clients: Any, url: str) -> list[dict[str, Any]]:
    """Every SNS notification in the queue (the SNS envelope, parsed)."""
    sqs, out = clients.client("sqs"), []
    while True:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
        if not got:
            return out
        for m in got:
            out.append(json.loads(m["Body"]))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


@pytest.fixture
def aws(shared_clients, aws_config):
    aws = aws_config()
    ensure_resources(NamedClients(shared_clients, aws), visibility_timeout_s=30)
    return aws


def test_the_hubs_finish_publishes_one_message_to_the_topic(tmp_path, shared_clients, aws):
    topic, url = subscribed_queue(shared_clients)
    base = config()
    cfg = Config.model_validate({**base.model_dump(), "aws": aws.model_dump(), "notify": {"sns_topic_arn": topic}})
    rig = Rig(tmp_path, cfg)
    rig.table = DynamoStateTable(shared_clients.client("dynamodb"), aws.table)
    # Yesterday's run: in the run index, its summary in the bucket; s0 failed then, s1 completed.
    then = rig.clock.now() - 86400
    assert rig.table.create_run(RunInfo(PREVIOUS, "FINISHED", then, then + 600, "20261120"))
    archive = S3RunArchive(shared_clients.client("s3"), aws.bucket)
    before = {"s0": "FAILED", "s1": "COMPLETED", "s2": "COMPLETED"}
    archive.put_summary(
        {"run_id": PREVIOUS, "started_at": then, "sites": {s: {"run_status": v} for s, v in before.items()}}
    )

    hub = rig.hub()
    hub.tick()
    for _ in range(3):
        rec, msg = rig.node_takes()
        if rec.site == "s1":  # fails today, with its reason
            ops.fail_now(rig.table, rec, Reason.ERROR, rig.clock.now(), error="HTTP 500 on page 2")
            rig.queue.delete(msg)
        else:
            rig.node_completes(rec, msg)
    for _ in range(3):
        if hub.executor.finished is None:
            hub.tick()
    assert hub.executor.finished is not None

    (note,) = received(shared_clients, url)
    assert note["TopicArn"] == topic
    assert note["Subject"] == f"gridfleet run {RUN} finished: 1 FAILED (2/3 COMPLETED)"
    text = note["Message"]
    assert "- s1: error: HTTP 500 on page 2" in text
    assert f"since run {PREVIOUS}:" in text and "newly failing (1): s1" in text and "fixed (1): s0" in text
    # The embedded default (AWS is the moto server on 127.0.0.1): the report is the local file.
    assert text.endswith(f"report: {tmp_path / 'runs' / RUN / 'report.html'}")


def test_the_previous_run_is_rebuilt_from_the_table_when_not_archived(shared_clients, aws):
    table = DynamoStateTable(shared_clients.client("dynamodb"), aws.table)
    assert table.create_run(RunInfo("old", "FINISHED", 100.0, 700.0, "20261119"))
    assert table.create_run(RunInfo("new", "RUNNING", 200.0, 800.0, "20261120"))
    archive = S3RunArchive(shared_clients.client("s3"), aws.bucket)
    prev = previous_summary(table, archive, "new")
    assert prev is not None and prev["run_id"] == "old"
    assert previous_summary(table, archive, "old") is None


def test_a_publish_that_fails_is_logged_and_not_raised(shared_clients, caplog):
    gone = f"arn:aws:sns:ap-northeast-2:123456789012:gone-{uuid.uuid4().hex[:8]}"
    ended = {"run_id": "r1", "failed": ["a"], "summary": None}
    assert notify_overdue(shared_clients.client("sns"), gone, ended, 60) == []
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("notify-failed")]
    assert f"channel=sns:{gone}" in line and "NotFound" in line
