"""Every command that talks to AWS, against every kind of AWS failure: one line on stderr, exit 1, no traceback.

The commands run in this process (`cli.main.main`) against a moto server. What moto can produce is real: no
credentials (the environment cleared), a table, queue and bucket that do not exist (fresh names), an endpoint
that refuses connections (a closed port); an empty `aws.region` is refused as the config loads (exit 2,
tests/unit/test_aws_values.py). What moto cannot produce is made by a botocore hook that each client of the
command gets through `fleet.aws.clients.CLIENT_HOOKS`: an error response on `before-call` (expired or invalid
credentials, access denied, throttling; the answer AWS gives once botocore's retries are spent, the retrying
itself being tested in tests/faults), or an exception raised on `before-send`, inside botocore's HTTP layer, where
botocore raises its own (a connect or read timeout, a region without the service).
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError, UnknownEndpointError

from cli.main import main
from fleet.aws import clients as fleet_aws
from fleet.aws.bootstrap import ensure_resources
from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.config.load import parse_config

RUN = "r1"
READ_ONLY = ("Describe", "Get", "List", "Head")

#: Every command that talks to AWS ({cfg}: the config, {tmp}: the test's directory). `render node|hub` do not,
#: nor `report` without --config; with it, `report` reads the run's summary from the bucket.
COMMANDS: dict[str, list[str]] = {
    "run": ["run", "--config", "{cfg}", "--run-id", RUN, "--out", "{tmp}/runs"],
    "run --dry-run": ["run", "--config", "{cfg}", "--dry-run", "--run-id", RUN],
    "status": ["status", "--config", "{cfg}", "--run-id", RUN, "--out", "{tmp}/runs"],
    "watch": ["watch", "--config", "{cfg}", "--run-id", RUN, "--interval", "0.1", "--out", "{tmp}/runs"],
    "check": ["check", "--config", "{cfg}", "--run-id", RUN],
    "teardown": ["teardown", "--config", "{cfg}", "--run-id", RUN, "--out", "{tmp}/runs"],
    "rerun --failed": ["rerun", "--failed", "--config", "{cfg}", "--run-id", RUN, "--out", "{tmp}/runs"],
    "report": ["report", "--config", "{cfg}", "--run-id", RUN, "--runs", "{tmp}/runs"],
    "aws bootstrap": ["aws", "bootstrap", "--config", "{cfg}"],
    "bundle --upload": ["bundle", "--config", "{cfg}", "--upload", "--out", "{tmp}/dist"],
}


# --- failures moto cannot produce: answered or raised by a hook on every client of the command ----------------
@dataclass
class Calls:
    """Every call the command's clients start, as `Service Operation`, and the calls a hook refused."""

    started: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hook(self, service: str, client: Any) -> None:
        label = str(client.meta.service_model.service_id)

        def record(model: Any, **_: Any) -> None:
            with self.lock:
                self.started.append(f"{label} {model.name}")

        client.meta.events.register("provide-client-params", record)


class _Raw:
    def __init__(self, body: bytes):
        self.body = body

    def stream(self, **_: Any):
        yield self.body


def answer(code: str, status: int = 400, message: str = "", spare: tuple[str, ...] = ()) -> Callable[[Calls], Any]:
    """Answer every call (but those named in `spare`) with AWS's error `code`."""

    def install(calls: Calls) -> Callable[[str, Any], None]:
        def hook(service: str, client: Any) -> None:
            label = str(client.meta.service_model.service_id)

            def refuse(model: Any, **_: Any) -> Any:
                if model.name in spare:
                    return None
                action = f"{model.service_model.signing_name}:{model.name}"
                with calls.lock:
                    calls.refused.append(f"{label} {model.name}")
                text = message.format(action=action)
                parsed = {
                    "Error": {"Code": code, "Message": text},
                    "ResponseMetadata": {"HTTPStatusCode": status, "RetryAttempts": 0},
                }
                return AWSResponse("https://aws.invalid/", status, {}, _Raw(b"")), parsed

            client.meta.events.register("before-call", refuse)

        return hook

    return install


