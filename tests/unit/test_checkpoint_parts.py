"""A site's state costs in proportion to its crawl: the record's checkpoint holds a cursor and counts, each
checkpoint's new items go to one part object beside the result, and a retry reads the parts its checkpoint names
(on the in-memory table and result store; the crawler is scripted, see tests/helpers/fake_node.py)."""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import ClientError

from fleet.outputs import checkpoint as ck
from fleet.outputs.results import part_key
from fleet.record import ops
from fleet.record.codec import ITEM_ID_MAX_CHARS, encode_checkpoint, site_to_item
from fleet.record.state import Reason, RunStatus
from sim import units
from tests.helpers.fake_node import HANG, RUN, Rig, status

START = [(0.5, {"event": "session", "id": "sess-1"}), (0.6, status("RUNNING"))]
PARTS = "staging/local:i-1/s1/20261121/parts/"  # node i-1's own prefix (a local node: no IAM role)
EACH_PAGE = ck.SaveEvery(pages=1)  # a part and the record's checkpoint with each page, as `run.checkpoint_pages: 1`


def page(p: int, t: float, nxt: str | None, per_page: int = 2, size: int = 0) -> list:
    """Page `p` as a crawler reports it: URL_CALL, CALL_DONE, then its checkpoint with `per_page` new items."""
    url = f"http://x.test/?page={p}"
    items = [{"id": f"i{p}-{k}", "text": "x" * size} for k in range(per_page)]
    return [
        (t, status("URL_CALL", url, p - 1)),
        (t + 0.5, status("CALL_DONE", url, p)),
        (t + 0.6, {"event": "checkpoint", "next": nxt, "pages": p, "items": items}),
    ]


def pages(first: int, last: int, **kw) -> list:
    return sum((page(p, float(p - first + 1), f"p{p + 1}", **kw) for p in range(first, last + 1)), [])


def ids(p_from: int, p_to: int, per_page: int = 2) -> list[str]:
    return [f"i{p}-{k}" for p in range(p_from, p_to + 1) for k in range(per_page)]


def result_ids(rig: Rig) -> list[str]:
    rig.site()  # the hub makes the staged result the site's
    return [i["id"] for i in json.loads(rig.results.get("s1/20261121/result.json"))["items"]]


def test_the_checkpoint_stays_the_same_size_as_the_pages_grow(tmp_path):
    # 40 pages of 20 items of 500 bytes: the old checkpoint grew to ~400 KB of items; this one must not grow.
    script = START + pages(1, 40, per_page=20, size=500) + [(45.0, {"event": "result", "items": [], "pages": 40})]
    rig = Rig(tmp_path, [script], heartbeat_interval_s=1000, save_every=EACH_PAGE)
    sizes: list[tuple[int, int]] = []
    write = rig.table.write

    def measured(old, new):  # the fake's own write, with the sizes DynamoDB would bill
        if new.checkpoint is not None and new.checkpoint != old.checkpoint:
            sizes.append((len(encode_checkpoint(new.checkpoint)), units.item_size(site_to_item(new))))
        return write(old, new)

    rig.table.write = measured
    rig.seed()
    rig.agent.run()
    assert len(sizes) == 40
    assert max(c for c, _ in sizes) - min(c for c, _ in sizes) <= 8  # a few digits of the counts move, no more
    assert max(units.write_units(i) for _, i in sizes) == 1  # every checkpoint write is one write unit
    assert len(rig.results.keys(PARTS)) == 40  # one part per checkpoint, each with only that page's items
    assert all(len(json.loads(rig.results.get(k))) == 20 for k in rig.results.keys(PARTS))
    assert result_ids(rig) == ids(1, 40, 20)


