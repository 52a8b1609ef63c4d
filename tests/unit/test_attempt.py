"""One attempt of the node agent on fakes: checkpoints and resumes, incremental marks, and what it writes being
bounded (a write the table refuses ends the attempt, not the node)."""

from __future__ import annotations

import json

from botocore.exceptions import ClientError

from fleet.outputs.checkpoint import SaveEvery
from fleet.record import ops
from fleet.record.codec import ERROR_MAX_CHARS, ITEM_ID_MAX_CHARS, URL_MAX_CHARS
from fleet.record.state import Counts, RunStatus, SiteSpec, SiteStatus
from tests.helpers.fake_node import HANG, RUN, Rig, pages_script, spied, status

# --- checkpoints and incremental marks ------------------------------------------------------------


def page_with_checkpoint(p: int, t: float, nxt: str | None) -> list:
    """A page as a crawler reports it: URL_CALL, CALL_DONE, then the checkpoint with its two new items."""
    url = f"http://x.test/?page={p}"
    return [
        (t, status("URL_CALL", url, p - 1)),
        (t + 0.5, status("CALL_DONE", url, p)),
        (t + 0.6, {"event": "checkpoint", "next": nxt, "pages": p, "items": [{"id": f"i{p}a"}, {"id": f"i{p}b"}]}),
    ]


def test_a_retry_resumes_from_the_checkpoint_and_the_result_has_each_item_once(tmp_path):
    start = [(0.5, {"event": "session", "id": "sess-1"}), (0.6, status("RUNNING"))]
    first = (
        start
        + page_with_checkpoint(1, 1, "p2")
        + page_with_checkpoint(2, 2, "p3")
        + [(3.0, status("URL_CALL", "http://x.test/?page=3", 2)), HANG]
    )
    # The resumed crawler reports page 2's items again (as a crawler that overlaps pages might): no duplicates.
    second = (
        start
        + page_with_checkpoint(3, 1, None)
        + [(2.0, {"event": "result", "items": [{"id": "i2b"}, {"id": "i3a"}, {"id": "i3b"}], "pages": 3})]
    )
    rig = Rig(tmp_path, [first, second])
    rig.seed()
    rig.agent.run()
    rec = rig.site()
    assert rec.run_status is RunStatus.COMPLETED and rec.attempt == 2 and rec.checkpoint is None
    assert rig.crawls[0].job["checkpoint"] is None
    resumed = rig.crawls[1].job["checkpoint"]
    assert resumed["next"] == "p3" and resumed["pages"] == 2
    assert [i["id"] for i in resumed["items"]] == ["i1a", "i1b", "i2a", "i2b"]
    body = json.loads(rig.results.get("s1/20261121/result.json"))
    assert [i["id"] for i in body["items"]] == ["i1a", "i1b", "i2a", "i2b", "i3a", "i3b"]


def test_each_attempt_records_what_it_found_and_the_completed_site_its_result(tmp_path):
    """Attempt 1 fetched 2 pages and saved 4 items before it hung; attempt 2 resumed at page 3: 1 page, 2 items
    of its own. The site's result holds 6 items from 3 pages."""
    start = [(0.5, {"event": "session", "id": "sess-1"}), (0.6, status("RUNNING"))]
    first = (
        start
        + page_with_checkpoint(1, 1, "p2")
        + page_with_checkpoint(2, 2, "p3")
        + [(3.0, status("URL_CALL", "http://x.test/?page=3", 2)), HANG]
    )
    result = {"event": "result", "items": [{"id": "i3a"}, {"id": "i3b"}], "pages": 3, "collisions": 2}
    result.update(skipped=1, collided=["i3a"], first_skipped='{"title": "no link"}')
    second = start + page_with_checkpoint(3, 1, None) + [(2.0, result)]
    rig = Rig(tmp_path, [first, second])
    rig.seed()
    rig.agent.run()
    rec = rig.site()
    assert (rec.items, rec.pages) == (6, 3)
    hung, done = rec.attempts
    assert hung.outcome == "hang" and hung.counts == Counts(items=4, pages=2)
    assert done.outcome == "completed" and done.counts == Counts(2, 1, 2, 1, ("i3a",))