def raise_in_http(make: Callable[[str, str], Exception]) -> Callable[[Calls], Any]:
    """Raise `make(url, service)` where botocore's HTTP layer would send the request."""

    def install(calls: Calls) -> Callable[[str, Any], None]:
        def hook(service: str, client: Any) -> None:
            label = str(client.meta.service_model.service_id)

            def fail(request: Any, event_name: str, **_: Any) -> None:
                with calls.lock:
                    calls.refused.append(f"{label} {event_name.rsplit('.', 1)[-1]}")
                raise make(request.url, service)

            client.meta.events.register("before-send", fail)

        return hook

    return install


DENIED = (
    "User: arn:aws:iam::123456789012:user/ops is not authorized to perform: {action} on resource: "
    "arn:aws:service:ap-northeast-2:123456789012:thing because no identity-based policy allows the {action} "
    "action"
)


@dataclass(frozen=True)
class Failure:
    expect: str  # how the one line starts (after "gridfleet: error: ")
    hook: Callable[[Calls], Any] | None = None
    config: dict[str, Any] = field(default_factory=dict)  # aws: overrides
    no_credentials: bool = False
    names_call: bool = True  # the line names the first call the failure hit


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FAILURES: dict[str, Failure] = {
    "no credentials": Failure("no AWS credentials", no_credentials=True),
    "expired token": Failure("AWS credentials expired", answer("ExpiredTokenException")),
    "invalid credentials": Failure("AWS credentials not valid", answer("UnrecognizedClientException")),
    "access denied": Failure("access denied to", answer("AccessDeniedException", 400, DENIED)),
    "endpoint refuses": Failure("cannot reach http://127.0.0.1:", config={"endpoint_url": "closed"}),
    "connect timeout": Failure(
        "no connection in time to http://127.0.0.1:",
        raise_in_http(lambda url, service: ConnectTimeoutError(endpoint_url=url)),
    ),
    "read timeout": Failure(
        "no answer in time from http://127.0.0.1:",
        raise_in_http(lambda url, service: ReadTimeoutError(endpoint_url=url)),
    ),
    "region without the service": Failure(
        "no endpoint for",
        raise_in_http(lambda url, service: UnknownEndpointError(service_name=service, region_name="ap-northeast-2")),
    ),
    "throttling": Failure("AWS throttled the call", answer("ThrottlingException")),
    "missing table, queue and bucket": Failure("", config={"fresh": True}, names_call=False),
}

#: Where a command does not fail: the dry run needs no credentials, and bootstrap creates what is missing.
SUCCEEDS = {("run --dry-run", "no credentials"), ("aws bootstrap", "missing table, queue and bucket")}


@pytest.fixture(scope="module")
def names(moto_endpoint) -> dict[str, str]:
    """A table, queue and bucket that exist on the moto server (the rows whose calls never reach it need none)."""
    tag = uuid.uuid4().hex[:10]
    found = {"table": f"t-{tag}", "queue": f"q-{tag}", "bucket": f"b-{tag}"}
    aws = parse_config(
        f"aws: {{endpoint_url: '{moto_endpoint}', table: {found['table']}, queue: {found['queue']}, "
        f"bucket: {found['bucket']}}}\nsites: [{{id: a, start_url: 'http://a.test'}}]"
    ).aws
    clients = AwsClients(aws, credentials=LOCAL_CREDENTIALS)
    ensure_resources(clients, visibility_timeout_s=30)
    clients.client("iam").create_instance_profile(InstanceProfileName=f"node-{tag}")
    # the stock nodes' amazon-efs-utils, as `bundle --upload --efs-utils-deb` puts it beside the bundle
    clients.client("s3").put_object(Bucket=found["bucket"], Key="bundle/amazon-efs-utils.deb", Body=b"!<arch>\n")
    ami = clients.client("ec2").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    clients.client("ssm").put_parameter(Name=f"/gridfleet/{tag}/ami", Type="String", Value=ami)
    return {**found, "profile": f"node-{tag}", "ami_parameter": f"/gridfleet/{tag}/ami", "ami": ami}


