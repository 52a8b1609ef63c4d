"""The simulator's machinery: an event heap on a virtual clock, and call counting (its queue: `sim.queue`).

Nothing here decides anything about a run: the hub's decisions are `hub.plan`
and its executor, the nodes' `fleet.protocol`. This file only moves virtual
time, and counts the AWS calls the adapters would make for each method the
hub and nodes call.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

EPOCH0 = 1_800_000_000.0  # the virtual wall clock at t = 0


class Engine:
    """Callbacks run in time order; `at(t, fn)` schedules, `run()` drains until `stop` is set."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.stop = False
        self.events = 0
        self._upkeep: tuple[int, Callable[[], None]] | None = None

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn))

    def after_events(self, n: int, fn: Callable[[], None]) -> None:
        """Call `fn` between two events, once `n` more have run (not on the virtual clock: upkeep of the
        simulation itself)."""
        self._upkeep = (self.events + n, fn)

    def run(self, until: float) -> None:
        heap = self._heap
        while heap and not self.stop:
            t, _, fn = heapq.heappop(heap)
            if t > until:
                self.now = until
                return
            self.now = t
            self.events += 1
            fn()
            if self._upkeep is not None and self.events >= self._upkeep[0]:
                upkeep, self._upkeep = self._upkeep[1], None
                upkeep()


class SimClock:
    """The Clock of hub and nodes in the simulation. `sleep` moves time on: only the hub's finish waits so."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def now(self) -> float:
        return EPOCH0 + self.engine.now

    def monotonic(self) -> float:
        return self.engine.now

    def sleep(self, seconds: float) -> None:
        self.engine.now += max(0.0, seconds)


# --- counting the AWS calls --------------------------------------------------------------------

#: Items per DynamoDB Query page (1 MB each): whole site records, and the open index's few attributes.
#: Estimates from the record sizes gridfleet writes (a site record with a few attempts is about 1-2 KB).
QUERY_PAGE_ITEMS = 500
OPEN_INDEX_PAGE_ITEMS = 8000

Cost = Callable[[tuple, dict, Any], int]


def _pages(n: int, per_page: int) -> int:
    return max(1, math.ceil(n / per_page))


def _n_arg(i: int, per_call: int) -> Cost:
    def cost(args: tuple, kwargs: dict, result: Any) -> int:
        items = args[i] if len(args) > i else next(iter(kwargs.values()))
        return math.ceil(len(items) / per_call) if items else 0

    return cost


def _one(op: str) -> tuple[str, Cost]:
    return op, lambda a, k, r: 1


#: method -> (service, AWS operation, calls it makes), as the AWS adapters make them.
TABLE_CALLS: dict[str, tuple[str, Cost]] = {
    "create_site": _one("PutItem"),
    "get_site": _one("GetItem"),
    "write": _one("UpdateItem"),
    "read_run": ("Query", lambda a, k, r: _pages(len(r.sites) + len(r.nodes) + len(r.history) + 1, QUERY_PAGE_ITEMS)),
    "open_stamps": ("Query", lambda a, k, r: _pages(len(r), OPEN_INDEX_PAGE_ITEMS)),
    "has_held": _one("Query"),
    "get_sites": ("BatchGetItem", _n_arg(1, 100)),
    "read_nodes": ("Query", lambda a, k, r: _pages(len(r), QUERY_PAGE_ITEMS)),
    "create_run": ("PutItem", lambda a, k, r: 2),
    "get_run": _one("GetItem"),
    "update_run": _one("UpdateItem"),
    "add_launched": _one("UpdateItem"),
    "put_node": _one("PutItem"),
    "add_history": ("BatchWriteItem", _n_arg(0, 25)),
    "list_runs": _one("Query"),
}
QUEUE_CALLS: dict[str, tuple[str, Cost]] = {
    "send": _one("SendMessage"),
    "send_many": ("SendMessageBatch", lambda a, k, r: math.ceil(r / 10)),
    "receive": _one("ReceiveMessage"),
    "delete": _one("DeleteMessage"),
    "delete_receipt": _one("DeleteMessage"),
    "set_visibility": _one("ChangeMessageVisibility"),
    "depth": ("GetQueueAttributes", lambda a, k, r: 2),
}
RESULT_CALLS: dict[str, tuple[str, Cost]] = {
    "exists": _one("HeadObject"),
    "put_new": _one("PutObject"),
    "put_staged": _one("PutObject"),
    "promote": ("CopyObject", lambda a, k, r: 1),
    "get": _one("GetObject"),
}
EC2_CALLS: dict[str, tuple[str, Cost]] = {
    "list": ("DescribeInstances", lambda a, k, r: _pages(len(r), 1000)),
    "terminate": ("TerminateInstances", _n_arg(0, 1000)),
    # RunInstances: one call per instance type tried, counted by the cloud itself
}


#: Called after each counted call with (method, args, kwargs, result): what it cost beyond a call (`cost.Meter`).
MeterFn = Callable[[str, tuple, dict, Any], None]


class Counted:
    """A proxy that counts, per AWS operation, the calls its methods stand for (and meters them, given a meter)."""

    def __init__(
        self,
        inner: Any,
        service: str,
        calls: dict[str, tuple[str, Cost]],
        counter: Counter,
        meter: MeterFn | None = None,
    ):
        self._inner = inner
        self._service = service
        self._calls = calls
        self._counter = counter
        self._meter = meter

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        spec = self._calls.get(name)
        if spec is None or not callable(attr):
            return attr
        op, cost = spec
        key = (self._service, op)
        counter, meter = self._counter, self._meter

        def counted(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            counter[key] += cost(args, kwargs, result)
            if meter is not None:
                meter(name, args, kwargs, result)
            return result

        return counted
