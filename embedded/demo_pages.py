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


def delay_param(params: dict[str, str]) -> float:
    """`delay_s`: seconds to wait before answering (0 when absent)."""
    if "delay_s" not in params:
        return 0.0
    try:
        delay_s = float(params["delay_s"])
    except ValueError:
        raise BadParam("delay_s") from None
    if not math.isfinite(delay_s) or delay_s < 0:
        raise BadParam("delay_s")
    return delay_s


@dataclass(frozen=True)
class PageRequest:
    page: int
    pages: int
    delay_s: float
    hang_page: int | None
    hang_attempts: int | None  # None: every request for hang_page hangs
    fail_attempts: int
    items: int = ITEMS_PER_PAGE  # items on each page
    status: int | None = None  # every page answers this status (a 4xx or 5xx) instead of its content
    retry_after: int | None = None  # with `status`: the Retry-After header, in seconds
    challenge: bool = False  # every page is a bot-check interstitial, served with HTTP 200

    @classmethod
    def parse(cls, params: dict[str, str]) -> PageRequest:
        page = int_param(params, "page")  # out of range is a 404, not a 400
        pages = int_param(params, "pages", minimum=1)
        items = int_param(params, "items", minimum=0, maximum=MAX_PER_PAGE)
        return cls(
            page=1 if page is None else page,
            pages=1 if pages is None else pages,
            delay_s=delay_param(params),
            hang_page=int_param(params, "hang_page", minimum=1),
            hang_attempts=int_param(params, "hang_attempts", minimum=0),
            fail_attempts=int_param(params, "fail_attempts", minimum=0) or 0,
            items=ITEMS_PER_PAGE if items is None else items,
            status=int_param(params, "status", minimum=400, maximum=599),
            retry_after=int_param(params, "retry_after", minimum=0, maximum=86400),
            challenge=int_param(params, "challenge", minimum=0, maximum=1) == 1,
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


def page_html(name: str, page: int, next_href: str | None, items: int = ITEMS_PER_PAGE) -> bytes:
    lines = [f"<h1>{html.escape(name)} page {page}</h1>", "<ul>"]
    for item_id in map(html.escape, item_ids(name, page, items)):
        lines.append(f'<li><a class="item" data-id="{item_id}" href="/item/{item_id}">Item {item_id}</a></li>')
    lines.append("</ul>")
    if next_href is not None:
        lines.append(f'<a class="next" href="{html.escape(next_href)}">Next</a>')
    return document(f"{name} page {page}", "\n".join(lines))


#: A bot-check interstitial as common defences serve it (its title is one of `fleet.record.blocked`'s default markers).
CHALLENGE_TITLE = "Just a moment..."


def challenge_html() -> bytes:
    return document(CHALLENGE_TITLE, "<p>Checking your browser before accessing this site.</p>")


def refusal_html(status: int) -> bytes:
    """A refusal page: "Access denied" for 401 and 403, else the status's plain message."""
    return message_html("Access denied" if status in (401, 403) else f"HTTP {status} on purpose")


def message_html(message: str) -> bytes:
    return document(message, f"<p>{html.escape(message)}</p>")


# --- the "news" sites: listing pages of articles, each article a page of its own ------------------------------

NEWS_PER_PAGE = 5
NEWS_MAX_PER_PAGE = 50
_ARTICLE = re.compile(r"([1-9][0-9]{0,8})-([1-9][0-9]{0,8})")
_WORDS = (
    "harbour council budget rail storm festival market river school bridge museum election "
    "library harvest tunnel airport orchestra stadium ferry garden"
).split()


@dataclass(frozen=True)
class NewsRequest:
    """The parameters of a news site's URL, the same on its listing and article pages (links carry them on)."""

    pages: int
    per_page: int
    delay_s: float
    hang_article: tuple[int, int] | None  # (listing page, article) that hangs
    hang_attempts: int | None  # None: every request for hang_article hangs
    fail_attempts: int  # listing page 1 answers 500 to its first fail_attempts requests

    @classmethod
    def parse(cls, params: dict[str, str]) -> NewsRequest:
        pages = int_param(params, "pages", minimum=1)
        per_page = int_param(params, "per_page", minimum=1, maximum=NEWS_MAX_PER_PAGE)
        hang_article = None
        if "hang_article" in params:
            match = _ARTICLE.fullmatch(params["hang_article"].strip())
            if not match:
                raise BadParam("hang_article")
            hang_article = (int(match.group(1)), int(match.group(2)))
        return cls(
            pages=1 if pages is None else pages,
            per_page=NEWS_PER_PAGE if per_page is None else per_page,
            delay_s=delay_param(params),
            hang_article=hang_article,
            hang_attempts=int_param(params, "hang_attempts", minimum=0),
            fail_attempts=int_param(params, "fail_attempts", minimum=0) or 0,
        )


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("/".join(map(str, parts)).encode()).digest()


def news_title(site: str, page: int, article: int) -> str:
    return f"Story {site}-{page}-{article}"


def news_time(site: str, page: int, article: int) -> tuple[str, str]:
    """An article's (ISO datetime, human text): page 1 the newest day, earlier articles of a page later."""
    day = max(1, 10 - page)
    hour = max(0, 23 - article)
    minute = _digest(site, page, article)[0] % 60
    return f"2026-01-0{day}T{hour:02d}:{minute:02d}:00Z", f"{day} January 2026, {hour:02d}:{minute:02d}"


def news_words(site: str, page: int, article: int, part: str, count: int) -> str:
    """`count` words, the same for the same (site, page, article, part)."""
    digest = _digest(site, page, article, part)
    return " ".join(_WORDS[b % len(_WORDS)] for b in digest[:count])


def _with_query(href: str, query: str) -> str:
    return html.escape(f"{href}?{query}" if query else href)


def news_listing_html(site: str, page: int, pages: int, per_page: int, query: str) -> bytes:
    """Listing page `page` of a news site. Article links are relative (`a<K>/index.html`, the same text on every
    listing page) and carry the request's `query` on, as the link to the next (older) listing page does."""
    lines = [f"<h1>{html.escape(site)} news, page {page}</h1>"]
    for k in range(1, per_page + 1):
        iso, text = news_time(site, page, k)
        lines += [
            '<article class="item">',
            f'<h2><a class="title" href="{_with_query(f"a{k}/index.html", query)}">'
            f"{html.escape(news_title(site, page, k))}</a></h2>",
            f'<time datetime="{iso}">{text}</time>',
            f'<p class="summary">{html.escape(news_words(site, page, k, "summary", 6))}</p>',
            "</article>",
        ]
    if page < pages:
        lines.append(f'<a class="next" rel="next" href="{_with_query(f"../p{page + 1}/index.html", query)}">Older</a>')
    return document(f"{site} news page {page}", "\n".join(lines))


def news_article_html(site: str, page: int, article: int) -> bytes:
    """Article `article` of listing page `page`: its title, time and a body of two paragraphs."""
    iso, text = news_time(site, page, article)
    body = "\n".join(f"<p>{html.escape(news_words(site, page, article, part, 12))}</p>" for part in ("lead", "rest"))
    return document(
        news_title(site, page, article),
        f'<h1 class="title">{html.escape(news_title(site, page, article))}</h1>\n'
        f'<time datetime="{iso}">{text}</time>\n<div class="body">\n{body}\n</div>',
    )
