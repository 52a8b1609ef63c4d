"""Benchmark: what a site's crawl state costs, the older layout against the current one, in the same run.

One attempt of a site of P pages of N items of B bytes is written through the
real code (`fleet.record.ops` on the in-memory table, the agent's `node.parts`, the
record encoded by `fleet.record.codec`) and priced as AWS bills it (`sim.units`:
DynamoDB by the kilobyte of the item each write touches, S3 by the request):

- old: every checkpoint carries every item so far on the site record, as nodes
  wrote it before (`{next, pages, items: [...]}`, compressed; items dropped and
  the checkpoint no longer resumable past CHECKPOINT_MAX_CHARS);
- new: every checkpoint puts the page's items in one part object beside the
  result and writes `{next, pages, items: <count>, parts}` on the record.

Both add the claim, the last heartbeat and the completion, and a retry that
resumes from the last checkpoint (its read of the record, and of the parts).
The items are JSON of made-up words (text compresses about as web text does).

    .venv/bin/python bench/state_cost.py                    # 50 and 200 pages of 20 items of 500 bytes
    .venv/bin/python bench/state_cost.py --pages 10 50 --items 20 --item-bytes 500
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet.outputs import checkpoint as ck  # noqa: E402
from fleet.record import ops  # noqa: E402
from fleet.record.state import SiteRecord, SiteSpec  # noqa: E402
from node.parts import Parts  # noqa: E402
from sim import units  # noqa: E402
from sim.cost import Meter, SimResults  # noqa: E402
from sim.engine import RESULT_CALLS, TABLE_CALLS, Counted  # noqa: E402
from sim.memory import MemoryStateTable  # noqa: E402

RUN, RUN_DATE, SITE = "2026-11-21", "20261121", "shop"
SITES_PER_DAY = 10_000
Items = list[dict[str, str]]
Save = Callable[[Any, Any, SiteRecord, Parts, int, Items, Items], SiteRecord]


def make_items(pages: int, per_page: int, item_bytes: int, seed: int = 7) -> list[Items]:
    """`pages` pages of `per_page` items, each about `item_bytes` bytes as JSON."""
    rng = random.Random(seed)
    syllables = ["ka", "ro", "mi", "ten", "sa", "lu", "ver", "po", "dan", "el", "ri", "gu", "on", "sha", "ti"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    out = []
    for p in range(1, pages + 1):
        page = []
        for k in range(per_page):
            item = {"id": f"https://{SITE}.example/p{p}/a{k}", "title": " ".join(rng.choices(words, k=8)), "text": ""}
            room = item_bytes - len(json.dumps(item))
            text = ""
            while len(text) < room:
                text += rng.choice(words) + " "
            item["text"] = text[: max(0, room)]
            page.append(item)
        out.append(page)
    return out


def one_attempt(pages: list[Items], save: Save) -> tuple[Meter, int | None]:
    """A claim, a checkpoint per page (`save`), then a retry's reads, the last beat and the completion: the meter,
    and the first page whose checkpoint was too large to keep its items (None: none was)."""
    results, records = SimResults(), MemoryStateTable()
    meter = Meter(results, records)
    table = Counted(records, "dynamodb", TABLE_CALLS, Counter(), meter.table)
    store = Counted(results, "s3", RESULT_CALLS, Counter(), meter.s3)
    rec = ops.new_site(RUN, SITE, SiteSpec(f"https://{SITE}.example/"), None)
    table.create_site(rec)
    rec = ops.claim(table, table.get_site(RUN, SITE), "i-1", 1.0)
    parts = Parts(ck.ClaimParts((SITE, RUN_DATE, RUN), rec.attempt, rec.version))
    so_far: Items = []
    partial_at = None
    for n, page in enumerate(pages, 1):
        so_far.extend(page)
        rec = save(table, store, rec, parts, n, page, so_far)
        if partial_at is None and rec.checkpoint and rec.checkpoint.get("partial"):
            partial_at = n
    retry = table.get_site(RUN, SITE)  # a retry's read of the record after the last checkpoint ...
    resume = ops.resumable(retry) if retry else None
    if resume and not ck.is_legacy(resume):  # ... and of the parts it names
        for key in ck.part_keys(SITE, RUN_DATE, RUN, ck.segments(resume)):
            store.get(key)
    rec = ops.beat(table, rec, 2.0)
    store.put_new(f"{SITE}/{RUN_DATE}/result.json", json.dumps({"items": so_far}).encode())
    ops.complete(table, rec, f"{SITE}/{RUN_DATE}/result.json", 3.0)
    return meter, partial_at


def save_old(table: Any, store: Any, rec: SiteRecord, parts: Parts, n: int, page: Items, so_far: Items) -> SiteRecord:
    """The older layout: every item so far in the record's checkpoint."""
    return ops.save_checkpoint(table, rec, 1.0 + n, None, {"next": f"p{n + 1}", "pages": n, "items": so_far})


def save_new(table: Any, store: Any, rec: SiteRecord, parts: Parts, n: int, page: Items, so_far: Items) -> SiteRecord:
    """The current layout, as the agent's `_checkpoint`: the page's items in a part, then the small checkpoint."""
    parts.stage(page)
    part = parts.next_part()
    if part is not None:
        store.put_part(*part)
        parts.stored()
    return ops.save_checkpoint(table, rec, 1.0 + n, None, parts.checkpoint(f"p{n + 1}", n))


def row(name: str, m: Meter) -> str:
    n = m.n
    usd = m.usd()
    return (
        f"  {name:<4} DynamoDB: {n['write_units']:>7,} write units ({n['state_bytes']:>11,} state bytes written), "
        f"{n['read_units']:>5,.0f} read units; S3: {n['s3_put']:>4} PUT {n['s3_get']:>4} GET; "
        f"${usd:.6f} per site, ${usd * SITES_PER_DAY:,.2f} per {SITES_PER_DAY:,} sites/day"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, nargs="+", default=[50, 200])
    ap.add_argument("--items", type=int, default=20, help="items per page")
    ap.add_argument("--item-bytes", type=int, default=500)
    a = ap.parse_args()
    print(
        f"prices (us-east-1 on-demand): DynamoDB ${units.USD_PER_WRITE_UNIT * 1e6:.3f}/M write units, "
        f"${units.USD_PER_READ_UNIT * 1e6:.3f}/M read units; S3 ${units.USD_PER_S3_PUT * 1e3:.4f}/1k PUT, "
        f"${units.USD_PER_S3_GET * 1e3:.4f}/1k GET"
    )
    for pages in a.pages:
        site = make_items(pages, a.items, a.item_bytes)
        (old, partial_at), (new, _) = one_attempt(site, save_old), one_attempt(site, save_new)
        print(f"{pages} pages x {a.items} items x {a.item_bytes} B (one attempt, then a retry's reads):")
        print(row("old", old))
        print(row("new", new))
        note = (
            f"old checkpoint too large from page {partial_at}: items dropped, not resumable after it"
            if partial_at
            else "old checkpoint stayed resumable"
        )
        print(
            f"  ratio old/new: {old.usd() / new.usd():.1f}x in dollars, "
            f"{old.n['write_units'] / new.n['write_units']:.1f}x in write units; {note}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
