"""The EC2 kill rungs: SSM (moto, and faults at the client seam), SSH against a real sshd, and the ladder."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from fleet import procs
from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.clock import FakeClock
from fleet.config.aws import AwsConfig
from fleet.crawl import crawlerfile
from hub.control.aws import (
    AcceptNewHostKeys,
    ConsoleHostKeys,
    LadderControl,
    SshControl,
    SsmControl,
    console_text,
    ec2_node_control,
    host_key_policy,
    host_keys_from_console,
    kill_command,
    private_address,
)
from hub.control.base import KillResult
from tests.helpers.sshd import Sshd, keygen, start_sshd
from tests.helpers.wait import wait_for

REGION = "ap-northeast-2"
GRIDFLEET = str(Path(sys.executable).parent / "gridfleet")


def client_error(code: str, message: str = "", op: str = "SendCommand") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message or f"{code} happened"}}, op)


# --------------------------------------------------------------------------- the command


def test_kill_command_quotes_every_value():
    cmd = kill_command("a site; rm -rf /", 3, gridfleet_bin="/opt/grid fleet/gridfleet", state_dir="/var/$HOME")
    assert cmd == (
        "'/opt/grid fleet/gridfleet' node kill --state-dir '/var/$HOME' --site 'a site; rm -rf /' --attempt 3"
    )
    assert (
        kill_command("s1", 2) == "/opt/gridfleet/venv/bin/gridfleet node kill --state-dir /var/lib/gridfleet "
        "--site s1 --attempt 2"
    )


# --------------------------------------------------------------------------- SSM under moto


@pytest.fixture(scope="module")
def aws_clients(moto_endpoint) -> AwsClients:
    return AwsClients(AwsConfig(endpoint_url=moto_endpoint, region=REGION), credentials=LOCAL_CREDENTIALS)


@pytest.fixture(scope="module")
def moto_instance(aws_clients) -> dict[str, Any]:
    ec2 = aws_clients.client("ec2")
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    return ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="t3.medium")["Instances"][0]


def test_ssm_kill_sends_the_kill_command_and_reads_success(aws_clients, moto_instance):
    ssm = aws_clients.client("ssm")
    sent: list[dict] = []
    ssm.meta.events.register("before-parameter-build.ssm.SendCommand", lambda params, **_: sent.append(dict(params)))
    clock = FakeClock()
    iid = moto_instance["InstanceId"]

    result = SsmControl(ssm, clock, timeout_s=30, poll_s=1).kill(iid, "site-7", 4)

    assert result.ok and result.path == "ssm", result
    assert len(sent) == 1
    assert sent[0]["Parameters"] == {"commands": [kill_command("site-7", 4)]}
    assert sent[0]["DocumentName"] == "AWS-RunShellScript"
    assert sent[0]["TimeoutSeconds"] >= 30
    assert "site-7" in sent[0]["Comment"] and "4" in sent[0]["Comment"]
    [listed] = [c for c in ssm.list_commands(InstanceId=iid)["Commands"] if c["Comment"] == sent[0]["Comment"]]
    assert listed["Parameters"]["commands"] == [kill_command("site-7", 4)]


def test_private_address_from_describe_instances(aws_clients, moto_instance):
    address_of = private_address(aws_clients.client("ec2"))
    assert address_of(moto_instance["InstanceId"]) == moto_instance["PrivateIpAddress"]


# --------------------------------------------------------------------------- SSM faults at the seam


class FakeSsm:
    """An SSM client that plays back scripted answers.

    moto's SendCommand always reports Success and runs nothing, so it cannot
    produce an undeliverable command, a failed or timed-out one, or an
    invocation that is not registered yet; these are injected here, at the
    client seam SsmControl talks to.
    """

    def __init__(self, invocations: list[Any] = (), send_error: ClientError | None = None):
        self.invocations = list(invocations)  # each: a status string, a dict answer, or a ClientError
        self.send_error = send_error
        self.sent: list[dict] = []
        self.polls = 0
        self.cancelled: list[str] = []

    def send_command(self, **kwargs: Any) -> dict:
        if self.send_error is not None:
            raise self.send_error
        self.sent.append(kwargs)
        return {"Command": {"CommandId": "cmd-1", "Status": "Pending"}}

    def get_command_invocation(self, CommandId: str, InstanceId: str) -> dict:
        self.polls += 1
        head = self.invocations.pop(0) if len(self.invocations) > 1 else self.invocations[0]
        if isinstance(head, ClientError):
            raise head
        if isinstance(head, str):
            head = {"Status": head, "StatusDetails": head}
        return {
            "CommandId": CommandId,
            "InstanceId": InstanceId,
            "StandardOutputContent": "",
            "StandardErrorContent": "",
            "ResponseCode": -1,
            **head,
        }

    def cancel_command(self, CommandId: str, InstanceIds: list[str]) -> dict:
        self.cancelled.append(CommandId)
        return {}


NOT_YET = client_error("InvocationDoesNotExist", op="GetCommandInvocation")


def test_ssm_instance_not_managed_is_a_failure_not_an_exception():
    ssm = FakeSsm(send_error=client_error("InvalidInstanceId", "Instances [[i-1]] not in a valid state"))
    result = SsmControl(ssm, FakeClock()).kill("i-1", "s", 1)
    assert result == KillResult(False, "ssm", "InvalidInstanceId: Instances [[i-1]] not in a valid state")


def test_ssm_throttling_left_after_retries_is_a_failure():
    ssm = FakeSsm(send_error=client_error("ThrottlingException", "Rate exceeded"))
    result = SsmControl(ssm, FakeClock()).kill("i-1", "s", 1)
    assert not result.ok and result.detail.startswith("ThrottlingException")


def test_ssm_failed_command_reports_status_exit_code_and_output():
    ssm = FakeSsm(
        [
            {
                "Status": "Failed",
                "StatusDetails": "Failed",
                "ResponseCode": 1,
                "StandardOutputContent": "failed: crawler survived SIGKILL\n",
            }
        ]
    )
    result = SsmControl(ssm, FakeClock()).kill("i-1", "s", 1)
    assert not result.ok and result.path == "ssm"
    assert result.detail.startswith("Failed: ") and "exit status 1" in result.detail
    assert "crawler survived SIGKILL" in result.detail


@pytest.mark.parametrize(
    "status,details",
    [
        ("TimedOut", "DeliveryTimedOut"),
        ("Cancelled", "Cancelled"),
        ("Failed", "Undeliverable"),
        ("TimedOut", "ExecutionTimedOut"),
    ],
)
def test_ssm_terminal_failures(status, details):
    ssm = FakeSsm([{"Status": status, "StatusDetails": details}])
    result = SsmControl(ssm, FakeClock()).kill("i-1", "s", 1)
    assert not result.ok and result.detail.startswith(f"{status}: ")
    if details != status:
        assert details in result.detail


def test_ssm_invocation_not_registered_yet_then_success_polls_on_the_fake_clock():
    ssm = FakeSsm([NOT_YET, NOT_YET, {"Status": "Success", "StandardOutputContent": "ok: killed process group 7\n"}])
    clock = FakeClock()
    start, wall = clock.monotonic(), time.monotonic()
    result = SsmControl(ssm, clock, timeout_s=60, poll_s=2).kill("i-1", "s", 1)
    assert result == KillResult(True, "ssm", "ok: killed process group 7")
    assert ssm.polls == 3
    assert clock.monotonic() - start == 4  # two sleeps of poll_s, on the injected clock
    assert time.monotonic() - wall < 1


def test_ssm_pending_until_the_deadline_times_out_and_cancels():
    ssm = FakeSsm(["InProgress"])
    clock = FakeClock()
    start, wall = clock.monotonic(), time.monotonic()
    result = SsmControl(ssm, clock, timeout_s=45, poll_s=1).kill("i-1", "s", 1)
    assert not result.ok and result.path == "ssm"
    assert result.detail.startswith("TimedOut: ") and "InProgress" in result.detail
    assert clock.monotonic() - start == 45
    assert ssm.polls == 46
    assert ssm.cancelled == ["cmd-1"]
    assert time.monotonic() - wall < 1


def test_ssm_never_registered_times_out():
    ssm = FakeSsm([NOT_YET])
    result = SsmControl(ssm, FakeClock(), timeout_s=5, poll_s=1).kill("i-1", "s", 1)
    assert not result.ok and result.detail.startswith("TimedOut: ")


# --------------------------------------------------------------------------- host keys from the console


def ed25519_blob(seed: int) -> str:
    name = b"ssh-ed25519"
    raw = len(name).to_bytes(4, "big") + name + (32).to_bytes(4, "big") + bytes([seed]) * 32
    return base64.b64encode(raw).decode()


def console(*key_lines: str, noise: str = "[   11.2] cloud-init[812]: Cloud-init v. 24.1 finished") -> str:
    return "\n".join(
        [
            "[    0.000000] Linux version 6.1.0-28-cloud-amd64",
            "-----BEGIN SSH HOST KEY FINGERPRINTS-----",
            "256 SHA256:abc root@ip-10-0-1-5 (ED25519)",
            "-----END SSH HOST KEY FINGERPRINTS-----",
            "-----BEGIN SSH HOST KEY KEYS-----",
            *key_lines,
            "-----END SSH HOST KEY KEYS-----",
            noise,
            "",
        ]
    )


def test_host_keys_from_console_reads_only_the_keys_block():
    a, b = ed25519_blob(1), ed25519_blob(2)
    text = f"ssh-ed25519 {ed25519_blob(9)} outside the block\n" + console(
        f"ssh-ed25519 {a} root@ip-10-0-1-5",
        f"[   10.5] cloud-init[800]: ssh-ed25519 {b}",
        "ssh-rsa not-base64!! root@x",
        "garbage line",
    )
    assert host_keys_from_console(text) == [("ssh-ed25519", a), ("ssh-ed25519", b)]


def test_host_keys_from_console_rejects_a_blob_of_another_type():
    assert host_keys_from_console(console(f"ssh-rsa {ed25519_blob(1)}")) == []


def test_host_keys_from_console_without_block_or_end():
    assert host_keys_from_console("boot\nlogin:\n") == []
    assert host_keys_from_console("-----BEGIN SSH HOST KEY KEYS-----\n") == []


def test_console_text_decodes_base64_and_passes_plain_text():
    text = console(f"ssh-ed25519 {ed25519_blob(1)}")
    assert console_text(base64.b64encode(text.encode()).decode()) == text
    assert console_text(text) == text
    assert console_text(None) == ""


class FakeEc2:
    """GetConsoleOutput of one instance, base64-encoded as EC2 returns it."""

    def __init__(self, text: str | None, latest_error: str | None = None):
        self.text = text
        self.latest_error = latest_error
        self.calls: list[dict] = []

    def get_console_output(self, **kwargs: Any) -> dict:
        self.calls.append(kwargs)
        if kwargs.get("Latest") and self.latest_error:
            raise client_error(self.latest_error, op="GetConsoleOutput")
        out = {"InstanceId": kwargs["InstanceId"]}
        if self.text is not None:
            out["Output"] = base64.b64encode(self.text.encode()).decode()
        return out


def test_console_host_keys_falls_back_to_the_buffered_output_and_caches():
    blob = ed25519_blob(5)
    ec2 = FakeEc2(console(f"ssh-ed25519 {blob}"), latest_error="UnsupportedOperation")
    keys = ConsoleHostKeys(ec2)
    assert keys.keys_of("i-1") == [("ssh-ed25519", blob)]
    assert keys.keys_of("i-1") == [("ssh-ed25519", blob)]
    assert ec2.calls == [{"InstanceId": "i-1", "Latest": True}, {"InstanceId": "i-1"}]


def test_host_key_policy_by_name():
    assert isinstance(host_key_policy("console", FakeEc2(None)), ConsoleHostKeys)
    assert isinstance(host_key_policy("accept-new", None), AcceptNewHostKeys)
    with pytest.raises(ValueError):
        host_key_policy("trust-me", None)


# --------------------------------------------------------------------------- SSH against a real sshd


@pytest.fixture(scope="module")
def sshd(tmp_path_factory) -> Sshd:
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        server.stop()


STAND_IN = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(child.pid))
import os; os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(300)
"""


