"""One instance of the EC2 twin, booted for real: its own network namespace on the twin's bridge, its own
mounts over /etc and the install, state and EFS paths, its IMDSv2 inside it, and nothing left after stop().
Root only (see conftest). Nothing is faked but `apt-get`, `shutdown` and `systemctl` inside the instance,
which the twin replaces on purpose (an instance here downloads nothing and powers nothing off)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import boto3

from tests.helpers.wait import wait_for
from twin.instance import network
from twin.instance.cloud_config import TwinError
from twin.instance.sandbox import cleanup_leftovers

IMDS_GET = (
    "t=$(curl -fsS -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' http://169.254.169.254/latest/api/token)"
    ' && curl -fsS -H "X-aws-ec2-metadata-token: $t" http://169.254.169.254/latest/meta-data/{}'
)
SITE_PACKAGES = str(Path(boto3.__file__).parent.parent)
PROBE = "/etc/gridfleet/twin-probe.env"
PROBE_TEXT = json.dumps("PROBE=1\n")  # JSON is YAML


def cloud_config(*runcmd: str, files: str = "") -> str:
    lines = "".join(f"  - {json.dumps(c)}\n" for c in runcmd)
    return f"#cloud-config\n{files}runcmd:\n{lines}"


def sh(box, script: str) -> subprocess.CompletedProcess[str]:
    return box.run(["sh", "-c", script])


def test_write_files_and_runcmd_land_in_the_instance_only(sandboxes):
    files = (
        "write_files:\n"
        f"  - {{path: {PROBE}, content: {PROBE_TEXT}, permissions: '0640', owner: 'root:root'}}\n"
        "  - {path: /opt/gridfleet/marker, content: installed}\n"
        "  - {path: /usr/lib/gridfleet-probe, content: overlaid}\n"
    )
    box = sandboxes("i-0000000000000a001", cloud_config(f"cp {PROBE} /var/lib/gridfleet/copied", files=files))
    assert box.wait_boot(30).exit_code == 0
    assert sh(box, f"stat -c '%a %U' {PROBE}").stdout == "640 root\n"
    assert not Path(PROBE).exists()  # the host's /etc is untouched
    assert box.host_path(PROBE).read_text() == "PROBE=1\n"
    assert box.host_path("/var/lib/gridfleet/copied").read_text() == "PROBE=1\n"
    assert not Path("/opt/gridfleet/marker").exists()
    assert not Path("/usr/lib/gridfleet-probe").exists()  # /usr: the host's, under the instance's own layer
    assert box.host_path("/usr/lib/gridfleet-probe").read_text() == "overlaid"
    assert sh(box, "test -x /usr/bin/python3 && echo host-usr").stdout == "host-usr\n"
    assert "runcmd exited with status 0" in box.boot_log.read_text()


def test_each_instance_has_its_own_imds_and_they_reach_each_other(sandboxes):
    serve = "setsid python3 -m http.server --bind 0.0.0.0 8080 --directory /var/lib/gridfleet >/dev/null 2>&1 &"
    a = sandboxes("i-0000000000000b001", cloud_config("echo from-a > /var/lib/gridfleet/hello", serve))
    b = sandboxes("i-0000000000000b002", cloud_config("true"), tags={"gridfleet:run_id": "twin-run-1"})
    assert a.wait_boot(30).exit_code == 0 and b.wait_boot(30).exit_code == 0
    assert a.address != b.address and {a.address, b.address} <= {network.address_of(i) for i in range(2, 9)}
    for box in (a, b):
        assert sh(box, IMDS_GET.format("instance-id")).stdout == box.instance_id
        assert sh(box, IMDS_GET.format("local-ipv4")).stdout == box.address
        assert sh(box, "ip route show default").stdout == ""  # nothing routes off the bridge's subnet
    assert sh(b, IMDS_GET.format("tags/instance/gridfleet:run_id")).stdout == "twin-run-1"
    assert sh(a, IMDS_GET.format("tags/instance/gridfleet:run_id")).returncode != 0  # no tags given: none served
    assert sh(b, IMDS_GET.format("spot/instance-action")).returncode != 0
    b.imds.spot_notice()
    assert json.loads(sh(b, IMDS_GET.format("spot/instance-action")).stdout)["action"] == "terminate"
    got = wait_for(lambda: sh(b, f"curl -fsS --max-time 2 http://{a.address}:8080/hello").stdout, timeout=10)
    assert got == "from-a\n"


def test_stop_leaves_no_process_no_namespace_and_no_veth(sandboxes):
    box = sandboxes("i-0000000000000c001", cloud_config("setsid sleep 600 >/dev/null 2>&1 &", "nohup sleep 601 &"))
    assert box.wait_boot(30).exit_code == 0
    assert len(box.processes()) >= 3  # init, two sleeps
    box.stop()
    assert box.processes() == []
    assert box.netns not in network.ip("netns", "list")
    assert not any(line.startswith(network.VETH_PREFIX) for line in network.ip("-br", "link").splitlines())
    box.stop()  # again: nothing to do


def test_shims_answer_as_debian_and_make_shutdown_observable(sandboxes):
    unit = (
        "write_files:\n"
        "  - path: /etc/systemd/system/probe.service\n"
        "    content: |\n"
        "      [Service]\n"
        "      ExecStart=/bin/sh -c 'echo started; exit 3'\n"
        "      ExecStopPost=/bin/sh -c 'echo \"post $SERVICE_RESULT $EXIT_STATUS\" > /var/lib/gridfleet/post'\n"
        "      StandardOutput=append:/var/log/probe.log\n"
    )
    box = sandboxes(
        "i-0000000000000d001",
        cloud_config(
            "apt-get -o DPkg::Lock::Timeout=60 install -y --no-install-recommends curl",
            "apt-get install -y amazon-efs-utils 2> /var/lib/gridfleet/apt || true",
            "mount -t efs fs-0123456789abcdef0:/ /efs 2> /var/lib/gridfleet/efs || true",
            "systemctl start --no-block probe.service",
            "shutdown -h now",
            files=unit,
        ),
    )
    assert box.wait_boot(30).exit_code == 0
    # Debian 12 has no amazon-efs-utils: apt's own words; and no mount helper for efs without it
    assert box.host_path("/var/lib/gridfleet/apt").read_text() == "E: Unable to locate package amazon-efs-utils\n"
    assert "unknown filesystem type 'efs'" in box.host_path("/var/lib/gridfleet/efs").read_text()
    assert wait_for(lambda: box.host_path("/var/lib/gridfleet/post").exists())
    assert box.host_path("/var/lib/gridfleet/post").read_text() == "post exit-code 3\n"
    assert box.host_path("/var/log/probe.log").read_text() == "started\n"
    assert box.shutdown_requested.split()[1:] == ["shutdown", "-h", "now"]


def test_a_boot_that_overruns_its_timeout_is_killed(sandboxes):
    box = sandboxes("i-0000000000000e001", cloud_config("sleep 120"), boot_timeout_s=1)
    result = box.wait_boot(30)
    assert result.exit_code == 124 and result.seconds < 30


def test_leftovers_of_a_crashed_run_are_removed(twin_ok):
    network.add_instance(network.NETNS_PREFIX + "i-0000000000000f001", 250)
    gone = cleanup_leftovers()
    assert network.NETNS_PREFIX + "i-0000000000000f001" in gone and f"{network.VETH_PREFIX}250" in gone
    assert network.NETNS_PREFIX not in network.ip("netns", "list") and network.BRIDGE not in network.ip("link")
    assert f"{network.VETH_PREFIX}250" not in network.ip("link")


def test_an_instance_id_that_is_not_one_is_refused(twin_root):
    try:
        from twin.instance.sandbox import InstanceSandbox

        InstanceSandbox("i-../../etc", "#cloud-config\n", twin_root)
    except TwinError as e:
        assert "is not i-<8 to 17 hex digits>" in str(e)
    else:
        raise AssertionError("a path-like instance id was accepted")


#: Where the test puts boto3 and what it needs inside an instance (its own install directory).
SDK = "/opt/gridfleet/sdk"
SDK_PARTS = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six.py")


def give_sdk(box) -> None:
    target = box.host_path(SDK)
    assert target is not None
    for part in SDK_PARTS:
        source = Path(SITE_PACKAGES) / part
        if source.is_dir():
            shutil.copytree(source, target / part, dirs_exist_ok=True)
        elif source.is_file():
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / part)


def test_an_instance_reaches_the_twins_aws_with_its_instance_profile(sandboxes):
    """The path the wiring will use: a moto server on the bridge, credentials from the instance's IMDS (the
    instance has none in its environment or files), the endpoint from the environment the twin gives."""
    from moto.server import ThreadedMotoServer

    network.ensure_bridge()
    server = ThreadedMotoServer(ip_address=network.HOST_ADDRESS, port=0, verbose=False)
    server.start()
    try:
        endpoint = "http://{}:{}".format(*server.get_host_and_port())
        s3 = boto3.client(
            "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
        )
        s3.create_bucket(Bucket="gridfleet-artifacts")
        s3.put_object(Bucket="gridfleet-artifacts", Key="runs/twin/fleet.yaml", Body=b"from moto")
        env = {"AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": "us-east-1"}
        box = sandboxes("i-0000000000000a201", cloud_config("true"), role="gridfleet-node", env=env)
        assert box.wait_boot(30).exit_code == 0
        assert sh(box, IMDS_GET.format("iam/security-credentials/")).stdout == "gridfleet-node"
        # the instance's own python3 with this project's boto3, copied into the instance's install directory (the
        # project's environment may live under a path the instance masks: /tmp, /root)
        get = (
            f"import sys; sys.path.insert(0, {SDK!r}); import boto3; s3 = boto3.client('s3');"
            "print(s3.get_object(Bucket='gridfleet-artifacts', Key='runs/twin/fleet.yaml')['Body'].read().decode())"
        )
        give_sdk(box)
        got = box.run(["python3", "-I", "-c", get])
        assert got.stdout == "from moto\n", got.stderr
        bare = sandboxes("i-0000000000000a202", cloud_config("true"), env=env)  # no instance profile
        assert bare.wait_boot(30).exit_code == 0
        give_sdk(bare)
        assert "Unable to locate credentials" in bare.run(["python3", "-I", "-c", get]).stderr
    finally:
        server.stop()


def test_an_instance_keeps_reaching_the_host_when_another_instance_comes_and_goes(twin_ok):
    """A bridge left to choose its MAC takes its ports' lowest, so an instance that came and went could take the
    host's MAC with it: the other instances' connections to the twin's AWS went dead for as long as their ARP
    entry lived (seen as a log shipper's batch with no answer). The host's MAC stays put, as a VPC router's."""
    import socket

    first, passing = network.NETNS_PREFIX + "i-0000000000000f0a1", network.NETNS_PREFIX + "i-0000000000000f0a2"
    network.add_instance(first, 241)
    server = socket.create_server((network.HOST_ADDRESS, 0))
    server.settimeout(5)
    port = server.getsockname()[1]
    connect = f"import socket; socket.create_connection(({network.HOST_ADDRESS!r}, {port}), timeout=3).close()"

    def reaches() -> bool:
        out = subprocess.run(["ip", "netns", "exec", first, "python3", "-I", "-c", connect], capture_output=True,
                             timeout=30)  # fmt: skip
        if out.returncode == 0:
            server.accept()[0].close()
        return out.returncode == 0

    try:
        network.add_instance(passing, 242)
        network.ip("link", "set", "dev", f"{network.VETH_PREFIX}242", "address", "02:00:00:00:00:01")  # the lowest
        assert reaches()  # the first instance learns the host's MAC now, while the other is there
        network.remove_instance(passing, 242)
        assert reaches()  # and the host is still at it once the other is gone
        assert network.BRIDGE_MAC in network.ip("-br", "link", "show", "dev", network.BRIDGE)
    finally:
        server.close()
        network.remove_instance(passing, 242)
        network.remove_instance(first, 241)
