"""The simulated sites: how long each crawl takes today, how long it took last time, and its hangs.

Crawl times are heavy-tailed (lognormal around `site_s`, spread `sigma`) or a
past run's (`--history`: a summary.json or {site: seconds}); today's time is
last time's moved by a little noise (`drift`), so an order built on the past
is good but not perfect, as it is in life. An attempt is a browser start and
then pages, each a URL_CALL and a CALL_DONE report and a checkpoint (as the
`links` crawler saves one); a retry resumes after the last checkpointed page.
With `hang_rate` an attempt stops answering on one of its pages.

Failures by class are keyed as `run.retry` keys its rules (`failure_for`):
with `failure_rates` an attempt fails on one of its pages with a class's
chance (the crawler reports it, as `node.crawler` does, and the node ends the
attempt with that class); with `failing_sites` a share of the sites fails
every attempt on its first page (a site that answers 404 today). These draws
use a random stream of their own, so a run with them crawls the same sites
in the same times as the same seed without them.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Mapping
from typing import Any

from fleet.record import ops
from fleet.record.failures import Failure, FailureClass, of_status
from fleet.record.state import SiteStatus
from sim.model import Crawl, SimParams

MAX_SPREAD = 20.0  # the longest drawn site is at most this many times the median
BROWSER_START_S = 2.0  # a Grid session, as measured on the embedded default

#: The classes a simulated crawler can fail with, besides `http_<status>`: what the crawler itself reports, and
#: `crash` (its process dies). A hang is `hang_rate`'s; contract and robots failures are not simulated.
SIMULATED_CLASSES = ("dns", "connect", "tls", "timeout", "blocked", "error", "crash")


def failure_for(key: str) -> Failure:
    """The failure a key names: a class of `SIMULATED_CLASSES` (`blocked` is a challenge page), or `http_<status>`
    for an answer of status 400-599, classed as the crawler classes it (`http_404` is http_4xx 404, `http_403` is
    blocked 403). ValueError says what a key may be."""
    if key in SIMULATED_CLASSES:
        return Failure(FailureClass(key))
    status = key.removeprefix("http_")
    failure = of_status(int(status)) if key.startswith("http_") and status.isdigit() and len(status) == 3 else None
    if failure is None:
        raise ValueError(f"{key!r}: a failure is one of {', '.join(SIMULATED_CLASSES)} or http_<status> (400-599)")
    return failure


def check_shares(rates: Mapping[str, float], what: str) -> dict[str, Failure]:
    """The failures of `rates`' keys; ValueError for a bad key or a rate outside 0-1."""
    out = {}
    for key, rate in rates.items():
        out[key] = failure_for(key)
        if not 0 <= rate <= 1:
            raise ValueError(f"{what} {key}={rate}: a fraction from 0 to 1")
    if what == "failing sites" and sum(rates.values()) > 1:
        raise ValueError(f"failing sites: the shares add up to {sum(rates.values()):g}, more than 1")
    return out


class Workload:
    def __init__(self, p: SimParams, rng: random.Random):
        self.p = p
        self.rng = rng
        if p.history:
            past = list(p.history.items())
            n = p.sites or len(past)
            picks = [past[i % len(past)] for i in range(n)]
            self.site_ids = [
                name if n <= len(past) else f"{name}-{i // len(past)}" for i, (name, _) in enumerate(picks)
            ]
            before = [max(1.0, s) for _, s in picks]
        else:
            self.site_ids = [f"site-{i:05d}" for i in range(1, p.sites + 1)]
            mu = math.log(p.site_s)
            before = [
                min(p.site_s * MAX_SPREAD, rng.lognormvariate(mu, p.sigma)) if p.sigma > 0 else p.site_s
                for _ in self.site_ids
            ]
        self.expected = dict(zip(self.site_ids, before, strict=True))
        self.today = {
            s: max(BROWSER_START_S + 1, b * (rng.lognormvariate(0, p.drift) if p.drift > 0 else 1.0))
            for s, b in zip(self.site_ids, before, strict=True)
        }
        self.work = list(self.today.values())
        self.failures = check_shares(p.failure_rates, "failure rate")
        self.fail_rng = random.Random(f"failures-{p.seed}")
        self.failing = self._failing_sites(check_shares(p.failing_sites, "failing sites"))

    def _failing_sites(self, failures: dict[str, Failure]) -> dict[str, Failure]:
        """Each site that fails every attempt, with its failure: `failing_sites`' shares of the sites, drawn."""
        shuffled = self.site_ids[:]
        self.fail_rng.shuffle(shuffled)
        out: dict[str, Failure] = {}
        for key in sorted(failures):
            n = round(self.p.failing_sites[key] * len(shuffled))
            out.update((s, failures[key]) for s in shuffled[len(out) : len(out) + n])
        return out

    def _failure(self, site: str, first: int, pages: int) -> tuple[int, Failure] | None:
        """The page this attempt fails on, and how; None when it does not fail."""
        if site in self.failing:
            return first, self.failing[site]
        for key in sorted(self.failures):
            if self.fail_rng.random() < self.p.failure_rates[key]:
                return self.fail_rng.randrange(first, pages), self.failures[key]
        return None

    def attempt(self, node: object, rec: Any, now: float) -> Crawl:
        """The timeline of one attempt at `rec.site`, starting `now`."""
        d = self.today[rec.site]
        pages = max(1, round(d / self.p.page_s))
        step = (d - BROWSER_START_S) / pages
        resume = ops.resumable(rec)
        first = min(pages - 1, int(resume.get("pages") or 0)) if resume else 0
        hang_page = self.rng.randrange(first, pages) if self.rng.random() < self.p.hang_rate else None
        fail_page, failure = self._failure(rec.site, first, pages) or (None, None)
        events: deque = deque()
        t = now + BROWSER_START_S
        events.append((t, "status", (SiteStatus.RUNNING, None, 0)))
        hang_at = None
        for i in range(first, pages):
            url = f"https://{rec.site}.example.test/p/{i + 1}"
            events.append((t, "status", (SiteStatus.URL_CALL, url, i)))
            if i == hang_page:
                hang_at = t
                break
            t += step
            if i == fail_page:  # the page's answer, or the error instead of one, ends the attempt
                events.append((t, "failed", failure))
                break
            events.append((t, "status", (SiteStatus.CALL_DONE, url, i + 1)))
            events.append((t, "checkpoint", i + 1))
        else:
            events.append((t, "result", None))
        return Crawl(rec.site, rec.attempt, now, events, hang_at=hang_at)
