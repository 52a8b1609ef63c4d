"""The metered queue: the hub sends first messages only as fast as the nodes take them, longest expected first.

With every message sent at seeding, a site that is retried (after a hang, a spot reclaim, a lost node) waits
behind every fresh site still in the queue: at 10,000 sites its retry starts when the queue runs dry, and a long
site interrupted early ends the run alone. A metered queue holds the fresh sites on their records (`held`:
QUEUED, never sent, never attempted) and keeps in the queue only what the nodes will take before the hub looks
again, so a retry (sent by whoever ended the attempt) waits behind a few dozen messages at most. The order holds
on a standard SQS queue too, which keeps no order of its own: what is not sent cannot be taken out of turn.

Metering needs the expected durations (the previous run's, `run.order: longest_first`): they give both the order
and the rate at which nodes come back for work. Without them (a first run, `order: config`, `feed: all`), every
message is sent at seeding and a held site is one a hub did not finish seeding, repaired as any unsent message.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Mapping

from fleet.config import Config
from fleet.record.state import RunStatus
from hub.actions import Action, Feed
from hub.snapshot import RankedSet, Snapshot

#: The shortest expected duration the feed reckons with, so a burst of tiny sites does not ask for a huge batch.
MIN_EXPECTED_S = 1.0


def metering(config: Config, expected: Mapping[str, float]) -> bool:
    """Whether the hub meters its queue: asked for, and the order to send in is known."""
    return config.run.feed == "metered" and config.run.order == "longest_first" and bool(expected)


class _Rank(dict[str, int]):
    """Site -> its place in the feed's order; a site the config no longer names comes after all of them."""

    def __missing__(self, key: str) -> int:
        return len(self)


#: The last ranking made, with the two objects it was made from: the hub reads the durations once and keeps its
#: config, so each tick finds both the same and ranks ten thousand held sites by a dict lookup, not a sort.
_last: list[tuple[Mapping[str, float], Config, float, _Rank]] = []


def _ranking(expected: Mapping[str, float], config: Config) -> tuple[float, _Rank]:
    """The median expected duration, and every configured site's place in the feed's order."""
    if _last and _last[0][0] is expected and _last[0][1] is config:
        return _last[0][2], _last[0][3]
    known = sorted(expected.values())
    median = known[len(known) // 2] if known else 0.0
    ids = [site.id for site in config.sites]
    order = sorted(range(len(ids)), key=lambda i: (-expected.get(ids[i], median), i))
    rank = _Rank({ids[i]: place for place, i in enumerate(order)})
    _last[:] = [(expected, config, median, rank)]
    return median, rank


def feed_order(held: Collection[str], expected: Mapping[str, float], config: Config, count: int) -> list[str]:
    """The `count` held sites to send next: longest expected first, a site without history as a median one, ties
    in the config's order (as `seeding_order`)."""
    if count <= 0 or not held:
        return []
    return _first(held, _ranking(expected, config)[1], count)


def _first(held: Collection[str], rank: _Rank, count: int) -> list[str]:
    """The first `count` of `held` by `rank`: from the hub's cache, whose set keeps them ranked by delta (each tick
    costs what was fed, not what is held), else by a pass over them."""
    if isinstance(held, RankedSet):
        return held.first(count, rank)
    return heapq.nsmallest(count, held, key=rank.__getitem__)


def wanted_depth(nodes: int, running: int, next_expected_s: float, horizon_s: float) -> int:
    """Messages to keep in the queue: one for each node without a site (a booting node included), and the claims
    busy nodes make before the hub looks again (`horizon_s`), reckoned as if each crawled sites as long as the next
    one in line. In longest-first order the sites running are as long or longer, so this errs on the deep side."""
    free = max(0, nodes - running)
    busy = min(nodes, running)
    return free + math.ceil(busy * horizon_s / max(MIN_EXPECTED_S, next_expected_s))


def sent_waiting(s: Snapshot) -> int:
    """QUEUED sites whose message is in the queue (sent and marked): the queue's depth as the records tell it."""
    if s.retrying is not None:
        unsent_retries = len(s.retrying)
    else:
        unsent_retries = sum(1 for n in s.watched if s.sites[n].run_status is RunStatus.QUEUED)
    return max(0, s.counts()[RunStatus.QUEUED.value] - len(s.held) - unsent_retries)


def feed_rule(s: Snapshot, now: float, config: Config, nodes: int) -> tuple[list[Action], float]:
    """Top the queue up to `wanted_depth` from the held sites, in `feed_order`, for `nodes` nodes (live or being
    launched). The hub looks again within `run.watch_interval_s`, the horizon the depth is reckoned for."""
    if not s.held or not metering(config, s.expected):
        return [], math.inf
    median, rank = _ranking(s.expected, config)
    next_s = s.expected.get(_first(s.held, rank, 1)[0], median)
    horizon = config.run.watch_interval_s
    missing = wanted_depth(nodes, s.counts()[RunStatus.RUN.value], next_s, horizon) - sent_waiting(s)
    if missing <= 0:
        return [], now + horizon
    return [Feed(tuple(_first(s.held, rank, missing)))], math.inf
