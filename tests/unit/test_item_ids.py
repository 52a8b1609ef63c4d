"""Item identity in a crawl: `links`' `id` option, and the rules of `BaseCrawler.fresh` (and of what `run` hands
out) that lose no item silently: a duplicate is kept once, a collision (same id, other content) and an item
without an id are left out, counted and shown. The `links` crawler runs against a scripted WebDriver, as in
test_found_links.py; the page scripts themselves run in Chromium in tests/e2e/test_links_detail.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fleet.config.load import parse_config
from fleet.crawl.crawlers import LinksOptions, OptionsError, id_template, render_id
from fleet.errors import ConfigError
from node.crawler import BaseCrawler, CrawlContext
from node.crawlers.links import _DETAIL_JS, _ITEMS_JS, _NEXT_JS, LinksCrawler, make_item
from node.itemids import Ledger, Tally

PAGE = "https://docs.test/api/strings.html"
FUNCTIONS = [f"fn{i}" for i in range(15)]


class OnePage:
    """A WebDriver whose one page lists `rows` (what `_ITEMS_JS` reads of each element), with no next page."""

    def __init__(self, rows: list[dict[str, Any]]):
        self.rows, self.opened = rows, []

    def get(self, url: str) -> None:
        self.opened.append(url)

    def execute_script(self, script: str, *args: Any) -> Any:
        if script == _ITEMS_JS:
            return self.rows
        if script in (_NEXT_JS, _DETAIL_JS):
            return None if script == _NEXT_JS else {"body": "b"}
        return 200


def function_rows() -> list[dict[str, Any]]:
    """15 functions documented on one page: every element links the page itself."""
    return [
        {"data_id": None, "url": PAGE, "text": f"{n}()", "href": PAGE, "fields": {"link": PAGE, "name": n}}
        for n in FUNCTIONS
    ]


def context(options: dict[str, Any], checkpoint: Any = None, events: list | None = None) -> CrawlContext:
    sink = events if events is not None else []
    return CrawlContext(
        site="docs",
        start_url=PAGE,
        options=options,
        attempt=1,
        node_id="n1",
        grid_url="http://grid.invalid",
        profile_dir="/nonexistent",
        emit=lambda **e: sink.append(e),
        checkpoint=checkpoint,
    )


def links_run(rows: list[dict[str, Any]], options: dict[str, Any], checkpoint: Any = None) -> tuple[dict, list]:
    events: list[dict[str, Any]] = []
    crawler = LinksCrawler(context({"next": None, **options}, checkpoint, events))
    crawler._driver = OnePage(rows)
    return crawler.run(), events


FIELDS = {"link": "a@href", "name": "code"}


def test_functions_that_share_their_page_collapse_into_one_item_and_are_counted_as_collisions():
    result, events = links_run(function_rows(), {"fields": FIELDS})
    assert [i["name"] for i in result["items"]] == ["fn0"]
    assert result["collisions"] == 14 and result["skipped"] == 0
    assert result["collided"] == [PAGE] * 5  # the first five, by id
    saved = [e for e in events if e["event"] == "checkpoint"]
    assert saved[-1]["collisions"] == 14 and len(saved[-1]["items"]) == 1


def test_an_id_template_of_fields_keeps_every_function():
    result, _ = links_run(function_rows(), {"fields": FIELDS, "id": "{link}#{name}"})
    assert [i["id"] for i in result["items"]] == [f"{PAGE}#{n}" for n in FUNCTIONS]
    assert (result["collisions"], result["skipped"]) == (0, 0)


def test_a_duplicate_is_kept_once_and_not_counted():
    rows = function_rows()[:2] * 2  # the page lists each function twice, the same each time
    result, _ = links_run(rows, {"fields": FIELDS, "id": "name"})
    assert [i["id"] for i in result["items"]] == ["fn0", "fn1"] and result["collisions"] == 0


def test_an_item_without_an_id_is_skipped_counted_and_shown():
    rows = function_rows()[:3]
    rows[1]["fields"] = {"link": None, "name": None}  # nothing the id is made of
    result, _ = links_run(rows, {"fields": FIELDS, "id": "{link}#{name}"})
    assert [i["name"] for i in result["items"]] == ["fn0", "fn2"]
    assert result["skipped"] == 1 and result["first_skipped"] == '{"id": "", "link": null, "name": null}'


def test_without_fields_the_id_may_name_text_or_href():
    result, _ = links_run(function_rows(), {"id": "{href}#{text}"})
    assert len(result["items"]) == 15 and result["items"][0]["id"] == f"{PAGE}#fn0()"


def test_a_resumed_crawl_finds_its_checkpoints_items_again_without_collisions():
    """A checkpoint's items hold their detail fields too: an item found again on its listing is compared with
    them on its own fields only."""
    options = {"fields": FIELDS, "id": "{link}#{name}", "detail": {"link": "link", "fields": {"body": "p"}}}
    done = [{"id": f"{PAGE}#fn0", "link": PAGE, "name": "fn0", "body": "b"}]
    rows = function_rows()[:2]
    resume = {"next": f"0 1 {PAGE}", "pages": 1, "items": done}  # at the listing page, its first detail done
    result, _ = links_run(rows, options, resume)
    assert [i["name"] for i in result["items"]] == ["fn1"] and result["collisions"] == 0
    rows[0]["fields"] = {"link": PAGE, "name": "fn0", "extra": "changed"}  # other content under fn0's id
    result, _ = links_run(rows, {**options, "fields": {**FIELDS, "extra": "em"}}, resume)
    assert result["collisions"] == 1


class OwnCrawler(BaseCrawler):
    """A crawler of a team's own that yields what it finds, with or without `fresh`."""

    needs_browser = False
    found: list[dict[str, Any]] = []
    use_fresh = True

    def crawl(self) -> Iterator[dict[str, Any]]:
        if self.use_fresh:
            items, _ = self.fresh(self.found)
            self.save(None, items)
            yield from items
        else:
            self.save(None, self.found)
            yield from self.found


