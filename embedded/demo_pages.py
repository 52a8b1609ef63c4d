"""The demo sites' pages and the API's signed page tokens, as pure functions of a request's parameters.

`embedded.demo_server` serves these; what a URL's parameters mean is told in its docstring. Kept apart from the
server so that what a page holds can be read, and tested, without sockets and threads.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import html
import json
import math
import re
import secrets
from dataclasses import dataclass

ITEMS_PER_PAGE = 10
MAX_PER_PAGE = 100
_INT = re.compile(r"[+-]?[0-9]+")


class BadParam(ValueError):
    """A query parameter that cannot be used; args[0] is its name."""


def int_param(params: dict[str, str], key: str, minimum: int | None = None, maximum: int | None = None) -> int | None:
    raw = params.get(key)
    if raw is None:
        return None
    if (
        not _INT.fullmatch(raw.strip())
        or (minimum is not None and int(raw) < minimum)
        or (maximum is not None and int(raw) > maximum)
    ):
        raise BadParam(key)
    return int(raw)


@dataclass(frozen=True)
class PageRequest:
    page: int
    pages: int
    delay_s: float
    hang_page: int | None
    hang_attempts: int | None  # None: every request for hang_page hangs
    fail_attempts: int

    @classmethod
    def parse(cls, params: dict[str, str]) -> PageRequest:
        delay_s = 0.0
        if "delay_s" in params:
            try:
                delay_s = float(params["delay_s"])
            except ValueError:
                raise BadParam("delay_s") from None
            if not math.isfinite(delay_s) or delay_s < 0:
                raise BadParam("delay_s")
        page = int_param(params, "page")  # out of range is a 404, not a 400
        pages = int_param(params, "pages", minimum=1)
        return cls(
            page=1 if page is None else page,
            pages=1 if pages is None else pages,
            delay_s=delay_s,
            hang_page=int_param(params, "hang_page", minimum=1),
            hang_attempts=int_param(params, "hang_attempts", minimum=0),
            fail_attempts=int_param(params, "fail_attempts", minimum=0) or 0,
        )


class BadToken(ValueError):
    """A pagination token this server did not issue for this site."""


class PageTokens:
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
        """The page a token designates; raises BadToken unless issued here for site."""
        body, _, sig = token.partition(".")
        if not hmac.compare_digest(self._sign(body).encode(), sig.encode()):
            raise BadToken(token)
        try:
            payload = json.loads(_b64decode(body))
        except (ValueError, binascii.Error):
            raise BadToken(token) from None
        if not isinstance(payload, dict) or payload.get("site") != site:
            raise BadToken(token)
        page = payload.get("page")
        if type(page) is not int or page < 1:
            raise BadToken(token)
        return page

    def _sign(self, body: str) -> str:
        digest = hmac.new(self._key, body.encode(), hashlib.sha256).digest()
        return _b64encode(digest[: self._SIG_BYTES])


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def item_ids(name: str, page: int, count: int = ITEMS_PER_PAGE) -> list[str]:
    return [f"{name}-{page}-{i}" for i in range(1, count + 1)]


def document(title: str, body: str) -> bytes:
    title = html.escape(title)
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{title}</title></head>\n'
        f"<body>\n{body}\n</body></html>\n"
    ).encode()


def page_html(name: str, page: int, next_href: str | None) -> bytes:
    lines = [f"<h1>{html.escape(name)} page {page}</h1>", "<ul>"]
    for item_id in map(html.escape, item_ids(name, page)):
        lines.append(f'<li><a class="item" data-id="{item_id}" href="/item/{item_id}">Item {item_id}</a></li>')
    lines.append("</ul>")
    if next_href is not None:
        lines.append(f'<a class="next" href="{html.escape(next_href)}">Next</a>')
    return document(f"{name} page {page}", "\n".join(lines))


def message_html(message: str) -> bytes:
    return document(message, f"<p>{html.escape(message)}</p>")