def test_a_checkpoint_is_written_with_each_page_and_counts_as_a_heartbeat(tmp_path):
    start = [(0.5, {"event": "session", "id": "sess-1"}), (0.6, status("RUNNING"))]
    pages = sum((page_with_checkpoint(p, float(p), f"p{p + 1}") for p in range(1, 4)), [])
    script = start + pages + [(3.0 + 0.6, status("URL_CALL", "http://x.test/?page=4", 3)), HANG]
    rest = start + [(1.0, {"event": "result", "items": [], "pages": 3})]
    rig = spied(Rig(tmp_path, [script, rest], save_every=SaveEvery(pages=1)))
    rig.seed()
    rig.agent.run()
    saved = [new.checkpoint for old, new in rig.table_spy.named("write") if new.checkpoint != old.checkpoint]
    assert [c["pages"] for c in saved if c] == [1, 2, 3]  # one write per page, before the hang
    assert rig.site().attempts[0].outcome == "hang"


def test_an_incremental_site_gets_its_mark_and_moves_it_to_the_newest_items(tmp_path):
    rig = Rig(tmp_path, [pages_script(2)])
    rec = ops.new_site(RUN, "s1", SiteSpec("http://x.test/", incremental=True), None, mark=("old-1", "old-2"))
    rig.table.create_site(rec)
    ops.send_next(rig.table, rig.queue, rec)
    rig.agent.run()
    assert rig.crawls[0].job["mark"] == ["old-1", "old-2"]
    assert rig.table.get_marks(["s1"]) == {"s1": ("i0", "i1", "old-1", "old-2")}


def test_an_incremental_crawl_that_found_nothing_new_keeps_the_mark(tmp_path):
    nothing = [
        (0.5, {"event": "session", "id": "sess-1"}),
        (0.6, status("RUNNING")),
        (1.0, {"event": "result", "items": [], "pages": 1}),
    ]
    rig = Rig(tmp_path, [nothing])
    rig.table.put_mark("s1", ("old-1",), "yesterday", 1.0)
    rec = ops.new_site(RUN, "s1", SiteSpec("http://x.test/", incremental=True), None, mark=("old-1",))
    rig.table.create_site(rec)
    ops.send_next(rig.table, rig.queue, rec)
    rig.agent.run()
    assert rig.site().run_status is RunStatus.COMPLETED
    assert rig.table.get_marks(["s1"]) == {"s1": ("old-1",)}
    assert rig.table.items[("#sites", "s1")]["run"] == "yesterday"


def test_a_site_without_incremental_gets_no_mark_and_writes_none(tmp_path):
    rig = Rig(tmp_path, [pages_script(1)])
    rig.seed()
    rig.agent.run()
    assert rig.crawls[0].job["mark"] is None and rig.table.get_marks(["s1"]) == {}


# --- what the node writes is bounded, and a write the table refuses ends the attempt, not the node ---------------


def refusing(write, refuse):
    """The fake table's `write` seam, raising what DynamoDB answers to an invalid item (ValidationException, e.g.
    one over 400 KB) for every write `refuse(old, new)` picks: the fault is injected here, the rest is the fake."""

    def write_or_refuse(old, new):
        if refuse(old, new):
            raise ClientError(
                {
                    "Error": {
                        "Code": "ValidationException",
                        "Message": "Item size has exceeded the maximum allowed size",
                    }
                },
                "UpdateItem",
            )
        return write(old, new)

    return write_or_refuse


