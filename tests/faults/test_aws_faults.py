"""Faults at the AWS seams, against a moto server: throttling past botocore's retries, a hub gone for good.

moto never throttles; a botocore `before-send` hook answers chosen calls with ThrottlingException
instead of sending them, so botocore's own retry logic runs and gives up as it would on AWS.
"""

from __future__ import annotations

import time
import uuid

from botocore.awsrequest import AWSResponse

from cli.report.check import check_run
from fleet.aws.bootstrap import ensure_resources
from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.aws.queue import SqsSiteQueue
from fleet.aws.results import S3ResultStore
from fleet.aws.table import DynamoStateTable
from fleet.clock import FakeClock
from fleet.config.load import parse_config
from fleet.record import ops
from fleet.record.partition import RunInfo
from fleet.record.state import RunStatus, SiteSpec
from node.agent import Agent, AgentSettings
from profiles import ProfileStore
from tests.helpers.fake_node import ScriptedCrawl, pages_script, promoted

RUN = "2026-11-21"


class FastClock:
    """Wall-clock time plus every sleep, which returns at once: backoffs cost nothing, real waits still count."""

    def __init__(self):
        self.offset = 0.0

    def now(self) -> float:
        return time.time() + self.offset

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def sleep(self, seconds: float) -> None:
        self.offset += max(0.0, seconds)

    advance = sleep


class _Raw:
    def __init__(self, body: bytes):
        self.body = body

    def stream(self, **_):
        yield self.body


class Throttle:
    """Answer the next `n` calls of `operation` with a ThrottlingException (botocore retries, then raises)."""

    def __init__(self, operation: str, n: int):
        self.operation, self.left, self.refused = operation, n, 0

    def hook(self, service: str, client) -> None:
        client.meta.events.register(f"before-send.{service}.{self.operation}", self._answer)

    def _answer(self, request, **_):
        if self.left <= 0:
            return None
        self.left -= 1
        self.refused += 1
        body = b'{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"Rate exceeded"}'
        return AWSResponse(request.url, 400, {"Content-Type": "application/x-amz-json-1.0"}, _Raw(body))


def config_on(moto_endpoint: str, **aws):
    tag = uuid.uuid4().hex[:8]
    extra = "".join(f", {k}: {v}" for k, v in aws.items())
    return parse_config(
        f"aws: {{endpoint_url: '{moto_endpoint}', table: t-{tag}, queue: q-{tag}, bucket: b-{tag}"
        f"{extra}}}\nsites: [{{id: s1, start_url: 'https://s1.test/'}}]"
    )


def test_a_node_under_throttling_beyond_retries_never_crawls_unclaimed_and_survives(moto_endpoint, tmp_path):
    config = config_on(moto_endpoint, max_retries=1)
    plain = AwsClients(config.aws, credentials=LOCAL_CREDENTIALS)
    ensure_resources(plain, 30)
    table = DynamoStateTable(plain.client("dynamodb"), config.aws.table)
    table.create_run(RunInfo(RUN, "RUNNING", time.time(), time.time() + 600, "20261121"))
    rec = ops.new_site(RUN, "s1", SiteSpec("https://s1.test/"), None)
    table.create_site(rec)
    ops.send_next(table, SqsSiteQueue(plain.client("sqs"), config.aws.queue, config.aws.dlq_name), rec)

    throttle = Throttle("UpdateItem", 6)  # the claim, and whatever follows, fails for a while
    clients = AwsClients(config.aws, credentials=LOCAL_CREDENTIALS, on_client=(throttle.hook,))
    clock = FastClock()
    crawl_starts = []

    def start_crawl(job, log):
        crawl_starts.append(table.get_site(RUN, "s1"))  # what the record said when a crawl began
        return ScriptedCrawl(clock, pages_script(2))

    (tmp_path / "state").mkdir()
    agent = Agent(
        AgentSettings(
            run_id=RUN, instance_id="i-1", receive_wait_s=1, visibility_s=1, idle_exit_s=4, heartbeat_interval_s=5
        ),
        table=DynamoStateTable(clients.client("dynamodb"), config.aws.table),
        queue=SqsSiteQueue(clients.client("sqs"), config.aws.queue, config.aws.dlq_name),
        results=S3ResultStore(clients.client("s3"), config.aws.bucket),
        profiles=ProfileStore(tmp_path),
        start_crawl=start_crawl,
        cleanup=lambda *a: None,
        clock=clock,
        state_dir=tmp_path / "state",
    )
    assert agent.run() == 0  # the node waited the throttling out instead of dying
    assert throttle.refused == 6
    assert crawl_starts and all(r.run_status is RunStatus.RUN and r.instance_id == "i-1" for r in crawl_starts)
    done = promoted(table, S3ResultStore(clients.client("s3"), config.aws.bucket), agent.queue, RUN, "s1")
    assert done.run_status is RunStatus.COMPLETED  # once the hub made its staged result the site's


