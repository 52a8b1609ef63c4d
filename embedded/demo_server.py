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

``GET /_stats`` tells what was fetched, per site: ``hits`` (requests per page),
``times`` (arrival times) and ``requests`` (``[epoch_s, page]`` per request in
arrival order, the last 10,000). ``POST /_reset`` forgets all of it; it needs
the server's token in an ``X-Gridfleet-Token`` header (the local stack makes one
per stack and keeps it in its state file), so that no page a browser of the
machine opens can reset a checker's counts.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import hmac
import html
import json
import logging
import math
import os
import re
import secrets
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from fleet.httpd import TOKEN_ENV, TOKEN_HEADER, QuietHandler, token_ok

log = logging.getLogger(__name__)

ITEMS_PER_PAGE = 10
MAX_PER_PAGE = 100
MAX_REQUESTS_KEPT = 10_000  # per site, in /_stats "requests"
_NAME = r"[A-Za-z0-9._-]+"
_SITE_PATH = re.compile(rf"/s/({_NAME})/?")
_API_PATH = re.compile(rf"/api/({_NAME})")
_ITEM_PATH = re.compile(rf"/item/({_NAME})")
_INT = re.compile(r"[+-]?[0-9]+")


class _BadParam(ValueError):
    """A query parameter that cannot be used; args[0] is its name."""


def _int(
    params: dict[str, str], key: str, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    raw = params.get(key)
    if raw is None:
        return None
    if (
        not _INT.fullmatch(raw.strip())
        or (minimum is not None and int(raw) < minimum)
        or (maximum is not None and int(raw) > maximum)
    ):
        raise _BadParam(key)
    return int(raw)


@dataclass(frozen=True)
class _PageRequest:
    page: int
    pages: int
    delay_s: float
    hang_page: int | None
    hang_attempts: int | None  # None: every request for hang_page hangs
    fail_attempts: int

    @classmethod
    def parse(cls, params: dict[str, str]) -> _PageRequest:
        delay_s = 0.0
        if "delay_s" in params:
            try:
                delay_s = float(params["delay_s"])
            except ValueError:
                raise _BadParam("delay_s") from None
            if not math.isfinite(delay_s) or delay_s < 0:
                raise _BadParam("delay_s")
        page = _int(params, "page")  # out of range is a 404, not a 400
        pages = _int(params, "pages", minimum=1)
        return cls(
            page=1 if page is None else page,
            pages=1 if pages is None else pages,
            delay_s=delay_s,
            hang_page=_int(params, "hang_page", minimum=1),
            hang_attempts=_int(params, "hang_attempts", minimum=0),
            fail_attempts=_int(params, "fail_attempts", minimum=0) or 0,
        )


class _BadToken(ValueError):
    """A pagination token this server did not issue for this site."""


class _Tokens:
    """Opaque, signed API page tokens: ``b64(json {site, page}).b64(hmac[:16])``.

    The key is random per server instance, so tokens do not outlive it.
    """

    _SIG_BYTES = 16

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def issue(self, site: str, page: int) -> str:
        payload = json.dumps({"site": site, "page": page}, separators=(",", ":")).encode()
        body = _b64encode(payload)
        return f"{body}.{self._sign(body)}"

    def page_of(self, site: str, token: str) -> int:
        """The page a token designates; raises _BadToken unless issued here for site."""
        body, _, sig = token.partition(".")
        if not hmac.compare_digest(self._sign(body).encode(), sig.encode()):
            raise _BadToken(token)
        try:
            payload = json.loads(_b64decode(body))
        except (ValueError, binascii.Error):
            raise _BadToken(token) from None
        if not isinstance(payload, dict) or payload.get("site") != site:
            raise _BadToken(token)
        page = payload.get("page")
        if type(page) is not int or page < 1:
            raise _BadToken(token)
        return page

    def _sign(self, body: str) -> str:
        digest = hmac.new(self._key, body.encode(), hashlib.sha256).digest()
        return _b64encode(digest[: self._SIG_BYTES])


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _item_ids(name: str, page: int, count: int = ITEMS_PER_PAGE) -> list[str]:
    return [f"{name}-{page}-{i}" for i in range(1, count + 1)]


def _document(title: str, body: str) -> bytes:
    title = html.escape(title)
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{title}</title></head>\n'
        f"<body>\n{body}\n</body></html>\n"
    ).encode()


def _page_html(name: str, page: int, next_href: str | None) -> bytes:
    lines = [f"<h1>{html.escape(name)} page {page}</h1>", "<ul>"]
    for item_id in map(html.escape, _item_ids(name, page)):
        lines.append(
            f'<li><a class="item" data-id="{item_id}" href="/item/{item_id}">Item {item_id}</a></li>'
        )
    lines.append("</ul>")
    if next_href is not None:
        lines.append(f'<a class="next" href="{html.escape(next_href)}">Next</a>')
    return _document(f"{name} page {page}", "\n".join(lines))


