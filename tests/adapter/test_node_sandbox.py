"""A node whose Chromium cannot have its sandbox crawls nothing unless it may: on AWS never, on the embedded default
only with `browser.allow_no_sandbox`. `node.main.main` runs in this process against the moto server.

Seams: "the sandbox is unavailable" is injected at the one function that probes it, `node.browser.sandbox_problem`;
`fleet.logs.setup` is replaced by nothing (it would take the root logger from pytest's capture)."""

from __future__ import annotations

import logging
import signal
import time

import pytest

from fleet.aws.bootstrap import ensure_resources
from fleet.aws.queue import SqsSiteQueue
from fleet.aws.table import DynamoStateTable
from fleet.record import ops
from fleet.record.partition import RunInfo
from fleet.record.state import SiteSpec
from node import browser
from node import main as node_main
from tests.adapter.conftest import moto_clients

PROBLEM = "user namespaces are denied to uid 2000: unshare: Operation not permitted"
RUN = "sbx-run"
NODE = "i-0123456789abcdef0"


@pytest.fixture
def node(tmp_path, aws_config, monkeypatch):
    """Run `gridfleet node` for a run with one site queued; returns (run it, its table, its queue)."""
    aws = aws_config()
    clients = moto_clients(aws)
    ensure_resources(clients, visibility_timeout_s=30)
    table = DynamoStateTable(clients.client("dynamodb"), aws.table)
    queue = SqsSiteQueue(clients.client("sqs"), aws.queue, aws.dlq_name)
    table.create_run(RunInfo(RUN, "RUNNING", time.time(), time.time() + 600, "20261121"))
    ops.send_next(table, queue, table_site(table))
    monkeypatch.setattr(browser, "sandbox_problem", lambda *a, **k: PROBLEM)
    monkeypatch.setattr(node_main, "setup", lambda **_: None)
    for logger in (logging.getLogger(), logging.getLogger("gridfleet")):  # a handler an earlier test left behind,
        kept = [h for h in logger.handlers if not getattr(getattr(h, "stream", None), "closed", False)]
        monkeypatch.setattr(logger, "handlers", kept)  # on a stream pytest has closed since, would print errors
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # a node on AWS has its role's; moto takes any
        monkeypatch.setenv(name, "testing")
    sigterm = signal.getsignal(signal.SIGTERM)

    def run(*, local: bool, allow: bool) -> int:
        config = tmp_path / "fleet.yaml"
        config.write_text(
            f"aws: {{endpoint_url: {aws.endpoint_url!r}, region: {aws.region}, table: {aws.table}, "
            f"queue: {aws.queue}, bucket: {aws.bucket}, install_dir: {str(tmp_path / 'opt')!r}}}\n"
            f"browser: {{allow_no_sandbox: {str(allow).lower()}}}\n"
            "fleet: {idle_exit_s: 1}\n"
            'sites: [{id: s1, start_url: "http://s1.test/"}]\n'
        )
        argv = ["--config", str(config), "--run-id", RUN, "--instance-id", NODE, "--grid-url", "http://127.0.0.1:9"]
        argv += ["--state-dir", str(tmp_path / "state"), "--profiles-root", str(tmp_path / "efs")]
        argv += ["--imds-url", "http://127.0.0.1:9"] + (["--local"] if local else [])
        try:
            return node_main.main(argv)
        finally:
            signal.signal(signal.SIGTERM, sigterm)

    return run, table, queue


def table_site(table: DynamoStateTable):
    rec = ops.new_site(RUN, "s1", SiteSpec("http://s1.test/"), None)
    table.create_site(rec)
    return rec


@pytest.mark.parametrize(
    "local, allow, why",
    [
        (False, False, "a node on AWS never crawls without it"),
        (False, True, "a node on AWS never crawls without it"),  # the config's leave is for the embedded default
        (True, False, "set browser.allow_no_sandbox: true in fleet.yaml to crawl without it on this machine"),
    ],
    ids=["aws", "aws-allowed", "embedded-not-allowed"],
)
def test_a_node_without_the_sandbox_crawls_nothing_and_says_why_on_its_node_item(node, capsys, local, allow, why):
    run, table, queue = node
    assert run(local=local, allow=allow) == 1
    said = f"Chromium cannot have its sandbox: {PROBLEM}; {why}"
    assert capsys.readouterr().err.splitlines() == [f"gridfleet node: {said}"]
    [item] = table.read_nodes(RUN)
    assert (item.instance_id, item.state, item.error) == (NODE, node_main.BOOT_FAILED, said)
    site = table.get_site(RUN, "s1")
    assert site is not None and site.run_status.value == "QUEUED" and site.attempt == 0  # never claimed
    assert (queue.depth().visible, queue.depth().in_flight) == (1, 0)  # its message was not taken
