"""The run report as a person reads it: the page is parsed (it is well-formed XML) and checked by what it shows."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from cli.report import timeline
from cli.report.page import find_previous, fmt_duration, fmt_usd, render_report, write_report

T = 1763700000.0  # 2025-11-21T04:40:00Z
SVG = "{http://www.w3.org/2000/svg}"
EVIL = "<script>alert('x')</script> & \"quoted\""


def attempt(node: str, start: float, end: float | None, outcome: str | None, kill: str | None = None) -> dict:
    a = {"instance_id": node, "start": T + start, "end": None if end is None else T + end, "outcome": outcome}
    return {**a, "kill_path": kill} if kill else a


def site(status: str, attempts: list[dict], reason: str | None = None, error: str | None = None) -> dict:
    return {
        "run_status": status,
        "site_status": status,
        "attemptCount": len(attempts),
        "failure_reason": reason,
        "result_key": None,
        "error": error,
        "instance_id": attempts[-1]["instance_id"] if attempts else None,
        "lastUpdateEpoch": 0,
        "attempts": attempts,
    }


def make_summary() -> dict[str, Any]:
    """Four sites on two nodes, eight attempts: a hang killed via ssm, a lost one terminated, an unfinished one."""
    return {
        "run_id": "2026-11-21",
        "started_at": T,
        "finished_at": T + 1000,
        "finish_reason": "done",
        "counts": {"QUEUED": 0, "RUN": 1, "COMPLETED": 2, "FAILED": 1},
        "nodes": {"launched": 2, "left_running": 0},
        "instances": {
            "i-a": {"type": "t3.medium", "market": "spot", "started_at": T + 10, "ended_at": T + 910},
            "i-b": {"type": "t3.micro", "market": "on-demand", "started_at": T + 15, "ended_at": T + 615},
        },
        "sites": {
            "alpha": site("COMPLETED", [attempt("i-a", 20, 80, "hang", "ssm"), attempt("i-b", 90, 150, "completed")]),
            "beta": site(
                "FAILED",
                [
                    attempt("i-a", 100, 130, "error"),
                    attempt("i-b", 160, 200, "error"),
                    attempt("i-a", 210, 260, "error"),
                ],
                reason="error",
                error=EVIL,
            ),
            "delta": site(
                "COMPLETED", [attempt("i-a", 300, 400, "lost", "terminate"), attempt("i-a", 410, 500, "completed")]
            ),
            "gamma": site("RUN", [attempt("i-b", 300, None, None)]),
        },
    }


def parse(html: str) -> ET.Element:
    return ET.fromstring(html)


def text(el: ET.Element) -> str:
    return " ".join("".join(el.itertext()).split())


def node_labels(doc: ET.Element) -> list[tuple[str, str]]:
    """(label, tooltip) of each timeline row."""
    found = [t for t in doc.iter(f"{SVG}text") if t.get("class") == "label" and t.find(f"{SVG}title") is not None]
    return [(t.find(f"{SVG}title").tail, t.find(f"{SVG}title").text) for t in found]


def bars(doc: ET.Element) -> list[ET.Element]:
    return [r for r in doc.iter(f"{SVG}rect") if r.get("class", "").split()[0] == "bar"]


def bar_titled(doc: ET.Element, prefix: str) -> ET.Element:
    (found,) = [b for b in bars(doc) if b.find(f"{SVG}title").text.startswith(prefix)]
    return found


def rows(doc: ET.Element, section: str) -> list[list[str]]:
    sec = doc.find(f".//section[@id='{section}']")
    return [[text(c) for c in tr] for tr in sec.iter("tr")]


def facts(doc: ET.Element) -> dict[str, str]:
    out = {}
    for tr in doc.iter("tr"):
        cells = list(tr)
        for th, td in zip(cells[::2], cells[1::2], strict=False):
            if th.tag == "th" and td.tag == "td":
                out[text(th)] = text(td)
    return out


@pytest.fixture
def summary() -> dict[str, Any]:
    return make_summary()


def render(summary: dict, **kw: Any) -> str:
    return render_report(summary, generated_at=T + 2000, **kw)


def test_human_formats():
    assert [fmt_duration(s) for s in (0, 42, 60, 119, 185, 3720, None)] == [
        "0 s",
        "42 s",
        "60 s",
        "119 s",
        "3 m 05 s",
        "1 h 02 m",
        "-",
    ]
    assert (fmt_usd(0.0123), fmt_usd(0.25), fmt_usd(12.345)) == ("$0.0123", "$0.2500", "$12.35")


def test_the_page_is_one_self_contained_document(summary):
    html = render(summary)
    doc = parse(html)
    assert html.startswith("<!DOCTYPE html>")
    assert not [el.tag for el in doc.iter() if el.tag in ("script", "link", "img", "iframe")]
    assert not [el.tag for el in doc.iter() if el.get("src") or el.get("href")]
    assert doc.find(".//head/style") is not None and doc.find(f".//{SVG}svg") is not None


def test_header_shows_the_run_at_a_glance(summary):
    doc = parse(render(summary))
    assert text(doc.find(".//h1")) == "Run 2026-11-21"
    f = facts(doc)
    assert (f["started"], f["finished"]) == ("2025-11-21T04:40:00Z", "2025-11-21T04:56:40Z")
    assert (f["duration"], f["finish reason"]) == ("16 m 40 s", "done")
    assert f["sites"] == "2 completed, 1 failed, 1 other"
    assert f["nodes"] == "2 launched, 0 left running"


def test_fleet_figures(summary):
    f = facts(parse(render(summary)))
    # durations: 60 60 | 30 40 50 | 100 90 | 700 (unfinished, to the run's end)
    assert f["attempts"] == "8 (4 retries)"
    assert f["attempt duration"] == "median 60 s, p95 11 m 40 s"
    assert f["kills by path"] == "ssm 1, terminate 1"
    assert f["attempts by outcome"] == "error 3, completed 2, hang 1, lost 1, unfinished 1"


def test_one_bar_per_attempt_positioned_by_time_with_a_title(summary):
    html = render(summary)
    doc = parse(html)
    assert html.count('<rect class="bar') == len(bars(doc)) == 8
    hang = bar_titled(doc, "site alpha attempt 1")
    assert hang.find(f"{SVG}title").text == "site alpha attempt 1: hang, killed via ssm, 60 s"
    assert hang.get("class") == "bar outcome-hang"
    plot = timeline.WIDTH - timeline.LABEL_W - timeline.RIGHT_PAD
    assert float(hang.get("x")) == pytest.approx(timeline.LABEL_W + 0.02 * plot, abs=0.1)
    assert float(hang.get("width")) == pytest.approx(0.06 * plot, abs=0.2)
    assert bar_titled(doc, "site alpha attempt 2").get("class") == "bar outcome-completed"


def test_one_row_per_node_labelled_with_id_and_type(summary):
    doc = parse(render(summary))
    assert node_labels(doc) == [
        ("i-a t3.medium", "node i-a (t3.medium, spot): 5 attempts, up 15 m 00 s"),
        ("i-b t3.micro", "node i-b (t3.micro, on-demand): 3 attempts, up 10 m 00 s"),
    ]
    ticks = [text(t) for t in doc.iter(f"{SVG}text") if t.get("class") == "tick"]
    assert len(ticks) >= 3 and all(len(t) == 5 and t[2] == ":" for t in ticks)  # HH:MM


def test_killed_attempts_are_marked_at_the_end_of_their_bar(summary):
    doc = parse(render(summary))
    kills = [p for p in doc.iter(f"{SVG}path") if p.get("class") == "kill"]
    assert [k.find(f"{SVG}title").text for k in kills] == ["killed via ssm", "killed via terminate"]
    hang = bar_titled(doc, "site alpha attempt 1")
    end = float(hang.get("x")) + float(hang.get("width"))
    assert kills[0].get("d").startswith(f"M{round(end - timeline.KILL_R, 1)},")


def test_an_unfinished_attempt_is_drawn_to_the_run_end(summary):
    doc = parse(render(summary))
    bar = bar_titled(doc, "site gamma attempt 1")
    assert bar.get("class") == "bar outcome-unfinished open"
    assert float(bar.get("x")) + float(bar.get("width")) == pytest.approx(timeline.WIDTH - timeline.RIGHT_PAD, abs=0.2)
    assert bar.find(f"{SVG}title").text == "site gamma attempt 1: unfinished, 11 m 40 s, no end recorded"


def test_text_from_the_summary_is_escaped(summary):
    summary["run_id"] = "<b>run</b>"
    summary["sites"]["beta"]["attempts"][0]["instance_id"] = "<i>node</i>"
    html = render(summary)
    assert "<script>" not in html and "<b>run" not in html and "<i>node" not in html
    doc = parse(html)
    assert text(doc.find(".//h1")) == "Run <b>run</b>"
    beta = next(r for r in rows(doc, "sites") if r[0] == "beta")
    assert beta[7] == " ".join(f"error: {EVIL}".split())


def test_site_table_lists_failed_sites_first_then_by_name(summary):
    table = rows(parse(render(summary)), "sites")
    assert table[0] == [
        "site",
        "status",
        "attempts",
        "items",
        "pages",
        "final attempt",
        "all attempts",
        "failure reason / error",
        "items left out",
        "node",
        "evidence",
    ]
    assert [r[0] for r in table[1:]] == ["beta", "alpha", "delta", "gamma"]
    # a summary of an older gridfleet counts no items: "-", never 0
    assert table[2] == ["alpha", "COMPLETED", "2", "-", "-", "60 s", "2 m 00 s", "", "", "i-b", ""]
    assert table[3][5:7] == ["90 s", "3 m 10 s"]


def test_cost_is_node_time_times_the_hourly_price(summary):
    doc = parse(render(summary, prices={"t3.medium": 0.0416}))
    table = rows(doc, "cost")
    assert table[1] == ["t3.medium", "1", "900", "0.25", "$0.0416/h", "$0.0104"]
    assert table[2] == ["t3.micro", "1", "600", "0.17", "no price for t3.micro"]  # node time shown anyway
    assert table[3] == ["total", "", "1,500", "", "", "$0.0104"]
    assert "The total leaves out t3.micro" in text(doc.find(".//section[@id='cost']"))


def test_cost_total_with_every_price(summary):
    doc = parse(render(summary, prices={"t3.medium": 0.0416, "t3.micro": 0.0104}))
    assert text(doc.find(".//th[@id='cost-total']")) == "$0.0121"  # 0.0104 + 600 s at $0.0104/h
    assert "leaves out" not in text(doc.find(".//section[@id='cost']"))


def test_without_prices_every_type_says_so(summary):
    section = text(parse(render(summary)).find(".//section[@id='cost']"))
    assert "No prices were given" in section
    assert "no price for t3.medium" in section and "no price for t3.micro" in section


def test_without_instances_a_node_lives_for_the_span_of_its_attempts(summary):
    del summary["instances"]
    summary["sites"]["gamma"]["attempts"] = [attempt("i-c", 300, 420, "spot")]
    doc = parse(render(summary, prices={"t3.medium": 1.0}))
    # i-a: 20..500, i-b: 90..200, i-c: 300..420
    assert rows(doc, "cost")[1] == ["unknown", "3", "710", "0.20", "no price for unknown"]
    assert node_labels(doc)[0] == ("i-a unknown", "node i-a (unknown): 5 attempts, up 8 m 00 s")


def test_an_instance_without_times_falls_back_to_its_attempts(summary):
    summary["instances"]["i-b"] = {"market": "spot"}
    summary["instances"]["i-idle"] = {"type": "t3.micro", "started_at": T + 800}  # no attempt, no end
    table = rows(parse(render(summary)), "cost")
    assert table[2][:3] == ["t3.micro", "1", "200"]  # to the run's end
    assert table[3][:3] == ["unknown", "1", "910"]  # 90 .. the run's end (gamma never ended)


def test_the_timeline_caps_its_rows_and_says_how_many_were_left_out():
    s = make_summary()
    s["instances"] = {}
    s["sites"] = {f"s{i:03d}": site("COMPLETED", [attempt(f"i-{i:03d}", i, i + 5, "completed")]) for i in range(55)}
    html = render(s)
    doc = parse(html)
    assert len(bars(doc)) == timeline.MAX_ROWS
    assert text(doc.find(".//p[@id='hidden-nodes']")) == "15 more nodes (15 attempts) are not drawn."


def test_no_previous_run(summary):
    assert "no earlier run to compare with" in text(parse(render(summary)).find(".//section[@id='diff']"))


def previous_of(summary: dict) -> dict:
    prev = copy.deepcopy(summary)
    prev.update(run_id="2026-11-20", started_at=T - 86400, finished_at=T - 86400 + 1000)
    for entry in prev["sites"].values():
        for a in entry["attempts"]:
            a["start"] -= 86400
            a["end"] = None if a["end"] is None else a["end"] - 86400
    sites = prev["sites"]
    sites["alpha"]["run_status"] = "FAILED"  # fixed now; final 60 s vs 40 s: not a big change
    sites["alpha"]["attempts"][-1].update(end=sites["alpha"]["attempts"][-1]["start"] + 40, outcome="error")
    sites["beta"]["run_status"] = "COMPLETED"  # failing now; final 50 s vs 10 s: a big change
    sites["beta"]["attempts"][-1].update(end=sites["beta"]["attempts"][-1]["start"] + 10, outcome="completed")
    sites["gamma"]["attempts"][-1].update(end=sites["gamma"]["attempts"][-1]["start"] + 600)  # +100 s, +17%
    del sites["delta"]
    sites["epsilon"] = site("COMPLETED", [attempt("i-z", -86000, -85900, "completed")])
    return prev


def test_differences_from_the_previous_run(summary):
    doc = parse(render(summary, previous=previous_of(summary)))
    section = doc.find(".//section[@id='diff']")
    assert "Compared with run 2026-11-20 (started 2025-11-20T04:40:00Z)" in text(section)

    def listed(key: str) -> list[str]:
        ul = section.find(f".//ul[@id='{key}']")
        return [] if ul is None else [text(li) for li in ul]

    assert listed("newly-failing") == ["beta"]
    assert listed("newly-fixed") == ["alpha"]
    assert listed("added") == ["delta"]
    assert listed("removed") == ["epsilon"]
    assert rows(doc, "diff") == [["site", "before", "now", "change"], ["beta", "10 s", "50 s", "+400%"]]


def write_summary(runs: Path, summary: dict) -> Path:
    path = runs / summary["run_id"] / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(summary))
    return path


def test_find_previous_takes_the_latest_earlier_run_and_skips_broken_ones(tmp_path, summary):
    for run_id, offset in [("two-days-ago", -2 * 86400), ("yesterday", -86400), ("tomorrow", 86400)]:
        write_summary(tmp_path, {**summary, "run_id": run_id, "started_at": T + offset})
    write_summary(tmp_path, summary)  # this run itself
    for name, body in [
        ("broken", b'{"run_id": "broken", "started_at": '),
        ("binary", b"\xff\xfe\x00"),
        ("not-a-summary", b'{"run_id": "x", "started_at": 1.0}'),
    ]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_bytes(body)
    (tmp_path / "empty").mkdir()
    assert find_previous(tmp_path, summary)["run_id"] == "yesterday"
    assert find_previous(tmp_path, {**summary, "started_at": T - 2 * 86400}) is None


def test_write_report_compares_with_the_run_before(tmp_path, summary):
    write_summary(tmp_path / "runs", previous_of(summary))
    path = write_summary(tmp_path / "runs", summary)
    out = write_report(path, tmp_path / "out" / "report.html", prices={"t3.medium": 0.0416})
    assert out == tmp_path / "out" / "report.html"
    doc = parse(out.read_text(encoding="utf-8"))
    assert [text(li) for li in doc.find(".//ul[@id='newly-failing']")] == ["beta"]
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]


# --- item counts ----------------------------------------------------------------------------------


def counted(summary: dict[str, Any], site_name: str, items: int | None, pages: int, **left: Any) -> None:
    """Give a site of `summary` the counts a summary of this gridfleet holds (its last attempt's, and the site's)."""
    entry = summary["sites"][site_name]
    entry.update(items=items, pages=pages)
    entry["attempts"][-1].update({"items": items or 0, "pages": pages, "collisions": 0, "skipped": 0, **left})


def test_sites_show_their_items_pages_and_what_their_attempts_left_out(summary):
    counted(summary, "alpha", 40, 4, collisions=7, collided=["https://a.test/p#1", "https://a.test/p#2"])
    counted(summary, "delta", 3, 1, skipped=2)
    doc = parse(render(summary))
    table = {r[0]: r for r in rows(doc, "sites")}
    assert table["alpha"][3:5] == ["40", "4"]
    assert table["alpha"][8] == "7 collisions (https://a.test/p#1, https://a.test/p#2, ...)"
    assert table["delta"][3:5] == ["3", "1"] and table["delta"][8] == "2 without an id"
    assert table["beta"][3:5] == ["-", "-"]  # FAILED: no result, so no items
    assert facts(doc)["items"] == "43 from 5 pages (COMPLETED sites' results); 5 pages fetched, retries included"
    assert facts(doc)["items left out"] == "7 collisions (same id, other content), 2 without an id"
    bar = bar_titled(doc, "site alpha attempt 2")
    assert bar.find(f"{SVG}title").text == "site alpha attempt 2: completed, 60 s, 40 items from 4 pages"


def test_items_per_site_are_drawn_against_the_previous_run_and_big_drops_named(summary):
    before = previous_of(summary)
    before["sites"]["alpha"]["run_status"] = "COMPLETED"
    before["sites"]["delta"] = copy.deepcopy(summary["sites"]["delta"])
    counted(before, "alpha", 100, 5)
    counted(before, "delta", 10, 1)
    counted(summary, "alpha", 40, 4)
    counted(summary, "delta", 10, 1)
    doc = parse(render(summary, previous=before))
    chart = doc.find(f".//{SVG}svg[@class='items']")
    labels = [t.find(f"{SVG}title").tail for t in chart.iter(f"{SVG}text") if t.get("class") == "label"]
    assert labels[:2] == ["alpha", "delta"]  # the largest change first
    counts = [t.text for t in chart.iter(f"{SVG}text") if t.get("class") == "count"]
    assert counts[:4] == ["100", "40", "10", "10"]
    widths = [float(r.get("width")) for r in chart.iter(f"{SVG}rect") if r.get("class", "").startswith("items-")]
    assert widths[0] > widths[1] > 0 and widths[2] == widths[3]
    assert text(doc.find(".//p[@id='item-drops']")) == "Items fell by half or more: alpha"


def test_no_chart_against_a_run_whose_summary_counts_no_items(summary):
    counted(summary, "alpha", 40, 4)
    doc = parse(render(summary, previous=previous_of(summary)))
    assert doc.find(f".//{SVG}svg[@class='items']") is None
    assert "has no item counts to compare with" in text(doc.find(".//section[@id='diff']"))