def test_a_checkpoint_the_table_refuses_ends_the_attempt_as_an_error_and_the_node_goes_on(tmp_path):
    start = [(0.5, {"event": "session", "id": "sess-1"}), (0.6, status("RUNNING"))]
    first = start + page_with_checkpoint(1, 1, "p2") + [HANG]
    rig = Rig(tmp_path, [first, pages_script(1), pages_script(2)])
    rig.table.write = refusing(
        rig.table.write, lambda old, new: new.checkpoint is not None and new.checkpoint != old.checkpoint
    )
    rig.seed("s1")
    rig.seed("s2")
    assert rig.agent.run() == 0  # the agent did not crash: it went on and idled out
    s1 = rig.site("s1")
    first_attempt = s1.attempts[0]
    assert first_attempt.outcome == "error"
    assert rig.crawls[0].killed and rig.cleanups[0] == ("s1", "sess-1", True)  # its crawler and browser ended
    assert s1.run_status is RunStatus.COMPLETED and s1.attempt == 2  # retried like any error
    assert rig.site("s2").run_status is RunStatus.COMPLETED  # and the node took its next site
    assert rig.agent.stats.errors == {"error": 1} and rig.agent.stats.completed == 2
    assert rig.queue.messages == []


def test_a_refused_write_leaves_its_reason_in_the_error_text(tmp_path):
    start = [(0.5, {"event": "session", "id": "sess-1"}), (0.6, status("RUNNING"))]
    rig = Rig(tmp_path, [start + page_with_checkpoint(1, 1, "p2") + [HANG]], max_attempts=1)
    rig.table.write = refusing(rig.table.write, lambda old, new: new.checkpoint is not None)
    rig.seed()
    assert rig.agent.run() == 0
    rec = rig.site()
    assert (rec.run_status, rec.failure_reason) == (RunStatus.FAILED, "error")
    assert "refused" in rec.error and "ValidationException" in rec.error and "save_checkpoint" in rec.error


def test_a_result_the_table_refuses_ends_the_attempt_as_an_error(tmp_path):
    rig = Rig(tmp_path, [pages_script(1)], max_attempts=1)
    rig.table.write = refusing(rig.table.write, lambda old, new: new.site_status is SiteStatus.SAVED)
    rig.seed()
    assert rig.agent.run() == 0
    rec = rig.site()
    assert (rec.run_status, rec.attempts[0].outcome) == (RunStatus.FAILED, "error")
    assert "saved" in rec.error and rig.agent.stats.completed == 0


def test_what_a_crawler_sends_is_cut_to_size_before_it_is_written(tmp_path):
    long_url = "http://x.test/?q=" + "u" * 10_000
    long_id = "i" * 5_000
    script = [
        (0.5, {"event": "session", "id": "sess-1"}),
        (0.6, status("RUNNING")),
        (1.0, status("URL_CALL", long_url, 0)),
        (1.5, {"event": "checkpoint", "next": "p2", "pages": 1, "items": [{"id": long_id}, {"id": "short"}]}),
        (2.0, {"event": "error", "message": "E" * 100_000}),
    ]
    rig = spied(Rig(tmp_path, [script], max_attempts=1))
    rig.seed()
    rig.agent.run()
    written = [new for _, new in rig.table_spy.named("write")]
    assert max(len(r.url or "") for r in written) == URL_MAX_CHARS
    ckpt = rig.site().checkpoint
    assert ckpt["items"] == 2 and long_id not in json.dumps(ckpt)  # the record counts the items, its size bounded
    (part,) = [k for k in rig.results.keys("staging/local:i-1/s1/20261121/parts/")]
    assert [i["id"] for i in json.loads(rig.results.get(part))] == [long_id, "short"]  # kept whole in its part
    assert rig.site().error == "E" * ERROR_MAX_CHARS


