"""What a simulated node and the virtual cloud read of the running simulation: `World`.

`sim.run.Sim` satisfies it without naming it, so the node (`sim.node`) and the
cloud (`sim.cloud`) never import the run that builds them. Where the node calls
the cloud or the workload, the world names only that call.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from fleet.config import Config
from fleet.protocol import NodeRules
from fleet.record.state import SiteRecord
from sim.engine import Counted, Engine, SimClock
from sim.model import Crawl, SimParams, Stats


class Shutdowns(Protocol):
    """The cloud as a node sees it: it shuts its own instance down."""

    def shutdown(self, iid: str) -> None: ...

    def changed(self) -> None: ...


class Attempts(Protocol):
    """The workload as a node sees it: the timeline of the attempt it claimed."""

    def attempt(self, node: object, rec: SiteRecord, now: float) -> Crawl: ...


class Waiter(Protocol):
    """A node in a long poll: a sent message wakes it (False: it was no longer waiting)."""

    def woken_by_message(self) -> bool: ...

    def polled_by_visible_message(self) -> bool: ...


class World(Protocol):
    """The running simulation, read-only, as its nodes and its cloud see it."""

    @property
    def params(self) -> SimParams: ...
    @property
    def config(self) -> Config: ...
    @property
    def settings(self) -> NodeRules: ...  # the node's rules, from the config
    @property
    def engine(self) -> Engine: ...
    @property
    def clock(self) -> SimClock: ...
    @property
    def run_id(self) -> str: ...
    @property
    def run_date(self) -> str: ...
    @property
    def node_table(self) -> Counted: ...  # the stores as the nodes call them: counted apart from the hub's
    @property
    def node_queue(self) -> Counted: ...
    @property
    def node_results(self) -> Counted: ...
    @property
    def stats(self) -> Stats: ...
    @property
    def waiters(self) -> deque[Waiter]: ...  # nodes in a long poll, woken in turn by a sent message
    @property
    def workload(self) -> Attempts: ...
    @property
    def cloud(self) -> Shutdowns: ...

    def message_visible(self) -> None: ...  # a message a node hid shows again: a node in a long poll receives it
