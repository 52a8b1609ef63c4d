"""The starter and watchdog Lambdas against EC2 and DynamoDB on a moto server.

The handlers are called directly (invoking a Lambda needs Docker). EC2 state is
shared by every test of this module, so each test uses its own table and run
ids and looks only at instances tagged with its run ids. Time is a FakeClock
that starts at the wall time, so EC2 launch times (moto's wall clock) and the
watchdog's clock agree until a test moves the clock.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

import pytest
from botocore.exceptions import ClientError

from fleet.aws import ec2 as ec2_api
from fleet.aws.archive import S3RunArchive
from fleet.aws.bootstrap import ensure_resources
from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.aws.table import DynamoStateTable
from fleet.clock import FakeClock
from fleet.config.aws import AwsConfig
from fleet.record import ops
from fleet.record.partition import RunInfo
from fleet.record.state import RunState, SiteSpec
from fleet.record.tags import TAG_ROLE, TAG_RUN_ID, TAG_STACK
from lambdas import starter, watchdog
from lambdas.orphans import FINISHING_HUB_S
from lambdas.starter import LambdaSettings, client_token, run_starter, start_hub
from lambdas.watchdog import claim_restart, heartbeat_token, orphan_reason, release_restart, watch
from tests.helpers.wait import wait_for

from .conftest import NamedClients

REGION = "ap-northeast-2"
STALE_S = 600.0
GRACE_S = 3600.0
_seq = itertools.count()


@pytest.fixture(scope="module")
def endpoint(moto_endpoint):
    return moto_endpoint


@pytest.fixture(scope="module")
def clients(endpoint) -> AwsClients:
    return AwsClients(AwsConfig(region=REGION, endpoint_url=endpoint), credentials=LOCAL_CREDENTIALS)


@pytest.fixture(scope="module")
def template(clients) -> str:
    ec2 = clients.client("ec2")
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    name = f"gridfleet-hub-{uuid.uuid4().hex[:8]}"
    ec2.create_launch_template(
        LaunchTemplateName=name, LaunchTemplateData={"ImageId": image, "InstanceType": "t3.micro"}
    )
    return name


# --- helpers --------------------------------------------------------------------------


class Spy:
    """A client that records the write calls made through it; everything else is the real client's."""

    RECORDED = ("run_instances", "start_instances", "stop_instances", "terminate_instances", "create_tags")

    def __init__(self, client: Any):
        self._client = client
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name not in self.RECORDED:
            return attr

        def call(**kwargs: Any) -> Any:
            self.calls.append((name, kwargs))
            return attr(**kwargs)

        return call

    def called(self, name: str) -> list[dict[str, Any]]:
        return [kw for n, kw in self.calls if n == name]


class HidingEc2(Spy):
    """An EC2 client whose DescribeInstances does not list some instances (a view from before they existed)."""

    def __init__(self, client: Any, hidden: set[str]):
        super().__init__(client)
        self._hidden = hidden

    def get_paginator(self, name: str) -> Any:
        real = self._client.get_paginator(name)
        hidden = self._hidden

        class Paginator:
            def paginate(self, **kwargs: Any):
                for page in real.paginate(**kwargs):
                    for r in page.get("Reservations", []):
                        r["Instances"] = [i for i in r["Instances"] if i["InstanceId"] not in hidden]
                    yield page

        return Paginator()


class FrozenReads:
    """A DynamoDB client whose GetItem answers with responses recorded earlier (a stale read)."""

    def __init__(self, client: Any, recorded: dict[str, dict[str, Any]]):
        self._client = client
        self._recorded = recorded

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def get_item(self, **kwargs: Any) -> dict[str, Any]:
        key = kwargs["Key"]["run_id"]["S"]
        return self._recorded[key] if key in self._recorded else self._client.get_item(**kwargs)


