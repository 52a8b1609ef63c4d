"""Each IAM role's code, run against a moto server, with every AWS call it makes recorded.

A role's scenario runs the code that role runs in production (the hub, the node agent,
the two Lambdas) through `AwsClients(on_client=...)`, the seam every client comes from,
and returns the set of `service.Operation` names the code called. The IAM cross-check
compares these with the policies in infra/terraform.

The account's config turns CloudWatch metrics on (`metrics.cloudwatch: true`), so the hub's
gauges and the node's job metrics are published as in production; since publishing is best
effort (a failure is logged, not raised), each scenario checks that its metrics arrived.
"""

from __future__ import annotations

import io
import json
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from fleet.aws.bootstrap import ensure_resources
from fleet.aws.clients import CLIENT_HOOKS, LOCAL_CREDENTIALS, AwsClients
from fleet.clock import FakeClock, SystemClock
from fleet.config import Config, NotifyConfig
from fleet.config.load import parse_config
from fleet.outputs.checkpoint import SaveEvery
from fleet.record import ops
from fleet.record.partition import NodeInfo, RunInfo
from fleet.record.state import SiteSpec
from tests.helpers.iam_eval import request_context

ROOT = Path(__file__).resolve().parents[2]


#: How a call on a DynamoDB index is recorded (instead of the plain `service.Operation`): IAM authorizes it
#: on the index's ARN (`<table arn>/index/<name>`), not on the table's.
INDEX_CALL = "{call} on index/{index}"
#: How a call on an S3 object is recorded: IAM authorizes it on the object's ARN (`<bucket arn>/<key>`), so
#: the policy's key patterns are checked against the keys the code uses.
OBJECT_CALL = "{call} on object/{key}"


class Recorder:
    def __init__(self, userid: str | None = None) -> None:
        self.userid = userid  # the `aws:userid` AWS would see on the calls (an instance role's: role id, instance id)
        self.calls: set[str] = set()
        #: (call as in `calls`, its IAM request context: the condition keys AWS would see, `iam_eval`), every call.
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def hook(self, service: str, client: Any) -> None:
        client.meta.events.register(
            "before-parameter-build", lambda params, model, **_: self._record(service, model, params)
        )

    def _record(self, service: str, model: Any, params: dict[str, Any]) -> None:
        call = f"{service}.{model.name}"
        if service == "dynamodb" and params.get("IndexName"):
            call = INDEX_CALL.format(call=call, index=params["IndexName"])
        elif service == "s3" and params.get("Key"):
            call = OBJECT_CALL.format(call=call, key=params["Key"])
        self.calls.add(call)
        context = request_context(service, params)
        if self.userid is not None:
            context["aws:userid"] = self.userid
        self.requests.append((call, context))

    def clients(self, config: Config) -> AwsClients:
        return AwsClients(config.aws, credentials=LOCAL_CREDENTIALS, on_client=(self.hook,))


