"""What the hub reads back from the table is not trusted: ids are checked again before they name files, and text
written by nodes (errors, site ids) is shown as text, never as terminal markup."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from cli.views.run import print_sites
from fleet.clock import FakeClock
from fleet.outputs.results import result_key
from fleet.outputs.summary import build_summary, export
from fleet.record import ops
from fleet.record.codec import ERROR_MAX_CHARS, URL_MAX_CHARS
from fleet.record.partition import RunInfo
from fleet.record.state import Reason, RunStatus, SiteSpec, SiteStatus
from sim.memory import MemoryResults, MemoryStateTable
from tests.helpers.cli_env import without_aws_credentials

RUN = "2026-11-21"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


# --- export: ids from the table become paths only inside the run's directory -----------------------------------


def completed_run(tmp_path: Path, sites: list[str]) -> tuple[MemoryStateTable, MemoryResults]:
    """A run whose sites all COMPLETED with a result in the (in-memory) bucket, written as a node writes them:
    site ids go into the table unchecked, as a crafted item would."""
    clock = FakeClock()
    table, results = MemoryStateTable(), MemoryResults()
    table.create_run(RunInfo(RUN, "RUNNING", clock.now(), clock.now() + 3600, "20261121"))
    for site in sites:
        rec = ops.new_site(RUN, site, SiteSpec("http://x.test/"), None)
        table.create_site(rec)
        rec = ops.claim(table, rec, "i-1", clock.now())
        key = result_key(site, "20261121", RUN)
        results.put_new(key, json.dumps({"site": site}).encode())
        ops.complete(table, rec, key, clock.now())
    return table, results


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_a_site_id_that_climbs_out_is_logged_and_skipped_and_the_summary_is_still_written(tmp_path, caplog):
    """A site item whose key is no site id is left out as the run is read (noted once, naming it), so the export
    never sees it; a record that reaches the export with one anyway is skipped there, one line each."""
    table, results = completed_run(tmp_path, ["good", "../../escaped", "a/b", "..", "/etc/abs"])
    out = tmp_path / "deep" / "runs"
    with caplog.at_level(logging.WARNING, logger="gridfleet.readback"):
        rows = table.read_run(RUN)
    assert [r.site for r in rows.sites] == ["good"]
    left = {u.key for u in rows.notes.found if u.why == "its key is not a site id"}
    assert left == {"../../escaped", "a/b", "..", "/etc/abs"}
    assert "'/etc/abs': its key is not a site id" in caplog.text
    forged = [replace(rows.sites[0], site=bad) for bad in sorted(left)]  # as a broken reader would pass them on
    summary = build_summary(rows.run, rows.sites, left_running=0, finished_at=1.0, finish_reason="done")
    with caplog.at_level(logging.ERROR, logger="gridfleet.hub"):
        path = export(out, summary, [*rows.sites, *forged], results)
    assert path == out / RUN / "summary.json" and json.loads(path.read_text())["run_id"] == RUN
    assert files_under(tmp_path) == {f"deep/runs/{RUN}/summary.json", f"deep/runs/{RUN}/results/good.json"}
    skipped = [r.getMessage() for r in caplog.records if "export-skipped" in r.getMessage()]
    assert len(skipped) == 4  # one line for each, naming it
    assert any("'../../escaped'" in line for line in skipped) and any("'/etc/abs'" in line for line in skipped)


def test_a_result_key_a_node_rewrote_is_not_read_and_the_site_is_left_out(tmp_path, caplog):
    """A node may write its site's record: one that names the hub's config as its result gets nothing exported;
    the other site's result is read at the key derived from its site, date and run."""
    table, results = completed_run(tmp_path, ["good", "forged"])
    results.put_new("hub/fleet.yaml", b"notify: {webhook_url: https://hooks.example/secret}")
    forged = table.get_site(RUN, "forged")
    table.write(forged, replace(forged, result_key="hub/fleet.yaml"))
    rows = table.read_run(RUN)
    summary = build_summary(rows.run, rows.sites, left_running=0, finished_at=1.0, finish_reason="done")
    with caplog.at_level(logging.ERROR, logger="gridfleet.hub"):
        export(tmp_path / "runs", summary, rows.sites, results)
    assert files_under(tmp_path / "runs") == {f"{RUN}/summary.json", f"{RUN}/results/good.json"}
    assert "export-skipped site=forged why=its record names result 'hub/fleet.yaml'" in caplog.text


