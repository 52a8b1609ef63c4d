"""The `links` crawler with `fields` and `detail` in real Chromium, on the demo server's news site: an article
that hangs ends the first attempt, and a second attempt resumes from the checkpoint the agent would have kept,
opening no article twice but the hung one.

Cheapest real browser: the crawler talks WebDriver to a bare chromedriver (the protocol the Grid speaks); the
hang is ended by an injected short page-load timeout (the node's watchdog kills the crawler process instead)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from selenium.common.exceptions import TimeoutException

from embedded.demo_pages import news_time
from embedded.demo_server import DemoServer
from fleet.record.codec import decode_checkpoint, encode_checkpoint
from node.browser import NO_SANDBOX, sandbox_problem
from node.crawler import CrawlContext, CrawlError
from node.crawlers.links import LinksCrawler
from node.result import merged_items

pytestmark = pytest.mark.e2e

NEWS = {
    "item": "article.item",
    "next": "a.next",
    "max_pages": 2,  # listing pages
    "fields": {"title": "a.title", "when": "time@datetime", "link": "a.title@href"},
    "detail": {"link": "link", "fields": {"headline": "h1.title", "body": "div.body"}},
}


@pytest.fixture
def webdriver_url(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(tmp_path / "chromedriver.log", "wb") as log:
        proc = subprocess.Popen(["chromedriver", f"--port={port}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:  # chromedriver's start, not a hang
            try:
                with urllib.request.urlopen(f"{url}/status", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def crawl(url: str, webdriver: str, profile: Path, options: dict, page_load_timeout_s: float, checkpoint=None):
    """One attempt: its result (None if it raised) and its checkpoints, as the agent keeps them (`node.attempt`:
    each checkpoint's items added to the attempt's, the last one stored on the site record)."""
    events: list[dict] = []
    extra = (NO_SANDBOX,) if sandbox_problem(os.geteuid(), os.getegid()) else ()
    ctx = CrawlContext(
        site="wire",
        start_url=url,
        options=options,
        attempt=1 if checkpoint is None else 2,
        node_id="n-1",
        grid_url=webdriver,
        profile_dir=str(profile),
        chrome_extra_args=extra,
        page_load_timeout_s=page_load_timeout_s,
        emit=lambda **e: events.append(e),
        checkpoint=checkpoint,
    )
    crawler = LinksCrawler(ctx)
    try:
        result = crawler.run()
    except TimeoutException:
        result = None
    finally:
        crawler.close()
    saved = [e for e in events if e["event"] == "checkpoint"]
    items = list(checkpoint["items"]) if checkpoint else []
    items += [i for e in saved for i in e["items"]]
    kept = {"next": saved[-1]["next"], "pages": saved[-1]["pages"], "items": items} if saved else None
    return result, (decode_checkpoint(encode_checkpoint(kept)) if kept else None)


def test_details_are_read_items_are_kept_by_absolute_url_and_a_resumed_attempt_opens_no_article_twice(
    tmp_path, webdriver_url
):
    with DemoServer() as demo:
        query = "pages=2&per_page=3&hang_article=2-2&hang_attempts=1"
        start = f"{demo.base_url}/news/wire/p1/index.html?{query}"

        first, ckpt = crawl(start, webdriver_url, tmp_path / "p1", NEWS, page_load_timeout_s=3)
        assert first is None  # article 2-2 hung: the attempt ended there
        assert ckpt is not None and ckpt["next"] == f"1 4 {demo.base_url}/news/wire/p2/index.html?{query}"
        assert len(ckpt["items"]) == 4  # page 1's three articles and 2-1, each with its details

        second, _ = crawl(start, webdriver_url, tmp_path / "p2", NEWS, page_load_timeout_s=30, checkpoint=ckpt)
        assert second is not None
        items = merged_items(ckpt["items"], second["items"])
        hits = demo.stats()["sites"]["wire"]["hits"]
        other_options(demo, webdriver_url, tmp_path)

    articles = {k: n for k, n in hits.items() if "/a" in k}
    assert articles == {"p1/a1": 1, "p1/a2": 1, "p1/a3": 1, "p2/a1": 1, "p2/a2": 2, "p2/a3": 1}, hits
    assert hits["p1"] == 1  # the resumed attempt reopened listing page 2 only

    # listing pages 1 and 2 both link "a1/index.html?...": two items, by absolute URL; and max_pages 2 counted
    # listing pages only (each attempt opened more pages than that)
    want = {f"{demo.base_url}/news/wire/p{n}/a{k}/index.html?{query}": (n, k) for n in (1, 2) for k in (1, 2, 3)}
    assert sorted(i["id"] for i in items) == sorted(want)
    for item in items:
        n, k = want[item["id"]]
        assert item["link"] == item["id"]
        assert item["title"] == item["headline"] == f"Story wire-{n}-{k}"
        assert item["when"] == news_time("wire", n, k)[0]
        assert len(item["body"].split()) == 24  # the article's two paragraphs
        assert set(item) == {"id", "title", "when", "link", "headline", "body"}


def other_options(demo: DemoServer, webdriver: str, tmp_path: Path) -> None:
    """Without fields, with a bound on detail pages, with a selector the browser refuses (one small site each)."""
    url = f"{demo.base_url}/news/%s/p1/index.html?pages=2&per_page=1"
    article = f"{demo.base_url}/news/%s/p%d/a1/index.html?pages=2&per_page=1"

    # without fields an item keeps its shape {id, text, href}; its id is the absolute URL here too
    plain, _ = crawl(url % "plain", webdriver, tmp_path / "p3", {"item": "a.title"}, page_load_timeout_s=30)
    assert plain is not None
    want = [
        {"id": article % ("plain", n), "text": f"Story plain-{n}-1", "href": article % ("plain", n)} for n in (1, 2)
    ]
    assert plain["items"] == want

    capped = {**NEWS, "detail": {**NEWS["detail"], "max_pages": 1}}
    few, _ = crawl(url % "few", webdriver, tmp_path / "p4", capped, page_load_timeout_s=30)
    assert few is not None
    assert [sorted(set(i) - set(NEWS["fields"])) for i in few["items"]] == [["body", "headline", "id"], ["id"]]
    assert demo.stats()["sites"]["few"]["hits"] == {"p1": 1, "p1/a1": 1, "p2": 1}

    # a selector the config refuses (fleet.crawl.css) stops the crawl before any page opens, as it stops `validate`
    bad = {**NEWS, "detail": {"link": "link", "fields": {"bad": "h1.title", "body": "div.body["}}}
    with pytest.raises(CrawlError, match=r"options: detail\.fields\.body: not a CSS selector: 'div\.body\['"):
        crawl(url % "bad", webdriver, tmp_path / "p5", bad, page_load_timeout_s=30)
    assert "bad" not in demo.stats()["sites"]
    # one that only the browser refuses (a pseudo-element it does not know, left to it) is named by the page's
    # check, on the first page it is used on: the first article
    odd = {**NEWS, "detail": {"link": "link", "fields": {"bad": "h1.title", "body": "div.body::nope"}}}
    with pytest.raises(CrawlError, match=r"^options: not a CSS selector: 'div\.body::nope'$"):
        crawl(url % "odd", webdriver, tmp_path / "p6", odd, page_load_timeout_s=30)
    assert demo.stats()["sites"]["odd"]["hits"] == {"p1": 1, "p1/a1": 1}


def test_what_the_config_says_of_a_selector_chromium_says_too(tmp_path, webdriver_url):
    """`fleet.crawl.css` against Chromium's own parser (`querySelector`), in one session: every selector the unit tests
    hold valid Chromium accepts, and every one they hold invalid it refuses, but those ended inside a bracket or a
    string, which Chromium's error recovery closes (refused by the config as the typos they are); and each
    pseudo-class the config leaves to the browser is one Chromium knows."""
    from fleet.crawl.css import BROWSER_PSEUDO_CLASSES, selector_problem
    from tests.unit.test_css import INVALID, VALID

    pseudo = [f"a:{name}" for name in sorted(BROWSER_PSEUDO_CLASSES - {"state", "active-view-transition-type"})]
    pseudo += ["a:state(x)", "a:active-view-transition-type(x)"]
    invalid = [selector for selector, _ in INVALID]
    ctx = CrawlContext(
        site="css",
        start_url="about:blank",
        options={},
        attempt=1,
        node_id="n-1",
        grid_url=webdriver_url,
        profile_dir=str(tmp_path / "profile"),
        chrome_extra_args=(NO_SANDBOX,) if sandbox_problem(os.geteuid(), os.getegid()) else (),
        page_load_timeout_s=30,
        emit=lambda **e: None,
    )
    crawler = LinksCrawler(ctx)
    try:
        accepted = crawler.driver.execute_script(
            "return arguments[0].map(s => { try { document.createDocumentFragment().querySelector(s); return true; }"
            " catch (_) { return false; } })",
            VALID + pseudo + invalid,
        )
    finally:
        crawler.close()
    said = dict(zip(VALID + pseudo + invalid, accepted, strict=True))
    assert [s for s in VALID + pseudo if not said[s]] == []
    assert [s for s in VALID + pseudo if selector_problem(s) is not None] == []
    closed_at_the_end = {"a[href", 'a[href="x]'}
    assert [s for s in invalid if said[s] != (s in closed_at_the_end)] == []