def _account(endpoint: str, tmp: Path) -> Config:
    tmp.mkdir(parents=True, exist_ok=True)
    """A config on moto with the resources Terraform would make (made without recording)."""
    setup = AwsClients(
        parse_config(f"aws: {{endpoint_url: '{endpoint}'}}\nsites: [{{id: a, start_url: 'http://a.test'}}]").aws,
        credentials=LOCAL_CREDENTIALS,
    )
    ec2 = setup.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.1.0/24")["Subnet"]["SubnetId"]
    sg = ec2.create_security_group(GroupName=f"g-{uuid.uuid4().hex[:6]}", Description="n", VpcId=vpc)["GroupId"]
    fs = setup.client("efs").create_file_system(CreationToken=uuid.uuid4().hex)["FileSystemId"]
    profile = f"node-{uuid.uuid4().hex[:6]}"
    iam = setup.client("iam")
    iam.create_instance_profile(InstanceProfileName=profile)
    iam.create_role(RoleName=profile, AssumeRolePolicyDocument="{}")  # the nodes' role: its id names their prefix
    iam.add_role_to_instance_profile(InstanceProfileName=profile, RoleName=profile)
    setup.client("ssm").put_parameter(
        Name=f"/gridfleet/ami-{uuid.uuid4().hex[:6]}",
        Type="String",
        Value=ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"],
    )
    ami_param = setup.client("ssm").describe_parameters()["Parameters"][-1]["Name"]
    tag = uuid.uuid4().hex[:8]
    config = parse_config(f"""
run: {{deadline_s: 3, watch_interval_s: 0.5}}
fleet: {{max_nodes: 2}}
metrics: {{cloudwatch: true, namespace: gridfleet-{tag}, interval_s: 1}}
aws: {{endpoint_url: '{endpoint}', stack: gf-{tag}, table: t-{tag}, queue: q-{tag}, bucket: b-{tag}, efs_id: {fs},
       subnet_ids: [{subnet}], security_group_ids: [{sg}], instance_profile: {profile}, ami: '{ami_param}',
       hub_address: 10.9.1.10, imds_url: 'http://127.0.0.1:9', hub_self_stop: terminate}}
sites: [{{id: s1, start_url: 'https://s1.test/'}}, {{id: s2, start_url: 'https://s2.test/'}}]
""")
    made = AwsClients(config.aws, credentials=LOCAL_CREDENTIALS)
    ensure_resources(made, 30)
    # the stock nodes' amazon-efs-utils beside the bundle (`bundle --upload --efs-utils-deb`), which a dry run asks for
    made.client("s3").put_object(Bucket=f"b-{tag}", Key="bundle/amazon-efs-utils.deb", Body=b"!<arch>\n")
    # The stack's end-of-run topic (infra/terraform/notify.tf), as fleet.yaml's notify names it.
    topic = setup.client("sns").create_topic(Name=f"runs-{tag}")["TopicArn"]
    return config.model_copy(update={"notify": NotifyConfig(sns_topic_arn=topic)})


def ship_logs(config: Config, clients: AwsClients, group: str, stream: str) -> None:
    """`gridfleet ship-logs` on an instance: a line into the instance's stream of its role's group, which the stack
    makes (here unrecorded, as Terraform would) and the shipper does not."""
    from fleet.aws.cwlogs import LogSink

    AwsClients(config.aws, credentials=LOCAL_CREDENTIALS).client("logs").create_log_group(logGroupName=group)
    sink = LogSink(clients.client("logs"), group, stream)
    try:
        sink.put("a shipped line", time.time())
        assert sink.flush().ok, f"nothing reached {group}:{stream}"
    finally:
        sink.close()


def published(config: Config) -> set[tuple[str, tuple[str, ...]]]:
    """Unrecorded: (metric name, dimension names) of what reached CloudWatch in the config's namespace."""
    cw = AwsClients(config.aws, credentials=LOCAL_CREDENTIALS).client("cloudwatch")
    pages = cw.get_paginator("list_metrics").paginate(Namespace=config.metrics.namespace)
    return {
        (m["MetricName"], tuple(sorted(d["Name"] for d in m.get("Dimensions", []))))
        for page in pages
        for m in page["Metrics"]
    }


