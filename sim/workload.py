"""The simulated sites: how long each crawl takes today, how long it took last time, and its hangs.

Crawl times are heavy-tailed (lognormal around `site_s`, spread `sigma`) or a
past run's (`--history`: a summary.json or {site: seconds}); today's time is
last time's moved by a little noise (`drift`), so an order built on the past
is good but not perfect, as it is in life. An attempt is a browser start and
then pages, each a URL_CALL and a CALL_DONE report and a checkpoint (as the
`links` crawler saves one); a retry resumes after the last checkpointed page.
With `hang_rate` an attempt stops answering on one of its pages.
"""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Any

from fleet import ops
from fleet.state import SiteStatus
from sim.model import Crawl, SimParams

MAX_SPREAD = 20.0  # the longest drawn site is at most this many times the median
BROWSER_START_S = 2.0  # a Grid session, as measured on the embedded default


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

    def attempt(self, node: object, rec: Any, now: float) -> Crawl:
        """The timeline of one attempt at `rec.site`, starting `now`."""
        d = self.today[rec.site]
        pages = max(1, round(d / self.p.page_s))
        step = (d - BROWSER_START_S) / pages
        resume = ops.resumable(rec)
        first = min(pages - 1, int(resume.get("pages") or 0)) if resume else 0
        hang_page = self.rng.randrange(first, pages) if self.rng.random() < self.p.hang_rate else None
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
            events.append((t, "status", (SiteStatus.CALL_DONE, url, i + 1)))
            events.append((t, "checkpoint", i + 1))
        else:
            events.append((t, "result", None))
        return Crawl(rec.site, rec.attempt, now, events, hang_at=hang_at)