def test_a_hub_under_throttling_beyond_retries_keeps_its_loop(moto_endpoint, tmp_path):
    from hub.loop import Hub
    from tests.unit.test_hub_loop import FakeControl, FakeProvider

    config = config_on(moto_endpoint, max_retries=1)
    ensure_resources(AwsClients(config.aws, credentials=LOCAL_CREDENTIALS), 30)
    throttle = Throttle("Query", 8)  # the hub cannot read the run for four ticks
    clients = AwsClients(config.aws, credentials=LOCAL_CREDENTIALS, on_client=(throttle.hook,))
    clock = FakeClock(time.time())
    table = DynamoStateTable(clients.client("dynamodb"), config.aws.table)
    hub = Hub(
        run_id=RUN,
        config=config.model_copy(update={"run": config.run.model_copy(update={"deadline_s": 60})}),
        table=table,
        queue=SqsSiteQueue(clients.client("sqs"), config.aws.queue, config.aws.dlq_name),
        results=S3ResultStore(clients.client("s3"), config.aws.bucket),
        provider=FakeProvider(),
        control=FakeControl(),
        clock=clock,
        out_dir=tmp_path / "runs",
        hub_id="h",
    )
    out = hub.run()  # no node ever comes: the deadline ends it, after the throttled ticks were retried
    assert throttle.refused == 8 and out.exit_code == 3
    assert table.get_site(RUN, "s1").failure_reason == "deadline"


def test_a_hub_gone_for_good_is_replaced_by_the_watchdog_and_the_run_ends_clean(moto_endpoint, tmp_path):
    from cli.envs import aws as aws_env
    from hub.loop import Hub
    from hub.providers.ec2 import Ec2Provider
    from lambdas.watchdog import run_watchdog

    config = config_on(moto_endpoint, efs_id="fs-0123456789abcdef0", hub_address="10.0.0.10")
    config = config.model_copy(update={"run": config.run.model_copy(update={"deadline_s": 120, "watch_interval_s": 1})})
    clients = AwsClients(config.aws, credentials=LOCAL_CREDENTIALS)
    ensure_resources(clients, 30)
    ec2 = clients.client("ec2")
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    template = f"hub-{uuid.uuid4().hex[:6]}"
    ec2.create_launch_template(LaunchTemplateName=template, LaunchTemplateData={"ImageId": ami})
    env = aws_env.connect(config, clients)
    clock = FakeClock(time.time())

    # The first hub starts the run, launches nodes, and dies (its instance is gone).
    provider = Ec2Provider(ec2, config, ami=ami, user_data=lambda r: "#cloud-config\n")
    first = Hub(
        run_id=RUN,
        config=config,
        table=env.table,
        queue=env.queue,
        results=env.results,
        provider=provider,
        control=env.control(RUN, clock),
        clock=clock,
        out_dir=tmp_path / "runs",
        hub_id="ec2:i-gone",
    )
    first.tick()
    first.tick()  # seeded, nodes launched, hub heartbeat written
    assert [i for i in provider.list(RUN) if i.live]

    # The watchdog notices the heartbeat no longer moves, and starts a hub for the run.
    lam = {
        "GRIDFLEET_REGION": config.aws.region,
        "GRIDFLEET_TABLE": config.aws.table,
        "GRIDFLEET_ENDPOINT_URL": moto_endpoint,
        "GRIDFLEET_HUB_LAUNCH_TEMPLATE": template,
        "GRIDFLEET_HUB_STALE_S": "600",
    }
    factory = lambda settings: AwsClients(config.aws, credentials=LOCAL_CREDENTIALS)  # noqa: E731
    run_watchdog({}, lam, clients_factory=factory, clock=clock)
    clock.advance(601)
    result = run_watchdog({}, lam, clients_factory=factory, clock=clock)
    (restart,) = result["restarted"]
    assert restart["run_id"] == RUN and restart["how"] == "run"
    again = run_watchdog({}, lam, clients_factory=factory, clock=clock)
    assert again["restarted"] == []  # one hub, not one per pass

    # The new hub (what the instance the watchdog started runs) resumes the run to its end.
    second = Hub(
        run_id=RUN,
        config=config,
        table=env.table,
        queue=env.queue,
        results=env.results,
        provider=provider,
        control=env.control(RUN, clock),
        clock=clock,
        out_dir=tmp_path / "runs",
        hub_id=f"ec2:{restart['instance_id']}",
    )
    out = second.run()
    assert out.exit_code == 3 and out.left_running == 0  # moto nodes never boot: the deadline ended the run
    report = check_run(RUN, table=env.table, queue=env.queue, results=env.results, provider=provider, config=config)
    assert report.violations == [], report.violations
