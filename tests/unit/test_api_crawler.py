"""The `api` crawler against the demo server's JSON API (real HTTP on loopback, no browser): pages by token,
a checkpoint per page, resuming from one, stopping at an incremental mark, pacing each request."""

from __future__ import annotations

import pytest

from embedded.demo_server import DemoServer
from node.crawler import CrawlContext, CrawlError
from node.crawlers.api import ApiCrawler, with_param


@pytest.fixture
def demo():
    with DemoServer() as server:
        yield server


def crawl(url: str, options=None, checkpoint=None, mark=(), pace=lambda url, delay: None):
    events: list[dict] = []
    ctx = CrawlContext(
        site="shop",
        start_url=url,
        options=options or {},
        attempt=1,
        node_id="i-1",
        grid_url="",
        profile_dir="/nonexistent",
        page_load_timeout_s=5,
        emit=lambda **e: events.append(e),
        checkpoint=checkpoint,
        mark=tuple(mark),
        pace=pace,
    )
    crawler = ApiCrawler(ctx)
    result = crawler.run()
    assert crawler._driver is None  # never a browser
    return result, events


def ids(items):
    return [i["id"] for i in items]


def test_it_follows_tokens_to_the_last_page_with_a_checkpoint_after_each(demo):
    result, events = crawl(f"{demo.base_url}/api/shop?pages=3&per_page=2")
    assert ids(result["items"]) == ["shop-1-1", "shop-1-2", "shop-2-1", "shop-2-2", "shop-3-1", "shop-3-2"]
    assert result["pages"] == 3
    ckpts = [e for e in events if e["event"] == "checkpoint"]
    assert [c["pages"] for c in ckpts] == [1, 2, 3] and ckpts[-1]["next"] is None
    assert all(isinstance(c["next"], str) for c in ckpts[:2])
    steps = [e["site_status"] for e in events if e["event"] == "status"]
    assert steps == ["RUNNING"] + ["URL_CALL", "CALL_DONE"] * 3
    assert demo.stats()["sites"]["shop"]["hits"] == {"1": 1, "2": 1, "3": 1}


def test_a_retry_resumes_at_the_saved_token_and_fetches_no_page_twice(demo):
    url = f"{demo.base_url}/api/shop?pages=4&per_page=2"
    _, walk = crawl(url)
    first = [e for e in walk if e["event"] == "checkpoint"][0]  # as the agent saved it after page 1
    demo.stats()  # the walk's hits are counted; count the resumed attempt's on their own
    before = dict(demo.stats()["sites"]["shop"]["hits"])
    result, events = crawl(url, checkpoint={"next": first["next"], "pages": 1, "items": first["items"]})
    after = demo.stats()["sites"]["shop"]["hits"]
    assert ids(result["items"]) == ["shop-2-1", "shop-2-2", "shop-3-1", "shop-3-2", "shop-4-1", "shop-4-2"]
    assert result["pages"] == 4  # counted from the checkpoint's pages
    assert {p: after[p] - before[p] for p in ("1", "2", "3", "4")} == {"1": 0, "2": 1, "3": 1, "4": 1}
    assert [e["pages"] for e in events if e["event"] == "checkpoint"] == [2, 3, 4]


def test_a_resumed_crawl_adds_no_item_the_checkpoint_holds(demo):
    url = f"{demo.base_url}/api/shop?pages=2&per_page=2"
    _, walk = crawl(url)
    token_2 = [e for e in walk if e["event"] == "checkpoint"][0]["next"]
    held = [{"id": "shop-2-1"}]  # e.g. saved by a crawler that overlaps pages
    result, _ = crawl(url, checkpoint={"next": token_2, "pages": 1, "items": held})
    assert ids(result["items"]) == ["shop-2-2"]


def test_a_checkpoint_with_no_next_page_means_nothing_left_to_fetch(demo):
    result, events = crawl(f"{demo.base_url}/api/shop?pages=2", checkpoint={"next": None, "pages": 2, "items": []})
    assert result["items"] == [] and not [e for e in events if e["event"] == "status" and e["url"]]
    assert "shop" not in demo.stats()["sites"]


def test_an_incremental_crawl_stops_at_the_first_item_seen_last_time(demo):
    url = f"{demo.base_url}/api/shop?pages=5&per_page=3"
    result, _ = crawl(url, mark=["shop-1-2", "shop-1-3"])
    assert ids(result["items"]) == ["shop-1-1"]  # new ones only, and no page after the first
    assert demo.stats()["sites"]["shop"]["hits"] == {"1": 1}


def test_every_request_waits_for_its_rate_limit_slot_first(demo):
    order: list[str] = []

    def pace(url, delay):
        order.append("slot")

    _, events = crawl(f"{demo.base_url}/api/shop?pages=2", pace=pace)
    assert order == ["slot", "slot", "slot"]  # the site's robots.txt, then its two pages


def test_http_errors_and_bad_answers_are_crawl_errors(demo):
    with pytest.raises(CrawlError, match="HTTP 500"):
        crawl(f"{demo.base_url}/api/shop?pages=2&fail_attempts=1")
    with pytest.raises(CrawlError, match="no list under 'entries'"):
        crawl(f"{demo.base_url}/api/shop?pages=2", options={"items": "entries"})
    with pytest.raises(CrawlError, match="max_pages"):
        crawl(f"{demo.base_url}/api/shop", options={"max_pages": 0})
    with pytest.raises(CrawlError, match="headers.X-N: Input should be a valid string"):  # as the config says
        crawl(f"{demo.base_url}/api/shop", options={"headers": {"X-N": 5}})


def test_the_token_replaces_any_earlier_one_in_the_url():
    assert with_param("http://h/api/x?pages=3&token=old", "token", "new") == "http://h/api/x?pages=3&token=new"
