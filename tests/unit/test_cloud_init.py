"""cloud_init: the rendered user-data is valid cloud-config, its scripts pass shellcheck, every value is quoted,
and the boot scripts do what they should when run for real by bash in a sandbox of stub commands."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import io
import os
import re
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import jinja2
import pytest
import yaml

import cloud_init
from cloud_init import HubUserData, NodeUserData, RenderError, render_hub, render_node
from cloud_init import render as render_mod
from fleet import crawlerfile
from tests.helpers.wait import wait_for

BASH = shutil.which("bash") or "/bin/bash"
INSTANCE_ID = "i-0123456789abcdef0"
LOCAL_IP = "10.0.1.23"
TOKEN = "AQAEAtestTOKEN=="
EFS_ID = "fs-0123456789abcdef0"
HOSTILE_KEY = 'bundle/it\'s a "test" $(touch pwned) `touch pwned` ; & | <x> # not: a comment {{ y }} \\ ü 🙂/b.tar.gz'
HOSTILE_CONFIG_KEY = "runs/2026-11-21/fleet $HOME ${PATH} 'x' \"y\".yaml"


def node_params(**kw) -> NodeUserData:
    base = dict(
        run_id="2026-11-21",
        region="ap-northeast-2",
        bucket="gridfleet-artifacts",
        bundle_key="bundle/gridfleet-bundle.tar.gz",
        config_key="runs/2026-11-21/fleet.yaml",
        efs_id=EFS_ID,
        hub_address="10.0.1.10",
    )
    return NodeUserData(**{**base, **kw})


def hub_params(**kw) -> HubUserData:
    base = dict(
        region="ap-northeast-2",
        bucket="gridfleet-artifacts",
        bundle_key="bundle/gridfleet-bundle.tar.gz",
        hub_config_key="config/fleet.yaml",
    )
    return HubUserData(**{**base, **kw})


def files_of(user_data: str) -> dict[str, dict]:
    return {f["path"]: f for f in yaml.safe_load(user_data)["write_files"]}


def node_script(user_data: str) -> str:
    return files_of(user_data)[render_mod.NODE_BOOT_SCRIPT]["content"]


def hub_script(user_data: str) -> str:
    return files_of(user_data)[render_mod.HUB_BOOT_SCRIPT]["content"]


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
    if kind == "node":  # a node boots once: cloud-init runs its script
        assert doc["runcmd"] == [[script_path]]
        assert set(files) == {script_path, env_path}
    else:  # a hub may be stopped and started again: a systemd unit runs its script at every boot
        unit = "/etc/systemd/system/gridfleet-hub.service"
        assert doc["runcmd"][-1] == ["systemctl", "enable", "--now", "--no-block", "gridfleet-hub.service"]
        assert set(files) == {script_path, env_path, unit}
        assert f"ExecStart={script_path}\n" in files[unit]["content"]
        assert "WantedBy=multi-user.target" in files[unit]["content"]
    assert files[script_path]["permissions"] == "0755" and files[script_path]["owner"] == "root:root"
    assert files[script_path]["content"].startswith("#!/bin/bash\n")
    assert files[env_path]["permissions"] == "0644"
    for secret in ("AKIA", "aws_secret", "X-Amz-Signature", "X-Amz-Credential", "SecretAccessKey"):
        assert secret.lower() not in text.lower()


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
    shell = [f for f in files_of(text).values() if not f["path"].endswith(".service")]  # not the systemd unit
    assert len(shell) == 2
    for i, f in enumerate(shell):  # the boot script and the env file (sourced by shells)
        path = tmp_path / f"file{i}.sh"
        path.write_text(f["content"])
        r = subprocess.run(["shellcheck", "-s", "bash", str(path)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and not r.stdout, f"{f['path']}:\n{r.stdout}{r.stderr}"


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
        ["BUNDLE_KEY", "CONFIG_KEY", "EFS_UTILS_KEY", "HUB", "EFS_ID", "RUN_ID", "GRID_PORT", "INSTALL_DIR"],
    )
    efs_utils_key = HOSTILE_KEY.rsplit("/", 1)[0] + "/amazon-efs-utils.deb"
    assert got == [
        HOSTILE_KEY,
        HOSTILE_CONFIG_KEY,
        efs_utils_key,
        "hub.internal.example",
        EFS_ID,
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
        env.get_template("node.yaml.j2").render(script_path="/x", script="", env_path="/y")
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


# --- the boot scripts in a sandbox ------------------------------------------------------------------
# Real commands the scripts may use; everything else they call is a stub, and a command that is neither
# is not found, so no test can reach the host's apt, mount or shutdown.
REAL_TOOLS = [
    "cat",
    "chmod",
    "cp",
    "date",
    "dirname",
    "env",
    "gzip",
    "mkdir",
    "mktemp",
    "mv",
    "nohup",
    "rm",
    "tar",
    "tee",
    "test",
    "timeout",
    "touch",
]
# Each stub records its call as one line, written at once: the Grid hub's stub runs in the background beside the
# script's next stubs, and a line written in parts could be cut by theirs.
RECORD = (
    '#!{bash}\n_call=${{0##*/}}; for a in "$@"; do _call+=$\'\\x1f\'"$a"; done\n'
    'printf "%s\\n" "$_call" >>"$STUB_LOG"; unset _call\n'
)

STUBS = {
    "curl": r"""
