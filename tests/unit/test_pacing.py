"""Per-domain pacing: what a domain is, its base spacing, the AutoThrottle arithmetic, the Crawl-delay robots.txt
gives, and how a crawl's pace and answers reach the domains."""

from __future__ import annotations

import pytest

from fleet.aws.ratelimit import PACE_MARGIN
from fleet.crawl.pacing import (
    FIRST_BACKOFF_S,
    FROM_CONFIG,
    FROM_CRAWL_DELAY,
    FROM_NONE,
    MAX_SPACING_S,
    base_spacing,
    domain_of,
    pacing_section,
    throttled,
)
from node.pacing import COUNT_EVERY, Pacer
from node.robots import Fetched, Robots

UA = "gridfleet/1.0 (+https://crawl.example/about)"


@pytest.mark.parametrize(
    ("url", "domain"),
    [
        ("https://Shop.Example/a?b=1", "shop.example"),
        ("https://shop.example:443/a", "shop.example"),  # the scheme's default port: the same origin
        ("http://shop.example:80/", "shop.example"),
        ("http://shop.example:8080/", "shop.example:8080"),
        ("https://shop.example:80/", "shop.example:80"),  # 80 is not https's default
        ("http://127.0.0.1:8900/s/a/", "127.0.0.1:8900"),
        ("http://localhost:8900/s/a/", "localhost:8900"),  # another host: another domain, as robots.txt has it
        ("http://[::1]:8900/", "[::1]:8900"),
        ("ftp://shop.example/", None),
        ("mailto:a@shop.example", None),
        ("http://[::1/", None),
    ],
)
def test_a_domain_is_the_host_with_its_port_unless_it_is_the_default(url, domain):
    assert domain_of(url) == domain


def test_the_base_spacing_is_the_slower_of_crawl_delay_and_the_configured_rate():
    assert base_spacing(None, None, PACE_MARGIN) == (0.0, FROM_NONE)
    assert base_spacing(2, None, PACE_MARGIN) == (pytest.approx(2.2), FROM_CRAWL_DELAY)  # with the groups' headroom
    assert base_spacing(None, 2, PACE_MARGIN) == (pytest.approx(0.55), FROM_CONFIG)
    assert base_spacing(1, 0.5, PACE_MARGIN) == (pytest.approx(2.2), FROM_CONFIG)
    assert base_spacing(3, 0.5, PACE_MARGIN) == (pytest.approx(3.3), FROM_CRAWL_DELAY)


def test_429_and_503_double_the_spacing_up_to_the_cap():
    assert throttled(0.0, 0.0, 429) == FIRST_BACKOFF_S  # a domain paced by nothing backs off to a second first
    assert throttled(1.0, 1.0, 503) == 2.0
    assert throttled(2.0, 1.0, 429) == 4.0
    assert throttled(40.0, 1.0, 429) == MAX_SPACING_S
    assert throttled(0.5, 2.0, 429) == 4.0  # from its base, never from below it


def test_successful_answers_recover_a_tenth_of_the_way_back_to_the_base_and_settle_there():
    assert throttled(4.0, 1.0, 200) == pytest.approx(3.7)
    assert throttled(3.7, 1.0, 304) == pytest.approx(3.43)
    assert throttled(1.005, 1.0, 200) == 1.0  # close enough: at its base
    assert throttled(1.0, 1.0, 200) == 1.0
    assert throttled(4.0, 1.0, 404) == 4.0  # other errors, and no answer at all, leave it
    assert throttled(4.0, 1.0, None) == 4.0
    spacing = MAX_SPACING_S
    for _ in range(100):
        spacing = throttled(spacing, 0.0, 200)
    assert spacing == 0.0


def test_the_crawl_delay_for_the_crawls_user_agent_is_read_from_each_hosts_robots_txt():
    texts = {
        "http://a.test/robots.txt": "User-agent: *\nCrawl-delay: 1\n",
        "http://b.test:81/robots.txt": "User-agent: gridfleet\nCrawl-delay: 2.5\n\nUser-agent: *\nCrawl-delay: 9\n",
        "http://c.test/robots.txt": "User-agent: *\nDisallow: /private\n",
    }
    paced: list[str] = []
    robots = Robots(UA, lambda url: Fetched(200, texts[url]), paced.append, site="s1", node="i-1", attempt=1)
    assert robots.crawl_delay("http://a.test/x") is None  # not read yet: crawl_delay never fetches
    for url in ("http://a.test/x", "http://b.test:81/y", "http://c.test/z"):
        assert robots.allowed(url)
    assert robots.crawl_delay("http://a.test/x") == 1.0
    assert robots.crawl_delay("http://b.test:81/y") == 2.5  # the group of the crawl's product token
    assert robots.crawl_delay("http://c.test/z") is None
    assert paced == list(texts)  # each robots.txt fetched once, paced by its own URL


