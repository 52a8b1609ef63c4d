"""What a completed attempt writes to the bucket: the crawler's items merged with its checkpoint's, the result
document, and the seconds each phase of the attempt took (for the node's log line)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fleet.codec import ITEM_ID_MAX_CHARS, capped
from fleet.state import SiteRecord

#: The phases of an attempt on the log line: name -> (the mark it starts at, the mark it ends at; None: now).
PHASES = {
    "setup_s": ("claim", "spawn"),
    "browser_s": ("spawn", "session"),
    "crawl_s": ("session", "result"),
    "close_s": ("result", "closed"),
    "save_s": ("closed", None),
}


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


def phase_timings(marks: Mapping[str, float], now: float) -> dict[str, str]:
    """Seconds per phase: setup (claim to crawler start), browser (to session), crawl, close, save."""
    return {
        k: f"{(marks[b] if b else now) - marks[a]:.2f}"
        for k, (a, b) in PHASES.items()
        if a in marks and (b is None or b in marks)
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
