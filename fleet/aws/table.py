"""The state table on DynamoDB (`fleet.record.table.StateTable`): site records, the run item, node items, history lines,
the run index and the sites' high-water marks, in one table through one boto3 client.

Every write of a site record is conditional on the fence of the record it was computed from (`fence_condition`);
a write that does not hold raises `StaleWrite` with the record as it is now. Reads of a run are a paginated Query
of its partition. The watchdog's writes of the run item are conditional on what it read (`fleet.record.run_item`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Unpack

from botocore.exceptions import ClientError

from fleet.aws.clients import error_code
from fleet.crawl.pacing import PACING_PARTITION_PREFIX, pacing_section
from fleet.errors import GridfleetError, MissingResource, StaleWrite
from fleet.record import run_item
from fleet.record.codec import (
    HELD_PREFIX,
    MARKS_PARTITION,
    OPEN_ATTR,
    OPEN_INDEX,
    item_to_site,
    num,
    site_to_item,
    site_update,
)
from fleet.record.partition import (
    NODE_ATTRS,
    NODE_PREFIX,
    RUN_ITEM,
    RUNS_PARTITION,
    HistoryEvent,
    NodeInfo,
    RunInfo,
    history_to_item,
    hub_partition,
    item_to_run,
    node_to_item,
    run_to_item,
    split_partition,
)
from fleet.record.readback import Notes, UnreadableItem
from fleet.record.run_item import RunFields, RunWatch
from fleet.record.stamp import STAMP_ATTRS, Stamp, item_stamp
from fleet.record.state import RunState, SiteRecord
from fleet.record.table import REPAIR_FENCE, RunIndexEntry, RunRows, mark_of, nodes_of, runs_of

log = logging.getLogger("gridfleet.table")


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
    """One table, by name, through one boto3 client (`StateTable` and `WatchTable`)."""

    BATCH_GET_MAX = 100  # keys per BatchGetItem, DynamoDB's limit
    BATCH_GET_ROUNDS = 8  # retries of UnprocessedKeys before giving up
    _has_open_index: bool | None = None  # whether the table has the index `open`; None: not known yet

    def __init__(self, client: Any, table_name: str, page_size: int | None = None):
        self._c = client
        self.name = table_name
        #: Items per Query page (`Limit`); None: as many as fit DynamoDB's 1 MB page.
        self.page_size = page_size
        from boto3.dynamodb.types import TypeDeserializer, TypeSerializer  # boto3 on first use (fleet.aws.clients)

        self._ser = TypeSerializer()
        self._de = TypeDeserializer()

    def check_exists(self) -> None:
        try:
            self._c.describe_table(TableName=self.name)
        except ClientError as e:
            if error_code(e) == "ResourceNotFoundException":
                raise MissingResource(f"DynamoDB table {self.name!r} does not exist") from None
            raise

    # --- site records ---------------------------------------------------------
    def create_site(self, rec: SiteRecord) -> bool:
        """Seed a site. An item of its key that no hub seeded (no spec: a node's UpdateItem can make one) is taken
        over whole; one a hub seeded is left as it is (False)."""
        try:
            self._c.put_item(
                TableName=self.name,
                Item=self._enc(site_to_item(rec)),
                ConditionExpression="attribute_not_exists(Site) OR attribute_not_exists(#spec)",
                ExpressionAttributeNames={"#spec": "spec"},
            )
            return True
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                return False
            raise

    def get_site(self, run_id: str, site: str) -> SiteRecord | None:
        """The site's record; None when there is none, or none that can be read (`fleet.record.readback`)."""
        out = self._c.get_item(TableName=self.name, Key=self._key(run_id, site), ConsistentRead=True)
        return self._site_or_none(out.get("Item"))

    def _site_or_none(self, item: dict[str, Any] | None) -> SiteRecord | None:
        if not item:
            return None
        try:
            return item_to_site(self._dec(item))
        except UnreadableItem as e:
            Notes().item(e)
            return None

    def write(self, old: SiteRecord, new: SiteRecord) -> SiteRecord:
        sets, removes = site_update(old, new)
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
                current = self._site_or_none(e.response.get("Item"))
                raise StaleWrite(old.run_id, old.site, old.fence(), current) from None
            raise
        return new

    def read_run(self, run_id: str) -> RunRows:
        """Both partitions of the run: its own (sites, node items) and its hub partition (run item, history)."""
        return RunRows.of(split_partition([*self._query(run_id), *self._query(hub_partition(run_id))]))

    def open_stamps(self, run_id: str) -> dict[str, Stamp]:
        """The stamps of the sites that can still change (QUEUED or RUN) but for those still as seeded (the hub's
        own, see `fleet.record.codec.HELD_PREFIX`): a Query of the sparse index `open` below that prefix.

        The index holds only the items carrying OPEN_ATTR, with the few attributes of a stamp, so the read
        costs in proportion to the sites being crawled or waiting in the queue, not to the run. A table made
        before the index existed is read whole instead (and a warning says how to get the index).
        """
        if self._has_open_index is not False:
            try:
                items = list(
                    self._pages(
                        IndexName=OPEN_INDEX,
                        KeyConditionExpression="run_id = :r AND #o < :h",
                        ExpressionAttributeValues={":r": {"S": run_id}, ":h": {"S": HELD_PREFIX}},
                        ProjectionExpression=", ".join(f"#a{i}" for i in range(len(STAMP_ATTRS) + 1)),
                        ExpressionAttributeNames={
                            "#o": OPEN_ATTR,
                            **{f"#a{i}": a for i, a in enumerate(("Site",) + STAMP_ATTRS)},
                        },
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
            if not str(i["Site"]).startswith("#") and not str(i.get(OPEN_ATTR, HELD_PREFIX)).startswith(HELD_PREFIX)
        }

    def has_held(self, run_id: str) -> bool:
        """Whether a site of the run is still as seeded (held by the hub for its feed): one item of the index's
        held range, or of the whole partition on a table without the index."""
        if self._has_open_index is not False:
            try:
                page = self._c.query(
                    TableName=self.name,
                    IndexName=OPEN_INDEX,
                    KeyConditionExpression="run_id = :r AND begins_with(#o, :h)",
                    ExpressionAttributeNames={"#o": OPEN_ATTR},
                    ExpressionAttributeValues={":r": {"S": run_id}, ":h": {"S": HELD_PREFIX}},
                    ProjectionExpression="Site",
                    Limit=1,
                )
                return bool(page.get("Items"))
            except ClientError as e:
                if not self._is_missing_index(e):
                    raise
        return any(str(i.get(OPEN_ATTR, "")).startswith(HELD_PREFIX) for i in self._query(run_id))

    @staticmethod
    def _is_missing_index(e: ClientError) -> bool:
        """A Query naming an index the table does not have. DynamoDB answers ValidationException ("The table
        does not have the specified index"); moto answers ResourceNotFoundException ("Invalid index")."""
        err = e.response.get("Error", {})
        return (
            err.get("Code") in ("ValidationException", "ResourceNotFoundException")
            and "index" in str(err.get("Message", "")).lower()
        )

    def get_sites(self, run_id: str, sites: Iterable[str], notes: Notes | None = None) -> list[SiteRecord]:
        """The records of `sites` (strongly consistent), in the order given; unknown sites are left out, and so are
        those that cannot be read (in `notes`, quarantined)."""
        names = list(sites)
        found: dict[str, SiteRecord] = {}
        notes = notes if notes is not None else Notes()
        unique = list(dict.fromkeys(names))  # a BatchGetItem refuses a key twice
        for start in range(0, len(unique), self.BATCH_GET_MAX):
            keys = [self._key(run_id, s) for s in unique[start : start + self.BATCH_GET_MAX]]
            for item in self._batch_get(keys):
                i = self._dec(item)
                try:
                    rec = item_to_site(i, notes)
                except UnreadableItem as e:
                    notes.item(e, str(i.get("Site")))
                    continue
                found[rec.site] = rec
        return [found[s] for s in names if s in found]

    def repair(self, bad: UnreadableItem, new: SiteRecord) -> bool:
        """Put `new` over a site item that could not be read, if it is still as it was read (its status, fence and
        spec the same values, of whatever type): the hub's repair of a record a node wrote what no one can read
        into. False when it changed in between (the next read decides again)."""
        raw = bad.raw or {}
        names, values, conds = {}, {}, []
        for n, attr in enumerate(REPAIR_FENCE):
            names[f"#k{n}"] = attr
            if attr in raw:
                values[f":k{n}"] = raw[attr]
                conds.append(f"#k{n} = :k{n}")
            else:
                conds.append(f"attribute_not_exists(#k{n})")
        try:
            self._c.put_item(
                TableName=self.name,
                Item=self._enc(site_to_item(new)),
                ConditionExpression=" AND ".join(conds),
                ExpressionAttributeNames=names,
                **({"ExpressionAttributeValues": self._enc(values)} if values else {}),
            )
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def stamp_expiry(self, run_id: str, expire_at: int) -> int:
        """Give every item of the run's partition and of its pacing partition that has no expiry `expire_at` (node
        items, pacing counters, items no hub made): the node role may not write `expireAt`, so the hub does, once
        the run is over. Returns how many it stamped."""
        n = 0
        for partition in (run_id, PACING_PARTITION_PREFIX + run_id):
            for item in self._pages(
                KeyConditionExpression="run_id = :r",
                ExpressionAttributeValues={":r": {"S": partition}},
                ProjectionExpression="run_id, Site, #e",
                ExpressionAttributeNames={"#e": "expireAt"},
            ):
                if "expireAt" in item:
                    continue
                try:
                    self._c.update_item(
                        TableName=self.name,
                        Key=self._key(partition, str(item["Site"])),
                        UpdateExpression="SET #e = :e",
                        ConditionExpression="attribute_exists(Site) AND attribute_not_exists(#e)",
                        ExpressionAttributeNames={"#e": "expireAt"},
                        ExpressionAttributeValues={":e": {"N": str(int(expire_at))}},
                    )
                    n += 1
                except ClientError as e:
                    if error_code(e) != "ConditionalCheckFailedException":
                        raise
        return n

    # --- what outlives runs: incremental high-water marks ------------------------------
    def get_marks(self, sites: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """The high-water marks of `sites` that have one (BatchGetItem on the `#sites` partition)."""
        unique = list(dict.fromkeys(sites))
        out: dict[str, tuple[str, ...]] = {}
        for start in range(0, len(unique), self.BATCH_GET_MAX):
            keys = [self._key(MARKS_PARTITION, s) for s in unique[start : start + self.BATCH_GET_MAX]]
            for item in self._batch_get(keys):
                i = self._dec(item)
                out[str(i["Site"])] = mark_of(i)
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
        return nodes_of(sorted(items, key=lambda i: str(i["Site"])), Notes())

    def read_pacing(self, run_id: str) -> dict[str, dict[str, Any]]:
        """summary.json's `pacing`: the run's counters of each domain (`fleet.aws.pacing`), from their partition."""
        return pacing_section(self._query(PACING_PARTITION_PREFIX + run_id))

    def put_node(self, node: NodeInfo) -> None:
        """The node's item, written as an UpdateItem of its own attributes (what it does not hold now removed): the
        node role may update attributes of items, never put a whole one (infra/terraform, dynamodb:Attributes)."""
        item = node_to_item(node)
        key = {k: item.pop(k) for k in ("run_id", "Site")}
        names = {f"#a{n}": k for n, k in enumerate(NODE_ATTRS)}
        sets = [f"#a{n} = :a{n}" for n, k in enumerate(NODE_ATTRS) if k in item]
        removes = [f"#a{n}" for n, k in enumerate(NODE_ATTRS) if k not in item]
        self._c.update_item(
            TableName=self.name,
            Key=self._enc(key),
            UpdateExpression="SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else ""),
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=self._enc({f":a{n}": item[k] for n, k in enumerate(NODE_ATTRS) if k in item}),
        )

    def add_history(self, events: Sequence[HistoryEvent]) -> None:
        """History lines need no condition (each has its own key): BatchWriteItem, 25 to a call."""
        items = [{"PutRequest": {"Item": self._enc(history_to_item(e))}} for e in events]
        for i in range(0, len(items), 25):
            self._batch_write(items[i : i + 25])

    # --- the run item and the run index --------------------------------------------------------
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
        out = self._c.get_item(TableName=self.name, Key=self._run_key(run_id), ConsistentRead=True)
        return item_to_run(self._dec(out["Item"])) if "Item" in out else None

    def update_run(self, run_id: str, **fields: Unpack[RunFields]) -> None:
        """Set fields of the run item; a field given as None is removed."""
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        update = run_item.assignments(fields, names, values)
        self._c.update_item(
            TableName=self.name,
            Key=self._run_key(run_id),
            UpdateExpression=update,
            ConditionExpression="attribute_exists(Site)",
            ExpressionAttributeNames=names,
            **({"ExpressionAttributeValues": self._enc(values)} if values else {}),
        )

    # --- the watchdog's bookkeeping on the run item ------------------------------------
    def get_run_watch(self, run_id: str) -> RunWatch | None:
        out = self._c.get_item(TableName=self.name, Key=self._run_key(run_id), ConsistentRead=True)
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
            Key=self._run_key(run_id),
            UpdateExpression="ADD nodes_launched :n",
            ConditionExpression="attribute_exists(Site)",
            ExpressionAttributeValues={":n": {"N": str(count)}},
        )

    def list_runs(self) -> list[RunIndexEntry]:
        return runs_of(self._query(RUNS_PARTITION))

    # --- DynamoDB plumbing: typed items, keys, paginated Queries, batch writes ------------------
    def _enc(self, item: dict[str, Any]) -> dict[str, Any]:
        return {k: self._ser.serialize(v) for k, v in item.items()}

    def _dec(self, item: dict[str, Any]) -> dict[str, Any]:
        return {k: self._de.deserialize(v) for k, v in item.items()}

    def _key(self, run_id: str, site: str) -> dict[str, Any]:
        return {"run_id": {"S": run_id}, "Site": {"S": site}}

    def _run_key(self, run_id: str) -> dict[str, Any]:
        return self._key(hub_partition(run_id), RUN_ITEM)

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
            self._c.update_item(TableName=self.name, Key=self._run_key(run_id), **kwargs)
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


def wait_table_active(client: Any, name: str, timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if client.describe_table(TableName=name)["Table"]["TableStatus"] == "ACTIVE":
            return
        time.sleep(0.2)
    raise MissingResource(f"DynamoDB table {name!r} did not become ACTIVE in {timeout_s:.0f}s")
