"""The run item and the run index in DynamoDB: the hub's writes of its run, the watchdog's conditional
bookkeeping on it (`fleet.aws.run_item`), and the index of runs (one item per run, partition `#runs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Unpack

from botocore.exceptions import ClientError

from fleet.aws import run_item
from fleet.aws.clients import error_code
from fleet.aws.dynamo import DynamoItems
from fleet.aws.run_item import RunFields, RunWatch
from fleet.codec import RUN_ITEM, RUNS_PARTITION, RunInfo, item_to_run, num, run_to_item
from fleet.state import RunState


@dataclass(frozen=True)
class RunIndexEntry:
    run_id: str
    started_at: float


class RunTable(DynamoItems):
    """The run-level reads and writes of the state table."""

    def create_run(self, run: RunInfo) -> bool:
        try:
            self._c.put_item(
                TableName=self.name, Item=self._enc(run_to_item(run)), ConditionExpression="attribute_not_exists(Site)"
            )
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                return False
            raise
        self._c.put_item(
            TableName=self.name,
            Item=self._enc({"run_id": RUNS_PARTITION, "Site": run.run_id, "started_at": num(run.started_at)}),
        )
        return True

    def get_run(self, run_id: str) -> RunInfo | None:
        out = self._c.get_item(TableName=self.name, Key=self._key(run_id, RUN_ITEM), ConsistentRead=True)
        return item_to_run(self._dec(out["Item"])) if "Item" in out else None

    def update_run(self, run_id: str, **fields: Unpack[RunFields]) -> None:
        """Set fields of the run item; a field given as None is removed."""
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        update = run_item.assignments(fields, names, values)
        self._c.update_item(
            TableName=self.name,
            Key=self._key(run_id, RUN_ITEM),
            UpdateExpression=update,
            ConditionExpression="attribute_exists(Site)",
            ExpressionAttributeNames=names,
            **({"ExpressionAttributeValues": self._enc(values)} if values else {}),
        )

    # --- the watchdog's bookkeeping on the run item ------------------------------------
    def get_run_watch(self, run_id: str) -> RunWatch | None:
        out = self._c.get_item(TableName=self.name, Key=self._key(run_id, RUN_ITEM), ConsistentRead=True)
        return run_item.item_to_watch(self._dec(out["Item"])) if "Item" in out else None

    def running_runs(self, last: int) -> list[RunWatch]:
        """The RUNNING runs among the `last` runs of the run index, oldest first."""
        found = (self.get_run_watch(e.run_id) for e in self.list_runs()[-last:])
        return [w for w in found if w is not None and w.run.status is RunState.RUNNING]

    def update_watch(self, run_id: str, expect: run_item.RunExpect, **fields: Unpack[run_item.WatchFields]) -> bool:
        """Set the watchdog's `fields` if the run item is as `expect` says; False if it is not, or is missing."""
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        update, cond = run_item.assignments(fields, names, values), run_item.expectations(expect, names, values)
        return self._update_if(
            run_id,
            UpdateExpression=update,
            ConditionExpression=cond,
            ExpressionAttributeNames=names,
            **({"ExpressionAttributeValues": self._enc(values)} if values else {}),
        )

    def add_hub_start(self, run_id: str) -> None:
        """Count a hub started for the run (nothing while the run has no item yet: its hub creates it)."""
        self._update_if(
            run_id,
            UpdateExpression="ADD #n :one",
            ConditionExpression="attribute_exists(Site)",
            ExpressionAttributeNames={"#n": run_item.HUB_STARTS},
            ExpressionAttributeValues={":one": {"N": "1"}},
        )

    def add_launched(self, run_id: str, count: int) -> None:
        self._c.update_item(
            TableName=self.name,
            Key=self._key(run_id, RUN_ITEM),
            UpdateExpression="ADD nodes_launched :n",
            ConditionExpression="attribute_exists(Site)",
            ExpressionAttributeValues={":n": {"N": str(count)}},
        )

    def list_runs(self) -> list[RunIndexEntry]:
        out = [RunIndexEntry(i["Site"], float(i.get("started_at", 0))) for i in self._query(RUNS_PARTITION)]
        return sorted(out, key=lambda e: e.started_at)