def test_a_resumed_crawl_meeting_an_item_with_a_long_id_again_keeps_it_once_with_its_whole_id(tmp_path):
    long_id = "L" * 2_000
    start = [(0.5, {"event": "session", "id": "sess-1"}), (0.6, status("RUNNING"))]
    first = start + [
        (1.0, {"event": "checkpoint", "next": "p2", "pages": 1, "items": [{"id": long_id}]}),
        (1.1, status("URL_CALL", "http://x.test/?page=2", 1)),
        HANG,
    ]
    second = start + [(1.0, {"event": "result", "items": [{"id": long_id}, {"id": "b"}], "pages": 2})]
    rig = Rig(tmp_path, [first, second])
    rig.seed()
    rig.agent.run()
    assert rig.crawls[1].job["checkpoint"]["items"][0]["id"] == long_id  # parts keep ids whole
    rig.site()  # the hub makes the staged result the site's
    body = json.loads(rig.results.get("s1/20261121/result.json"))
    assert [i["id"] for i in body["items"]] == [long_id, "b"]


def test_a_mark_keeps_no_id_longer_than_the_cap(tmp_path):
    long_id = "M" * (ITEM_ID_MAX_CHARS + 1)
    script = [
        (0.5, {"event": "session", "id": "sess-1"}),
        (0.6, status("RUNNING")),
        (1.0, {"event": "result", "items": [{"id": long_id}, {"id": "ok"}], "pages": 1}),
    ]
    rig = Rig(tmp_path, [script])
    rec = ops.new_site(RUN, "s1", SiteSpec("http://x.test/", incremental=True), None, mark=("old",))
    rig.table.create_site(rec)
    ops.send_next(rig.table, rig.queue, rec)
    rig.agent.run()
    assert rig.table.get_marks(["s1"]) == {"s1": ("ok", "old")}  # the long id dropped, not cut


# --- the data contract ----------------------------------------------------------------------------------------------


def seed_with(rig: Rig, expect: dict, baseline: int | None = None) -> None:
    spec = SiteSpec("http://x.test/", expect=expect, baseline_items=baseline)
    rec = ops.new_site(RUN, "s1", spec, None)
    rig.table.create_site(rec)
    ops.send_next(rig.table, rig.queue, rec)


def test_a_result_that_breaks_its_contract_is_quarantined_and_the_site_fails_at_once(tmp_path):
    rig = Rig(tmp_path, [pages_script(2), pages_script(2)])  # a second crawl would be there if it were retried
    seed_with(rig, {"min_items": 5, "fields": {"required": ["price"]}})
    rig.agent.run()
    rec = rig.site()
    assert rec.run_status is RunStatus.FAILED and rec.failure_reason == "contract"
    assert rec.attempt == 1 and len(rig.crawls) == 1 and rig.queue.depth().visible == 0
    assert "min_items: 2 items < 5" in rec.error and "fields: item 0" in rec.error and "'price'" in rec.error
    assert rec.attempts[0].outcome == "contract" and rec.attempts[0].counts.items == 2
    kept = "staging/local:i-1/s1/20261121/quarantine/1.json"  # under the node's own prefix; no result anywhere
    assert rig.results.keys("s1/") == [] and rig.results.keys("staging/") == [kept]
    assert len(json.loads(rig.results.get(kept))["items"]) == 2
    assert rec.result_key is None and rec.items is None


def test_a_result_that_keeps_its_contract_is_the_result(tmp_path):
    rig = Rig(tmp_path, [pages_script(2)])
    seed_with(rig, {"min_items": 2, "min_pages": 2, "max_drop": 0.5, "fields": {"required": ["id"]}}, baseline=4)
    rig.agent.run()
    rec = rig.site()
    assert rec.run_status is RunStatus.COMPLETED and rec.items == 2
    assert rig.results.keys("s1/") == ["s1/20261121/result.json"]


def test_max_drop_is_judged_against_the_baseline_the_record_carries(tmp_path):
    rig = Rig(tmp_path, [pages_script(2)])
    seed_with(rig, {"max_drop": 0.5}, baseline=5)
    rig.agent.run()
    rec = rig.site()
    assert rec.failure_reason == "contract" and "max_drop: 2 items after 5" in rec.error