def test_a_run_id_that_is_not_one_writes_nothing(tmp_path, caplog):
    table, results = completed_run(tmp_path, ["good"])
    rows = table.read_run(RUN)
    summary = build_summary(rows.run, rows.sites, left_running=0, finished_at=1.0, finish_reason="done")
    out = tmp_path / "a" / "runs"
    for bad in ("../../x", "x/y", "..", "x\n"):
        with caplog.at_level(logging.ERROR, logger="gridfleet.hub"), pytest.raises(ValueError):
            export(out, {**summary, "run_id": bad}, rows.sites, results)
    assert files_under(tmp_path) == set()
    assert sum("export-refused" in r.getMessage() for r in caplog.records) == 4


def test_a_results_directory_that_links_elsewhere_receives_nothing(tmp_path):
    table, results = completed_run(tmp_path, ["good"])
    rows = table.read_run(RUN)
    summary = build_summary(rows.run, rows.sites, left_running=0, finished_at=1.0, finish_reason="done")
    out, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / RUN).mkdir(parents=True)
    (out / RUN / "results").symlink_to(elsewhere)  # the resolved path, not the id, is what gives it away
    export(out, summary, rows.sites, results)
    assert list(elsewhere.iterdir()) == []
    assert (out / RUN / "summary.json").is_file()


# --- caps on what a node writes -----------------------------------------------------------------------------------


def test_every_error_a_node_or_the_hub_writes_is_cut_to_one_size(tmp_path):
    clock = FakeClock()
    table = MemoryStateTable()
    for site in ("a", "b"):
        table.create_site(ops.new_site(RUN, site, SiteSpec("http://x.test/"), None))
    a = ops.claim(table, table.get_site(RUN, "a"), "i-1", clock.now())
    a = ops.report(table, a, SiteStatus.URL_CALL, clock.now(), url="http://x.test/" + "p" * 9_000)
    assert len(a.url) == URL_MAX_CHARS
    a = ops.end_attempt(table, a, reason=Reason.ERROR, now=clock.now(), max_attempts=1, spot_cap=0, error="e" * 50_000)
    b = ops.fail_now(table, table.get_site(RUN, "b"), Reason.KILLED, clock.now(), error={"not": "text" * 9_000})
    assert a.run_status is RunStatus.FAILED and len(a.error) == len(b.error) == ERROR_MAX_CHARS


# --- status shows text from the table as text ---------------------------------------------------------------------

HOSTILE = {
    "[bold]s-1": {
        "run_status": "FAILED",
        "site_status": "FAILED",
        "attemptCount": 3,
        "failure_reason": "error",
        "error": "[/x] closing [red]boom[/red] \x1b[31mansi\x1b]0;title\x07",
        "instance_id": "[blink]i-1",
        "attempts": [],
        "result_key": None,
    },
    "s-2": {"run_status": "[red]ODD", "site_status": "[/]", "attemptCount": 1, "error": None, "attempts": []},
}


