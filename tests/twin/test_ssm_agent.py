"""The twin's SSM agent without an instance (no root): how it changes moto's SendCommand, and its pure parts.
moto runs in-process (`mock_aws`), in a module of its own: its reset would clear the moto server that
test_ssm.py's instances are launched in."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from twin.ssm import TwinSsmAgent, outcome, shell_argv

ACCOUNT, REGION = "123456789012", "us-east-1"
IID = "i-0123456789abcdef0"


class Instances:
    """Who SSM can deliver to: `managed` instance ids (a stand-in for the sandbox; its commands never run)."""

    def __init__(self) -> None:
        self.managed: set[str] = set()

    def __call__(self, instance_id: str) -> object:
        return object() if instance_id in self.managed else None


def test_an_instance_without_a_running_agent_is_refused_as_aws_refuses_it():
    with mock_aws():
        ssm = boto3.client("ssm", region_name=REGION)
        instances = Instances()
        agent = TwinSsmAgent.for_region(ACCOUNT, REGION, instances)
        with pytest.raises(ClientError) as e:
            ssm.send_command(InstanceIds=[IID], DocumentName="AWS-RunShellScript", Parameters={"commands": ["true"]})
        error = e.value.response["Error"]
        assert error["Code"] == "InvalidInstanceId"
        assert error["Message"] == f"Instances [[{IID}]] not in a valid state for account {ACCOUNT}"
        assert ssm.list_commands()["Commands"] == []
        agent.close()


def test_only_run_shell_script_starts_pending_across_a_reset_and_close_gives_moto_its_send_command_back():
    """No root: moto in-process; the instance's agent goes between the send and the delivery: undeliverable."""
    from moto.ssm.models import ssm_backends

    with mock_aws():
        ssm = boto3.client("ssm", region_name=REGION)
        instances = Instances()
        instances.managed.add(IID)
        agent = TwinSsmAgent.for_region(ACCOUNT, REGION, instances)
        iid = IID

        def send(document: str) -> dict:
            return ssm.send_command(InstanceIds=[iid], DocumentName=document, Parameters={"commands": ["true"]})

        sent = send("AWS-RunShellScript")["Command"]
        assert (sent["Status"], send("AWS-RunPowerShellScript")["Command"]["Status"]) == ("Pending", "Success")
        instances.managed.clear()
        assert agent.poll() == 1 and agent.poll() == 0
        inv = ssm.get_command_invocation(CommandId=sent["CommandId"], InstanceId=iid)
        assert (inv["Status"], inv["StatusDetails"], inv["ResponseCode"]) == ("Failed", "Undeliverable", -1)
        instances.managed.add(IID)
        ssm_backends.reset()  # moto reset (clears the backend, wrapper and all): the next pass wraps it again
        assert send("AWS-RunShellScript")["Command"]["Status"] == "Success"
        agent.poll()
        assert send("AWS-RunShellScript")["Command"]["Status"] == "Pending"
        agent.close()
        assert send("AWS-RunShellScript")["Command"]["Status"] == "Success"  # moto's own answer again


def test_a_command_goes_only_to_the_instances_it_names():
    """moto alone adds every instance of the region to a command sent without Targets."""
    with mock_aws():
        ec2, ssm = boto3.client("ec2", region_name=REGION), boto3.client("ssm", region_name=REGION)
        launched = ec2.run_instances(ImageId="ami-12c6146b", MinCount=2, MaxCount=2)["Instances"]
        one, other = (i["InstanceId"] for i in launched)
        instances = Instances()
        instances.managed.add(one)
        agent = TwinSsmAgent.for_region(ACCOUNT, REGION, instances)
        sent = ssm.send_command(InstanceIds=[one], DocumentName="AWS-RunShellScript", Parameters={"commands": ["true"]})
        instances.managed.clear()  # no command runs: the stand-in has no sandbox
        command_id = sent["Command"]["CommandId"]
        assert sent["Command"]["InstanceIds"] == [one] and sent["Command"]["TargetCount"] == 1
        with pytest.raises(ClientError, match="InvocationDoesNotExist"):
            ssm.get_command_invocation(CommandId=command_id, InstanceId=other)
        assert agent.poll() == 1
        agent.close()


def test_send_command_refuses_parameters_the_document_refuses():
    with mock_aws():
        ssm = boto3.client("ssm", region_name=REGION)
        agent = TwinSsmAgent.for_region(ACCOUNT, REGION, lambda instance_id: None)
        for parameters in ({"commands": ["true"], "executionTimeout": ["soon"]}, {"commands": []}):
            with pytest.raises(ClientError, match="InvalidParameters"):
                ssm.send_command(InstanceIds=[IID], DocumentName="AWS-RunShellScript", Parameters=parameters)
        assert ssm.list_commands()["Commands"] == [] and agent.poll() == 0
        agent.close()


def test_shell_argv_joins_the_commands_and_bounds_them():
    argv, timeout_s = shell_argv({"commands": ["a", "b"], "executionTimeout": ["7"]})
    assert argv[:3] == ["timeout", "--kill-after=5", "7"] and argv[3:6] == ["bash", "-c", "a\nb"]
    argv, timeout_s = shell_argv({"commands": ["a"], "workingDirectory": ["/srv/x y"]})
    assert timeout_s == 3600 and argv[-1] == "/srv/x y" and argv[5].startswith('cd -- "$1" || exit 1\n')


def test_outcome_tells_a_timeout_from_a_script_that_exits_124():
    assert outcome(124, 10.0, 5.0)["Status"] == "TimedOut"
    assert outcome(124, 1.0, 5.0) == {"Status": "Failed", "StatusDetails": "Failed", "ResponseCode": 124}
    assert outcome(0, 1.0, 5.0)["Status"] == "Success"
