"""The rendered boot scripts run for real by bash in a sandbox of stub commands (tests/helpers/boot_sandbox.py):
what each step calls, in which order, and how each failure ends (logged, reported, shipped, shut down)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloud_init import HubUserData, NodeUserData, RenderError, boot_script, render_hub, render_node
from cloud_init import render as render_mod
from fleet.crawl import crawlerfile
from fleet.grid_auth import GRID_USER, GridSecret, hub_toml
from tests.helpers.boot_sandbox import (
    BASH,
    INSTANCE_ID,
    LOCAL_IP,
    SSM_AGENT_BUCKET,
    SSM_AGENT_KEY,
    TOKEN,
    Sandbox,
    make_bundle,
)
from tests.helpers.wait import wait_for
from tests.unit.test_cloud_init import HOSTILE_CONFIG_KEY, HOSTILE_KEY, hub_params, node_params, parameter_block

APT_PACKAGES = [
    "chromium", "chromium-driver", "default-jre-headless", "python3-venv", "nfs-common", "awscli", "curl",
    "ca-certificates",
]  # fmt: skip
SHUTDOWN = ["shutdown", "-h", "now"]


@pytest.fixture
def sandbox(tmp_path_factory) -> Sandbox:
    return Sandbox(tmp_path_factory.mktemp("sandbox"))


def sandbox_node(sb: Sandbox, **kw) -> NodeUserData:
    base = dict(
        install_dir=f"{sb.root}/opt/gridfleet",
        state_dir=f"{sb.root}/state",
        efs_mount=f"{sb.root}/efs",
        bucket=sb.bucket,
        log_group="/gridfleet/node",
    )
    return node_params(**{**base, **kw})


def upload_node_objects(sb: Sandbox, p: NodeUserData, bundle: bool = True, config: bool = True) -> None:
    """The objects a node's boot reads: the bundle and the run's config in S3, and the Grid secret the hub put
    in SSM."""
    put_grid_secret(sb, p.grid_secret_parameter)
    if bundle:
        make_bundle(sb.put(p.bundle_key))
    if config:
        sb.put(p.config_key, b"sites: []\n")
    sb.put("bundle/amazon-efs-utils.deb", b"Package: amazon-efs-utils\n")


SECRET = GridSecret("s3cr3t-" + "x" * 40)
NODE_RUN = "2026-11-21"  # the run of `node_params()`
HUB_RUN = "2026-11-20"  # the run tag of the hubs below


def put_grid_secret(sb: Sandbox, name: str, value: str = f"{NODE_RUN} {SECRET.value}\n") -> Path:
    """The parameter as the AWS CLI prints it (`--output text`): the run's id, then the secret, as a hub put it."""
    path = sb.ssm / name.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value)
    return path


def s3_calls(sb: Sandbox) -> list[list[str]]:
    return [c for c in sb.calls("aws") if c[1] == "s3"]


def agent_argv(sb: Sandbox, p: NodeUserData) -> list[str]:
    hub = p.hub_address
    return [
        "gridfleet", "node", "--config", f"{sb.etc}/fleet.yaml", "--run-id", p.run_id, "--instance-id", INSTANCE_ID,
        "--grid-url", f"http://{hub}:4444", "--grid-jar", f"{p.install_dir}/selenium-server.jar",
        "--grid-publish", f"tcp://{hub}:4442", "--grid-subscribe", f"tcp://{hub}:4443", "--grid-host", LOCAL_IP,
        "--grid-port", "5555", "--state-dir", p.state_dir, "--profiles-root", p.efs_mount,
        "--site-mounts", f"{p.state_dir}/site-mounts.sock", "--grid-secret-file", f"{sb.etc}/grid-secret",
    ]  # fmt: skip


def crawl_user(home: str, uid: int = 2000, name: str = "gridfleet") -> list[str]:
    ids = [f"--reuid={uid}", f"--regid={uid}", "--init-groups", "--no-new-privs"]
    return ["setpriv", *ids, "env", f"HOME={home}", f"USER={name}", f"LOGNAME={name}"]


def url_of(call: list[str]) -> str:
    return next(a for a in call if a.startswith("http"))


def assert_imds_v2(sb: Sandbox, items: list[str]) -> None:
    """A token PUT first, then only GETs of these items, each with the token."""
    curls = [c for c in sb.calls("curl") if "/latest/" in url_of(c)]
    token, gets = curls[0], curls[1:]
    assert url_of(token) == "http://169.254.169.254/latest/api/token"
    assert token[token.index("-X") + 1] == "PUT" and "X-aws-ec2-metadata-token-ttl-seconds: 21600" in token
    assert [url_of(c).split("/latest/meta-data/", 1)[1] for c in gets] == items
    for c in gets:
        assert "-X" not in c and f"X-aws-ec2-metadata-token: {TOKEN}" in c


def work_file(call: list[str], name: str) -> bool:
    return call[-1].endswith(f"/{name}")


