"""The twin fails where AWS and Debian would: an instance has no SSM agent and no EFS mount helper until it installs
them, with the boot scripts' own install steps, from where AWS serves them; its host keys reach the console only
when cloud-init's final stage gets to them; SSM answers InvalidInstanceId for an instance without a running agent.
Root only (see conftest). One twin (moto on the bridge, instances booted for real) for the module."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from cloud_init import render as render_mod
from hub.control.ssh import HOST_KEYS_BEGIN, HOST_KEYS_END, console_text
from tests.helpers.twin_stacks import running_twin
from tests.helpers.wait import wait_for
from twin.instance.standins import AGENT_PID_FILE

REGION = "ap-northeast-2"


@pytest.fixture(scope="module")
def twin(twin_ok):
    with running_twin("gridfleet-twin-fidelity-", REGION) as stack:
        yield stack


def install_steps(*steps: str) -> str:
    """A runcmd script of the boot scripts' own install functions (`_install.sh.j2`, `_node_install.sh.j2`),
    then `steps`."""
    env = render_mod.environment()
    ctx = {"install_dir": "/opt/gridfleet"}
    parts = [
        "#!/bin/bash",
        "set -Eeuo pipefail",
        "REGION=" + REGION,
        "INSTALL_DIR=/opt/gridfleet STATE_DIR=/var/lib/gridfleet BOOT_TIMEOUT_S=300 CRAWL_HOME=/x",
        "CRAWL_USER=gridfleet CRAWL_UID=2000 WORK_DIR=$(mktemp -d)",
        'log() { printf "%s\\n" "$*"; }',
        'fail() { printf "failed: %s\\n" "$*"; exit 1; }',
        env.get_template("_install.sh.j2").render(ctx),
        env.get_template("_node_install.sh.j2").render(ctx),
        *steps,
    ]
    return "\n".join(parts) + "\n"


def launch(twin, runcmd_script: str) -> str:
    doc = {
        "write_files": [{"path": "/usr/local/sbin/steps", "permissions": "0755", "content": runcmd_script}],
        "runcmd": [["/usr/local/sbin/steps"]],
    }
    user_data = "#cloud-config\n" + json.dumps(doc)
    ec2 = twin.client("ec2")
    return ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, UserData=user_data)["Instances"][0][
        "InstanceId"
    ]


def booted(twin, iid: str):
    box = wait_for(lambda: twin.running(iid), timeout=30, interval=0.1)
    result = wait_for(lambda: box.wait_boot(0.1), timeout=120, interval=0.1)
    return box, result


def send(twin, iid: str) -> dict:
    return twin.client("ssm").send_command(
        InstanceIds=[iid], DocumentName="AWS-RunShellScript", Parameters={"commands": ["echo from-ssm"]}
    )["Command"]


def test_ssm_reaches_an_instance_only_once_the_boot_installed_and_started_the_agent(twin):
    bare = launch(twin, "#!/bin/sh\ntrue\n")
    box, result = booted(twin, bare)
    assert result.exit_code == 0
    with pytest.raises(ClientError) as e:  # as AWS answers for an instance that is not managed
        send(twin, bare)
    assert e.value.response["Error"]["Code"] == "InvalidInstanceId"
    assert f"Instances [[{bare}]] not in a valid state" in e.value.response["Error"]["Message"]

    managed = launch(twin, install_steps("install_ssm_agent"))
    box, result = booted(twin, managed)
    assert result.exit_code == 0, box.boot_log.read_text()[-3000:]
    assert box.host_path("/usr/bin/amazon-ssm-agent").exists()  # in the instance's own /usr, never the host's
    assert not Path("/usr/bin/amazon-ssm-agent").exists()
    wait_for(lambda: box.host_path(AGENT_PID_FILE).exists(), timeout=10)
    # what SendCommand asks of the instance: its agent answers (checked inside the instance, which takes longer
    # than the pid file's writing on a busy machine)
    wait_for(lambda: twin.managed(managed), timeout=60, interval=0.2)
    command = send(twin, managed)
    ssm = twin.client("ssm")

    def done():
        inv = ssm.get_command_invocation(CommandId=command["CommandId"], InstanceId=managed)
        return inv if inv["Status"] == "Success" else None

    assert wait_for(done, timeout=30, interval=0.2)["StandardOutputContent"] == "from-ssm\n"


def test_the_agent_for_another_architecture_is_refused_by_dpkg(twin):
    arm64 = 'dpkg() { [ "$1" = --print-architecture ] && echo arm64 || command dpkg "$@"; }'
    steps = install_steps(arm64, "pause() { :; }", "install_ssm_agent")  # apt_get's retries need no pause here
    box, result = booted(twin, launch(twin, steps))
    assert result.exit_code != 0
    log = box.boot_log.read_text()
    assert "failed: cannot install the SSM agent" in log
    assert "package architecture (arm64) does not match system (amd64)" in log


def test_mount_t_efs_needs_the_helper_and_a_file_system_the_account_has(twin):
    fs = twin.client("efs").create_file_system(CreationToken="fidelity")["FileSystemId"]
    point = twin.client("efs").create_access_point(FileSystemId=fs)["AccessPointId"]
    deb = twin.efs_utils_deb
    steps = install_steps(
        "mkdir -p /efs",
        f'if mount -t efs -o tls,iam {fs}:/ /efs 2>"$WORK_DIR/err"; then echo mounted-without-helper; fi',
        'grep -o "unknown filesystem type .efs." "$WORK_DIR/err"',
        'efs_utils_deb() { aws s3 cp --no-sign-request "s3://efs-debs/amazon-efs-utils.deb" "$1"; }',
        "install_efs_utils",
        f"mount -t efs -o tls,iam {fs}:/ /efs",
        "mountpoint -q /efs && echo shared > /efs/from-instance",
        "mkdir -p /other && ! mount -t efs -o tls,iam fs-0000000000000000f:/ /other && echo unknown-refused",
        f"! mount -t efs -o tls,iam,accesspoint=fsap-00000000000000000 {fs}:/ /other && echo ap-refused",
        f"mount -t efs -o tls,iam,accesspoint={point} {fs}:/ /other && echo ap-mounted",
    )
    s3 = twin.client("s3")
    s3.create_bucket(Bucket="efs-debs", CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.upload_file(str(deb), "efs-debs", "amazon-efs-utils.deb", ExtraArgs={"ACL": "public-read"})
    box, result = booted(twin, launch(twin, steps))
    log = box.boot_log.read_text()
    assert result.exit_code == 0, log[-3000:]
    assert "mounted-without-helper" not in log and "unknown filesystem type 'efs'" in log
    assert "unknown-refused" in log and "ap-refused" in log and "ap-mounted" in log
    assert (twin.root / "efs" / "from-instance").read_text() == "shared\n"  # the twin's one EFS directory


def test_host_keys_reach_the_console_only_after_the_runcmd_script(twin):
    iid = launch(twin, "#!/bin/sh\nwhile [ ! -e /var/lib/cloud/go ]; do sleep 0.1; done\n")
    box = wait_for(lambda: twin.running(iid), timeout=30, interval=0.1)
    wait_for(lambda: box.host_path("/etc/ssh/ssh_host_ed25519_key.pub").exists(), timeout=30)  # `ssh`: init stage
    console = twin.client("ec2")

    def output() -> str:
        return console_text(console.get_console_output(InstanceId=iid).get("Output"))

    assert HOST_KEYS_BEGIN not in box.console.read_text()  # scripts-user runs; keys-to-console comes after it
    box.host_path("/var/lib/cloud/go").touch()
    assert box.wait_boot(30).exit_code == 0
    text = wait_for(lambda: (o := output()) and HOST_KEYS_BEGIN in o and o, timeout=10, interval=0.2)
    keys = text.split(HOST_KEYS_BEGIN, 1)[1].split(HOST_KEYS_END, 1)[0].split()
    own = box.host_path("/etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[1]
    assert own in keys
    assert "Cloud-init v. " in text.split(HOST_KEYS_END, 1)[1]  # final-message comes after keys-to-console


def test_a_node_refuses_a_bundle_built_for_another_platform_and_says_so_everywhere(twin):
    """A real node boot (the rendered user-data) in an x86_64 instance with CPython 3.11, given a bundle built for
    aarch64: it stops at its check-platform step, and the one line is on its console, its node item (written with
    the AWS CLI: gridfleet is not installed) and its log stream (the boot log, shipped with the AWS CLI)."""
    import io
    import tarfile

    from cloud_init import NodeUserData, render_node

    tag = "plat"
    bucket, table, group, run_id = f"gf-{tag}-bucket", f"gf-{tag}-table", f"/gf-{tag}/node", "2026-11-27"
    s3, ddb, logs, iam = (twin.client(s) for s in ("s3", "dynamodb", "logs", "iam"))
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
    keys = [{"AttributeName": "run_id", "KeyType": "HASH"}, {"AttributeName": "Site", "KeyType": "RANGE"}]
    types = [{"AttributeName": n, "AttributeType": "S"} for n in ("run_id", "Site")]
    ddb.create_table(TableName=table, BillingMode="PAY_PER_REQUEST", KeySchema=keys, AttributeDefinitions=types)
    logs.create_log_group(logGroupName=group)
    iam.create_role(RoleName=f"gf-{tag}-node", AssumeRolePolicyDocument="{}")
    iam.create_instance_profile(InstanceProfileName=f"gf-{tag}-node")
    iam.add_role_to_instance_profile(InstanceProfileName=f"gf-{tag}-node", RoleName=f"gf-{tag}-node")
    bundle = io.BytesIO()
    with tarfile.open(fileobj=bundle, mode="w:gz") as tar:
        platform = b'{"format": 1, "machine": "aarch64", "python": "3.11"}'
        for name, data in (("wheels/x.whl", b"x"), ("selenium-server.jar", b"jar"), ("platform.json", platform)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    s3.put_object(Bucket=bucket, Key="bundle/gridfleet-bundle.tar.gz", Body=bundle.getvalue())
    s3.put_object(Bucket=bucket, Key=f"runs/{run_id}/fleet.yaml", Body=b"sites: [{id: a, start_url: 'http://a/'}]\n")
    params = NodeUserData(run_id=run_id, region=REGION, bucket=bucket, bundle_key="bundle/gridfleet-bundle.tar.gz",
                          config_key=f"runs/{run_id}/fleet.yaml", efs_id="fs-0123456789abcdef0",
                          hub_address="10.77.0.1", table=table, log_group=group, boot_timeout_s=300,
                          grid_secret_parameter=f"/gf-{tag}/grid-secret")  # fmt: skip
    launched = twin.client("ec2").run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1,
                                                UserData=render_node(params),
                                                IamInstanceProfile={"Name": f"gf-{tag}-node"})  # fmt: skip
    iid = launched["Instances"][0]["InstanceId"]
    box = wait_for(lambda: twin.running(iid), timeout=30, interval=0.1)
    ec2 = twin.client("ec2")
    state = lambda: ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]  # noqa: E731
    # the failed boot shuts the instance down; moto says stopped before the twin has ended its processes (their
    # SIGTERM grace), and the twin reads the guest's word as it ends them
    wait_for(lambda: state() == "stopped" and twin.running(iid) is None, timeout=240, interval=0.2)
    result = box.wait_boot(0)  # the guest's word outlives its processes
    assert result is not None and result.exit_code != 0
    line = "node bootstrap failed at check-platform: the bundle is built for linux aarch64, CPython 3.11 but this "
    line += "instance is linux x86_64, CPython 3.11"
    assert line in box.console.read_text()
    item = ddb.get_item(TableName=table, Key={"run_id": {"S": run_id}, "Site": {"S": f"#node#{iid}"}})["Item"]
    assert item["node_state"]["S"] == "boot-failed"
    assert item["error"]["S"].startswith("check-platform: the bundle is built")
    events = logs.get_log_events(logGroupName=group, logStreamName=f"{run_id}/{iid}", startFromHead=True)["events"]
    assert any(line in e["message"] for e in events) and any("step: install-ssm-agent" in e["message"] for e in events)


def test_cloudwatch_logs_takes_the_events_of_a_day_the_twin_jumped_to(twin):
    """An instance booted after a jump writes at the twin's time, days past this machine's: CloudWatch Logs judges
    an event's time by the twin's clock, as AWS by the day's, and still refuses one over 2 hours ahead of it.
    (Last in the module: the clock only moves ahead.)"""
    twin.clock.jump(time.time() + 3 * 86400)
    logs, group, stream = twin.client("logs"), "/fidelity/node", "2026-11-30/i-0123456789abcdef0"
    logs.create_log_group(logGroupName=group)
    logs.create_log_stream(logGroupName=group, logStreamName=stream)
    at = int(twin.clock.now() * 1000)
    events = [{"timestamp": at, "message": "at the twin's time"}, {"timestamp": at + 3 * 3600_000, "message": "3 h on"}]
    answer = logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=events)
    assert answer.get("rejectedLogEventsInfo") == {"tooNewLogEventStartIndex": 1}
    got = logs.get_log_events(logGroupName=group, logStreamName=stream, startFromHead=True)["events"]
    assert [e["message"] for e in got] == ["at the twin's time"]
