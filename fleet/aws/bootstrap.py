"""Create the table, the queue with its DLQ, and the bucket where they are missing.

Idempotent. Used by the embedded default on its moto server; on a real account
the Terraform in infra/ owns these resources.
"""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import ClientError

from fleet.aws.clients import AwsClients, error_code
from fleet.aws.table import wait_table_active
from fleet.record.codec import OPEN_ATTR, OPEN_INDEX
from fleet.record.stamp import STAMP_ATTRS

#: The attributes the index `open` carries besides the keys: those of a stamp (`fleet.record.codec.item_stamp`).
OPEN_INDEX_ATTRIBUTES = STAMP_ATTRS


def ensure_resources(clients: AwsClients, visibility_timeout_s: int) -> list[str]:
    """Create what is missing; return a line per resource created."""
    aws = clients.aws
    created: list[str] = []
    if _ensure_table(clients.client("dynamodb"), aws.table):
        created.append(f"DynamoDB table {aws.table}")
    sqs = clients.client("sqs")
    # FIFO (aws.queue_fifo): both queues, since a FIFO queue's DLQ must be one; deduplication by the ids the
    # senders give (those of a site's attempt, fleet.aws.queue.dedup_id), never by content.
    fifo = {"FifoQueue": "true", "ContentBasedDeduplication": "false"} if aws.queue_fifo else {}
    dlq_url, new_dlq = _ensure_queue(sqs, aws.dlq_name, {"MessageRetentionPeriod": "1209600", **fifo})
    if new_dlq:
        created.append(f"SQS queue {aws.dlq_name}")
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    attrs = {
        "VisibilityTimeout": str(int(visibility_timeout_s)),
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": aws.max_receive_count}),
        **fifo,
    }
    if _ensure_queue(sqs, aws.queue_name, attrs)[1]:
        created.append(f"SQS queue {aws.queue_name} (DLQ {aws.dlq_name})")
    if _ensure_bucket(clients.client("s3"), aws.bucket, aws.region):
        created.append(f"S3 bucket {aws.bucket}")
    return created


def _ensure_table(ddb: Any, name: str) -> bool:
    try:
        ddb.describe_table(TableName=name)
        return False
    except ClientError as e:
        if error_code(e) != "ResourceNotFoundException":
            raise
    ddb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "run_id", "KeyType": "HASH"}, {"AttributeName": "Site", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "run_id", "AttributeType": "S"},
            {"AttributeName": "Site", "AttributeType": "S"},
            {"AttributeName": OPEN_ATTR, "AttributeType": "S"},
        ],
        # The sparse index of the sites that can still change (only they carry OPEN_ATTR), with what their
        # stamps are made of: the hub's read of what moved. A local index, so that read can be consistent.
        LocalSecondaryIndexes=[
            {
                "IndexName": OPEN_INDEX,
                "KeySchema": [
                    {"AttributeName": "run_id", "KeyType": "HASH"},
                    {"AttributeName": OPEN_ATTR, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": list(OPEN_INDEX_ATTRIBUTES)},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    wait_table_active(ddb, name)
    ddb.update_time_to_live(TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expireAt"})
    return True


def _ensure_queue(sqs: Any, name: str, attrs: dict[str, str]) -> tuple[str, bool]:
    try:
        return sqs.get_queue_url(QueueName=name)["QueueUrl"], False
    except ClientError as e:
        if error_code(e) not in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"):
            raise
    return sqs.create_queue(QueueName=name, Attributes=attrs)["QueueUrl"], True


def _ensure_bucket(s3: Any, name: str, region: str) -> bool:
    try:
        s3.head_bucket(Bucket=name)
        return False
    except ClientError as e:
        if error_code(e) not in ("404", "NoSuchBucket", "NotFound"):
            raise
    kwargs: dict[str, Any] = {"Bucket": name}
    if region != "us-east-1":
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    s3.create_bucket(**kwargs)
    return True
