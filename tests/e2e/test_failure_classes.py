"""Failures by class, end to end: two runs on one stack of the embedded default, real Grid and Chromium.

Run `a`: a 404 fails at once; a 403 and a bot-check page served with 200 are `blocked`, never counted as pages,
retried after their backoff (left to the other node first), then FAILED; a start URL robots.txt disallows fails at
once; a page with no items breaks `min_items` and is quarantined; a site that will shrink crawls whole. Run `b`:
that site answers a fifth of its items, breaking `max_drop` against run `a`. The summary and the report count the failed
attempts by class. No fault is injected: no attempt is lost, none is a spot.
"""

from __future__ import annotations

import json

import pytest

from fleet.protocol import AVOID_RECEIVES
from tests.e2e.conftest import attempts

pytestmark = pytest.mark.e2e

CONFIG = """\
run:
  max_attempts: 3
  hang_after_s: 10
  heartbeat_timeout_s: 15
  watch_interval_s: 1
  deadline_s: 300
  retry: {{blocked: {{backoff_s: 1}}}}
fleet: {{max_nodes: 2, min_nodes: 2, idle_exit_s: 30}}  # both nodes run and stay: a blocked retry has another
hub: {{port: 0}}
sites:
  - {{id: gone, start_url: "{{demo}}/s/gone/?pages=2&status=404"}}
  - {{id: walled, start_url: "{{demo}}/s/walled/?pages=2&status=403"}}
  - {{id: checked, start_url: "{{demo}}/s/checked/?pages=2&challenge=1"}}
  - {{id: robots-denied, start_url: "{{demo}}/s/robots-denied/?pages=2"}}
  - {{id: thin, start_url: "{{demo}}/s/thin/?pages=2&items=0", expect: {{min_items: 1}}}}
  - {{id: shrinks, start_url: "{{demo}}/s/shrinks/?pages=2&items={items}", expect: {{max_drop: 0.5}}}}
"""


def failed(s: dict, site: str) -> tuple[str, str | None, int | None, int]:
    e = s["sites"][site]
    return e["run_status"], e["failure_reason"], e["http_status"], len(attempts(s, site))


def left_to_others(gf, run: str, node: str, site: str, attempt: int) -> list[int]:
    """The receive counts at which `node` left `site`'s `attempt` to other nodes, from its log."""
    lines = (gf.cwd / "runs" / run / "nodes" / node / "node.log").read_text().splitlines()
    said = [json.loads(line) for line in lines if line.startswith("{") and '"left-to-others"' in line]
    return sorted(e["receives"] for e in said if e.get("site") == site and e.get("attempt") == attempt)


def test_each_failure_ends_by_its_class_and_a_shrunk_site_breaks_max_drop_on_the_next_run(gf):
    assert gf.run("local", "up", timeout=120).returncode == 0
    cfg = gf.write_config("a.yaml", CONFIG.format(items=10))
    p = gf.run("run", "--local", "--config", str(cfg), "--run-id", "a", timeout=300)
    assert p.returncode == 3, p.stdout[-3000:] + p.stderr[-3000:]  # finished, some sites FAILED
    s = gf.summary("a")

    assert failed(s, "gone") == ("FAILED", "error", 404, 1)
    assert s["sites"]["gone"]["failure_class"] == "http_4xx"
    for site in ("walled", "checked"):
        assert failed(s, site)[:2] == ("FAILED", "error") and len(attempts(s, site)) == 3, attempts(s, site)
        assert s["sites"][site]["failure_class"] == "blocked"
        assert all(a["pages"] == 0 for a in attempts(s, site))  # a blocked page is never a crawled page
        # A retry leaves the node it was blocked on to the other for AVOID_RECEIVES receives, then takes it itself
        # (on a busy machine the other may be crawling all that while): each retry either moved, or its node's log
        # shows it left the message to others first.
        tried = attempts(s, site)
        for n, (before, retry) in enumerate(zip(tried, tried[1:], strict=False), start=2):
            if retry["instance_id"] == before["instance_id"]:
                left = left_to_others(gf, "a", retry["instance_id"], site, n)
                assert left and max(left) < AVOID_RECEIVES, (site, retry, left)
        gaps = [b["start"] - a["end"] for a, b in zip(attempts(s, site), attempts(s, site)[1:], strict=False)]
        assert all(g >= 1 for g in gaps), gaps  # each waited out its backoff
    assert s["sites"]["walled"]["http_status"] == 403 and s["sites"]["checked"]["http_status"] == 200
    assert failed(s, "robots-denied") == ("FAILED", "robots", None, 1)
    assert failed(s, "thin") == ("FAILED", "contract", None, 1) and "min_items" in s["sites"]["thin"]["error"]
    assert s["sites"]["shrinks"]["run_status"] == "COMPLETED" and s["sites"]["shrinks"]["items"] == 20
    assert s["failures"] == {
        "blocked 200": 3,
        "blocked 403": 3,
        "contract": 1,
        "http_4xx 404": 1,
        "robots": 1,
    }
    outcomes = {a["outcome"] for e in s["sites"].values() for a in e["attempts"]}
    assert not outcomes & {"lost", "spot"} and s["check"]["false_losses"] == 0
    report = (gf.cwd / "runs" / "a" / "report.html").read_text()
    assert ">blocked 403<" in report and ">http_4xx 404<" in report

    cfg = gf.write_config("b.yaml", CONFIG.format(items=2))
    p = gf.run("run", "--local", "--config", str(cfg), "--run-id", "b", timeout=300)
    assert p.returncode == 3, p.stdout[-3000:] + p.stderr[-3000:]
    s = gf.summary("b")
    assert failed(s, "shrinks") == ("FAILED", "contract", None, 1)
    assert "max_drop" in s["sites"]["shrinks"]["error"], s["sites"]["shrinks"]["error"]