def hub_calls(endpoint: str, tmp: Path) -> set[str]:
    """`gridfleet run` on AWS (to its deadline, then its record into the bucket), the kill ladder, status,
    teardown, dry run, self-stop, and the hub's logs shipped."""
    from cli.commands.run import monitor_for
    from cli.envs import aws as aws_env
    from cli.envs.aws_plan import dry_run
    from embedded.imds_server import ImdsServer
    from hub.control.aws import ConsoleHostKeys
    from hub.loop import Hub
    from hub.teardown import teardown_run

    config = _account(endpoint, tmp)
    rec = Recorder()
    env = aws_env.connect(config, rec.clients(config))
    dry_run(env, "iam-dry", Console(file=io.StringIO()))
    env.preflight()
    ami = env.resolve_ami()
    env.upload_run_config("iam-hub")
    env.ensure_site_access_points()  # as `gridfleet run` does before any node starts: s1's and s2's made...
    env.ensure_site_access_points()  # ...and found by their tags the next time
    provider = env.provider(ami, "10.9.1.10")
    clock = SystemClock()
    control = env.control("iam-hub", clock)
    hub = Hub(
        run_id="iam-hub",
        config=config,
        table=env.table,
        queue=env.queue,
        results=env.results,
        provider=provider,
        control=control,
        clock=clock,
        out_dir=tmp / "runs",
        hub_id="ec2:i-hub",
        monitor=monitor_for("iam-hub", config, env.queue, env.clients, clock),
        writer_role=env.node_role(),
    )  # as `gridfleet run`
    hub.tick()  # start, seed, launch
    # The hub's per-tick read of what moved: the open sites' stamps (the table's index `open`), the records
    # that changed (in batches) and the node items.
    assert set(env.table.open_stamps("iam-hub")) == {"s1", "s2"}
    assert [r.site for r in env.table.get_sites("iam-hub", ["s1", "s2"])] == ["s1", "s2"]
    env.table.read_nodes("iam-hub")
    node = provider.list("iam-hub")[0].id
    _act_as_a_node(config, node, env.node_role())  # s1's result staged (SAVED), s2 hung in URL_CALL, marked for a kill
    CLIENT_HOOKS.append(rec.hook)  # the end-of-run message goes through clients of its own (fleet.aws.notify)
    try:
        outcome = hub.run()  # kills s2 through SSM, requeues it; the deadline: the end message, export, teardown
    finally:
        CLIENT_HOOKS.remove(rec.hook)
    from cli.envs.identity import identify, self_stop
    from cli.report.check import check_run
    from cli.report.page import publish
    from fleet.aws.archive import S3RunArchive

    check_run(
        "iam-hub", table=env.table, queue=env.queue, results=env.results, provider=provider, config=config
    )  # what `gridfleet run` does at the end: the run checks itself...
    publish(outcome.summary_path, S3RunArchive(env.clients.client("s3"), config.aws.bucket))  # ...and keeps its record
    for name in ("summary.json", "report.html"):
        AwsClients(config.aws, credentials=LOCAL_CREDENTIALS).client("s3").head_object(
            Bucket=config.aws.bucket, Key=f"runs/iam-hub/{name}"
        )
    control.kill(node, "s1", 1)  # SSM (moto answers Success)
    ConsoleHostKeys(env.ec2)  # the SSH rung reads host keys from the console output
    env.ec2.get_console_output(InstanceId=node)
    provider.hub_alive(f"ec2:{node}")
    teardown_run("iam-hub", env.table, provider, clock)
    env.table.list_runs()
    hub_instance = env.ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    with ImdsServer() as imds:
        imds.set(hub_instance, local_ipv4="10.9.1.10")
        ident = identify(imds.base_url(hub_instance))
    self_stop("terminate", ident, env.ec2)
    ship_logs(config, rec.clients(config), config.aws.log_group_hub, f"iam-hub/{hub_instance}")
    metrics = published(config)
    assert {("ActiveNodes", ()), ("SitesCompleted", ()), ("RunProgress", ()), ("Kills", ())} <= metrics, metrics
    return rec.calls


def _act_as_a_node(config: Config, node: str, role: str) -> None:
    """Unrecorded: what nodes would have written, so the hub takes its promotion and kill paths."""
    from fleet.aws.results import S3ResultStore
    from fleet.aws.table import DynamoStateTable
    from fleet.outputs.results import staged_result_key, writer_id
    from fleet.record.state import Reason, SiteStatus

    clients = AwsClients(config.aws, credentials=LOCAL_CREDENTIALS)
    table = DynamoStateTable(clients.client("dynamodb"), config.aws.table)
    now = time.time()
    s1 = ops.claim(table, table.get_site("iam-hub", "s1"), node, now)
    run_date = table.get_run("iam-hub").run_date
    staged = staged_result_key(
        writer_id(role, node), "s1", run_date, "iam-hub", s1.attempt, s1.version
    )  # as node.attempt
    S3ResultStore(clients.client("s3"), config.aws.bucket).put_staged(staged, b"{}")
    ops.saved(table, s1, now, staged=s1.version)
    s2 = ops.claim(table, table.get_site("iam-hub", "s2"), node, now)
    s2 = ops.report(table, ops.report(table, s2, SiteStatus.RUNNING, now), SiteStatus.URL_CALL, now)
    ops.request_kill(table, s2, Reason.HANG, now)