# --- a node ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "keys",
    [
        pytest.param({}, id="plain"),
        pytest.param({"bundle_key": HOSTILE_KEY, "config_key": HOSTILE_CONFIG_KEY}, id="hostile-keys"),
    ],
)
def test_node_bootstrap_hands_the_work_to_its_service(sandbox, keys):
    p = sandbox_node(sandbox, **keys)
    upload_node_objects(sandbox, p)
    if keys:  # the efs-utils package sits beside the bundle, wherever that is
        sandbox.put(p.bundle_key.rsplit("/", 1)[0] + "/amazon-efs-utils.deb", b"Package: amazon-efs-utils\n")
    r = sandbox.run(boot_script(render_node(p)), STUB_MOUNT_FAILS="2")
    assert r.returncode == 0, r.stdout + r.stderr

    assert_imds_v2(sandbox, ["instance-id", "local-ipv4"])
    # apt: update failed once (the lock race) and was retried, then the missing packages were installed
    apts = sandbox.calls("apt-get")
    assert [c[-1] for c in apts[:2]] == ["update", "update"]
    assert apts[2][apts[2].index("install") :] == ["install", "-y", "--no-install-recommends", *APT_PACKAGES]
    # the SSM agent: the region's own package, read anonymously, installed and started as a service
    agent = f"s3://{SSM_AGENT_BUCKET}/{SSM_AGENT_KEY}"
    cps = s3_calls(sandbox)
    assert cps[0][cps[0].index("--no-sign-request") :][1:3] == ["--only-show-errors", agent]
    assert work_file(apts[3], "amazon-ssm-agent.deb") and apts[3][-2] == "-y"
    systemctl = sandbox.calls("systemctl")
    assert systemctl[0] == ["systemctl", "enable", "--now", "amazon-ssm-agent.service"]
    # S3: the exact keys, with the region; the efs-utils package beside the bundle
    folder = p.bundle_key.rsplit("/", 1)[0]
    assert [c[-2] for c in cps[1:]] == [
        f"s3://{p.bucket}/{p.config_key}",
        f"s3://{p.bucket}/{p.bundle_key}",
        f"s3://{p.bucket}/{folder}/amazon-efs-utils.deb",
    ]
    assert all(c[c.index("--region") + 1] == "ap-northeast-2" for c in cps)
    assert (sandbox.etc / "fleet.yaml").read_text() == "sites: []\n"
    pip = sandbox.calls("pip")[0]
    assert pip[pip.index("--find-links") + 1] == f"{p.install_dir}/wheels" and "--no-index" in pip
    assert work_file(apts[4], "amazon-efs-utils.deb") and len(apts) == 5
    # the log shipper starts once gridfleet is installed, then the site-mount helper, the agent's service last of all
    assert systemctl[1:] == [
        ["systemctl", "start", "--no-block", "gridfleet-logs.service"],
        ["systemctl", "start", "--no-block", "gridfleet-mounts.service"],
        ["systemctl", "start", "--no-block", "gridfleet-node.service"],
    ]
    calls = sandbox.calls()
    assert calls.index(pip) < calls.index(systemctl[1]) < calls.index(sandbox.calls("gridfleet")[0])
    # EFS: nothing is mounted at boot (the helper mounts a site's own access point per claim); the mount points'
    # directory is root's, and the helper answers the crawl user before the agent starts
    assert sandbox.calls("mount") == []
    chown_root = ["chown", "root:root", p.efs_mount]
    assert sandbox.calls("chown") == [["chown", "2000:2000", f"{sandbox.etc}/grid-secret.part"], chown_root]
    home = f"{p.state_dir}/home"
    ping = ["node", "site-mount", "ping", "--socket", f"{p.state_dir}/site-mounts.sock"]
    assert sandbox.calls("setpriv") == [crawl_user(home) + [f"{p.install_dir}/venv/bin/gridfleet", *ping]]
    assert calls.index(sandbox.calls("useradd")[0]) < calls.index(chown_root) < calls.index(systemctl[2])
    assert calls.index(systemctl[2]) < calls.index(["gridfleet", *ping]) < calls.index(systemctl[3])
    # the bootstrap ends; the instance does not: its agent runs as a service
    assert calls[-1] == systemctl[-1] and SHUTDOWN not in calls
    assert sandbox.calls("gridfleet") == [
        ["gridfleet", "validate", "--config", f"{sandbox.etc}/fleet.yaml"],
        ["gridfleet", *ping],
    ]
    assert (sandbox.etc / "instance.env").read_text() == (
        f"INSTANCE_ID={INSTANCE_ID}\nLOCAL_IP={LOCAL_IP}\nINSTANCE_RUN_ID={p.run_id}\n"
    )
    log = sandbox.boot_log()
    assert "the node agent runs as gridfleet" in log and "bootstrap failed" not in log
    assert sandbox.console.read_text() == log
    assert not list(sandbox.root.rglob("pwned"))


def booted(sb: Sandbox, **kw) -> NodeUserData:
    """A node whose bootstrap has run in `sb` (its calls forgotten): ready for its services' commands."""
    p = sandbox_node(sb, **kw)
    upload_node_objects(sb, p)
    r = sb.run(boot_script(render_node(p)))
    assert r.returncode == 0, r.stdout + r.stderr
    sb.stub_log.unlink()
    return p


def test_the_agent_service_runs_the_agent_as_the_crawl_user(sandbox):
    p = booted(sandbox)
    r = sandbox.run(boot_script(render_node(p)), "agent", STUB_AGENT_RC="3")
    assert r.returncode == 3  # the agent's own status: its process is the service's
    assert sandbox.calls("setpriv") == [crawl_user(f"{p.state_dir}/home") + [f"{p.install_dir}/venv/bin/gridfleet"]
                                        + agent_argv(sandbox, p)[1:]]  # fmt: skip
    assert sandbox.calls() == [sandbox.calls("setpriv")[0], agent_argv(sandbox, p)]


def test_the_end_of_the_agent_service_shuts_the_node_down(sandbox):
    p = booted(sandbox)
    r = sandbox.run(boot_script(render_node(p)), "stopped", SERVICE_RESULT="exit-code", EXIT_STATUS="3")
    assert r.returncode == 0 and sandbox.calls() == [SHUTDOWN]
    assert "the node agent exited (exit-code, status 3)" in sandbox.boot_log().splitlines()[-2]


def test_the_log_service_ships_the_nodes_four_logs(sandbox):
    p = booted(sandbox)
    sandbox.run(boot_script(render_node(p)), "ship-logs")
    root = sandbox.root
    assert sandbox.calls("gridfleet") == [
        ["gridfleet", "ship-logs", "--config", f"{sandbox.etc}/fleet.yaml", "--group", "/gridfleet/node",
         "--stream", f"{p.run_id}/{INSTANCE_ID}", "--state", f"{p.state_dir}/logship",
         str(sandbox.log_file), str(root / "log" / "node.log"), f"{p.state_dir}/crawler.log",
         f"{p.state_dir}/grid-node.log"]
    ]  # fmt: skip


def test_the_site_mounts_service_runs_the_helper_as_root(sandbox):
    p = booted(sandbox)
    r = sandbox.run(boot_script(render_node(p)), "site-mounts")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sandbox.calls() == [
        ["gridfleet", "node", "site-mounts", "--config", f"{sandbox.etc}/fleet.yaml", "--run-id", p.run_id,
         "--instance-id", INSTANCE_ID, "--socket", f"{p.state_dir}/site-mounts.sock"]
    ]  # fmt: skip


