"""The DynamoDB plumbing the state table's parts share: typed items, keys, paginated Queries, batch writes,
conditional updates of the run item. What the items mean is not known here."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from fleet.aws.clients import error_code
from fleet.codec import RUN_ITEM
from fleet.errors import GridfleetError


class DynamoItems:
    """One table, by name, through one boto3 client."""

    BATCH_GET_MAX = 100  # keys per BatchGetItem, DynamoDB's limit
    BATCH_GET_ROUNDS = 8  # retries of UnprocessedKeys before giving up

    def __init__(self, client: Any, table_name: str, page_size: int | None = None):
        self._c = client
        self.name = table_name
        #: Items per Query page (`Limit`); None: as many as fit DynamoDB's 1 MB page.
        self.page_size = page_size
        self._ser = TypeSerializer()
        self._de = TypeDeserializer()

    def _enc(self, item: dict[str, Any]) -> dict[str, Any]:
        return {k: self._ser.serialize(v) for k, v in item.items()}

    def _dec(self, item: dict[str, Any]) -> dict[str, Any]:
        return {k: self._de.deserialize(v) for k, v in item.items()}

    def _key(self, run_id: str, site: str) -> dict[str, Any]:
        return {"run_id": {"S": run_id}, "Site": {"S": site}}

    def _pages(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """The decoded items of a Query, page after page (following LastEvaluatedKey)."""
        kwargs = {"TableName": self.name, "ConsistentRead": True, **kwargs}
        if self.page_size is not None:
            kwargs["Limit"] = self.page_size
        while True:
            page = self._c.query(**kwargs)
            for item in page.get("Items", []):
                yield self._dec(item)
            if "LastEvaluatedKey" not in page:
                return
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _query(self, run_id: str) -> Iterator[dict[str, Any]]:
        return self._pages(KeyConditionExpression="run_id = :r", ExpressionAttributeValues={":r": {"S": run_id}})

    def _update_if(self, run_id: str, **kwargs: Any) -> bool:
        """An UpdateItem of the run item; False when its condition does not hold."""
        try:
            self._c.update_item(TableName=self.name, Key=self._key(run_id, RUN_ITEM), **kwargs)
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def _batch_write(self, requests: list[dict[str, Any]]) -> None:
        """Up to 25 writes, retrying the ones DynamoDB leaves unprocessed (throttling)."""
        for round_ in range(self.BATCH_GET_ROUNDS + 1):
            if round_:
                time.sleep(min(0.05 * 2 ** (round_ - 1), 1.0))
            out = self._c.batch_write_item(RequestItems={self.name: requests})
            requests = (out.get("UnprocessedItems") or {}).get(self.name) or []
            if not requests:
                return
        raise GridfleetError(
            f"DynamoDB table {self.name!r}: {len(requests)} writes still unprocessed after "
            f"{self.BATCH_GET_ROUNDS} retries of BatchWriteItem (throttled?)"
        )