class StandIn:
    """A crawler stand-in in its own process group, with a child of its own."""

    def __init__(self, workdir: Path):
        pid_file = workdir / "child.pid"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", STAND_IN, str(pid_file)], start_new_session=True, stdin=subprocess.DEVNULL
        )
        self.pid = self.proc.pid
        self.child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text()))

    def alive(self) -> bool:
        return procs.pid_alive(self.pid) or procs.pid_alive(self.child)

    def dead(self) -> bool:
        self.proc.poll()  # reap our own child
        return not procs.pid_alive(self.pid) and not procs.pid_alive(self.child)

    def stop(self) -> None:
        for pid in (self.pid, self.child):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=5)


@pytest.fixture
def state_dir(tmp_path) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    return d


@pytest.fixture
def crawl(tmp_path, state_dir):
    """A running stand-in crawler of site-a attempt 2, recorded in crawler.json."""
    stand_in = StandIn(tmp_path)
    crawlerfile.write(state_dir, "site-a", 2, stand_in.pid)
    try:
        yield stand_in
    finally:
        stand_in.stop()


def ssh_control(
    sshd: Sshd, state_dir: Path, *, host_keys=None, port: int | None = None, command=None, timeout_s: float = 10.0
) -> SshControl:
    if command is None:

        def command(site: str, attempt: int) -> str:
            return kill_command(site, attempt, gridfleet_bin=GRIDFLEET, state_dir=str(state_dir))

    return SshControl(
        lambda iid: "127.0.0.1",
        user="root",
        key_path=str(sshd.client_key),
        host_keys=host_keys or AcceptNewHostKeys(),
        port=port or sshd.port,
        timeout_s=timeout_s,
        command=command,
    )


