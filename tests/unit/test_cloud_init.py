"""cloud_init: the rendered user-data is valid cloud-config, its scripts pass shellcheck, every value is quoted and
every parameter is checked. What the boot scripts do when bash runs them is in test_boot_scripts.py."""

from __future__ import annotations

import dataclasses
import functools
import re
import shutil
import subprocess

import jinja2
import pytest
import yaml

import cloud_init
from cloud_init import HubUserData, NodeUserData, RenderError, render_hub, render_node
from cloud_init import render as render_mod
from tests.helpers.boot_sandbox import BASH, EFS_ID  # noqa: E402 - the sandbox's own values

HOSTILE_KEY = 'bundle/it\'s a "test" $(touch pwned) `touch pwned` ; & | <x> # not: a comment {{ y }} \\ ü 🙂/b.tar.gz'
HOSTILE_CONFIG_KEY = "runs/2026-11-21/fleet $HOME ${PATH} 'x' \"y\".yaml"
GRID_SECRET_PARAMETER = "/gridfleet/grid-secret"


def node_params(**kw) -> NodeUserData:
    base = dict(
        run_id="2026-11-21",
        region="ap-northeast-2",
        bucket="gridfleet-artifacts",
        bundle_key="bundle/gridfleet-bundle.tar.gz",
        config_key="runs/2026-11-21/fleet.yaml",
        efs_id=EFS_ID,
        hub_address="10.0.1.10",
        grid_secret_parameter=GRID_SECRET_PARAMETER,
    )
    return NodeUserData(**{**base, **kw})


def hub_params(**kw) -> HubUserData:
    base = dict(
        region="ap-northeast-2",
        bucket="gridfleet-artifacts",
        bundle_key="bundle/gridfleet-bundle.tar.gz",
        hub_config_key="config/fleet.yaml",
        grid_secret_parameter=GRID_SECRET_PARAMETER,
        grid_secret_key="alias/gridfleet",
    )
    return HubUserData(**{**base, **kw})


def files_of(user_data: str) -> dict[str, dict]:
    return {f["path"]: f for f in yaml.safe_load(user_data)["write_files"]}


def node_script(user_data: str) -> str:
    return render_mod.boot_script(user_data)


def hub_script(user_data: str) -> str:
    return render_mod.boot_script(user_data)


NODE_UNIT = "/etc/systemd/system/gridfleet-node.service"
LOGS_UNIT = "/etc/systemd/system/gridfleet-logs.service"
MOUNTS_UNIT = "/etc/systemd/system/gridfleet-mounts.service"


# --- the documents --------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["node", "hub"])
def test_cloud_config_shape(kind):
    text = render_node(node_params()) if kind == "node" else render_hub(hub_params())
    assert text.startswith("#cloud-config\n")
    assert len(text.encode()) < cloud_init.USER_DATA_LIMIT
    doc = yaml.safe_load(text)
    script_path = render_mod.NODE_BOOT_SCRIPT if kind == "node" else render_mod.HUB_BOOT_SCRIPT
    env_path = render_mod.NODE_ENV_FILE if kind == "node" else render_mod.HUB_ENV_FILE
    assert "packages" not in doc
    files = files_of(text)
    script = render_mod.boot_script(text)
    if kind == "node":  # a node boots once: cloud-init runs its script, which hands the work to a service
        assert doc["runcmd"] == [[script_path]]
        assert set(files) == {script_path, env_path, NODE_UNIT, LOGS_UNIT, MOUNTS_UNIT}
        mounts = files[MOUNTS_UNIT]["content"]  # root's helper: no User=, and started by the boot script only
        assert f"ExecStart={script_path} site-mounts\n" in mounts and "User=" not in mounts
        assert "[Install]" not in mounts
        unit = files[NODE_UNIT]["content"]
        assert f"ExecStart={script_path} agent\n" in unit and f"ExecStopPost={script_path} stopped\n" in unit
        assert f"StandardOutput=append:{render_mod.NODE_AGENT_LOG}\n" in unit  # not the console
        assert "After=network-online.target gridfleet-logs.service\n" in unit  # stopped before the shipper
        assert "[Install]" not in unit  # started by the boot script once it is ready, never by itself
    else:  # a hub may be stopped and started again: a systemd unit runs its script at every boot
        unit = "/etc/systemd/system/gridfleet-hub.service"
        assert doc["runcmd"][-1] == ["systemctl", "enable", "--now", "--no-block", "gridfleet-hub.service"]
        assert set(files) == {script_path, env_path, unit, LOGS_UNIT}
        assert f"ExecStart={script_path}\n" in files[unit]["content"]
        assert "WantedBy=multi-user.target" in files[unit]["content"]
    assert f"ExecStart={script_path} ship-logs\n" in files[LOGS_UNIT]["content"]
    assert files[script_path]["permissions"] == "0755" and files[script_path]["owner"] == "root:root"
    assert files[script_path]["encoding"] == "gz+b64" and script.startswith("#!/bin/bash\n")
    assert files[env_path]["permissions"] == "0644"
    for secret in ("AKIA", "aws_secret", "X-Amz-Signature", "X-Amz-Credential", "SecretAccessKey"):
        assert secret.lower() not in (text + script).lower()


