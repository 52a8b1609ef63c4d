"""What a site crawler is: a `BaseCrawler` subclass that walks pages and returns items.

`BaseCrawler` owns the state reporting so site crawlers cannot get it wrong:
RUNNING when the crawl starts, URL_CALL before each navigation, CALL_DONE
after it, and the result (reported as COMPLETED once it is safely in S3).
A crawler runs in its own process (`node.child`), so a hang is ended by
killing that process; it talks to the agent only through `CrawlContext.emit`.

It also owns what makes a crawl cheap to repeat: `save()` after each page
records a checkpoint (the next URL or token and the page's new items; the agent
keeps it on the site record), `self.resume` is the checkpoint a retried attempt
starts from, `self.known` the item ids an incremental site saw last time (stop
there), and every request waits for its slot of the site's fleet-wide rate
limit and of its domain (`pace(url)`, done by `open()` and `get_json()`, which
also report each answer's status with `answered(url, status)`: the domain's
AutoThrottle, `fleet.crawl.pacing`).

And that no item vanishes silently (`node.itemids`): `fresh()` and what `run()` hands out give each item id
once; another item of the same id is a duplicate (the same content, dropped) or a collision (other content,
dropped, counted and listed in `self.tally`), and an item without an id is skipped (dropped, counted, shown).
The tally rides on every checkpoint and on the result, for the attempt's counts.

And that the crawl is a good citizen: every request sends the crawl's user agent (fleet.yaml's `politeness`), and
`open()` and `get_json()` ask the site's robots.txt first (`node.robots`), unless the site turns that off. A
disallowed start URL ends the crawl with `RobotsDenied` (the site FAILED, reason `robots`, not retried); a
disallowed later page raises `Disallowed` after counting it (`tally.robots_skipped`): a crawler that catches it
goes on without the page, and one that does not ends its crawl there with the items it handed out.
"""

from __future__ import annotations

import abc
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

from fleet.grid_auth import GRID_USER, GridSecret
from fleet.record.blocked import MARKED_CHARS, Markers
from fleet.record.failures import Failure, FailureClass, of_os_error, of_status, retry_after
from node.browser import capabilities, chrome_args
from node.itemids import Ledger, Tally, item_id
from node.robots import ROBOTS_TIMEOUT_S, Robots, fetch_robots

Emit = Callable[..., None]
#: Waits for a request's slot: (its URL; the Crawl-delay robots.txt gives its host, or None).
Pace = Callable[[str, float | None], None]
#: Told each answer: (the URL; its HTTP status, or None when it did not say).
Answered = Callable[[str, int | None], None]
#: Called after each page has answered: (the WebDriver, or None for `get_json`; the URL; its HTTP status or None).
OnPage = Callable[[Any, str, int | None], None]

#: The page's title and the start of its HTML, for the blocked markers (`fleet.record.blocked`).
_PAGE_JS = (
    "return (document.title || '') + '\\n' + "
    f"(document.documentElement ? document.documentElement.outerHTML : '').slice(0, {MARKED_CHARS});"
)
#: The HTTP status of the last navigation, from the Navigation Timing API.
_STATUS_JS = (
    "const e = performance.getEntriesByType('navigation')[0]; return e && e.responseStatus ? e.responseStatus : null;"
)


#: What a browser strips from both ends of an href before reading it: C0 control characters and space.
_EDGES = "".join(map(chr, range(0x21)))


def web_url(href: Any, page_url: str) -> str | None:
    """A URL found on a page (an href, a field read from one), made absolute against the page's URL, if it is a
    web address: http or https, with a host. None for anything else (file:, data:, javascript:, mailto:, blank,
    not a string), so a page cannot send the crawler's browser to a local file or a script. Every URL a
    crawler opens after reading it from a page goes through here."""
    if not isinstance(href, str) or not href.strip(_EDGES):
        return None
    try:
        url = urljoin(page_url, href.strip(_EDGES))
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # a malformed address, e.g. an unclosed IPv6 bracket
        return None
    return url if parts.scheme.lower() in ("http", "https") and host else None


