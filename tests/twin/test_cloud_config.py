"""The twin's reading of a #cloud-config: what it writes, in which order, and what it refuses (no root needed)."""

from __future__ import annotations

import base64
import gzip
import shlex

import pytest

from cloud_init import HubUserData, NodeUserData, render_hub, render_node
from cloud_init.render import HUB_BOOT_SCRIPT, NODE_BOOT_SCRIPT, NODE_ENV_FILE
from twin.instance.cloud_config import TwinError, plan_user_data
from twin.instance.shims import shutdown_delay


def node_user_data() -> str:
    return render_node(
        NodeUserData(
            run_id="2026-11-21",
            region="ap-northeast-2",
            bucket="gridfleet-artifacts",
            bundle_key="bundle/gridfleet-bundle.tar.gz",
            config_key="runs/2026-11-21/fleet.yaml",
            efs_id="fs-0123456789abcdef0",
            hub_address="10.77.0.2",
            grid_secret_parameter="/gridfleet/grid-secret",
        )
    )


def test_rendered_node_user_data_is_planned_with_the_real_script():
    plan = plan_user_data(node_user_data())
    files = {f["path"]: f for f in plan["write_files"]}
    units = {f"/etc/systemd/system/gridfleet-{name}.service" for name in ("node", "logs", "mounts")}
    assert set(files) == {NODE_BOOT_SCRIPT, NODE_ENV_FILE, *units}
    script = base64.b64decode(files[NODE_BOOT_SCRIPT]["data_b64"]).decode()  # the gz+b64 content, decoded
    assert script.startswith("#!/bin/bash") and "step start-agent" in script
    assert files[NODE_BOOT_SCRIPT]["mode"] == 0o755 and files[NODE_ENV_FILE]["mode"] == 0o644
    assert plan["runcmd"] == f"#!/bin/sh\n{NODE_BOOT_SCRIPT}\n"
    assert plan["bootcmd"] is None and plan["packages"] == []


def test_rendered_hub_user_data_writes_its_unit_and_runs_systemctl():
    hub = HubUserData(
        region="ap-northeast-2",
        bucket="gridfleet-artifacts",
        bundle_key="b/x.tar.gz",
        hub_config_key="c/f.yaml",
        grid_secret_parameter="/gridfleet/grid-secret",
    )
    plan = plan_user_data(render_hub(hub))
    unit = next(f for f in plan["write_files"] if f["path"].endswith("gridfleet-hub.service"))
    assert f"ExecStart={HUB_BOOT_SCRIPT}" in base64.b64decode(unit["data_b64"]).decode()
    assert "systemctl enable --now --no-block gridfleet-hub.service" in plan["runcmd"]


def test_encodings_lists_and_strings_follow_cloud_init():
    packed = base64.b64encode(gzip.compress(b"zipped\n")).decode()
    plan = plan_user_data(
        "#cloud-config\n"
        "write_files:\n"
        f"  - {{path: /etc/a, content: {packed}, encoding: gz+b64, permissions: '0600', owner: 'nobody:nogroup'}}\n"
        "  - {path: /etc/b, content: 'later', defer: true, append: true}\n"
        "packages: [curl]\n"
        "bootcmd: [echo early]\n"
        'runcmd:\n  - [echo, "it\'s $HOME"]\n  - echo $HOME\n'
    )
    a, b = plan["write_files"]
    assert base64.b64decode(a["data_b64"]) == b"zipped\n" and a["mode"] == 0o600 and a["owner"] == "nobody:nogroup"
    assert b["defer"] and b["append"] and b["owner"] == "root:root" and b["mode"] == 0o644
    quoted = shlex.quote("it's $HOME")
    assert plan["runcmd"] == f"#!/bin/sh\necho {quoted}\necho $HOME\n"
    assert plan["bootcmd"] == "#!/bin/sh\necho early\n" and plan["packages"] == ["curl"]


@pytest.mark.parametrize(
    ("user_data", "problem"),
    [
        ("#!/bin/sh\necho hi\n", "#cloud-config documents only"),
        ("#cloud-config\nusers: [default]\n", "does not support users"),
        ("#cloud-config\nwrite_files: [{path: etc/x, content: y}]\n", "write_files[0].path"),
        ("#cloud-config\nwrite_files: [{path: /x, content: y, permissions: '0999'}]\n", "permissions"),
        ("#cloud-config\nwrite_files: [{path: /x, source: {uri: 'http://a/'}}]\n", "does not support source"),
        ("#cloud-config\nwrite_files: [{path: /x, content: '!!', encoding: b64}]\n", "cannot decode"),
        ("#cloud-config\nruncmd: [[]]\n", "runcmd[0]"),
        ("#cloud-config\npackages: [[curl, '8.0']]\n", "packages"),
        # a value ending in a newline: each rule is matched whole
        ('#cloud-config\nwrite_files: [{path: /x, content: y, permissions: "0644\\n"}]\n', "permissions"),
        ('#cloud-config\nwrite_files: [{path: /x, content: y, owner: "root:root\\n"}]\n', "owner"),
        ('#cloud-config\npackages: ["curl\\n"]\n', "packages"),
    ],
)
def test_what_the_twin_cannot_boot_is_refused_by_name(user_data, problem):
    with pytest.raises(TwinError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        plan_user_data(user_data)


@pytest.mark.parametrize(
    "said, delay",
    [
        ("", None),
        ("2026-11-27T08:00:00Z shutdown -h now\n", 0.0),
        ("2026-11-27T08:00:00Z shutdown -h +1 gridfleet: the run is over\n", 60.0),
        ("2026-11-27T08:00:00Z shutdown -h +5\n", 300.0),
        ("2026-11-27T08:00:00Z shutdown -h\n", 60.0),  # systemd's default: a minute
        ("2026-11-27T08:00:00Z poweroff\n", 0.0),
        ("t shutdown -h +1\nt shutdown -h now\n", 0.0),  # the last request counts
        ("t shutdown -h +1\nt shutdown -c\n", None),
    ],
)
def test_a_shutdowns_delay_is_read_as_systemd_reads_it(said, delay):
    assert shutdown_delay(said) == delay


def test_an_instance_id_or_ssh_user_ending_in_a_newline_is_refused(tmp_path):
    """Matched whole: with `re.match` and `$`, a trailing newline passed into a path and a shell line."""
    from twin.instance.sandbox import InstanceSandbox
    from twin.instance.sshd import authorize

    with pytest.raises(TwinError, match="instance id"):
        InstanceSandbox("i-0123456789abcdef0\n", node_user_data(), tmp_path)
    with pytest.raises(TwinError, match="ssh user"):
        authorize(None, "admin\n", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB x")  # type: ignore[arg-type]