def test_ssh_kills_the_crawl_and_its_children(sshd, state_dir, crawl):
    result = ssh_control(sshd, state_dir).kill("i-1", "site-a", 2)
    assert result.ok and result.path == "ssh", result
    assert "killed process group" in result.detail
    wait_for(crawl.dead, timeout=5)


def test_ssh_kill_of_another_attempt_leaves_the_crawl_running(sshd, state_dir, crawl):
    result = ssh_control(sshd, state_dir).kill("i-1", "site-a", 1)
    assert result.ok and result.path == "ssh", result
    assert "attempt 2" in result.detail
    assert crawl.alive()


def test_ssh_with_console_host_keys_trusts_the_listed_key(sshd, state_dir, crawl):
    kind, blob = sshd.host_key
    ec2 = FakeEc2(console(f"{kind} {blob} root@ip-10-0-1-5"))
    result = ssh_control(sshd, state_dir, host_keys=ConsoleHostKeys(ec2)).kill("i-0abc", "site-a", 2)
    assert result.ok and result.path == "ssh", result
    assert ec2.calls[0] == {"InstanceId": "i-0abc", "Latest": True}
    wait_for(crawl.dead, timeout=5)


def test_ssh_with_console_host_keys_rejects_an_unlisted_key(sshd, state_dir, crawl, tmp_path):
    other = keygen(tmp_path / "other-hostkey")
    ec2 = FakeEc2(console(f"{other[0]} {other[1]} root@ip-10-0-1-5"))
    result = ssh_control(sshd, state_dir, host_keys=ConsoleHostKeys(ec2)).kill("i-0abc", "site-a", 2)
    assert not result.ok and result.path == "ssh"
    assert "host key" in result.detail and "i-0abc" in result.detail
    assert crawl.alive()


