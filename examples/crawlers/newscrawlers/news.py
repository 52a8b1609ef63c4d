"""A two-level news site: listing pages of articles, each article on a page of its own.

An item is one article: its absolute URL (the id), title, date and body, read on the article's page, and the
summary shown on the listing. After each listing page the crawler saves a checkpoint (the next listing page and
the articles read so far), so a retried attempt starts at the listing page it had not finished.

Options (fleet.yaml, per site): `max_listings` (listing pages an attempt walks, default 5).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from node.crawler import BaseCrawler, CrawlError

#: The listing's articles as (absolute URL, summary); the DOM's `href` property is the absolute URL.
_LISTING_JS = """
return Array.from(document.querySelectorAll('article.item')).map(a => {
  const link = a.querySelector('h2 a');
  const summary = a.querySelector('.summary');
  return [link ? link.href : null, summary ? summary.textContent.trim() : null];
});
"""

_NEXT_JS = "const e = document.querySelector('a.next'); return e ? e.href : null;"

_ARTICLE_JS = """
const text = s => { const e = document.querySelector(s); return e ? e.textContent.trim() : null; };
const time = document.querySelector('time');
return {title: text('h1.title'), date: time ? time.getAttribute('datetime') : null, body: text('div.body')};
"""


class NewsCrawler(BaseCrawler):
    def crawl(self) -> Iterator[dict[str, Any]]:
        max_listings = self.options.get("max_listings", 5)
        if not isinstance(max_listings, int) or max_listings < 1:
            raise CrawlError(f"option max_listings must be a positive integer, got {max_listings!r}")
        url: str | None = self.resume["next"] if self.resume else self.ctx.start_url
        listings = 0
        while url and listings < max_listings:
            self.open(url)
            listings += 1
            entries = self.driver.execute_script(_LISTING_JS) or []
            following = self.driver.execute_script(_NEXT_JS)
            articles, reached = self.fresh({"id": link, "summary": summary} for link, summary in entries if link)
            for article in articles:
                self.open(article["id"])
                details = self.driver.execute_script(_ARTICLE_JS) or {}
                if not details.get("title"):
                    raise CrawlError(f"{article['id']}: no title (h1.title) on the article's page")
                article.update(details)
            yield from articles
            url = None if reached or listings >= max_listings else following
            self.save(url, articles)
