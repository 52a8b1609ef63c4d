"""The run's end message (fleet/outputs/notify.py), fleet.yaml's `notify` section, and sending that never fails a run.

The webhook tests post to a real HTTP receiver on 127.0.0.1 (a tiny http.server in the test): one that answers
200 and keeps the body, one that answers 500, and one that accepts the connection and never answers.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleet.aws.notify import WebhookChannel, channels, notify_run_end, previous_summary, report_location
from fleet.config import Config, NotifyConfig
from fleet.config.load import dump_config, parse_config
from fleet.errors import ConfigError
from fleet.outputs.notify import MAX_LISTED, Message, changes, overdue_message, redact_url, run_message, send_all

ARN = "arn:aws:sns:ap-northeast-2:123456789012:gridfleet-runs"
SECRET_PATH = "/services/T000/B000/s3cr3tT0ken"


def site(status: str, reason: str | None = None, error: str | None = None) -> dict[str, Any]:
    return {"run_status": status, "failure_reason": reason, "error": error, "attempts": []}


def summary(run_id: str, started_at: float, **sites: dict[str, Any]) -> dict[str, Any]:
    counts = {"QUEUED": 0, "RUN": 0, "COMPLETED": 0, "FAILED": 0}
    for e in sites.values():
        counts[e["run_status"]] += 1
    return {"run_id": run_id, "started_at": started_at, "sites": sites, "counts": counts, "finish_reason": "done"}


TODAY = summary(
    "2026-11-24",
    2000.0,
    a=site("COMPLETED"),
    b=site("FAILED", "hang", "page 3 hung for 120s"),
    c=site("COMPLETED"),
    d=site("FAILED", "error", "HTTP 500 <html>"),
    new=site("COMPLETED"),
)
YESTERDAY = summary(
    "2026-11-23",
    1000.0,
    a=site("COMPLETED"),
    b=site("COMPLETED"),
    c=site("FAILED", "hang"),
    d=site("FAILED", "error"),
    gone=site("FAILED", "error"),
)


# --- the message ------------------------------------------------------------------------------------------------


def test_the_message_of_a_run_with_failures():
    m = run_message(TODAY, YESTERDAY, "s3://results/runs/2026-11-24/report.html")

    assert m.subject == "gridfleet run 2026-11-24 finished: 2 FAILED (3/5 COMPLETED)"
    lines = m.text.splitlines()
    assert lines[0] == m.subject
    assert "COMPLETED 3, FAILED 2" in lines[1]
    assert "- b: hang: page 3 hung for 120s" in lines
    assert "- d: error: HTTP 500 <html>" in lines
    assert "since run 2026-11-23:" in lines
    assert "newly failing (1): b" in lines  # COMPLETED yesterday, FAILED today
    assert "fixed (1): c" in lines  # FAILED yesterday, COMPLETED today; d failed both days: neither
    assert lines[-1] == "report: s3://results/runs/2026-11-24/report.html"


def test_a_site_whose_result_broke_its_contract_is_newly_failing_with_the_rules_it_broke():
    today = summary(
        "r2", 2000.0, shop=site("FAILED", "contract", "min_items: 0 items < 100; max_drop: 0 items after 120")
    )
    m = run_message(today, summary("r1", 1000.0, shop=site("COMPLETED")), None)
    lines = m.text.splitlines()
    assert "- shop: contract: min_items: 0 items < 100; max_drop: 0 items after 120" in lines
    assert "newly failing (1): shop" in lines


def test_a_run_without_failures_or_previous_run():
    ok = summary("r2", 5.0, a=site("COMPLETED"))
    m = run_message(ok, None, "/runs/r2/report.html")
    assert m.subject == "gridfleet run r2 finished: all COMPLETED (1/1 COMPLETED)"
    assert "FAILED (" not in m.text
    assert "no previous run to compare with" in m.text
    assert changes(ok, None).previous_run is None


def test_the_message_gives_the_runs_totals_against_the_previous_runs_items():
    today = {**TODAY, "totals": {"items": 1260, "pages": 63, "pages_fetched": 70, "collisions": 14, "skipped": 2}}
    yesterday = {**YESTERDAY, "totals": {"items": 1400, "pages": 70, "pages_fetched": 70}}
    lines = run_message(today, yesterday, "here").text.splitlines()
    assert lines[2] == "items: 1,260 from 63 pages (previous run 1,400, -10%); 70 pages fetched, retries included"
    assert lines[3] == "left out: 14 collisions (same id, other content), 2 items without an id"


def test_a_summary_without_totals_is_counted_from_its_sites():
    counted = site("COMPLETED")
    counted.update(items=7, pages=2, attempts=[{"pages": 2, "collisions": 1, "skipped": 0}])
    lines = run_message(summary("r2", 5.0, a=counted, b=site("COMPLETED")), None, "here").text.splitlines()
    assert lines[2:4] == [
        "items: 7 from 2 pages; 2 pages fetched, retries included",
        "left out: 1 collisions (same id, other content), 0 items without an id",
    ]


def test_long_lists_are_cut_and_the_subject_fits_sns():
    many = summary("r" * 90, 5.0, **{f"s{i:04d}": site("FAILED", "hang", "x" * 1000) for i in range(MAX_LISTED + 7)})
    m = run_message(many, None, "here")
    assert len(m.subject) <= 100
    assert m.text.count("\n- s") == MAX_LISTED
    assert "... and 7 more (see the report)" in m.text
    assert max(len(line) for line in m.text.splitlines()) < 400  # an error is cut, the summary keeps it whole


def test_the_slack_body_escapes_markup_and_keeps_blocks_within_limits():
    many = summary("r3", 5.0, **{f"s{i:04d}": site("FAILED", "error", "<b>" + "y" * 190) for i in range(40)})
    body = run_message(many, None, "here").slack()
    assert "&lt;b&gt;" in body["text"] and "<b>" not in body["text"]
    assert 1 < len(body["blocks"]) <= 50
    assert all(len(b["text"]["text"]) <= 3000 for b in body["blocks"])
    assert "\n".join(b["text"]["text"] for b in body["blocks"]) == body["text"]


def test_the_overdue_message():
    m = overdue_message("r9", ["a", "b"], 3600, "s3://bucket/runs/r9/summary.json")
    assert m.subject == "gridfleet run r9 overdue: ended by the watchdog, 2 site(s) FAILED (deadline)"
    assert "- a: deadline" in m.text and "- b: deadline" in m.text
    assert "3600s past its deadline" in m.text
    assert m.text.endswith("summary: s3://bucket/runs/r9/summary.json")


def test_report_location_is_the_bucket_on_aws_and_the_file_on_the_embedded_default(tmp_path):
    cfg = Config(sites=[{"id": "a", "start_url": "https://a.example/"}], aws={"bucket": "res"})
    assert report_location(cfg, "r1", tmp_path) == "s3://res/runs/r1/report.html"
    local = cfg.with_endpoint("http://127.0.0.1:5000")
    assert report_location(local, "r1", tmp_path) == str(tmp_path / "r1" / "report.html")


# --- the config -------------------------------------------------------------------------------------------------


def load(notify: str) -> Config:
    return parse_config(f"notify: {notify}\nsites:\n  - {{id: a, start_url: 'https://a.example/'}}\n", "fleet.yaml")


def test_notify_is_read_and_off_by_default():
    assert not load("{}").notify.enabled
    cfg = load(f"{{sns_topic_arn: '{ARN}', webhook_url: 'https://hooks.example{SECRET_PATH}', timeout_s: 3}}")
    assert cfg.notify.enabled and cfg.notify.sns_topic_arn == ARN and cfg.notify.timeout_s == 3
    assert cfg.notify.webhook_url is not None
    assert cfg.notify.webhook_url.get_secret_value() == f"https://hooks.example{SECRET_PATH}"


@pytest.mark.parametrize(
    "notify, field, words",
    [
        ("{sns_topic_arn: 'arn:aws:sqs:ap-northeast-2:123456789012:q'}", "notify.sns_topic_arn", "SNS topic ARN"),
        ("{sns_topic_arn: 'arn:aws:sns:ap-northeast-2:1234:t'}", "notify.sns_topic_arn", "SNS topic ARN"),
        ("{webhook_url: 'ftp://hooks.example/x'}", "notify.webhook_url", "http(s) URL"),
        ("{webhook_url: 'hooks.example/x'}", "notify.webhook_url", "http(s) URL"),
        ("{webhook_url: 'https://u:p@hooks.example/x'}", "notify.webhook_url", "must not hold credentials"),
        ("{webhook_url: 'https://u@hooks.example/x'}", "notify.webhook_url", "must not hold credentials"),
        ("{timeout_s: 0}", "notify.timeout_s", "greater than 0"),
        ("{email: a@b.c}", "notify.email", "unknown key"),
    ],
)
def test_a_bad_notify_value_is_one_error_naming_the_field(notify, field, words):
    with pytest.raises(ConfigError) as e:
        load(notify)
    (line,) = str(e.value).splitlines()
    assert line.startswith(f"fleet.yaml:1: {field}: ") and words in line


@pytest.mark.parametrize(
    "url", [f"ftp://hooks.example{SECRET_PATH}", f"https://bot:hunter2@hooks.example{SECRET_PATH}"]
)
def test_a_bad_webhook_url_is_not_repeated_in_the_error(url):
    with pytest.raises(ConfigError) as e:
        load(f"{{webhook_url: '{url}'}}")
    assert SECRET_PATH not in str(e.value) and "hunter2" not in str(e.value)


def test_the_webhook_url_is_masked_and_never_dumped():
    cfg = load(f"{{sns_topic_arn: '{ARN}', webhook_url: 'https://hooks.example{SECRET_PATH}'}}")
    assert SECRET_PATH not in repr(cfg) and SECRET_PATH not in str(cfg.notify)
    dumped = dump_config(cfg)  # what the nodes read (runs/<run_id>/fleet.yaml)
    assert SECRET_PATH not in dumped and "webhook_url" not in dumped
    assert parse_config(dumped).notify == NotifyConfig(sns_topic_arn=ARN)


def test_the_nodes_config_has_no_notify_settings_and_the_hubs_lives_under_hub():
    """What the hub uploads for its nodes (runs/<run_id>/fleet.yaml) carries neither the webhook nor the topic; the
    hub's own config, with the webhook, defaults to hub/, which the node role may not read (infra/terraform)."""
    from cli.envs import aws as aws_env

    cfg = load(f"{{sns_topic_arn: '{ARN}', webhook_url: 'https://hooks.example{SECRET_PATH}'}}")
    dumped = dump_config(aws_env.connect(cfg).node_config())
    assert SECRET_PATH not in dumped and ARN not in dumped and "webhook" not in dumped
    assert parse_config(dumped).notify == NotifyConfig()
    assert cfg.aws.hub_config_key == "hub/fleet.yaml"