def test_ssh_with_console_host_keys_rejects_when_the_console_lists_none(sshd, state_dir, crawl):
    ec2 = FakeEc2("[    0.0] Linux version 6.1\nlogin: \n")
    result = ssh_control(sshd, state_dir, host_keys=ConsoleHostKeys(ec2)).kill("i-0abc", "site-a", 2)
    assert not result.ok and "no SSH host keys" in result.detail
    assert crawl.alive()


def test_ssh_no_server_fails_quickly(sshd, state_dir):
    started = time.monotonic()
    result = ssh_control(sshd, state_dir, port=procs.free_port(), timeout_s=5).kill("i-1", "site-a", 2)
    assert not result.ok and result.path == "ssh"
    assert time.monotonic() - started < 3


def test_ssh_no_address():
    control = SshControl(lambda iid: None, user="root", key_path="/nonexistent", host_keys=AcceptNewHostKeys())
    assert control.kill("i-1", "s", 1) == KillResult(False, "ssh", "no address")


def test_ssh_address_lookup_error_is_a_failure():
    def lookup(iid: str) -> str:
        raise client_error("InvalidInstanceID.NotFound", "gone", op="DescribeInstances")

    control = SshControl(lookup, user="root", key_path="/nonexistent", host_keys=AcceptNewHostKeys())
    result = control.kill("i-1", "s", 1)
    assert not result.ok and "InvalidInstanceID.NotFound" in result.detail