def node_calls(endpoint: str, tmp: Path, requests: list[tuple[str, dict[str, Any]]] | None = None) -> set[str]:
    """The node agent crawling a site in a real crawler process, a failed boot reported, and the node's logs
    shipped; each call's request context is added to `requests` when given."""
    from fleet.aws.metrics import CloudWatchSink
    from fleet.aws.queue import SqsSiteQueue
    from fleet.aws.results import S3ResultStore
    from fleet.aws.table import DynamoStateTable
    from node.agent import Agent, AgentSettings
    from node.evidence import Evidence
    from node.main import BOOT_FAILED
    from node.runner import ChildProcess
    from profiles import ProfileStore

    config = _account(endpoint, tmp)
    aws = config.aws
    seed = AwsClients(aws, credentials=LOCAL_CREDENTIALS)
    table = DynamoStateTable(seed.client("dynamodb"), aws.table)
    table.create_run(RunInfo("iam-node", "RUNNING", time.time(), time.time() + 600, "20261121"))
    rec_site = ops.new_site("iam-node", "s1", SiteSpec("http://x.test/", "tests.helpers.crawlers:SavingCrawler"), None)
    table.create_site(rec_site)
    ops.send_next(table, SqsSiteQueue(seed.client("sqs"), aws.queue, aws.dlq_name), rec_site)
    failing = ops.new_site(
        "iam-node", "s2", SiteSpec("http://y.test/", "tests.helpers.crawlers:FailingInSessionCrawler"), None
    )  # an error: the node keeps its evidence, requeues it itself (a new message), then fails it
    table.create_site(failing)
    ops.send_next(table, SqsSiteQueue(seed.client("sqs"), aws.queue, aws.dlq_name), failing)

    me = "AROANODEROLE0000:i-node"  # the instance role session's `aws:userid`, as STS says it on AWS
    rec = Recorder(userid=me)
    clients = rec.clients(config)
    state = tmp / "state"
    state.mkdir(parents=True)
    clock = SystemClock()
    agent = Agent(
        AgentSettings(
            run_id="iam-node",
            instance_id="i-node",
            heartbeat_interval_s=0.2,
            idle_exit_s=1,
            receive_wait_s=0,
            hang_after_s=30,
            save_every=SaveEvery(pages=1),  # a part per page: the parts' keys are among the calls recorded
            writer=me,
        ),
        table=DynamoStateTable(clients.client("dynamodb"), aws.table),
        queue=SqsSiteQueue(clients.client("sqs"), aws.queue, aws.dlq_name),
        results=S3ResultStore(clients.client("s3"), aws.bucket),
        profiles=ProfileStore(tmp / "efs"),
        start_crawl=lambda job, log: ChildProcess(job, log),
        cleanup=lambda *a: None,
        capture=lambda session_id: Evidence(answered=False, why="no browser in this scenario"),
        clock=clock,
        state_dir=state,
        metrics=CloudWatchSink(
            clients.client("cloudwatch") if config.metrics.cloudwatch else None, config.metrics.namespace, clock
        ),
    )  # as node.main builds it
    sys.path.insert(0, str(ROOT))
    agent.run()
    assert table.get_site("iam-node", "s1").site_status.value == "SAVED"  # the hub makes it COMPLETED
    metrics = published(config)
    assert {
        ("JobsCompleted", ("WorkerId",)),
        ("JobDuration", ("WorkerId",)),
        ("Heartbeat", ("WorkerId",)),
        ("JobErrors", ("ErrorType", "WorkerId")),
    } <= metrics, metrics
    # `gridfleet node report-failure`: one item written with the node's own table client
    DynamoStateTable(clients.client("dynamodb"), aws.table).put_node(
        NodeInfo("iam-node", "i-x", BOOT_FAILED, time.time(), time.time(), error="mount failed")
    )
    ship_logs(config, clients, aws.log_group_node, "iam-node/i-node")
    # `gridfleet node site-mounts` (root's helper) finds a claimed site's access point by its tags
    from fleet.aws.efs import site_points

    site_points(clients.client("efs"), aws.efs_id or "", aws.stack, config.fleet.crawl_uid)
    if requests is not None:
        requests.extend(rec.requests)
    return rec.calls


