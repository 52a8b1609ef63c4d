"""Evidence of failed attempts: the capture stays in its time budget, keys and paths come only from checked ids,
what is kept is capped, the agent captures after the crawler is killed and before the browser is closed, the
export writes only what it can parse, and the report links a thumbnail."""

from __future__ import annotations

import base64
import json
import socket
import time

import pytest

from cli.report.data import evidence_links
from cli.report.page import render_report, write_report
from fleet import protocol
from fleet.grid_auth import GridSecret
from fleet.outputs.results import (
    EVIDENCE_FILES,
    EVIDENCE_TYPES,
    evidence_key,
    evidence_prefix,
    parse_evidence_key,
    result_key,
)
from fleet.outputs.summary import export
from fleet.record.state import Reason
from node import evidence
from node.evidence import Evidence, cap_console, cap_html, capture, png_of
from sim.memory import MemoryResults
from tests.helpers.fake_cdp import BusyGrid
from tests.helpers.fake_node import HANG, RUN, Rig, pages_script, status
from tests.unit.test_agent import hub_marks_before_each_beat

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16

# --- the capture's time budget --------------------------------------------------------------------------------------


def test_a_browser_that_never_answers_is_recorded_as_such_within_the_budget():
    # A fake at the WebDriver HTTP seam, for timing only: a socket that takes the connection and never answers, as
    # a Grid whose chromedriver is stuck in a hung navigation does. A real browser cannot be made to do this on cue.
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        started = time.monotonic()
        ev = capture(f"http://127.0.0.1:{port}", "sess-1", budget_s=0.4)
        took = time.monotonic() - started
    assert ev.answered is False and ev.screenshot is None and ev.html is None
    assert "no answer to url within 0.4 s" in ev.why
    assert 0.3 <= took < 1.5  # one HTTP timeout of the budget, and nothing asked after it
    files = ev.files({"site": "s1", "attempt": 1})
    assert list(files) == ["evidence.json"]
    record = json.loads(files["evidence.json"][0])
    assert (record["answered"], record["site"], record["files"]) == (False, "s1", [])


def test_a_spent_budget_asks_nothing():
    ticks = iter([0.0, 10.0, 10.0])  # the injected clock: the budget is gone before the first call
    ev = capture("http://127.0.0.1:9", "sess-1", budget_s=5, monotonic=lambda: next(ticks))
    assert ev.answered is False and ev.why == "the capture's time budget is spent"


@pytest.mark.parametrize("session_id", ["../status", "a/b", "x?y", "", "s" * 129])
def test_a_session_id_that_would_reshape_the_url_is_not_asked_for(session_id):
    ev = capture("http://127.0.0.1:9", session_id, budget_s=5, monotonic=lambda: 0.0)
    assert ev.answered is False and "is not a WebDriver session id" in ev.why


def test_a_grid_that_is_gone_is_recorded_at_once():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    ev = capture(f"http://127.0.0.1:{port}", "sess-1", budget_s=5)
    assert ev.answered is False and "url:" in ev.why and ev.elapsed_s < 2


def test_a_page_that_keeps_webdriver_busy_is_photographed_over_devtools_within_the_budget(monkeypatch):
    # WebDriver on the session never answers (chromedriver waits on a hung navigation); the browser's DevTools
    # endpoint, which the Grid proxies per session, still does. The budget and the first call's share are scaled
    # down by the same measure as the real ones (5 s, 2.5 s).
    monkeypatch.setattr(evidence, "FIRST_ANSWER_S", 0.3)
    secret = GridSecret.make()
    with BusyGrid(PNG) as grid:
        started = time.monotonic()
        ev = capture(grid.url, "sess-1", budget_s=0.6, secret=secret)
        took = time.monotonic() - started
    assert ev.answered is False and "no answer to url within 0.3 s" in (ev.why or "")
    assert 0.25 <= took < 0.6  # the first call's share of the budget, then DevTools at once
    assert (ev.screenshot, ev.screenshot_from, ev.url) == (PNG, "devtools", "http://site.test/hangs/2")
    assert grid.requests == ["GET /session/sess-1/url HTTP/1.1", "GET /session/sess-1/se/cdp HTTP/1.1"]
    assert grid.authorization == [secret.authorization] * 2
    assert [c["method"] for c in grid.cdp_calls] == [
        "Target.getTargets",
        "Target.attachToTarget",
        "Page.captureScreenshot",
    ]
    assert grid.cdp_calls[1]["params"] == {"targetId": "tab", "flatten": True}  # the page chromedriver drives
    assert grid.cdp_calls[2]["sessionId"] == "s-tab"
    files = ev.files({"site": "s1", "attempt": 1})
    record = json.loads(files["evidence.json"][0])
    assert (record["answered"], record["files"], record["screenshot_from"]) == (False, ["screenshot.png"], "devtools")
    assert files["screenshot.png"][0] == PNG


