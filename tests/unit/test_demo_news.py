"""The demo server's two-level "news" sites: the pure page builders, and the server's routing, faults and
/_stats counts over real HTTP on loopback."""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import pytest

from embedded.demo_pages import BadParam, NewsRequest, news_article_html, news_listing_html, news_time
from embedded.demo_server import DemoServer


class _Tags(HTMLParser):
    """Every start tag as (tag, attributes), and the text inside each element (by ".class", else by tag)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: dict[str, list[str]] = {}
        self._open: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        self._open.append("." + a["class"] if a.get("class") else tag)

    def handle_endtag(self, tag: str) -> None:
        if self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        for name in self._open:
            self.text.setdefault(name, []).append(data)

    def hrefs(self, cls: str) -> list[str]:
        return [a["href"] or "" for tag, a in self.tags if tag == "a" and a.get("class") == cls]


def test_a_listing_page_links_its_articles_relatively_and_carries_the_query_on():
    page = _Tags(news_listing_html("wire", 1, 2, 3, "pages=2&per_page=3").decode())
    assert page.hrefs("title") == [f"a{k}/index.html?pages=2&per_page=3" for k in (1, 2, 3)]
    assert page.hrefs("next") == ["../p2/index.html?pages=2&per_page=3"]
    assert [a.get("rel") for t, a in page.tags if a.get("class") == "next"] == ["next"]
    assert len([a for t, a in page.tags if t == "article" and a.get("class") == "item"]) == 3
    assert page.text[".title"] == ["Story wire-1-1", "Story wire-1-2", "Story wire-1-3"]
    assert [a["datetime"] for t, a in page.tags if t == "time"] == [news_time("wire", 1, k)[0] for k in (1, 2, 3)]
    assert all(s.strip() for s in page.text[".summary"])


def test_every_listing_page_has_the_same_raw_hrefs_and_the_last_no_next_link():
    first = _Tags(news_listing_html("wire", 1, 2, 2, "").decode())
    last = _Tags(news_listing_html("wire", 2, 2, 2, "").decode())
    assert first.hrefs("title") == last.hrefs("title") == ["a1/index.html", "a2/index.html"]  # no "?" without a query
    assert last.hrefs("next") == []
    assert "Story wire-2-1" in last.text[".title"]


def test_an_article_page_is_derived_from_site_page_and_number_alone():
    one = news_article_html("wire", 2, 3)
    assert one == news_article_html("wire", 2, 3)
    assert one != news_article_html("wire", 2, 4) and one != news_article_html("other", 2, 3)
    page = _Tags(one.decode())
    assert page.text[".title"] == ["Story wire-2-3"]
    assert [a["datetime"] for t, a in page.tags if t == "time"] == [news_time("wire", 2, 3)[0]]
    assert len([t for t, a in page.tags if t == "p"]) == 2 and page.text[".body"]


def test_times_are_iso_and_page_one_is_the_newest():
    newer, older = news_time("wire", 1, 1)[0], news_time("wire", 2, 1)[0]
    assert newer.startswith("2026-01-0") and newer.endswith("Z") and newer > older
    assert news_time("wire", 1, 1)[0] > news_time("wire", 1, 2)[0]


def test_news_parameters_have_defaults_and_bounds():
    assert NewsRequest.parse({}) == NewsRequest(1, 5, 0.0, None, None, 0)
    req = NewsRequest.parse({"pages": "3", "per_page": "50", "hang_article": "2-4", "hang_attempts": "1"})
    assert (req.pages, req.per_page, req.hang_article, req.hang_attempts) == (3, 50, (2, 4), 1)
    bads = [("per_page", "0"), ("per_page", "51"), ("pages", "0"), ("hang_article", "2"), ("hang_article", "0-1")]
    bads += [("hang_article", "x-y"), ("delay_s", "nan"), ("fail_attempts", "-1")]
    for key, value in bads:
        bad = {key: value}
        with pytest.raises(BadParam) as e:
            NewsRequest.parse(bad)
        assert e.value.args[0] == key


@pytest.fixture
def server():
    with DemoServer() as srv:
        yield srv


def get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.read().decode()


def test_the_server_walks_a_news_site_and_counts_listings_and_articles_apart(server):
    start = f"{server.base_url}/news/wire/p1/index.html?pages=2&per_page=2"
    status, body = get(start)
    assert status == 200
    nxt = urljoin(start, _Tags(body).hrefs("next")[0])
    assert urlsplit(nxt).path == "/news/wire/p2/index.html"
    status, body = get(nxt)
    article = urljoin(nxt, _Tags(body).hrefs("title")[1])
    assert article == f"{server.base_url}/news/wire/p2/a2/index.html?pages=2&per_page=2"
    status, body = get(article)
    assert status == 200 and "Story wire-2-2" in body
    get(article)
    assert server.stats()["sites"]["wire"]["hits"] == {"p1": 1, "p2": 1, "p2/a2": 2}
    assert [page for _, page in server.stats()["sites"]["wire"]["requests"]] == ["p1", "p2", "p2/a2", "p2/a2"]


@pytest.mark.parametrize(
    "path",
    [
        "/news/wire/p3/index.html?pages=2",
        "/news/wire/p1/a6/index.html",
        "/news/wire/p0/index.html",
        "/news/wire/p01/index.html",
        "/news/wire/p1/",
        "/news/wire/p1/a1/x.html",
    ],  # fmt: skip
)
def test_pages_outside_the_site_are_404_and_not_counted(server, path):
    assert get(server.base_url + path)[0] == 404
    assert server.stats() == {"sites": {}}


def test_bad_values_are_400_naming_the_parameter(server):
    status, body = get(f"{server.base_url}/news/wire/p1/index.html?per_page=99")
    assert status == 400 and "per_page" in body
    assert server.stats() == {"sites": {}}


def test_the_first_listing_page_fails_its_first_requests_on_demand(server):
    url = f"{server.base_url}/news/wire/p1/index.html?fail_attempts=1"
    assert get(url)[0] == 500
    assert get(url)[0] == 200
    assert get(f"{server.base_url}/news/wire/p1/a1/index.html?fail_attempts=1")[0] == 200  # articles never fail


def test_an_article_hangs_for_its_first_requests_only(server):
    host, port = urlsplit(server.base_url).netloc.split(":")
    query = "pages=2&hang_article=2-1&hang_attempts=1"
    conn = http.client.HTTPConnection(host, int(port), timeout=0.5)
    try:
        conn.request("GET", f"/news/wire/p2/a1/index.html?{query}")
        with pytest.raises(TimeoutError):
            conn.getresponse()  # held open, nothing sent: a hang
    finally:
        conn.close()
    assert get(f"{server.base_url}/news/wire/p2/a1/index.html?{query}")[0] == 200
    assert get(f"{server.base_url}/news/wire/p1/a1/index.html?{query}")[0] == 200  # another article: no hang
    assert server.stats()["sites"]["wire"]["hits"] == {"p1/a1": 1, "p2/a1": 2}
