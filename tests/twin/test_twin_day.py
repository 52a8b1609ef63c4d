"""A day of the AWS path on the EC2 twin, whole: nothing is called directly that AWS would call.

The stack is made as infra/terraform defines it and deployed as docs/aws/first-night.md says (`twin.deploy`).
The starter Lambda is fired by its EventBridge schedule, launches the hub from the hub template; the hub boots
its rendered user-data, launches nodes through `Ec2Provider`, the nodes boot theirs and crawl with Chromium
through the hub's Selenium Grid. Three sites: one plain; one that hangs on its first attempt, with the nodes'
own watchdog off, so only the hub can end it and its first rung, SSM, does (the command runs inside the node);
one interrupted by a spot notice raised through its node's IMDS (the one fault injected, at the twin's seam
for what EC2 decides). The nodes boot the node image baked for the stack, the hub the stock image. Root only
(see conftest)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from hub.control.ssh import console_text, host_keys_from_console
from tests.twin.conftest import DAY_SITES
from twin.account import AccountLimits
from twin.day import wait_until

SITES = DAY_SITES
#: The day is bounded by its own waits (each named, each with its time); the suite's 300 s per test is for a test,
#: not for a deployment and a day, which take minutes on a busy machine.
pytestmark = pytest.mark.timeout(1500)  # the day's own waits bound it (each named, with its time)


@pytest.fixture(scope="module")
def day(twin_stack):
    d = twin_stack
    d.ensure_deployed()
    d.put_config(SITES)  # the deployment's own sites, whatever ran before
    first_boot, first_fired = len(d.twin.boots), len(d.twin.fired)
    run_id = d.start_by_schedule()
    spot_node = wait_until(lambda: d.node_of("spot", run_id, "RUN", min_pages=2), 480, "the spot site running",
                           explain=d.processes)  # fmt: skip
    d.twin.running(spot_node).imds.spot_notice()  # EC2's two-minute notice
    wait_until(lambda: d.stack_idle() and d.summary(run_id), 600, "the run archived and the stack idle",
               explain=d.processes)  # fmt: skip
    d.run_id, d.spot_node = run_id, spot_node
    d.day_boots, d.day_fired = d.twin.boots[first_boot:], d.twin.fired[first_fired:]
    return d


def test_each_site_ends_as_its_behaviour_implies(day):
    sites = day.summary(day.run_id)["sites"]
    assert {name: s["run_status"] for name, s in sites.items()} == dict.fromkeys(SITES, "COMPLETED")
    assert [a["outcome"] for a in sites["plain"]["attempts"]] == ["completed"]
    hang = sites["hang"]["attempts"]
    assert [a["outcome"] for a in hang] == ["hang", "completed"] and hang[0]["kill_path"] == "ssm", hang
    spot = sites["spot"]["attempts"]
    assert [a["outcome"] for a in spot] == ["spot", "completed"] and spot[0]["instance_id"] == day.spot_node
    outcomes = [a["outcome"] for s in sites.values() for a in s["attempts"]]
    assert "lost" not in outcomes and outcomes.count("spot") == 1  # the one fault injected, nothing else


def test_the_hang_was_killed_by_a_command_that_ran_inside_its_node(day):
    ssm = day.twin.client("ssm")
    killed = day.summary(day.run_id)["sites"]["hang"]["attempts"][0]["instance_id"]
    commands = ssm.list_commands()["Commands"]
    assert commands and all(c["DocumentName"] == "AWS-RunShellScript" for c in commands), commands
    outcomes = [ssm.get_command_invocation(CommandId=c["CommandId"], InstanceId=killed) for c in commands]
    assert [o["Status"] for o in outcomes] == ["Success"] * len(outcomes), outcomes


def test_each_instance_ran_sshd_and_the_hub_would_trust_exactly_its_host_keys(day):
    """Once cloud-init's final stage printed them (after the boot script), the console holds exactly the
    instance's host keys; an instance whose boot had not ended when it went shows none (Debian's order)."""
    ec2, finished = day.twin.client("ec2"), 0
    for boot in day.day_boots:
        out = ec2.get_console_output(InstanceId=boot.instance_id)
        text = console_text(out.get("Output"))
        keys = host_keys_from_console(text)  # what the hub's SSH rung trusts
        if "Cloud-init v. " not in text:  # its final stage never came: a node ended with the run during its boot
            assert keys == [], boot.instance_id
            continue
        finished += 1
        pubs = sorted((boot.sandbox.dir / "etc" / "ssh").glob("ssh_host_*_key.pub"))
        assert sorted(keys) == sorted(tuple(p.read_text().split()[:2]) for p in pubs), (boot.instance_id, keys)
    assert finished >= 2  # the hub and a node at least


def test_the_summary_and_report_are_in_the_bucket(day):
    s3, bucket = day.twin.client("s3"), day.deployed.config["aws"]["bucket"]
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"runs/{day.run_id}/")["Contents"]}
    assert {f"runs/{day.run_id}/summary.json", f"runs/{day.run_id}/report.html"} <= keys
    summary = json.loads(s3.get_object(Bucket=bucket, Key=f"runs/{day.run_id}/summary.json")["Body"].read())
    assert summary["check"]["ok"] and summary["check"]["false_losses"] == 1  # the spot notice raised, nothing else


def test_nothing_of_the_stack_is_left_and_the_hub_ended_itself(day):
    states = day.instance_states()
    assert states and set(states.values()) == {"terminated"}, states
    hubs = [b for b in day.day_boots if b.role == "hub"]
    assert len(hubs) == 1
    assert f"shutdown {hubs[0].instance_id} -> terminate" in day.twin.log  # its own shutdown -h, not the API
    assert not day.twin.errors, day.twin.errors


def test_the_starter_fired_on_its_schedule_and_the_nodes_boot_and_claim(day):
    fired = [f for f in day.day_fired if f.rule.endswith("-start")]
    assert len(fired) == 1 and fired[0].result["action"] == "started", fired
    figures = day.figures(day.run_id, day.day_boots)
    assert figures["schedule_to_first_launch_s"] < 120 and figures["node_launch_to_first_claim_s"] < 120, figures
    print(json.dumps(figures), time.time())


def test_the_nodes_booted_the_baked_image_and_the_hub_the_stock_one(day):
    """The stack's nodes are launched from the node image baked for it (infra/packer's bake script, run once on
    the twin), its hub from the stock image: both boot paths run, each as its boot log says."""
    image = list(day.twin.images.values())[-1]  # the one the deployment made (again, if moto was reset)
    assert image.marker["crawl_uid"] == 2000 and len(image.marker["deps_sha256"]) == 64
    assert any(line.startswith("gridfleet:x:2000:2000:") for line in image.accounts["passwd"])
    installed = 0
    for boot in day.day_boots:
        log = (boot.sandbox.var_log / "gridfleet-boot.log").read_text()
        if f"step: {'check-config' if boot.role == 'node' else 'run'}" not in log:
            continue  # a node launched late may be terminated with the run before its boot gets past its install
        installed += boot.role == "node"
        if boot.role == "node":
            assert boot.baked and "baked image: its venv has the bundle's dependencies" in log, boot.instance_id
            assert "step: install-gridfleet" in log and "already installed:" in log
        else:
            assert not boot.baked and "baked image" not in log, boot.instance_id
    assert installed, "no node's boot got past its install"


def boot_log(boot) -> str:
    return (boot.sandbox.var_log / "gridfleet-boot.log").read_text()


def test_every_instance_runs_the_ssm_agent_its_boot_installed_or_its_image_had(day):
    """Debian's AMI has no SSM agent: the hub's (stock) boot fetched the region's package from S3 and installed
    it, the nodes' image had it; SSM reached the hung site's node only through it (test above)."""
    hub = next(b for b in day.day_boots if b.role == "hub")
    assert "step: install-ssm-agent" in boot_log(hub) and "amazon-ssm-agent is installed" not in boot_log(hub)
    assert hub.sandbox.host_path("/usr/bin/amazon-ssm-agent").exists()  # in its own /usr, by dpkg
    nodes = [b for b in day.day_boots if b.role == "node" and "step: install-ssm-agent" in boot_log(b)]
    assert nodes and all("amazon-ssm-agent is installed" in boot_log(b) for b in nodes)


def test_the_bundle_was_checked_against_each_instances_platform(day):
    for boot in day.day_boots:
        log = boot_log(boot)
        if "step: install-gridfleet" in log:
            assert "the bundle is built for this platform (linux x86_64, CPython 3.11)" in log, boot.instance_id


def test_a_nodes_console_has_its_boot_steps_then_its_host_keys_and_no_agent_lines(day):
    """The agent runs as a service, so cloud-init's final stage ends and prints the keys after the boot script;
    the agent's own lines go to its log, not the console."""
    seen = 0
    for boot in (b for b in day.day_boots if b.role == "node"):
        console = boot.sandbox.console.read_text()
        if "the node agent runs as" not in console:
            continue  # a node terminated with the run before its boot ended
        seen += 1
        assert console.index("the node agent runs as") < console.index("-----BEGIN SSH HOST KEY KEYS-----")
        assert '"event"' not in console, boot.instance_id
    assert seen


