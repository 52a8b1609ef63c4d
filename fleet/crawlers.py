"""Names of crawlers, shared by the config validator (here) and the node's registry.

`fleet` may not import `node`, so built-in crawlers are named by dotted path and
resolved only where they run. A site's `crawler` is a built-in name or a dotted
path `package.module:Class` (or `package.module.Class`) importable on the nodes.
"""

from __future__ import annotations

import importlib.util
import re

BUILTIN_CRAWLERS: dict[str, str] = {
    "links": "node.crawlers.links:LinksCrawler",
    "api": "node.crawlers.api:ApiCrawler",
}

_DOTTED = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*([:.][A-Za-z_][\w]*)$")


def split_dotted(ref: str) -> tuple[str, str]:
    """'pkg.mod:Class' or 'pkg.mod.Class' -> ('pkg.mod', 'Class')."""
    if ":" in ref:
        module, _, attr = ref.partition(":")
    else:
        module, _, attr = ref.rpartition(".")
    return module, attr


def resolve_name(name: str) -> str:
    """A crawler name as written in fleet.yaml -> its dotted path."""
    return BUILTIN_CRAWLERS.get(name, name)


def crawler_problem(name: str) -> str | None:
    """Why `name` cannot be a crawler, or None if it can (checked without importing it)."""
    if name in BUILTIN_CRAWLERS:
        return None
    if not _DOTTED.match(name) or ("." not in name and ":" not in name):
        known = ", ".join(sorted(BUILTIN_CRAWLERS))
        return f"unknown crawler {name!r}: use a built-in ({known}) or a dotted path 'package.module:Class'"
    module, _ = split_dotted(name)
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return f"unknown crawler {name!r}: module {module!r} cannot be imported"
    return None