method=GET url= headers=()
while (($#)); do
  case $1 in
    -X) method=$2; shift 2 ;;
    -H) headers+=("$2"); shift 2 ;;
    -o|--max-time|--retry) shift 2 ;;
    http*) url=$1; shift ;;
    *) shift ;;
  esac
done
has_header() { local h; for h in "${headers[@]}"; do [[ $h == "$1" ]] && return 0; done; return 1; }
case $url in
  */latest/api/token)
    [[ $method == PUT ]] && has_header "X-aws-ec2-metadata-token-ttl-seconds: 21600" || exit 22
    printf %s "$STUB_TOKEN" ;;
  */latest/meta-data/*)
    has_header "X-aws-ec2-metadata-token: $STUB_TOKEN" || { echo "curl: (22) 401" >&2; exit 22; }
    case ${url#*/latest/meta-data/} in
      instance-id) printf %s "$STUB_INSTANCE_ID" ;;
      local-ipv4) printf %s "$STUB_LOCAL_IP" ;;
      tags/instance/gridfleet:run_id) [[ -n ${STUB_TAG_RUN_ID:-} ]] || exit 22; printf %s "$STUB_TAG_RUN_ID" ;;
      *) exit 22 ;;
    esac ;;
  */status) [[ -n ${STUB_GRID_DOWN:-} ]] && exit 7; printf '{"value":{"ready":false}}' ;;
  *) exit 7 ;;
esac
""",
    "aws": r"""
[[ $1 == s3 && $2 == cp ]] || exit 2
src=${*: -2:1} dest=${*: -1}
obj=$S3_ROOT/${src#s3://}
[[ -f $obj ]] || { echo "fatal error: An error occurred (404) when calling the HeadObject operation" >&2; exit 1; }
cp -- "$obj" "$dest"
""",
    "apt-get": r"""
count=$(cat "$SANDBOX/apt.count" 2>/dev/null || echo 0); echo $((count + 1)) >"$SANDBOX/apt.count"
for a in "$@"; do
  case $a in
    update) ((count == 0)) && { echo "E: Could not get lock /var/lib/apt/lists/lock" >&2; exit 100; }; exit 0 ;;
    amazon-efs-utils) echo "E: Unable to locate package amazon-efs-utils" >&2; exit 100 ;;
    *.deb) cp "$SANDBOX/mount.efs.stub" "$STUB_BIN/mount.efs"; exit 0 ;;
  esac
done
exit 0
""",
    "dpkg-query": "exit 1\n",
    "mountpoint": "exit 1\n",
    "mount.efs": "exit 0\n",
    "mount": r"""
count=$(cat "$SANDBOX/mount.count" 2>/dev/null || echo 0); echo $((count + 1)) >"$SANDBOX/mount.count"
((count < ${STUB_MOUNT_FAILS:-0})) && { echo "mount.nfs4: Connection timed out" >&2; exit 32; }
exit 0
""",
    "sleep": 'exec "$REAL_SLEEP" "${STUB_SLEEP_REAL:-0}"\n',
    "shutdown": "exit 0\n",
    # Users: none exists until useradd (STUB_PASSWD: one that does); `id` answers STUB_IDS (uid:gid).
    "getent": r"""
