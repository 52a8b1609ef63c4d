"""A day of the AWS path on the EC2 twin, whole: nothing is called directly that AWS would call.

The stack is made as infra/terraform defines it and deployed as the README says (`embedded.twin.deploy`).
The starter Lambda is fired by its EventBridge schedule, launches the hub from the hub template; the hub boots
its rendered user-data, launches nodes through `Ec2Provider`, the nodes boot theirs and crawl with Chromium
through the hub's Selenium Grid. Three sites: one plain; one that hangs on its first attempt, with the nodes'
own watchdog off, so only the hub can end it and its first rung, SSM, does (the command runs inside the node);
one interrupted by a spot notice raised through its node's IMDS (the one fault injected, at the twin's seam
for what EC2 decides). The nodes boot the node image baked for the stack, the hub the stock image. Root only
(see conftest)."""

from __future__ import annotations

import json
import time

import pytest

from hub.control.ssh import console_text, host_keys_from_console
from tests.twin.conftest import DAY_SITES
from tests.twin.day import wait_until

SITES = DAY_SITES


@pytest.fixture(scope="module")
def day(twin_stack):
    d = twin_stack
    d.ensure_deployed()
    d.put_config(SITES)  # the deployment's own sites, whatever ran before
    first_boot, first_fired = len(d.twin.boots), len(d.twin.fired)
    run_id = d.start_by_schedule()
    spot_node = wait_until(lambda: d.node_of("spot", run_id, "RUN", min_pages=2), 240, "the spot site running")
    d.twin.running(spot_node).imds.spot_notice()  # EC2's two-minute notice
    wait_until(lambda: d.stack_idle() and d.summary(run_id), 420, "the run archived and the stack idle")
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
    ec2 = day.twin.client("ec2")
    for boot in day.day_boots:
        out = ec2.get_console_output(InstanceId=boot.instance_id)
        keys = host_keys_from_console(console_text(out.get("Output")))  # what the hub's SSH rung trusts
        pubs = sorted((boot.sandbox.dir / "etc" / "ssh").glob("ssh_host_*_key.pub"))
        assert sorted(keys) == sorted(tuple(p.read_text().split()[:2]) for p in pubs), (boot.instance_id, keys)


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