def test_a_retry_after_a_crash_mid_crawl_gives_every_item_exactly_once(tmp_path):
    # attempt 1: pages 1-3 saved, then the crawler process dies; attempt 2 resumes at page 4, reports page 3's
    # items again (a crawler may overlap pages), crashes after page 5; attempt 3 finishes pages 6-7.
    first = START + pages(1, 3) + [(4.0, status("URL_CALL", "http://x.test/?page=4", 3))]
    second = START + pages(3, 5) + [(4.0, status("URL_CALL", "http://x.test/?page=6", 5))]
    third = START + pages(6, 7) + [(3.0, {"event": "result", "items": [{"id": "i7-1"}, {"id": "tail"}], "pages": 7})]
    rig = Rig(tmp_path, [first, second, third])
    rig.seed()
    rig.agent.run()
    rec = rig.site()
    assert rec.run_status is RunStatus.COMPLETED and rec.attempt == 3 and rec.checkpoint is None
    assert [a.outcome for a in rec.attempts] == ["error", "error", "completed"]
    assert [i["id"] for i in rig.crawls[1].job["checkpoint"]["items"]] == ids(1, 3)
    resumed = rig.crawls[2].job["checkpoint"]
    assert (resumed["next"], resumed["pages"], resumed["items"][-1]["id"]) == ("p6", 5, "i5-1")
    assert [i["id"] for i in resumed["items"]] == ids(1, 3) + ids(3, 5)  # as stored: the result dedups
    assert result_ids(rig) == ids(1, 7) + ["tail"]


def test_a_checkpoint_names_its_parts_by_claim_and_a_retry_continues_them(tmp_path):
    first = START + pages(1, 2) + [(3.0, status("URL_CALL", "http://x.test/?page=3", 2)), HANG]
    second = START + pages(3, 3) + [(2.0, status("URL_CALL", "http://x.test/?page=4", 3)), HANG]
    rig = Rig(tmp_path, [first, second], max_attempts=2, save_every=EACH_PAGE)
    rig.seed()
    seen = []
    write = rig.table.write
    rig.table.write = lambda old, new: seen.append(new.checkpoint) or write(old, new)
    rig.agent.run()
    saved = [c for c in seen if c and "parts" in c]
    claim1, claim2 = saved[0]["parts"][0][1], saved[-1]["parts"][1][1]
    assert saved[-1] == {"next": "p4", "pages": 3, "items": 6, "parts": [[1, claim1, 2, "i-1"], [2, claim2, 1, "i-1"]]}
    assert claim2 > claim1  # each claim moved the record's version
    assert rig.results.keys(PARTS) == [
        f"{PARTS}1-{claim1}/000001.json",
        f"{PARTS}1-{claim1}/000002.json",
        f"{PARTS}2-{claim2}/000001.json",
    ]


def test_a_checkpoint_written_by_an_older_node_is_resumed_from(tmp_path):
    # An older node's record: the items themselves in the checkpoint, one with its id cut to fit the item limit.
    long_id = "L" * 2_000
    old = {"next": "p3", "pages": 2, "items": [{"id": "i1-0"}, {"id": long_id[:ITEM_ID_MAX_CHARS]}, {"id": "i2-0"}]}
    resume = START + pages(3, 3) + [(2.0, {"event": "result", "items": [{"id": long_id}], "pages": 3})]
    rig = Rig(tmp_path, [resume], save_every=EACH_PAGE)
    rig.seed()
    rec = rig.site()
    saved = []
    write = rig.table.write
    rig.table.write = lambda o, n: saved.append(n.checkpoint) or write(o, n)
    write(rec, ops.transition(rec, bump=False, checkpoint=old))
    rig.agent.run()
    assert rig.crawls[0].job["checkpoint"] == old  # the crawler starts at page 3, knowing those items
    new = next(c for c in saved if c and "parts" in c)
    assert new["items"] == 5 and new["pages"] == 3  # the old items moved into this claim's first part
    (part,) = rig.results.keys(PARTS)
    assert [i["id"] for i in json.loads(rig.results.get(part))] == [i["id"] for i in old["items"]] + ids(3, 3)
    assert result_ids(rig) == ["i1-0", long_id, "i2-0", *ids(3, 3)]  # the cut id matched: one item, whole