def write_config(path: Path, moto_endpoint: str, names: dict[str, str], **aws: Any) -> Path:
    fields: dict[str, Any] = {
        "region": "ap-northeast-2",
        "endpoint_url": moto_endpoint,
        "table": names["table"],
        "queue": names["queue"],
        "bucket": names["bucket"],
        "max_retries": 0,
        "efs_id": "fs-0123456789abcdef0",
        "subnet_ids": ["subnet-0123456789abcdef0"],
        "security_group_ids": ["sg-0123456789abcdef0"],
        "instance_profile": names["profile"],
        "ami": names["ami_parameter"],
        "hub_address": "10.0.0.10",
        "imds_url": "http://127.0.0.1:9",
        "hub_launch_template": "gridfleet-hub",
    }
    if aws.pop("fresh", False):
        tag = uuid.uuid4().hex[:10]
        fields.update(table=f"t-{tag}", queue=f"q-{tag}", bucket=f"b-{tag}")
    if aws.get("endpoint_url") == "closed":
        aws["endpoint_url"] = f"http://127.0.0.1:{closed_port()}"
    fields.update(aws)
    path.write_text(
        yaml.safe_dump(
            {
                "run": {"deadline_s": 5, "watch_interval_s": 0.5},
                "hub": {"http": False},
                "metrics": {"cloudwatch": False},
                "aws": fields,
                "sites": [{"id": "alpha", "start_url": "https://alpha.test/"}],
            }
        )
    )
    return path


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """Run `gridfleet ARGS...` in this process; return (exit code, stdout, stderr, the calls its clients made)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRIDFLEET_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")

    def run(argv: list[str], hook: Callable[[Calls], Any] | None = None) -> tuple[int, str, str, Calls]:
        calls = Calls()
        hooks = [calls.hook] + ([hook(calls)] if hook else [])
        fleet_aws.CLIENT_HOOKS.extend(hooks)
        try:
            code = main([a.format(tmp=tmp_path, cfg=tmp_path / "fleet.yaml") for a in argv])
        finally:
            for h in hooks:
                fleet_aws.CLIENT_HOOKS.remove(h)
        out, err = capsys.readouterr()
        return code, out, err, calls

    return run


def clear_credentials(monkeypatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.mark.parametrize("failure", list(FAILURES))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_aws_failure_is_one_line_and_exit_1(command, failure, cli, names, moto_endpoint, tmp_path, monkeypatch):
    row = FAILURES[failure]
    cfg = write_config(tmp_path / "fleet.yaml", moto_endpoint, names, **row.config)
    if row.no_credentials:
        clear_credentials(monkeypatch, tmp_path)
    code, out, err, calls = cli(COMMANDS[command], row.hook)

    assert "Traceback" not in out + err
    if (command, failure) in SUCCEEDS:
        assert code == 0, err
        if command == "run --dry-run":  # it asked AWS nothing, and says what it could not resolve
            assert calls.started == [] and "not resolved: no AWS credentials" in out
        return
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    line = lines[0]
    start = row.expect
    assert line.startswith(f"gridfleet: error: {'dry run: ' if command == 'run --dry-run' else ''}{start}"), line
    if command == "run --dry-run":
        assert row.expect in out, out
    if row.names_call:
        first = (calls.refused or calls.started)[0]
        assert f"({first}" in line, (first, line)
    if failure == "access denied":  # the action the message names
        service, operation = first.split()
        assert f"access denied to {service.lower()}:{operation} on " in line, line
    if failure == "missing table, queue and bucket":
        assert "does not exist" in line and "run `gridfleet aws bootstrap` or apply infra/terraform" in line
        assert yaml.safe_load(cfg.read_text())["aws"]["bucket"] in line, line


# --- a failure past the first calls: access denied to everything but the preflight checks -------------------------
PREFLIGHT = ("DescribeTable", "GetQueueUrl", "HeadBucket")


@pytest.mark.parametrize("command", list(COMMANDS))
def test_access_denied_past_the_preflight_checks_names_the_call_it_hit(
    command, cli, names, moto_endpoint, tmp_path, monkeypatch
):
    """The account's resources exist; every call but the preflight's is denied, so each command fails at the first
    call of its own work. `bundle --upload` has its two builds (minutes of wheels) replaced at their seam by
    files of a few bytes: the upload, through boto3's transfer manager, is what is tested."""
    from cli.commands import aws as aws_cmd

    def build(name: str) -> Callable[..., Path]:
        def make(root: Path, out: Path, *_: Any, **__: Any) -> Path:
            out.mkdir(parents=True, exist_ok=True)
            (out / name).write_bytes(b"bundle")
            return out / name

        return make

    monkeypatch.setattr(aws_cmd, "find_grid_jar", lambda candidates: tmp_path / "selenium-server.jar")
    monkeypatch.setattr(aws_cmd, "build_bundle", build("gridfleet-bundle.tar.gz"))
    monkeypatch.setattr(aws_cmd, "build_lambda_zip", build("gridfleet-lambda.zip"))
    write_config(tmp_path / "fleet.yaml", moto_endpoint, names)
    code, out, err, calls = cli(COMMANDS[command], answer("AccessDenied", 403, DENIED, spare=PREFLIGHT))

    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and "Traceback" not in out + err, err
    first = calls.refused[0]
    service, operation = first.split()
    assert f"access denied to {service.lower()}:{operation} on " in lines[0] and f"({first}, AccessDenied)" in lines[0]


