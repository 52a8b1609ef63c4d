"""The project's moto server applies DynamoDB's writes atomically, as DynamoDB does.

Many threads race to move one counter on, as nodes claiming a site or taking a rate-limit slot do: with a
conditional UpdateItem (``SET n = n + 1`` on ``n = :seen``), every success must be a distinct step; with an
UpdateItem returning the old value (the rate limiter's queued slot), every caller must be told a distinct one.
With moto's read, check and write unguarded, two threads pass one check, or are told one old value.
"""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from embedded import moto_server
from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.config.aws import AwsConfig
from tests.adapter.conftest import REGION

THREADS, TRIES = 8, 40


@pytest.fixture
def busy_threads():
    """The server's threads are this process's: switching between them every 10 µs, rather than every 5 ms,
    makes the race as likely here as on a busy machine."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


KEY = {"k": {"S": "counter"}}


def counter(moto_endpoint: str) -> tuple[Any, str]:
    c = AwsClients(AwsConfig(endpoint_url=moto_endpoint, region=REGION), credentials=LOCAL_CREDENTIALS).client(
        "dynamodb"
    )
    table = f"race-{uuid.uuid4().hex}"
    c.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    c.put_item(TableName=table, Item={**KEY, "n": {"N": "0"}})
    return c, table


def race(racer: Callable[[], None]) -> None:
    start = threading.Barrier(THREADS)

    def run() -> None:
        start.wait()
        for _ in range(TRIES):
            racer()

    threads = [threading.Thread(target=run) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)


def test_of_racing_conditional_updates_only_one_wins_each_step(moto_endpoint, busy_threads):
    c, table = counter(moto_endpoint)
    won: list[int] = []

    def racer() -> None:
        seen = int(c.get_item(TableName=table, Key=KEY, ConsistentRead=True)["Item"]["n"]["N"])
        try:
            c.update_item(
                TableName=table,
                Key=KEY,
                UpdateExpression="SET n = n + :one",
                ConditionExpression="n = :seen",
                ExpressionAttributeValues={":one": {"N": "1"}, ":seen": {"N": str(seen)}},
            )
        except ClientError as e:
            assert e.response["Error"]["Code"] == "ConditionalCheckFailedException"
            return
        won.append(seen)

    race(racer)
    final = int(c.get_item(TableName=table, Key=KEY, ConsistentRead=True)["Item"]["n"]["N"])
    assert len(won) == len(set(won)) == final  # each step won once, and every success moved the counter


def test_of_racing_updates_each_is_told_the_old_value_it_replaced(moto_endpoint, busy_threads):
    c, table = counter(moto_endpoint)
    told: list[int] = []

    def racer() -> None:
        out = c.update_item(
            TableName=table,
            Key=KEY,
            UpdateExpression="SET n = n + :one",
            ExpressionAttributeValues={":one": {"N": "1"}},
            ReturnValues="UPDATED_OLD",
        )
        told.append(int(out["Attributes"]["n"]["N"]))

    race(racer)
    assert sorted(told) == list(range(THREADS * TRIES))


def test_making_the_writes_atomic_twice_wraps_them_once():
    from moto.dynamodb.responses import DynamoHandler

    moto_server.make_dynamodb_writes_atomic()
    first = DynamoHandler.update_item
    moto_server.make_dynamodb_writes_atomic()
    assert DynamoHandler.update_item is first and first.gridfleet_atomic
    assert first.__wrapped__.__name__ == "update_item"


def test_an_index_key_of_another_type_is_refused_as_dynamodb_refuses_it(moto_endpoint):
    """DynamoDB refuses an UpdateItem that gives a secondary index's key a value of another type than the table
    defines; moto does for an item that exists but stores it in one the write creates, and then every Query of the
    index fails with an internal error. The project's moto refuses both and leaves the items as they were."""
    from fleet.aws.bootstrap import ensure_resources

    hx = uuid.uuid4().hex[:8]
    aws = AwsConfig(endpoint_url=moto_endpoint, region=REGION, table=f"t-{hx}", queue=f"q-{hx}", bucket=f"b-{hx}")
    clients = AwsClients(aws, credentials=LOCAL_CREDENTIALS)
    ensure_resources(clients, 30)
    ddb = clients.client("dynamodb")

    def update(site: str, value: dict[str, Any]) -> None:
        ddb.update_item(
            TableName=aws.table,
            Key={"run_id": {"S": "r"}, "Site": {"S": site}},
            UpdateExpression="SET openSite = :o, pages = :p",
            ExpressionAttributeValues={":o": value, ":p": {"N": "2"}},
        )

    update("kept", {"S": "kept"})
    for site in ("new", "kept"):
        for value in ({"N": "1"}, {"M": {"a": {"S": "x"}}}, {"L": []}, {"SS": ["a"]}, {"BOOL": True}):
            with pytest.raises(ClientError) as refused:
                update(site, value)
            err = refused.value.response["Error"]
            assert err["Code"] == "ValidationException" and "Type mismatch" in err["Message"], err
    assert "Item" not in ddb.get_item(TableName=aws.table, Key={"run_id": {"S": "r"}, "Site": {"S": "new"}})
    out = ddb.query(
        TableName=aws.table,
        IndexName="open",
        KeyConditionExpression="run_id = :r",
        ExpressionAttributeValues={":r": {"S": "r"}},
    )
    assert [i["openSite"] for i in out["Items"]] == [{"S": "kept"}]