class CrawlError(Exception):
    """The site answered, but not with what the crawl needs (HTTP error, missing element...). `failure` says how,
    by class (`fleet.record.failures`); without one the crawl's failure is classed from the exception."""

    def __init__(self, message: str, failure: Failure | None = None):
        super().__init__(message)
        self.failure = failure


class Blocked(CrawlError):
    """The site refused the crawler (401, 403, 429) or showed a challenge page: class `blocked`, not a crawled page."""


class RobotsDenied(CrawlError):
    """The site's robots.txt disallows its start URL for the crawl's user agent: a retry gets the same answer."""


class Disallowed(Exception):  # noqa: N818 - it reads as what happened to the page, like StopIteration
    """The site's robots.txt disallows this page (not the start URL): it was skipped and counted."""

    def __init__(self, url: str):
        super().__init__(f"robots.txt disallows {url}")
        self.url = url


@dataclass(frozen=True)
class CrawlContext:
    site: str
    start_url: str
    options: Mapping[str, Any]
    attempt: int
    node_id: str
    grid_url: str
    profile_dir: str
    chromium: str = "/usr/bin/chromium"
    chrome_extra_args: tuple[str, ...] = ()
    page_load_timeout_s: float = 600
    emit: Emit = field(default=lambda **_: None, repr=False)
    checkpoint: Mapping[str, Any] | None = None  # resume from here: {next, pages, items}
    mark: tuple[str, ...] = ()  # incremental: item ids seen by the last successful crawl
    pace: Pace = field(default=lambda url, delay: None, repr=False)  # wait for the site's and the domain's slots
    answered: Answered = field(default=lambda url, status: None, repr=False)  # each answer, for the domain's pace
    ended: Callable[[], None] = field(default=lambda: None, repr=False)  # the crawl ended (sends pending counters)
    on_page: OnPage | None = field(default=None, repr=False)  # `gridfleet crawl`'s page lines and screenshots
    grid_secret: GridSecret | None = field(default=None, repr=False)  # the router's credentials come from it
    user_agent: str = ""  # sent by every request of the crawl ("": Chromium's and urllib's own)
    robots: bool = True  # ask the site's robots.txt before each request
    blocked_markers: tuple[str, ...] = ()  # the site's own markers of a blocked page, beside the defaults


