"""The `links` crawler's `fields` and `detail` options: checked when the config loads, and the pure parts of the
crawler (field specs, item ids and links, the detail crawl's resume point). The page scripts themselves run in
Chromium in tests/e2e/test_links_detail.py."""

from __future__ import annotations

import textwrap

import pytest

from fleet.config.load import parse_config
from fleet.crawl.crawlers import LinksOptions, OptionsError, split_field
from fleet.errors import ConfigError
from node.crawlers.links import (
    field_specs,
    item_link,
    link_field,
    make_item,
    read_token,
    resume_token,
)

NEWS = {
    "item": "article.item",
    "fields": {"title": "h2", "when": "time@datetime", "link": "a@href"},
    "detail": {"link": "link", "fields": {"body": "div.body", "image": "img.lead@src"}, "max_pages": 40},
}


def problems(options: str) -> list[str]:
    text = f"sites:\n  - {{id: a, start_url: 'http://a.test', crawler: links, options: {options}}}\n"
    with pytest.raises(ConfigError) as e:
        parse_config(textwrap.dedent(text), "fleet.yaml")
    return [str(p) for p in e.value.problems]


def test_fields_and_detail_are_read_with_their_defaults():
    opts = LinksOptions.read(NEWS)
    assert opts.fields == NEWS["fields"] and opts.max_pages == 10
    assert opts.detail is not None and opts.detail.link == "link" and opts.detail.max_pages == 40
    plain = LinksOptions.read({})
    assert plain.fields == {} and plain.detail is None
    assert LinksOptions.read({"detail": {"fields": {"body": "div.body"}}}).detail.link is None  # the item's href


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ("{fields: {bad-name: h2}}", "options.fields: field name 'bad-name' is not an identifier"),
        ("{fields: {id: h2}}", "options.fields: field name 'id' is reserved"),
        ("{fields: {title: ''}}", "options.fields.title: must be a CSS selector, optionally with @attribute"),
        ("{fields: {title: '  '}}", "options.fields.title: must be a CSS selector"),
        ("{fields: {title: 3}}", "options.fields.title: Input should be a valid string"),
        (f"{{fields: {{title: '{'a' * 501}'}}}}", "options.fields.title: selector longer than 500 characters"),
        ("{fields: [h2]}", "options.fields: Input should be a valid dictionary"),
        ("{detail: {fields: {body: p}, page: 1}}", "options.detail: unknown key 'page' (allowed: link, fields, "),
        ("{detail: {link: body}}", "options.detail.fields: required key is missing"),
        ("{detail: {fields: {body: p}, max_pages: 0}}", "options.detail.max_pages: Input should be greater than"),
        ("{fields: {a: h2}, detail: {link: url, fields: {b: p}}}", "options: detail.link: 'url' is not one of"),
        ("{fields: {a: h2}, detail: {fields: {a: p}}}", "options: detail.fields.a: already an item field"),
    ],
)
def test_a_bad_field_or_detail_is_one_line_naming_its_key(options, expected):
    found = problems(options)
    assert len(found) == 1 and found[0].startswith(f"fleet.yaml:2: sites[0].{expected}"), found


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ("{item: 'div.columns li['}", "options.item: not a CSS selector: 'div.columns li[': malformed attribute"),
        ("{next: 'a:nth-child('}", "options.next: not a CSS selector: 'a:nth-child(': invalid syntax for pseudo"),
        (
            "{fields: {link: 'a@@href'}}",
            "options.fields.link: not a CSS selector: 'a@' (before @href): invalid character '@' at character 2",
        ),
        (
            "{fields: {name: 'a:frist-child'}}",
            "options.fields.name: not a CSS selector: 'a:frist-child': unknown pseudo",
        ),
        ("{fields: {name: 'h2@1x'}}", "options.fields.name: not a CSS selector: 'h2@1x': invalid character '@'"),
        ("{detail: {fields: {body: 'div.body['}}}", "options.detail.fields.body: not a CSS selector: 'div.body['"),
    ],
)
def test_a_selector_chromium_would_refuse_is_refused_when_the_config_loads(options, expected):
    found = problems(options)
    assert len(found) == 1 and found[0].startswith(f"fleet.yaml:2: sites[0].{expected}"), found


def test_every_bad_selector_of_the_options_is_named_not_only_the_first():
    found = problems(
        "{item: 'li[', next: 'a:nth-child(', fields: {a: 'h2', b: 'p..x', c: 'a@@href'}, "
        "detail: {fields: {d: 'div[', e: '@src'}}}"
    )
    keys = [line.split(": ")[1] for line in found]
    assert keys == [
        "sites[0].options.item",
        "sites[0].options.next",
        "sites[0].options.fields.b",
        "sites[0].options.fields.c",
        "sites[0].options.detail.fields.d",
    ], found