def _hub_template_and_reusable_hub(ec2: Any, stack_tag: dict[str, str]) -> tuple[str, str, str]:
    """The hub launch template, and the reusable hub as the operator makes it: the hub's role and the stack's tag,
    stopped."""
    template = f"hub-{uuid.uuid4().hex[:6]}"
    ec2.create_launch_template(
        LaunchTemplateName=template,
        LaunchTemplateData={
            "ImageId": ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"],
            "InstanceType": "t3.small",
        },
    )
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    reusable = ec2.run_instances(
        ImageId=ami,
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": "gridfleet:role", "Value": "hub"}, stack_tag]}
        ],
    )["Instances"][0]["InstanceId"]
    ec2.stop_instances(InstanceIds=[reusable])
    return template, ami, reusable


def _silent_and_finished_runs(
    table: Any, ec2: Any, ami: str, stack_tag: dict[str, str], clock: FakeClock
) -> tuple[str, str, str, str]:
    """What the watchdog finds: a run whose hub went silent, a finished run's orphan node and stopped hub, and a run
    whose hub is gone past its deadline and the grace (GRIDFLEET_RUN_GRACE_S, 3600 s) with one site open."""
    stale = f"iam-stale-{uuid.uuid4().hex[:6]}"
    table.create_run(
        RunInfo(
            stale,
            "RUNNING",
            clock.now(),
            clock.now() + 7200,
            "20261121",
            hub_id="ec2:i-gone",
            hub_heartbeat=clock.now(),
        )
    )
    done = f"iam-done-{uuid.uuid4().hex[:6]}"
    table.create_run(RunInfo(done, "RUNNING", clock.now(), clock.now() + 7200, "20261121"))
    table.update_run(done, status="FINISHED", finished_at=clock.now())
    orphan, old_hub = (
        ec2.run_instances(
            ImageId=ami,
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [
                        {"Key": "gridfleet:run_id", "Value": done},
                        {"Key": "gridfleet:role", "Value": role},
                        stack_tag,
                    ],
                }
            ],
        )["Instances"][0]["InstanceId"]
        for role in ("node", "hub")
    )
    ec2.stop_instances(InstanceIds=[old_hub])  # a hub left stopped: it bills for its volume every day
    gone = f"iam-gone-{uuid.uuid4().hex[:6]}"
    table.create_run(
        RunInfo(
            gone,
            "RUNNING",
            clock.now() - 20000,
            clock.now() - 3700,
            "20261121",
            hub_id="ec2:i-lost",
            hub_heartbeat=clock.now() - 9000,
        )
    )
    table.create_site(ops.new_site(gone, "s1", SiteSpec("http://x.test/"), None))
    return stale, gone, orphan, old_hub


