"""Hostile bodies on a real SQS queue (the moto server on 127.0.0.1), one node agent's receive loop over them and an
honest message behind them, on DynamoDB and S3 there too.

The crawl is scripted (tests.helpers.fake_node.ScriptedCrawl), the one seam: its pages move the agent's clock on
instead of taking wall time. Everything else is real, and moto measures the queue's visibility timeouts in real
time, so the clock is real time plus what the scripted pages added.
"""

from __future__ import annotations

import logging
import time

import pytest
from botocore.exceptions import ClientError

from fleet.aws.bootstrap import ensure_resources
from fleet.aws.queue import SqsSiteQueue
from fleet.aws.results import S3ResultStore
from fleet.aws.table import DynamoStateTable
from fleet.logs import JsonFormatter
from fleet.record import ops
from fleet.record.messages import SiteMessage
from fleet.record.partition import RunInfo
from fleet.record.state import RunStatus, SiteSpec
from node.agent import Agent, AgentSettings
from profiles import ProfileStore
from tests.helpers.fake_node import ScriptedCrawl, Spy, pages_script, promoted
from tests.helpers.hostile import HOSTILE, RUN

from .conftest import NamedClients


class ScriptedTime:
    """Real time, as moto measures visibility timeouts, that the scripted crawl moves on (`advance`) for its pages;
    the agent's own sleeps (none are expected here) move it on too, so nothing waits on the wall clock for them."""

    def __init__(self) -> None:
        self._ahead = 0.0

    def now(self) -> float:
        return time.time() + self._ahead

    def monotonic(self) -> float:
        return time.monotonic() + self._ahead

    def advance(self, seconds: float) -> None:
        self._ahead += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))


@pytest.fixture
def world(aws_config, shared_clients, tmp_path):
    aws = aws_config(max_receive_count=2)
    ensure_resources(NamedClients(shared_clients, aws), visibility_timeout_s=30)
    sqs = shared_clients.client("sqs")
    w = type("World", (), {})()
    w.sqs = sqs
    w.table = DynamoStateTable(shared_clients.client("dynamodb"), aws.table)
    w.queue = SqsSiteQueue(sqs, aws.queue_name, aws.dlq_name)
    w.results = S3ResultStore(shared_clients.client("s3"), aws.bucket)
    w.clock = ScriptedTime()
    w.table.create_run(RunInfo(RUN, "RUNNING", w.clock.now(), w.clock.now() + 600, "20261121"))
    w.crawls = []
    (tmp_path / "state").mkdir()

    def start(job, log_path):
        crawl = ScriptedCrawl(w.clock, pages_script(2))  # type: ignore[arg-type]
        w.crawls.append(crawl)
        return crawl

    w.queue_spy = Spy(w.queue)
    w.agent = Agent(
        AgentSettings(
            run_id=RUN,
            instance_id="i-1",
            hang_after_s=10,
            heartbeat_interval_s=5,
            visibility_s=30,
            idle_exit_s=2,
            receive_wait_s=1,
            max_attempts=3,
            lock_timeout_s=0,
        ),
        table=w.table,
        queue=w.queue_spy,
        results=w.results,
        profiles=ProfileStore(tmp_path / "efs"),
        start_crawl=start,
        cleanup=lambda *a: None,
        clock=w.clock,
        state_dir=tmp_path / "state",
    )
    return w


def test_dynamodb_refuses_keys_that_are_not_of_the_id_shape(world):
    """Why `decode` checks the ids before the node looks a site up: an empty key makes GetItem fail (so does a sort
    key over 1024 bytes on DynamoDB itself, which moto does not check)."""
    with pytest.raises(ClientError) as e:
        world.table.get_site(RUN, "")
    assert e.value.response["Error"]["Code"] == "ValidationException"


def test_the_agent_refuses_each_hostile_body_keeps_going_deletes_none_and_crawls_the_honest_one(world, caplog):
    sent = {}
    for name, body in HOSTILE.items():
        out = world.sqs.send_message(QueueUrl=world.queue.url, MessageBody=body)
        sent[out["MessageId"]] = name
    rec = ops.new_site(RUN, "s1", SiteSpec("http://x.test/"), None)
    world.table.create_site(rec)
    ops.send_next(world.table, world.queue, rec)  # the honest message, queued behind them all

    with caplog.at_level(logging.INFO, logger="gridfleet.node"):
        assert world.agent.run() == 0  # idled out: no hostile body ended it

    done = promoted(world.table, world.results, world.queue, RUN, "s1")  # the hub makes the staged result the site's
    assert (done.run_status, done.attempt, len(world.crawls)) == (RunStatus.COMPLETED, 1, 1)
    assert world.results.exists("s1/20261121/result.json")
    deleted = [args[0] for args in world.queue_spy.named("delete")]
    assert deleted and all(isinstance(m, SiteMessage) and m.site == "s1" for m in deleted), deleted
    depth = world.queue.depth()
    assert depth.visible + depth.in_flight + depth.dlq == len(HOSTILE)  # every one kept: the DLQ gets them

    said = [r for r in caplog.records if getattr(r, "event", None) in ("bad-message", "refused-message")]
    assert {sent[r.fields["message_id"]] for r in said} == set(HOSTILE)  # each refused, one line per receive
    for r in said:
        assert r.levelno == logging.WARNING
        assert len(r.getMessage()) < 1024 and len(JsonFormatter().format(r)) < 1024, r.getMessage()[:300]
