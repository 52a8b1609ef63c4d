"""The generic `links` crawler: items by CSS selector, pages by a "next" link, no code per site.

Options (per site in fleet.yaml):
  item:      CSS selector of the items on a page (default "a.item")
  next:      CSS selector of the link to the next page (default "a.next"; null: one page only)
  max_pages: stop after this many pages (default 10)
An item is {"id", "text", "href"}; the id is the element's `data-id`, else its href.
After each page it saves a checkpoint (the next page's URL and the page's new
items): a retried attempt resumes at that URL. An incremental site stops at the
first item its last successful crawl had seen.
"""

from __future__ import annotations

from typing import Any, Iterator

from node.crawler import BaseCrawler, CrawlError

_ITEMS_JS = """
return Array.from(document.querySelectorAll(arguments[0])).map(e => ({
  id: e.getAttribute('data-id') || e.getAttribute('href') || '',
  text: (e.textContent || '').trim(),
  href: e.href || null,
}));
"""

_NEXT_JS = """
const e = arguments[0] ? document.querySelector(arguments[0]) : null;
return e && e.href ? e.href : null;
"""


class LinksCrawler(BaseCrawler):
    def crawl(self) -> Iterator[dict[str, Any]]:
        item_sel = self.options.get("item", "a.item")
        next_sel = self.options.get("next", "a.next")
        max_pages = self.options.get("max_pages", 10)
        if not isinstance(item_sel, str) or not item_sel:
            raise CrawlError("option 'item' must be a CSS selector")
        if next_sel is not None and not isinstance(next_sel, str):
            raise CrawlError("option 'next' must be a CSS selector or null")
        if not isinstance(max_pages, int) or max_pages < 1:
            raise CrawlError("option 'max_pages' must be an integer >= 1")
        url: str | None = self.resume["next"] if self.resume else self.ctx.start_url
        while url and self.pages < max_pages:
            self.open(url)
            items, reached = self.fresh(self.driver.execute_script(_ITEMS_JS, item_sel) or [])
            yield from items
            url = None if reached or not next_sel else self.driver.execute_script(_NEXT_JS, next_sel)
            self.save(url if self.pages < max_pages else None, items)