def test_selectors_chromium_accepts_pass():
    valid = [
        'a[href$=".html"]',
        "li:nth-child(2n+1) > a",
        ":scope > a",
        "a:not(.x)",
        "h2 + p",
        "[data-id]",
        "a[title='x y']",
        "input:valid ~ label",
        "p::first-line",
    ]
    for selector in valid:
        opts = LinksOptions.read(
            {"item": selector, "next": selector, "fields": {"t": selector, "h": f"{selector}@href"}}
        )
        assert opts.item == selector and split_field(opts.fields["h"]) == (selector, "href")
    assert LinksOptions.read({"fields": {"self": "@href", "at": "a[href^='mailto:x@y.org']@href"}}).fields


def test_the_number_of_fields_is_bounded():
    many = {f"f{i}": "p" for i in range(51)}
    with pytest.raises(OptionsError, match="fields: Dictionary should have at most 50 items"):
        LinksOptions.read({"fields": many})
    with pytest.raises(OptionsError, match="detail.fields: Dictionary should have at most 50 items"):
        LinksOptions.read({"detail": {"fields": many}})
    LinksOptions.read({"fields": dict(list(many.items())[:50])})


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("h2", ("h2", None)),
        (" h2 > a ", ("h2 > a", None)),
        ("time@datetime", ("time", "datetime")),
        ("a.title@href", ("a.title", "href")),
        ("@href", ("", "href")),  # the item element itself
        ("img@data-src", ("img", "data-src")),
        ("a[href^='mailto:x@y.org']", ("a[href^='mailto:x@y.org']", None)),  # an @ inside the selector
        ("a[href^='mailto:x@y.org']@href", ("a[href^='mailto:x@y.org']", "href")),
    ],
)
def test_a_field_is_a_selector_with_an_optional_attribute(spec, parsed):
    assert split_field(spec) == parsed


def test_field_specs_are_what_the_page_script_takes():
    assert field_specs({"t": "h2", "w": "time@datetime"}) == [["t", "h2", None], ["w", "time", "datetime"]]


def raw(url=None, data_id=None, fields=None, text="Story", href=None):
    """What the page script reads of an item element (`_ITEMS_JS`)."""
    return {"data_id": data_id, "url": url, "text": text, "href": href, "fields": fields or {}}


def test_without_fields_an_item_keeps_its_shape_and_its_id_is_its_absolute_url():
    opts = LinksOptions.read({})
    item = make_item(raw(url="http://s.test/p2/a1/index.html", href="http://s.test/p2/a1/index.html"), opts)
    assert item == {"id": "http://s.test/p2/a1/index.html", "text": "Story", "href": "http://s.test/p2/a1/index.html"}
    assert make_item(raw(url="http://s.test/x", data_id="n-1"), opts)["id"] == "n-1"  # data-id wins
    assert make_item(raw(), opts) == {"id": "", "text": "Story", "href": None}


def test_with_fields_an_item_is_its_id_and_its_fields():
    opts = LinksOptions.read(NEWS)
    read = {"title": "Story", "when": "2026-01-09T22:00:00Z", "link": "http://s.test/p1/a1/index.html"}
    assert make_item(raw(fields=read), opts) == {"id": "http://s.test/p1/a1/index.html", **read}
    assert make_item(raw(fields=read, data_id="n-1"), opts)["id"] == "n-1"
    assert make_item(raw(fields={**read, "link": None}), opts)["id"] == ""


def test_an_items_link_is_the_named_field_else_its_own_href_else_the_first_href_field():
    named = LinksOptions.read(NEWS)
    assert item_link(raw(url="http://s.test/own", fields={"link": "http://s.test/f"}), named) == "http://s.test/f"
    own = LinksOptions.read({"fields": {"t": "h2", "a": "a@href", "b": "a.more@href"}})
    assert link_field(own) == "a"
    assert item_link(raw(url="http://s.test/own", fields={"a": "http://s.test/a"}), own) == "http://s.test/own"
    assert item_link(raw(fields={"a": "http://s.test/a", "b": "http://s.test/b"}), own) == "http://s.test/a"
    assert item_link(raw(fields={"t": "x"}), LinksOptions.read({"fields": {"t": "h2"}})) is None


def test_a_detail_crawls_resume_point_counts_listing_and_detail_pages():
    token = resume_token(1, 7, "http://s.test/news/p2/index.html?a=1 b")
    assert token == "1 7 http://s.test/news/p2/index.html?a=1 b"
    assert read_token(token, 9) == (1, 7, "http://s.test/news/p2/index.html?a=1 b")
    assert resume_token(2, 9, None) is None and read_token(None, 11) == (11, 0, None)  # the end
    # a checkpoint of a crawl without details: a plain URL, every page was a listing page
    assert read_token("http://s.test/s/shop/?page=3", 2) == (2, 0, "http://s.test/s/shop/?page=3")
