"""Crawler classes by name (built-ins) or dotted path (`package.module:Class`)."""

from __future__ import annotations

import importlib

from fleet.crawl.crawlers import resolve_name, split_dotted
from node.crawler import BaseCrawler


def load_crawler(name: str) -> type[BaseCrawler]:
    module_name, attr = split_dotted(resolve_name(name))
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise LookupError(f"crawler {name!r}: cannot import {module_name!r}: {e}") from None
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseCrawler)):
        raise LookupError(f"crawler {name!r}: {module_name}.{attr} is not a BaseCrawler subclass")
    return cls