def test_a_devtools_endpoint_that_does_not_answer_either_costs_no_more_than_the_budget(monkeypatch):
    monkeypatch.setattr(evidence, "FIRST_ANSWER_S", 0.3)
    with BusyGrid(PNG, cdp=False) as grid:
        started = time.monotonic()
        ev = capture(grid.url, "sess-1", budget_s=0.6)
        took = time.monotonic() - started
    assert ev.answered is False and ev.screenshot is None and ev.screenshot_from is None
    assert 0.5 <= took < 1.2
    assert len(ev.truncated) == 1 and ev.truncated[0].startswith("screenshot over DevTools: se/cdp:"), ev.truncated
    with BusyGrid(b"not a png") as grid:
        ev = capture(grid.url, "sess-1", budget_s=0.6)
    assert ev.screenshot is None and ev.truncated == ["screenshot over DevTools: se/cdp: the screenshot is not a PNG"]


# --- what is kept -------------------------------------------------------------------------------------------------


def test_the_html_and_the_console_are_capped():
    assert cap_html("x" * 10, limit=4) == ("xxxx", True)
    assert cap_html("abc", limit=4) == ("abc", False)
    entries = [{"level": "SEVERE", "message": f"m{i}" + "y" * 5000, "timestamp": i} for i in range(250)]
    kept, cut = cap_console(entries)
    assert cut and len(kept) == evidence.CONSOLE_MAX_ENTRIES and kept[0]["timestamp"] == 50  # the last ones
    assert all(len(e["message"]) == evidence.CONSOLE_MESSAGE_MAX_CHARS for e in kept)
    assert cap_console("not a list") == ([], False)
    assert cap_console([1, {"message": "ok", "timestamp": "soon"}]) == (
        [{"level": "", "message": "ok", "timestamp": None}],
        False,
    )


def test_only_a_png_is_kept_as_the_screenshot():
    assert png_of(base64.b64encode(PNG).decode()) == PNG
    assert png_of(base64.b64encode(b"<svg/>").decode()) is None
    assert png_of("%%% not base64") is None and png_of(None) is None


def test_an_answered_capture_keeps_its_files_and_lists_them_in_its_record():
    ev = Evidence(True, url="http://x.test/", screenshot=PNG, html="<p>hi</p>", console=[{"message": "m"}])
    files = ev.files({"end": "error"})
    assert sorted(files) == sorted(EVIDENCE_FILES)
    record = json.loads(files["evidence.json"][0])
    assert record["url"] == "http://x.test/" and record["files"] == ["console.json", "page.html", "screenshot.png"]
    assert files["screenshot.png"] == (PNG, "image/png")


# --- keys ---------------------------------------------------------------------------------------------------------


def test_evidence_goes_beside_the_result_of_its_run():
    assert result_key("s1", "20261121") == "s1/20261121/result.json"
    assert evidence_key("s1", "20261121", "2026-11-21", 2, "page.html") == "s1/20261121/evidence/2/page.html"
    assert evidence_key("s1", "20261121", "demo-1", 1, "evidence.json") == "s1/20261121/demo-1/evidence/1/evidence.json"
    prefix = evidence_prefix("s1", "20261121", "demo-1")
    assert parse_evidence_key(prefix, prefix + "3/screenshot.png") == (3, "screenshot.png")