def test_a_baked_node_installs_no_package(sandbox):
    """An image that has the packages, the SSM agent and amazon-efs-utils: only the agent's service is started."""
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    sandbox.stub("mount.efs", "exit 0\n")
    installed = " ".join([*APT_PACKAGES, "amazon-ssm-agent", "amazon-efs-utils"])
    r = sandbox.run(boot_script(render_node(p)), STUB_INSTALLED=installed)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sandbox.calls("apt-get") == [] and sandbox.calls("dpkg-deb") == []
    assert [c[-2] for c in s3_calls(sandbox)] == [
        f"s3://{p.bucket}/{p.config_key}",
        f"s3://{p.bucket}/{p.bundle_key}",
    ]
    assert sandbox.calls("systemctl")[0] == ["systemctl", "enable", "--now", "amazon-ssm-agent.service"]


def failed(sb: Sandbox, step: str) -> str:
    """The boot log of a bootstrap that failed at `step`, after checking it ended as every failure does."""
    log = sb.boot_log()
    assert f"gridfleet: node bootstrap failed at {step}: " in log, log
    assert sb.calls()[-1] == SHUTDOWN and sb.calls().count(SHUTDOWN) == 1
    assert ["systemctl", "start", "--no-block", "gridfleet-node.service"] not in sb.calls()
    return log


def failure_update(sandbox) -> list[str]:
    """The AWS CLI's update-item of the node item (a node may not put whole items): [its JSON input]."""
    (call,) = [c for c in sandbox.calls("aws") if c[1:3] == ["dynamodb", "update-item"]]
    assert not [c for c in sandbox.calls("aws") if c[1:3] == ["dynamodb", "put-item"]]
    return [call[call.index("--cli-input-json") + 1]]


def test_node_bundle_download_fails_and_is_reported_with_the_aws_cli(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p, bundle=False)
    r = sandbox.run(boot_script(render_node(p)))
    assert r.returncode != 0
    log = failed(sandbox, "fetch-bundle")
    assert f"cannot download s3://{p.bucket}/{p.bundle_key}" in log
    # no gridfleet yet: the node item is updated with the AWS CLI, as `gridfleet node report-failure` updates it
    update = json.loads(failure_update(sandbox)[-1])
    assert update["TableName"] == "TrendlyzeStatus"
    assert update["Key"] == {"run_id": {"S": p.run_id}, "Site": {"S": f"#node#{INSTANCE_ID}"}}
    item = {
        update["ExpressionAttributeNames"][n]: update["ExpressionAttributeValues"][f":{n[1:]}"]
        for n in (update["ExpressionAttributeNames"])
    }
    assert update["UpdateExpression"] == "SET " + ", ".join(
        f"{n} = :{n[1:]}" for n in update["ExpressionAttributeNames"]
    )
    assert item["node_state"] == {"S": "boot-failed"} and item["error"]["S"].startswith("fetch-bundle: cannot download")
    # and the boot log goes to the node's stream with the AWS CLI, its lines in time order
    logs = [c[1:3] for c in sandbox.calls("aws") if c[1] == "logs"]
    assert logs == [["logs", "create-log-stream"], ["logs", "put-log-events"]]
    events = json.loads((sandbox.root / "events.json").read_text())
    assert any("node bootstrap failed at fetch-bundle" in e["message"] for e in events)
    assert [e["timestamp"] for e in events] == sorted(e["timestamp"] for e in events)
    assert sandbox.calls("gridfleet") == [] and sandbox.calls("mount") == []
    assert sandbox.console.read_text() == log


def test_a_download_that_fails_once_is_tried_again_and_the_cli_waits_for_imds(sandbox):
    """A busy boot can miss IMDS within botocore's default second ("Unable to locate credentials"): every AWS CLI
    call gets five seconds and three tries, and an S3 download that failed anyway is tried again."""
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    (sandbox.bin / "aws").rename(sandbox.bin / "aws-stub")
    seen, failed = sandbox.root / "imds-settings", sandbox.root / "failed-once"
    sandbox.write_exe(
        sandbox.bin / "aws",
        f'echo "$AWS_METADATA_SERVICE_TIMEOUT $AWS_METADATA_SERVICE_NUM_ATTEMPTS" >> {seen}\n'
        f'if [[ $1 == s3 && " $* " == *" s3://{p.bucket}/{p.bundle_key} "* && ! -e {failed} ]]; then\n'
        f'  touch {failed}; echo "fatal error: Unable to locate credentials" >&2; exit 1\n'
        "fi\n"
        f'exec {sandbox.bin / "aws-stub"} "$@"\n',
    )
    r = sandbox.run(boot_script(render_node(p)), STUB_MOUNT_FAILS="2")
    assert r.returncode == 0, r.stdout + r.stderr
    log = sandbox.log_file.read_text()
    assert f"aws s3 cp s3://{p.bucket}/{p.bundle_key} failed (attempt 1 of 3)" in log
    assert "step: unpack-bundle" in log and "attempt 2 of 3" not in log
    assert set(seen.read_text().splitlines()) == {"5 3"}


