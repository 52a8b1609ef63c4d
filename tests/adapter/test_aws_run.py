"""A run on AWS, against a moto server on 127.0.0.1: bootstrap, spot nodes from cloud-init, deadline, teardown.

moto's instances never boot, so no node ever heartbeats: with a short deadline the run ends with every
site FAILED (deadline), every launched instance terminated, exit code 3 and a summary.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from rich.console import Console

from cli.envs import aws as aws_env
from cli.envs.aws_plan import dry_run
from cloud_init import boot_script
from fleet.aws.bootstrap import ensure_resources
from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.aws.table import DynamoStateTable
from fleet.config.load import parse_config
from fleet.outputs.results import result_key
from fleet.record import ops
from fleet.record.partition import RunInfo
from fleet.record.state import RunState, RunStatus, SiteSpec


@pytest.fixture(scope="module")
def moto_url(moto_endpoint):
    return moto_endpoint


@pytest.fixture
def account(moto_url, tmp_path):
    """What Terraform would have made: a VPC with two subnets, a security group, an EFS file system."""
    clients = AwsClients(
        parse_config(f"aws: {{endpoint_url: '{moto_url}'}}\nsites: [{{id: a, start_url: 'http://a.test'}}]").aws,
        credentials=LOCAL_CREDENTIALS,
    )
    ec2, efs = clients.client("ec2"), clients.client("efs")
    vpc = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.1.{k}.0/24")["Subnet"]["SubnetId"] for k in (1, 2)]
    sg = ec2.create_security_group(GroupName=f"n-{uuid.uuid4().hex[:6]}", Description="nodes", VpcId=vpc)["GroupId"]
    fs = efs.create_file_system(CreationToken=uuid.uuid4().hex, Encrypted=True)["FileSystemId"]
    iam = clients.client("iam")
    profile = f"gridfleet-node-{uuid.uuid4().hex[:6]}"
    iam.create_instance_profile(InstanceProfileName=profile)
    iam.create_role(RoleName=profile, AssumeRolePolicyDocument="{}")  # the nodes' role: its id names their prefix
    iam.add_role_to_instance_profile(InstanceProfileName=profile, RoleName=profile)
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    tag = uuid.uuid4().hex[:8]
    text = f"""\
run: {{deadline_s: 6, watch_interval_s: 1, hang_after_s: 60}}
fleet: {{max_nodes: 2, instance_types: [t3.medium, t3a.medium], spot: true}}
aws:
  region: ap-northeast-2
  endpoint_url: {moto_url}
  table: t-{tag}
  queue: q-{tag}
  bucket: b-{tag}
  efs_id: {fs}
  subnet_ids: [{subnets[0]}, {subnets[1]}]
  security_group_ids: [{sg}]
  instance_profile: {profile}
  ami: {ami}
  hub_address: 10.1.1.10
  imds_url: http://127.0.0.1:9
sites:
  - {{id: alpha, start_url: "https://alpha.test/"}}
  - {{id: beta, start_url: "https://beta.test/"}}
  - {{id: gamma, start_url: "https://gamma.test/"}}
