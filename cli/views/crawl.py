"""What `gridfleet crawl` prints, and the two callbacks through which it steers a crawl.

`CrawlOutput` turns a crawler's events into lines: each item as a JSON line on stdout as soon as the crawler
hands it out, each page (URL, HTTP status, time), checkpoint and the end on stderr. Its `pace` is the crawl's
`CrawlContext.pace`: the site's rate (its group's or its domain's, the slower) or its host's Crawl-delay as a local
pause, and the stop after `--max-pages`; its `page` is the
crawl's `CrawlContext.on_page`: the page line and, with `--screenshot`, the page's PNG and HTML.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from fleet.clock import Clock

#: A fleet-wide group is paced 1.1/per_s apart by the fleet; here the same gap is a local pause.
PACE_MARGIN = 1.1


class Enough(BaseException):
    """Raised from `pace()` when `--max-pages` pages are done. A BaseException, so that a crawler's own
    `except Exception` around a request does not swallow the stop."""


def one_line(e: object) -> str:
    """The first line of an error's text with something on it (WebDriver errors append a stack trace)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else repr(e)


class CrawlOutput:
    """The crawl's events as lines: items on `out` (JSON), pages, checkpoints and the end on `err`; the crawl's
    `pace` (local rate pause, `--max-pages`) and `on_page` hook (page lines, screenshots)."""

    def __init__(
        self,
        out: IO[str],
        err: IO[str],
        clock: Clock,
        *,
        shots: Path | None = None,
        max_pages: int | None = None,
        per_s: float | None = None,
    ):
        self.out, self.err, self.clock = out, err, clock
        self.shots, self.max_pages = shots, max_pages
        self.interval_s = PACE_MARGIN / per_s if per_s else 0.0
        self.pages = 0  # page lines printed
        self.items = 0
        self.kept: list[Mapping[str, Any]] = []  # the items printed, for the site's contract at the end
        self._printed: set[str] = set()  # ids of the items printed
        self._saved: list[Mapping[str, Any]] = []  # the checkpoints' items, printed if a stop cuts the crawl short
        self._last_request: float | None = None
        self._url_at: float | None = None
        self._page_seen = False

    def note(self, line: str) -> None:
        print(line, file=self.err, flush=True)

    def run(self, crawler: Any) -> bool:
        """`BaseCrawler.run()`, with the items printed as they come and `--max-pages` able to stop it; whether
        `--max-pages` stopped it."""
        start = self.clock.monotonic()
        if crawler.needs_browser:
            _ = crawler.driver  # the session first, as the node's crawl does
        crawler.status("RUNNING")
        stopped = False
        try:
            for item in crawler.walk():  # by `fresh`'s rules, whether the crawler calls it or not
                self.item(item)
        except Enough:
            stopped = True
            for item in self._saved:  # a crawler that returns its items at the end had not handed them out yet
                if str(item.get("id")) not in self._printed:
                    self.item(item)
        took = self.clock.monotonic() - start
        why = f", stopped after --max-pages {self.max_pages}" if stopped else ""
        pages = f"{self.pages} page" + ("" if self.pages == 1 else "s")
        tally = crawler.tally
        for line in tally.lines():  # what was left out, and why: never silently
            self.note(line)
        left = f"{tally.collisions} collisions, {tally.skipped} skipped (no id)"
        left += f", {tally.robots_skipped} pages skipped (robots.txt)" if tally.robots_skipped else ""
        self.note(f"done: {self.items} items from {pages} in {took:.1f} s; left out: {left}{why}")
        return stopped

    def item(self, item: Mapping[str, Any]) -> None:
        self._printed.add(str(item.get("id")))
        self.items += 1
        self.kept.append(item)
        print(json.dumps(dict(item), ensure_ascii=False, default=str), file=self.out, flush=True)

    # --- CrawlContext's callbacks ---------------------------------------------------------------------------
    def event(self, **e: Any) -> None:
        if e.get("event") == "status" and e.get("site_status") == "URL_CALL":
            self._url_at, self._page_seen = self.clock.monotonic(), False
        elif e.get("event") == "status" and e.get("site_status") == "CALL_DONE" and not self._page_seen:
            self._page_line(str(e.get("url")), None)  # a crawler that reports its pages without open()/get_json()
        elif e.get("event") == "robots-skipped":
            self.note(f"skipped: robots.txt disallows {e.get('url')}")
        elif e.get("event") == "checkpoint":
            items = list(e.get("items") or [])
            self._saved.extend(items)
            nxt = e.get("next") or "none (the end)"
            self.note(f"checkpoint after page {e.get('pages')}: {len(items)} new items, next {nxt}")

    def page(self, driver: Any, url: str, code: int | None) -> None:
        n = self._page_line(url, code)
        if self.shots is not None and driver is not None:
            (self.shots / f"{n:03d}.png").write_bytes(driver.get_screenshot_as_png())
            (self.shots / f"{n:03d}.html").write_text(driver.page_source, encoding="utf-8")

    def pace(self, url: str, crawl_delay: float | None = None) -> None:
        """The local pause before a request of `url`: the site's group's spacing, or its host's robots.txt
        Crawl-delay, or the configured per-domain spacing, whichever is longest (no back-off: one crawl here)."""
        if self.max_pages is not None and self.pages >= self.max_pages:
            raise Enough
        now = self.clock.monotonic()
        gap = max(self.interval_s, crawl_delay or 0.0)
        if self._last_request is not None and gap:
            self.clock.sleep(self._last_request + gap - now)
            now = self.clock.monotonic()
        self._last_request = now

    def _page_line(self, url: str, code: int | None) -> int:
        self.pages += 1
        self._page_seen = True
        took = self.clock.monotonic() - self._url_at if self._url_at is not None else 0.0
        self.note(f"page {self.pages}: HTTP {code if code is not None else '-'} in {took:.2f} s: {url}")
        return self.pages
