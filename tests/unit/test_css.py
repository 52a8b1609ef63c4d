"""`fleet.crawl.css.selector_problem`: the CSS selectors of a config parsed as Chromium reads them, before any page
loads. What Chromium itself says of the same selectors: tests/e2e/test_links_detail.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.crawl.css import BROWSER_PSEUDO_CLASSES, selector_problem

#: Selectors Chromium accepts in `querySelector` (each checked in Chromium too: tests/e2e/test_links_detail.py).
VALID = [
    "a.item",
    "div.columns li",
    'a[href$=".html"]',
    "a[href^='mailto:x@y.org']",
    'a[title="x y"]',
    "a[title='a \\' b']",
    "[data-id]",
    "a[href*=news i]",
    "li:nth-child(2n+1) > a",
    "li:nth-child( 2n + 1 )",
    "tr:nth-of-type(odd)",
    "li:nth-last-child(-n+3)",
    "li:nth-child(2 of .x)",
    ":scope > a",
    "a:not(.x)",
    "a:not(.x, .y)",
    "a:is(.x, .y)",
    "div:where(.a) p",
    "article:has(> img)",
    "h2 + p",
    "h2 ~ p",
    "ul>li",
    "a , b",
    "A.Item",
    "*",
    "#main .list > li:first-child a",
    "a:hover",
    "input:checked",
    "p:lang(en)",
    "a:any-link",
    "a\\:b",
    "a\n  b",
    # what soupsieve does not know and Chromium does: left to the browser, the rest of the selector still parsed
    "p::before",
    "a::part(x)",
    "::slotted(a)",
    "p:first-line",
    "a:before",
    "input:valid",
    "form :invalid + label",
    "input:user-valid",
    "dialog:modal",
    "x-el:state(open)",
    "a:-webkit-any(.x, .y)",
    "input:-webkit-autofill",
    "A:VALID",
    "li:valid:nth-child(2n+1)::before",
]

#: Selectors Chromium refuses, with what the config says of each.
INVALID = [
    ("div.columns li[", "malformed attribute selector at character 15"),
    ("a:nth-child(", "invalid syntax for pseudo class ':nth-child' at character 2"),
    ("a@", "invalid character '@' at character 2"),
    ("a..b", "malformed class selector at character 2"),
    ("a >", "expected a selector at character 4"),
    ("> a", "the combinator '>' must have a selector before it at character 1"),
    ("a,", "expected a selector at character 3"),
    ("a:nth-child(x)", "invalid syntax for pseudo class ':nth-child'"),
    ("a:nth-child(2n+)", "invalid syntax for pseudo class ':nth-child'"),
    ("a:lang()", "at character 2"),
    ("a:frist-child", "unknown pseudo-class ':frist-child' at character 2"),
    ("a:foo", "unknown pseudo-class ':foo'"),
    ("#1a", "malformed id selector at character 1"),
    ("a:-soup-contains('x')", "':-soup-contains()' is soupsieve's own pseudo-class: Chromium refuses it"),
    ("article:has(p:contains(x))", "':-soup-contains()' is soupsieve's own pseudo-class"),
    # ended inside a bracket or a string: Chromium's error recovery would close it; refused as the typo it is
    ("a[href", "malformed attribute selector at character 2"),
    ('a[href="x]', "malformed attribute selector at character 2"),
]


@pytest.mark.parametrize("selector", VALID)
def test_a_selector_chromium_accepts_passes(selector):
    assert selector_problem(selector) is None


@pytest.mark.parametrize(("selector", "expected"), INVALID)
def test_a_selector_chromium_refuses_is_named_with_what_is_wrong_and_where(selector, expected):
    problem = selector_problem(selector)
    assert problem is not None and expected in problem, problem
    assert "\n" not in problem and len(problem) < 120


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("input:valid li[", "malformed attribute selector at character 15"),
        ("p::before, b[", "malformed attribute selector at character 13"),
        ("a:-webkit-any(.x, :frist) b", "unknown pseudo-class ':frist' at character 19"),
        ("a:state(x) b:frist", "unknown pseudo-class ':frist' at character 13"),
        ("a\n  b[", "malformed attribute selector at character 6"),
    ],
)
def test_what_is_left_to_the_browser_leaves_the_rest_parsed_and_positions_as_written(selector, expected):
    assert selector_problem(selector) == expected


def test_every_pseudo_class_left_to_the_browser_passes_alone_and_with_an_argument():
    for name in sorted(BROWSER_PSEUDO_CLASSES):
        assert selector_problem(f"a:{name}") is None, name
        assert selector_problem(f"a:{name}(b) c") is None, name


def test_a_selector_past_the_parsers_bounds_is_a_problem_not_a_crash():
    assert selector_problem(":is(" * 100 + "a" + ")" * 100) is None
    assert selector_problem(":not(" * 50_000 + "a" + ")" * 50_000) == "nested too deeply"
    assert selector_problem("a," * 10_000 + "a") == "selector exceeds pseudo-class nesting limit of 8192"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*"ab*.#[]()=:\"'\\ >+~,|^$@-_12n\n", ":is(", "::before", ":valid", ":nth-child("])))
def test_any_text_gets_an_answer(parts):
    text = "".join(parts)
    problem = selector_problem(text)
    assert problem is None or (isinstance(problem, str) and problem)


def test_the_parser_loads_on_the_first_check_not_with_the_config():
    """The Lambdas import the config's models and carry no soupsieve: only a check loads it."""
    code = (
        "import sys, fleet.config, fleet.crawl.crawlers, lambdas.settings; assert 'soupsieve' not in sys.modules; "
        "from fleet.crawl.css import selector_problem; selector_problem('a'); assert 'soupsieve' in sys.modules"
    )
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