def test_redact_url_keeps_scheme_and_host_only():
    assert redact_url(f"https://hooks.example:8443{SECRET_PATH}?token=x") == "https://hooks.example/..."


# --- sending ----------------------------------------------------------------------------------------------------


class Broken:
    name = "broken:test"

    def send(self, message: Message) -> None:
        raise ConnectionError("no route to the channel")


class Kept:
    name = "kept:test"

    def __init__(self) -> None:
        self.got: list[Message] = []

    def send(self, message: Message) -> None:
        self.got.append(message)


def test_a_failing_channel_is_logged_in_one_line_and_the_next_still_sent(caplog):
    kept = Kept()
    with caplog.at_level(logging.INFO, logger="gridfleet.notify"):
        sent = send_all([Broken(), kept], Message("s", "t"), run_id="r1")
    assert sent == ["kept:test"] and kept.got == [Message("s", "t")]
    (failed,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("notify-failed")]
    assert "channel=broken:test" in failed and "ConnectionError: no route to the channel" in failed
    assert "\n" not in failed


class Receiver(BaseHTTPRequestHandler):
    status = 200
    bodies: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).bodies.append((self.path, self.headers["Content-Type"], body))
        self.send_response(self.status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver():
    def start(status: int) -> tuple[str, type[Receiver]]:
        handler = type("R", (Receiver,), {"status": status, "bodies": []})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}{SECRET_PATH}", handler

    servers: list[ThreadingHTTPServer] = []
    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def test_the_webhook_posts_slack_compatible_json(receiver):
    url, got = receiver(200)
    m = run_message(TODAY, YESTERDAY, "s3://results/runs/2026-11-24/report.html")
    assert send_all([WebhookChannel(url, timeout_s=5)], m, run_id="2026-11-24") == ["webhook:http://127.0.0.1/..."]
    ((path, ctype, body),) = got.bodies
    assert path == SECRET_PATH and ctype.startswith("application/json")
    data = json.loads(body)
    assert data["text"].startswith("gridfleet run 2026-11-24 finished: 2 FAILED")
    assert "- d: error: HTTP 500 &lt;html&gt;" in data["text"]
    assert data["blocks"][0]["type"] == "section"