def test_a_bundle_for_another_platform_is_refused_before_anything_is_installed(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    make_bundle(sandbox.put(p.bundle_key), machine="aarch64")
    sandbox.run(boot_script(render_node(p)))
    log = failed(sandbox, "check-platform")
    python = "{}.{}".format(*sys.version_info[:2])
    assert f"the bundle is built for linux aarch64, CPython {python} but this instance is linux x86_64, " in log
    assert sandbox.calls("pip") == [] and sandbox.calls("gridfleet") == []
    assert "check-platform: the bundle is built for linux aarch64" in failure_update(sandbox)[-1]


def test_node_whose_site_mount_helper_never_answers(sandbox):
    # 6 s of boot timeout: on a busy machine one stubbed attempt can take seconds, and the test wants two
    p = sandbox_node(sandbox, boot_timeout_s=6)
    upload_node_objects(sandbox, p)
    started = time.monotonic()
    r = sandbox.run(boot_script(render_node(p)), STUB_SITE_MOUNTS_RC="1", STUB_SLEEP_REAL="0.3")
    assert time.monotonic() - started < 30  # bounded by the boot timeout, not endless
    assert r.returncode != 0
    assert (
        f"gridfleet: node bootstrap failed at site-mounts: the site-mount helper does not answer gridfleet on "
        f"{p.state_dir}/site-mounts.sock (see /var/log/gridfleet-mounts.log)"
    ) in failed(sandbox, "site-mounts")
    gf = sandbox.calls("gridfleet")
    assert len([c for c in gf if c[1:3] == ["node", "site-mount"]]) >= 2
    assert gf[-1][1:3] == ["node", "report-failure"]
    assert gf[-1][gf[-1].index("--message") + 1].startswith("site-mounts: ")
    # the shipper runs: the boot log goes through it (at the shutdown), not through the AWS CLI
    assert [c for c in sandbox.calls("aws") if c[1] == "logs"] == []


def test_node_failure_after_install_is_reported(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    r = sandbox.run(boot_script(render_node(p)), STUB_VALIDATE_RC="2")
    assert r.returncode != 0
    cfg = f"{sandbox.etc}/fleet.yaml"
    message = f"check-config: {cfg} does not pass gridfleet validate"
    assert f"gridfleet: node bootstrap failed at {message}" in failed(sandbox, "check-config")
    assert sandbox.calls("gridfleet")[-1] == [
        "gridfleet", "node", "report-failure", "--config", cfg, "--run-id", p.run_id, "--instance-id", INSTANCE_ID,
        "--message", message,
    ]  # fmt: skip
    assert sandbox.calls("mount") == []


def test_node_unexpected_failure_is_caught_by_the_trap(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    sandbox.stub("mktemp", "exit 1\n")  # a command without a failure message of its own
    sandbox.run(boot_script(render_node(p)))
    log = sandbox.boot_log()
    assert "gridfleet: node bootstrap failed at start: exit status 1 from: WORK_DIR=$(mktemp -d)" in log
    assert sandbox.calls()[-1] == SHUTDOWN and sandbox.calls("curl") == []


def test_the_ssm_agent_that_cannot_be_fetched_fails_the_bootstrap(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    (sandbox.s3 / SSM_AGENT_BUCKET / SSM_AGENT_KEY).unlink()
    sandbox.run(boot_script(render_node(p)))
    log = failed(sandbox, "install-ssm-agent")
    assert f"cannot download the SSM agent from s3://{SSM_AGENT_BUCKET}/{SSM_AGENT_KEY}" in log


def test_an_arm64_node_fetches_the_arm64_agent(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    sandbox.put_object(SSM_AGENT_BUCKET, "latest/debian_arm64/amazon-ssm-agent.deb", b"Package: amazon-ssm-agent\n")
    sandbox.run(boot_script(render_node(p)), STUB_ARCH="arm64")
    assert sandbox.calls("aws")[0][-2] == f"s3://{SSM_AGENT_BUCKET}/latest/debian_arm64/amazon-ssm-agent.deb"


def test_node_without_efs_utils_fails_clearly(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    (sandbox.s3 / sandbox.bucket / "bundle/amazon-efs-utils.deb").unlink()
    sandbox.run(boot_script(render_node(p)))
    assert (
        "amazon-efs-utils is not installed and no .deb of it is at hand: bake it into the node image, or upload it "
        "with gridfleet bundle --upload --efs-utils-deb FILE"
    ) in failed(sandbox, "install-efs-utils")
    assert not any(c[-1] == "amazon-efs-utils" for c in sandbox.calls("apt-get"))  # Debian has no such package
    assert sandbox.calls("gridfleet")[-1][1:3] == ["node", "report-failure"]


def test_node_crawl_user_of_the_config(sandbox):
    p = sandbox_node(sandbox, crawl_user="crawler_1", crawl_uid=4321)
    upload_node_objects(sandbox, p)
    r = sandbox.run(boot_script(render_node(p)), STUB_IDS="4321:4321")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sandbox.calls("useradd")[0][-1] == "crawler_1" and "4321" in sandbox.calls("useradd")[0]
    assert sandbox.calls("setpriv")[-1][:5] == ["setpriv", "--reuid=4321", "--regid=4321", "--init-groups",
                                                "--no-new-privs"]  # fmt: skip


def test_node_refuses_a_crawl_user_of_another_uid(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    r = sandbox.run(
        boot_script(render_node(p)), STUB_PASSWD="gridfleet:x:1000:1000::/home/g:/bin/bash", STUB_IDS="1000:1000"
    )
    assert r.returncode != 0
    assert "user gridfleet is not uid and gid 2000" in failed(sandbox, "crawl-user")
    assert sandbox.calls("useradd") == [] and sandbox.calls("mount") == [] and sandbox.calls("setpriv") == []
    assert sandbox.calls("gridfleet")[-1][1:3] == ["node", "report-failure"]  # as root: never through setpriv


def test_logs_stay_on_the_instance_when_shipping_is_off(sandbox):
    p = sandbox_node(sandbox, log_group="")
    upload_node_objects(sandbox, p, bundle=False)
    sandbox.run(boot_script(render_node(p)))
    failed(sandbox, "fetch-bundle")
    assert [c for c in sandbox.calls("aws") if c[1] == "logs"] == []
    with pytest.raises(RenderError, match="^log_group: "):
        sandbox_node(sandbox, log_group="/bad group")


# --- the crawl user for real ------------------------------------------------------------------------
def shell_function(script: str, name: str) -> str:
    m = re.search(rf"^{name}\(\) \{{$.*?^\}}$", script, re.M | re.S)
    assert m, f"no function {name}"
    return m.group(0)


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a user and switching to it needs root")
def test_the_crawl_user_is_created_and_the_agent_runs_as_it_for_real(open_dir):
    """The rendered script's own functions, run by bash with the real groupadd, useradd, install and setpriv,
    in a private mount namespace whose /etc is a copy: the host's users are untouched. The agent is a stand-in
    (the project's Python may not be readable by that user) that says who it runs as."""
    user, uid = "gfcitest", 2345
    state = open_dir / "state"
    p = node_params(state_dir=str(state), crawl_user=user, crawl_uid=uid)
    script = boot_script(render_node(p))
    subprocess.run(["cp", "-a", "/etc", str(open_dir / "etc")], check=True, timeout=60)
    agent = open_dir / "agent"
    agent.write_text(
        '#!/bin/sh\nid -u; id -g; id -G; echo "$HOME"; grep NoNewPrivs /proc/self/status\ntouch "$1/agent-wrote"\n'
    )
    agent.chmod(0o755)
    crawl_as = re.search(r"^AS_CRAWL_USER=\(.*?\)$", script, re.M | re.S)
    assert crawl_as
    steps = open_dir / "steps.sh"
    steps.write_text(
        "\n".join(
            [
                "set -Eeuo pipefail",
                parameter_block(script),
                'log() { printf "log: %s\\n" "$*"; }',
                'fail() { printf "failed: %s\\n" "$*"; exit 1; }',
                shell_function(script, "ensure_crawl_user"),
                crawl_as.group(0),
                shell_function(script, "as_crawl_user"),
                "ensure_crawl_user",
                "ensure_crawl_user",  # found the second time, not made again
                'getent passwd "$CRAWL_USER"',
                f'as_crawl_user {agent} "$STATE_DIR"',
                "",
            ]
        )
    )
    unshare = ["unshare", "--mount", "--propagation", "private", "--", BASH, "-c"]
    r = subprocess.run(
        [*unshare, 'mount --bind "$1" /etc && exec "$0" "$2"', BASH, str(open_dir / "etc"), str(steps)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        f"{user}:x:{uid}:{uid}::{state}/home:/usr/sbin/nologin",  # a system account, no login shell
        str(uid),
        str(uid),
        str(uid),
        f"{state}/home",
        "NoNewPrivs:\t1",
    ]
    for path, mode in ((state, 0o755), (state / "home", 0o700), (state / "agent-wrote", None)):
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (uid, uid), path
        assert mode is None or st.st_mode & 0o777 == mode, path
    assert subprocess.run(["getent", "passwd", user], capture_output=True).returncode == 2  # the host: untouched

    # What SSM or SSH runs as root (`gridfleet node kill`) still ends a crawler process group of that user.
    crawler = subprocess.Popen(["sleep", "60"], user=uid, group=uid, extra_groups=[], start_new_session=True)
    try:
        crawlerfile.write(state, "site-a", 1, crawler.pid)
        k = crawlerfile.kill(state, "site-a", 1)
        assert k.ok and k.detail == f"killed process group {crawler.pid}", k
        assert crawler.wait(timeout=5) == -9
    finally:
        crawler.kill()


# --- the hub ---------------------------------------------------------------------------------------
def sandbox_hub(sb: Sandbox, **kw) -> HubUserData:
    base = dict(install_dir=f"{sb.root}/opt/gridfleet", state_dir=f"{sb.root}/state", bucket=sb.bucket,
                log_group="/gridfleet/hub")  # fmt: skip
    p = hub_params(**{**base, **kw})
    make_bundle(sb.put(p.bundle_key))
    sb.put(p.hub_config_key, b"sites: []\n")
    return p


def test_hub_happy_path(sandbox):
    p = sandbox_hub(sandbox)
    r = sandbox.run(boot_script(render_hub(p)), STUB_TAG_RUN_ID="2026-11-20")
    assert r.returncode == 0, r.stdout + r.stderr
    assert_imds_v2(sandbox, ["instance-id", "local-ipv4", "tags/instance/gridfleet:run_id"])
    wait_for(lambda: sandbox.calls("java"))  # the Grid hub runs under nohup ... &: its stub may log after the script
    assert sandbox.calls("java") == [
        ["java", "-jar", f"{p.install_dir}/selenium-server.jar", "hub", "--host", LOCAL_IP, "--port", "4444",
         "--publish-events", f"tcp://{LOCAL_IP}:4442", "--subscribe-events", f"tcp://{LOCAL_IP}:4443",
         "--config", f"{sandbox.etc}/grid-hub.toml"]
    ]  # fmt: skip
    assert url_of(sandbox.calls("curl")[-1]) == f"http://{LOCAL_IP}:4444/status"
    assert sandbox.calls("systemctl") == [
        ["systemctl", "enable", "--now", "amazon-ssm-agent.service"],
        ["systemctl", "start", "--no-block", "gridfleet-logs.service"],
    ]
    run = ["gridfleet", "run", "--config", f"{sandbox.etc}/fleet.yaml", "--run-id", "2026-11-20", "--resume"]
    assert sandbox.calls("gridfleet")[1:] == [run]
    calls = [c for c in sandbox.calls() if c[0] != "java"]  # the background Grid hub logs whenever it gets to
    assert calls[-2:] == [run, SHUTDOWN]
    log = sandbox.boot_log()
    assert "gridfleet run exited with status 0" in log and f"its log: {sandbox.root}/log/hub.log" in log
    assert (sandbox.etc / "instance.env").read_text().endswith("INSTANCE_RUN_ID=2026-11-20\n")
    r = sandbox.run(boot_script(render_hub(p)), "ship-logs")
    assert sandbox.calls("gridfleet")[-1][-3:] == [str(sandbox.log_file), *(f"{sandbox.root}/log/{n}" for n in
                                                                            ("hub.log", "grid.log"))]  # fmt: skip


def test_hub_run_id_defaults_to_today_and_self_stop_none(sandbox):
    p = sandbox_hub(sandbox, self_stop="none")
    before = dt.datetime.now(dt.UTC).date().isoformat()
    r = sandbox.run(boot_script(render_hub(p)), STUB_RUN_RC="3")
    after = dt.datetime.now(dt.UTC).date().isoformat()
    assert r.returncode == 3
    run = sandbox.calls("gridfleet")[-1]
    assert run[run.index("--run-id") + 1] in {before, after}
    assert sandbox.calls("shutdown") == []
    assert "self_stop=none: leaving the instance running" in sandbox.boot_log()


def test_hub_rejects_a_bad_run_id_tag(sandbox):
    p = sandbox_hub(sandbox)
    sandbox.run(boot_script(render_hub(p)), STUB_TAG_RUN_ID="bad id;")
    assert "gridfleet: hub bootstrap failed at run-id: " in sandbox.boot_log()
    assert sandbox.calls("gridfleet") == []
    assert sandbox.calls()[-1] == SHUTDOWN


def test_hub_failure_stops_the_instance(sandbox):
    p = sandbox_hub(sandbox, self_stop="terminate")
    (sandbox.s3 / sandbox.bucket / p.hub_config_key).unlink()
    r = sandbox.run(boot_script(render_hub(p)))
    assert r.returncode != 0
    log = sandbox.boot_log()
    assert f"gridfleet: hub bootstrap failed at fetch-config: cannot download s3://{p.bucket}/{p.hub_config_key}" in log
    assert sandbox.calls("gridfleet") == [] and sandbox.calls("java") == []
    assert [c[1:3] for c in sandbox.calls("aws") if c[1] == "logs"] == [
        ["logs", "create-log-stream"],
        ["logs", "put-log-events"],
    ]
    assert sandbox.calls()[-1] == SHUTDOWN


def test_hub_grid_that_dies_fails_the_bootstrap(sandbox):
    p = sandbox_hub(sandbox)
    sandbox.run(boot_script(render_hub(p)), STUB_GRID_DOWN="1")
    assert "gridfleet: hub bootstrap failed at wait-grid: the Grid hub exited" in sandbox.boot_log()
    assert [c[1] for c in sandbox.calls("gridfleet")] == ["grid-secret"]
    assert sandbox.calls()[-1] == SHUTDOWN


def test_a_grid_hub_slow_to_answer_is_waited_for_and_the_wait_is_logged(sandbox):
    p = sandbox_hub(sandbox)
    sandbox.run(boot_script(render_hub(p)), STUB_GRID_SLOW="11")
    log = sandbox.boot_log()
    waits = [line.split("gridfleet: ", 1)[1] for line in log.splitlines() if "does not answer on /status yet" in line]
    assert waits == [f"the Grid hub does not answer on /status yet ({n} tries); waiting up to 120 s" for n in (5, 10)]
    assert f"the Grid hub answers at http://{LOCAL_IP}:4444" in log and "bootstrap failed" not in log


# --- the Grid secret -------------------------------------------------------------------------------
def assert_nowhere(sb: Sandbox, *values: str) -> None:
    """None of `values` is on a recorded command line, in the boot log or on the console."""
    seen = [" ".join(c) for c in sb.calls()] + [sb.boot_log(), sb.console.read_text()]
    for value in values:
        assert not any(value in text for text in seen)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def ssm_calls(sb: Sandbox) -> list[list[str]]:
    return [c for c in sb.calls("aws") if c[1] == "ssm"]


def get_parameter_call(name: str = "/gridfleet/grid-secret") -> list[str]:
    return ["aws", "ssm", "get-parameter", "--region", "ap-northeast-2", "--with-decryption", "--name", name,
            "--query", "Parameter.Value", "--output", "text"]  # fmt: skip


def stored_secret(sb: Sandbox) -> str:
    """The parameter's value as the hub put it."""
    return (sb.ssm / "gridfleet" / "grid-secret").read_text()


def test_the_hub_makes_the_grid_secret_puts_it_in_ssm_from_a_file_and_starts_the_grid_with_it(sandbox):
    """The first hub of the stack: no parameter yet, so a new secret, put with the run's id. `gridfleet grid-secret`
    runs for real (the sandbox's gridfleet hands it to the project's own command)."""
    p = sandbox_hub(sandbox)
    r = sandbox.run(boot_script(render_hub(p)), STUB_TAG_RUN_ID=HUB_RUN)
    assert r.returncode == 0, r.stdout + r.stderr
    etc = sandbox.etc
    secret = GridSecret.read(etc / "grid-secret")
    assert secret != SECRET and all(mode(etc / f) == 0o600 for f in ("grid-secret", "grid-hub.toml", "grid-curl.conf"))
    assert (etc / "grid-hub.toml").read_text() == hub_toml(secret)
    assert (etc / "grid-curl.conf").read_text() == f'user = "{GRID_USER}:{secret.password}"\n'
    get, put = ssm_calls(sandbox)  # one read: a parameter that does not exist is not asked again
    assert get == get_parameter_call()
    assert put == ["aws", "ssm", "put-parameter", "--region", "ap-northeast-2", "--name", "/gridfleet/grid-secret",
                   "--type", "SecureString", "--key-id", "alias/gridfleet", "--overwrite",
                   "--value", f"file://{etc}/grid-secret.value"]  # fmt: skip
    assert stored_secret(sandbox) == f"{HUB_RUN} {secret.value}"  # what the nodes will read
    assert not (etc / "grid-secret.value").exists() and not (etc / "grid-secret.current").exists()
    wait_for(lambda: sandbox.calls("java"))
    (java,) = sandbox.calls("java")
    assert java[-2:] == ["--config", f"{etc}/grid-hub.toml"]
    calls = sandbox.calls()
    assert calls.index(get) < calls.index(sandbox.calls("gridfleet")[0]) < calls.index(put) < calls.index(java)
    status = sandbox.calls("curl")[-1]
    assert "-fs" in status and status[status.index("-K") + 1] == f"{etc}/grid-curl.conf"
    assert (sandbox.root / "curl-config-seen").read_text() == (etc / "grid-curl.conf").read_text()
    log = sandbox.boot_log()
    assert "the SSM parameter /gridfleet/grid-secret does not exist yet" in log
    assert f"a new Grid secret for run {HUB_RUN} is in the SSM parameter /gridfleet/grid-secret" in log
    assert_nowhere(sandbox, secret.value, secret.password, secret.registration_secret)


def test_a_replacement_hub_keeps_the_secret_its_runs_nodes_hold(sandbox):
    """A hub that boots for a run whose secret the parameter holds (the one before it died): the same secret,
    so the same Grid config, and nothing put."""
    p = sandbox_hub(sandbox)
    put_grid_secret(sandbox, p.grid_secret_parameter, f"{HUB_RUN} {SECRET.value}\n")
    r = sandbox.run(boot_script(render_hub(p)), STUB_TAG_RUN_ID=HUB_RUN)
    assert r.returncode == 0, r.stdout + r.stderr
    etc = sandbox.etc
    assert GridSecret.read(etc / "grid-secret") == SECRET and (etc / "grid-hub.toml").read_text() == hub_toml(SECRET)
    assert mode(etc / "grid-secret") == mode(etc / "grid-hub.toml") == 0o600
    assert ssm_calls(sandbox) == [get_parameter_call()]  # no put-parameter
    assert stored_secret(sandbox) == f"{HUB_RUN} {SECRET.value}\n"
    assert not (etc / "grid-secret.current").exists() and not (etc / "grid-secret.value").exists()
    log = sandbox.boot_log()
    assert f"holds the Grid secret of run {HUB_RUN} already: this hub keeps it" in log
    wait_for(lambda: sandbox.calls("java"))
    assert "bootstrap failed" not in log and sandbox.calls("gridfleet")[-1][1] == "run"
    assert_nowhere(sandbox, SECRET.value, SECRET.password, SECRET.registration_secret)


@pytest.mark.parametrize(
    "stored",
    [
        pytest.param(f"2026-11-19 {SECRET.value}\n", id="the-last-runs"),
        pytest.param(f"{HUB_RUN}x {SECRET.value}\n", id="a-run-whose-id-starts-alike"),
        pytest.param(SECRET.value + "\n", id="a-secret-without-its-run"),
        pytest.param(f"{HUB_RUN} short\n", id="not-a-secret"),
        pytest.param(f"{HUB_RUN} {SECRET.value} more\n", id="more-than-a-secret"),
    ],
)
def test_a_hub_of_another_run_never_keeps_the_secret_in_the_parameter(sandbox, stored):
    p = sandbox_hub(sandbox)
    put_grid_secret(sandbox, p.grid_secret_parameter, stored)
    r = sandbox.run(boot_script(render_hub(p)), STUB_TAG_RUN_ID=HUB_RUN)
    assert r.returncode == 0, r.stdout + r.stderr
    secret = GridSecret.read(sandbox.etc / "grid-secret")
    assert secret != SECRET and stored_secret(sandbox) == f"{HUB_RUN} {secret.value}"
    assert [c[2] for c in ssm_calls(sandbox)] == ["get-parameter", "put-parameter"]
    assert_nowhere(sandbox, SECRET.value, secret.value)


def test_a_run_keeps_its_secret_through_its_hubs_and_the_next_run_makes_its_own(sandbox):
    """Three boots on one parameter: the run's first hub, its replacement, the next day's hub."""
    p = sandbox_hub(sandbox)
    script = boot_script(render_hub(p))
    seen = []
    for run_id in (HUB_RUN, HUB_RUN, "2026-11-21"):
        r = sandbox.run(script, STUB_TAG_RUN_ID=run_id)
        assert r.returncode == 0, r.stdout + r.stderr
        seen.append(GridSecret.read(sandbox.etc / "grid-secret"))
        assert stored_secret(sandbox) == f"{run_id} {seen[-1].value}"
    assert seen[0] == seen[1] != seen[2]


def test_a_hub_that_cannot_read_the_parameter_makes_a_new_secret_and_says_what_that_means(sandbox):
    """Reading is tried three times (the AWS CLI's error in the log); then the secret is new, as a first hub's:
    the nodes already running cannot join, and the hub replaces them, as it does any node that cannot work."""
    p = sandbox_hub(sandbox)
    put_grid_secret(sandbox, p.grid_secret_parameter, f"{HUB_RUN} {SECRET.value}\n")
    r = sandbox.run(boot_script(render_hub(p)), STUB_TAG_RUN_ID=HUB_RUN, STUB_SSM_GET_FAILS="1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [c[2] for c in ssm_calls(sandbox)] == ["get-parameter"] * 3 + ["put-parameter"]
    log = sandbox.boot_log()
    assert (
        "aws ssm get-parameter /gridfleet/grid-secret failed (attempt 3 of 3): An error occurred "
        "(AccessDeniedException) when calling the get-parameter operation"
    ) in log
    assert (
        "cannot read the SSM parameter /gridfleet/grid-secret: a new Grid secret, which the nodes of run "
        f"{HUB_RUN} already running do not hold"
    ) in log
    secret = GridSecret.read(sandbox.etc / "grid-secret")
    assert secret != SECRET and stored_secret(sandbox) == f"{HUB_RUN} {secret.value}"


def test_a_hub_that_cannot_put_the_grid_secret_starts_no_grid(sandbox):
    p = sandbox_hub(sandbox)
    sandbox.run(boot_script(render_hub(p)), STUB_SSM_FAILS="1")
    log = sandbox.boot_log()
    assert (
        "gridfleet: hub bootstrap failed at grid-secret: cannot put the Grid secret in the SSM parameter "
        "/gridfleet/grid-secret: no node could join"
    ) in log
    assert "aws ssm put-parameter /gridfleet/grid-secret failed (attempt 3 of 3)" in log
    assert sandbox.calls("java") == [] and [c[1] for c in sandbox.calls("gridfleet")] == ["grid-secret"]
    assert sandbox.calls()[-1] == SHUTDOWN and log in sandbox.console.read_text()


def test_grid_secret_refuses_a_bad_run_id_in_one_line(tmp_path):
    """What the boot script hands `gridfleet grid-secret` is checked again there: a run id it could not have
    read from the tag is one line, exit 2, and no file is written."""
    root = Path(__file__).resolve().parents[2]
    files = [a for name in ("secret-file", "hub-config", "curl-config", "parameter-file")
             for a in (f"--{name}", str(tmp_path / name))]  # fmt: skip
    cmd = [sys.executable, "-m", "cli.main", "grid-secret", "--run-id", "no run; id", *files]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--run-id 'no run; id' is not a run id" in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_node_reads_the_grid_secret_into_a_file_of_the_crawl_user(sandbox):
    p = booted(sandbox)
    sandbox.run(boot_script(render_node(p)), "agent")  # the calls of the boot were forgotten: read them from disk
    secret_file = sandbox.etc / "grid-secret"
    assert GridSecret.read(secret_file) == SECRET and mode(secret_file) == 0o600
    assert sandbox.calls("gridfleet")[0][-2:] == ["--grid-secret-file", str(secret_file)]


def test_the_node_gets_the_grid_secret_with_decryption_and_hands_the_file_to_the_crawl_user(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    r = sandbox.run(boot_script(render_node(p)))
    assert r.returncode == 0, r.stdout + r.stderr
    (get,) = ssm_calls(sandbox)
    assert get == get_parameter_call()
    part = f"{sandbox.etc}/grid-secret.part"
    calls = sandbox.calls()
    assert calls.index(sandbox.calls("useradd")[0]) < calls.index(get) < calls.index(["chown", "2000:2000", part])
    assert f"the Grid secret of run {NODE_RUN} in /gridfleet/grid-secret is in" in sandbox.boot_log()
    assert (sandbox.etc / "grid-secret").read_text() == SECRET.value + "\n"  # the secret alone, not the run's id
    assert_nowhere(sandbox, SECRET.value)


@pytest.mark.parametrize(
    "case, env, stored, line",
    [
        pytest.param(
            "denied", {"STUB_SSM_FAILS": "1"}, True,
            "cannot read the Grid secret from the SSM parameter /gridfleet/grid-secret: without it this node cannot "
            "join the Grid", id="denied",
        ),
        pytest.param(
            "missing", {}, False,
            "cannot read the Grid secret from the SSM parameter /gridfleet/grid-secret: without it this node cannot "
            "join the Grid", id="missing",
        ),
        pytest.param(
            "not-a-secret", {}, f"{NODE_RUN} short secret!\n",
            "the SSM parameter /gridfleet/grid-secret does not hold a Grid secret", id="not-a-secret",
        ),
        pytest.param(
            "no-run-id", {}, SECRET.value + "\n",
            "the SSM parameter /gridfleet/grid-secret does not hold a Grid secret (a run id, then", id="no-run-id",
        ),
        pytest.param(
            "another-run", {}, f"2026-11-20 {SECRET.value}\n",
            "the SSM parameter /gridfleet/grid-secret holds the Grid secret of another run than 2026-11-21, which "
            "this run's Grid hub refuses", id="another-run",
        ),
    ],
)  # fmt: skip
def test_a_node_without_the_grid_secret_refuses_to_start_and_says_why(sandbox, case, env, stored, line):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    stored_file = sandbox.ssm / "gridfleet" / "grid-secret"
    if stored is False:
        stored_file.unlink()
    elif isinstance(stored, str):
        stored_file.write_text(stored)
    r = sandbox.run(boot_script(render_node(p)), **env)
    assert r.returncode != 0
    log = failed(sandbox, "grid-secret")
    assert f"gridfleet: node bootstrap failed at grid-secret: {line}" in sandbox.console.read_text()
    gets = [c for c in sandbox.calls("aws") if c[1:3] == ["ssm", "get-parameter"]]
    assert len(gets) == (3 if case in ("denied", "missing") else 1)
    assert sandbox.calls("gridfleet")[-1][1:3] == ["node", "report-failure"] and sandbox.calls("mount") == []
    assert not (sandbox.etc / "grid-secret").exists() and not (sandbox.etc / "grid-secret.part").exists()
    assert "short secret" not in log
    assert_nowhere(sandbox, SECRET.value)


def test_production_paths_are_the_defaults():
    script = boot_script(render_node(node_params()))
    for default in (
        "${GRIDFLEET_BOOT_LOG:-/var/log/gridfleet-boot.log}",
        "${GRIDFLEET_CONSOLE:-/dev/console}",
        "${GRIDFLEET_ETC_DIR:-/etc/gridfleet}",
        "${GRIDFLEET_AGENT_LOG:-/var/log/gridfleet-node.log}",
    ):
        assert default in script
    assert 'exec > >(tee -a "$LOG_FILE" "$CONSOLE") 2>&1' in script
    assert os.path.basename(render_mod.NODE_BOOT_SCRIPT) == "gridfleet-node-boot"
    assert render_mod.NODE_AGENT_LOG == "/var/log/gridfleet-node.log"


def test_render_script_prints_the_boot_script(tmp_path):
    config = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"
    cmd = [".venv/bin/gridfleet", "render", "node", "--config", str(config), "--hub-address", "10.0.0.5"]
    root = Path(__file__).resolve().parents[2]
    plain = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=60)
    script = subprocess.run([*cmd, "--script"], capture_output=True, text=True, cwd=root, timeout=60)
    assert plain.returncode == 0 and script.returncode == 0, plain.stderr + script.stderr
    assert script.stdout == boot_script(plain.stdout) and script.stdout.startswith("#!/bin/bash\n")


def test_the_efs_utils_key_is_the_one_the_upload_and_the_preflight_use():
    """The boot script finds amazon-efs-utils where `bundle --upload --efs-utils-deb` puts it (AwsConfig's key)."""
    from fleet.config.aws import AwsConfig

    for bundle_key in ("bundle/gridfleet-bundle.tar.gz", "gridfleet-bundle.tar.gz", "a/b/c.tar.gz"):
        script = boot_script(render_node(node_params(bundle_key=bundle_key)))
        key = AwsConfig(bundle_key=bundle_key).efs_utils_key
        assert f"EFS_UTILS_KEY={key}" in parameter_block(script).replace("'", ""), (bundle_key, key)


def test_a_log_shipper_that_cannot_start_leaves_the_boot_log_to_the_aws_cli(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    r = sandbox.run(boot_script(render_node(p)), STUB_SYSTEMCTL_FAIL="gridfleet-logs.service", STUB_VALIDATE_RC="2")
    assert r.returncode != 0
    assert "cannot start the log shipper (status 1)" in failed(sandbox, "check-config")
    assert [c[1:3] for c in sandbox.calls("aws") if c[1] == "logs"] == [
        ["logs", "create-log-stream"],
        ["logs", "put-log-events"],
    ]