def test_parts_of_a_fenced_attempt_do_not_reach_the_result(tmp_path):
    # Attempt 1's node is taken for lost after page 2 (the hub ends its attempt and sends the next): its part for
    # page 3 is stored before its checkpoint write fails. Attempt 2 (another node) reads only the named parts.
    zombie = START + pages(1, 3) + [HANG]
    rig = Rig(tmp_path, [zombie], save_every=EACH_PAGE)
    rig.seed()
    write, ckpts = rig.table.write, []

    def hub_moves_on_at_page_3(old, new):
        if new.checkpoint and new.checkpoint != old.checkpoint:
            ckpts.append(new.checkpoint)
            if new.checkpoint["pages"] == 3:  # the hub's own ops, as its executor performs them
                cur = ops.end_attempt(rig.table, old, reason=Reason.LOST, now=1.0, max_attempts=3, spot_cap=2)
                ops.send_next(rig.table, rig.queue, cur)
        return write(old, new)

    rig.table.write = hub_moves_on_at_page_3
    rig.agent.run()
    assert rig.site().run_status is RunStatus.QUEUED and rig.site().checkpoint["pages"] == 2
    assert len(rig.results.keys(PARTS)) == 3  # the zombie's third part is there, named by no checkpoint
    rest = START + pages(3, 4) + [(3.0, {"event": "result", "items": [], "pages": 4})]
    (tmp_path / "n2").mkdir()
    other = Rig(tmp_path / "n2", [rest], instance_id="i-2")
    other.agent.table, other.agent.queue, other.agent.results = rig.table, rig.queue, rig.results
    other.clock = other.agent.clock = rig.clock  # one store, one time: the second node of the same fleet
    rig.table.write = write
    other.agent.run()
    assert [i["id"] for i in other.crawls[0].job["checkpoint"]["items"]] == ids(1, 2)
    assert rig.site().run_status is RunStatus.COMPLETED and result_ids(rig) == ids(1, 4)