def test_a_webhook_answering_500_is_logged_without_its_secret(receiver, caplog):
    url, got = receiver(500)
    with caplog.at_level(logging.INFO):
        sent = send_all([WebhookChannel(url, timeout_s=5)], Message("s", "t"), run_id="r1")
    assert sent == [] and len(got.bodies) == 1  # one try, no retry
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "notify-failed" in logged and "channel=webhook:http://127.0.0.1/..." in logged and "HTTP 500" in logged
    assert SECRET_PATH not in logged


def test_a_webhook_that_never_answers_costs_its_timeout_and_no_more(caplog):
    silent = socket.create_server(("127.0.0.1", 0))  # accepts connections (backlog), never answers
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}{SECRET_PATH}"
        started = time.monotonic()
        with caplog.at_level(logging.INFO):
            sent = send_all([WebhookChannel(url, timeout_s=0.3)], Message("s", "t"), run_id="r1")
        took = time.monotonic() - started
    finally:
        silent.close()
    assert sent == [] and took < 3
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "notify-failed" in logged and "timed out" in logged and SECRET_PATH not in logged


def test_an_unreachable_webhook_is_logged_not_raised(caplog):
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed again: nothing listens there
    cfg = Config(
        sites=[{"id": "b", "start_url": "https://b.example/"}],
        notify={"webhook_url": f"http://127.0.0.1:{port}{SECRET_PATH}", "timeout_s": 2},
    )
    with caplog.at_level(logging.INFO):
        sent = notify_run_end(cfg, TODAY, table=NoRuns(), out_dir=Path("runs"), clients=NoClients())
    assert sent == []
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "notify-failed" in logged and "cannot reach it" in logged and SECRET_PATH not in logged


def closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]  # closed again: nothing listens there


@pytest.mark.parametrize(
    "url, secrets",
    [
        ("http://bot:hunter2@127.0.0.1:{port}/hook/s3cr3t?token=t0k", ["bot:", "hunter2", "s3cr3t", "t0k"]),
        ("http://127.0.0.1:{port}/hook/s3cr3t?token=t0k", ["s3cr3t", "t0k"]),
        ("http://127.0.0.1:{port}/hook/s3cr3t\n?token=t0k", ["s3cr3t", "t0k"]),  # http.client: InvalidURL
        ("http://127.0.0.1:{port}/hook/s3cr3t t0k", ["s3cr3t", "t0k"]),  # http.client: InvalidURL
        ("http://127.0.0.1:{port}/hook/s3cr3t\u00e9?token=t0k", ["s3cr3t", "t0k"]),  # UnicodeEncodeError
        ("http://[::1/hook/s3cr3t?token=t0k", ["s3cr3t", "t0k"]),  # urllib.parse: ValueError
    ],
)
def test_a_failing_webhook_send_logs_no_part_of_its_secret(caplog, url, secrets):
    """The channel is called directly: load refuses some of these URLs, and the sender must hold on its own."""
    channel = WebhookChannel(url.format(port=closed_port()), timeout_s=2)
    with caplog.at_level(logging.DEBUG):
        sent = send_all([channel], Message("s", "t"), run_id="r1")
    assert sent == []
    logged = "\n".join(r.getMessage() for r in caplog.records)
    (failed,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("notify-failed")]
    assert "error=" in failed
    assert not [part for part in secrets if part in logged], logged