[[ $1 == passwd && -n ${STUB_PASSWD:-} && $2 == "${STUB_PASSWD%%:*}" ]] && { echo "$STUB_PASSWD"; exit 0; }
exit 2
""",
    "groupadd": "exit 0\n",
    "useradd": "exit 0\n",
    "id": 'ids=${STUB_IDS:-2000:2000}; [[ $1 == -u ]] && echo "${ids%:*}" || echo "${ids#*:}"\n',
    "chown": "exit 0\n",
    "install": 'mkdir -p -- "${@: -1}"\n',
    # setpriv runs its command as this test's own user; STUB_CANNOT_WRITE: the crawl user's `test -w` fails.
    "setpriv": r"""
while [[ $1 == --* ]]; do shift; done
[[ -n ${STUB_CANNOT_WRITE:-} && " $* " == *" test -w "* ]] && exit 1
exec "$@"
""",
    "java": "exit 0\n",
    "python3": r"""
[[ $1 == -m && $2 == venv ]] || exit 2
venv=${*: -1}
mkdir -p "$venv/bin"
cp "$SANDBOX/pip.stub" "$venv/bin/pip"
""",
}
PIP_STUB = 'cp "$SANDBOX/gridfleet.stub" "$(dirname "$0")/gridfleet"\n'
GRIDFLEET_STUB = r"""
case $1 in
  validate) exit "${STUB_VALIDATE_RC:-0}" ;;
  node) [[ $2 == report-failure ]] && exit 0; exit "${STUB_AGENT_RC:-0}" ;;
  run) exit "${STUB_RUN_RC:-0}" ;;
esac
exit 2
"""


def make_bundle(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (("wheels/gridfleet-0.1.0-py3-none-any.whl", b"wheel"), ("selenium-server.jar", b"jar")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


class Sandbox:
    """A directory with stub commands first on PATH, a fake S3, and the script's paths inside it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.real = root / "real"
        self.s3 = root / "s3"
        self.etc = root / "etc" / "gridfleet"
        self.log_file = root / "log" / "gridfleet-boot.log"
        self.console = root / "console"
        self.stub_log = root / "calls.log"
        self.bucket = "gridfleet-artifacts"
        for d in (self.bin, self.real, self.s3, root / "home", root / "tmp"):
            d.mkdir(parents=True)
        for tool in REAL_TOOLS:
            (self.real / tool).symlink_to(shutil.which(tool))
        for name, body in STUBS.items():
            self.stub(name, body)
        for name, body in (
            ("pip.stub", PIP_STUB),
            ("gridfleet.stub", GRIDFLEET_STUB),
            ("mount.efs.stub", STUBS["mount.efs"]),
        ):
            self.write_exe(root / name, body)
        self.env = {
            "PATH": f"{self.bin}:{self.real}",
            "HOME": str(root / "home"),
            "TMPDIR": str(root / "tmp"),
            "LANG": "C.UTF-8",
            "SANDBOX": str(root),
            "STUB_BIN": str(self.bin),
            "STUB_LOG": str(self.stub_log),
            "S3_ROOT": str(self.s3),
            "REAL_SLEEP": shutil.which("sleep"),
            "STUB_TOKEN": TOKEN,
            "STUB_INSTANCE_ID": INSTANCE_ID,
            "STUB_LOCAL_IP": LOCAL_IP,
            "GRIDFLEET_BOOT_LOG": str(self.log_file),
            "GRIDFLEET_CONSOLE": str(self.console),
            "GRIDFLEET_ETC_DIR": str(self.etc),
            "GRIDFLEET_GRID_LOG": str(root / "log" / "grid.log"),
        }

    def write_exe(self, path: Path, body: str) -> None:
        path.write_text(RECORD.format(bash=BASH) + body)
        path.chmod(0o755)

    def stub(self, name: str, body: str) -> None:
        self.write_exe(self.bin / name, body)

    def put(self, key: str, data: bytes = b"") -> Path:
        path = self.s3 / self.bucket / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    def run(self, script: str, **env: str) -> subprocess.CompletedProcess:
        path = self.root / "boot.sh"
        path.write_text(script)
        return subprocess.run(
            [BASH, str(path)], env={**self.env, **env}, cwd=self.root, capture_output=True, text=True, timeout=60
        )

    def calls(self, name: str | None = None) -> list[list[str]]:
        lines = self.stub_log.read_text().splitlines() if self.stub_log.exists() else []
        calls = [line.split("\x1f") for line in lines]
        return [c for c in calls if name is None or c[0] == name]

    def boot_log(self) -> str:
        return self.log_file.read_text()


