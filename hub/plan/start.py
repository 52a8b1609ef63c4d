"""Starting a run: its run item, and the records and first messages of the sites the table does not hold yet.

Also where a site's spec, the run's date and the seeding order come from, since
the CLI (a rerun, the AWS commands) and the simulator need the same answers.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping

from fleet.config import Config, SiteConfig
from fleet.record.state import SiteSpec
from hub.actions import Action, SeedSites, StartRun
from hub.plan.feed import metering
from hub.snapshot import Snapshot

_DATE_ID = re.compile(r"^(\d{4})-?(\d{2})-?(\d{2})")

#: The sites to seed: (site id, spec), in the order their messages are sent.
Seeds = tuple[tuple[str, SiteSpec], ...]


def run_date_for(run_id: str, now: float) -> str:
    """YYYYMMDD for result keys: the run id's date if it starts with one, else today (UTC)."""
    m = _DATE_ID.match(run_id)
    if m:
        try:
            return dt.date(int(m[1]), int(m[2]), int(m[3])).strftime("%Y%m%d")
        except ValueError:
            pass
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y%m%d")


def spec_of(site: SiteConfig, config: Config) -> SiteSpec:
    """What a node needs to crawl `site`, copied onto its record (a rate limit only if its group exists). The
    baseline of its `max_drop` is not the config's: the hub adds it when it seeds the site (`hub.history`)."""
    limit = config.rate_limits.get(site.rate_limit) if site.rate_limit else None
    return SiteSpec(
        site.start_url,
        site.crawler,
        dict(site.options),
        site.incremental,
        site.rate_limit if limit else None,
        limit.per_s if limit else None,
        site.politeness.robots,
        expect=config.expect_of(site),
        blocked_markers=site.blocked_markers,
        per_domain_s=site.politeness.per_domain_s or config.politeness.per_domain_s,
    )


def seeding_order(sites: Seeds, expected: Mapping[str, float], order: str) -> Seeds:
    """Longest expected crawl first (longest-processing-time order: the long ones do not end the run alone);
    a site with no history counts as a median one. `order: config` keeps the order of the config."""
    if order != "longest_first" or not expected:
        return sites
    known = sorted(expected.values())
    median = known[len(known) // 2]
    return tuple(sorted(sites, key=lambda item: -expected.get(item[0], median)))  # stable: ties keep config order


def missing_sites(s: Snapshot, config: Config) -> Seeds:
    """The configured sites the table holds no record of yet, in the config's order (none to look for once the
    hub's cache has read every configured site: a tick of a seeded run does not walk the config)."""
    if s.unseen is not None and not s.unseen:
        return ()
    return tuple(
        (site.id, spec_of(site, config)) for site in config.sites if site.id not in s.sites and site.id not in s.repairs
    )


def start_rules(s: Snapshot, now: float, config: Config, missing: Seeds) -> list[Action]:
    """Create the run item if there is none, and seed the `missing` sites (their messages too, unless the queue is
    metered)."""
    actions: list[Action] = []
    if s.run is None:
        actions.append(StartRun(now, now + config.run.deadline_s, run_date_for(s.run_id, now)))
    if missing:
        order = seeding_order(missing, s.expected, config.run.order)
        actions.append(SeedSites(order, send=not metering(config, s.expected)))  # metered: `Feed` sends them
    return actions