def lambda_calls(endpoint: str, tmp: Path) -> dict[str, set[str]]:
    """The starter and the watchdog, through their handlers' code paths: launching a hub, starting the
    reusable hub, restarting a silent run's hub (from the template, then the reusable hub), ending a run
    abandoned past its deadline (its open site FAILED, its summary into the bucket), terminating orphans and
    stopped instances, and stopping the reusable hub."""
    from fleet.aws.table import DynamoStateTable
    from lambdas.starter import run_starter
    from lambdas.watchdog import run_watchdog

    config = _account(endpoint, tmp)
    setup = AwsClients(config.aws, credentials=LOCAL_CREDENTIALS)
    ec2 = setup.client("ec2")
    stack_tag = {"Key": "gridfleet:stack", "Value": config.aws.stack}
    template, ami, reusable = _hub_template_and_reusable_hub(ec2, stack_tag)
    # The environment Terraform gives both functions (infra/terraform/lambda.tf), on moto.
    base = {
        "GRIDFLEET_REGION": config.aws.region,
        "GRIDFLEET_STACK": config.aws.stack,
        "GRIDFLEET_TABLE": config.aws.table,
        "GRIDFLEET_BUCKET": config.aws.bucket,
        "GRIDFLEET_ENDPOINT_URL": endpoint,
        "GRIDFLEET_HUB_LAUNCH_TEMPLATE": template,
        "GRIDFLEET_HUB_STALE_S": "60",
        "GRIDFLEET_NOTIFY_TOPIC_ARN": config.notify.sns_topic_arn or "",
    }
    recs = {"starter": Recorder(), "watchdog": Recorder()}

    def factory(name: str) -> Callable[[Any], AwsClients]:
        return lambda settings: AwsClients(
            parse_config(
                f"aws: {{region: {settings.region}, endpoint_url: '{endpoint}', table: "
                f"{settings.table}}}\nsites: [{{id: a, start_url: 'http://a.test'}}]"
            ).aws,
            credentials=LOCAL_CREDENTIALS,
            on_client=(recs[name].hook,),
        )

    clock = FakeClock(time.time())
    # The starter: a hub from the launch template, and the reusable stopped hub started again.
    run_starter({"run_id": f"iam-{uuid.uuid4().hex[:6]}"}, base, clients_factory=factory("starter"), clock=clock)
    run_starter(
        {"run_id": f"iam-{uuid.uuid4().hex[:6]}"},
        {**base, "GRIDFLEET_HUB_INSTANCE_ID": reusable},
        clients_factory=factory("starter"),
        clock=clock,
    )
    # The watchdog: a run whose hub went silent (restarted once it is stale) and a finished run's orphan.
    table = DynamoStateTable(setup.client("dynamodb"), config.aws.table)
    stale, gone, orphan, old_hub = _silent_and_finished_runs(table, ec2, ami, stack_tag, clock)
    watchdog_env = {**base, "GRIDFLEET_HUB_INSTANCE_ID": reusable}

    def watchdog_pass() -> dict[str, Any]:
        return run_watchdog({}, watchdog_env, clients_factory=factory("watchdog"), clock=clock)

    def state(instance_id: str) -> str:
        return ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]["State"]["Name"]

    # The abandoned run is ended, the finished run's node and the stopped hub go, the silent hub is noted.
    first = watchdog_pass()
    assert table.get_site(gone, "s1").run_status.value == "FAILED"
    setup.client("s3").head_object(Bucket=config.aws.bucket, Key=f"runs/{gone}/summary.json")
    assert (state(orphan), state(old_hub)) == ("terminated", "terminated"), first
    clock.advance(61)
    # Stale: a new hub from the template (the reusable hub is running another run's), and the reusable hub,
    # whose run has no item, is stopped rather than terminated.
    second = watchdog_pass()
    assert [(r["run_id"], r["how"]) for r in second["restarted"]] == [(stale, "run")], second
    assert [e["instance_id"] for e in second["stopped"]] == [reusable], second
    ec2.terminate_instances(InstanceIds=[second["restarted"][0]["instance_id"]])  # that hub dies too
    clock.advance(61)
    third = watchdog_pass()  # stale again: now the stopped reusable hub is tagged with the run and started
    restarted = [(r["run_id"], r["instance_id"], r["how"]) for r in third["restarted"]]
    assert restarted == [(stale, reusable, "start")], third
    return {name: r.calls for name, r in recs.items()}


if __name__ == "__main__":  # print what each role calls (for writing policies)
    import tempfile

    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
    try:
        with tempfile.TemporaryDirectory() as t:
            result = {
                "hub": hub_calls(url, Path(t) / "h"),
                "node": node_calls(url, Path(t) / "n"),
                **lambda_calls(url, Path(t) / "l"),
            }
        print(json.dumps({k: sorted(v) for k, v in result.items()}, indent=1))
    finally:
        server.stop()