@pytest.mark.parametrize(
    "site, run_date, run_id, attempt, name",
    [
        ("../etc", "20261121", "r", 1, "page.html"),
        ("s1", "20261121", "a/b", 1, "page.html"),
        ("s1", "2026112", "r", 1, "page.html"),
        ("s1", "20261121", "r", 0, "page.html"),
        ("s1", "20261121", "r", True, "page.html"),
        ("s1", "20261121", "r", 1, "run.sh"),
        ("s1\n", "20261121", "r", 1, "page.html"),
    ],
)
def test_a_bad_id_attempt_or_file_never_becomes_a_key(site, run_date, run_id, attempt, name):
    with pytest.raises(ValueError):
        evidence_key(site, run_date, run_id, attempt, name)


@pytest.mark.parametrize("rest", ["0/page.html", "x/page.html", "1/../page.html", "1/run.sh", "1", "1/a/page.html"])
def test_a_listed_key_that_is_not_evidence_is_not_parsed(rest):
    assert parse_evidence_key("s1/20261121/evidence/", "s1/20261121/evidence/" + rest) is None


# --- the agent ------------------------------------------------------------------------------------------------------


class Captures:
    """The agent's capture seam: records when it was asked (the browser and Grid are the e2e tests')."""

    def __init__(self, rig: Rig, answered: bool = True):
        self.rig, self.answered, self.calls = rig, answered, []
        rig.agent.capture = self

    def __call__(self, session_id: str) -> Evidence:
        crawl = self.rig.crawls[-1]
        self.calls.append((session_id, crawl.killed, len(self.rig.cleanups)))
        if not self.answered:
            return Evidence(False, why="no answer to url within 5.0 s")
        return Evidence(True, url="http://x.test/?page=1", screenshot=PNG, html="<p>page 1</p>")


NODE = "staging/local:i-1/"  # what node i-1 writes is under its own prefix (a local node: no IAM role)


def record_of(rig: Rig, attempt: int, run_dir: str = "s1/20261121") -> dict:
    return json.loads(rig.results.get(f"{NODE}{run_dir}/evidence/{attempt}/evidence.json"))


def test_a_watchdog_hang_is_captured_after_the_kill_and_before_the_browser_is_closed(tmp_path):
    rig = Rig(tmp_path, [pages_script(1)[:3] + [HANG], pages_script(1)])
    seen = Captures(rig, answered=False)
    rig.seed()
    rig.agent.run()
    assert seen.calls == [("sess-1", True, 0)]  # crawler killed on time, browser not yet cleaned up
    record = record_of(rig, 1)
    assert (record["end"], record["answered"], record["attempt"]) == ("hang", False, 1)
    assert record["last_reported_url"] == "http://x.test/?page=1" and "no answer" in record["why"]
    assert not rig.results.exists(f"{NODE}s1/20261121/evidence/2/evidence.json")  # the completed attempt leaves none


def test_a_crawler_error_is_captured_with_its_page(tmp_path):
    err = [(0.5, {"event": "session", "id": "sess-9"}), (0.6, {"event": "error", "message": "HTTP 500 from x"})]
    rig = Rig(tmp_path, [err, pages_script(1)])
    seen = Captures(rig)
    rig.seed()
    rig.agent.run()
    assert [c[0] for c in seen.calls] == ["sess-9"]
    assert rig.results.get(f"{NODE}s1/20261121/evidence/1/screenshot.png") == PNG
    assert rig.results.get(f"{NODE}s1/20261121/evidence/1/page.html") == b"<p>page 1</p>"
    record = record_of(rig, 1)
    assert (record["end"], record["error"], record["url"]) == ("error", "HTTP 500 from x", "http://x.test/?page=1")


def test_a_hub_kill_is_captured_when_the_node_finds_itself_fenced(tmp_path):
    rig = Rig(tmp_path, [pages_script(1)[:3] + [HANG]], node_watchdog=False, hang_after_s=1000)
    Captures(rig)
    rig.seed()
    hub_marks_before_each_beat(rig, Reason.HANG)
    rig.agent.run()
    assert record_of(rig, 1)["end"] == "fenced"


