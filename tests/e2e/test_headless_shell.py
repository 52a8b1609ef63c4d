"""A run whose `browser.chromium` is Chrome's headless shell: the Grid node's stereotype and the crawls' capabilities
agree on the browserName `chrome-headless-shell` through the real Grid, and one node crawls two sites in a row
(the second starts while the first one's browser closes) with every phase on its log lines."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e

SHELL = "/usr/lib/chromium/chromium-headless-shell"


def test_a_run_on_the_headless_shell_crawls_through_the_grid(gf):
    cfg = gf.write_config(
        "shell.yaml",
        f"""\
        run: {{hang_after_s: 30, watch_interval_s: 1}}
        fleet: {{max_nodes: 1, idle_exit_s: 4}}
        browser: {{chromium: {SHELL}}}
        sites:
          - {{id: one, start_url: "{{demo}}/s/one/?pages=2"}}
          - {{id: two, start_url: "{{demo}}/s/two/?pages=2"}}
        """,
    )
    run = gf.run("run", "--local", "--config", str(cfg), "--run-id", "shell", timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    s = gf.summary("shell")
    assert s["check"]["ok"], s["check"]
    assert {k: v["run_status"] for k, v in s["sites"].items()} == {"one": "COMPLETED", "two": "COMPLETED"}
    assert len(gf.result("shell", "two")["items"]) == 20
    [node] = list((gf.cwd / "runs" / "shell" / "nodes").iterdir())
    assert '"browserName": "chrome-headless-shell"' in (node / "grid-node.log").read_text()
    lines = [json.loads(line) for line in (node / "node.log").read_text().splitlines() if line.startswith("{")]
    done = [e for e in lines if e.get("event") in ("completed", "closed")]
    assert {e["site"] for e in done if e["event"] == "completed"} == {"one", "two"}
    assert all(float(e["request_s"]) > 0 for e in done if e["event"] == "completed")
    assert any("close_s" in e for e in done if e["site"] == "one")  # the first site's closing was logged too
    assert gf.wait_no_leftovers() == []