def test_the_logs_of_the_hub_and_the_nodes_are_in_cloudwatch_logs(day):
    config = str(day.deployed.config_path)
    out = day.deployed.gridfleet("logs", "--run-id", day.run_id, "--config", config).stdout
    instances = {line.split()[2] for line in out.splitlines()}
    hub = next(b.instance_id for b in day.day_boots if b.role == "hub")
    killed = day.summary(day.run_id)["sites"]["hang"]["attempts"][0]["instance_id"]
    assert {hub, killed} <= instances, instances
    shipper = day.root / "twin" / "instances" / hub / "var-log" / "gridfleet-logs.log"  # what the hub's shipper said
    said = shipper.read_text(errors="replace")[-3000:] if shipper.is_file() else f"no {shipper}"
    assert "step: install-gridfleet" in out, said  # boot logs, from the start...
    assert "gridfleet run exited with status" in out, said  # ...to the end, shipped at the hub's shutdown
    hang = day.deployed.gridfleet("logs", "--run-id", day.run_id, "--config", config, "--site", "hang").stdout
    assert hang and all('"site": "hang"' in line or "site=hang" in line for line in hang.splitlines())
    print(hang[-3000:])


def preflight(day) -> subprocess.CompletedProcess[str]:
    """`gridfleet aws preflight` as the operator runs it against the stack, with the operator's fleet.yaml."""
    cmd = [sys.executable, "-m", "cli.main", "aws", "preflight", "--config", str(day.deployed.config_path)]
    return subprocess.run(cmd, cwd=day.deployed.work, env=day.deployed.env, capture_output=True, text=True, timeout=300)


def test_the_preflight_finds_the_deployed_stack_ready_and_then_a_quota_too_low(day):
    ready = preflight(day)
    print(ready.stdout)
    assert ready.returncode == 0, ready.stdout + ready.stderr
    lines = ready.stdout.splitlines()
    assert lines[-1].startswith("ready: ") and not [line for line in lines if line.startswith("FAIL")]
    assert any(line.startswith("ok    efs-utils:") for line in lines), lines
    assert any(line.startswith("ok    ssm-agent:") for line in lines), lines
    day.twin.limits.spot_vcpus = 2  # the account's spot quota, as a new account may have it
    try:
        short = preflight(day)
    finally:
        day.twin.limits.spot_vcpus = AccountLimits().spot_vcpus
    print(short.stdout)
    assert short.returncode == 1
    failed = [line for line in short.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and failed[0].startswith("FAIL  spot-vcpus: ") and "L-34B43A08" in failed[0], failed
