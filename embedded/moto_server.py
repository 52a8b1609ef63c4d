"""The local runtime's AWS: moto server, with DynamoDB's item writes made atomic as DynamoDB's are, and refused as
DynamoDB refuses them when an index's key would hold a value of another type.

DynamoDB applies a conditional write atomically, and the old values it returns are those it replaced: of two
requests whose condition holds only for the first to be applied, the second fails. moto reads the old item,
checks the condition and writes, in steps with no lock, and serves each request on a thread of its own, so on a
busy machine two requests can pass one check, or both be told the same old value: two nodes would claim one
site, or take one rate-limit slot. `make_dynamodb_writes_atomic()` serialises moto's handling of DynamoDB's
write requests in this process; every moto server the project starts (the embedded default's, the twin's, the
tests') runs with it. `python -m embedded.moto_server` takes moto server's own arguments.

DynamoDB refuses a write that gives a secondary index's key attribute a value of another type than the table
defines (ValidationException, "Type mismatch"). moto refuses it for an item that exists, but stores it in an item
the UpdateItem creates, and then every Query of that index fails with an internal error (it sorts a number with a
string): one node's UpdateItem of `openSite` would have stopped every hub's read of the open sites on moto, where
AWS refuses the write. The same wrapper puts such an item back as it was and answers as DynamoDB does.
"""

from __future__ import annotations

import copy
import functools
import sys
import threading
from typing import Any

#: The write requests of moto's DynamoDB handler: each reads, checks and writes items.
WRITES = ("put_item", "update_item", "delete_item", "transact_write_items", "batch_write_item")

_lock = threading.RLock()


def make_dynamodb_writes_atomic() -> None:
    """Serialise moto's DynamoDB write requests in this process (idempotent)."""
    from moto.dynamodb.responses import DynamoHandler

    for name in WRITES:
        write = getattr(DynamoHandler, name)
        if getattr(write, "gridfleet_atomic", False):
            continue

        @functools.wraps(write)
        def atomic(self: Any, *args: Any, _write: Any = write, _name: str = name, **kwargs: Any) -> Any:
            with _lock:
                if _name != "update_item":
                    return _write(self, *args, **kwargs)
                item = _item(self)
                before = copy.deepcopy(item.to_json()["Attributes"]) if item is not None else None
                out = _write(self, *args, **kwargs)
                _refuse_index_key_types(self, before)  # as DynamoDB would have, before writing
                return out

        atomic.gridfleet_atomic = True  # type: ignore[attr-defined]
        setattr(DynamoHandler, name, atomic)


def _item(handler: Any) -> Any:
    """The item an UpdateItem request names, as moto holds it now (None: none, or no table)."""
    try:
        return handler.dynamodb_backend.get_item(handler.body.get("TableName"), handler.body.get("Key"))
    except Exception:  # noqa: BLE001 - a request moto refuses on its own
        return None


def _refuse_index_key_types(handler: Any, before: dict[str, Any] | None) -> None:
    """The item an UpdateItem just wrote: if an index's key attribute holds a value of another type than the table
    defines, put it back as it was `before` (None: it was not there) and raise DynamoDB's ValidationException."""
    from moto.dynamodb.exceptions import MockValidationException

    item = _item(handler)
    if item is None:
        return
    name = handler.body.get("TableName")
    table = handler.dynamodb_backend.get_table(name)
    types = {a["AttributeName"]: a["AttributeType"] for a in table.attr}
    attrs = item.to_json()["Attributes"]
    for index in [*table.indexes, *table.global_indexes]:
        for part in index.schema:
            key, want = part["AttributeName"], types.get(part["AttributeName"])
            got = next(iter(attrs[key])) if key in attrs else want
            if got != want:
                if before is None:
                    handler.dynamodb_backend.delete_item(name, handler.body.get("Key"))
                else:
                    handler.dynamodb_backend.put_item(name, before)
                raise MockValidationException(
                    f"One or more parameter values were invalid: Type mismatch for Index Key {key} "
                    f"Expected: {want} Actual: {got} IndexName: {index.name}"
                )


def main(argv: list[str] | None = None) -> None:
    make_dynamodb_writes_atomic()
    from moto.server import main as moto_main

    moto_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