FOUND = [{"id": "a", "v": 1}, {"id": "a", "v": 1}, {"id": "a", "v": 2}, {"id": None, "v": 3}, {"id": "  ", "v": 4}]


@pytest.mark.parametrize("use_fresh", [True, False])
def test_a_crawler_of_its_own_gets_the_same_rules_whether_it_calls_fresh_or_not(use_fresh):
    events: list[dict[str, Any]] = []
    crawler = type("Crawler", (OwnCrawler,), {"found": FOUND, "use_fresh": use_fresh})(context({}, events=events))
    result = crawler.run()
    assert result["items"] == [{"id": "a", "v": 1}]
    assert (result["collisions"], result["skipped"], result["collided"]) == (1, 2, ["a"])
    assert [i["id"] for i in events[-1]["items"]] == (["a"] if use_fresh else ["a", "a", "a"])  # no id: not saved
    assert crawler.tally.lines() == [
        'collision: id \'a\': kept {"id": "a", "v": 1}, dropped {"id": "a", "v": 2}',
        'skipped 2 items with no id (first: {"id": null, "v": 3})',
    ]


def test_an_incremental_mark_stops_at_a_seen_id_before_anything_else():
    crawler = OwnCrawler(context({}))
    crawler.known = frozenset({"b"})
    items, reached = crawler.fresh([{"id": "a"}, {"id": None}, {"id": "b"}, {"id": "c"}])
    assert (items, reached, crawler.tally.skipped) == ([{"id": "a"}], True, 1)


def test_the_ledger_lists_the_first_few_collisions_and_counts_the_rest():
    tally = Tally()
    book = Ledger(tally)
    for n in range(9):
        book.admit({"id": "same", "n": n})
    assert tally.collisions == 8 and [c.id for c in tally.collided] == ["same"] * 5
    assert tally.lines()[-1] == "... and 3 more collisions"
    assert "same" in book and len(book) == 1


# --- the option as the config reads it ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "values", "expected"),
    [
        ("link", {"link": "u"}, "u"),
        ("{link}#{name}", {"link": "u", "name": "f"}, "u#f"),
        ("{link}#{name}", {"link": "u", "name": None}, "u#"),
        ("{link}#{name}", {"link": None, "name": ""}, ""),  # nothing it is made of: no id
        ("{{{name}}}", {"name": 3}, "{3}"),
    ],
)
def test_an_id_template_renders_the_items_fields(spec, values, expected):
    assert render_id(id_template(spec), values) == expected


def test_make_item_takes_the_id_option_over_data_id_and_link():
    raw = {"data_id": "d1", "url": PAGE, "text": "t", "href": PAGE, "fields": {"link": PAGE, "name": "f"}}
    assert make_item(raw, LinksOptions.read({"fields": FIELDS}))["id"] == "d1"
    assert make_item(raw, LinksOptions.read({"fields": FIELDS, "id": "name"}))["id"] == "f"


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"fields": FIELDS, "id": "{link}#{nam}"}, "'nam' in '{link}#{nam}' is not a field of the item"),
        ({"id": "link"}, "'link' in 'link' is not a field of the item; the item's fields: text, href"),
        ({"fields": FIELDS, "id": "#"}, "'#' names no field"),
        ({"fields": FIELDS, "id": "{name!r}"}, "{name} is not a plain {field}"),
        ({"fields": FIELDS, "id": "{name"}, "is not a field name or a template of {field}s"),
        ({"fields": FIELDS, "detail": {"fields": {"body": "p"}}, "id": "body"}, "'body' in 'body' is a detail field"),
    ],
)
def test_an_id_naming_what_the_item_lacks_is_an_error_of_the_option(options, error):
    with pytest.raises(OptionsError) as e:
        LinksOptions.read(options)
    assert str(e.value).startswith("options: id: ") and error in str(e.value)


def test_an_unknown_field_in_id_stops_the_config_in_one_line_naming_the_site_and_key():
    options = "{fields: {link: 'a@href'}, id: '{link}#{name}'}"
    text = f"sites:\n  - {{id: docs, start_url: 'http://a.test', crawler: links, options: {options}}}\n"
    with pytest.raises(ConfigError) as e:
        parse_config(text, "fleet.yaml")
    assert [str(p) for p in e.value.problems] == [
        "fleet.yaml:2: sites[0].options.id: 'name' in '{link}#{name}' is not a field of the item; "
        "the item's fields: link"
    ]
