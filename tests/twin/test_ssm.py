"""The twin's SSM agent against the hub's SSM rung: commands sent through a real moto server run for real
inside a booted instance, and GetCommandInvocation tells what happened there. Root only (see conftest); one
instance for the module. Nothing is faked: the outcome is what the script did in the instance (the node's
kill command there is this checkout's, through a launcher at the node's path: node_kill.py)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import boto3
import pytest

from fleet.clock import SystemClock
from hub.control.ssm import SsmControl
from tests.helpers.wait import wait_for
from tests.twin.node_kill import install_gridfleet, running, start_crawl
from twin.instance import network
from twin.ssm import MAX_STDERR_CHARS, MAX_STDOUT_CHARS, TwinSsmAgent

ACCOUNT, REGION = "123456789012", "us-east-1"
STAY_UP = '#cloud-config\nruncmd:\n  - "true"\n'
STATE = "/var/lib/gridfleet"


@pytest.fixture(scope="module")
def twin(twin_ok):
    """A moto server on the bridge, an instance moto launched booted in the twin, and the agent polling."""
    from moto.server import ThreadedMotoServer

    from twin.instance.sandbox import InstanceSandbox

    network.ensure_bridge()
    server = ThreadedMotoServer(ip_address=network.HOST_ADDRESS, port=0, verbose=False)
    server.start()
    root = Path(tempfile.mkdtemp(prefix="gridfleet-twin-ssm-"))
    box = agent = None
    try:
        kw = {"region_name": REGION, "aws_access_key_id": "t", "aws_secret_access_key": "t"}
        endpoint = "http://{}:{}".format(*server.get_host_and_port())
        ec2, ssm = (boto3.client(s, endpoint_url=endpoint, **kw) for s in ("ec2", "ssm"))
        iid = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
        box = InstanceSandbox(iid, STAY_UP, root).start()
        assert box.wait_boot(30).exit_code == 0
        agent = TwinSsmAgent.for_region(ACCOUNT, REGION, lambda i: box if i == box.instance_id else None)
        agent.start(interval_s=0.1)
        yield box, ssm, agent
    finally:
        if agent is not None:
            agent.close()
        if box is not None:
            box.stop()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def control(ssm, script: str, timeout_s: float = 20.0) -> SsmControl:
    return SsmControl(ssm, SystemClock(), timeout_s=timeout_s, poll_s=0.1, command=lambda site, attempt: script)


def invocation(ssm, command_id: str, instance_id: str, *statuses: str) -> dict:
    def get():
        inv = ssm.get_command_invocation(CommandId=command_id, InstanceId=instance_id)
        return inv if inv["Status"] in statuses else None

    return wait_for(get, timeout=20, interval=0.05)


def test_the_nodes_kill_command_runs_inside_the_instance_and_reports_success(twin):
    box, ssm, _ = twin
    install_gridfleet(box)
    pid = start_crawl(box, "example.org", 2)
    assert running(box, pid)
    ladder = SsmControl(ssm, SystemClock(), timeout_s=20, poll_s=0.1)  # the hub's own kill command
    result = ladder.kill(box.instance_id, "example.org", 2)
    assert (result.ok, result.path, result.detail) == (True, "ssm", f"ok: killed process group {pid}")
    assert not running(box, pid)
    listed = ssm.list_commands(InstanceId=box.instance_id)["Commands"]
    assert listed[-1]["Status"] == "Success" and listed[-1]["CompletedCount"] == 1


def test_a_failing_command_reports_its_exit_status_and_stderr(twin):
    box, ssm, _ = twin
    result = control(ssm, "echo 'no crawler here' >&2; exit 3").kill(box.instance_id, "example.org", 1)
    assert (result.ok, result.detail) == (False, "Failed: exit status 3; no crawler here")


def test_a_command_that_outlives_its_execution_timeout_is_killed_with_its_children(twin):
    box, ssm, _ = twin
    script = [f"sleep 300 & echo $! > {STATE}/child.pid", "wait"]
    sent = ssm.send_command(
        InstanceIds=[box.instance_id],
        DocumentName="AWS-RunShellScript",
        Parameters={"commands": script, "executionTimeout": ["1"]},
    )
    command_id = sent["Command"]["CommandId"]
    assert sent["Command"]["Status"] == "Pending"  # moto alone would say Success before anything ran
    invocation(ssm, command_id, box.instance_id, "InProgress")
    pid = wait_for(lambda: (p := box.host_path(f"{STATE}/child.pid")).exists() and p.read_text().strip())
    assert running(box, pid)
    inv = invocation(ssm, command_id, box.instance_id, "TimedOut", "Success", "Failed")
    assert (inv["Status"], inv["StatusDetails"], inv["ResponseCode"]) == ("TimedOut", "ExecutionTimedOut", -1)
    assert not running(box, pid)
    assert ssm.list_commands(CommandId=command_id)["Commands"][0]["StatusDetails"] == "ExecutionTimedOut"


def test_a_slow_command_does_not_hold_up_the_next(twin):
    box, ssm, agent = twin
    slow = ssm.send_command(
        InstanceIds=[box.instance_id],
        DocumentName="AWS-RunShellScript",
        Parameters={"commands": ["sleep 60"], "executionTimeout": ["60"]},
    )["Command"]["CommandId"]
    invocation(ssm, slow, box.instance_id, "InProgress")
    result = control(ssm, "echo quick").kill(box.instance_id, "example.org", 1)
    assert (result.ok, result.detail) == (True, "quick")
    assert ssm.get_command_invocation(CommandId=slow, InstanceId=box.instance_id)["Status"] == "InProgress"
    assert agent.running() >= 1


def test_working_directory_and_output_truncated_as_ssm_does(twin):
    box, ssm, _ = twin
    script = [
        "pwd",
        "echo here > ssm-wrote",
        "head -c 30000 /dev/zero | tr '\\0' o",
        "head -c 9000 /dev/zero | tr '\\0' e >&2",
    ]
    sent = ssm.send_command(
        InstanceIds=[box.instance_id],
        DocumentName="AWS-RunShellScript",
        Parameters={"commands": script, "workingDirectory": [STATE]},
    )
    inv = invocation(ssm, sent["Command"]["CommandId"], box.instance_id, "Success", "Failed", "TimedOut")
    assert inv["Status"] == "Success" and inv["ResponseCode"] == 0
    out, err = inv["StandardOutputContent"], inv["StandardErrorContent"]
    assert out.startswith(f"{STATE}\nooo") and len(out) == MAX_STDOUT_CHARS
    assert set(err) == {"e"} and len(err) == MAX_STDERR_CHARS
    assert box.host_path(f"{STATE}/ssm-wrote").read_text() == "here\n"


def test_an_instance_that_is_not_in_the_twin_is_not_a_managed_instance(twin):
    _, ssm, _ = twin
    result = control(ssm, "true").kill("i-0fffffffffffffff0", "example.org", 1)
    assert not result.ok and result.detail.startswith("InvalidInstanceId"), result.detail  # AWS's answer
