"""The state table (DynamoDB): site records, the run item, node items, the run index.

Every write of a site record is conditional on the fence of the record it was
computed from (version, attemptCount, instance_id): a writer that lost a race,
or a zombie node, gets `StaleWrite` carrying the record as it is now, and its
write is not applied. Reads of a run are a paginated Query of its partition.
The run item also carries the watchdog's bookkeeping (`fleet.aws.run_item`),
changed only by writes conditional on what the watchdog read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Unpack

from botocore.exceptions import ClientError

from fleet.aws import run_item
from fleet.aws.clients import error_code
from fleet.aws.run_item import RunFields, RunWatch
from fleet.aws.run_table import RunIndexEntry, RunTable
from fleet.codec import (
    MARKS_PARTITION,
    NODE_PREFIX,
    OPEN_ATTR,
    OPEN_INDEX,
    HistoryEvent,
    NodeInfo,
    RunInfo,
    diff_items,
    history_to_item,
    item_to_node,
    item_to_site,
    node_to_item,
    num,
    site_to_item,
    split_partition,
)
from fleet.errors import GridfleetError, MissingResource, StaleWrite
from fleet.stamp import STAMP_ATTRS, Stamp, item_stamp
from fleet.state import SiteRecord

log = logging.getLogger("gridfleet.table")


@dataclass(frozen=True)
class RunRows:
    run: RunInfo | None
    sites: list[SiteRecord]
    nodes: list[NodeInfo]
    history: list[HistoryEvent] = field(default_factory=list)


class StateTable(Protocol):
    def create_site(self, rec: SiteRecord) -> bool: ...
    def get_site(self, run_id: str, site: str) -> SiteRecord | None: ...
    def write(self, old: SiteRecord, new: SiteRecord) -> SiteRecord: ...
    def read_run(self, run_id: str) -> RunRows: ...
    def open_stamps(self, run_id: str) -> dict[str, Stamp]: ...
    def get_sites(self, run_id: str, sites: Iterable[str]) -> list[SiteRecord]: ...
    def read_nodes(self, run_id: str) -> list[NodeInfo]: ...
    def create_run(self, run: RunInfo) -> bool: ...
    def get_run(self, run_id: str) -> RunInfo | None: ...
    def update_run(self, run_id: str, **fields: Unpack[RunFields]) -> None: ...
    def add_launched(self, run_id: str, count: int) -> None: ...
    def put_node(self, node: NodeInfo) -> None: ...
    def add_history(self, events: Sequence[HistoryEvent]) -> None: ...
    def list_runs(self) -> list[RunIndexEntry]: ...
    def get_marks(self, sites: Iterable[str]) -> dict[str, tuple[str, ...]]: ...
    def put_mark(self, site: str, mark: tuple[str, ...], run_id: str, at: float) -> None: ...


class WatchTable(StateTable, Protocol):
    """The state table as the Lambdas use it: the hub's API, and the watchdog's bookkeeping on the run item."""

    def get_run_watch(self, run_id: str) -> RunWatch | None: ...
    def running_runs(self, last: int) -> list[RunWatch]: ...
    def update_watch(self, run_id: str, expect: run_item.RunExpect, **fields: Unpack[run_item.WatchFields]) -> bool: ...
    def add_hub_start(self, run_id: str) -> None: ...


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


class DynamoStateTable(RunTable):
    """The state table: site records, node items and history here; the run item and the run index in
    `RunTable`."""

    _has_open_index: bool | None = None  # whether the table has the index `open`; None: not known yet

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
                TableName=self.name,
                Item=self._enc(site_to_item(rec)),
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
                TableName=self.name,
                Key=self._key(old.run_id, old.site),
                UpdateExpression=expr,
                ConditionExpression=cond,
                ExpressionAttributeNames=names,
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

    def read_run(self, run_id: str) -> RunRows:
        return RunRows(*split_partition(self._query(run_id)))

    def open_stamps(self, run_id: str) -> dict[str, Stamp]:
        """The stamps of the sites that can still change (QUEUED or RUN): a Query of the sparse index `open`.

        The index holds only the items carrying OPEN_ATTR, with the few attributes of a stamp, so the read
        costs in proportion to the open sites, not to the run. A table made before the index existed is
        read whole instead (and a warning says how to get the index).
        """
        if self._has_open_index is not False:
            try:
                items = list(
                    self._pages(
                        IndexName=OPEN_INDEX,
                        KeyConditionExpression="run_id = :r",
                        ExpressionAttributeValues={":r": {"S": run_id}},
                        ProjectionExpression=", ".join(f"#a{i}" for i in range(len(STAMP_ATTRS) + 1)),
                        ExpressionAttributeNames={f"#a{i}": a for i, a in enumerate(("Site",) + STAMP_ATTRS)},
                    )
                )
            except ClientError as e:
                if not self._is_missing_index(e):
                    raise
                self._has_open_index = False
                log.warning(
                    "DynamoDB table %r has no index %r: each read of the open sites reads the whole run; "
                    "recreate the table (`gridfleet aws bootstrap`, or infra/terraform) for the cheaper read",
                    self.name,
                    OPEN_INDEX,
                )
            else:
                self._has_open_index = True
                return {i["Site"]: item_stamp(i) for i in items}
        return {
            i["Site"]: item_stamp(i)
            for i in self._query(run_id)
            if not str(i["Site"]).startswith("#") and OPEN_ATTR in i
        }

    @staticmethod
    def _is_missing_index(e: ClientError) -> bool:
        """A Query naming an index the table does not have. DynamoDB answers ValidationException ("The table
        does not have the specified index"); moto answers ResourceNotFoundException ("Invalid index")."""
        err = e.response.get("Error", {})
        return (
            err.get("Code") in ("ValidationException", "ResourceNotFoundException")
            and "index" in str(err.get("Message", "")).lower()
        )

    def get_sites(self, run_id: str, sites: Iterable[str]) -> list[SiteRecord]:
        """The records of `sites` (strongly consistent), in the order given; unknown sites are left out."""
        names = list(sites)
        found: dict[str, SiteRecord] = {}
        unique = list(dict.fromkeys(names))  # a BatchGetItem refuses a key twice
        for start in range(0, len(unique), self.BATCH_GET_MAX):
            keys = [self._key(run_id, s) for s in unique[start : start + self.BATCH_GET_MAX]]
            for item in self._batch_get(keys):
                rec = item_to_site(self._dec(item))
                found[rec.site] = rec
        return [found[s] for s in names if s in found]

    # --- what outlives runs: incremental high-water marks ------------------------------
    def get_marks(self, sites: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """The high-water marks of `sites` that have one (BatchGetItem on the `#sites` partition)."""
        unique = list(dict.fromkeys(sites))
        out: dict[str, tuple[str, ...]] = {}
        for start in range(0, len(unique), self.BATCH_GET_MAX):
            keys = [self._key(MARKS_PARTITION, s) for s in unique[start : start + self.BATCH_GET_MAX]]
            for item in self._batch_get(keys):
                i = self._dec(item)
                out[i["Site"]] = tuple(i.get("mark") or ())
        return out

    def put_mark(self, site: str, mark: tuple[str, ...], run_id: str, at: float) -> None:
        self._c.put_item(
            TableName=self.name,
            Item=self._enc({"run_id": MARKS_PARTITION, "Site": site, "mark": list(mark), "run": run_id, "at": num(at)}),
        )

    def _batch_get(self, keys: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The items of up to 100 keys, retrying the keys DynamoDB leaves unprocessed (throttling, 16 MB)."""
        for round_ in range(self.BATCH_GET_ROUNDS + 1):
            if round_:
                time.sleep(min(0.05 * 2 ** (round_ - 1), 1.0))
            out = self._c.batch_get_item(RequestItems={self.name: {"Keys": keys, "ConsistentRead": True}})
            yield from out.get("Responses", {}).get(self.name, [])
            keys = ((out.get("UnprocessedKeys") or {}).get(self.name) or {}).get("Keys") or []
            if not keys:
                return
        raise GridfleetError(
            f"DynamoDB table {self.name!r}: {len(keys)} keys still unprocessed after "
            f"{self.BATCH_GET_ROUNDS} retries of BatchGetItem (throttled?)"
        )

    def read_nodes(self, run_id: str) -> list[NodeInfo]:
        """The run's node items, by key."""
        items = self._pages(
            KeyConditionExpression="run_id = :r AND begins_with(#k, :p)",
            ExpressionAttributeNames={"#k": "Site"},
            ExpressionAttributeValues={":r": {"S": run_id}, ":p": {"S": NODE_PREFIX}},
        )
        return [item_to_node(i) for i in sorted(items, key=lambda i: i["Site"])]

    def put_node(self, node: NodeInfo) -> None:
        self._c.put_item(TableName=self.name, Item=self._enc(node_to_item(node)))

    def add_history(self, events: Sequence[HistoryEvent]) -> None:
        """History lines need no condition (each has its own key): BatchWriteItem, 25 to a call."""
        items = [{"PutRequest": {"Item": self._enc(history_to_item(e))}} for e in events]
        for i in range(0, len(items), 25):
            self._batch_write(items[i : i + 25])


def wait_table_active(client: Any, name: str, timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if client.describe_table(TableName=name)["Table"]["TableStatus"] == "ACTIVE":
            return
        time.sleep(0.2)
    raise MissingResource(f"DynamoDB table {name!r} did not become ACTIVE in {timeout_s:.0f}s")
