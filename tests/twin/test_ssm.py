"""The twin's SSM agent against the hub's SSM rung: commands sent through a real moto server run for real
inside a booted instance, and GetCommandInvocation tells what happened there. Root only (see conftest); one
instance for the module. Nothing is faked: the outcome is what the script did in the instance."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import boto3
import pytest

from embedded.twin import network
from embedded.twin.ssm import MAX_STDERR_CHARS, MAX_STDOUT_CHARS, TwinSsmAgent
from fleet.clock import SystemClock
from hub.control.ssm import SsmControl
from tests.helpers.wait import wait_for

ACCOUNT, REGION = "123456789012", "us-east-1"
STAY_UP = '#cloud-config\nruncmd:\n  - "true"\n'
STATE = "/var/lib/gridfleet"


@pytest.fixture(scope="module")
def twin(twin_ok):
    """A moto server on the bridge, an instance moto launched booted in the twin, and the agent polling."""
    from moto.server import ThreadedMotoServer

    from embedded.twin import InstanceSandbox

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


def alive(box, pid: str) -> bool:
    """The process runs in the instance (a zombie does not: its parent, the instance's init, has yet to reap it)."""
    state = box.run(["ps", "-o", "stat=", "-p", pid]).stdout.strip()
    return bool(state) and not state.startswith("Z")


def invocation(ssm, command_id: str, instance_id: str, *statuses: str) -> dict:
    def get():
        inv = ssm.get_command_invocation(CommandId=command_id, InstanceId=instance_id)
        return inv if inv["Status"] in statuses else None

    return wait_for(get, timeout=20, interval=0.05)


def test_the_kill_command_runs_inside_the_instance_and_reports_success(twin):
    box, ssm, _ = twin
    started = box.run(["sh", "-c", f"setsid sleep 600 >/dev/null 2>&1 & echo $! > {STATE}/crawler.pid"])
    pid = box.host_path(f"{STATE}/crawler.pid").read_text().strip()
    assert started.returncode == 0 and alive(box, pid)
    script = f"kill -9 $(cat {STATE}/crawler.pid) && echo killed > {STATE}/killed && echo killed pid {pid}"
    result = control(ssm, script).kill(box.instance_id, "example.org", 2)
    assert (result.ok, result.path, result.detail) == (True, "ssm", f"killed pid {pid}")
    assert box.host_path(f"{STATE}/killed").read_text() == "killed\n"
    assert not Path(f"{STATE}/killed").exists()  # the instance's state directory, not the host's
    assert wait_for(lambda: not alive(box, pid), timeout=5)
    listed = ssm.list_commands(InstanceId=box.instance_id)["Commands"]
    assert listed[0]["Status"] == "Success" and listed[0]["CompletedCount"] == 1


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
    assert alive(box, pid)
    inv = invocation(ssm, command_id, box.instance_id, "TimedOut", "Success", "Failed")
    assert (inv["Status"], inv["StatusDetails"], inv["ResponseCode"]) == ("TimedOut", "ExecutionTimedOut", -1)
    assert not alive(box, pid)
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
    script = ["pwd", "head -c 30000 /dev/zero | tr '\\0' o", "head -c 9000 /dev/zero | tr '\\0' e >&2"]
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


def test_an_instance_that_is_not_in_the_twin_gets_no_agent(twin):
    _, ssm, _ = twin
    result = control(ssm, "true").kill("i-0fffffffffffffff0", "example.org", 1)
    assert (result.ok, result.detail) == (False, "Failed: Undeliverable")