@pytest.fixture
def sandbox(tmp_path_factory) -> Sandbox:
    return Sandbox(tmp_path_factory.mktemp("sandbox"))


def sandbox_node(sb: Sandbox, **kw) -> NodeUserData:
    return node_params(
        install_dir=f"{sb.root}/opt/gridfleet",
        state_dir=f"{sb.root}/state",
        efs_mount=f"{sb.root}/efs",
        bucket=sb.bucket,
        **kw,
    )


def upload_node_objects(sb: Sandbox, p: NodeUserData, bundle: bool = True, config: bool = True) -> None:
    if bundle:
        make_bundle(sb.put(p.bundle_key))
    if config:
        sb.put(p.config_key, b"sites: []\n")


def agent_argv(sb: Sandbox, p: NodeUserData) -> list[str]:
    return [
        "gridfleet",
        "node",
        "--config",
        f"{sb.etc}/fleet.yaml",
        "--run-id",
        p.run_id,
        "--instance-id",
        INSTANCE_ID,
        "--grid-url",
        f"http://{p.hub_address}:4444",
        "--grid-jar",
        f"{p.install_dir}/selenium-server.jar",
        "--grid-publish",
        f"tcp://{p.hub_address}:4442",
        "--grid-subscribe",
        f"tcp://{p.hub_address}:4443",
        "--grid-host",
        LOCAL_IP,
        "--grid-port",
        "5555",
        "--state-dir",
        p.state_dir,
        "--profiles-root",
        p.efs_mount,
    ]


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