class Domains:
    def __init__(self) -> None:
        self.waits: list[tuple[str, float]] = []
        self.answers: list[tuple[str, float, int | None]] = []
        self.counted: list[tuple] = []

    def wait(self, domain: str, base: float) -> float:
        self.waits.append((domain, base))
        return 0.0

    def answered(self, domain: str, base: float, status: int | None) -> float:
        self.answers.append((domain, base, status))
        return throttled(base, base, status)

    def count(self, run_id, domain, base, answers, spacing_s) -> None:
        self.counted.append((run_id, domain, base, answers, spacing_s))


def test_a_request_waits_for_its_group_then_its_domain_and_each_answer_is_counted_for_the_run():
    order: list[str] = []
    domains = Domains()
    domains.wait = lambda d, b: order.append(f"domain {d} {b}") or 0.0  # type: ignore[method-assign]
    pacer = Pacer(lambda: order.append("group"), domains, "run-1", per_domain_s=None)
    pacer.pace("http://localhost:8900/s/a/", 2.0)
    assert order == ["group", "domain localhost:8900 2.2"]
    pacer.answered("http://localhost:8900/s/a/", 429)  # a back-off is sent at once
    assert domains.counted == [("run-1", "localhost:8900", (pytest.approx(2.2), FROM_CRAWL_DELAY), (1, 1), 4.4)]
    for _ in range(COUNT_EVERY + 3):  # answers are sent COUNT_EVERY at a time, the rest when the crawl ends
        pacer.answered("http://localhost:8900/s/a/", 200)
    assert [c[3] for c in domains.counted] == [(1, 1), (COUNT_EVERY, 0)]
    pacer.flush()
    assert [c[3] for c in domains.counted] == [(1, 1), (COUNT_EVERY, 0), (3, 0)]
    pacer.pace("file:///etc/passwd", None)  # no domain: the group's slot only
    assert order[-1] == "group"


def test_the_summarys_pacing_is_keyed_by_domain():
    items = [{"Site": "b.test", "requests": 3, "base_s": 1, "base_from": "crawl-delay", "backoffs": 1, "spacing_s": 2}]
    assert pacing_section(items) == {
        "b.test": {"requests": 3, "base_s": 1.0, "base_from": "crawl-delay", "backoffs": 1, "spacing_s": 2.0}
    }


def test_a_sites_per_domain_rate_overrides_the_fleets_and_rides_on_its_spec():
    from fleet.config.load import parse_config
    from fleet.record.codec import item_to_site, site_to_item
    from fleet.record.ops import new_site
    from hub.plan.start import spec_of

    config = parse_config(
        "politeness: {per_domain_s: 2}\n"
        "sites:\n"
        "  - {id: a, start_url: 'http://a.test'}\n"
        "  - {id: b, start_url: 'http://a.test/b', politeness: {per_domain_s: 0.5}}\n"
    )
    specs = {s.id: spec_of(s, config) for s in config.sites}
    assert (specs["a"].per_domain_s, specs["b"].per_domain_s) == (2, 0.5)
    rec = new_site("run-1", "b", specs["b"], expire_at=99)
    assert item_to_site(site_to_item(rec)).spec.per_domain_s == 0.5


def test_a_crawl_delay_or_a_stored_spacing_past_the_cap_counts_as_the_cap():
    from fleet.crawl.pacing import MAX_SPACING_S, spacing_read_back

    assert base_spacing(86400, None, 1.0) == (MAX_SPACING_S, FROM_CRAWL_DELAY)  # one a day would look stuck
    assert spacing_read_back(1e12) == MAX_SPACING_S and spacing_read_back(2.5) == 2.5
    assert spacing_read_back(float("nan")) is None and spacing_read_back(-1) is None and spacing_read_back(True) is None
