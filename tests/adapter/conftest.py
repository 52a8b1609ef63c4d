"""Fixtures for the adapter tests: one moto server per session, fresh resources per test.

The contract suite asks for a `backend` (parametrized "moto" / "memory") and
gets the state table, queue and result store of that backend together with the
few backend-specific helpers a contract test needs: how to let time pass, how to
send a body that is not a site message, and how to look at a stored item as it
is stored.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from fleet.aws.bootstrap import ensure_resources
from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.aws.queue import SqsSiteQueue
from fleet.aws.results import S3ResultStore
from fleet.aws.table import DynamoStateTable
from fleet.clock import FakeClock
from fleet.config.aws import AwsConfig
from fleet.record.partition import NODE_PREFIX
from sim.memory import MemoryQueue, MemoryResults, MemoryStateTable

REGION = "ap-northeast-2"
BACKENDS = ("moto", "memory")


def fresh_names() -> dict[str, str]:
    """Resource names no other test uses (S3 wants lowercase, 3-63 chars)."""
    hx = uuid.uuid4().hex
    return {"table": f"t-{hx}", "queue": f"q-{hx}", "bucket": f"b-{hx}"}


@pytest.fixture
def aws_config(moto_endpoint) -> Callable[..., AwsConfig]:
    """Factory of AwsConfigs on the moto server, with fresh names unless given."""

    def make(**overrides: Any) -> AwsConfig:
        fields: dict[str, Any] = {"endpoint_url": moto_endpoint, "region": REGION, **fresh_names()}
        fields.update(overrides)
        return AwsConfig(**fields)

    return make


def moto_clients(aws: AwsConfig, on_client: tuple[Callable[[str, Any], None], ...] = ()) -> AwsClients:
    return AwsClients(aws, credentials=LOCAL_CREDENTIALS, on_client=on_client)


#: API calls made by the shared moto clients, by operation name.
MOTO_CALLS: dict[str, int] = {}


def _count_calls(service: str, client: Any) -> None:
    def after_call(model: Any, **_: Any) -> None:
        MOTO_CALLS[model.name] = MOTO_CALLS.get(model.name, 0) + 1

    client.meta.events.register(f"after-call.{service}", after_call)


@pytest.fixture(scope="session")
def shared_clients(moto_endpoint) -> AwsClients:
    """One set of moto clients for the session (making boto3 clients is the slow part of a test)."""
    return moto_clients(AwsConfig(endpoint_url=moto_endpoint, region=REGION), on_client=(_count_calls,))


class NamedClients:
    """The shared clients under another AwsConfig: what `ensure_resources` needs of an AwsClients."""

    def __init__(self, clients: AwsClients, aws: AwsConfig):
        self.aws = aws
        self._clients = clients

    def client(self, service: str) -> Any:
        return self._clients.client(service)


@dataclass
class Backend:
    """One implementation of the table, queue and result store, plus what the contract tests need around them."""

    name: str
    table: Any
    queue: Any
    results: Any
    #: A new queue (and DLQ) with its own max_receive_count.
    new_queue: Callable[[int], Any]
    #: Put a raw body (not necessarily a site message) on a queue of this backend.
    send_raw: Callable[[Any, str], None]
    #: The stored item of a site as plain Python values (numbers as Decimal), or None.
    raw_site: Callable[[str, str], dict[str, Any] | None]
    #: Let `seconds` pass for the queue's visibility timeouts.
    elapse: Callable[[float], None]
    #: What a node's UpdateItem can do to any item of the partitions it may write: SET these attributes, of any
    #: DynamoDB type (plain Python values, numbers as Decimal), creating the item if there is none.
    scribble: Callable[[str, str, dict[str, Any]], None] = lambda run_id, site, values: None
    #: API calls made so far, by operation name (moto only; empty for memory).
    calls: dict[str, int] = field(default_factory=dict)


def _moto_backend(shared: AwsClients, make_config: Callable[..., AwsConfig]) -> Backend:
    aws = make_config()
    clients = NamedClients(shared, aws)
    ensure_resources(clients, visibility_timeout_s=30)
    sqs = clients.client("sqs")
    ddb = clients.client("dynamodb")
    de = TypeDeserializer()

    def new_queue(max_receive_count: int) -> SqsSiteQueue:
        other = aws.model_copy(update={"queue": f"q-{uuid.uuid4().hex}", "max_receive_count": max_receive_count})
        ensure_resources(NamedClients(shared, other), visibility_timeout_s=30)
        return SqsSiteQueue(sqs, other.queue, other.dlq_name)

    def send_raw(queue: SqsSiteQueue, body: str) -> None:
        sqs.send_message(QueueUrl=queue.url, MessageBody=body)

    def raw_site(run_id: str, site: str) -> dict[str, Any] | None:
        out = ddb.get_item(TableName=aws.table, Key={"run_id": {"S": run_id}, "Site": {"S": site}}, ConsistentRead=True)
        return {k: de.deserialize(v) for k, v in out["Item"].items()} if "Item" in out else None

    ser = TypeSerializer()

    def scribble(run_id: str, site: str, values: dict[str, Any]) -> None:
        ddb.update_item(
            TableName=aws.table,
            Key={"run_id": {"S": run_id}, "Site": {"S": site}},
            UpdateExpression="SET " + ", ".join(f"#a{n} = :a{n}" for n in range(len(values))),
            ExpressionAttributeNames={f"#a{n}": k for n, k in enumerate(values)},
            ExpressionAttributeValues={f":a{n}": ser.serialize(v) for n, v in enumerate(values.values())},
        )

    return Backend(
        name="moto",
        table=DynamoStateTable(ddb, aws.table),
        queue=SqsSiteQueue(sqs, aws.queue, aws.dlq_name),
        results=S3ResultStore(clients.client("s3"), aws.bucket),
        new_queue=new_queue,
        send_raw=send_raw,
        raw_site=raw_site,
        elapse=time.sleep,
        scribble=scribble,
        calls=MOTO_CALLS,
    )


def _memory_backend() -> Backend:
    clock = FakeClock()
    table = MemoryStateTable()

    def raw_site(run_id: str, site: str) -> dict[str, Any] | None:
        item = table.items.get((run_id, site))
        return dict(item) if item is not None else None

    def scribble(run_id: str, site: str, values: dict[str, Any]) -> None:
        """As DynamoDB takes the UpdateItem: the item made if absent, its index entry and node key kept."""
        item = table.items.setdefault((run_id, site), {"run_id": run_id, "Site": site})
        item.update(values)
        if site.startswith(NODE_PREFIX):
            table._nodes.setdefault(run_id, set()).add(site)
            table._node_keys.pop(run_id, None)
            table._node_info.pop((run_id, site), None)
        elif not site.startswith("#"):
            table._index(run_id, site, item)

    return Backend(
        name="memory",
        table=table,
        queue=MemoryQueue(clock=clock),
        results=MemoryResults(),
        new_queue=lambda n: MemoryQueue(clock=clock, max_receive_count=n),
        send_raw=lambda q, body: q.send_raw(body),
        raw_site=raw_site,
        elapse=clock.advance,
        scribble=scribble,
    )


@pytest.fixture(scope="module")
def limits_table(shared_clients, moto_endpoint) -> str:
    """One state table (made as bootstrap makes it) for the module; each test uses its own group or domain names."""
    aws = AwsConfig(
        endpoint_url=moto_endpoint,
        region=REGION,
        table=f"t-{uuid.uuid4().hex}",
        queue=f"q-{uuid.uuid4().hex}",
        bucket=f"b-{uuid.uuid4().hex}",
    )
    ensure_resources(NamedClients(shared_clients, aws), visibility_timeout_s=30)
    return aws.table


@pytest.fixture(params=BACKENDS)
def backend(request) -> Backend:
    if request.param == "moto":
        return _moto_backend(request.getfixturevalue("shared_clients"), request.getfixturevalue("aws_config"))
    return _memory_backend()


@pytest.fixture
def table(backend):
    return backend.table


@pytest.fixture
def queue(backend):
    return backend.queue


@pytest.fixture
def results(backend):
    return backend.results
