"""Test web sites for the embedded default, served on loopback.

Crawls run locally (and the tests) need sites that paginate, answer slowly,
hang or fail on demand. Every behaviour is chosen by the URL, e.g.
``/s/shop/?pages=3&delay_s=0.5&hang_page=2&hang_attempts=1``, so any sites file
can describe a test site without this server knowing about it beforehand.

The same sites are also served as a paginated JSON API, for crawls of APIs:
``/api/shop?pages=3&per_page=20`` answers page 1 as
``{"site": "shop", "page": 1, "items": [{"id": "shop-1-1", "title": "Item shop-1-1"}, ...],
"next": "<token>"}``; the next page is that URL plus ``&token=<token>``, and the
last page has ``"next": null``. Items carry the ids the HTML pages do, so HTML and
API crawls of a site name agree, and both count in the same ``/_stats``. Tokens
are opaque and signed with a key of this server instance: a forged token or one
issued for another site is a 400. The behaviour parameters (``delay_s``,
``hang_page``, ``hang_attempts``, ``fail_attempts``) work as for the HTML pages,
for the page the token designates (page 1 without a token); ``page`` itself is
not accepted by the API. Errors are JSON: ``{"error": "..."}``.

A site can also be a two-level "news" site: listing pages of articles, each
article a page of its own. ``/news/shop/p1/index.html?pages=2&per_page=5`` is
listing page 1; its articles link to ``a<K>/index.html`` (relative, so every
listing page has the same hrefs) and page N < ``pages`` links to
``../p<N+1>/index.html``, each link carrying the request's own query string. An
article is ``/news/shop/p<N>/a<K>/index.html``. ``per_page`` is 1-50 (default 5);
``delay_s`` and ``fail_attempts`` (listing page 1) work as for ``/s/`` pages, and
``hang_article=N-K`` with ``hang_attempts`` makes article K of listing page N
hang as ``hang_page`` does.

A ``/s/`` site can also fail the way real sites do: ``status=404`` (any 400-599) answers every page with that
status (401 and 403 with an "Access denied" page), ``retry_after=N`` adds a ``Retry-After: N`` header to it, and
``challenge=1`` answers every page with HTTP 200 and a bot-check interstitial ("Just a moment...", as common
defences show one). ``items=N`` (0-100, default 10) sets the items on each page.

``GET /robots.txt`` allows everything but two sites, so that robots.txt can be tried end to end: every page of
the site ``robots-denied`` (its start URL, as HTML, API or news) and every next page of ``robots-later`` (its
first page is allowed). Asked as ``localhost:<port>`` (a request whose Host is ``localhost``: another origin than
``127.0.0.1:<port>``, so another domain), it also says ``Crawl-delay: 1``: the sites reached through
``{demo-localhost}`` are paced by it, the rest not.

``GET /_stats`` tells what was fetched, per site: ``hits`` (requests per page:
``"1"``, ``"2"``... for ``/s/`` and API pages, ``"p1"`` and ``"p1/a3"`` for a news
site's listing pages and articles), ``times`` (arrival times) and ``requests``
(``[epoch_s, page]`` per request in arrival order, the last 10,000). ``POST /_reset`` forgets all of it; it needs
the server's token in an ``X-Gridfleet-Token`` header (the local stack makes one
per stack and keeps it in its state file), so that no page a browser of the
machine opens can reset a checker's counts.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import signal
import threading
import time
from collections import deque
from dataclasses import replace
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from embedded.demo_pages import (
    ITEMS_PER_PAGE,
    MAX_PER_PAGE,
    BadParam,
    BadToken,
    NewsRequest,
    PageRequest,
    PageTokens,
    challenge_html,
    int_param,
    item_ids,
    message_html,
    news_article_html,
    news_listing_html,
    page_html,
    refusal_html,
)
from fleet.httpd import TOKEN_ENV, TOKEN_HEADER, QuietHandler, token_ok

log = logging.getLogger(__name__)

#: The demo's robots.txt: everything allowed but the two sites named, for every user agent.
ROBOTS_TXT = b"""# gridfleet demo sites
User-agent: *
Disallow: /s/robots-denied/
Disallow: /api/robots-denied
Disallow: /news/robots-denied/
Disallow: /s/robots-later/*page=
"""

#: What robots.txt adds when the server is reached as `localhost` (another origin, another domain): a Crawl-delay
#: that paces that domain alone, so that per-domain pacing can be tried end to end without slowing every demo site.
LOCALHOST_CRAWL_DELAY_S = 1
LOCALHOST_ROBOTS_TXT = ROBOTS_TXT + f"Crawl-delay: {LOCALHOST_CRAWL_DELAY_S}\n".encode()

MAX_REQUESTS_KEPT = 10_000  # per site, in /_stats "requests"
_NAME = r"[A-Za-z0-9._-]+"
_SITE_PATH = re.compile(rf"/s/({_NAME})/?")
_API_PATH = re.compile(rf"/api/({_NAME})")
_ITEM_PATH = re.compile(rf"/item/({_NAME})")
_NEWS_PATH = re.compile(rf"/news/({_NAME})/p([1-9][0-9]{{0,8}})/(?:a([1-9][0-9]{{0,8}})/)?index\.html")


def _page_order(key: str) -> tuple[int, ...]:
    """Pages in their natural order: "2" before "10", "p1" before "p1/a2" before "p2"."""
    return tuple(int(n) for n in re.findall(r"[0-9]+", key)) or (0,)


class _State:
    """Hit counts and arrival times per site, shared by all request threads."""

    def __init__(self, token: str) -> None:
        self.stopping = threading.Event()
        self.token = token
        self._lock = threading.Lock()
        self._sites: dict[str, dict[str, Any]] = {}

    def record(self, name: str, page: int | str) -> int:
        """Count one request for a page; returns how many there have been so far."""
        with self._lock:
            site = self._sites.setdefault(name, {"hits": {}, "times": [], "requests": deque(maxlen=MAX_REQUESTS_KEPT)})
            now = time.time()
            site["times"].append(now)
            site["requests"].append((now, page))
            key = str(page)
            site["hits"][key] = site["hits"].get(key, 0) + 1
            return site["hits"][key]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "sites": {
                    name: {
                        "hits": dict(sorted(site["hits"].items(), key=lambda kv: _page_order(kv[0]))),
                        "times": list(site["times"]),
                        "requests": [[at, page] for at, page in site["requests"]],
                    }
                    for name, site in self._sites.items()
                }
            }

    def reset(self) -> None:
        with self._lock:
            self._sites.clear()


class _Handler(QuietHandler):
    server: _HTTPServer
    server_version = "gridfleet-demo/1"
    log = log

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if 0 < length <= 1 << 20:
            self.rfile.read(length)
        self._route("POST")

    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        state = self.server.state
        if url.path == "/_reset":
            if method != "POST":
                self._send(405, b'{"error": "POST only"}', "application/json", {"Allow": "POST"})
            elif not token_ok(self.headers.get(TOKEN_HEADER), state.token):
                self._send_json({"error": f"a valid {TOKEN_HEADER} header is required"}, 403)
            else:
                state.reset()
                self._send_json({"ok": True})
        elif method == "GET" and url.path == "/_stats":
            self._send_json(state.stats())
        elif method == "GET" and url.path == "/robots.txt":
            local = urlsplit(f"//{self.headers.get('Host') or ''}").hostname == "localhost"
            self._send(200, LOCALHOST_ROBOTS_TXT if local else ROBOTS_TXT, "text/plain; charset=utf-8")
        elif method == "GET" and (match := _SITE_PATH.fullmatch(url.path)):
            self._site_page(match.group(1), url.path, url.query)
        elif method == "GET" and (match := _API_PATH.fullmatch(url.path)):
            self._api_page(match.group(1), url.query)
        elif method == "GET" and (match := _NEWS_PATH.fullmatch(url.path)):
            article = int(match.group(3)) if match.group(3) else None
            self._news_page(match.group(1), int(match.group(2)), article, url.query)
        elif method == "GET" and (match := _ITEM_PATH.fullmatch(url.path)):
            self._send_html(200, message_html(f"item {match.group(1)}"))
        else:
            self._send_html(404, message_html("not found"))

    def _site_page(self, name: str, path: str, query: str) -> None:
        pairs = parse_qsl(query, keep_blank_values=True)
        try:
            req = PageRequest.parse(dict(pairs))
        except BadParam as exc:
            self._send_html(400, message_html(f"bad value for {exc.args[0]}"))
            return
        if not 1 <= req.page <= req.pages:
            self._send_html(404, message_html(f"{name} has no page {req.page}"))
            return
        attempt = self._await_turn(name, req.page, req.page == req.hang_page, req.hang_attempts, req.delay_s)
        if attempt is None:
            return
        if req.page == 1 and attempt <= req.fail_attempts:
            self._send_html(500, message_html(f"{name} failed on purpose (attempt {attempt})"))
            return
        if req.status is not None:
            after = {"Retry-After": str(req.retry_after)} if req.retry_after is not None else None
            self._send(req.status, refusal_html(req.status), "text/html; charset=utf-8", after)
            return
        if req.challenge:
            self._send_html(200, challenge_html())
            return
        next_href = None
        if req.page < req.pages:
            kept = [(k, v) for k, v in pairs if k != "page"]
            next_href = f"{path}?{urlencode(kept + [('page', str(req.page + 1))])}"
        self._send_html(200, page_html(name, req.page, next_href, req.items))

    def _api_page(self, name: str, query: str) -> None:
        params = dict(parse_qsl(query, keep_blank_values=True))
        try:
            if "page" in params:  # the API pages by token only
                raise BadParam("page")
            req = PageRequest.parse(params)
            per_page = int_param(params, "per_page", minimum=1, maximum=MAX_PER_PAGE) or ITEMS_PER_PAGE
        except BadParam as exc:
            self._send_json({"error": f"bad value for {exc.args[0]}"}, 400)
            return
        tokens = self.server.tokens
        if "token" in params:
            try:
                req = replace(req, page=tokens.page_of(name, params["token"]))
            except BadToken:
                self._send_json({"error": "bad token"}, 400)
                return
        if req.page > req.pages:
            self._send_json({"error": f"{name} has no page {req.page}"}, 404)
            return
        attempt = self._await_turn(name, req.page, req.page == req.hang_page, req.hang_attempts, req.delay_s)
        if attempt is None:
            return
        if req.page == 1 and attempt <= req.fail_attempts:
            self._send_json({"error": f"{name} failed on purpose (attempt {attempt})"}, 500)
            return
        items = [{"id": item_id, "title": f"Item {item_id}"} for item_id in item_ids(name, req.page, per_page)]
        self._send_json(
            {
                "site": name,
                "page": req.page,
                "items": items,
                "next": tokens.issue(name, req.page + 1) if req.page < req.pages else None,
            }
        )

    def _news_page(self, name: str, page: int, article: int | None, query: str) -> None:
        try:
            req = NewsRequest.parse(dict(parse_qsl(query, keep_blank_values=True)))
        except BadParam as exc:
            self._send_html(400, message_html(f"bad value for {exc.args[0]}"))
            return
        if page > req.pages or (article is not None and article > req.per_page):
            what = f"page {page}" if article is None else f"article {page}-{article}"
            self._send_html(404, message_html(f"{name} has no {what}"))
            return
        key = f"p{page}" if article is None else f"p{page}/a{article}"
        hangs = article is not None and req.hang_article == (page, article)
        attempt = self._await_turn(name, key, hangs, req.hang_attempts, req.delay_s)
        if attempt is None:
            return
        if article is not None:
            self._send_html(200, news_article_html(name, page, article))
        elif page == 1 and attempt <= req.fail_attempts:
            self._send_html(500, message_html(f"{name} failed on purpose (attempt {attempt})"))
        else:
            self._send_html(200, news_listing_html(name, page, req.pages, req.per_page, query))

    def _await_turn(
        self, name: str, page: int | str, hangs: bool, hang_attempts: int | None, delay_s: float
    ) -> int | None:
        """Counts the request and plays its hang (`hangs`: this is the page that hangs, for its first
        `hang_attempts` requests; None: all of them) and delay.

        Returns which request for this page it is, or None if the server
        stopped meanwhile (the connection then closes without a response).
        """
        state = self.server.state
        attempt = state.record(name, page)
        if hangs and (hang_attempts is None or attempt <= hang_attempts):
            state.stopping.wait()  # hold the connection, send nothing, until stop()
            return None
        if delay_s and state.stopping.wait(delay_s):
            return None
        return attempt

    def _send_json(self, payload: dict[str, Any], status: int = 200) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _send_html(self, status: int, body: bytes) -> None:
        self._send(status, body, "text/html; charset=utf-8")


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # hung handlers are released by stop(), not joined

    def __init__(self, address: tuple[str, int], state: _State) -> None:
        self.state = state
        self.tokens = PageTokens()
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("error serving %s", client_address, exc_info=True)


class DemoServer:
    """Serves the demo sites from a daemon thread; usable as a context manager.

    `token` is what ``POST /_reset`` must carry; without one the server makes its own (`self.token`)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> None:
        self._address = (host, port)
        self.token = token or secrets.token_urlsafe(32)
        self._state = _State(self.token)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False

    def start(self) -> DemoServer:
        if self._httpd is not None or self._stopped:
            raise RuntimeError("a DemoServer can be started only once")
        self._httpd = _HTTPServer(self._address, self._state)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"demo-server-{self._httpd.server_address[1]}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._state.stopping.set()
        if self._httpd is not None and self._thread is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join()

    @property
    def base_url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the DemoServer has not been started")
        host, port = self._httpd.server_address[:2]
        assert isinstance(host, str)  # an AF_INET server's address
        return f"http://{host}:{port}"

    def stats(self) -> dict[str, Any]:
        return self._state.stats()

    def __enter__(self) -> DemoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedded.demo_server", description="Serve the demo test sites.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8800, help="0 picks a free port")
    args = parser.parse_args(argv)

    done = threading.Event()
    previous = {sig: signal.signal(sig, lambda signum, frame: done.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with DemoServer(args.host, args.port, token=os.environ.get(TOKEN_ENV)) as server:
            print(f"demo server on {server.base_url}", flush=True)
            done.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