@pytest.mark.parametrize(
    "keys",
    [
        pytest.param({}, id="plain"),
        pytest.param({"bundle_key": HOSTILE_KEY, "config_key": HOSTILE_CONFIG_KEY}, id="hostile-keys"),
    ],
)
def test_node_happy_path(sandbox, keys):
    p = sandbox_node(sandbox, **keys)
    upload_node_objects(sandbox, p)
    r = sandbox.run(node_script(render_node(p)), STUB_MOUNT_FAILS="2")
    assert r.returncode == 0, r.stdout + r.stderr

    assert_imds_v2(sandbox, ["instance-id", "local-ipv4"])
    # apt: update failed once (the lock race) and was retried, then the missing packages were installed
    apts = sandbox.calls("apt-get")
    assert [c[-1] for c in apts[:2]] == ["update", "update"]
    assert apts[2][apts[2].index("install") :] == [
        "install",
        "-y",
        "--no-install-recommends",
        "chromium",
        "chromium-driver",
        "default-jre-headless",
        "python3-venv",
        "nfs-common",
        "awscli",
        "curl",
        "ca-certificates",
    ]
    assert len(apts) == 3
    # S3: the exact keys, with the region
    cps = sandbox.calls("aws")
    assert [c[-2] for c in cps] == [f"s3://{p.bucket}/{p.config_key}", f"s3://{p.bucket}/{p.bundle_key}"]
    assert all(c[c.index("--region") + 1] == "ap-northeast-2" for c in cps)
    assert (sandbox.etc / "fleet.yaml").read_text() == "sites: []\n"
    assert (Path(p.install_dir) / "selenium-server.jar").read_bytes() == b"jar"
    pip = sandbox.calls("pip")[0]
    assert pip[pip.index("--find-links") + 1] == f"{p.install_dir}/wheels" and "--no-index" in pip
    assert pip[-1] == "gridfleet"
    # EFS: mounted over TLS with IAM, retried every 5 s until it worked
    mount = ["mount", "-t", "efs", "-o", "tls,iam", f"{EFS_ID}:/", p.efs_mount]
    assert sandbox.calls("mount") == [mount] * 3
    assert sandbox.calls("sleep").count(["sleep", "5"]) == 2
    assert (Path(p.efs_mount) / "profiles").is_dir() and (Path(p.efs_mount) / "locks").is_dir()
    # the crawl user: created before the mount, given the state dir and the EFS directories
    home = f"{p.state_dir}/home"
    assert sandbox.calls("groupadd") == [["groupadd", "--system", "--gid", "2000", "gridfleet"]]
    assert sandbox.calls("useradd") == [
        [
            "useradd",
            "--system",
            "--no-log-init",
            "--uid",
            "2000",
            "--gid",
            "2000",
            "--home-dir",
            home,
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            "gridfleet",
        ]
    ]
    assert sandbox.calls("install") == [
        ["install", "-d", "-o", "2000", "-g", "2000", "-m", "0755", p.state_dir],
        ["install", "-d", "-o", "2000", "-g", "2000", "-m", "0700", home],
    ]
    assert sandbox.calls("chown") == [["chown", "2000:2000", f"{p.efs_mount}/profiles", f"{p.efs_mount}/locks"]]
    calls = sandbox.calls()
    assert calls.index(sandbox.calls("useradd")[0]) < calls.index(mount) < calls.index(sandbox.calls("chown")[0])
    # the agent runs as the crawl user (and only it, and the check that it can write on EFS); then the shutdown
    gf = sandbox.calls("gridfleet")
    assert gf == [["gridfleet", "validate", "--config", f"{sandbox.etc}/fleet.yaml"], agent_argv(sandbox, p)]
    crawl_user = [
        "setpriv",
        "--reuid=2000",
        "--regid=2000",
        "--init-groups",
        "--no-new-privs",
        "env",
        f"HOME={home}",
        "USER=gridfleet",
        "LOGNAME=gridfleet",
    ]
    assert sandbox.calls("setpriv") == [
        crawl_user + ["test", "-w", f"{p.efs_mount}/profiles", "-a", "-w", f"{p.efs_mount}/locks"],
        crawl_user + [f"{p.install_dir}/venv/bin/gridfleet"] + agent_argv(sandbox, p)[1:],
    ]
    assert calls[-1] == ["shutdown", "-h", "now"] and calls.count(["shutdown", "-h", "now"]) == 1
    assert calls.index(agent_argv(sandbox, p)) == len(calls) - 2
    assert calls[len(calls) - 3][0] == "setpriv"
    log = sandbox.boot_log()
    assert "the node agent exited with status 0" in log and "bootstrap failed" not in log
    assert sandbox.console.read_text() == log
    assert not list(sandbox.root.rglob("pwned"))


