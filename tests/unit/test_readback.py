"""Reading is total: nothing a node can write into the table makes a read raise, and a whole run (the real hub and
node agents, in virtual time, on the in-memory stores) ends as it would have while a hostile node writes at random
into everything the node role's policy lets it (hypothesis; the policy's attribute list as infra/terraform writes
it: the e2e tier runs the same fuzz against the policy as the twin renders it, on a real run on the moto server)."""

from __future__ import annotations

import logging
import re
from decimal import Decimal
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.record.codec import item_to_site, site_to_item
from fleet.record.partition import split_partition
from fleet.record.readback import UnreadableItem, as_count, as_epoch
from fleet.record.stamp import UNREAD, item_stamp, patchable
from fleet.record.state import RunStatus, SiteRecord, SiteSpec
from hub.snapshot import SiteCache
from sim.memory import MemoryStateTable
from tests.helpers import scribbles
from tests.helpers.fleet_sim import RUN, SimCloud, sim_config

TF = Path(__file__).resolve().parents[2] / "infra" / "terraform" / "iam.tf"


def node_attributes() -> list[str]:
    """The attributes the node's UpdateItem may name, as infra/terraform/iam.tf lists them."""
    text = TF.read_text()
    block = text[text.index('sid       = "AttemptAndNodeWrites"') :]
    values = block[block.index("values = [") : block.index("]", block.index("values = ["))]
    return re.findall(r'"([^"]+)"', values)


ATTRS = node_attributes()
ALL_ATTRS = sorted({*ATTRS, *scribbles.HUB_ONLY, "spec", "attemptBase", "mark"})

items = st.fixed_dictionaries(
    {"run_id": st.just(RUN), "Site": st.text(max_size=30) | st.sampled_from(["s1", "#run", "#node#i-1", "#h#1#1"])},
    optional={a: scribbles.VALUES for a in ALL_ATTRS if a not in ("run_id", "Site")},
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(items, max_size=4))
def test_no_item_a_node_can_write_makes_a_read_of_the_run_raise(raw):
    logging.getLogger("gridfleet.readback").disabled = True
    try:
        part = split_partition(raw)
    finally:
        logging.getLogger("gridfleet.readback").disabled = False
    for r in part.sites:  # what is read is whole: its status, fence and counts what a record can hold
        assert isinstance(r.run_status, RunStatus) and r.attempt >= 0 and r.version >= 0 and r.pages >= 0
        assert site_to_item(r)  # and can be written again
    for item in raw:
        st_ = item_stamp(item)
        assert len(st_) == 11
        if patchable(st_):
            assert all(v != UNREAD for v in st_)


@settings(max_examples=300, deadline=None)
@given(scribbles.VALUES)
def test_a_value_of_any_type_is_a_count_or_a_time_only_when_it_is_one(v):
    n, t = as_count(v), as_epoch(v)
    assert n is None or (isinstance(n, int) and 0 <= n and Decimal(n) == v)
    assert t is None or (isinstance(t, float) and 0 <= t)


def test_a_seeded_record_with_its_fence_scribbled_is_quarantined_not_misread():
    rec = SiteRecord(RUN, "s1", SiteSpec("http://s1.test/"), version=3, attempt=1, instance_id="i-1")
    for attr, bad in (("version", "x"), ("attemptCount", [1]), ("instance_id", Decimal(7)), ("run_status", None)):
        item = {**site_to_item(rec), attr: bad}
        try:
            item_to_site(item)
        except UnreadableItem as e:
            assert e.unread.attr == attr and e.raw is item
        else:
            raise AssertionError(f"{attr}: read as a record")


def test_the_hubs_cache_never_reads_more_than_its_own_sites_whatever_a_node_adds():
    """A node can make items of any key in the run's partition, index key included: the hub reads only its own."""
    table, cache = MemoryStateTable(), SiteCache()
    cache.expect(["s1"])
    table.create_site(SiteRecord(RUN, "s1", SiteSpec("http://s1.test/")))
    cache.load(table.read_run(RUN).sites)
    for n in range(50):
        scribbles.to_memory(table, scribbles.Write(RUN, f"junk{n}", {"openSite": f"junk{n}", "run_status": "RUN"}))
    fetched: list[str] = []
    cache.refresh(table.open_stamps(RUN), lambda names, notes: fetched.extend(names) or [])
    assert fetched == [] and set(cache.sites) == {"s1"}


