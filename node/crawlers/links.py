"""The generic `links` crawler: items by CSS selector, pages by a "next" link, no code per site.

Options (per site in fleet.yaml): `item`, `next` (null: one page only), `max_pages` (listing pages), `fields`,
`detail` and `id`, as `fleet.crawl.crawlers.LinksOptions` defines them with their defaults; the config is checked
against it when it loads (each CSS selector parsed, `fleet.crawl.css`), and the crawler reads them through it. The page
scripts still try each selector in the browser before using it (`bad`): one the config's parser passed and
Chromium refuses fails the attempt naming it.

Without `fields` an item is {"id", "text", "href"}. With `fields` it is {"id", <field>...}: each field is a CSS
selector within the item element, its trimmed text, or with "@attr" that attribute (`href` and `src` as absolute
URLs); a selector that matches nothing gives null. An item's id is `id` when given (a field name, or a template
of the item's fields such as "{link}#{name}"), else its `data-id`, else its link: the field `detail.link` names,
else the element's absolute href, else the first field read from "@href". Ids are absolute URLs, so two pages that
both link to a relative "a1/index.html" give two items. Items of one id are given out once (`BaseCrawler.fresh`):
another of the same id and other content is a collision, one without an id is skipped, both counted and shown.

After each listing page it saves a checkpoint (the next page's URL and the page's new items): a retried attempt
resumes at that URL. With `detail`, each new item's link is opened too (through `open`, so paced by the site's
rate limit) and the detail fields read there are merged into the item; a checkpoint follows each detail page,
holding the items done so far and, as its resume point, the current listing page with the listing and detail
pages counted so far ("<listings> <details> <url>"). A retry reopens that listing page and opens the details of
its items not saved yet only. An incremental site stops at the first item its last successful crawl had seen.
Every URL read from a page (next, detail, the checkpoint's) is opened only if `web_url` finds it http(s).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from fleet.crawl.crawlers import LinksOptions, OptionsError, id_template, render_id, split_field
from node.crawler import BaseCrawler, CrawlError, Disallowed, web_url

#: Reads fields (arguments: a root element, [[name, selector, attribute or null]...]); shared by both scripts.
_FIELDS_JS = """
const abs = v => { try { return new URL(v, document.baseURI).href; } catch (_) { return v; } };
const read = (root, specs) => Object.fromEntries(specs.map(([name, sel, attr]) => {
  const el = sel ? root.querySelector(sel) : root;
  if (!el) return [name, null];
  if (!attr) return [name, (el.textContent || '').trim()];
  const v = el.getAttribute(attr);
  return [name, v === null ? null : (attr === 'href' || attr === 'src') ? abs(v) : v];
}));
const bad = specs => specs.map(s => s[1]).find(sel => {
  if (!sel) return false;
  try { document.createDocumentFragment().querySelector(sel); return false; } catch (_) { return true; }
});
"""

_ITEMS_JS = (
    _FIELDS_JS
    + """
const [itemSel, specs] = arguments;
const wrong = bad([['item', itemSel, null], ...specs]);
if (wrong !== undefined) return {'!bad': wrong};
return Array.from(document.querySelectorAll(itemSel)).map(e => {
  const href = e.getAttribute('href');
  return {
    data_id: e.getAttribute('data-id'),
    url: href === null ? null : abs(href),
    text: (e.textContent || '').trim(),
    href: e.href || null,
    fields: read(e, specs),
  };
});
"""
)

_DETAIL_JS = (
    _FIELDS_JS
    + """
const wrong = bad(arguments[0]);
return wrong !== undefined ? {'!bad': wrong} : read(document.documentElement, arguments[0]);
"""
)

_NEXT_JS = """
const e = arguments[0] ? document.querySelector(arguments[0]) : null;
return e && e.href ? e.href : null;
"""

_TOKEN = re.compile(r"([0-9]{1,9}) ([0-9]{1,9}) (.+)", re.DOTALL)


def field_specs(fields: Mapping[str, str]) -> list[list[str | None]]:
    """The fields as the page scripts take them: [name, CSS selector ('' for the element itself), attribute]."""
    return [[name, *split_field(spec)] for name, spec in fields.items()]


def link_field(opts: LinksOptions) -> str | None:
    """The field that holds an item's link when its element has no href: `detail.link`, else the first "@href"."""
    if opts.detail is not None and opts.detail.link is not None:
        return opts.detail.link
    return next((name for name, spec in opts.fields.items() if split_field(spec)[1] == "href"), None)


