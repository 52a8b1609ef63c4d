"""The generic `links` crawler: items by CSS selector, pages by a "next" link, no code per site.

Options (per site in fleet.yaml): `item`, `next` (null: one page only) and
`max_pages`, as `fleet.crawlers.LinksOptions` defines them with their defaults;
the config is checked against it when it loads, and the crawler reads them through it.
An item is {"id", "text", "href"}; the id is the element's `data-id`, else its href.
After each page it saves a checkpoint (the next page's URL and the page's new
items): a retried attempt resumes at that URL. An incremental site stops at the
first item its last successful crawl had seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fleet.crawlers import LinksOptions, OptionsError
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
        try:
            opts = LinksOptions.read(self.options)
        except OptionsError as e:
            raise CrawlError(str(e)) from None
        item_sel, next_sel, max_pages = opts.item, opts.next, opts.max_pages
        url: str | None = self.resume["next"] if self.resume else self.ctx.start_url
        while url and self.pages < max_pages:
            self.open(url)
            items, reached = self.fresh(self.driver.execute_script(_ITEMS_JS, item_sel) or [])
            yield from items
            url = None if reached or not next_sel else self.driver.execute_script(_NEXT_JS, next_sel)
            self.save(url if self.pages < max_pages else None, items)