@dataclass
class Rig:
    settings: LambdaSettings
    ec2: Spy
    ddb: Any
    table: DynamoStateTable
    clock: FakeClock
    template: str

    def run_id(self) -> str:
        return f"r{next(_seq)}-{uuid.uuid4().hex[:8]}"

    def create_run(
        self, run_id: str, *, status: str = "RUNNING", heartbeat: float | None = None, deadline_in_s: float = 6 * 3600
    ) -> None:
        now = self.clock.now()
        assert self.table.create_run(
            RunInfo(
                run_id,
                "RUNNING",
                now,
                now + deadline_in_s,
                "20270101",
                hub_id="i-previous",
                hub_heartbeat=heartbeat or now,
            )
        )
        if status != "RUNNING":  # ended long enough ago that its hub has had the time to archive it and go
            self.table.update_run(run_id, status=status, finished_at=now - FINISHING_HUB_S - 1)

    def beat(self, run_id: str, value: float) -> None:
        self.table.update_run(run_id, hub_heartbeat=value)

    def launch(self, run_id: str | None, role: str | None, n: int = 1, stack: str | None = "") -> list[str]:
        """Instances tagged like the stack's (`stack` "": this rig's stack; None: no stack tag)."""
        tags = [{"Key": "Name", "Value": f"test-{role}"}]
        stack = self.settings.stack if stack == "" else stack
        if stack is not None:
            tags.append({"Key": TAG_STACK, "Value": stack})
        if run_id is not None:
            tags.append({"Key": TAG_RUN_ID, "Value": run_id})
        if role is not None:
            tags.append({"Key": TAG_ROLE, "Value": role})
        out = self.ec2._client.run_instances(
            LaunchTemplate={"LaunchTemplateName": self.template},
            MinCount=n,
            MaxCount=n,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        )
        return [i["InstanceId"] for i in out["Instances"]]

    def instances(self, run_id: str, role: str | None = None) -> dict[str, str]:
        """instance id -> state of every instance tagged with the run (and role)."""
        filters = [{"Name": f"tag:{TAG_RUN_ID}", "Values": [run_id]}]
        if role:
            filters.append({"Name": f"tag:{TAG_ROLE}", "Values": [role]})
        return self.states(Filters=filters)

    def states(self, **kwargs: Any) -> dict[str, str]:
        out = self.ec2._client.describe_instances(**kwargs)
        return {i["InstanceId"]: i["State"]["Name"] for r in out["Reservations"] for i in r["Instances"]}

    def live(self, run_id: str, role: str | None = None) -> list[str]:
        return sorted(i for i, s in self.instances(run_id, role).items() if s in ("pending", "running"))

    def terminate(self, *ids: str) -> None:
        self.ec2._client.terminate_instances(InstanceIds=list(ids))

    def tags(self, instance_id: str) -> dict[str, str]:
        inst = self.ec2._client.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
        return {t["Key"]: t["Value"] for t in inst.get("Tags", [])}

    def watch(self, **kwargs: Any) -> dict[str, Any]:
        return watch(
            kwargs.get("settings", self.settings),
            kwargs.get("ec2", self.ec2),
            kwargs.get("table", self.table),
            kwargs.get("clock", self.clock),
            kwargs.get("archive"),
        )

    def start(self, run_id: str | None = None, settings: LambdaSettings | None = None) -> dict[str, Any]:
        return start_hub(settings or self.settings, self.ec2, self.table, self.clock, run_id=run_id)


def mine(entries: list[dict[str, Any]], *run_ids: str) -> list[dict[str, Any]]:
    """The entries of a watch result that are about these runs (EC2 is shared by the whole module)."""
    return [e for e in entries if e["run_id"] in run_ids]


@pytest.fixture
def rig(clients, template) -> Rig:
    aws = AwsConfig(
        region=REGION,
        endpoint_url=clients.aws.endpoint_url,
        table=f"t-{uuid.uuid4().hex}",
        queue=f"q-{uuid.uuid4().hex}",
        bucket=f"b-{uuid.uuid4().hex}",
    )
    ensure_resources(NamedClients(clients, aws), visibility_timeout_s=30)
    ddb = clients.client("dynamodb")
    table = DynamoStateTable(ddb, aws.table)
    # A stack of its own per test: EC2 is shared by the module, and a watchdog touches only its stack's instances.
    settings = LambdaSettings(
        region=REGION,
        table=aws.table,
        stack=f"s{uuid.uuid4().hex[:8]}",
        bucket=aws.bucket,
        endpoint_url=aws.endpoint_url,
        hub_launch_template=template,
        hub_stale_s=STALE_S,
        run_grace_s=GRACE_S,
    )
    return Rig(settings, Spy(clients.client("ec2")), ddb, table, FakeClock(start=time.time()), template)


# --- the starter ----------------------------------------------------------------------------


def test_starter_runs_a_hub_from_the_template_tagged_with_the_run(rig):
    run_id = rig.run_id()

    out = rig.start(run_id)

    assert out == {"action": "started", "run_id": run_id, "instance_id": out["instance_id"], "how": "run"}
    assert rig.live(run_id, "hub") == [out["instance_id"]]
    tags = rig.tags(out["instance_id"])
    assert tags[TAG_ROLE] == "hub"
    assert tags[TAG_RUN_ID] == run_id
    assert tags[TAG_STACK] == rig.settings.stack
    assert tags["Name"] == f"{rig.settings.stack}-hub-{run_id}"
    (call,) = rig.ec2.called("run_instances")
    assert call["LaunchTemplate"] == {"LaunchTemplateName": rig.template}
    assert (call["MinCount"], call["MaxCount"]) == (1, 1)
    assert call["ClientToken"] == client_token(run_id, 0)