def item_link(raw: Mapping[str, Any], opts: LinksOptions) -> str | None:
    """An item's absolute URL, from what the page script read of its element (see `_ITEMS_JS`): the field
    `detail.link` names, else the element's own href, else the first field read from "@href"."""
    fields = raw.get("fields") or {}
    if opts.detail is not None and opts.detail.link is not None:
        link = fields.get(opts.detail.link)
    else:
        link = raw.get("url") or fields.get(link_field(opts) or "")
    return link if isinstance(link, str) and link else None


def make_item(raw: Mapping[str, Any], opts: LinksOptions) -> dict[str, Any]:
    """One item from what the page script read of its element: its id and fields. The id is `opts.id` made of
    the item's fields when given, else its `data-id`, else its link; "" when there is none (the item is skipped)."""
    if opts.fields:
        values = dict(raw.get("fields") or {})
    else:
        values = {"text": raw.get("text", ""), "href": raw.get("href")}
    if opts.id is not None:
        item_id = render_id(id_template(opts.id), values)
    else:
        item_id = raw.get("data_id") or item_link(raw, opts) or ""
    return {"id": item_id, **values}


def resume_token(listings: int, details: int, url: str | None) -> str | None:
    """A detail crawl's resume point: the listing page to (re)open and the listing and detail pages so far."""
    return None if url is None else f"{listings} {details} {url}"


def read_token(next_ref: Any, pages: int) -> tuple[int, int, str | None]:
    """(listing pages done, detail pages done, URL to open) from a checkpoint's `next`; a plain URL (a crawl
    without details) counts every page it fetched as a listing page."""
    if not isinstance(next_ref, str):
        return pages, 0, None
    m = _TOKEN.fullmatch(next_ref)
    if m is None:
        return pages, 0, next_ref
    return int(m.group(1)), int(m.group(2)), m.group(3)


class LinksCrawler(BaseCrawler):
    #: detail pages opened by this crawl, earlier attempts' included (`detail.max_pages` bounds them)
    _details = 0

    def crawl(self) -> Iterator[dict[str, Any]]:
        try:
            opts = LinksOptions.read(self.options)
        except OptionsError as e:
            raise CrawlError(str(e)) from None
        url: str | None
        if self.resume:  # a URL the last attempt found on a page
            listings, self._details, saved = read_token(self.resume.get("next"), self.pages)
            url = web_url(saved, self.ctx.start_url)
        else:
            listings, self._details, url = 0, 0, self.ctx.start_url
        while url and listings < opts.max_pages:
            try:
                self.open(url)
            except Disallowed:  # robots.txt: a next page the crawl may not fetch ends the listing (counted)
                return
            listings += 1
            found = [
                (make_item(raw, opts), raw) for raw in self._script(_ITEMS_JS, opts.item, field_specs(opts.fields))
            ]
            items, reached = self.fresh(item for item, _ in found)
            last = reached or not opts.next or listings >= opts.max_pages
            nxt = None if last else web_url(self.driver.execute_script(_NEXT_JS, opts.next), url)
            if opts.detail is None:
                yield from items
                self.save(nxt, items)
            else:
                links: dict[str, str | None] = {}
                for item, raw in found:  # the first item of an id is the one kept (`fresh`)
                    links.setdefault(str(item["id"]), item_link(raw, opts))
                yield from self._details_of(opts, items, links, listings, url, nxt)
            url = nxt

    def _details_of(
        self,
        opts: LinksOptions,
        items: list[dict[str, Any]],
        links: Mapping[str, str | None],
        listings: int,
        url: str,
        nxt: str | None,
    ) -> Iterator[dict[str, Any]]:
        """The listing page's new items, each with its detail page's fields; a checkpoint after each detail
        page (resuming at this listing page) and one at the end (resuming at the next)."""
        assert opts.detail is not None
        specs, limit = field_specs(opts.detail.fields), opts.detail.max_pages
        pending: list[dict[str, Any]] = []
        for n, item in enumerate(items):
            link = web_url(links.get(str(item["id"])), url)
            opened = link is not None and (limit is None or self._details < limit)
            if opened and link is not None:  # `opened` says so; spelled out for the type checker
                try:
                    self.open(link)
                    self._details += 1
                    item.update(self._script(_DETAIL_JS, specs))
                except Disallowed:  # robots.txt: the item keeps its listing's fields (the page counted)
                    opened = False
            pending.append(item)
            yield item
            if opened and n < len(items) - 1:
                self.save(resume_token(listings - 1, self._details, url), pending)
                pending = []
        self.save(resume_token(listings, self._details, nxt), pending)

    def _script(self, script: str, *args: Any) -> Any:
        """Run a page script; a selector the browser cannot parse is a CrawlError naming it."""
        out = self.driver.execute_script(script, *args)
        if isinstance(out, Mapping) and "!bad" in out:  # no field is named so: names are identifiers
            raise CrawlError(f"options: not a CSS selector: {out['!bad']!r}")
        return out if out is not None else []
