"""A site's data contract (`expect:` in fleet.yaml): what its crawl must have found before it counts as done.

The rules are plain values (they travel on the site's record, `SiteSpec.expect`):

- `min_items`, `min_pages`: the fewest items and pages a result may have;
- `fields`: a JSON Schema (draft 2020-12) every item must fit, checked with `jsonschema`;
- `max_drop`: the largest fall in items (0..1) against `baseline`, the items of the site's previous COMPLETED
  run, which the hub gives; without a baseline it is not judged.

`broken` is the check itself, pure; `schema_problems` is what the config's load says of a `fields` schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

#: Items whose `fields` errors are listed one by one; the rest are counted.
MAX_ITEM_ERRORS = 5
#: Characters of an item's id kept in its error.
ID_CHARS = 40

#: The keys of `expect`, in the order their rules are judged.
KEYS = ("min_items", "min_pages", "max_drop", "fields")

#: Keywords whose values are data, not schemas: nothing under them is a pattern to compile.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def schema_problems(schema: Mapping[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
    """Each way `schema` is not a JSON Schema one item can be checked with: (where in it, what), all of them. The
    metaschema of draft 2020-12 judges its shape; every `pattern` and `patternProperties` key is compiled too."""
    from jsonschema import Draft202012Validator  # on first use: the Lambdas load the config and ship no jsonschema

    meta = Draft202012Validator(Draft202012Validator.META_SCHEMA)
    found = [(tuple(e.absolute_path), e.message) for e in meta.iter_errors(schema)]
    found.extend(_pattern_problems(schema, ()))
    return sorted(found, key=lambda p: [str(x) for x in p[0]])


def _pattern_problems(node: object, at: tuple[str | int, ...]) -> Iterable[tuple[tuple[str | int, ...], str]]:
    if isinstance(node, list):
        for i, v in enumerate(node):
            yield from _pattern_problems(v, (*at, i))
        return
    if not isinstance(node, Mapping):
        return
    for key, value in node.items():
        if key == "pattern" and isinstance(value, str):
            yield from _compile(value, (*at, key))
        elif key == "patternProperties" and isinstance(value, Mapping):
            for pattern in value:
                yield from _compile(str(pattern), (*at, key, str(pattern)))
        if key not in _DATA_KEYWORDS:
            yield from _pattern_problems(value, (*at, key))


def _compile(pattern: str, at: tuple[str | int, ...]) -> Iterable[tuple[tuple[str | int, ...], str]]:
    try:
        re.compile(pattern)
    except re.error as e:
        yield at, f"pattern {pattern!r} does not compile: {e}"


def broken(items: Sequence[Any], pages: int, expect: Mapping[str, Any], baseline: int | None = None) -> list[str]:
    """The rules of `expect` the result (its `items`, its `pages`) breaks, each a short text naming the rule and the
    figures; empty when it keeps them all (or there are none)."""
    out: list[str] = []
    n = len(items)
    if (low := expect.get("min_items")) is not None and n < low:
        out.append(f"min_items: {n} items < {low}")
    if (low := expect.get("min_pages")) is not None and pages < low:
        out.append(f"min_pages: {pages} pages < {low}")
    drop = expect.get("max_drop")
    if drop is not None and baseline:  # no previous run (or one with no item): nothing to fall from
        fell = 1 - n / baseline
        if fell > drop:
            out.append(f"max_drop: {n} items after {baseline} (-{fell:.0%} > -{drop:.0%})")
    if expect.get("fields") is not None:
        out.extend(_field_errors(items, expect["fields"]))
    return out


def _field_errors(items: Sequence[Any], schema: Mapping[str, Any]) -> list[str]:
    from jsonschema import Draft202012Validator  # on first use, as above

    validator = Draft202012Validator(schema)
    out: list[str] = []
    more = 0
    for i, item in enumerate(items):
        error: ValidationError | None = next(iter(validator.iter_errors(item)), None)
        if error is None:
            continue
        if len(out) >= MAX_ITEM_ERRORS:
            more += 1
            continue
        out.append(f"fields: item {i} ({_label(item)}): {_where(error)}{error.message}")
    if more:
        out.append(f"fields: {more} more items break it")
    return out


def _label(item: object) -> str:
    ident = item.get("id") if isinstance(item, Mapping) else None
    text = json.dumps(ident if ident is not None else item, default=str, ensure_ascii=False)
    return text if len(text) <= ID_CHARS else text[: ID_CHARS - 1] + "…"


def _where(error: ValidationError) -> str:
    path = ".".join(str(p) for p in error.absolute_path)
    return f"{path}: " if path else ""


def summary(rules: Sequence[str]) -> str:
    """The broken rules as one line (the record's `error`)."""
    return "contract broken: " + "; ".join(rules)