def test_a_second_start_is_refused_while_the_hub_is_live(rig):
    run_id = rig.run_id()
    first = rig.start(run_id)

    second = rig.start(run_id)

    assert second["action"] == "refused"
    assert second["instance_id"] == first["instance_id"]
    assert second["run_id"] == run_id and first["instance_id"] in second["reason"]
    assert rig.live(run_id, "hub") == [first["instance_id"]]
    assert len(rig.ec2.called("run_instances")) == 1


def test_a_finished_run_is_skipped(rig):
    run_id = rig.run_id()
    rig.create_run(run_id, status="FINISHED")

    out = rig.start(run_id)

    assert out["action"] == "skipped" and out["run_id"] == run_id and "FINISHED" in out["reason"]
    assert rig.instances(run_id) == {}
    assert rig.ec2.calls == []


def test_a_later_hub_of_the_same_run_gets_a_new_client_token(rig):
    run_id = rig.run_id()
    rig.create_run(run_id)
    first = rig.start(run_id)
    rig.terminate(first["instance_id"])

    second = rig.start(run_id)

    assert second["action"] == "started" and second["instance_id"] != first["instance_id"]
    tokens = [c["ClientToken"] for c in rig.ec2.called("run_instances")]
    assert tokens == [client_token(run_id, 0), client_token(run_id, 1)]
    assert rig.table.get_run_watch(run_id).hub_starts == 2


def test_client_tokens_are_short_enough_and_distinct():
    long_id = "x" * 64
    tokens = {client_token(long_id, n) for n in range(3)} | {client_token("2027-01-15", n) for n in range(3)}
    assert len(tokens) == 6
    assert all(len(t) <= 64 for t in tokens)
    assert client_token("2027-01-15", 0) == client_token("2027-01-15", 0)


def test_the_default_run_id_is_todays_utc_date(rig):
    clock = FakeClock(start=1_800_000_000.0 + 3600 * 15)  # 2027-01-15T23:00Z

    out = start_hub(rig.settings, rig.ec2, rig.table, clock)

    assert out["run_id"] == "2027-01-15"
    assert rig.tags(out["instance_id"])[TAG_RUN_ID] == "2027-01-15"


def test_starting_a_stopped_hub_instance_tags_and_starts_it(rig):
    (hub_iid,) = rig.launch(None, None)
    rig.ec2._client.stop_instances(InstanceIds=[hub_iid])
    wait_for(lambda: rig.states(InstanceIds=[hub_iid])[hub_iid] == "stopped")
    settings = replace(rig.settings, hub_instance_id=hub_iid)
    run_id = rig.run_id()

    out = rig.start(run_id, settings)

    assert out == {"action": "started", "run_id": run_id, "instance_id": hub_iid, "how": "start"}
    assert rig.states(InstanceIds=[hub_iid])[hub_iid] in ("pending", "running")
    tags = rig.tags(hub_iid)
    assert (tags[TAG_RUN_ID], tags[TAG_ROLE]) == (run_id, "hub")
    assert rig.ec2.called("run_instances") == []
    assert rig.start(run_id, settings)["action"] == "refused"


def test_a_hub_instance_that_is_not_stopped_falls_back_to_the_template_or_is_refused(rig):
    (busy,) = rig.launch(rig.run_id(), "hub")  # running, for another run
    run_id = rig.run_id()

    refused = rig.start(run_id, replace(rig.settings, hub_instance_id=busy, hub_launch_template=None))
    assert refused["action"] == "refused" and busy in refused["reason"] and "running" in refused["reason"]
    assert rig.instances(run_id) == {}

    out = rig.start(run_id, replace(rig.settings, hub_instance_id=busy))
    assert out["how"] == "run" and out["instance_id"] != busy
    assert rig.live(run_id, "hub") == [out["instance_id"]]

    other = rig.run_id()
    missing = rig.start(other, replace(rig.settings, hub_instance_id="i-0123456789abcdef0"))
    assert missing["action"] == "started" and missing["how"] == "run"


# --- the watchdog: stale hubs ------------------------------------------------------------


