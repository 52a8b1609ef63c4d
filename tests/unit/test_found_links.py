"""A URL a built-in crawler reads from a page is opened only if it is a web address (http or https): a page
cannot send the crawler's browser to a local file (`file:`), inline content (`data:`) or a script
(`javascript:`). The `links` crawler runs here against a scripted WebDriver, faked at the driver seam
(`BaseCrawler._driver`): its page scripts answer what the demo pages would; the scripts themselves run in
Chromium in tests/e2e/test_links_detail.py."""

from __future__ import annotations

from typing import Any

import pytest

from node.crawler import CrawlContext, web_url
from node.crawlers.links import _DETAIL_JS, _ITEMS_JS, _NEXT_JS, LinksCrawler

PAGE = "https://shop.test/list/p1.html"


@pytest.mark.parametrize(
    ("href", "opened"),
    [
        ("https://shop.test/list/p2.html", "https://shop.test/list/p2.html"),
        ("p2.html", "https://shop.test/list/p2.html"),
        ("/list/p2.html?page=2", "https://shop.test/list/p2.html?page=2"),
        ("//cdn.shop.test/p2", "https://cdn.shop.test/p2"),
        ("  p2.html\n", "https://shop.test/list/p2.html"),
        ("HTTP://Shop.test/p2", "HTTP://Shop.test/p2"),
        ("http://shop.test/p2", "http://shop.test/p2"),
        ("file:///etc/passwd", None),
        ("FILE:///etc/passwd", None),
        ("data:text/html,<script>alert(1)</script>", None),
        ("javascript:alert(1)", None),
        ("  javascript:alert(1)", None),
        ("\tjava\nscript:alert(1)", None),
        ("\x01javascript:alert(1)", None),
        ("mailto:a@shop.test", None),
        ("about:blank", None),
        ("http:///p2", None),  # no host
        ("http://[::1/p2", None),  # malformed
        ("", None),
        ("   ", None),
        (None, None),
        (3, None),
    ],
)
def test_a_found_url_is_opened_only_as_an_absolute_web_address(href, opened):
    assert web_url(href, PAGE) == opened


class ScriptedDriver:
    """The WebDriver as the `links` crawler uses it: `get` and the answers of its page scripts."""

    def __init__(self, next_href: Any, item_link: Any = None):
        self.next_href, self.item_link = next_href, item_link
        self.opened: list[str] = []

    def get(self, url: str) -> None:
        self.opened.append(url)

    def execute_script(self, script: str, *args: Any) -> Any:
        if script == _ITEMS_JS:
            n = len(self.opened)
            fields = {"title": f"Story {n}", "link": self.item_link} if args[1] else {}
            return [{"data_id": f"i{n}", "url": None, "text": f"Story {n}", "href": None, "fields": fields}]
        if script == _NEXT_JS:
            return self.next_href
        if script == _DETAIL_JS:
            return {"body": "text"}
        return 200  # the navigation's HTTP status


def crawl(driver: ScriptedDriver, options: dict[str, Any], checkpoint: Any = None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    ctx = CrawlContext(
        site="shop",
        start_url=PAGE,
        options=options,
        attempt=1,
        node_id="n1",
        grid_url="http://grid.invalid",
        profile_dir="/nonexistent",
        emit=lambda **e: events.append(e),
        checkpoint=checkpoint,
    )
    crawler = LinksCrawler(ctx)
    crawler._driver = driver
    list(crawler.crawl())
    return [e for e in events if e["event"] == "checkpoint"]


@pytest.mark.parametrize("href", ["file:///etc/passwd", "data:text/html,x", " javascript:go(2)"])
def test_a_next_link_that_is_not_a_web_address_ends_the_crawl_unopened(href):
    driver = ScriptedDriver(next_href=href)
    saved = crawl(driver, {"item": "a.item", "next": "a.next", "max_pages": 5})
    assert driver.opened == [PAGE]
    assert [c["next"] for c in saved] == [None]  # nothing for a retry to resume at either


def test_a_web_next_link_is_followed():
    driver = ScriptedDriver(next_href="https://shop.test/list/p2.html")
    crawl(driver, {"item": "a.item", "next": "a.next", "max_pages": 2})
    assert driver.opened == [PAGE, "https://shop.test/list/p2.html"]


def test_a_detail_link_that_is_not_a_web_address_is_not_opened():
    options = {
        "item": "article",
        "next": None,
        "fields": {"title": "h2", "link": "a@href"},
        "detail": {"link": "link", "fields": {"body": "div.body"}},
    }
    driver = ScriptedDriver(next_href=None, item_link="file:///etc/passwd")
    crawl(driver, options)
    assert driver.opened == [PAGE]
    driver = ScriptedDriver(next_href=None, item_link="a1.html")
    crawl(driver, options)
    assert driver.opened == [PAGE, "https://shop.test/list/a1.html"]


def test_a_checkpoint_that_names_no_web_address_is_not_resumed():
    driver = ScriptedDriver(next_href=None)
    crawl(driver, {"item": "a.item", "next": "a.next"}, {"next": "file:///etc/passwd", "pages": 1, "items": []})
    assert driver.opened == []