def test_node_mounts_through_the_access_point_when_one_is_given(sandbox):
    ap = "fsap-0123456789abcdef0"
    p = dataclasses.replace(sandbox_node(sandbox), efs_access_point_id=ap)
    upload_node_objects(sandbox, p)
    r = sandbox.run(node_script(render_node(p)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert sandbox.calls("mount") == [
        ["mount", "-t", "efs", "-o", f"tls,iam,accesspoint={ap}", f"{EFS_ID}:/", p.efs_mount]
    ]
    with pytest.raises(RenderError, match="efs_access_point_id"):
        dataclasses.replace(p, efs_access_point_id="fsap-nothex!")


def test_node_agent_exit_status_is_kept(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    r = sandbox.run(node_script(render_node(p)), STUB_AGENT_RC="3")
    assert r.returncode == 3
    assert "the node agent exited with status 3" in sandbox.boot_log()
    assert sandbox.calls()[-1] == ["shutdown", "-h", "now"]


def test_node_bundle_download_fails(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p, bundle=False)
    r = sandbox.run(node_script(render_node(p)))
    assert r.returncode != 0
    log = sandbox.boot_log()
    assert f"gridfleet: node bootstrap failed at fetch-bundle: cannot download s3://{p.bucket}/{p.bundle_key}" in log
    assert "cannot report the failure to the hub" in log  # no gridfleet installed yet
    assert sandbox.calls("gridfleet") == [] and sandbox.calls("mount") == []
    assert sandbox.calls()[-1] == ["shutdown", "-h", "now"]
    assert sandbox.console.read_text() == log


def test_node_mount_never_succeeds(sandbox):
    p = sandbox_node(sandbox, boot_timeout_s=3)
    upload_node_objects(sandbox, p)
    started = time.monotonic()
    r = sandbox.run(node_script(render_node(p)), STUB_MOUNT_FAILS="1000000", STUB_SLEEP_REAL="0.3")
    assert time.monotonic() - started < 8
    assert r.returncode != 0
    assert re.search(
        r"gridfleet: node bootstrap failed at mount-efs: fs-0123456789abcdef0 is not mounted at "
        r"\S+/efs after 3 s \(\d+ attempts\)",
        sandbox.boot_log(),
    )
    assert len(sandbox.calls("mount")) >= 2
    gf = sandbox.calls("gridfleet")
    assert [c[1:3] for c in gf] == [["validate", "--config"], ["node", "report-failure"]]
    assert gf[1][gf[1].index("--message") + 1].startswith("mount-efs: ")
    calls = sandbox.calls()
    assert calls[-1] == ["shutdown", "-h", "now"] and calls.count(["shutdown", "-h", "now"]) == 1


def test_node_failure_after_install_is_reported(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    r = sandbox.run(node_script(render_node(p)), STUB_VALIDATE_RC="2")
    assert r.returncode != 0
    cfg = f"{sandbox.etc}/fleet.yaml"
    message = f"check-config: {cfg} does not pass gridfleet validate"
    assert f"gridfleet: node bootstrap failed at {message}" in sandbox.boot_log()
    assert sandbox.calls("gridfleet")[-1] == [
        "gridfleet",
        "node",
        "report-failure",
        "--config",
        cfg,
        "--run-id",
        p.run_id,
        "--instance-id",
        INSTANCE_ID,
        "--message",
        message,
    ]
    assert sandbox.calls("mount") == []
    assert sandbox.calls()[-1] == ["shutdown", "-h", "now"]


def test_node_unexpected_failure_is_caught_by_the_trap(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    sandbox.stub("mktemp", "exit 1\n")  # a command without a failure message of its own
    sandbox.run(node_script(render_node(p)))
    log = sandbox.boot_log()
    assert "gridfleet: node bootstrap failed at fetch-bundle: exit status 1 from: WORK_DIR=$(mktemp -d)" in log
    assert sandbox.calls()[-1] == ["shutdown", "-h", "now"]


def test_node_efs_utils_from_the_bundle_folder(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    sandbox.put("bundle/amazon-efs-utils.deb", b"deb")
    (sandbox.bin / "mount.efs").unlink()
    r = sandbox.run(node_script(render_node(p)))
    assert r.returncode == 0, r.stdout + r.stderr
    apts = sandbox.calls("apt-get")
    assert apts[-2][-1] == "amazon-efs-utils"
    assert apts[-1][-1].endswith("/amazon-efs-utils.deb")
    assert sandbox.calls("aws")[-1][-2] == f"s3://{p.bucket}/bundle/amazon-efs-utils.deb"
    assert sandbox.calls("gridfleet")[-1] == agent_argv(sandbox, p)


def test_node_without_efs_utils_fails_clearly(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    (sandbox.bin / "mount.efs").unlink()
    sandbox.run(node_script(render_node(p)))
    assert (
        "gridfleet: node bootstrap failed at install-efs-utils: amazon-efs-utils is not available: bake it "
        "into the AMI or upload amazon-efs-utils.deb beside the bundle"
    ) in sandbox.boot_log()
    assert sandbox.calls("gridfleet")[-1][1:3] == ["node", "report-failure"]
    assert sandbox.calls()[-1] == ["shutdown", "-h", "now"]


def test_node_crawl_user_of_the_config(sandbox):
    p = sandbox_node(sandbox, crawl_user="crawler_1", crawl_uid=4321)
    upload_node_objects(sandbox, p)
    r = sandbox.run(node_script(render_node(p)), STUB_IDS="4321:4321")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sandbox.calls("useradd")[0][-1] == "crawler_1" and "4321" in sandbox.calls("useradd")[0]
    assert sandbox.calls("setpriv")[-1][:5] == [
        "setpriv",
        "--reuid=4321",
        "--regid=4321",
        "--init-groups",
        "--no-new-privs",
    ]
    env = files_of(render_node(p))[render_mod.NODE_ENV_FILE]["content"]
    assert "GRIDFLEET_CRAWL_USER=crawler_1\n" in env and "GRIDFLEET_CRAWL_UID=4321\n" in env


def test_node_keeps_an_existing_crawl_user_of_the_right_uid(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    r = sandbox.run(node_script(render_node(p)), STUB_PASSWD="gridfleet:x:2000:2000::/x:/usr/sbin/nologin")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sandbox.calls("useradd") == [] and sandbox.calls("groupadd") == []
    assert sandbox.calls("gridfleet")[-1] == agent_argv(sandbox, p)


def test_node_refuses_a_crawl_user_of_another_uid(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    r = sandbox.run(
        node_script(render_node(p)), STUB_PASSWD="gridfleet:x:1000:1000::/home/g:/bin/bash", STUB_IDS="1000:1000"
    )
    assert r.returncode != 0
    assert "node bootstrap failed at crawl-user: user gridfleet is not uid and gid 2000" in sandbox.boot_log()
    assert sandbox.calls("useradd") == [] and sandbox.calls("mount") == [] and sandbox.calls("setpriv") == []
    assert sandbox.calls("gridfleet")[-1][1:3] == ["node", "report-failure"]  # as root: never through setpriv
    assert sandbox.calls()[-1] == ["shutdown", "-h", "now"]


def test_node_fails_when_the_crawl_user_cannot_write_on_efs(sandbox):
    p = sandbox_node(sandbox)
    upload_node_objects(sandbox, p)
    r = sandbox.run(node_script(render_node(p)), STUB_CANNOT_WRITE="1")
    assert r.returncode != 0
    assert (
        f"node bootstrap failed at prepare-dirs: gridfleet cannot write to {p.efs_mount}/profiles and locks "
        f"(access point user not uid 2000?)"
    ) in sandbox.boot_log()
    assert [c[1:3] for c in sandbox.calls("gridfleet")] == [["validate", "--config"], ["node", "report-failure"]]
    assert sandbox.calls()[-1] == ["shutdown", "-h", "now"]


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
    script = node_script(render_node(p))
    subprocess.run(["cp", "-a", "/etc", str(open_dir / "etc")], check=True, timeout=60)
    agent = open_dir / "agent"
    agent.write_text(
        '#!/bin/sh\nid -u; id -g; id -G; echo "$HOME"; grep NoNewPrivs /proc/self/status\ntouch "$1/agent-wrote"\n'
    )
    agent.chmod(0o755)
    steps = open_dir / "steps.sh"
    steps.write_text(
        "\n".join(
            [
                "set -Eeuo pipefail",
                parameter_block(script),
                'log() { printf "log: %s\\n" "$*"; }',
                'fail() { printf "failed: %s\\n" "$*"; exit 1; }',
                shell_function(script, "ensure_crawl_user"),
                shell_function(script, "as_crawl_user"),
                "ensure_crawl_user",
                "ensure_crawl_user",  # found the second time, not made again
                'getent passwd "$CRAWL_USER"',
                f'as_crawl_user {agent} "$STATE_DIR"',
                "",
            ]
        )
    )
    r = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            BASH,
            "-c",
            'mount --bind "$1" /etc && exec "$0" "$2"',
            BASH,
            str(open_dir / "etc"),
            str(steps),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines == [
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


def sandbox_hub(sb: Sandbox, **kw) -> HubUserData:
    p = hub_params(install_dir=f"{sb.root}/opt/gridfleet", state_dir=f"{sb.root}/state", bucket=sb.bucket, **kw)
    make_bundle(sb.put(p.bundle_key))
    sb.put(p.hub_config_key, b"sites: []\n")
    return p


def test_hub_happy_path(sandbox):
    p = sandbox_hub(sandbox)
    r = sandbox.run(hub_script(render_hub(p)), STUB_TAG_RUN_ID="2026-11-20")
    assert r.returncode == 0, r.stdout + r.stderr
    assert_imds_v2(sandbox, ["instance-id", "local-ipv4", "tags/instance/gridfleet:run_id"])
    wait_for(lambda: sandbox.calls("java"))  # the Grid hub runs under nohup ... &: its stub may log after the script
    assert sandbox.calls("java") == [
        [
            "java",
            "-jar",
            f"{p.install_dir}/selenium-server.jar",
            "hub",
            "--host",
            LOCAL_IP,
            "--port",
            "4444",
            "--publish-events",
            f"tcp://{LOCAL_IP}:4442",
            "--subscribe-events",
            f"tcp://{LOCAL_IP}:4443",
        ]
    ]
    assert url_of(sandbox.calls("curl")[-1]) == f"http://{LOCAL_IP}:4444/status"
    run = ["gridfleet", "run", "--config", f"{sandbox.etc}/fleet.yaml", "--run-id", "2026-11-20", "--resume"]
    assert sandbox.calls("gridfleet") == [run]
    calls = [c for c in sandbox.calls() if c[0] != "java"]  # the background Grid hub logs whenever it gets to
    assert calls[-2:] == [run, ["shutdown", "-h", "now"]]
    assert "gridfleet run exited with status 0" in sandbox.boot_log()
    assert (Path(p.state_dir)).is_dir()


def test_hub_run_id_defaults_to_today_and_self_stop_none(sandbox):
    p = sandbox_hub(sandbox, self_stop="none")
    before = dt.datetime.now(dt.UTC).date().isoformat()
    r = sandbox.run(hub_script(render_hub(p)), STUB_RUN_RC="3")
    after = dt.datetime.now(dt.UTC).date().isoformat()
    assert r.returncode == 3
    run = sandbox.calls("gridfleet")[0]
    assert run[run.index("--run-id") + 1] in {before, after}
    assert sandbox.calls("shutdown") == []
    assert "self_stop=none: leaving the instance running" in sandbox.boot_log()


def test_hub_rejects_a_bad_run_id_tag(sandbox):
    p = sandbox_hub(sandbox)
    sandbox.run(hub_script(render_hub(p)), STUB_TAG_RUN_ID="bad id;")
    assert "gridfleet: hub bootstrap failed at run-id: " in sandbox.boot_log()
    assert sandbox.calls("gridfleet") == []
    assert sandbox.calls()[-1] == ["shutdown", "-h", "now"]


def test_hub_failure_stops_the_instance(sandbox):
    p = sandbox_hub(sandbox, self_stop="terminate")
    (sandbox.s3 / sandbox.bucket / p.hub_config_key).unlink()
    r = sandbox.run(hub_script(render_hub(p)))
    assert r.returncode != 0
    log = sandbox.boot_log()
    assert f"gridfleet: hub bootstrap failed at fetch-config: cannot download s3://{p.bucket}/{p.hub_config_key}" in log
    assert sandbox.calls("gridfleet") == [] and sandbox.calls("java") == []
    assert sandbox.calls()[-1] == ["shutdown", "-h", "now"]


def test_hub_grid_that_dies_fails_the_bootstrap(sandbox):
    p = sandbox_hub(sandbox)
    sandbox.run(hub_script(render_hub(p)), STUB_GRID_DOWN="1")
    assert "gridfleet: hub bootstrap failed at wait-grid: the Grid hub exited" in sandbox.boot_log()
    assert sandbox.calls("gridfleet") == []
    assert sandbox.calls()[-1] == ["shutdown", "-h", "now"]


def test_production_paths_are_the_defaults():
    script = node_script(render_node(node_params()))
    for default in (
        "${GRIDFLEET_BOOT_LOG:-/var/log/gridfleet-boot.log}",
        "${GRIDFLEET_CONSOLE:-/dev/console}",
        "${GRIDFLEET_ETC_DIR:-/etc/gridfleet}",
    ):
        assert default in script
    assert 'exec > >(tee -a "$LOG_FILE" "$CONSOLE") 2>&1' in script
    assert os.path.basename(render_mod.NODE_BOOT_SCRIPT) == "gridfleet-node-boot"