def test_a_fresh_heartbeat_needs_nothing(rig):
    run_id = rig.run_id()
    rig.create_run(run_id, heartbeat=rig.clock.now())

    first = rig.watch()
    item = rig.table.get_run_watch(run_id)
    assert item.seen_hb == heartbeat_token(item.run)
    assert item.seen_since == pytest.approx(rig.clock.now(), abs=0.01)
    for _ in range(4):
        rig.clock.advance(STALE_S / 2)
        rig.beat(run_id, rig.clock.now())
        out = rig.watch()
        assert mine(out["restarted"], run_id) == [] and mine(out["terminated"], run_id) == []
        assert mine(out["observed"], run_id) == [{"run_id": run_id, "state": "fresh", "unchanged_s": 0.0}]
    assert mine(first["observed"], run_id)[0]["state"] == "fresh"
    assert rig.instances(run_id) == {}
    assert rig.ec2.called("run_instances") == []


def test_a_stale_hub_is_restarted_once(rig):
    run_id = rig.run_id()
    rig.create_run(run_id)
    old_hub = rig.start(run_id)["instance_id"]
    rig.watch()  # the first observation of the heartbeat
    rig.terminate(old_hub)

    rig.clock.advance(STALE_S - 1)
    early = rig.watch()
    assert mine(early["restarted"], run_id) == []
    assert mine(early["observed"], run_id)[0]["state"] == "ok"

    rig.clock.advance(2)
    out = rig.watch()

    (restart,) = mine(out["restarted"], run_id)
    assert restart["how"] == "run" and restart["instance_id"] != old_hub
    assert rig.live(run_id, "hub") == [restart["instance_id"]]
    assert rig.tags(restart["instance_id"])[TAG_RUN_ID] == run_id
    item = rig.table.get_run_watch(run_id)
    assert item.restart_at == pytest.approx(rig.clock.now(), abs=0.01)
    tokens = [c["ClientToken"] for c in rig.ec2.called("run_instances")]
    assert len(tokens) == 2 and tokens[0] != tokens[1]

    again = rig.watch()
    assert mine(again["restarted"], run_id) == []
    rig.clock.advance(STALE_S + 1)  # still no heartbeat, but the new hub is alive: left to boot
    later = rig.watch()
    assert mine(later["restarted"], run_id) == []
    assert mine(later["observed"], run_id)[0]["state"] == "stale-hub-alive"
    assert rig.live(run_id, "hub") == [restart["instance_id"]]


def test_a_changing_heartbeat_is_never_stale_whatever_the_hubs_clock_says(rig):
    run_id = rig.run_id()
    rig.create_run(run_id, heartbeat=12_345.0)  # the hub's clock is decades behind the watchdog's

    out = rig.watch()
    assert mine(out["restarted"], run_id) == []
    for hb in (12_350.0, 9e9, 9e9 + 5, 7.0, 7.5, 1.0):
        rig.clock.advance(2 * STALE_S)  # long gaps on the watchdog's clock; the value still moved
        rig.beat(run_id, hb)
        out = rig.watch()
        assert mine(out["restarted"], run_id) == []
        assert mine(out["observed"], run_id)[0]["state"] == "fresh"

    rig.clock.advance(STALE_S / 2)  # unchanged, and decades old by the watchdog's clock: not stale yet
    out = rig.watch()
    assert mine(out["observed"], run_id)[0]["state"] == "ok"
    assert mine(out["restarted"], run_id) == []
    assert rig.instances(run_id) == {}

    rig.beat(run_id, 9e9 + 10)  # far in the watchdog's future, and then it stops moving
    rig.watch()
    rig.clock.advance(STALE_S + 1)
    out = rig.watch()
    assert [r["run_id"] for r in mine(out["restarted"], run_id)] == [run_id]


def test_racing_watchdogs_start_one_hub(rig):
    run_id = rig.run_id()
    rig.create_run(run_id)
    rig.watch()
    rig.clock.advance(STALE_S + 1)
    key = {"run_id": {"S": f"#run:{run_id}"}, "Site": {"S": "#run"}}  # the run item, in the run's hub partition
    before = rig.ddb.get_item(TableName=rig.settings.table, Key=key, ConsistentRead=True)

    first = rig.watch()
    (restart,) = mine(first["restarted"], run_id)
    # The second watchdog read the run item and the instances before the first one's restart was visible.
    late_ec2 = HidingEc2(rig.ec2._client, hidden={restart["instance_id"]})
    late_table = DynamoStateTable(FrozenReads(rig.ddb, {f"#run:{run_id}": before}), rig.settings.table)
    second = rig.watch(ec2=late_ec2, table=late_table, clock=FakeClock(start=rig.clock.now() + 0.5))

    assert mine(second["restarted"], run_id) == []
    assert mine(second["observed"], run_id)[0]["state"] == "restart-claimed-elsewhere"
    assert late_ec2.called("run_instances") == []
    assert rig.live(run_id, "hub") == [restart["instance_id"]]


