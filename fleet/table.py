"""The state table (DynamoDB): site records, the run item, node items, the run index.

Every write of a site record is conditional on the fence of the record it was
computed from (version, attemptCount, instance_id): a writer that lost a race,
or a zombie node, gets `StaleWrite` carrying the record as it is now, and its
write is not applied. Reads of a run are a paginated Query of its partition.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from fleet.aws import error_code
from fleet.codec import (
    RUN_ITEM, RUNS_PARTITION, HistoryEvent, NodeInfo, RunInfo, diff_items, history_to_item, item_to_run,
    item_to_site, node_to_item, num, run_to_item, site_to_item, split_partition,
)
from fleet.errors import MissingResource, StaleWrite
from fleet.state import SiteRecord


@dataclass(frozen=True)
class RunRows:
    run: RunInfo | None
    sites: list[SiteRecord]
    nodes: list[NodeInfo]
    history: list[HistoryEvent] = field(default_factory=list)


@dataclass(frozen=True)
class RunIndexEntry:
    run_id: str
    started_at: float


class StateTable(Protocol):
    def create_site(self, rec: SiteRecord) -> bool: ...
    def get_site(self, run_id: str, site: str) -> SiteRecord | None: ...
    def write(self, old: SiteRecord, new: SiteRecord) -> SiteRecord: ...
    def read_run(self, run_id: str) -> RunRows: ...
    def create_run(self, run: RunInfo) -> bool: ...
    def get_run(self, run_id: str) -> RunInfo | None: ...
    def update_run(self, run_id: str, **fields: Any) -> None: ...
    def add_launched(self, run_id: str, count: int) -> None: ...
    def put_node(self, node: NodeInfo) -> None: ...
    def add_history(self, event: HistoryEvent) -> None: ...
    def list_runs(self) -> list[RunIndexEntry]: ...


_RUN_FIELDS = {"status": "status", "hub_id": "hub_id", "hub_heartbeat": "hub_heartbeat",
               "finished_at": "finished_at", "expire_at": "expireAt", "deadline_at": "deadline_at",
               "launch_failures": "launch_failures", "launch_error": "launch_error",
               "launch_retry_at": "launch_retry_at", "reruns": "reruns"}


def fence_condition(old: SiteRecord) -> tuple[str, dict[str, Any], dict[str, str]]:
    """ConditionExpression (with values and names) that holds only while `old` is current."""
    names = {"#v": "version", "#a": "attemptCount", "#i": "instance_id"}
    values: dict[str, Any] = {":fv": num(old.version), ":fa": num(old.attempt)}
    expr = "#v = :fv AND #a = :fa AND "
    if old.instance_id is None:
        expr += "attribute_not_exists(#i)"
    else:
        expr += "#i = :fi"
        values[":fi"] = old.instance_id
    return expr, values, names


class DynamoStateTable:
    def __init__(self, client: Any, table_name: str):
        self._c = client
        self.name = table_name
        self._ser = TypeSerializer()
        self._de = TypeDeserializer()

    # --- codec helpers ------------------------------------------------------
    def _enc(self, item: dict[str, Any]) -> dict[str, Any]:
        return {k: self._ser.serialize(v) for k, v in item.items()}

    def _dec(self, item: dict[str, Any]) -> dict[str, Any]:
        return {k: self._de.deserialize(v) for k, v in item.items()}

    def _key(self, run_id: str, site: str) -> dict[str, Any]:
        return {"run_id": {"S": run_id}, "Site": {"S": site}}

    def check_exists(self) -> None:
        try:
            self._c.describe_table(TableName=self.name)
        except ClientError as e:
            if error_code(e) == "ResourceNotFoundException":
                raise MissingResource(f"DynamoDB table {self.name!r} does not exist") from None
            raise

    # --- site records ---------------------------------------------------------
    def create_site(self, rec: SiteRecord) -> bool:
        try:
            self._c.put_item(
                TableName=self.name, Item=self._enc(site_to_item(rec)),
                ConditionExpression="attribute_not_exists(Site)",
            )
            return True
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                return False
            raise

    def get_site(self, run_id: str, site: str) -> SiteRecord | None:
        out = self._c.get_item(TableName=self.name, Key=self._key(run_id, site), ConsistentRead=True)
        return item_to_site(self._dec(out["Item"])) if "Item" in out else None

    def write(self, old: SiteRecord, new: SiteRecord) -> SiteRecord:
        sets, removes = diff_items(site_to_item(old), site_to_item(new))
        if not sets and not removes:
            sets = {"version": num(old.version)}  # nothing to change, but the fence must still hold
        cond, values, names = fence_condition(old)
        parts, n = [], 0
        for k, v in sets.items():
            n += 1
            names[f"#s{n}"] = k
            values[f":s{n}"] = v
            parts.append(f"#s{n} = :s{n}")
        expr = ("SET " + ", ".join(parts)) if parts else ""
        if removes:
            rm = []
            for k in removes:
                n += 1
                names[f"#r{n}"] = k
                rm.append(f"#r{n}")
            expr += (" " if expr else "") + "REMOVE " + ", ".join(rm)
        try:
            self._c.update_item(
                TableName=self.name, Key=self._key(old.run_id, old.site), UpdateExpression=expr,
                ConditionExpression=cond, ExpressionAttributeNames=names,
                ExpressionAttributeValues=self._enc(values),
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                item = e.response.get("Item")
                current = item_to_site(self._dec(item)) if item else None
                raise StaleWrite(old.run_id, old.site, old.fence(), current) from None
            raise
        return new

    # --- the run partition ------------------------------------------------------
    def _query(self, run_id: str) -> Iterator[dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "TableName": self.name, "KeyConditionExpression": "run_id = :r",
            "ExpressionAttributeValues": {":r": {"S": run_id}}, "ConsistentRead": True,
        }
        while True:
            page = self._c.query(**kwargs)
            for item in page.get("Items", []):
                yield self._dec(item)
            if "LastEvaluatedKey" not in page:
                return
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def read_run(self, run_id: str) -> RunRows:
        return RunRows(*split_partition(self._query(run_id)))

    def create_run(self, run: RunInfo) -> bool:
        try:
            self._c.put_item(TableName=self.name, Item=self._enc(run_to_item(run)),
                             ConditionExpression="attribute_not_exists(Site)")
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                return False
            raise
        self._c.put_item(TableName=self.name, Item=self._enc(
            {"run_id": RUNS_PARTITION, "Site": run.run_id, "started_at": num(run.started_at)}))
        return True

    def get_run(self, run_id: str) -> RunInfo | None:
        out = self._c.get_item(TableName=self.name, Key=self._key(run_id, RUN_ITEM), ConsistentRead=True)
        return item_to_run(self._dec(out["Item"])) if "Item" in out else None

    def update_run(self, run_id: str, **fields: Any) -> None:
        """Set fields of the run item; a field given as None is removed."""
        names, values, parts, removes = {}, {}, [], []
        for i, (k, v) in enumerate(fields.items()):
            names[f"#f{i}"] = _RUN_FIELDS[k]
            if v is None:
                removes.append(f"#f{i}")
                continue
            values[f":f{i}"] = num(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
            parts.append(f"#f{i} = :f{i}")
        update = ("SET " + ", ".join(parts) if parts else "") + (" REMOVE " + ", ".join(removes) if removes else "")
        self._c.update_item(
            TableName=self.name, Key=self._key(run_id, RUN_ITEM), UpdateExpression=update.strip(),
            ConditionExpression="attribute_exists(Site)", ExpressionAttributeNames=names,
            ExpressionAttributeValues=self._enc(values),
        )

    def add_launched(self, run_id: str, count: int) -> None:
        self._c.update_item(
            TableName=self.name, Key=self._key(run_id, RUN_ITEM), UpdateExpression="ADD nodes_launched :n",
            ConditionExpression="attribute_exists(Site)", ExpressionAttributeValues={":n": {"N": str(count)}},
        )

    def put_node(self, node: NodeInfo) -> None:
        self._c.put_item(TableName=self.name, Item=self._enc(node_to_item(node)))

    def add_history(self, event: HistoryEvent) -> None:
        self._c.put_item(TableName=self.name, Item=self._enc(history_to_item(event)))

    def list_runs(self) -> list[RunIndexEntry]:
        out = [RunIndexEntry(i["Site"], float(i.get("started_at", 0))) for i in self._query(RUNS_PARTITION)]
        return sorted(out, key=lambda e: e.started_at)


def wait_table_active(client: Any, name: str, timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if client.describe_table(TableName=name)["Table"]["TableStatus"] == "ACTIVE":
            return
        time.sleep(0.2)
    raise MissingResource(f"DynamoDB table {name!r} did not become ACTIVE in {timeout_s:.0f}s")