def test_a_part_that_could_not_be_stored_stays_staged_and_its_checkpoint_is_not_written(tmp_path):
    script = START + pages(1, 3) + [(4.0, {"event": "result", "items": [], "pages": 3})]
    rig = Rig(tmp_path, [script], heartbeat_interval_s=1000, save_every=EACH_PAGE)
    put, calls = rig.results.put_staged, []

    def throttled_once(key, body):  # S3's answer to a request rate it will not take, at the store's seam
        calls.append(key)
        if len(calls) == 2:
            slow = {"Error": {"Code": "SlowDown", "Message": "Reduce your request rate."}}
            raise ClientError({**slow, "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject")
        return put(key, body)

    rig.results.put_staged = throttled_once
    saved = []
    write = rig.table.write
    rig.table.write = lambda o, n: saved.append(n.checkpoint if n.checkpoint != o.checkpoint else None) or write(o, n)
    rig.seed()
    rig.agent.run()
    written = [c for c in saved if c and "parts" in c]
    assert [(c["pages"], c["items"], c["parts"][0][2]) for c in written] == [(1, 2, 1), (3, 6, 2)]
    keys = rig.results.keys(PARTS)
    assert [len(json.loads(rig.results.get(k))) for k in keys] == [2, 4]  # page 2's items went with page 3's
    assert result_ids(rig) == ids(1, 3)


def test_parts_named_by_a_checkpoint_are_checked_before_they_become_keys():
    assert ck.segments({"parts": [[2, 17, 3]]}) == [ck.Segment(2, 17, 3)]
    assert ck.segments({"parts": [[2, 17, 3, "i-0abc"]]}) == [ck.Segment(2, 17, 3, "i-0abc")]
    for bad in ([[1, 2]], [["1", 2, 3]], [[True, 2, 3]], [[1, -2, 3]], "1-2/3", [[1, 2, 3]] * (ck.MAX_SEGMENTS + 1)):
        with pytest.raises(ValueError):
            ck.segments({"parts": bad})
    with pytest.raises(ValueError):
        part_key("../etc", "20261121", RUN, 1, 2, 1)
    with pytest.raises(ValueError):
        part_key("s1", "20261121", RUN, 0, 2, 1)
    assert part_key("s1", "20261121", RUN, 1, 2, 3) == "s1/20261121/parts/1-2/000003.json"
    assert part_key("s1", "20261121", "demo-1", 1, 2, 3) == "s1/20261121/demo-1/parts/1-2/000003.json"
    staged = part_key("s1", "20261121", RUN, 1, 2, 3, "AROAX:i-0abc")
    assert staged == "staging/AROAX:i-0abc/s1/20261121/parts/1-2/000003.json"
    for bad in ("AROAX", "AROAX:../i-0", "AR/X:i-0", "AROAX:i-0/.."):  # a writer names one node's own prefix only
        with pytest.raises(ValueError):
            part_key("s1", "20261121", RUN, 1, 2, 3, bad)
    for bad in ([[1, 2, 3, "../x"]], [[1, 2, 3, 7]], [[1, 2, 3, "i-1", 4]]):
        with pytest.raises(ValueError):
            ck.segments({"parts": bad})


def test_a_checkpoint_whose_parts_cannot_be_read_is_not_resumed_from(tmp_path):
    rest = START + pages(1, 2) + [(3.0, {"event": "result", "items": [], "pages": 2})]
    rig = Rig(tmp_path, [rest])
    rig.seed()
    rec = rig.site()
    rig.table.write(rec, ops.transition(rec, bump=False, checkpoint=ck.make("p9", 8, 16, [ck.Segment(1, 5, 8)])))
    rig.agent.run()  # no such parts in the store: the crawl starts over, nothing is lost
    assert rig.crawls[0].job["checkpoint"] is None and result_ids(rig) == ids(1, 2)


# --- saves in batches: `run.checkpoint_pages`, `run.checkpoint_s` --------------------------------------------------


def record_checkpoints(rig: Rig) -> list[tuple[float, dict, bool]]:
    """Each write of the record's checkpoint from now on: (monotonic time, checkpoint, a heartbeat too)."""
    seen: list[tuple[float, dict, bool]] = []
    write = rig.table.write

    def watched(old, new):
        if new.checkpoint and new.checkpoint != old.checkpoint:
            seen.append((rig.clock.monotonic(), new.checkpoint, new.heartbeat != old.heartbeat))
        return write(old, new)

    rig.table.write = watched
    return seen


def part_sizes(rig: Rig) -> list[int]:
    return [len(json.loads(rig.results.get(k))) for k in rig.results.keys(PARTS)]


def test_pages_are_saved_every_checkpoint_pages_as_one_part_and_one_record_write(tmp_path):
    script = START + pages(1, 7) + [(8.0, {"event": "result", "items": [], "pages": 7})]
    rig = Rig(tmp_path, [script], heartbeat_interval_s=1000, save_every=ck.SaveEvery(pages=3))
    rig.seed()
    saves = record_checkpoints(rig)
    rig.agent.run()
    assert [(c["next"], c["pages"], c["items"]) for _, c, _ in saves] == [("p4", 3, 6), ("p7", 6, 12)]
    assert part_sizes(rig) == [6, 6]  # pages 1-3 and 4-6; page 7's items went with the result only
    assert rig.site().run_status is RunStatus.COMPLETED and result_ids(rig) == ids(1, 7)


def test_a_slow_crawl_saves_once_checkpoint_s_passed_since_its_first_unsaved_page(tmp_path):
    slow = sum((page(p, 1.0 + 40.0 * (p - 1), f"p{p + 1}") for p in range(1, 9)), [])  # a page every 40 s
    script = START + slow + [(330.0, {"event": "result", "items": [], "pages": 8})]
    rig = Rig(tmp_path, [script], heartbeat_interval_s=1000, save_every=ck.SaveEvery(pages=25, seconds=100))
    rig.seed()
    saves = record_checkpoints(rig)
    rig.agent.run()
    # pages 1-3 span 80 s: page 4 (120 s after page 1) is the first past 100 s, then page 8 (120 s after page 5)
    assert [c["pages"] for _, c, _ in saves] == [4, 8]
    assert part_sizes(rig) == [8, 8] and result_ids(rig) == ids(1, 8)


def test_a_save_due_before_the_next_heartbeat_is_written_with_this_one(tmp_path):
    # Page 1 is staged 1.6 s after the crawler started; the crawl then waits on page 2 for 30 s. The save falls due
    # 12 s after page 1: the beat before that (5 s apart) writes it, one write that is checkpoint and heartbeat.
    script = START + page(1, 1.0, "p2") + page(2, 30.0, "p3") + [(31.0, {"event": "result", "items": [], "pages": 2})]
    rig = Rig(tmp_path, [script], heartbeat_interval_s=5, save_every=ck.SaveEvery(pages=25, seconds=12))
    rig.seed()
    writes: list[tuple[float, bool]] = []  # (time, the checkpoint moved) of every write of the record
    write = rig.table.write
    rig.table.write = lambda o, n: writes.append((rig.clock.monotonic(), n.checkpoint != o.checkpoint)) or write(o, n)
    saves = record_checkpoints(rig)
    rig.agent.run()
    ((at, ckpt, beat),) = saves
    staged_at = rig.crawls[0].started + 1.6
    assert (ckpt["next"], ckpt["pages"], beat) == ("p2", 1, True)
    assert staged_at + 12 - 5 <= at < staged_at + 12  # the last beat before it fell due
    assert [t for t, _ in writes].count(at) == 1  # one write at that beat, not a heartbeat and a save
    assert result_ids(rig) == ids(1, 2)


def spot_after(rig: Rig, at: float) -> None:
    rig.agent.spot_notice = lambda: rig.crawls and rig.clock.monotonic() >= rig.crawls[0].started + at


NODE_ENDS = {
    "error": [(5.0, {"event": "error", "message": "boom"})],
    "hang": [(4.6, status("URL_CALL", "http://x.test/?page=5", 4)), HANG],
    "exited": [(4.6, status("URL_CALL", "http://x.test/?page=5", 4))],
    "spot": [(4.6, status("URL_CALL", "http://x.test/?page=5", 4)), HANG],
}


@pytest.mark.parametrize("how", sorted(NODE_ENDS))
def test_an_attempt_its_node_ends_saves_its_staged_pages_first(tmp_path, how):
    first = START + pages(1, 4) + NODE_ENDS[how]
    retry = START + pages(5, 5) + [(2.0, {"event": "result", "items": [], "pages": 5})]
    rig = Rig(tmp_path, [first, retry])  # 25 pages or 120 s: none of the four is due before the end
    if how == "spot":
        spot_after(rig, 6.0)
    rig.seed()
    saves = record_checkpoints(rig)
    write, browsers_ended = rig.table.write, []  # how many browsers were ended when the checkpoint was written
    rig.table.write = lambda o, n: (n.checkpoint != o.checkpoint and browsers_ended.append(len(rig.cleanups))) or write(
        o, n
    )
    rig.agent.run()
    assert [(c["next"], c["pages"], c["items"]) for _, c, _ in saves][:1] == [("p5", 4, 8)]
    assert browsers_ended[0] == 0  # saved at once, before the evidence and the browser (the hub's backup kill is near)
    assert rig.site().attempts[0].outcome == {"exited": "error"}.get(how, how)
    if how == "spot":  # given back, and the node leaves: the record holds where the retry starts
        assert rig.site().checkpoint["next"] == "p5"
        return
    resumed = rig.crawls[1].job["checkpoint"]
    assert (resumed["next"], resumed["pages"]) == ("p5", 4) and [i["id"] for i in resumed["items"]] == ids(1, 4)
    assert result_ids(rig) == ids(1, 5)


def test_a_result_writes_no_part_for_its_staged_pages(tmp_path):
    # The save would fall due before the next beat when the result comes: "still ours?" is a plain beat all the same.
    script = START + pages(1, 3) + [(4.0, {"event": "result", "items": [], "pages": 3})]
    rig = Rig(tmp_path, [script], heartbeat_interval_s=5, save_every=ck.SaveEvery(pages=25, seconds=5))
    rig.seed()
    saves = record_checkpoints(rig)
    rig.agent.run()
    assert saves == [] and rig.results.keys(PARTS) == []
    assert rig.site().run_status is RunStatus.COMPLETED and result_ids(rig) == ids(1, 3)


def test_a_fenced_attempt_saves_nothing_of_what_it_staged(tmp_path):
    # The hub ends the attempt (the node taken for lost) after page 2: the next heartbeat is fenced, and the pages
    # staged are the hub's to retry, never saved by the node (a part stored, its checkpoint fenced, names nothing).
    script = START + pages(1, 2) + [(2.6, status("URL_CALL", "http://x.test/?page=3", 2)), HANG]
    rig = Rig(tmp_path, [script], heartbeat_interval_s=5)
    rig.seed()
    saves = record_checkpoints(rig)
    write, moved = rig.table.write, []

    def hub_moves_on(old, new):
        if not moved and rig.crawls and rig.clock.monotonic() >= rig.crawls[0].started + 3.0:
            moved.append(old)  # the hub's own ops, as its executor performs them
            cur = ops.end_attempt(rig.table, old, reason=Reason.LOST, now=1.0, max_attempts=3, spot_cap=2)
            ops.send_next(rig.table, rig.queue, cur)
        return write(old, new)

    rig.table.write = hub_moves_on
    rig.agent.run()
    assert saves == [] and rig.results.keys(PARTS) == [] and moved
    rec = rig.site()
    assert rec.run_status is RunStatus.QUEUED and rec.checkpoint is None and rec.attempts[0].outcome == "lost"


def test_a_claim_stages_pages_and_tells_when_they_are_due():
    claim = ck.ClaimParts(("s1", "20261121", RUN), attempt=2, claim=7, earlier=[ck.Segment(1, 3, 2)], saved_items=5)
    every = ck.SaveEvery(pages=3, seconds=60)
    assert not claim.due(every, 1e9)  # nothing staged: never due
    claim.page("p2", 1, 100.0)
    claim.page("p3", 2, 130.0)
    assert (claim.staged_pages, claim.staged_since) == (2, 100.0)
    assert not claim.due(every, 159.9) and claim.due(every, 160.0)  # 60 s after the first staged page
    claim.page("p4", 3, 140.0)
    assert claim.due(every, 140.0)  # 3 pages
    claim.stored(4)
    assert (claim.staged_pages, claim.staged_since, claim.written) == (0, None, 1)
    assert claim.saved() == {"next": "p4", "pages": 3, "items": 9, "parts": [[1, 3, 2], [2, 7, 1]]}
    assert claim.next_key() == "s1/20261121/parts/2-7/000002.json"
    claim.page(None, 4, 200.0)
    claim.stored(0)  # the page found no items: no part, the cursor still saved
    assert claim.written == 1 and not claim.due(every, 1e9)
    assert claim.saved() == {"next": None, "pages": 4, "items": 9, "parts": [[1, 3, 2], [2, 7, 1]]}


def slow_down(key, body):
    """S3's answer to a request rate it will not take, past botocore's retries."""
    slow = {"Error": {"Code": "SlowDown", "Message": "Reduce your request rate."}}
    raise ClientError({**slow, "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject")


def test_a_save_whose_part_is_missed_is_tried_again_with_the_next_page(tmp_path):
    script = START + pages(1, 3) + [(4.0, {"event": "result", "items": [], "pages": 3})]
    rig = Rig(tmp_path, [script], heartbeat_interval_s=1000, save_every=ck.SaveEvery(pages=2))
    put, calls = rig.results.put_staged, []
    rig.results.put_staged = lambda key, body: calls.append(key) or (slow_down if len(calls) == 1 else put)(key, body)
    rig.seed()
    saves = record_checkpoints(rig)
    rig.agent.run()
    assert [(c["pages"], c["items"]) for _, c, _ in saves] == [(3, 6)]  # due at page 2, missed, saved at page 3
    assert part_sizes(rig) == [6] and result_ids(rig) == ids(1, 3)


@pytest.mark.parametrize("fault", ["part", "record"])
def test_an_end_is_written_even_when_the_save_before_it_fails(tmp_path, fault):
    first = START + pages(1, 2) + [(3.0, {"event": "error", "message": "boom"})]
    rig = Rig(tmp_path, [first, START + [(1.0, {"event": "result", "items": [], "pages": 0})]])
    if fault == "part":  # every part refused (the result, staged under the same prefix, is not)
        put = rig.results.put_staged
        rig.results.put_staged = lambda key, body, *a: (slow_down if "/parts/" in key else put)(key, body, *a)
    else:  # the table refuses the checkpoint as invalid (ValidationException)
        write = rig.table.write

        def refusing(old, new):
            if new.checkpoint and new.checkpoint != old.checkpoint:
                raise ClientError({"Error": {"Code": "ValidationException", "Message": "too large"}}, "UpdateItem")
            return write(old, new)

        rig.table.write = refusing
    rig.seed()
    rig.agent.run()
    rec = rig.site()
    assert [a.outcome for a in rec.attempts] == ["error", "completed"]
    assert rec.attempts[0].counts is not None and rec.attempts[0].counts.items == 4  # the end, with its counts
    assert rig.crawls[1].job["checkpoint"] is None  # nothing saved: the retry started over