def test_only_one_of_two_claims_from_the_same_observation_wins(rig):
    run_id = rig.run_id()
    rig.create_run(run_id)
    rig.watch()
    item = rig.table.get_run_watch(run_id)
    now = rig.clock.now() + STALE_S + 1

    assert claim_restart(rig.table, item, now) is True
    assert claim_restart(rig.table, item, now + 1) is False
    stored = rig.table.get_run_watch(run_id)
    assert stored.restart_at == pytest.approx(now, abs=0.01)
    assert stored.seen_since == pytest.approx(now, abs=0.01)

    assert release_restart(rig.table, item, now) is True
    assert rig.table.get_run_watch(run_id).restart_at is None
    assert claim_restart(rig.table, item, now + 2) is True


def test_a_heartbeat_written_after_the_read_cancels_the_claim(rig):
    run_id = rig.run_id()
    rig.create_run(run_id)
    rig.watch()
    item = rig.table.get_run_watch(run_id)
    rig.beat(run_id, rig.clock.now() + 1)

    assert claim_restart(rig.table, item, rig.clock.now() + STALE_S + 1) is False


def test_a_failed_restart_releases_its_claim(rig):
    run_id = rig.run_id()
    rig.create_run(run_id)
    rig.watch()
    rig.clock.advance(STALE_S + 1)
    broken = replace(rig.settings, hub_launch_template="no-such-template")

    with pytest.raises(ClientError):  # EC2 knows no such launch template
        rig.watch(settings=broken)

    assert rig.table.get_run_watch(run_id).restart_at is None
    out = rig.watch()
    assert [r["run_id"] for r in mine(out["restarted"], run_id)] == [run_id]


def test_an_abandoned_run_is_not_restarted(rig):
    run_id = rig.run_id()
    rig.create_run(run_id, deadline_in_s=60)
    rig.watch()
    rig.clock.advance(60 + GRACE_S + 1)

    out = rig.watch()

    assert mine(out["restarted"], run_id) == []
    assert mine(out["observed"], run_id) == [{"run_id": run_id, "state": "abandoned"}]
    assert rig.instances(run_id) == {}


