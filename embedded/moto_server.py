"""The local runtime's AWS: moto server, with DynamoDB's item writes made atomic as DynamoDB's are.

DynamoDB applies a conditional write atomically, and the old values it returns are those it replaced: of two
requests whose condition holds only for the first to be applied, the second fails. moto reads the old item,
checks the condition and writes, in steps with no lock, and serves each request on a thread of its own, so on a
busy machine two requests can pass one check, or both be told the same old value: two nodes would claim one
site, or take one rate-limit slot. `make_dynamodb_writes_atomic()` serialises moto's handling of DynamoDB's
write requests in this process; every moto server the project starts (the embedded default's, the twin's, the
tests') runs with it. `python -m embedded.moto_server` takes moto server's own arguments.
"""

from __future__ import annotations

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
        def atomic(self: Any, *args: Any, _write: Any = write, **kwargs: Any) -> Any:
            with _lock:
                return _write(self, *args, **kwargs)

        atomic.gridfleet_atomic = True  # type: ignore[attr-defined]
        setattr(DynamoHandler, name, atomic)


def main(argv: list[str] | None = None) -> None:
    make_dynamodb_writes_atomic()
    from moto.server import main as moto_main

    moto_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