class NoRuns:
    """A run index with only this run in it (a seam: the previous-run lookup is tested on moto)."""

    def list_runs(self) -> list[Any]:
        return []


class NoClients:
    def client(self, service: str) -> Any:
        assert service == "s3", f"no {service} client is needed without SNS"
        return object()  # never called: there is no earlier run to read


def test_channels_are_those_configured():
    assert channels(NotifyConfig(), object()) == []
    both = channels(NotifyConfig(sns_topic_arn=ARN, webhook_url="https://h.example/x"), object())
    assert [c.name for c in both] == [f"sns:{ARN}", "webhook:https://h.example/..."]
    assert previous_summary(NoRuns(), None, "r1") is None  # type: ignore[arg-type]


# --- the hub's finish path ----------------------------------------------------------------------------------------


def finished_run(tmp_path, webhook_url: str, caplog) -> Any:
    """A whole run of the hub loop's fakes (memory table, queue and provider) whose config has a webhook; s1
    fails with an error. What `Hub._finish` returned."""
    from fleet.record import ops
    from fleet.record.state import Reason
    from tests.unit.test_hub_loop import Rig, config

    cfg = config().model_copy(update={"notify": NotifyConfig(webhook_url=webhook_url, timeout_s=2)})
    rig = Rig(tmp_path, cfg)
    hub = rig.hub()
    hub.tick()
    for _ in range(3):
        rec, msg = rig.node_takes()
        if rec.site == "s1":
            ops.fail_now(rig.table, rec, Reason.ERROR, rig.clock.now(), error="HTTP 500 on page 2")
            rig.queue.delete(msg)
        else:
            rig.node_completes(rec, msg)
    with caplog.at_level(logging.INFO):
        while hub.executor.finished is None:
            hub.tick()
    return hub._finish(hub.executor.finished)


def test_the_hub_posts_the_end_message_as_the_run_finishes(tmp_path, receiver, caplog):
    url, got = receiver(200)
    out = finished_run(tmp_path, url, caplog)
    assert out.exit_code == 3  # some sites FAILED: as without a message
    ((_, _, body),) = got.bodies
    text = json.loads(body)["text"]
    assert text.startswith("gridfleet run 2026-11-21 finished: 1 FAILED (2/3 COMPLETED)")
    assert "- s1: error: HTTP 500 on page 2" in text
    assert text.endswith("report: s3://trendlyze-results/runs/2026-11-21/report.html")  # on AWS: the bucket


def test_a_webhook_failure_does_not_fail_the_run(tmp_path, receiver, caplog):
    url, got = receiver(500)
    out = finished_run(tmp_path, url, caplog)
    assert out.exit_code == 3 and len(got.bodies) == 1
    assert json.loads(out.summary_path.read_text())["counts"]["FAILED"] == 1
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("notify-failed")]
    assert len(logged) == 1 and "HTTP 500" in logged[0] and SECRET_PATH not in "\n".join(logged)


class BrokenTable:
    """A table that cannot be read (a seam: a DynamoDB outage at the run's end)."""

    def read_run(self, run_id: str) -> Any:
        raise ConnectionError("the table is unreachable")


def test_a_run_that_cannot_be_read_back_is_logged_not_raised(caplog):
    from fleet.aws.notify import notify_finished

    cfg = Config(sites=[{"id": "a", "start_url": "https://a.example/"}], notify={"sns_topic_arn": ARN})
    with caplog.at_level(logging.INFO):
        assert notify_finished(cfg, BrokenTable(), "r1", "done", 0, 5.0, Path("runs")) == []  # type: ignore[arg-type]
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("notify-failed")]
    assert "channel=all" in line and "the table is unreachable" in line