def test_ssh_command_exit_status_is_in_the_detail(sshd, state_dir):
    result = ssh_control(sshd, state_dir, command=lambda s, a: "echo cannot kill >&2; exit 1").kill("i-1", "s", 1)
    assert result == KillResult(False, "ssh", "exit status 1: cannot kill")


def test_ssh_command_that_hangs_times_out(sshd, state_dir, tmp_path):
    pid_file = tmp_path / "hang.pid"
    started = time.monotonic()
    try:
        result = ssh_control(
            sshd, state_dir, command=lambda s, a: f"echo $$ > {pid_file}; exec sleep 30", timeout_s=1
        ).kill("i-1", "s", 1)
        assert not result.ok and "did not finish" in result.detail
        assert time.monotonic() - started < 5
    finally:
        if pid_file.exists():  # the session's command outlives the closed channel: end it here
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


def test_ssh_bad_key_file_is_a_failure(sshd, state_dir, tmp_path):
    bad = tmp_path / "not-a-key"
    bad.write_text("hello\n")
    control = SshControl(
        lambda iid: "127.0.0.1", user="root", key_path=str(bad), host_keys=AcceptNewHostKeys(), port=sshd.port
    )
    assert not control.kill("i-1", "s", 1).ok


# --------------------------------------------------------------------------- the ladder


def test_ladder_falls_through_to_ssh_when_ssm_cannot_deliver(sshd, state_dir, crawl):
    ssm = FakeSsm(send_error=client_error("InvalidInstanceId", "not managed"))
    ladder = LadderControl([SsmControl(ssm, FakeClock()), ssh_control(sshd, state_dir)])
    result = ladder.kill("i-1", "site-a", 2)
    assert result.ok and result.path == "ssh", result
    wait_for(crawl.dead, timeout=5)


def test_ladder_reports_every_rung_when_all_fail(sshd, state_dir, crawl):
    ssm = FakeSsm(send_error=client_error("InvalidInstanceId", "not managed"))
    ladder = LadderControl(
        [SsmControl(ssm, FakeClock()), ssh_control(sshd, state_dir, port=procs.free_port(), timeout_s=5)]
    )
    result = ladder.kill("i-1", "site-a", 2)
    assert not result.ok and result.path == "ssh"
    assert result.detail.startswith("ssm: InvalidInstanceId: not managed; ssh: ")
    assert crawl.alive()


def test_ladder_stops_at_the_first_rung_that_works():
    class Boom:
        def kill(self, instance_id, site, attempt):
            raise AssertionError("not reached")

    ssm = FakeSsm([{"Status": "Success", "StandardOutputContent": "ok: no crawler running"}])
    result = LadderControl([SsmControl(ssm, FakeClock()), Boom()]).kill("i-1", "s", 1)
    assert result == KillResult(True, "ssm", "ok: no crawler running")


def test_ladder_rung_that_raises_counts_as_failed():
    class Boom:
        path = "boom"

        def kill(self, instance_id, site, attempt):
            raise RuntimeError("bug")

    result = LadderControl([Boom()]).kill("i-1", "s", 1)
    assert result == KillResult(False, "boom", "boom: RuntimeError: bug")


def test_ec2_node_control_from_config(aws_clients):
    ssm_only = ec2_node_control(AwsConfig(), aws_clients, FakeClock())
    assert [type(r) for r in ssm_only.rungs] == [SsmControl]
    both = ec2_node_control(
        AwsConfig(ssh_key_path="/etc/gridfleet/id_ed25519", install_dir="/srv/gf", state_dir="/srv/state"),
        aws_clients,
        FakeClock(),
    )
    ssm, ssh = both.rungs
    assert isinstance(ssh, SshControl) and isinstance(ssh.host_keys, ConsoleHostKeys)
    assert ssm.command("s", 1) == kill_command(
        "s", 1, gridfleet_bin="/srv/gf/venv/bin/gridfleet", state_dir="/srv/state"
    )
    assert ssh.command("s", 1) == "sudo -n " + ssm.command("s", 1)
    assert ssh.user == "admin"
