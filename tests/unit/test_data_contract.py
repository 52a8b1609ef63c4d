"""A site's data contract: the pure check (`fleet.crawl.contract`), and what fleet.yaml's `expect:` may say."""

from __future__ import annotations

import pytest

from fleet.config.load import parse_config
from fleet.crawl import contract
from fleet.errors import ConfigError
from fleet.record.state import SiteSpec
from hub.plan import spec_of

SCHEMA = {"type": "object", "required": ["price"], "properties": {"sku": {"type": "string", "pattern": "^[A-Z]+$"}}}


def test_a_result_that_keeps_every_rule_breaks_none():
    items = [{"id": "a", "price": 1, "sku": "AB"}]
    assert contract.broken(items, 3, {"min_items": 1, "min_pages": 3, "max_drop": 0.5, "fields": SCHEMA}, 2) == []
    assert contract.broken([], 0, {}) == []


def test_each_broken_rule_names_itself_and_its_figures():
    rules = contract.broken([], 0, {"min_items": 1, "min_pages": 2, "max_drop": 0.5}, 10)
    assert rules == ["min_items: 0 items < 1", "min_pages: 0 pages < 2", "max_drop: 0 items after 10 (-100% > -50%)"]


def test_max_drop_is_not_judged_without_a_baseline():
    assert contract.broken([], 0, {"max_drop": 0.0}, None) == []
    assert contract.broken([], 0, {"max_drop": 0.0}, 0) == []
    assert contract.broken([{}] * 5, 0, {"max_drop": 0.5}, 10) == []  # exactly half: allowed


def test_fields_errors_name_the_item_and_are_capped():
    items = [{"id": "ok", "price": 1}, {"id": "x" * 100, "sku": "ab"}] + [{"id": i} for i in range(10)]
    rules = contract.broken(items, 1, {"fields": SCHEMA})
    assert rules[0].startswith('fields: item 1 ("xxx') and "…" in rules[0]
    assert len(rules) == contract.MAX_ITEM_ERRORS + 1 and rules[-1] == "fields: 6 more items break it"
    assert "'price' is a required property" in rules[1]
    bad_sku = contract.broken([{"price": 1, "sku": "ab"}], 1, {"fields": SCHEMA})
    assert bad_sku == ['fields: item 0 ({"price": 1, "sku": "ab"}): sku: \'ab\' does not match \'^[A-Z]+$\'']


def test_a_schema_is_checked_by_the_metaschema_and_its_patterns_compiled():
    assert contract.schema_problems(SCHEMA) == []
    bad = {"type": "nothing", "properties": {"a": {"pattern": "[x"}}, "patternProperties": {"(": {}}}
    where = [w for w, _ in contract.schema_problems(bad)]
    assert where == [("patternProperties", "("), ("properties", "a", "pattern"), ("type",)]


def config(text: str):
    return parse_config("sites:\n  - {id: a, start_url: 'https://a.test'}\n" + text, "fleet.yaml")


def test_a_site_expect_replaces_run_expect_key_by_key():
    c = parse_config(
        "run:\n  expect: {min_items: 5, max_drop: 0.5}\n"
        "sites:\n  - {id: a, start_url: 'https://a.test', expect: {min_items: 1}}\n"
        "  - {id: b, start_url: 'https://b.test'}\n",
        "fleet.yaml",
    )
    assert spec_of(c.site("a"), c).expect == {"min_items": 1, "max_drop": 0.5}
    assert spec_of(c.site("b"), c).expect == {"min_items": 5, "max_drop": 0.5}
    assert spec_of(c.site("b"), c).baseline_items is None  # the hub's to give, not the config's


def test_every_bad_expect_is_reported_with_its_line_and_key():
    text = (
        "run:\n"
        "  expect: {max_drop: 1.5}\n"
        "sites:\n"
        "  - id: a\n"
        "    start_url: 'https://a.test'\n"
        "    expect:\n"
        "      fields:\n"
        "        type: numbr\n"
        "        properties: {sku: {pattern: '[a-'}}\n"
        "  - {id: b, start_url: 'https://b.test', expect: {min_items: -1, min_pages: true}}\n"
    )
    with pytest.raises(ConfigError) as e:
        parse_config(text, "fleet.yaml")
    lines = str(e.value).splitlines()
    assert any(line.startswith("fleet.yaml:2: run.expect.max_drop:") for line in lines)
    assert any(line.startswith("fleet.yaml:8: sites[0].expect.fields.type:") for line in lines)
    assert any(
        "fleet.yaml:9: sites[0].expect.fields.properties.sku.pattern: pattern '[a-' does not" in x for x in lines
    )
    assert any(line.startswith("fleet.yaml:10: sites[1].expect.min_items:") for line in lines)
    assert any(line.startswith("fleet.yaml:10: sites[1].expect.min_pages:") for line in lines)


def test_a_contract_travels_on_the_record_as_written():
    from fleet.record.codec import item_to_site, site_to_item
    from fleet.record.ops import new_site

    spec = SiteSpec("https://a.test", expect={"fields": {"minimum": 0.0001}, "max_drop": 0.25}, baseline_items=7)
    back = item_to_site(site_to_item(new_site("r", "a", spec, None)))
    assert back.spec.expect == spec.expect and back.spec.baseline_items == 7
    item = site_to_item(new_site("r", "a", spec, None))
    item["spec"]["baseline_items"] = -3  # a count read back is a count, or none
    assert item_to_site(item).spec.baseline_items is None
