"""The simulator counts bytes, request units and dollars, not only calls, and its nodes checkpoint as the agent:
staged pages saved as a part beside the result and a small checkpoint on the record (every
`run.checkpoint_pages` pages or `run.checkpoint_s` seconds), the parts read back by a retry."""

import dataclasses
import json
import random
from collections import Counter

import pytest

from cli.main import main
from fleet.config import Config
from fleet.record import ops
from fleet.record.codec import site_to_item
from fleet.record.state import SiteSpec
from sim import units
from sim.cost import Meter, SimResults
from sim.engine import RESULT_CALLS, TABLE_CALLS, Counted
from sim.memory import MemoryStateTable
from sim.model import SimParams
from sim.run import simulate

CALM = SimParams(sites=30, nodes=6, seed=3, sigma=0, drift=0, hang_rate=0.0, spot_per_hour=0.0, capacity_error_rate=0)
COST_KEYS = (
    "state_bytes_per_site",
    "state_write_units_per_site",
    "state_usd_per_site",
    "write_units_per_site",
    "read_units_per_site",
    "s3_requests_per_site",
    "s3_bytes_per_site",
    "requests_usd_per_site",
    "requests_usd",
)


def per_page(p: SimParams) -> SimParams:
    """`p` with a save after every page (`run.checkpoint_pages: 1`)."""
    one = {"sites": [{"id": "x", "start_url": "https://x.test/"}], "run": {"checkpoint_pages": 1}}
    return dataclasses.replace(p, config=Config.model_validate(one))


def test_a_sites_state_grows_in_proportion_to_its_pages():
    short, long = simulate(per_page(CALM)), simulate(per_page(dataclasses.replace(CALM, site_s=1200)))
    pages_short, pages_long = short.checkpoint_calls_per_site, long.checkpoint_calls_per_site
    assert (pages_short, pages_long) == (10, 40)
    page_bytes = CALM.items_per_page * (CALM.item_bytes + 1) + 2
    for r, p in ((short, pages_short), (long, pages_long)):
        assert page_bytes * p < r.state_bytes_per_site < (page_bytes + 200) * p  # a part and a small checkpoint a page
        assert r.state_write_units_per_site == p  # one write unit per checkpoint, whatever the page
        assert r.s3_requests_per_site["put"] == p + 2  # a part per page, the staged result and the hub's copy
    assert long.state_usd_per_site == pytest.approx(4 * short.state_usd_per_site, rel=0.01)


def test_saves_in_batches_cost_a_part_and_a_write_per_batch_and_keep_every_item():
    """30-s pages saved every 120 s (the default) or 25 pages: about one save for four pages, the rest of a site's
    items go with its result; the bytes are those of saving page by page, less the pages the result carries."""
    for site_s in (300, 1200):  # 10 and 40 pages a site
        one, batched = (simulate(q(dataclasses.replace(CALM, site_s=site_s))) for q in (per_page, lambda p: p))
        pages, saves = one.checkpoint_calls_per_site, batched.checkpoint_calls_per_site
        assert 0 < saves <= pages / 4
        assert batched.state_write_units_per_site == saves  # one write unit per save
        assert batched.s3_requests_per_site["put"] == saves + 2  # a part per save, the staged result, its copy
        assert batched.requests_usd_per_site < one.requests_usd_per_site / 2
        assert (batched.completed, batched.attempts) == (one.completed, one.attempts)


def test_retries_read_the_parts_their_checkpoint_names_and_a_calm_run_reads_none():
    calm, hung = simulate(CALM), simulate(dataclasses.replace(CALM, hang_rate=0.5))
    # the node's look for an existing result, then the hub's looks at the staged result and at its key (HEADs) only
    assert calm.s3_requests_per_site["get"] == 3.0
    assert hung.attempts.get("hang", 0) > 0 and hung.s3_requests_per_site["get"] > 3.0
    assert hung.s3_bytes_per_site["get"] > 0


def test_a_write_is_billed_by_the_larger_item_and_a_read_by_what_it_returned():
    results = SimResults()
    meter = Meter(results)
    table = Counted(MemoryStateTable(), "dynamodb", TABLE_CALLS, Counter(), meter.table)
    rec = ops.new_site("r", "s1", SiteSpec("http://x.test/"), None)
    table.create_site(rec)
    rec = ops.claim(table, table.get_site("r", "s1"), "i-1", 1.0)
    assert meter.n["write_units"] == 2 and meter.n["read_units"] == 1
    rng = random.Random(1)  # text that compresses little, as an older node's checkpoint of 600 items
    big = [
        {"id": f"https://x.test/{i}", "text": "".join(f"{rng.getrandbits(128):032x}" for _ in range(8))}
        for i in range(600)
    ]
    rec = ops.save_checkpoint(table, rec, 2.0, None, {"next": "p2", "pages": 1, "items": big})  # an older node's
    size = units.item_size(site_to_item(rec))
    assert size > 50 * 1024 and meter.n["state_write_units"] == units.write_units(size)
    before = meter.n["write_units"]
    ops.beat(table, rec, 3.0)  # a heartbeat alone costs what the whole item weighs
    assert meter.n["write_units"] - before == units.write_units(size)
    table.get_site("r", "s1")
    assert meter.n["read_units"] == 1 + units.read_units(size)
    store = Counted(results, "s3", RESULT_CALLS, Counter(), meter.s3)
    store.put_staged("s1/20261121/parts/1-1/000001.json", b"x" * 5000)
    assert results.get("s1/20261121/parts/1-1/000001.json") == b"[]"  # sizes are kept, not bytes
    assert (meter.n["state_s3_put"], meter.n["s3_put_bytes"]) == (1, 5000)


def test_item_sizes_follow_dynamodbs_rules():
    assert units.item_size({"a": "xyz"}) == 4  # name and UTF-8 value
    assert units.item_size({"n": 12345}) == 1 + 4  # three bytes for five digits, plus one
    assert units.item_size({"m": {"k": True}, "l": [None, "é"]}) == 1 + (3 + 1 + 1 + 1) + 1 + (3 + 1 + 1 + 2 + 1)
    assert units.write_units(1024) == 1 and units.write_units(1025) == 2 and units.write_units(0) == 1
    assert units.read_units(4096) == 1 and units.read_units(4097) == 2 and units.read_units(100, False) == 0.5
    assert units.usd(write_units=1e6, read_units=1e6, s3_puts=1000, s3_gets=1000) == pytest.approx(
        0.625 + 0.125 + 0.005 + 0.0004
    )


def test_simulate_json_shows_the_cost_figures(capsys):
    assert main(["simulate", "--sites", "10", "--nodes", "2", "--seed", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert all(k in out for k in COST_KEYS)
    assert out["state_bytes_per_site"] > 0 and out["requests_usd"] > 0
    assert set(out["s3_requests_per_site"]) == set(out["s3_bytes_per_site"]) == {"put", "get"}
