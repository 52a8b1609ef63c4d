"""What a completed attempt writes to the bucket: the crawler's items merged with its checkpoint's, and the result
document."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from fleet.outputs.results import ResultStore
from fleet.outputs.shapes import Key
from fleet.record.codec import ITEM_ID_MAX_CHARS, capped
from fleet.record.state import SiteRecord

log = logging.getLogger("gridfleet.node")


def merged_items(before: list[dict[str, Any]], now: list[Any]) -> list[dict[str, Any]]:
    """The checkpoint's items (earlier attempts and this one), then the crawler's result, each item once (by id,
    else by content): a resumed crawl's result has no duplicates.

    Ids are compared as the checkpoint stores them (cut to ITEM_ID_MAX_CHARS), so an item with a longer id that
    a resumed crawl finds again is still one item; it keeps its whole id when the crawler reported it whole."""
    out: dict[str, dict[str, Any]] = {}
    for item in [*before, *now]:
        if not isinstance(item, dict):
            item = {"value": item}
        if item.get("id") is None:
            key = json.dumps(item, sort_keys=True, default=str)
        else:
            key = capped(item["id"], ITEM_ID_MAX_CHARS)
        held = out.get(key)
        if held is None or len(str(held.get("id"))) < len(str(item.get("id"))):
            out[key] = item
    return list(out.values())


#: The result document (`result_body`), key by key: `<site>/<YYYYMMDD>[/<run_id>]/result.json` in the bucket, and
#: `runs/<run_id>/results/<site>.json` once exported.
RESULT: Mapping[str, Key] = {
    "run_id": Key("string", "the run it is the result of"),
    "site": Key("string", "the site's id"),
    "attempt": Key("integer", "the attempt that produced it"),
    "instance_id": Key("string", "the node that crawled it"),
    "start_url": Key("string", "where the crawl started"),
    "started_at": Key("number | null", "when the node claimed that attempt (epoch seconds)"),
    "finished_at": Key("number", "when the node wrote it (epoch seconds)"),
    "pages": Key("integer", "the pages the crawl got to (a resumed crawl counts its checkpoint's)"),
    "items": Key(
        "array",
        "the items, each once: those of the checkpoint's saves, then the crawler's",
        each=Key("object", "one item, as the crawler made it (an item that is no object is kept as {value})"),
    ),
}


def result_body(rec: SiteRecord, instance_id: str, finished_at: float, result: Mapping[str, Any]) -> bytes:
    """The result document of `rec`'s current attempt."""
    attempt = rec.current_attempt
    body = {
        "run_id": rec.run_id,
        "site": rec.site,
        "attempt": rec.attempt,
        "instance_id": instance_id,
        "start_url": rec.spec.start_url,
        "started_at": attempt.start if attempt else None,
        "finished_at": finished_at,
        "pages": result.get("pages", 0),
        "items": result.get("items", []),
    }
    return json.dumps(body, indent=1).encode()


def result_counts(results: ResultStore, key: str) -> tuple[int | None, int | None]:
    """(items, pages) of a result already in the store (an earlier attempt's): (None, None) when it cannot be read
    or is not a result document. Counting it is not worth failing the attempt."""
    try:
        body = json.loads(results.get(key))
    except Exception as e:  # noqa: BLE001 - a count is a report, the result stands
        log.warning("result-uncounted key=%s error=%s", key, capped(e, 300))
        return None, None
    if not isinstance(body, Mapping):
        return None, None
    items, pages = body.get("items"), body.get("pages")
    whole = isinstance(pages, int) and not isinstance(pages, bool) and pages >= 0
    return (len(items) if isinstance(items, list) else None), (pages if whole else None)
