"""The three stores a run lives in (state table, site queue, result bucket), built in one place."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.aws.clients import AwsClients
from fleet.aws.queue import SqsSiteQueue
from fleet.aws.results import S3ResultStore
from fleet.aws.table import DynamoStateTable
from fleet.config.aws import AwsConfig


@dataclass(frozen=True)
class Stores:
    table: DynamoStateTable
    queue: SqsSiteQueue
    results: S3ResultStore


def open_stores(clients: AwsClients, aws: AwsConfig) -> Stores:
    """The run's table, queue and bucket as `aws` names them, through `clients` (nothing is called yet)."""
    return Stores(
        table=DynamoStateTable(clients.client("dynamodb"), aws.table),
        queue=SqsSiteQueue(clients.client("sqs"), aws.queue_name, aws.dlq_name),
        results=S3ResultStore(clients.client("s3"), aws.bucket),
    )