class BaseCrawler(abc.ABC):
    #: Crawlers that need no browser (e.g. JSON APIs) set this to False and never touch `driver`.
    needs_browser = True

    def __init__(self, ctx: CrawlContext):
        self.ctx = ctx
        self.options = dict(ctx.options)
        self.resume: Mapping[str, Any] | None = ctx.checkpoint
        self.pages = int(ctx.checkpoint.get("pages") or 0) if ctx.checkpoint else 0
        self.known: frozenset[str] = frozenset(ctx.mark)
        #: what the crawl left out (collisions, items without an id), as its events report it (`node.itemids`)
        self.tally = Tally()
        earlier = [i for i in (ctx.checkpoint or {}).get("items", []) if isinstance(i, Mapping)]
        #: the items `fresh` gave out so far, by id (those of the checkpoint too): a resumed crawl adds no duplicate
        self.collected = Ledger(self.tally, earlier)
        self._emitted = Ledger(self.tally, earlier)  # the items the crawl handed out (`emitted`)
        self._driver: Any = None
        self.markers = Markers(ctx.blocked_markers)
        fields = {"site": ctx.site, "node": ctx.node_id, "attempt": ctx.attempt}
        #: the robots.txt rules of the hosts this crawl visits (None: the site does not ask them)
        self.robots = (
            Robots(ctx.user_agent, lambda url: fetch_robots(url, ctx.user_agent, ROBOTS_TIMEOUT_S), self.pace, **fields)
            if ctx.robots
            else None
        )

    # --- the browser ------------------------------------------------------------
    @property
    def driver(self) -> Any:
        if self._driver is None:
            from selenium import webdriver
            from selenium.webdriver.chrome.options import Options

            opts = Options()
            caps = capabilities(
                self.ctx.chromium,
                chrome_args(Path(self.ctx.profile_dir), self.ctx.chrome_extra_args, self.ctx.user_agent),
                self.ctx.node_id,
                self.ctx.page_load_timeout_s,
            )
            chrome = caps["goog:chromeOptions"]
            opts.binary_location = chrome["binary"]
            for arg in chrome["args"]:
                opts.add_argument(arg)
            opts.add_experimental_option("prefs", chrome["prefs"])
            for key in ("browserName", "gridfleet:node", "timeouts", "goog:loggingPrefs"):
                opts.set_capability(key, caps[key])
            self._driver = webdriver.Remote(
                command_executor=self.ctx.grid_url, options=opts, client_config=self._client_config()
            )
            self.ctx.emit(event="session", id=self._driver.session_id)
        return self._driver

    def _client_config(self) -> Any:
        """The router's basic-auth credentials, in the client's config (never in the URL, which errors name)."""
        secret = self.ctx.grid_secret
        if secret is None:
            return None
        from selenium.webdriver.remote.client_config import ClientConfig

        return ClientConfig(self.ctx.grid_url, username=GRID_USER, password=secret.password)

    def close(self) -> None:
        if self._driver is not None:
            try:
                self._driver.quit()
            finally:
                self._driver = None

    # --- reporting ----------------------------------------------------------------
    def status(self, site_status: str, url: str | None = None) -> None:
        self.ctx.emit(event="status", site_status=site_status, url=url, pages=self.pages)

    def save(self, next_ref: str | None, items: Iterable[Mapping[str, Any]]) -> None:
        """A checkpoint after a page: where the next page is (URL or token; None: the end) and its new items (with
        what the crawl left out so far: collisions, items without an id)."""
        saved = [dict(i) for i in items if item_id(i) is not None]  # one without an id is counted where it is seen
        self.ctx.emit(event="checkpoint", next=next_ref, pages=self.pages, items=saved, **self.tally.plain())

    def fresh(self, items: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
        """The page's items not collected yet, up to the first one an incremental site saw last time; and
        whether that one was reached (stop paging). Each id is given out once: an item of an id given out
        before is a duplicate (the same content: left out) or a collision (other content: left out, counted and
        listed in `tally`); an item without an id is skipped (left out, counted, the first kept to show)."""
        out: list[dict[str, Any]] = []
        for item in items:
            key = item_id(item)
            if key is not None and key in self.known:
                return out, True
            kept = self.collected.admit(item)
            if kept is not None:
                out.append(kept)
        return out, False

    def emitted(self, items: Iterable[Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
        """The items a crawl hands out, by `fresh`'s rules: what `run` returns and `gridfleet crawl` prints, so a
        crawler that does not call `fresh` loses no item silently either."""
        for item in items:
            kept = self._emitted.admit(item)
            if kept is not None:
                yield kept

    def pace(self, url: str | None = None) -> None:
        """Wait for the slot of a request of `url` (default: the start URL) in the site's fleet-wide rate limit (if
        it has one), then in its domain's pace (its host's Crawl-delay, once its robots.txt was read; the configured
        rate; the back-off)."""
        url = url or self.ctx.start_url
        self.ctx.pace(url, self.robots.crawl_delay(url) if self.robots is not None else None)

    def allow(self, url: str) -> None:
        """Raise unless the site's robots.txt lets the crawl fetch `url`: RobotsDenied for the start URL,
        Disallowed (the page counted as skipped) for any other."""
        if self.robots is None or self.robots.allowed(url):
            return
        if url == self.ctx.start_url:
            agent = self.ctx.user_agent or "any user agent"
            raise RobotsDenied(f"robots.txt disallows the start URL {url} for {agent}")
        self.tally.robots_skipped += 1
        self.ctx.emit(event="robots-skipped", url=url, robots_skipped=self.tally.robots_skipped)
        raise Disallowed(url)

    def open(self, url: str) -> None:
        """Navigate to `url`, reporting URL_CALL before and CALL_DONE after. Raises Blocked when the site refused the
        crawler or showed a challenge page (not counted as a page), CrawlError on any other HTTP >= 400, and
        RobotsDenied or Disallowed when the site's robots.txt disallows it (`allow`)."""
        self.allow(url)
        self.pace(url)
        self.status("URL_CALL", url)
        self.driver.get(url)
        code = self.driver.execute_script(_STATUS_JS)
        self.ctx.answered(url, code if isinstance(code, int) else None)
        self._page_seen(self.driver, url, code)
        self.refused(url, code if isinstance(code, int) else None, self.driver.execute_script(_PAGE_JS))
        self.pages += 1
        self.status("CALL_DONE", url)

    def refused(self, url: str, code: int | None, page: str | None, retry_after_s: float | None = None) -> None:
        """Raise if the answer to `url` failed: Blocked for a blocking status or a page (title and HTML) that shows
        a marker, CrawlError for any other HTTP >= 400 (with its class and Retry-After)."""
        failure = of_status(code, retry_after_s) if code is not None else None
        if failure is not None and failure.cls is FailureClass.BLOCKED:
            raise Blocked(f"HTTP {code} from {url}: blocked", failure)
        marker = self.markers.match(page) if isinstance(page, str) else None
        if marker is not None:
            raise Blocked(f"{url} shows a blocked page (marker {marker!r})", Failure(FailureClass.BLOCKED, code))
        if failure is not None:
            raise CrawlError(f"HTTP {code} from {url}", failure)

    def _page_seen(self, driver: Any, url: str, code: Any) -> None:
        if self.ctx.on_page is not None:
            self.ctx.on_page(driver, url, code if isinstance(code, int) else None)

    def get_json(self, url: str, headers: Mapping[str, str] | None = None) -> Any:
        """GET `url` without a browser and parse its JSON, reported, paced and asked of robots.txt like `open`."""
        self.allow(url)
        self.pace(url)
        self.status("URL_CALL", url)
        agent = {"User-Agent": self.ctx.user_agent} if self.ctx.user_agent else {}
        req = urllib.request.Request(url, headers={"Accept": "application/json", **agent, **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=self.ctx.page_load_timeout_s) as resp:  # noqa: S310 - http(s)
                body = resp.read()
                code = resp.status
        except urllib.error.HTTPError as e:
            self.ctx.answered(url, e.code)
            self._page_seen(None, url, e.code)
            self.refused(url, e.code, None, retry_after(e.headers.get("Retry-After") if e.headers else None))
            raise CrawlError(f"HTTP {e.code} from {url}") from None  # < 400: a redirect urllib did not follow
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            cls = of_os_error(e) or FailureClass.CONNECT
            raise CrawlError(f"{url}: {getattr(e, 'reason', e)}", Failure(cls)) from None
        self.ctx.answered(url, code)
        self._page_seen(None, url, code)
        self.pages += 1
        try:
            data = json.loads(body)
        except ValueError:
            raise CrawlError(f"{url} did not answer JSON") from None
        self.status("CALL_DONE", url)
        return data

    # --- the crawl ------------------------------------------------------------------
    @abc.abstractmethod
    def crawl(self) -> Iterable[Mapping[str, Any]]:
        """Walk the site from `self.ctx.start_url`; return (or yield) its items."""

    def walk(self) -> Iterator[dict[str, Any]]:
        """The items the crawl hands out (`emitted`); a disallowed page the crawler did not catch ends it there."""
        try:
            yield from self.emitted(self.crawl())
        except Disallowed:
            return

    def run(self) -> dict[str, Any]:
        if self.needs_browser:
            _ = self.driver  # the session starts while the site is still PENDING
        self.status("RUNNING")
        items = list(self.walk())
        return {"items": items, "pages": self.pages, **self.tally.plain()}