"""
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return {"path": path, "ec2": ec2, "efs_id": fs, "config": parse_config(text), "clients": clients}


def gridfleet(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_EC2_METADATA_DISABLED="true",
        GRIDFLEET_HOME=str(tmp_path / "home"),
    )
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )


@pytest.mark.slow
def test_bootstrap_then_a_run_to_its_deadline_on_moto(account, tmp_path):
    boot = gridfleet(tmp_path, "aws", "bootstrap", "--config", str(account["path"]))
    assert boot.returncode == 0, boot.stderr
    assert "created DynamoDB table" in boot.stdout
    again = gridfleet(tmp_path, "aws", "bootstrap", "--config", str(account["path"]))
    assert again.returncode == 0 and "all present" in again.stdout

    run = gridfleet(tmp_path, "run", "--config", str(account["path"]), "--run-id", "aws-1")
    assert run.returncode == 3, run.stdout + run.stderr
    summary = json.loads((tmp_path / "runs" / "aws-1" / "summary.json").read_text())
    assert {s["failure_reason"] for s in summary["sites"].values()} == {"deadline"}
    assert summary["nodes"]["launched"] == 2 and summary["nodes"]["left_running"] == 0, run.stderr
    assert "hub self-stop: not stopping: not on EC2" in run.stderr

    ec2 = account["ec2"]
    nodes = [
        i
        for r in ec2.describe_instances(Filters=[{"Name": "tag:gridfleet:run_id", "Values": ["aws-1"]}])["Reservations"]
        for i in r["Instances"]
    ]
    assert len(nodes) == 2
    for i in nodes:
        assert i["State"]["Name"] in ("shutting-down", "terminated")
        assert i["InstanceLifecycle"] == "spot" and i["MetadataOptions"]["HttpTokens"] == "required"
        assert {t["Key"]: t["Value"] for t in i["Tags"]}["gridfleet:role"] == "node"
        shutdown = ec2.describe_instance_attribute(
            InstanceId=i["InstanceId"], Attribute="instanceInitiatedShutdownBehavior"
        )
        assert shutdown["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
        raw = ec2.describe_instance_attribute(InstanceId=i["InstanceId"], Attribute="userData")["UserData"]["Value"]
        user_data = base64.b64decode(raw).decode()
        assert user_data.startswith("#cloud-config") and account["efs_id"] in user_data
        script = boot_script(user_data)
        assert "node site-mounts" in script and '--site-mounts "$SITE_MOUNTS"' in script  # a site's mount per claim
        ud_file = tmp_path / f"{i['InstanceId']}.yaml"
        ud_file.write_text(user_data)
        if shutil.which("cloud-init"):
            check = subprocess.run(
                ["cloud-init", "schema", "--config-file", str(ud_file)], capture_output=True, text=True
            )
            assert check.returncode == 0, check.stdout + check.stderr

    # every site of the run got its own access point on the stack's file system before a node started
    points = account["clients"].client("efs").describe_access_points(FileSystemId=account["efs_id"])["AccessPoints"]
    tagged = sorted({t["Key"]: t["Value"] for t in p["Tags"]}["gridfleet:site"] for p in points)
    assert tagged == sorted(summary["sites"])
    assert points and all(p["RootDirectory"]["Path"].startswith("/gridfleet/sites/") for p in points)
    s3 = account["clients"].client("s3")  # the nodes' config was published where their user-data looks for it
    body = s3.get_object(Bucket=account["config"].aws.bucket, Key="runs/aws-1/fleet.yaml")["Body"].read()
    assert parse_config(body.decode()).aws.table == account["config"].aws.table

    status = gridfleet(tmp_path, "status", "--config", str(account["path"]), "--run-id", "aws-1", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["sites"] == summary["sites"]


def test_missing_resources_are_named_before_anything_is_launched(account, tmp_path):
    run = gridfleet(tmp_path, "run", "--config", str(account["path"]), "--run-id", "aws-missing")
    assert run.returncode == 1
    cfg = account["config"].aws
    for name in (cfg.table, cfg.queue, cfg.bucket):
        assert name in run.stderr
    ec2 = account["ec2"]
    assert not ec2.describe_instances(Filters=[{"Name": "tag:gridfleet:run_id", "Values": ["aws-missing"]}])[
        "Reservations"
    ]


READ_ONLY = ("Describe", "Get", "List", "Head")


def test_dry_run_prints_the_plan_and_calls_no_mutating_api(account, tmp_path):
    calls: list[str] = []

    def record(service, client):
        client.meta.events.register("before-call", lambda model, **_: calls.append(f"{service}.{model.name}"))

    assert gridfleet(tmp_path, "aws", "bootstrap", "--config", str(account["path"])).returncode == 0
    config = account["config"]
    setup = AwsClients(config.aws, credentials=LOCAL_CREDENTIALS)  # the efs-utils package a stock node installs
    setup.client("s3").put_object(Bucket=config.aws.bucket, Key="bundle/amazon-efs-utils.deb", Body=b"!<arch>\n")
    env = aws_env.connect(config, AwsClients(config.aws, credentials=LOCAL_CREDENTIALS, on_client=(record,)))
    out = io.StringIO()
    code = dry_run(env, "aws-dry", Console(file=out, width=200))
    text = out.getvalue()
    assert code == 0, text
    assert "up to 2 x t3.medium/t3a.medium (spot, on-demand fallback)" in text
    assert "bytes of cloud-config" in text and config.aws.efs_id in text and "3 (alpha, beta, gamma)" in text
    assert calls and all(c.split(".")[1].startswith(READ_ONLY) for c in calls), calls
    ec2 = account["ec2"]
    assert not ec2.describe_instances(Filters=[{"Name": "tag:gridfleet:run_id", "Values": ["aws-dry"]}])["Reservations"]


@pytest.mark.slow
def test_a_hub_on_ec2_takes_its_identity_from_imds_and_stops_itself(account, tmp_path):
    from embedded.imds_server import ImdsServer

    ec2 = account["ec2"]
    hub = ec2.run_instances(
        ImageId=account["config"].aws.ami,
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "gridfleet:role", "Value": "hub"}]}],
    )["Instances"][0]["InstanceId"]
    with ImdsServer() as imds:
        imds.set(hub, local_ipv4="10.1.1.77")
        text = account["path"].read_text().replace("  hub_address: 10.1.1.10\n", "  hub_self_stop: terminate\n")
        text = text.replace("imds_url: http://127.0.0.1:9", f"imds_url: {imds.base_url(hub)}")
        cfg = tmp_path / "hub.yaml"
        cfg.write_text(text)
        assert gridfleet(tmp_path, "aws", "bootstrap", "--config", str(cfg)).returncode == 0
        run = gridfleet(tmp_path, "run", "--config", str(cfg), "--run-id", "aws-hub")
    assert run.returncode == 3, run.stderr
    assert f"hub self-stop: terminating {hub}" in run.stderr
    assert "Grid at 10.1.1.77:4444" in run.stderr  # the nodes were told the hub's private address from IMDS
    state = ec2.describe_instances(InstanceIds=[hub])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state in ("shutting-down", "terminated")
    summary = json.loads((tmp_path / "runs" / "aws-hub" / "summary.json").read_text())
    assert summary["nodes"]["left_running"] == 0


def test_shutdown_is_refused_when_the_metadata_is_an_emulator():
    from cli.envs.identity import HubIdentity, self_stop

    ident = HubIdentity("ec2:i-0abc", "10.0.0.1", "i-0abc", real_ec2=False)
    assert self_stop("shutdown", ident, ec2=None).startswith("not shutting down")
    assert self_stop("none", ident, ec2=None).startswith("not stopping")


@pytest.mark.slow
def test_metrics_reach_cloudwatch_and_a_rerun_on_aws_starts_a_hub_for_the_reopened_sites(account, tmp_path):
    """moto serves CloudWatch: the hub's gauges come back from list_metrics/get_metric_statistics. A rerun of the
    failed sites reopens them and the run, and starts one hub from the hub launch template (its cloud-init then
    runs `gridfleet run --resume` for the run named by its tag); a second rerun starts no second hub."""
    ec2, clients = account["ec2"], account["clients"]
    template = f"hub-{uuid.uuid4().hex[:6]}"
    ec2.create_launch_template(
        LaunchTemplateName=template,
        LaunchTemplateData={"ImageId": account["config"].aws.ami, "InstanceType": "t3.small"},
    )
    text = (
        account["path"]
        .read_text()
        .replace(
            "aws:\n",
            f"metrics: {{cloudwatch: true, namespace: gf-{template}}}\n"
            f"hub: {{port: 0}}\naws:\n  hub_launch_template: {template}\n",
            1,
        )
    )
    account["path"].write_text(text)
    assert gridfleet(tmp_path, "aws", "bootstrap", "--config", str(account["path"])).returncode == 0
    run = gridfleet(tmp_path, "run", "--config", str(account["path"]), "--run-id", "aws-re")
    assert run.returncode == 3, run.stdout + run.stderr

    cw = clients.client("cloudwatch")
    names = {m["MetricName"] for m in cw.list_metrics(Namespace=f"gf-{template}")["Metrics"]}
    assert {"ActiveNodes", "SitesCompleted", "SitesFailed", "RunProgress", "QueueVisible"} <= names
    stats = cw.get_metric_statistics(
        Namespace=f"gf-{template}",
        MetricName="SitesFailed",
        Statistics=["Maximum"],
        StartTime=time.time() - 600,
        EndTime=time.time() + 60,
        Period=60,
    )
    assert max(p["Maximum"] for p in stats["Datapoints"]) == 3

    rerun = gridfleet(tmp_path, "rerun", "--failed", "--config", str(account["path"]), "--run-id", "aws-re")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "3 site(s) queued again" in rerun.stdout and "hub: started" in rerun.stdout
    hubs = [
        i
        for r in ec2.describe_instances(
            Filters=[
                {"Name": "tag:gridfleet:run_id", "Values": ["aws-re"]},
                {"Name": "tag:gridfleet:role", "Values": ["hub"]},
            ]
        )["Reservations"]
        for i in r["Instances"]
    ]
    assert len(hubs) == 1 and hubs[0]["State"]["Name"] in ("pending", "running")
    status = json.loads(
        gridfleet(tmp_path, "status", "--config", str(account["path"]), "--run-id", "aws-re", "--json").stdout
    )
    assert {s["run_status"] for s in status["sites"].values()} == {"QUEUED"}
    assert {s["attemptCount"] for s in status["sites"].values()} == {0}  # the deadline came before any claim
    sqs = clients.client("sqs")
    url = sqs.get_queue_url(QueueName=account["config"].aws.queue)["QueueUrl"]
    depth = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    assert int(depth["Attributes"]["ApproximateNumberOfMessages"]) == 3  # one message per reopened site

    again = gridfleet(tmp_path, "rerun", "--failed", "--config", str(account["path"]), "--run-id", "aws-re")
    assert again.returncode == 0 and "nothing to rerun" in again.stdout
    assert (
        len(
            [
                i
                for r in ec2.describe_instances(
                    Filters=[
                        {"Name": "tag:gridfleet:role", "Values": ["hub"]},
                        {"Name": "tag:gridfleet:run_id", "Values": ["aws-re"]},
                    ]
                )["Reservations"]
                for i in r["Instances"]
            ]
        )
        == 1
    )


def test_node_metrics_round_trip_through_cloudwatch_on_moto(account):
    from fleet.aws.metrics import CloudWatchSink, node_heartbeat, node_job_data

    ns = f"gf-node-{uuid.uuid4().hex[:6]}"
    sink = CloudWatchSink(account["clients"].client("cloudwatch"), ns)
    sink.add(node_job_data("i-0abc", 12.5, None) + node_job_data("i-0abc", 3.0, "hang") + [node_heartbeat("i-0abc")])
    assert sink.flush() == 5
    cw = account["clients"].client("cloudwatch")
    metrics = cw.list_metrics(Namespace=ns)["Metrics"]
    dims = {(m["MetricName"], tuple(sorted((d["Name"], d["Value"]) for d in m["Dimensions"]))) for m in metrics}
    assert ("JobsCompleted", (("WorkerId", "i-0abc"),)) in dims
    assert ("JobErrors", (("ErrorType", "hang"), ("WorkerId", "i-0abc"))) in dims
    assert ("Heartbeat", (("WorkerId", "i-0abc"),)) in dims
    got = cw.get_metric_statistics(
        Namespace=ns,
        MetricName="JobDuration",
        Statistics=["Sum", "SampleCount"],
        Dimensions=[{"Name": "WorkerId", "Value": "i-0abc"}],
        StartTime=time.time() - 600,
        EndTime=time.time() + 60,
        Period=60,
    )
    assert sum(p["Sum"] for p in got["Datapoints"]) == 15.5 and sum(p["SampleCount"] for p in got["Datapoints"]) == 2


def _forget(clients, table: str, run_id: str) -> int:
    """Delete a run's partitions from the table (its sites and nodes, its run item and history), as their items'
    TTL eventually does (moto never expires them)."""
    ddb = clients.client("dynamodb")
    keys = []
    for partition in (run_id, f"#run:{run_id}"):
        pages = ddb.get_paginator("query").paginate(
            TableName=table,
            KeyConditionExpression="run_id = :r",
            ExpressionAttributeValues={":r": {"S": partition}},
            ProjectionExpression="run_id, Site",
        )
        keys += [item for page in pages for item in page["Items"]]
    for k in keys:
        ddb.delete_item(TableName=table, Key=k)
    return len(keys)


@pytest.mark.slow
def test_a_runs_record_outlives_the_table_in_the_bucket(account, tmp_path):
    """Each run puts its summary and report in the bucket; once the table has forgotten a run, status, check and
    report read it from there, and the next run's report is compared with it from there too."""
    cfg, clients = account["config"], account["clients"]
    assert gridfleet(tmp_path, "aws", "bootstrap", "--config", str(account["path"])).returncode == 0
    first = tmp_path / "first"
    first.mkdir()
    assert gridfleet(first, "run", "--config", str(account["path"]), "--run-id", "aws-a").returncode == 3
    s3 = clients.client("s3")
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=cfg.aws.bucket, Prefix="runs/aws-a/")["Contents"]}
    assert {"runs/aws-a/summary.json", "runs/aws-a/report.html", "runs/aws-a/fleet.yaml"} <= keys
    archived = json.loads(s3.get_object(Bucket=cfg.aws.bucket, Key="runs/aws-a/summary.json")["Body"].read())
    assert archived["check"]["ok"] and archived["check"]["false_losses"] == 0
    assert archived["sites"] == json.loads((first / "runs" / "aws-a" / "summary.json").read_text())["sites"]

    assert _forget(clients, cfg.aws.table, "aws-a") > 3
    elsewhere = tmp_path / "elsewhere"  # another machine: nothing of the run on its disk
    elsewhere.mkdir()
    status = gridfleet(elsewhere, "status", "--config", str(account["path"]), "--run-id", "aws-a", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["sites"] == archived["sites"]
    check = gridfleet(elsewhere, "check", "--config", str(account["path"]), "--run-id", "aws-a")
    assert check.returncode == 0 and "archived summary" in check.stdout, check.stdout + check.stderr
    report = gridfleet(elsewhere, "report", "--config", str(account["path"]), "--run-id", "aws-a")
    assert report.returncode == 0, report.stderr
    assert "aws-a" in (elsewhere / "runs" / "aws-a" / "report.html").read_text()

    second = tmp_path / "second"  # the next day's hub, on a fresh instance: the previous run is in the bucket only
    second.mkdir()
    assert gridfleet(second, "run", "--config", str(account["path"]), "--run-id", "aws-b").returncode == 3
    html = s3.get_object(Bucket=cfg.aws.bucket, Key="runs/aws-b/report.html")["Body"].read().decode()
    assert "aws-a" in html  # the difference from the previous run
    missing = gridfleet(elsewhere, "status", "--config", str(account["path"]), "--run-id", "aws-nope")
    assert missing.returncode == 1 and "runs/aws-nope/summary.json" in missing.stderr


def test_a_forced_rerun_refuses_a_result_key_a_node_rewrote_and_moves_nothing(account, tmp_path):
    """A node writes its site's record: one that names the code bundle as the site's result makes `rerun --force`
    refuse in one line (exit 2), and nothing is copied or deleted; the bundle and the real result stay."""
    ec2 = account["ec2"]
    template = f"hub-{uuid.uuid4().hex[:6]}"  # so that the rerun would start a hub and go on to set the result aside
    ec2.create_launch_template(
        LaunchTemplateName=template,
        LaunchTemplateData={"ImageId": account["config"].aws.ami, "InstanceType": "t3.small"},
    )
    path = tmp_path / "forged.yaml"
    path.write_text(account["path"].read_text().replace("aws:\n", f"aws:\n  hub_launch_template: {template}\n", 1))
    config = parse_config(path.read_text())
    clients = AwsClients(config.aws, credentials=LOCAL_CREDENTIALS)
    ensure_resources(clients, 30)
    table, s3 = DynamoStateTable(clients.client("dynamodb"), config.aws.table), clients.client("s3")
    now = time.time()
    table.create_run(RunInfo("aws-forged", "RUNNING", now, now + 600, "20261121"))
    table.update_run("aws-forged", status=RunState.FINISHED, finished_at=now)
    site = ops.new_site("aws-forged", "alpha", SiteSpec("https://alpha.test/"), None)
    table.create_site(site)
    rec = ops.claim(table, site, "i-1", now)
    real = result_key("alpha", "20261121", "aws-forged")
    s3.put_object(Bucket=config.aws.bucket, Key=real, Body=b"[]")
    s3.put_object(Bucket=config.aws.bucket, Key=config.aws.bundle_key, Body=b"the code every node installs")
    ops.complete(table, rec, config.aws.bundle_key, now)  # the forged key, as a compromised node would write it

    rerun = gridfleet(tmp_path, "rerun", "alpha", "--force", "--config", str(path), "--run-id", "aws-forged")
    assert rerun.returncode == 2, rerun.stdout + rerun.stderr
    lines = rerun.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing --force, nothing moved" in lines[0], rerun.stderr
    assert "'bundle/gridfleet-bundle.tar.gz'" in lines[0] and f"{real!r}" in lines[0]
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=config.aws.bucket).get("Contents", [])}
    assert keys == {real, config.aws.bundle_key}
    assert (
        s3.get_object(Bucket=config.aws.bucket, Key=config.aws.bundle_key)["Body"].read()
        == b"the code every node installs"
    )
    assert table.get_site("aws-forged", "alpha").run_status is RunStatus.COMPLETED  # not reopened either
