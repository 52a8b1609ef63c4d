"""The `api` crawler: a paginated JSON API, no browser (so no Grid session and no Chrome).

Options (per site in fleet.yaml):
  items:       key of the list of items in each response (default "items")
  next:        key of the next page's token; null or missing ends the crawl (default "next")
  token_param: query parameter the token goes back in (default "token")
  id:          key of an item's id, for de-duplication and incremental marks (default "id")
  max_pages:   stop after this many pages (default 10)
  headers:     extra request headers, e.g. {Accept-Language: ko}
The first request is `start_url`; each next one is `start_url` with `token_param`
set to the token. Checkpoints, incremental marks and rate limits work as for
`links`: a retry resumes at the saved token.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from node.crawler import BaseCrawler, CrawlError


def with_param(url: str, key: str, value: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != key] + [(key, value)]
    return urlunsplit(parts._replace(query=urlencode(query)))


class ApiCrawler(BaseCrawler):
    needs_browser = False

    def crawl(self) -> Iterator[dict[str, Any]]:
        items_key = self.options.get("items", "items")
        next_key = self.options.get("next", "next")
        token_param = self.options.get("token_param", "token")
        id_key = self.options.get("id", "id")
        max_pages = self.options.get("max_pages", 10)
        headers = self.options.get("headers") or {}
        for name, value in (("items", items_key), ("next", next_key), ("token_param", token_param), ("id", id_key)):
            if not isinstance(value, str) or not value:
                raise CrawlError(f"option {name!r} must be a non-empty string")
        if not isinstance(max_pages, int) or max_pages < 1:
            raise CrawlError("option 'max_pages' must be an integer >= 1")
        if not isinstance(headers, Mapping):
            raise CrawlError("option 'headers' must be a mapping")
        if self.resume and self.resume.get("next") is None:
            return  # the last attempt fetched every page: its checkpoint holds the items
        token: str | None = self.resume["next"] if self.resume else None
        while self.pages < max_pages:
            url = self.ctx.start_url if token is None else with_param(self.ctx.start_url, token_param, token)
            data = self.get_json(url, {str(k): str(v) for k, v in headers.items()})
            raw = data.get(items_key) if isinstance(data, Mapping) else None
            if not isinstance(raw, list):
                raise CrawlError(f"{url}: no list under {items_key!r}")
            found = [{**i, "id": str(i.get(id_key))} if isinstance(i, Mapping) else {"id": str(i)} for i in raw]
            items, reached = self.fresh(found)
            yield from items
            nxt = data.get(next_key)
            token = None if reached or nxt in (None, "") else str(nxt)
            self.save(token if self.pages < max_pages else None, items)
            if token is None:
                return
