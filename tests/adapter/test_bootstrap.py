"""ensure_resources on a moto server, and the adapters' errors for resources that do not exist."""

from __future__ import annotations

import json

import pytest

from fleet.aws.bootstrap import ensure_resources
from fleet.aws.queue import SqsSiteQueue
from fleet.aws.results import S3ResultStore
from fleet.aws.table import DynamoStateTable
from fleet.errors import MissingResource
from fleet.record.codec import OPEN_ATTR, OPEN_INDEX
from fleet.record.stamp import STAMP_ATTRS

from .conftest import moto_clients


def queue_attributes(sqs, name: str) -> dict[str, str]:
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]


def test_ensure_resources_creates_the_table_the_queues_and_the_bucket(aws_config):
    aws = aws_config(max_receive_count=4)
    clients = moto_clients(aws)

    created = ensure_resources(clients, visibility_timeout_s=45)

    assert created == [
        f"DynamoDB table {aws.table}",
        f"SQS queue {aws.queue}-dlq",
        f"SQS queue {aws.queue} (DLQ {aws.queue}-dlq)",
        f"S3 bucket {aws.bucket}",
    ]
    ddb = clients.client("dynamodb")
    table = ddb.describe_table(TableName=aws.table)["Table"]
    assert table["TableStatus"] == "ACTIVE"
    assert sorted((k["AttributeName"], k["KeyType"]) for k in table["KeySchema"]) == [
        ("Site", "RANGE"),
        ("run_id", "HASH"),
    ]
    # The sparse index of the open sites, carrying what a stamp is made of.
    (index,) = table["LocalSecondaryIndexes"]
    assert index["IndexName"] == OPEN_INDEX
    assert [(k["AttributeName"], k["KeyType"]) for k in index["KeySchema"]] == [
        ("run_id", "HASH"),
        (OPEN_ATTR, "RANGE"),
    ]
    assert index["Projection"]["ProjectionType"] == "INCLUDE"
    assert sorted(index["Projection"]["NonKeyAttributes"]) == sorted(STAMP_ATTRS)
    assert {"AttributeName": OPEN_ATTR, "AttributeType": "S"} in table["AttributeDefinitions"]
    assert not table.get("GlobalSecondaryIndexes")
    ttl = ddb.describe_time_to_live(TableName=aws.table)["TimeToLiveDescription"]
    assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "expireAt")

    sqs = clients.client("sqs")
    dlq = queue_attributes(sqs, aws.dlq_name)
    main = queue_attributes(sqs, aws.queue)
    assert main["VisibilityTimeout"] == "45"
    redrive = json.loads(main["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == dlq["QueueArn"]
    assert int(redrive["maxReceiveCount"]) == 4
    assert dlq["MessageRetentionPeriod"] == "1209600"  # 14 days to look at what went there
    assert "RedrivePolicy" not in dlq

    s3 = clients.client("s3")
    s3.head_bucket(Bucket=aws.bucket)
    assert s3.get_bucket_location(Bucket=aws.bucket)["LocationConstraint"] == aws.region


def test_ensure_resources_is_idempotent(aws_config):
    aws = aws_config()
    clients = moto_clients(aws)
    assert len(ensure_resources(clients, visibility_timeout_s=30)) == 4

    assert ensure_resources(clients, visibility_timeout_s=30) == []
    assert ensure_resources(moto_clients(aws), visibility_timeout_s=30) == []
    DynamoStateTable(clients.client("dynamodb"), aws.table).check_exists()
    SqsSiteQueue(clients.client("sqs"), aws.queue, aws.dlq_name).check_exists()
    S3ResultStore(clients.client("s3"), aws.bucket).check_exists()


def test_ensure_resources_creates_only_what_is_missing(aws_config):
    aws = aws_config()
    ensure_resources(moto_clients(aws), visibility_timeout_s=30)
    other = aws.model_copy(update={"queue": aws.queue + "-2", "dlq": aws.queue + "-dead"})

    created = ensure_resources(moto_clients(other), visibility_timeout_s=30)

    assert created == [f"SQS queue {aws.queue}-dead", f"SQS queue {aws.queue}-2 (DLQ {aws.queue}-dead)"]
    sqs = moto_clients(other).client("sqs")
    redrive = json.loads(queue_attributes(sqs, other.queue)["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == queue_attributes(sqs, other.dlq_name)["QueueArn"]


def test_ensure_resources_in_us_east_1(aws_config):
    aws = aws_config(region="us-east-1")  # the one region whose buckets take no LocationConstraint
    clients = moto_clients(aws)
    assert f"S3 bucket {aws.bucket}" in ensure_resources(clients, visibility_timeout_s=30)
    clients.client("s3").head_bucket(Bucket=aws.bucket)


def test_missing_table(shared_clients):
    table = DynamoStateTable(shared_clients.client("dynamodb"), "absent")
    with pytest.raises(MissingResource, match="DynamoDB table 'absent'"):
        table.check_exists()


def test_missing_queue(shared_clients):
    queue = SqsSiteQueue(shared_clients.client("sqs"), "absent", "absent-dlq")
    with pytest.raises(MissingResource, match="SQS queue 'absent'"):
        queue.check_exists()
    with pytest.raises(MissingResource, match="SQS queue 'absent'"):
        queue.send("r1", "s1", 1)


def test_missing_dead_letter_queue(aws_config, shared_clients):
    aws = aws_config()
    ensure_resources(moto_clients(aws), visibility_timeout_s=30)
    queue = SqsSiteQueue(shared_clients.client("sqs"), aws.queue, "absent-dlq")
    with pytest.raises(MissingResource, match="SQS queue 'absent-dlq'"):
        queue.check_exists()


def test_missing_bucket(shared_clients):
    results = S3ResultStore(shared_clients.client("s3"), "absent-bucket")
    with pytest.raises(MissingResource, match="S3 bucket 'absent-bucket'"):
        results.check_exists()