def test_markup_in_a_site_error_id_or_node_is_shown_as_typed(tmp_path):
    console = Console(record=True, width=300, force_terminal=True, color_system="truecolor")
    print_sites(console, RUN, HOSTILE, {"FAILED": 1, "[red]X": 1})  # no MarkupError
    text = console.export_text()
    for literal in ("[/x] closing [red]boom[/red]", "[bold]s-1", "[blink]i-1", "[red]ODD", "[/]", "[red]X 1"):
        assert literal in text, literal
    assert "\\x1b[31mansi\\x1b]0;title\\x07" in text  # the site's own escape sequences are written out
    styled = console.export_text(styles=True)
    assert "\x1b]0;title" not in styled and "\x1b[31mansi" not in styled
    assert not re.search(r"\x1b\[[0-9;]*m(boom|s-1|i-1|ODD)", styled)  # nothing of theirs was restyled


def test_gridfleet_status_prints_a_hostile_summary_without_failing(tmp_path):
    run = tmp_path / "runs" / RUN
    run.mkdir(parents=True)
    (run / "summary.json").write_text(
        json.dumps({"run_id": RUN, "started_at": 0, "finished_at": 1, "sites": HOSTILE, "nodes": {}})
    )
    env = {**os.environ, "GRIDFLEET_HOME": str(tmp_path / "home"), "FORCE_COLOR": "1", "COLUMNS": "300"}
    p = subprocess.run(
        [sys.executable, "-m", "cli.main", "status", "--run-id", RUN],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert "[/x] closing [red]boom[/red]" in ANSI.sub("", p.stdout)
    assert not re.search(r"\x1b\[[0-9;]*m(boom|s-1)", p.stdout)


# --- the dry runs show the config's strings as typed ------------------------------------------------------------

#: Site URLs the config accepts whose text rich would read as markup, or a terminal as its own sequences.
HOSTILE_URLS = {
    "markup": "http://a.test/[/x]/[red]b[/red]",
    "ansi": "http://b.test/\x1b[31mred\x1b]0;title\x07",
}


def _dry_run(tmp_path: Path, config: str, *args: str, **env_extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "fleet.yaml").write_text(config)
    env = without_aws_credentials(tmp_path, **env_extra)
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "run", "--dry-run", "--run-id", "d1", "--config", "fleet.yaml", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _sites_yaml() -> str:
    return "sites:\n" + "".join(
        f"  - {{id: {name}, start_url: {json.dumps(url)}}}\n" for name, url in HOSTILE_URLS.items()
    )


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "color-terminal"])
def test_the_local_dry_run_prints_a_sites_markup_and_escapes_as_text(tmp_path, terminal):
    p = _dry_run(tmp_path, _sites_yaml(), "--local", **({"FORCE_COLOR": "1", "COLUMNS": "300"} if terminal else {}))
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr  # no MarkupError
    shown = ANSI.sub("", p.stdout) if terminal else p.stdout
    assert HOSTILE_URLS["markup"] in shown
    assert "http://b.test/\\x1b[31mred\\x1b]0;title\\x07" in shown  # written out, character by character
    assert "\x1b]" not in p.stdout and "\x07" not in p.stdout
    if not terminal:
        assert "\x1b" not in p.stdout
    else:  # what escapes there are, are rich's own styles, none of them opened by the site's text
        assert not re.search(r"\x1b\[31m(red|b)", p.stdout)
    assert not (tmp_path / "home").exists()  # nothing started


def test_the_aws_dry_run_prints_the_configs_markup_and_escapes_as_text(tmp_path):
    config = (
        "aws: {imds_url: 'http://127.0.0.1:9', efs_id: fs-0123456789abcdef0, hub_address: 10.0.0.5,"
        ' queue: "q[/x]", subnet_ids: ["subnet-[red]1"], key_name: "k\\e[31mred",'
        ' instance_profile: "p[/]\\e]0;t\\a"}\n' + _sites_yaml()
    )
    p = _dry_run(tmp_path, config)
    assert "Traceback" not in p.stderr, p.stderr
    for literal in ("SQS q[/x]", "subnets subnet-[red]1", "p[/]\\x1b]0;t\\x07"):
        assert literal in p.stdout, (literal, p.stdout)
    assert "\x1b" not in p.stdout and "\x07" not in p.stdout