def _message_html(message: str) -> bytes:
    return _document(message, f"<p>{html.escape(message)}</p>")


class _State:
    """Hit counts and arrival times per site, shared by all request threads."""

    def __init__(self, token: str) -> None:
        self.stopping = threading.Event()
        self.token = token
        self._lock = threading.Lock()
        self._sites: dict[str, dict[str, Any]] = {}

    def record(self, name: str, page: int) -> int:
        """Count one request for a page; returns how many there have been so far."""
        with self._lock:
            site = self._sites.setdefault(
                name, {"hits": {}, "times": [], "requests": deque(maxlen=MAX_REQUESTS_KEPT)}
            )
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
                        "hits": dict(sorted(site["hits"].items(), key=lambda kv: int(kv[0]))),
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
        elif method == "GET" and (match := _SITE_PATH.fullmatch(url.path)):
            self._site_page(match.group(1), url.path, url.query)
        elif method == "GET" and (match := _API_PATH.fullmatch(url.path)):
            self._api_page(match.group(1), url.query)
        elif method == "GET" and (match := _ITEM_PATH.fullmatch(url.path)):
            self._send_html(200, _message_html(f"item {match.group(1)}"))
        else:
            self._send_html(404, _message_html("not found"))

    def _site_page(self, name: str, path: str, query: str) -> None:
        pairs = parse_qsl(query, keep_blank_values=True)
        try:
            req = _PageRequest.parse(dict(pairs))
        except _BadParam as exc:
            self._send_html(400, _message_html(f"bad value for {exc.args[0]}"))
            return
        if not 1 <= req.page <= req.pages:
            self._send_html(404, _message_html(f"{name} has no page {req.page}"))
            return
        attempt = self._await_turn(name, req)
        if attempt is None:
            return
        if req.page == 1 and attempt <= req.fail_attempts:
            self._send_html(500, _message_html(f"{name} failed on purpose (attempt {attempt})"))
            return
        next_href = None
        if req.page < req.pages:
            kept = [(k, v) for k, v in pairs if k != "page"]
            next_href = f"{path}?{urlencode(kept + [('page', str(req.page + 1))])}"
        self._send_html(200, _page_html(name, req.page, next_href))

    def _api_page(self, name: str, query: str) -> None:
        params = dict(parse_qsl(query, keep_blank_values=True))
        try:
            if "page" in params:  # the API pages by token only
                raise _BadParam("page")
            req = _PageRequest.parse(params)
            per_page = _int(params, "per_page", minimum=1, maximum=MAX_PER_PAGE) or ITEMS_PER_PAGE
        except _BadParam as exc:
            self._send_json({"error": f"bad value for {exc.args[0]}"}, 400)
            return
        tokens = self.server.tokens
        if "token" in params:
            try:
                req = replace(req, page=tokens.page_of(name, params["token"]))
            except _BadToken:
                self._send_json({"error": "bad token"}, 400)
                return
        if req.page > req.pages:
            self._send_json({"error": f"{name} has no page {req.page}"}, 404)
            return
        attempt = self._await_turn(name, req)
        if attempt is None:
            return
        if req.page == 1 and attempt <= req.fail_attempts:
            self._send_json({"error": f"{name} failed on purpose (attempt {attempt})"}, 500)
            return
        items = [
            {"id": item_id, "title": f"Item {item_id}"} for item_id in _item_ids(name, req.page, per_page)
        ]
        self._send_json(
            {
                "site": name,
                "page": req.page,
                "items": items,
                "next": tokens.issue(name, req.page + 1) if req.page < req.pages else None,
            }
        )

    def _await_turn(self, name: str, req: _PageRequest) -> int | None:
        """Counts the request and plays its hang and delay.

        Returns which request for this page it is, or None if the server
        stopped meanwhile (the connection then closes without a response).
        """
        state = self.server.state
        attempt = state.record(name, req.page)
        if req.page == req.hang_page and (req.hang_attempts is None or attempt <= req.hang_attempts):
            state.stopping.wait()  # hold the connection, send nothing, until stop()
            return None
        if req.delay_s and state.stopping.wait(req.delay_s):
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
        self.tokens = _Tokens()
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
        return f"http://{host}:{port}"

    def stats(self) -> dict[str, Any]:
        return self._state.stats()

    def __enter__(self) -> DemoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m embedded.demo_server", description="Serve the demo test sites."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8800, help="0 picks a free port")
    args = parser.parse_args(argv)

    done = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda signum, frame: done.set())
        for sig in (signal.SIGTERM, signal.SIGINT)
    }
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
