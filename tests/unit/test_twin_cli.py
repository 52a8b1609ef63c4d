"""`gridfleet local ... --twin`: bad input and the wrong user get one line and exit 2, and nothing starts."""

from __future__ import annotations

import os
import types

import pytest

from cli.main import main
from twin.serve import START_AFTER_S, fleet_of, schedule_start


def run(capsys, *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_config_without_twin_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GRIDFLEET_HOME", str(tmp_path))
    rc, text = run(capsys, "local", "status", "--config", "x.yaml")
    assert rc == 2 and "--config goes with --twin" in text and "Traceback" not in text


@pytest.mark.skipif(os.geteuid() != 0, reason="as root the check that comes first is the file's")
def test_a_missing_config_is_refused_before_anything_starts(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GRIDFLEET_HOME", str(tmp_path))
    rc, text = run(capsys, "local", "up", "--twin", "--config", str(tmp_path / "none.yaml"))
    assert rc == 2 and "none.yaml: no such file" in text
    assert not (tmp_path / "twin").exists()


def test_status_and_down_of_a_twin_never_started(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GRIDFLEET_HOME", str(tmp_path))
    assert run(capsys, "local", "status", "--twin") == (1, "the twin is not running (never started)\n")
    assert run(capsys, "local", "down", "--twin") == (0, "the twin was not running\n")


def test_the_twins_sites_get_its_demo_server_and_the_crawler_project_where_it_is(tmp_path):
    config = tmp_path / "sites.yaml"
    config.write_text("crawlers: {project: ./c}\nsites: [{id: a, start_url: '{demo}/s/a/?pages=2', crawler: links}]\n")
    doc = fleet_of(config, "http://10.77.0.1:8000")
    assert doc["sites"][0]["start_url"] == "http://10.77.0.1:8000/s/a/?pages=2"
    assert doc["crawlers"] == {"project": str(tmp_path / "c")}


@pytest.mark.skipif(os.geteuid() != 0, reason="as root the check that comes first is the file's")
def test_a_bad_config_is_refused_with_its_place_before_anything_starts(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GRIDFLEET_HOME", str(tmp_path))
    bad = tmp_path / "sites.yaml"
    bad.write_text('sites: [{id: a, start_url: "{demo}/x", crawler: nope}]\n')
    rc, text = run(capsys, "local", "up", "--twin", "--config", str(bad))
    assert rc == 2 and "sites[0].crawler: unknown crawler 'nope'" in text and "Traceback" not in text
    assert not (tmp_path / "twin").exists()


class _Rules:
    """The twin as schedule_start sees it: its EventBridge rules (their expressions) and their next times."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}

    def client(self, service: str):
        assert service == "events"
        return self

    def put_rule(self, Name: str, ScheduleExpression: str, State: str) -> None:  # noqa: N803 - boto3's names
        assert State == "ENABLED"
        self.rules[Name] = ScheduleExpression

    lambda_clients = clock = None

    def load_schedules(self, handlers, prefix: str):
        from twin.schedules import parse

        return [types.SimpleNamespace(rule=r, next_at=parse(e, self.now).next_after(self.now)) for r, e in
                self.rules.items()]  # fmt: skip


def test_the_days_start_is_set_from_the_moment_the_stack_is_ready(monkeypatch):
    """Whatever the second the deployment ends at, the start fires 45 to 105 s later, and `up` is told when."""
    monkeypatch.setattr("twin.schedules.stack_handlers", lambda *a: {})
    base = 1_795_000_000.0  # a whole minute
    for now in (base + s for s in (0.0, 1.0, 14.5, 15.0, 16.0, 44.9, 59.9)):
        twin = _Rules()
        twin.now = now
        start, at = schedule_start(twin, "gftwin", now)
        assert twin.rules == {"gftwin-start": start} and start.startswith("cron(")
        assert START_AFTER_S <= at - now < START_AFTER_S + 60, (now - base, at - now)
        assert at % 60 == 0
