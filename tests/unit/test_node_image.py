"""The baked node image: infra/packer's template and bake script, and a node's boot on a baked image.

The bake script is rendered from the boot script's own parts, so the image holds what a stock node's boot
installs; it runs here in the boot scripts' sandbox of stub commands (tests/unit/test_cloud_init.py), and the
node boot script then runs on what it left: the marker's dependency hash decides whether the image's venv is
used (gridfleet alone installed into it, without its dependencies) or a new one is made as on a stock image.
No `packer` binary is here: the template is parsed with python-hcl2 and its settings checked.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import hcl2
import pytest

from cloud_init import NodeUserData, boot_script, render_bake, render_node
from tests.helpers.boot_sandbox import BASH, Sandbox
from tests.unit.test_boot_scripts import APT_PACKAGES, put_grid_secret, sandbox_node
from tests.unit.test_cloud_init import needs_shellcheck, node_params

ROOT = Path(__file__).resolve().parents[2]
PACKER = ROOT / "infra" / "packer"
DEPS = "pydantic-2.0-py3-none-any.whl\nPyYAML-6.0-cp311-cp311-manylinux_2_17_x86_64.whl\n"


def bundle_bytes(deps: str | None = DEPS) -> bytes:
    """A bundle as `gridfleet bundle` makes it: wheels/, the jar, and deps.txt (its pinned dependency set)."""
    out = io.BytesIO()
    platform = json.dumps({"format": 1, "machine": "x86_64", "python": "{}.{}".format(*sys.version_info[:2])})
    files = [("wheels/gridfleet-0.1.0-py3-none-any.whl", b"wheel"), ("selenium-server.jar", b"jar")]
    files.append(("platform.json", platform.encode()))
    if deps is not None:
        files.append(("deps.txt", deps.encode()))
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.fixture
def sandbox(tmp_path_factory) -> Sandbox:
    sb = Sandbox(tmp_path_factory.mktemp("image"))
    for tool in ("sha256sum", "grep"):
        (sb.real / tool).symlink_to(shutil.which(tool))
    # python3: a venv as the boot scripts' stub makes one; anything else (the bake's marker) is the real python3
    real_python = sys.executable
    sb.stub(
        "python3",
        f'[[ $1 == -m && $2 == venv ]] || exec {real_python} "$@"\nmkdir -p "${{*: -1}}/bin"\n'
        'cp "$SANDBOX/pip.stub" "${*: -1}/bin/pip"\n',
    )
    return sb


def bake(sb: Sandbox, install_dir: Path, state_dir: Path, bundle: bytes, **env: str) -> subprocess.CompletedProcess:
    path, deb = sb.root / "bundle.tar.gz", sb.root / "amazon-efs-utils.deb"
    path.write_bytes(bundle)
    deb.write_text("Package: amazon-efs-utils\n")
    script = render_bake(install_dir=str(install_dir), state_dir=str(state_dir))
    (sb.root / "bake.sh").write_text(script)
    return subprocess.run(
        [BASH, str(sb.root / "bake.sh"), str(path), str(deb)],
        env={**sb.env, "GRIDFLEET_REGION": "ap-northeast-2", **env},
        cwd=sb.root,
        capture_output=True,
        text=True,
        timeout=60,
    )


# --- one source -----------------------------------------------------------------------------------------------
def functions(script: str) -> dict[str, str]:
    """Each top-level shell function of a script, by name, with its body."""
    return {m.group(1): m.group(0) for m in re.finditer(r"(?ms)^([a-z_0-9]+)\(\) \{\n.*?^\}\n", script)}


def test_the_bake_script_is_the_rendered_one_and_shares_the_boot_scripts_install_steps():
    assert (PACKER / "bake.sh").read_text() == render_bake(), "infra/packer/bake.sh: python -m cloud_init bake"
    boot = boot_script(render_node(node_params()))
    bake_fns, boot_fns = functions(render_bake()), functions(boot)
    shared = (
        "installed",
        "install_ssm_agent",
        "install_missing",
        "apt_get",
        "apt_update_once",
        "bounded",
        "install_efs_utils",
        "ensure_crawl_user",
        "make_venv",
        "pip_wheels",
        "sha256_of",
    )
    for name in shared:
        assert bake_fns[name] == boot_fns[name], name
    packages = re.search(r"^APT_PACKAGES=\((.*)\)$", render_bake(), re.M)
    assert packages and f"APT_PACKAGES=({packages.group(1)})" in boot


@needs_shellcheck
def test_shellcheck_finds_nothing_in_the_bake_script():
    r = subprocess.run(["shellcheck", "-s", "bash", str(PACKER / "bake.sh")], capture_output=True, text=True)
    assert r.returncode == 0 and not r.stdout, r.stdout + r.stderr


# --- the Packer template -------------------------------------------------------------------------------------
def unq(value):
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    if isinstance(value, dict):
        return {unq(k): unq(v) for k, v in value.items() if not k.startswith("__")}
    if isinstance(value, list):
        return [unq(v) for v in value]
    return value


@pytest.fixture(scope="module")
def packer():
    with (PACKER / "node.pkr.hcl").open() as f:
        return unq(hcl2.load(f))


def test_the_packer_template_builds_an_encrypted_imdsv2_image_from_the_stacks_debian(packer):
    variables = {name: body for block in packer["variable"] for name, body in block.items()}
    with (ROOT / "infra" / "terraform" / "variables.tf").open() as f:
        tf = {name: body for block in unq(hcl2.load(f))["variable"] for name, body in block.items()}
    # the default resolves to the stack's Debian 12 of the chosen arch (tests/infra/test_packer.py evaluates it)
    assert variables["ami_parameter"]["default"] == "" and variables["arch"]["default"] == "amd64"
    assert tf["ami_parameter"]["default"].endswith("/debian/release/12/latest/amd64")
    assert variables["crawl_uid"]["default"] == tf["crawl_uid"]["default"] == NodeUserData.crawl_uid
    assert "default" not in variables["bundle"]  # the bundle whose pinned dependencies are baked: always given
    [data] = [b["amazon-parameterstore"]["base"] for b in packer["data"] if "amazon-parameterstore" in b]
    assert "var.ami_parameter" in data["name"] and "${var.arch}" in data["name"]
    [source] = [b["amazon-ebs"]["node"] for b in packer["source"] if "amazon-ebs" in b]
    assert source["source_ami"] == "${data.amazon-parameterstore.base.value}"
    assert source["imds_support"] == "v2.0"  # instances of the image default to IMDSv2
    [md] = source["metadata_options"]
    assert md["http_tokens"] == "required" and md["http_endpoint"] == "enabled"
    assert source["encrypt_boot"] is True
    [disk] = source["launch_block_device_mappings"]
    assert disk["encrypted"] is True and disk["delete_on_termination"] is True
    assert not {"access_key", "secret_key", "token", "ssh_password", "ssh_private_key_file"} & set(source)
    text = (PACKER / "node.pkr.hcl").read_text()
    assert not re.search(r"AKIA|aws_secret|password", text, re.I)


def test_the_packer_build_runs_the_bake_script_on_the_bundle_as_root(packer):
    [build] = packer["build"]
    assert build["sources"] == ["source.amazon-ebs.node"]
    files = [p["file"] for p in build["provisioner"] if "file" in p]
    assert any("${path.root}/bake.sh" in str(f["sources"]) and "var.bundle" in str(f["sources"]) for f in files)
    [run] = [p["shell"] for p in build["provisioner"] if "shell" in p and "environment_vars" in p["shell"]]
    assert run["inline"][0].startswith("bash ${local.work_dir}/bake.sh ${local.work_dir}/${basename(var.bundle)}")
    assert run["execute_command"].startswith("chmod +x {{ .Path }}; sudo -n env {{ .Vars }}")
    assert "GRIDFLEET_CRAWL_UID=${var.crawl_uid}" in run["environment_vars"]


# --- the bake, then a boot on what it left --------------------------------------------------------------------
def test_a_node_boots_on_the_baked_image_installing_only_gridfleet(sandbox):
    p = sandbox_node(sandbox)
    install, state = Path(p.install_dir), Path(p.state_dir)
    r = bake(sandbox, install, state, bundle_bytes())
    assert r.returncode == 0, r.stdout + r.stderr
    marker = json.loads((install / "image.json").read_text())
    assert marker["deps_sha256"] == hashlib.sha256(DEPS.encode()).hexdigest()
    assert marker["jar_sha256"] == hashlib.sha256(b"jar").hexdigest()
    assert marker["deps"] == DEPS.split() and (marker["crawl_user"], marker["crawl_uid"]) == ("gridfleet", 2000)
    assert {"chromium", "amazon-efs-utils", "amazon-ssm-agent"} <= set(marker["packages"])
    assert sandbox.calls("aws")[0][-2] == "s3://amazon-ssm-ap-northeast-2/latest/debian_amd64/amazon-ssm-agent.deb"
    assert [c[-1].rsplit("/", 1)[1] for c in sandbox.calls("apt-get") if c[-1].endswith(".deb")] == [
        "amazon-ssm-agent.deb",
        "amazon-efs-utils.deb",
    ]
    assert (install / "selenium-server.jar").read_bytes() == b"jar" and not (install / "wheels").exists()
    pips = [c[1:] for c in sandbox.calls("pip")]
    assert pips[0][-1] == "gridfleet" and "--no-deps" not in pips[0]  # its dependencies, from the bundle's wheels
    assert pips[1][0] == "uninstall" and pips[1][-1] == "gridfleet"  # each boot brings its own gridfleet
    assert sandbox.calls("useradd")[0][-1] == "gridfleet"

    sandbox.stub_log.unlink()
    sandbox.put(p.bundle_key, bundle_bytes())
    sandbox.put(p.config_key, b"sites: []\n")
    put_grid_secret(sandbox, p.grid_secret_parameter)
    sandbox.stub("mount.efs", "exit 0\n")
    image = " ".join([*APT_PACKAGES, "amazon-ssm-agent", "amazon-efs-utils"])  # what the bake installed
    r = sandbox.run(boot_script(render_node(p)), STUB_INSTALLED=image)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not [c for c in sandbox.calls("python3") if c[1:3] == ["-m", "venv"]]  # the image's venv is kept
    [pip] = sandbox.calls("pip")
    assert pip[pip.index("install") + 1 :][-3:] == ["--no-deps", "--force-reinstall", "gridfleet"]
    assert "baked image: its venv has the bundle's dependencies" in sandbox.boot_log()
    assert sandbox.calls("apt-get") == []  # nothing downloaded: every package is the image's
    assert sandbox.calls("systemctl")[-1] == ["systemctl", "start", "--no-block", "gridfleet-node.service"]


@pytest.mark.parametrize(
    "deps, why",
    [
        pytest.param(
            "pydantic-2.1-py3-none-any.whl\n", "baked image for other dependencies than the bundle's", id="other"
        ),
        pytest.param(None, "baked image; the bundle has no deps.txt: a new venv", id="old-bundle"),
    ],
)
def test_a_baked_image_for_other_dependencies_gets_a_new_venv_and_says_why(sandbox, deps, why):
    p = sandbox_node(sandbox)
    assert bake(sandbox, Path(p.install_dir), Path(p.state_dir), bundle_bytes()).returncode == 0
    sandbox.stub_log.unlink()
    sandbox.put(p.bundle_key, bundle_bytes(deps))
    sandbox.put(p.config_key, b"sites: []\n")
    put_grid_secret(sandbox, p.grid_secret_parameter)
    sandbox.put("bundle/amazon-efs-utils.deb", b"Package: amazon-efs-utils\n")
    r = sandbox.run(boot_script(render_node(p)))
    assert r.returncode == 0, r.stdout + r.stderr
    # today's path: a new venv, all of it
    assert [c[1:3] for c in sandbox.calls("python3") if c[1] == "-m"] == [["-m", "venv"]]
    [pip] = sandbox.calls("pip")
    assert pip[-1] == "gridfleet" and "--no-deps" not in pip
    assert why in sandbox.boot_log()


def test_a_stock_image_takes_todays_path_without_a_word_of_images(sandbox):
    p = sandbox_node(sandbox)
    sandbox.put(p.bundle_key, bundle_bytes())
    sandbox.put(p.config_key, b"sites: []\n")
    put_grid_secret(sandbox, p.grid_secret_parameter)
    sandbox.put("bundle/amazon-efs-utils.deb", b"Package: amazon-efs-utils\n")
    r = sandbox.run(boot_script(render_node(p)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert [c[1:3] for c in sandbox.calls("python3") if c[1] == "-m"] == [["-m", "venv"]]
    assert "--no-deps" not in sandbox.calls("pip")[0] and "baked image" not in sandbox.boot_log()


@pytest.mark.parametrize(
    "env, message",
    [
        ({"GRIDFLEET_CRAWL_UID": "0"}, "GRIDFLEET_CRAWL_UID '0' is not a uid from 1000 to 60000"),
        ({"GRIDFLEET_CRAWL_UID": "99999"}, "GRIDFLEET_CRAWL_UID '99999' is not a uid from 1000 to 60000"),
        ({"GRIDFLEET_CRAWL_USER": "root"}, "GRIDFLEET_CRAWL_USER 'root' is not a user name"),
    ],
)
def test_the_bake_refuses_a_bad_crawl_user_in_one_line(sandbox, env, message):
    r = bake(sandbox, sandbox.root / "opt", sandbox.root / "state", bundle_bytes(), **env)
    assert r.returncode == 1 and message in r.stdout and "Traceback" not in r.stdout + r.stderr
    assert not (sandbox.root / "opt" / "image.json").exists()


def test_the_bake_refuses_a_bundle_without_its_dependency_set(sandbox):
    r = bake(sandbox, sandbox.root / "opt", sandbox.root / "state", bundle_bytes(deps=None))
    assert r.returncode == 1 and "has no wheels/, selenium-server.jar or deps.txt" in r.stdout
    assert not (sandbox.root / "opt" / "image.json").exists()
