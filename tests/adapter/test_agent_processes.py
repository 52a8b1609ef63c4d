"""The node agent with real crawler processes and pipes, against a moto server on 127.0.0.1."""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from fleet import procs
from fleet.aws.bootstrap import ensure_resources
from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.aws.queue import SqsSiteQueue
from fleet.aws.results import S3ResultStore
from fleet.aws.table import DynamoStateTable
from fleet.clock import SystemClock
from fleet.config.aws import AwsConfig
from fleet.record import ops
from fleet.record.partition import RunInfo
from fleet.record.state import Reason, RunStatus, SiteSpec, SiteStatus
from hub.control.local import LocalNodeControl
from node.agent import Agent, AgentSettings
from node.runner import ChildProcess
from profiles import ProfileStore
from tests.helpers.fake_node import promoted

ROOT = Path(__file__).resolve().parents[2]
RUN = "2026-11-21"


@pytest.fixture(scope="module")
def moto_url(moto_endpoint):
    return moto_endpoint


@pytest.fixture
def world(moto_url, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the crawler processes import tests.helpers
    tag = uuid.uuid4().hex[:8]
    aws = AwsConfig(endpoint_url=moto_url, table=f"t-{tag}", queue=f"q-{tag}", bucket=f"b-{tag}")
    clients = AwsClients(aws, credentials=LOCAL_CREDENTIALS)
    ensure_resources(clients, 30)
    w = type("World", (), {})()
    w.table = DynamoStateTable(clients.client("dynamodb"), aws.table)
    w.queue = SqsSiteQueue(clients.client("sqs"), aws.queue, aws.dlq_name)
    w.results = S3ResultStore(clients.client("s3"), aws.bucket)
    w.table.create_run(RunInfo(RUN, "RUNNING", time.time(), time.time() + 600, "20261121"))
    w.state_dir = tmp_path / "instances" / RUN / "i-1"
    w.state_dir.mkdir(parents=True)
    w.tmp = tmp_path

    def agent(**kw):
        settings = dict(
            run_id=RUN,
            instance_id="i-1",
            hang_after_s=1.0,
            heartbeat_interval_s=0.5,
            visibility_s=30,
            idle_exit_s=1.5,
            receive_wait_s=0,
            max_attempts=1,
            lock_timeout_s=1,
        )
        settings.update(kw)
        return Agent(
            AgentSettings(**settings),
            table=w.table,
            queue=w.queue,
            results=w.results,
            profiles=ProfileStore(tmp_path / "efs"),
            start_crawl=lambda job, log: ChildProcess(job, log),
            cleanup=lambda *a: None,
            clock=SystemClock(),
            state_dir=w.state_dir,
        )

    def seed(site, crawler, **options):
        rec = ops.new_site(RUN, site, SiteSpec("http://x.test/", crawler, options), None)
        w.table.create_site(rec)
        ops.send_next(w.table, w.queue, rec)

    w.agent, w.seed = agent, seed
    return w


def test_a_real_crawler_process_reports_through_the_pipe_and_its_result_lands(world):
    world.seed("quick", "tests.helpers.crawlers:QuickCrawler")
    assert world.agent().run() == 0
    rec = promoted(world.table, world.results, world.queue, RUN, "quick")  # the hub makes the staged result the site's
    assert (rec.run_status, rec.pages) == (RunStatus.COMPLETED, 2)
    body = json.loads(world.results.get("quick/20261121/result.json"))
    assert [i["id"] for i in body["items"]] == ["quick-0", "quick-1", "quick-2"]
    assert world.queue.depth().visible == 0 and world.queue.depth().in_flight == 0


def test_watchdog_kills_the_crawlers_whole_process_group(world):
    pid_file = world.tmp / "helper.pid"
    world.seed("stuck", "tests.helpers.crawlers:HangCrawler", pid_file=str(pid_file))
    started = time.monotonic()
    world.agent().run()
    rec = world.table.get_site(RUN, "stuck")
    assert (rec.run_status, rec.failure_reason) == (RunStatus.FAILED, "hang")
    assert rec.attempts[0].kill_path == "watchdog"
    assert time.monotonic() - started < 15
    helper = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while procs.pid_alive(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not procs.pid_alive(helper)  # the crawler's helper died with it
    assert not (world.state_dir / "crawler.json").exists()


def test_the_hubs_local_kill_reaches_the_crawler_and_the_agent_stands_down(world):
    pid_file = world.tmp / "helper.pid"
    world.seed("stuck", "tests.helpers.crawlers:HangCrawler", pid_file=str(pid_file))
    agent = world.agent(node_watchdog=False, hang_after_s=600, max_attempts=3)
    stack_id = "test-" + uuid.uuid4().hex[:6]
    # The agent runs in this test process; a marked stand-in tells the control that instance i-1 is up.
    marker = procs.spawn(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        log_path=world.tmp / "m.log",
        markers={"GRIDFLEET_INSTANCE": "i-1", "GRIDFLEET_STACK": stack_id},
    )
    done = threading.Event()
    thread = threading.Thread(target=lambda: (agent.run(), done.set()), daemon=True)
    try:
        thread.start()
        deadline = time.monotonic() + 20
        while True:  # until the crawler is hung in URL_CALL, as the hub would see it
            rec = world.table.get_site(RUN, "stuck")
            if rec.site_status is SiteStatus.URL_CALL and pid_file.exists():
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # What the hub's executor does: mark the kill (fencing the node off), then signal the crawler's group.
        ops.request_kill(world.table, rec, Reason.HANG, time.time())
        result = LocalNodeControl(world.tmp / "instances", stack_id, RUN).kill("i-1", "stuck", 1)
        assert result.ok and result.path == "local", result
        assert done.wait(20)
    finally:
        marker.kill()
        marker.wait()
    rec = world.table.get_site(RUN, "stuck")
    assert rec.run_status is RunStatus.RUN and rec.kill_reason == "hang"  # left to the hub to requeue
    assert not world.results.exists("stuck/20261121/result.json")