def test_no_session_or_no_capture_keeps_nothing(tmp_path):
    no_session = [(0.5, status("RUNNING")), (0.6, {"event": "error", "message": "boom"})]
    rig = Rig(tmp_path, [no_session, pages_script(1)])
    seen = Captures(rig)
    rig.seed()
    rig.agent.run()
    assert seen.calls == [] and rig.results.keys(f"{NODE}s1/20261121/evidence/") == []


# --- the export and the report ----------------------------------------------------------------------------------


def test_the_export_writes_each_evidence_file_under_its_site_and_attempt(tmp_path):
    """Evidence is read from the prefix of the node that held the attempt, and stored again beside the result as
    the hub's copy (the report's links); what another node's prefix holds for the site is nobody's evidence."""
    rig = Rig(tmp_path, [pages_script(1)[:3] + [HANG], pages_script(1)])
    Captures(rig)
    rig.seed()
    rig.agent.run()
    results: MemoryResults = rig.results
    results.objects[f"{NODE}s1/20261121/evidence/1/notes.sh"] = b"x"  # not an evidence file: never exported
    results.objects[f"{NODE}s1/20261121/evidence/x/page.html"] = b"x"
    results.objects["staging/local:i-9/s1/20261121/evidence/1/page.html"] = b"forged"  # not the attempt's node
    summary = {"run_id": RUN, "run_date": "20261121", "sites": {}}
    export(tmp_path / "runs", summary, [rig.site()], results)
    out = tmp_path / "runs" / RUN / "evidence"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        "s1/1/console.json",
        "s1/1/evidence.json",
        "s1/1/page.html",
        "s1/1/screenshot.png",
    ]
    assert (out / "s1/1/screenshot.png").read_bytes() == PNG
    assert (out / "s1/1/page.html").read_bytes() == b"<p>page 1</p>"
    assert results.keys("s1/20261121/evidence/") == [f"s1/20261121/evidence/1/{n}" for n in sorted(EVIDENCE_TYPES)]


def test_the_report_links_a_thumbnail_of_each_failed_attempt(tmp_path):
    run = tmp_path / "runs" / RUN
    shot = run / "evidence" / "s1" / "2" / "screenshot.png"
    shot.parent.mkdir(parents=True)
    shot.write_bytes(PNG)
    (shot.parent / "evidence.json").write_text(json.dumps({"answered": True}))
    silent = run / "evidence" / "s1" / "1" / "evidence.json"
    silent.parent.mkdir(parents=True)
    silent.write_text(json.dumps({"answered": False}))
    (run / "evidence" / "not a site").mkdir()
    links = evidence_links(run / "evidence", run)
    assert links == {
        "s1": [
            {"attempt": 1, "shot": None, "href": "evidence/s1/1/evidence.json", "note": "no answer"},
            {
                "attempt": 2,
                "shot": "evidence/s1/2/screenshot.png",
                "href": "evidence/s1/2/screenshot.png",
                "note": "screenshot",
            },
        ]
    }
    summary = {"run_id": RUN, "sites": {"s1": {"run_status": "FAILED", "attempts": []}}}
    html = render_report(summary, generated_at=0, evidence=links)
    assert '<img class="thumb" src="evidence/s1/2/screenshot.png" alt="attempt 2"/>' in html
    assert '<a class="evidence" href="evidence/s1/1/evidence.json"' in html
    (run / "summary.json").write_text(json.dumps(summary))
    elsewhere = write_report(run / "summary.json", tmp_path / "out" / "report.html", previous={})
    assert 'src="../runs/2026-11-21/evidence/s1/2/screenshot.png"' in elsewhere.read_text()  # relative to the page


def test_the_capture_budget_is_small_and_every_file_has_a_type():
    assert evidence.CAPTURE_BUDGET_S <= 5 and set(evidence.CONTENT_TYPES) == set(EVIDENCE_FILES)
    assert evidence.FIRST_ANSWER_S == evidence.CAPTURE_BUDGET_S / 2  # the rest is DevTools' when WebDriver is busy
    # the node's kill of a hang, evidence included, reaches the table before the hub's backup kill would fire: the
    # budget leaves the kill, the browser's end and the writes more than 5 s
    assert evidence.CAPTURE_BUDGET_S + 5 < protocol.NODE_HANG_END_S