def test_the_dry_run_on_a_complete_account_resolves_everything_and_only_reads(cli, names, moto_endpoint, tmp_path):
    write_config(tmp_path / "fleet.yaml", moto_endpoint, names)
    code, out, err, calls = cli(COMMANDS["run --dry-run"])
    assert code == 0, out + err
    assert f"{names['ami_parameter']} (SSM parameter) -> {names['ami']}" in out
    assert f"profile:    {names['profile']}: exists" in out
    assert out.count(": present") == 3 and f"run:        {RUN} does not exist yet" in out
    assert "not resolved" not in out and err == ""
    assert calls.started and all(c.split()[1].startswith(READ_ONLY) for c in calls.started), calls.started
    assert {
        "SSM GetParameter",
        "IAM GetInstanceProfile",
        "DynamoDB DescribeTable",
        "SQS GetQueueUrl",
        "S3 HeadBucket",
        "DynamoDB GetItem",
    } <= set(calls.started)


def test_the_nodes_ami_is_aws_node_ami_when_it_is_given(cli, names, moto_endpoint, tmp_path):
    """aws.node_ami (a baked node image) is the nodes' AMI: the dry run resolves its parameter, not aws.ami's, and
    the provider launches it; a parameter that is missing is named with its key."""
    from cli.envs import aws as aws_env
    from fleet.config.load import load_config

    aws = parse_config(f"aws: {{endpoint_url: '{moto_endpoint}'}}\nsites: [{{id: a, start_url: 'http://a.test'}}]").aws
    clients = AwsClients(aws, credentials=LOCAL_CREDENTIALS)
    baked = clients.client("ec2").register_image(Name=f"gridfleet-node-{names['table']}")["ImageId"]
    parameter = f"/gridfleet/{names['table']}/node-ami"
    clients.client("ssm").put_parameter(Name=parameter, Type="String", Value=baked)
    write_config(tmp_path / "fleet.yaml", moto_endpoint, names, node_ami=parameter)
    code, out, err, _ = cli(COMMANDS["run --dry-run"])
    assert code == 0, out + err
    assert f"AMI:        {parameter} (SSM parameter) -> {baked}" in out
    assert aws_env.connect(load_config(tmp_path / "fleet.yaml")).resolve_ami() == baked
    write_config(tmp_path / "fleet.yaml", moto_endpoint, names, node_ami=parameter + "-gone")
    code, out, err, _ = cli(COMMANDS["run --dry-run"])
    assert code == 1 and f"aws.node_ami: there is no SSM parameter '{parameter}-gone'" in out + err


def test_the_dry_run_of_a_missing_account_only_reads_and_names_what_is_missing(cli, names, moto_endpoint, tmp_path):
    cfg = write_config(tmp_path / "fleet.yaml", moto_endpoint, names, fresh=True)
    aws = yaml.safe_load(cfg.read_text())["aws"]
    code, out, err, calls = cli(COMMANDS["run --dry-run"])
    assert code == 1 and len(err.strip().splitlines()) == 1
    for name in (aws["table"], aws["queue"], aws["bucket"]):
        assert f"'{name}' does not exist" in err
    assert calls.started and all(c.split()[1].startswith(READ_ONLY) for c in calls.started), calls.started


@pytest.mark.parametrize("command", ["status", "watch"])
def test_a_stack_with_no_run_yet_says_so_in_aws_words(cli, tmp_path, moto_endpoint, names, command):
    """Before the day's first hub has started its run there is nothing to show: said of the table and the bucket,
    not of a local stack that nobody asked for."""
    config = write_config(tmp_path / "fleet.yaml", moto_endpoint, names)
    code, out, err, _ = cli([command, "--config", str(config)])
    assert code == 1 and "Traceback" not in err
    assert f"no run to show: the table {names['table']} and s3://{names['bucket']}/runs/ have none yet" in err
    assert "local stack" not in err
