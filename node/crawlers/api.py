"""The `api` crawler: a paginated JSON API, no browser (so no Grid session and no Chrome).

Options (per site in fleet.yaml): `items`, `next`, `token_param`, `id`,
`max_pages` and `headers` (e.g. {Accept-Language: ko}), as `fleet.crawl.crawlers.ApiOptions`
defines them with their defaults; the config is checked against it when it loads,
and the crawler reads them through it.
The first request is `start_url`; each next one is `start_url` with `token_param`
set to the token. Checkpoints, incremental marks and rate limits work as for
`links`: a retry resumes at the saved token.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from fleet.crawl.crawlers import ApiOptions, OptionsError
from node.crawler import BaseCrawler, CrawlError, Disallowed


def with_param(url: str, key: str, value: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != key] + [(key, value)]
    return urlunsplit(parts._replace(query=urlencode(query)))


def _with_id(raw: Any, id_key: str) -> dict[str, Any]:
    """An item of the response with its id as a string (a value that is not an object is its own id); an item
    whose `id_key` is missing or null has no id (`fresh` skips it, counted)."""
    if not isinstance(raw, Mapping):
        return {"id": str(raw)}
    key = raw.get(id_key)
    return {**raw, "id": None if key is None else str(key)}


class ApiCrawler(BaseCrawler):
    needs_browser = False

    def crawl(self) -> Iterator[dict[str, Any]]:
        try:
            opts = ApiOptions.read(self.options)
        except OptionsError as e:
            raise CrawlError(str(e)) from None
        items_key, next_key, token_param, id_key = opts.items, opts.next, opts.token_param, opts.id
        max_pages, headers = opts.max_pages, opts.headers
        if self.resume and self.resume.get("next") is None:
            return  # the last attempt fetched every page: its checkpoint holds the items
        token: str | None = self.resume["next"] if self.resume else None
        while self.pages < max_pages:
            url = self.ctx.start_url if token is None else with_param(self.ctx.start_url, token_param, token)
            try:
                data = self.get_json(url, dict(headers))
            except Disallowed:  # robots.txt: a next page the crawl may not fetch ends it (counted)
                return
            raw = data.get(items_key) if isinstance(data, Mapping) else None
            if not isinstance(raw, list):
                raise CrawlError(f"{url}: no list under {items_key!r}")
            found = [_with_id(i, id_key) for i in raw]
            items, reached = self.fresh(found)
            yield from items
            nxt = data.get(next_key)
            token = None if reached or nxt in (None, "") else str(nxt)
            self.save(token if self.pages < max_pages else None, items)
            if token is None:
                return