def _needs(tool: str):
    """`make setup` installs the real tool; without it the check must fail, not pass by skipping."""

    def wrap(fn):
        @functools.wraps(fn)
        def check(*args, **kwargs):
            if shutil.which(tool) is None:
                pytest.fail(f"{tool} is not installed (make setup)")
            return fn(*args, **kwargs)

        return check

    return wrap


needs_cloud_init = _needs("cloud-init")
needs_shellcheck = _needs("shellcheck")


@needs_cloud_init
@pytest.mark.parametrize(
    "text",
    [
        pytest.param(render_node(node_params()), id="node"),
        pytest.param(render_hub(hub_params()), id="hub"),
        pytest.param(
            render_node(node_params(bundle_key=HOSTILE_KEY, config_key=HOSTILE_CONFIG_KEY)), id="node-hostile"
        ),
        pytest.param(render_hub(hub_params(bundle_key=HOSTILE_KEY, self_stop="none")), id="hub-hostile"),
    ],
)
def test_cloud_init_schema_accepts_it(text, tmp_path):
    path = tmp_path / "user-data.yaml"
    path.write_text(text)
    r = subprocess.run(["cloud-init", "schema", "--config-file", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == f"Valid cloud-config: {path}"


@needs_shellcheck
@pytest.mark.parametrize(
    "text",
    [
        pytest.param(render_node(node_params()), id="node"),
        pytest.param(render_hub(hub_params(self_stop="terminate")), id="hub"),
        pytest.param(
            render_node(node_params(bundle_key=HOSTILE_KEY, config_key=HOSTILE_CONFIG_KEY)), id="node-hostile"
        ),
        pytest.param(
            render_hub(hub_params(bundle_key=HOSTILE_KEY, hub_config_key=HOSTILE_CONFIG_KEY)), id="hub-hostile"
        ),
    ],
)
def test_shellcheck_finds_nothing(text, tmp_path):
    env = [f["content"] for f in files_of(text).values() if f["path"].endswith(".env")]
    assert len(env) == 1
    for i, content in enumerate([render_mod.boot_script(text), *env]):  # the env file is sourced by shells
        path = tmp_path / f"file{i}.sh"
        path.write_text(content)
        r = subprocess.run(["shellcheck", "-s", "bash", str(path)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and not r.stdout, f"file{i}.sh:\n{r.stdout}{r.stderr}"


def test_user_data_limit(monkeypatch):
    text = render_node(node_params())
    monkeypatch.setattr(render_mod, "USER_DATA_LIMIT", len(text.encode()) - 1)
    with pytest.raises(RenderError, match="user-data: .* over EC2's limit"):
        render_node(node_params())


# --- quoting ------------------------------------------------------------------------------------
def parameter_block(script: str) -> str:
    m = re.search(r"^# --- parameters .*?$(.*?)^# --- end of parameters ---$", script, re.M | re.S)
    assert m, "no parameter block"
    return m.group(1)


def bash_values(code: str, names: list[str]) -> list[str]:
    printer = "printf '%s\\0'" + "".join(f' "${{{n}}}"' for n in names)
    r = subprocess.run([BASH, "-c", code + "\n" + printer], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().split("\0")[:-1]


def test_hostile_values_are_reproduced_exactly(tmp_path):
    p = node_params(bundle_key=HOSTILE_KEY, config_key=HOSTILE_CONFIG_KEY, hub_address="hub.internal.example")
    text = render_node(p)
    script = node_script(text)
    path = tmp_path / "boot.sh"
    path.write_text(script)
    assert subprocess.run([BASH, "-n", str(path)], capture_output=True, timeout=30).returncode == 0

    block = parameter_block(script)
    got = bash_values(
        f"cd {tmp_path}\n{block}",
        ["BUNDLE_KEY", "CONFIG_KEY", "EFS_UTILS_KEY", "HUB", "EFS_MOUNT", "RUN_ID", "GRID_PORT", "INSTALL_DIR"],
    )
    efs_utils_key = HOSTILE_KEY.rsplit("/", 1)[0] + "/amazon-efs-utils.deb"
    assert got == [
        HOSTILE_KEY,
        HOSTILE_CONFIG_KEY,
        efs_utils_key,
        "hub.internal.example",
        "/efs",
        "2026-11-21",
        "4444",
        "/opt/gridfleet",
    ]

    env = files_of(text)[render_mod.NODE_ENV_FILE]["content"]
    got = bash_values(f"cd {tmp_path}\n{env}", ["GRIDFLEET_BUNDLE_KEY", "GRIDFLEET_CONFIG_KEY", "GRIDFLEET_RUN_ID"])
    assert got == [HOSTILE_KEY, HOSTILE_CONFIG_KEY, "2026-11-21"]
    assert not (tmp_path / "pwned").exists()


def test_hub_hostile_values_are_reproduced_exactly(tmp_path):
    text = render_hub(hub_params(bundle_key=HOSTILE_KEY, hub_config_key=HOSTILE_CONFIG_KEY, self_stop="none"))
    got = bash_values(
        f"cd {tmp_path}\n{parameter_block(hub_script(text))}", ["BUNDLE_KEY", "HUB_CONFIG_KEY", "SELF_STOP"]
    )
    assert got == [HOSTILE_KEY, HOSTILE_CONFIG_KEY, "none"]
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "value",
    [
        "plain",
        "quote \" and ' and \\",
        "line\nbreak\ttab",
        "yaml: # not a comment",
        "nel\x85 ls\u2028 ps\u2029",
        "del\x7f c1\x9b bom\ufeff",
        "ü 🙂 漢字",
        "<&>",
    ],
)
def test_tojson_is_yaml(value):
    env = render_mod.environment()
    dumped = env.from_string("{{ v | tojson }}").render(v=value)
    assert "\n" not in dumped and "\u2028" not in dumped and "\x85" not in dumped
    assert yaml.safe_load(f"x: {dumped}\n") == {"x": value}


def test_shquote_quotes_one_word():
    env = render_mod.environment()
    assert env.from_string("{{ v | shquote }}").render(v="a b'c") == "'a b'\"'\"'c'"
    assert env.from_string("{{ v | shquote }}").render(v=4444) == "4444"
    with pytest.raises(TypeError):
        env.from_string("{{ v | shquote }}").render(v=None)


def test_missing_template_variable_fails():
    env = render_mod.environment()
    ctx = dataclasses.asdict(node_params())
    del ctx["efs_id"]
    with pytest.raises(jinja2.UndefinedError):
        env.get_template("node-boot.sh.j2").render(ctx)
    with pytest.raises(jinja2.UndefinedError):
        env.get_template("node.yaml.j2").render(script_path="/x", script_gz="", env_path="/y")
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ v | tojson }}").render()


# --- validation ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value",
    [
        ("efs_id", "fs-XYZ"),
        ("efs_id", "fs-0123"),
        ("efs_id", "0123456789abcdef0"),
        ("efs_id", "fs-0123456789abcdef0 "),
        ("run_id", "-starts-with-dash"),
        ("run_id", "has space"),
        ("run_id", "x" * 65),
        ("run_id", "a;b"),
        ("grid_port", 0),
        ("grid_port", 65536),
        ("node_port", -1),
        ("grid_publish_port", "4442"),
        ("grid_subscribe_port", True),
        ("grid_publish_port", 4444),
        ("install_dir", "opt/gridfleet"),
        ("state_dir", "var/lib"),
        ("efs_mount", "efs"),
        ("efs_mount", "/"),
        ("install_dir", "/opt/../etc"),
        ("install_dir", "/opt/grid fleet"),
        ("hub_address", "10.0.1.10; reboot"),
        ("hub_address", ""),
        ("bucket", "Bad_Bucket"),
        ("region", "mars-1"),
        ("bundle_key", "/abs"),
        ("config_key", "a\nb"),
        ("bundle_key", ""),
        ("imds_url", "http://169.254.169.254/latest"),
        ("boot_timeout_s", 0),
        ("boot_timeout_s", 1.5),
        ("node_port", 80),  # the Grid node runs unprivileged
        ("crawl_user", "root"),
        ("crawl_user", "Crawler"),
        ("crawl_user", "a b"),
        ("crawl_user", ""),
        ("crawl_user", "x;reboot"),
        ("crawl_user", "-dash"),
        ("crawl_user", "x" * 33),
        ("crawl_user", 2000),
        ("crawl_uid", 0),
        ("crawl_uid", 999),
        ("crawl_uid", 60001),
        ("crawl_uid", -1),
        ("crawl_uid", "2000"),
        ("crawl_uid", True),
        ("crawl_uid", 2000.0),
        ("grid_secret_parameter", "gridfleet/grid-secret"),  # a parameter path starts with '/'
        ("grid_secret_parameter", "/gridfleet/grid-secret\n"),
        ("grid_secret_parameter", "/gridfleet/grid secret"),
        ("grid_secret_parameter", "/gridfleet//grid-secret"),
        ("grid_secret_parameter", "/gridfleet/grid-secret/"),
        ("grid_secret_parameter", "/aws/service/x"),  # AWS's own names, not the account's
        ("grid_secret_parameter", "/gridfleet/$(reboot)"),
        ("grid_secret_parameter", ""),
        ("grid_secret_parameter", None),
    ],
)
def test_node_rejects(field, value):
    with pytest.raises(RenderError, match=f"^{field}: ") as e:
        node_params(**{field: value})
    assert e.value.field == field


@pytest.mark.parametrize(
    "field, value",
    [
        ("self_stop", "reboot"),
        ("self_stop", ""),
        ("grid_port", 70000),
        ("install_dir", "relative"),
        ("state_dir", "/var/lib/"),
        ("hub_config_key", "x\ty"),
        ("bucket", "ab"),
        ("grid_secret_parameter", "/ssm/x"),
        ("grid_secret_parameter", "/gridfleet/grid-secret;x"),
        ("grid_secret_key", "arn:aws:kms:x"),  # by its alias
        ("grid_secret_key", "alias/gridfleet\n"),
        ("grid_secret_key", "alias/grid fleet"),
    ],
)
def test_hub_rejects(field, value):
    with pytest.raises(RenderError, match=f"^{field}: "):
        hub_params(**{field: value})


def test_render_checks_again():
    p = node_params()
    object.__setattr__(p, "efs_id", "fs-nope")  # past the frozen dataclass
    with pytest.raises(RenderError, match="^efs_id: "):
        render_node(p)
    with pytest.raises(TypeError):
        render_hub(node_params())


def test_render_error_is_a_value_error():
    assert issubclass(RenderError, ValueError)


def test_the_user_data_names_the_grid_secrets_parameter_and_holds_no_secret():
    """The commands that render user-data (`gridfleet render`, the hub launching nodes) give it the stack's
    parameter, /<stack>/grid-secret, and its KMS key's alias: names only. The instances make or read the secret
    when they boot, so a rendering holds nothing random: two are the same, and neither says anything of the
    Grid's config or credentials."""
    from cli.commands.aws import hub_params as hub_params_of
    from cli.envs.aws import node_params as node_params_of
    from fleet.config import Config

    config = Config.model_validate(
        {"aws": {"stack": "crawl-a", "efs_id": EFS_ID}, "sites": [{"id": "a", "start_url": "http://a/"}]}
    )
    hub = hub_params_of(config)
    node = node_params_of(config, "2026-11-21", "10.0.1.10")
    assert hub.grid_secret_parameter == node.grid_secret_parameter == "/crawl-a/grid-secret"
    assert hub.grid_secret_key == "alias/crawl-a"
    for text, render, values in (
        (render_hub(hub), lambda: render_hub(hub_params_of(config)), ["GRID_SECRET_PARAM", "GRID_SECRET_KEY"]),
        (render_node(node), lambda: render_node(node_params_of(config, "2026-11-21", "10.0.1.10")),
         ["GRID_SECRET_PARAM"]),
    ):  # fmt: skip
        script = cloud_init.boot_script(text)
        assert bash_values(parameter_block(script), values) == ["/crawl-a/grid-secret", "alias/crawl-a"][: len(values)]
        assert render() == text
        for word in ("registration-secret", "password"):
            assert word not in text and word not in script, word
        assert all("file://" in v for v in re.findall(r"--value (\S+)", script))  # a value from a file only


# --- hostile values: a trailing newline, a value of any length --------------------------------------------------
#: Every field checked against a pattern, with a valid value: each is refused with a newline after it (a `$`
#: anchor alone, with `re.match`, lets one through, and a newline in user-data or a shell line is a new line).
NODE_PATTERNED = {
    "run_id": "2026-11-21",
    "region": "ap-northeast-2",
    "bucket": "gridfleet-artifacts",
    "efs_id": EFS_ID,
    "hub_address": "10.0.1.10",
    "imds_url": "http://169.254.169.254",
    "table": "TrendlyzeStatus",
    "crawl_user": "gridfleet",
    "log_group": "/gridfleet/node",
    "install_dir": "/opt/gridfleet",
    "state_dir": "/var/lib/gridfleet",
    "efs_mount": "/efs",
}
HUB_PATTERNED = {
    "region": "ap-northeast-2",
    "bucket": "gridfleet-artifacts",
    "imds_url": "http://169.254.169.254",
    "log_group": "/gridfleet/hub",
    "install_dir": "/opt/gridfleet",
    "state_dir": "/var/lib/gridfleet",
}


@pytest.mark.parametrize("ending", ["\n", "\r\n"])
@pytest.mark.parametrize(
    "kind, field",
    [("node", f) for f in NODE_PATTERNED] + [("hub", f) for f in HUB_PATTERNED],
)
def test_a_value_ending_in_a_newline_is_refused(kind, field, ending):
    valid = (NODE_PATTERNED if kind == "node" else HUB_PATTERNED)[field]
    make = node_params if kind == "node" else hub_params
    make(**{field: valid})  # the value itself passes
    with pytest.raises(RenderError, match=f"^{field}: ") as e:
        make(**{field: valid + ending})
    assert e.value.field == field and "\n" not in str(e.value)  # the newline is written out, not printed


def test_render_checks_a_newline_again():
    p = node_params()
    object.__setattr__(p, "hub_address", "10.0.1.10\n")  # past the frozen dataclass
    with pytest.raises(RenderError, match="^hub_address: "):
        render_node(p)


def test_a_long_value_is_cut_in_its_error_with_its_length():
    with pytest.raises(RenderError) as e:
        node_params(hub_address="h" * 102_400 + ";")
    assert len(str(e.value)) < 200 and "(102401 characters)" in str(e.value)


@pytest.mark.parametrize(
    "value", ["", "short", "a" * 64, "a" * 65, "x" * 102_400, "\x1b[31m" * 40, "\u2028" * 70, 12, ["x"] * 400, None]
)
def test_cloud_init_quotes_a_value_as_fleet_errors_does(value):
    """cloud_init imports nothing of the project: its copy of the rule is held to the same output."""
    from fleet.errors import quote

    assert render_mod._quote(value) == quote(value)
