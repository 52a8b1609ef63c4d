"""The simulator's plain values, shared by its modules: the run's parameters, an instance, a crawl, the tallies.

Nothing here imports another module of the simulator, so the cloud, the nodes,
the workload and the run (`sim.run`, on top) all read these without importing
one another.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from fleet.config import Config

MIN_BILLED_S = 60.0  # EC2 bills a Linux instance for at least a minute


@dataclass(frozen=True)
class SimParams:
    sites: int = 80
    nodes: int = 20
    seed: int = 1
    policy: str = "gridfleet"
    boot_s: float = 60.0  # mean boot time (EC2 + cloud-init + EFS + Grid node), +-15%
    site_s: float = 300.0  # median crawl time
    sigma: float = 0.8  # spread of crawl times (lognormal); 0 = every site takes site_s
    drift: float = 0.15  # how much a site's time moves from the previous run (lognormal)
    page_s: float = 30.0  # time per page (progress reports per page)
    hang_rate: float = 0.01  # chance that an attempt hangs on one of its pages
    # Failures by class, keyed as `run.retry` is (`sim.workload.failure_for`: `dns`, `blocked`, `http_404`...):
    failure_rates: Mapping[str, float] = field(default_factory=dict)  # chance that an attempt fails so
    failing_sites: Mapping[str, float] = field(default_factory=dict)  # share of sites whose every attempt fails so
    spot_per_hour: float = 0.05  # spot interruptions per instance-hour
    capacity_error_rate: float = 0.02  # chance a RunInstances for one instance type finds no capacity
    items_per_page: int = 20  # items a page gives (each checkpoint's part holds a page's)
    item_bytes: int = 500  # bytes of one item as stored (JSON)
    history: dict[str, float] | None = None  # site -> seconds, from a past run (replaces the drawn times)
    hub_restart_at: float | None = None  # the hub dies at this second of the run and a new one takes over
    config: Config | None = None  # run and fleet settings (its sites are not used)


class InstanceNode(Protocol):
    """What the cloud does to the node an instance runs (`sim.node.SimNode`)."""

    dead: bool

    def boot(self) -> None: ...

    def spot_notice_arrives(self) -> None: ...

    def crawler_killed(self, site: str, attempt: int) -> None: ...


@dataclass
class VInstance:
    id: str
    instance_type: str
    launched_at: float
    boot_s: float
    spot: bool
    state: str = "pending"
    ended_at: float | None = None
    interrupted: bool = False
    notice_at: float | None = None
    node: InstanceNode | None = None

    def billed_s(self, now: float) -> float:
        end = self.ended_at if self.ended_at is not None else now
        return max(MIN_BILLED_S, end - self.launched_at)


@dataclass
class Crawl:
    """One attempt's crawler: its timeline of events, and whether it was killed."""

    site: str
    attempt: int
    claimed_at: float
    # (time, kind, payload): status / checkpoint / result / failed (a Failure); a hang is a URL_CALL with nothing after
    events: deque
    hang_at: float | None = None  # when the hung page started
    killed: bool = False


class Stats:
    """What happened, for the figures: attempts, busy time, hang lags, tick times."""

    def __init__(self, hang_after_s: float):
        self.hang_after_s = hang_after_s
        self.busy_s = 0.0
        self.hang_lags: list[float] = []
        self.tick_ms: list[float] = []
        self.outcomes: Counter = Counter()
        self.heartbeats = 0  # heartbeat writes of nodes (one UpdateItem each): calls that grow with crawl time
        self.checkpoints = 0  # checkpoint writes (one per page, each also a heartbeat)

    def attempt_ended(self, node: str, site: str, attempt: int, now: float, outcome: str, crawl: Crawl) -> None:
        self.busy_s += now - crawl.claimed_at
        self.outcomes[outcome] += 1
        if crawl.hang_at is not None and outcome != "spot":
            self.hang_lags.append(max(0.0, now - (crawl.hang_at + self.hang_after_s)))