HONEST = {f"h{n}": ("slow" if n % 2 else "ok") for n in range(6)}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_a_run_ends_as_it_would_have_while_a_node_writes_at_random_into_all_it_may(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("hostile")
    cloud = SimCloud(tmp, sim_config(HONEST), HONEST)
    nodes = [f"i-sim{n:03d}" for n in range(3)]
    writes = data.draw(st.lists(scribbles.writes(RUN, sorted(HONEST), ATTRS, nodes), min_size=60, max_size=60))
    tally = scribbles.Tally()

    def hostile() -> None:
        for w in writes:
            cloud.clock.sleep(0.5)
            names = set(w.values)
            if not (names <= set(ATTRS) or w.put) or w.partition.startswith("#run") or w.partition == "#sites" != w.put:
                tally.refused_by_iam += 1  # the policy's attribute list and hub partitions: as the evaluator says
                continue
            try:
                scribbles.to_memory(cloud.table, w)
            except ValueError:
                tally.refused_by_dynamodb += 1
                continue
            tally.sent += 1

    cloud.start_hub()
    cloud.clock.spawn("hostile", hostile)
    logging.getLogger("gridfleet.readback").disabled = True
    try:
        cloud.run()
    finally:
        logging.getLogger("gridfleet.readback").disabled = False
    report = cloud.check()
    assert report.violations == [], report.violations
    for name in HONEST:
        assert cloud.site(name).run_status is RunStatus.COMPLETED, (name, cloud.site(name))
    assert cloud.outcomes and cloud.outcomes[-1].exit_code == 0


def test_what_is_read_back_is_plain_python_a_crawlers_job_can_carry_as_json():
    """Numbers come back from DynamoDB as Decimal: the spec's options and a node's counters read back as plain
    numbers, which the crawler's job (JSON on its stdin) and the dashboard take."""
    import json

    from fleet.record.partition import NodeInfo, item_to_node, node_to_item

    spec = SiteSpec("http://s1.test/", options={"depth": 2, "ratio": 0.25, "nested": {"n": [1, 2.5]}})
    rec = item_to_site(site_to_item(SiteRecord(RUN, "s1", spec)))
    assert json.dumps(dict(rec.spec.options)) == json.dumps(dict(spec.options))
    node = item_to_node(node_to_item(NodeInfo(RUN, "i-1", "idle", 1.0, 1.0, stats={"completed": 3, "errors": {}})))
    assert json.dumps(node.stats) == '{"completed": 3, "errors": {}}'


def _forge_when(cloud: SimCloud, site: str, ready, values: dict) -> list[float]:
    """A hostile node that waits until `ready(record)` holds, then writes `values` into `site`'s record (an
    UpdateItem the node role may make: every name is one of its attributes). Returns when it wrote."""
    assert set(values) <= set(ATTRS), set(values) - set(ATTRS)
    wrote: list[float] = []

    def forge() -> None:
        while not wrote:
            cloud.clock.sleep(0.25)
            rec = cloud.site(site)
            if rec is not None and ready(rec):
                scribbles.to_memory(cloud.table, scribbles.Write(RUN, site, values))
                wrote.append(cloud.clock.now())

    cloud.clock.spawn("forger", forge)
    return wrote


def _history_of(cloud: SimCloud) -> list:
    return cloud.table.read_run(RUN).history


def test_a_completion_no_hub_made_is_set_apart_and_the_site_crawled_again_for_its_result(tmp_path):
    """A node writes COMPLETED into a site it does not hold (no result at the site's key): the hub, which alone
    completes a site, repairs the record and the site is crawled again; it ends with a result of its own."""
    sites = {"a": "slow", "b": "ok"}
    cloud = SimCloud(tmp_path, sim_config(sites), sites)
    wrote = _forge_when(cloud, "a", lambda r: r.run_status is RunStatus.RUN, {"run_status": "COMPLETED"})
    cloud.start_hub()
    cloud.run()
    assert wrote, "the forger never saw the site running"
    rec = cloud.site("a")
    assert rec.run_status is RunStatus.COMPLETED and cloud.results.exists(rec.result_key)
    repaired = [e for e in _history_of(cloud) if e.kind == "repaired"]
    assert [e.fields.get("site") for e in repaired] == ["a"], repaired
    assert cloud.check().violations == []


def test_a_saved_that_nothing_staged_backs_ends_the_attempt_as_an_error_and_the_site_is_retried(tmp_path):
    """A node writes SAVED (with a claim it names) into a site another node is crawling: the hub finds nothing
    staged under the holder's prefix for that claim, ends the attempt as an error (no result from a node's word)
    and the retry completes the site with a result of its own."""
    sites = {"a": "slow"}
    cloud = SimCloud(tmp_path, sim_config(sites), sites)
    wrote = _forge_when(cloud, "a", lambda r: r.run_status is RunStatus.RUN, {"site_status": "SAVED", "staged": 7})
    cloud.start_hub()
    cloud.run()
    assert wrote
    rec = cloud.site("a")
    assert rec.run_status is RunStatus.COMPLETED and cloud.results.exists(rec.result_key)
    assert rec.attempts[0].outcome == "error" and len(rec.attempts) == 2
    assert cloud.check().violations == []


def test_a_history_forged_so_it_reads_whole_is_what_the_check_judges(tmp_path):
    """Attempts a node writes into a finished site's record as readable history (two that overlap, on a node that
    never held the site) are read as written, and `gridfleet check` refuses them: the fuzzers leave honest sites'
    histories alone for that reason."""
    sites = {"a": "ok"}
    cloud = SimCloud(tmp_path, sim_config(sites), sites)
    cloud.start_hub()
    cloud.run()
    rec = cloud.site("a")
    honest = site_to_item(rec)["attempts"]
    forged = [*honest, {"n": 2, "instance_id": "i-forged", "start": 0, "end": 10**10, "outcome": "completed"}]
    scribbles.to_memory(cloud.table, scribbles.Write(RUN, "a", {"attempts": forged}))
    report = cloud.check()
    assert any("overlap" in v for v in report.violations), report.violations
