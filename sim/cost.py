"""What a simulated run's state and requests cost: bytes, DynamoDB request units and S3 requests, in dollars.

`Meter` is called after each adapter call the hub and nodes make (beside the
call counting of `engine.Counted`) and prices it as AWS would bill it
(`sim.units`): a site record write by the size of its item as `fleet.record.codec`
encodes it (an update by the larger of the item before and after), a read by
the size of what it returned, an S3 request by its kind. Items that are not
site records (the run item, node items, history lines, marks) are each under a
kilobyte and count one unit. The state of a site is what its checkpoints wrote:
the record's `checkpoint` attribute at each checkpoint write, and the part
objects beside the result (`fleet.outputs.checkpoint`).

`SimResults` is the result store of the simulation: it keeps each object's size
and not its bytes (the results and parts of 10,000 sites would not fit), and
gives the hub a small body when it exports a result.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from fleet.outputs.results import PROMOTED
from fleet.record.codec import encode_checkpoint, site_to_item
from fleet.record.state import SiteRecord
from sim import units
from sim.memory import MemoryResults, MemoryStateTable

STAMP_BYTES = 150  # a stamp of the open index (its projection: a dozen small attributes)
NODE_ITEM_BYTES = 400  # a node item with its counters
OTHER_ITEM_BYTES = 300  # the run item, a history line


class SimResults(MemoryResults):
    """Object sizes, not bytes: a result reads back as `{}` (the hub's export), a part as `[]`. What nodes write goes
    through `put_new` (`put_staged` is it), and `promote` keeps the size of what it copies."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: dict[str, int] = {}

    def put_new(self, key: str, body: bytes) -> bool:
        if not super().put_new(key, b"[]" if "/parts/" in key else b"{}"):
            return False
        self.sizes[key] = len(body)
        return True

    def promote(self, staged: str, key: str) -> str:
        answer = super().promote(staged, key)
        if answer == PROMOTED:
            self.sizes[key] = self.sizes.get(staged, 0)
        return answer


class Meter:
    """Bytes, units and requests of the calls made through `engine.Counted(..., meter=...)`."""

    def __init__(self, results: SimResults, table: MemoryStateTable | None = None):
        self.results = results
        self.records = table  # the in-memory table: its items are sized without encoding again, its writes by delta
        self.stored = table.items if table is not None else None
        self.n: Counter[str] = Counter()  # write_units, read_units, s3_put, s3_get, s3_put_bytes, s3_get_bytes, state_*
        self._size: dict[tuple[str, str], int] = {}  # the last size of each site record written or read
        # per stored item, each attribute's value and size: the table replaces only the attributes a write
        # changes, so an attribute whose value is the same object is not sized again
        self._attrs: dict[tuple[str, str], dict[str, tuple[Any, int]]] = {}

    def size(self, rec: SiteRecord, stored: bool = True) -> int:
        """The item size of `rec` as the table holds it (`stored`: the table's item is `rec`'s, just written or
        read), else as `fleet.record.codec` encodes it."""
        key = (rec.run_id, rec.site)
        item = self.stored.get(key) if stored and self.stored is not None else None
        if item is None:
            s = units.item_size(site_to_item(rec))
        else:
            sized, s = self._attrs.setdefault(key, {}), 0
            for name, value in item.items():
                hit = sized.get(name)
                if hit is None or hit[0] is not value:
                    hit = sized[name] = (value, units.attribute_size(name, value))
                s += hit[1]
        self._size[key] = s
        return s

    def _resized(self, key: tuple[str, str], sets: dict[str, Any], removes: list[str]) -> int:
        """The size of a stored item after a write that SET `sets` and REMOVEd `removes`: only those sized again."""
        sized, s = self._attrs[key], self._size[key]
        for name, value in sets.items():
            hit = sized.get(name)
            s -= hit[1] if hit is not None else 0
            hit = sized[name] = (value, units.attribute_size(name, value))
            s += hit[1]
        for name in removes:
            hit = sized.pop(name, None)
            s -= hit[1] if hit is not None else 0
        self._size[key] = s
        return s

    def _read(self, size: int) -> None:
        self.n["read_units"] += units.read_units(size)  # type: ignore[assignment]  # a Counter adds fractions too

    def table(self, name: str, args: tuple, kwargs: dict, result: Any) -> None:
        n = self.n
        if name == "write":
            old, new = args[0], args[1]
            key = (old.run_id, old.site)
            before = self._size.get(key) or self.size(old, stored=False)
            last = self.records.last_write if self.records is not None else None
            if last is not None and last[0] == key and key in self._attrs and key in self._size:
                after = self._resized(key, last[1], last[2])
            else:
                after = self.size(new)
            wu = units.write_units(max(before, after))
            n["write_units"] += wu
            if new.checkpoint is not None and new.checkpoint != old.checkpoint:
                n["state_write_units"] += wu
                n["state_bytes"] += len("checkpoint") + len(encode_checkpoint(new.checkpoint))
        elif name == "create_site":
            n["write_units"] += units.write_units(self.size(args[0]))
        elif name == "get_site":
            self._read(self.size(result) if result is not None else 1)
        elif name == "get_sites":
            for rec in result:
                self._read(self.size(rec))
        elif name == "read_run":
            sizes = sum(self.size(r) for r in result.sites)
            self._read(sizes + NODE_ITEM_BYTES * len(result.nodes) + OTHER_ITEM_BYTES * (len(result.history) + 1))
        elif name == "open_stamps":
            self._read(STAMP_BYTES * len(result))
        elif name == "read_nodes":
            self._read(NODE_ITEM_BYTES * len(result))
        elif name == "add_history":
            n["write_units"] += len(args[0])
        elif name == "create_run":
            n["write_units"] += 2
        elif name in ("put_node", "update_run", "add_launched", "put_mark"):
            n["write_units"] += 1
        elif name in ("get_run", "list_runs", "get_marks", "has_held"):
            n["read_units"] += 1

    def s3(self, name: str, args: tuple, kwargs: dict, result: Any) -> None:
        n, key = self.n, args[0]
        state = "/parts/" in key
        if name == "promote":  # HEAD of the staged object and of the result's key, then the copy (a PUT)
            n["s3_get"] += 2
            n["s3_put"] += 1 if result == PROMOTED else 0
        elif name in ("put_new", "put_staged"):
            n["s3_put"] += 1
            n["s3_put_bytes"] += len(args[1])
            if state:
                n["state_s3_put"] += 1
                n["state_bytes"] += len(args[1])
        elif name in ("get", "exists"):
            n["s3_get"] += 1  # HEAD is billed as a GET
            n["s3_get_bytes"] += self.results.sizes.get(key, 0) if name == "get" else 0
            n["state_s3_get"] += 1 if state else 0

    def usd(self, state_only: bool = False) -> float:
        n, p = self.n, "state_" if state_only else ""
        sqs = 0 if state_only else n["sqs_requests"]
        return units.usd(
            n[f"{p}write_units"], 0 if state_only else n["read_units"], n[f"{p}s3_put"], n[f"{p}s3_get"], sqs
        )

    def figures(self, sites: int) -> dict[str, Any]:
        """SimResult's cost figures (per site unless named otherwise)."""
        n = self.n
        return {
            "state_bytes_per_site": round(n["state_bytes"] / sites, 1),
            "state_write_units_per_site": round(n["state_write_units"] / sites, 2),
            "state_usd_per_site": round(self.usd(state_only=True) / sites, 8),
            "write_units_per_site": round(n["write_units"] / sites, 2),
            "read_units_per_site": round(n["read_units"] / sites, 2),
            "s3_requests_per_site": {"put": round(n["s3_put"] / sites, 2), "get": round(n["s3_get"] / sites, 2)},
            "s3_bytes_per_site": {"put": round(n["s3_put_bytes"] / sites), "get": round(n["s3_get_bytes"] / sites)},
            "requests_usd_per_site": round(self.usd() / sites, 8),
            "requests_usd": round(self.usd(), 4),
        }