def test_an_overdue_run_is_told_to_the_topic_once(rig, clients):
    sns, sqs = clients.client("sns"), clients.client("sqs")
    topic = sns.create_topic(Name=f"runs-{uuid.uuid4().hex[:12]}")["TopicArn"]
    url = sqs.create_queue(QueueName=f"notes-{uuid.uuid4().hex[:12]}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
    settings = replace(rig.settings, notify_topic_arn=topic)
    archive = S3RunArchive(clients.client("s3"), settings.bucket)
    run_id = rig.run_id()
    rig.create_run(run_id, deadline_in_s=60)
    spec = SiteSpec("https://a.example/")
    assert rig.table.create_site(ops.new_site(run_id, "a", spec, rig.clock.now() + 86400))
    rig.clock.advance(60 + GRACE_S + 1)

    def notes() -> list[dict[str, Any]]:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
        for m in got:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        return [json.loads(m["Body"]) for m in got]

    out = watch(settings, rig.ec2, rig.table, rig.clock, archive, sns)
    (ended,) = mine(out["ended"], run_id)
    assert ended["notified"] == [f"sns:{topic}"]
    (note,) = notes()
    assert note["Subject"] == f"gridfleet run {run_id} overdue: ended by the watchdog, 1 site(s) FAILED (deadline)"
    assert "- a: deadline" in note["Message"]
    assert note["Message"].endswith(f"summary: s3://{settings.bucket}/runs/{run_id}/summary.json")

    again = watch(settings, rig.ec2, rig.table, rig.clock, archive, sns)  # the run is FINISHED now
    assert mine(again["ended"], run_id) == [] and notes() == []


def test_only_the_last_lookback_runs_are_watched(rig):
    old, new = rig.run_id(), rig.run_id()
    rig.create_run(old)
    rig.clock.advance(1)
    rig.create_run(new)
    settings = replace(rig.settings, lookback_runs=1)
    rig.watch(settings=settings)
    rig.clock.advance(STALE_S + 1)

    out = rig.watch(settings=settings)

    assert [r["run_id"] for r in mine(out["restarted"], old, new)] == [new]
    assert rig.instances(old) == {}


# --- the watchdog: orphans ----------------------------------------------------------------


def test_orphans_are_terminated_and_live_runs_left_alone(rig):
    finished, no_item, abandoned, healthy = (rig.run_id() for _ in range(4))
    rig.create_run(finished, status="FINISHED")
    rig.create_run(abandoned, deadline_in_s=-(GRACE_S + 10))
    rig.create_run(healthy)
    doomed = {
        finished: rig.launch(finished, "hub") + rig.launch(finished, "node", 2),
        abandoned: rig.launch(abandoned, "hub") + rig.launch(abandoned, "node"),
    }
    waiting = rig.launch(no_item, "hub") + rig.launch(no_item, "node")
    kept = rig.launch(healthy, "hub") + rig.launch(healthy, "node", 2)
    untagged = rig.launch(None, "node") + rig.launch(None, None)

    out = rig.watch()

    gone = {e["instance_id"]: e for e in mine(out["terminated"], finished, no_item, abandoned, healthy)}
    assert set(gone) == set(doomed[finished] + doomed[abandoned])
    assert {gone[i]["reason"] for i in doomed[finished]} == {"run FINISHED"}
    assert {gone[i]["role"] for i in doomed[finished]} == {"hub", "node"}
    assert {gone[i]["reason"] for i in doomed[abandoned]} == {"run FINISHED"}  # ended by this very pass
    assert [e["run_id"] for e in out["ended"] if e["run_id"] in (finished, no_item, abandoned, healthy)] == [abandoned]
    for run_id, ids in doomed.items():
        assert set(rig.instances(run_id)) == set(ids)
        assert set(rig.instances(run_id).values()) <= {"shutting-down", "terminated"}
    assert rig.live(no_item) == sorted(waiting)  # just launched: its hub may not have created the run item yet
    assert rig.live(healthy) == sorted(kept)
    assert mine(out["restarted"], abandoned) == []

    rig.clock.advance(STALE_S + 1)
    rig.beat(healthy, rig.clock.now())
    out = rig.watch()

    assert {e["instance_id"] for e in mine(out["terminated"], no_item, healthy)} == set(waiting)
    assert {e["reason"] for e in mine(out["terminated"], no_item)} == {"no run item"}
    assert rig.live(no_item) == []
    assert rig.live(healthy) == sorted(kept)
    assert all(rig.states(InstanceIds=[i])[i] == "running" for i in untagged)
    terminated = {i for c in rig.ec2.called("terminate_instances") for i in c["InstanceIds"]}
    assert not terminated & set(untagged + kept)


def test_orphans_are_terminated_in_batches(rig, monkeypatch):
    monkeypatch.setattr(ec2_api, "TERMINATE_BATCH", 2)
    run_id = rig.run_id()
    rig.create_run(run_id, status="FINISHED")
    ids = rig.launch(run_id, "node", 5)

    out = rig.watch()

    assert {e["instance_id"] for e in mine(out["terminated"], run_id)} == set(ids)
    batches = [c["InstanceIds"] for c in rig.ec2.called("terminate_instances")]
    assert all(len(b) <= 2 for b in batches)
    assert set(ids) <= {i for b in batches for i in b}
    assert rig.live(run_id) == []


def test_the_configured_hub_instance_of_a_finished_run_is_stopped_not_terminated(rig):
    run_id = rig.run_id()
    rig.create_run(run_id, status="FINISHED")
    (hub_iid,) = rig.launch(run_id, "hub")
    nodes = rig.launch(run_id, "node", 2)

    out = rig.watch(settings=replace(rig.settings, hub_instance_id=hub_iid))

    assert {e["instance_id"] for e in mine(out["terminated"], run_id)} == set(nodes)
    assert [e["instance_id"] for e in mine(out["stopped"], run_id)] == [hub_iid]
    assert rig.states(InstanceIds=[hub_iid])[hub_iid] in ("stopping", "stopped")


def test_orphan_reason():
    s = LambdaSettings(region=REGION, hub_launch_template="t", hub_stale_s=100, run_grace_s=50)
    running = RunInfo("r", RunState.RUNNING, 0, deadline_at=1000, run_date="20270101")
    assert orphan_reason(None, launched_at=0, now=99, settings=s) is None
    assert orphan_reason(None, launched_at=0, now=100, settings=s) == "no run item"
    assert orphan_reason(replace(running, status=RunState.FINISHED), 0, 10, s) == "run FINISHED"
    assert orphan_reason(running, 0, 1050, s) is None
    assert "abandoned" in orphan_reason(running, 0, 1051, s)


# --- handlers and settings ---------------------------------------------------------------


def test_settings_from_env_defaults_and_values():
    s = LambdaSettings.from_env(
        {"GRIDFLEET_REGION": "eu-west-1", "GRIDFLEET_HUB_INSTANCE_ID": "i-1", "GRIDFLEET_ENDPOINT_URL": ""}
    )
    assert s == LambdaSettings(
        region="eu-west-1",
        table="TrendlyzeStatus",
        endpoint_url=None,
        hub_launch_template=None,
        hub_instance_id="i-1",
        hub_stale_s=600.0,
        run_grace_s=3600.0,
        lookback_runs=7,
    )
    s = LambdaSettings.from_env(
        {
            "GRIDFLEET_REGION": "eu-west-1",
            "GRIDFLEET_TABLE": "T",
            "GRIDFLEET_ENDPOINT_URL": "http://127.0.0.1:1",
            "GRIDFLEET_HUB_LAUNCH_TEMPLATE": "lt",
            "GRIDFLEET_HUB_STALE_S": "90",
            "GRIDFLEET_RUN_GRACE_S": "10.5",
            "GRIDFLEET_LOOKBACK_RUNS": "3",
        }
    )
    assert (s.table, s.endpoint_url, s.hub_launch_template, s.hub_stale_s, s.run_grace_s, s.lookback_runs) == (
        "T",
        "http://127.0.0.1:1",
        "lt",
        90.0,
        10.5,
        3,
    )


@pytest.mark.parametrize(
    "env, names",
    [
        ({"GRIDFLEET_HUB_LAUNCH_TEMPLATE": "lt"}, ["GRIDFLEET_REGION"]),
        ({"GRIDFLEET_REGION": " "}, ["GRIDFLEET_REGION"]),
        ({"GRIDFLEET_REGION": "eu-west-1"}, ["GRIDFLEET_HUB_LAUNCH_TEMPLATE", "GRIDFLEET_HUB_INSTANCE_ID"]),
        (
            {"GRIDFLEET_REGION": "eu-west-1", "GRIDFLEET_HUB_LAUNCH_TEMPLATE": "lt", "GRIDFLEET_HUB_STALE_S": "ten"},
            ["GRIDFLEET_HUB_STALE_S"],
        ),
        (
            {"GRIDFLEET_REGION": "eu-west-1", "GRIDFLEET_HUB_LAUNCH_TEMPLATE": "lt", "GRIDFLEET_LOOKBACK_RUNS": "0"},
            ["GRIDFLEET_LOOKBACK_RUNS"],
        ),
        (
            {"GRIDFLEET_REGION": "eu-west-1", "GRIDFLEET_HUB_LAUNCH_TEMPLATE": "lt", "GRIDFLEET_NOTIFY_TOPIC_ARN": "t"},
            ["GRIDFLEET_NOTIFY_TOPIC_ARN"],
        ),
    ],
)
def test_bad_settings_name_the_variable(env, names):
    with pytest.raises(ValueError) as err:
        LambdaSettings.from_env(env)
    for name in names:
        assert name in str(err.value)


@pytest.fixture
def lambda_env(monkeypatch, rig):
    """The environment of a Lambda pointed at the moto server, with the test's table."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    env = {
        "AWS_ACCESS_KEY_ID": LOCAL_CREDENTIALS.access_key_id,
        "AWS_SECRET_ACCESS_KEY": LOCAL_CREDENTIALS.secret_access_key,
        "AWS_EC2_METADATA_DISABLED": "true",
        "GRIDFLEET_REGION": REGION,
        "GRIDFLEET_TABLE": rig.settings.table,
        "GRIDFLEET_ENDPOINT_URL": rig.settings.endpoint_url,
        "GRIDFLEET_HUB_LAUNCH_TEMPLATE": rig.template,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def test_handlers_read_the_environment(rig, lambda_env):
    run_id = rig.run_id()

    out = starter.handler({"run_id": run_id}, None)

    assert out["action"] == "started" and out["run_id"] == run_id
    assert rig.live(run_id, "hub") == [out["instance_id"]]
    assert starter.handler({"run_id": run_id}, None)["action"] == "refused"
    result = watchdog.handler({}, None)
    assert set(result) >= {"restarted", "terminated", "observed"}
    assert rig.live(run_id, "hub") == [out["instance_id"]]  # launched just now: not an orphan yet


def test_handlers_fail_clearly_without_a_region(lambda_env, monkeypatch, caplog):
    monkeypatch.delenv("GRIDFLEET_REGION")
    with pytest.raises(ValueError, match="GRIDFLEET_REGION"):
        starter.handler({}, None)
    with pytest.raises(ValueError, match="GRIDFLEET_REGION"):
        watchdog.handler({}, None)
    assert any("GRIDFLEET_REGION" in r.getMessage() for r in caplog.records)


def test_the_starter_rejects_a_bad_run_id_in_the_event(lambda_env):
    with pytest.raises(ValueError, match="run_id"):
        starter.handler({"run_id": "../etc"}, None)


def test_run_starter_takes_clients_and_clock(rig, clients):
    env = {
        "GRIDFLEET_REGION": REGION,
        "GRIDFLEET_TABLE": rig.settings.table,
        "GRIDFLEET_ENDPOINT_URL": rig.settings.endpoint_url,
        "GRIDFLEET_HUB_LAUNCH_TEMPLATE": rig.template,
    }
    made: list[LambdaSettings] = []

    def factory(settings: LambdaSettings) -> AwsClients:
        made.append(settings)
        return clients

    out = run_starter({}, env, clients_factory=factory, clock=FakeClock(start=1_900_000_000.0))

    assert out["run_id"] == "2030-03-17" and out["action"] == "started"
    assert made[0].table == rig.settings.table


# --- the watchdog: runs it ends, instances that bill while stopped --------------------------------


def test_an_abandoned_run_is_ended_its_open_sites_failed_and_its_summary_archived(rig, clients):
    run_id = rig.run_id()
    rig.create_run(run_id, deadline_in_s=-(GRACE_S + 10))
    for name in ("done", "open", "running"):
        rec = ops.new_site(run_id, name, SiteSpec(f"https://{name}.test/"), None)
        assert rig.table.create_site(rec)
        if name != "open":
            rec = ops.claim(rig.table, rec, "i-gone", rig.clock.now() - 100)
        if name == "done":
            ops.complete(rig.table, rec, f"{name}/20270101/{run_id}/result.json", rig.clock.now() - 50)
    rig.launch(run_id, "node")

    out = rig.watch(archive=S3RunArchive(clients.client("s3"), rig.settings.bucket))

    (ended,) = [e for e in out["ended"] if e["run_id"] == run_id]
    assert sorted(ended["failed"]) == ["open", "running"]
    assert ended["summary"] == f"s3://{rig.settings.bucket}/runs/{run_id}/summary.json"
    run = rig.table.get_run(run_id)
    assert run.finished
    sites = {r.site: r for r in rig.table.read_run(run_id).sites}
    assert sites["done"].run_status.value == "COMPLETED"
    assert {sites[n].failure_reason for n in ("open", "running")} == {"deadline"}
    summary = S3RunArchive(clients.client("s3"), rig.settings.bucket).get_summary(run_id)
    assert summary["counts"] == {"QUEUED": 0, "RUN": 0, "COMPLETED": 1, "FAILED": 2}
    assert summary["sites"]["running"]["attempts"][0]["outcome"] == "deadline"
    assert rig.live(run_id) == []  # its instances went in the same pass

    again = rig.watch(archive=S3RunArchive(clients.client("s3"), rig.settings.bucket))
    assert [e for e in again["ended"] if e["run_id"] == run_id] == []  # FINISHED now: nothing more to do


def test_stopped_instances_of_the_stack_are_terminated_unless_configured_to_be_kept(rig):
    run_id = rig.run_id()
    rig.create_run(run_id)  # a live run: its running instances stay
    running = rig.launch(run_id, "node")
    stopped_hub, kept_hub, stopped_node = (
        rig.launch(run_id, "hub") + rig.launch(None, "hub") + rig.launch(run_id, "node")
    )
    other_stack = rig.launch(run_id, "hub", stack="someone-else")
    rig.ec2._client.stop_instances(InstanceIds=[stopped_hub, kept_hub, stopped_node, *other_stack])

    out = rig.watch(settings=replace(rig.settings, hub_instance_id=kept_hub))

    gone = {e["instance_id"]: e for e in out["terminated"]}
    assert set(gone) >= {stopped_hub, stopped_node}
    assert gone[stopped_hub]["reason"] == "stopped, and kept by no configuration"
    assert kept_hub not in gone and not set(other_stack) & set(gone)
    assert rig.states(InstanceIds=[kept_hub, *other_stack]) == {kept_hub: "stopped", other_stack[0]: "stopped"}
    assert rig.live(run_id) == running


def test_the_starter_never_starts_an_instance_of_another_stack(rig):
    run_id = rig.run_id()
    (foreign,) = rig.launch(None, "hub", stack="someone-else")
    rig.ec2._client.stop_instances(InstanceIds=[foreign])
    wait_for(lambda: rig.states(InstanceIds=[foreign])[foreign] == "stopped", timeout=10)

    out = rig.start(run_id, settings=replace(rig.settings, hub_instance_id=foreign, hub_launch_template=None))

    assert out["action"] == "refused" and "not tagged" in out["reason"], out
    assert rig.states(InstanceIds=[foreign])[foreign] == "stopped"
    assert rig.ec2.called("start_instances") == []
