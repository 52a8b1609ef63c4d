"""The code bundle installs offline, as the boot scripts install it, built for the instances' platform whatever
machine builds it; the Lambda package holds the handlers.

The bundles are built for real (gridfleet's dependencies fetched with pip), once per platform for the module. The
dependencies without a wheel for the target are small projects made here, found through PIP_FIND_LINKS as sdists.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from cli.commands import aws as aws_cmd
from cli.envs.home import PROJECT_ROOT
from cli.packaging import built
from cli.packaging.bundle import Pin, build_bundle, build_lambda_zip, fetch_dependencies, fetch_pinned
from cli.packaging.crawler_ship import installed_config, shipment_of
from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.config.aws import AwsConfig
from fleet.config.bundle import platform_of
from fleet.config.load import dump_config, load_config
from fleet.errors import UsageError
from fleet.platform import PLATFORM_FILE, S3_METADATA, BundlePlatform
from tests.helpers.crawler_project import CRAWLER, make_project

GRAVITON = BundlePlatform("aarch64", "3.11")
#: A crawler requirement with wheels for every platform but the pure kind (checked per platform), and one with
#: none at all, whose pure-Python wheel the bundle builds from its source.
NATIVE_PIN, PURE_PIN = "regex==2026.11.15", "gridfleet-test-pure==1.0"


@pytest.mark.slow
def test_the_bundle_installs_with_no_index_and_runs(tmp_path):
    """With a crawler project: installed as the boot script installs it (gridfleet, then what crawlers.txt names),
    `gridfleet validate` passes on the config the hub and nodes get, which names the project by its identity."""
    jar = tmp_path / "selenium-server-4.48.0.jar"
    jar.write_bytes(b"PK fake jar")
    make_project(tmp_path / "conf" / "team", version="2.1.0")
    (tmp_path / "conf" / "fleet.yaml").write_text(
        f"crawlers: {{project: team}}\nsites:\n  - {{id: shop, start_url: 'https://a.example/', crawler: {CRAWLER}}}\n"
    )
    config = load_config(tmp_path / "conf" / "fleet.yaml")
    crawlers = shipment_of(config)
    assert crawlers is not None
    bundle = build_bundle(PROJECT_ROOT, tmp_path / "dist", jar, target=platform_of(config), crawlers=crawlers)
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "opt", filter="data")
    assert "selenium-server.jar" in names
    assert json.loads((tmp_path / "opt" / PLATFORM_FILE).read_text()) == {
        "format": 1,
        "machine": "x86_64",
        "python": "3.11",
    }
    assert (tmp_path / "opt" / "crawlers.txt").read_text() == "teamcrawlers\n"
    manifest = json.loads((tmp_path / "opt" / "crawlers.json").read_text())
    assert manifest == {"name": "teamcrawlers", "version": "2.1.0", "hash": crawlers.project.build.hash}
    wheels = [n for n in names if n.startswith("wheels/") and n.endswith(".whl")]
    assert any(n.startswith("wheels/gridfleet-") for n in wheels)
    assert not any("moto" in n for n in wheels)  # the embedded default's moto is not shipped to instances
    # deps.txt: gridfleet's pinned dependency set (what a baked image's venv holds), not gridfleet or the crawlers
    deps = (tmp_path / "opt" / "deps.txt").read_text().splitlines()
    assert deps == sorted(deps) and {f"wheels/{d}" for d in deps} <= set(wheels)
    assert any(d.startswith("pydantic-") for d in deps)
    assert not any(d.startswith(("gridfleet-", "teamcrawlers-")) for d in deps)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install = subprocess.run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(tmp_path / "opt" / "wheels"),
            "gridfleet",
        ],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr
    dists = (tmp_path / "opt" / "crawlers.txt").read_text().split()
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--find-links", str(tmp_path / "opt" / "wheels")]
    install = subprocess.run([*pip, *dists], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    given = tmp_path / "run" / "fleet.yaml"  # on the instance: no project directory, the project installed
    given.parent.mkdir()
    given.write_text(dump_config(installed_config(config, crawlers.project)))
    validate = subprocess.run(
        [str(venv / "bin" / "gridfleet"), "validate", "--config", str(given)], capture_output=True, text=True
    )
    assert validate.returncode == 0 and "teamcrawlers.shop:ShopCrawler" in validate.stdout, validate.stderr
    help_ = subprocess.run([str(venv / "bin" / "gridfleet"), "node", "--help"], capture_output=True, text=True)
    assert help_.returncode == 0 and "node agent" in help_.stdout
    probe = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import cloud_init, node.agent, lambdas.starter, lambdas.watchdog; "
            "print(len(cloud_init.render_hub.__module__))",
        ],
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr


def test_the_lambda_package_holds_the_handlers_and_the_templates(tmp_path):
    zipped = build_lambda_zip(PROJECT_ROOT, tmp_path, deps=False)
    with zipfile.ZipFile(zipped) as z:
        names = set(z.namelist())
    assert {
        "lambdas/starter.py",
        "lambdas/watchdog.py",
        "fleet/aws/table.py",
        "cloud_init/templates/node.yaml.j2",
    } <= names
    assert {n.split("/")[0] for n in names} == {"fleet", "lambdas", "cloud_init"}  # nothing the handlers never load
    assert not any("__pycache__" in n for n in names)


@pytest.mark.slow
def test_the_lambda_package_imports_where_only_boto3_is_installed(tmp_path):
    """The Lambda runtime brings boto3 and nothing else: the package must carry the rest."""
    zipped = build_lambda_zip(PROJECT_ROOT, tmp_path / "dist")
    code = tmp_path / "task"
    with zipfile.ZipFile(zipped) as z:
        z.extractall(code)
    runtime = tmp_path / "runtime"
    subprocess.run([sys.executable, "-m", "venv", str(runtime)], check=True)
    boto = subprocess.run(
        [str(runtime / "bin" / "pip"), "install", "-q", "-c", str(PROJECT_ROOT / "constraints.txt"), "boto3"],
        capture_output=True,
        text=True,
    )
    assert boto.returncode == 0, boto.stderr
    probe = subprocess.run(
        [
            str(runtime / "bin" / "python"),
            "-c",
            "import lambdas.starter as s, lambdas.watchdog as w; print(s.handler.__module__, w.handler.__module__)",
        ],
        capture_output=True,
        text=True,
        cwd=code,
        env={"PYTHONPATH": str(code), "PATH": "/usr/bin"},
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["lambdas.starter", "lambdas.watchdog"]


# --- built here for Graviton ------------------------------------------------------------------------------------
def _sdist(links: Path, name: str, *, native: bool = False, requires: tuple[str, ...] = ()) -> None:
    """An sdist of a one-module project, in `links`; `native` ones build a wheel for this machine only."""
    src = links / "src" / f"{name}-1.0"
    module = name.replace("-", "_")
    (src / module).mkdir(parents=True)
    (src / module / "__init__.py").write_text("")
    (src / "pyproject.toml").write_text(
        "[build-system]\nrequires = ['setuptools>=68']\nbuild-backend = 'setuptools.build_meta'\n"
        f"[project]\nname = '{name}'\nversion = '1.0'\ndependencies = {list(requires)}\n"
        f"[tool.setuptools]\npackages = ['{module}']\n"
    )
    if native:  # a platform wheel without a compiler: the distribution says it has extension modules
        (src / "setup.py").write_text(
            "from setuptools import setup\nfrom setuptools.dist import Distribution\n\n"
            "class Native(Distribution):\n    def has_ext_modules(self):\n        return True\n\n"
            "setup(distclass=Native)\n"
        )
    with tarfile.open(links / f"{module}-1.0.tar.gz", "w:gz") as tar:
        tar.add(src, arcname=src.name)


@pytest.fixture(scope="module")
def links(tmp_path_factory):
    """Sdists that no index has a wheel of, found by pip (and so by the bundle's build) through PIP_FIND_LINKS."""
    links = tmp_path_factory.mktemp("links")
    _sdist(links, "gridfleet-test-pure")
    _sdist(links, "gridfleet-test-native", native=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIP_FIND_LINKS", f"{os.environ.get('PIP_FIND_LINKS', '')} {links}".strip())
        yield links


@pytest.fixture(scope="module")
def graviton_bundle(tmp_path_factory, links) -> Path:
    """A bundle built on this x86_64 machine for t4g instances, with a crawler project and its requirements."""
    root = tmp_path_factory.mktemp("graviton")
    make_project(root / "conf" / "team", version="3.0.0")
    (root / "conf" / "requirements.txt").write_text(f"{NATIVE_PIN}\n{PURE_PIN}\n")
    (root / "conf" / "fleet.yaml").write_text(
        "fleet: {instance_types: [t4g.medium, m7g.large]}\n"
        "crawlers: {project: team, requirements: requirements.txt}\n"
        f"sites:\n  - {{id: shop, start_url: 'https://a.example/', crawler: {CRAWLER}}}\n"
    )
    config = load_config(root / "conf" / "fleet.yaml")
    assert platform_of(config) == GRAVITON
    jar = root / "selenium-server.jar"
    jar.write_bytes(b"PK fake jar")
    return build_bundle(PROJECT_ROOT, root / "dist", jar, target=GRAVITON, crawlers=shipment_of(config))


def _tags(wheel: str) -> tuple[str, str, list[str]]:
    """A wheel's python tag, abi tag and platform tags, from its file name."""
    *_, python, abi, platforms = wheel.removesuffix(".whl").split("-")
    return python, abi, platforms.split(".")


@pytest.mark.slow
def test_a_bundle_built_here_for_graviton_holds_aarch64_wheels_for_cpython_311(graviton_bundle, tmp_path):
    with tarfile.open(graviton_bundle) as tar:
        tar.extractall(tmp_path, filter="data")
    assert json.loads((tmp_path / PLATFORM_FILE).read_text()) == {"format": 1, "machine": "aarch64", "python": "3.11"}
    wheels = sorted(p.name for p in (tmp_path / "wheels").glob("*.whl"))
    binary = {w.split("-")[0].lower(): _tags(w) for w in wheels if not w.endswith("-none-any.whl")}
    assert {"pydantic_core", "pyyaml", "cffi", "cryptography", "regex"} <= set(binary), wheels
    for name, (python, abi, platforms) in binary.items():
        assert python in ("cp311", "cp38", "cp39") and abi in ("cp311", "abi3"), (name, python, abi)
        assert all(p.startswith("manylinux") and p.endswith("_aarch64") for p in platforms), (name, platforms)
    assert binary["pydantic_core"][:2] == binary["pyyaml"][:2] == binary["cffi"][:2] == ("cp311", "cp311")
    assert not any("x86_64" in w for w in wheels)
    # no index has a wheel of the pure requirement: the one built from its source here is in the bundle
    assert "gridfleet_test_pure-1.0-py3-none-any.whl" in wheels
    assert (tmp_path / "crawlers.txt").read_text() == f"teamcrawlers\n{NATIVE_PIN}\n{PURE_PIN}\n"
    deps = (tmp_path / "deps.txt").read_text().splitlines()
    assert deps == sorted(deps) and any(d.startswith("pydantic_core-") for d in deps)
    assert not any(d.startswith(("gridfleet", "teamcrawlers", "regex")) for d in deps)  # gridfleet's set only
    # the wheels are all an aarch64 instance needs: pip, told it is one, installs everything from them alone
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--no-index"]
        + ["--target", str(tmp_path / "target"), "--find-links", str(tmp_path / "wheels"), *GRAVITON.pip_args()]
        + ["gridfleet", "teamcrawlers"]
        + [NATIVE_PIN, PURE_PIN],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr


@pytest.mark.slow
def test_a_dependency_with_no_wheel_for_the_target_and_no_pure_source_stops_the_build_in_one_line(links, tmp_path):
    with pytest.raises(UsageError) as e:
        fetch_pinned([Pin("gridfleet-test-native==1.0")], GRAVITON, tmp_path)
    message = str(e.value)
    assert message.startswith("gridfleet-test-native==1.0 has no wheel for linux aarch64, CPython 3.11, ")
    assert "builds a wheel for this machine only (gridfleet_test_native-1.0-cp311-cp311-linux_x86_64.whl)" in message
    assert "\n" not in message and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_gridfleets_dependencies_without_a_wheel_for_the_target_are_found_and_built_pure(links, tmp_path):
    """pip's resolver says which dependency has no wheel only in prose: the set is resolved here, then fetched."""
    app = tmp_path / "gridfleet_test_app-1.0-py3-none-any.whl"
    with zipfile.ZipFile(app, "w") as z:
        info = "gridfleet_test_app-1.0.dist-info"
        z.writestr(
            f"{info}/METADATA",
            "Metadata-Version: 2.1\nName: gridfleet-test-app\nVersion: 1.0\n"
            "Requires-Dist: gridfleet-test-pure\nRequires-Dist: six\n",
        )
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(f"{PURE_PIN}\nsix==1.17.0\n")
    into = tmp_path / "wheels"
    into.mkdir()
    fetch_dependencies(app, constraints, GRAVITON, into)
    assert sorted(p.name for p in into.iterdir()) == [
        "gridfleet_test_app-1.0-py3-none-any.whl",
        "gridfleet_test_pure-1.0-py3-none-any.whl",
        "six-1.17.0-py2.py3-none-any.whl",
    ]


@pytest.mark.slow
def test_the_upload_tags_the_bundle_with_its_target(graviton_bundle, moto_endpoint, tmp_path, monkeypatch):
    """`bundle --upload` puts the target's machine and Python on the bundle object, so a reader knows its
    platform without downloading it."""
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    bucket = f"b-{os.urandom(8).hex()}"
    aws = AwsConfig(endpoint_url=moto_endpoint, region="ap-northeast-2", bucket=bucket)
    s3 = AwsClients(aws, credentials=LOCAL_CREDENTIALS).client("s3")
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": aws.region})
    config = tmp_path / "fleet.yaml"
    config.write_text(
        "fleet: {instance_types: [t4g.large]}\n"
        f"aws: {{region: {aws.region}, endpoint_url: '{moto_endpoint}', bucket: {bucket}}}\n"
        "sites: [{id: a, start_url: 'http://a.test'}]\n"
    )
    targets: list[BundlePlatform] = []

    def built(project, out_dir, jar, *, target, crawlers):  # the build of the test above, not another
        targets.append(target)
        return Path(shutil.copy(graviton_bundle, out_dir / graviton_bundle.name))

    monkeypatch.setattr(aws_cmd, "build_bundle", built)
    monkeypatch.setattr(aws_cmd, "build_lambda_zip", lambda project, out: build_lambda_zip(project, out, deps=False))
    monkeypatch.setattr(aws_cmd, "find_grid_jar", lambda candidates: tmp_path / "unused.jar")
    out = io.StringIO()
    args = argparse.Namespace(config=str(config), out=tmp_path / "dist", upload=True, efs_utils_deb=None, built=None)
    (tmp_path / "dist").mkdir()
    assert aws_cmd.cmd_bundle(args, Console(file=out, width=200)) == 0
    assert targets == [GRAVITON]
    assert "building the code bundle for linux aarch64, CPython 3.11 (the instances: t4g.large)" in out.getvalue()
    head = s3.head_object(Bucket=bucket, Key=aws.bundle_key)
    assert head["Metadata"] == dict(zip(S3_METADATA, ("aarch64", "3.11"), strict=True))
    assert head["ContentLength"] == graviton_bundle.stat().st_size
    assert s3.head_object(Bucket=bucket, Key="bundle/gridfleet-lambda.zip")["Metadata"] == {}


def _bucket(moto_endpoint: str, monkeypatch) -> tuple[AwsConfig, Any]:
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    aws = AwsConfig(endpoint_url=moto_endpoint, region="ap-northeast-2", bucket=f"b-{os.urandom(8).hex()}")
    s3 = AwsClients(aws, credentials=LOCAL_CREDENTIALS).client("s3")
    s3.create_bucket(Bucket=aws.bucket, CreateBucketConfiguration={"LocationConstraint": aws.region})
    return aws, s3


@pytest.mark.slow
def test_upload_built_sends_the_bundle_built_before_and_refuses_one_built_for_another_config(
    graviton_bundle, moto_endpoint, tmp_path, monkeypatch
):
    """`bundle --upload --built DIR`: the bytes a node image was baked from go to the bucket, nothing is built
    again; a bundle of another platform or crawler project is refused in one line, and nothing is uploaded."""
    aws, s3 = _bucket(moto_endpoint, monkeypatch)
    conf = graviton_bundle.parent.parent / "conf"  # the crawler project of the graviton bundle's config, unchanged
    section = f"aws: {{region: {aws.region}, endpoint_url: '{aws.endpoint_url}', bucket: {aws.bucket}}}\n"
    same = conf / "upload.yaml"
    same.write_text((conf / "fleet.yaml").read_text() + section)
    dist = tmp_path / "dist"
    dist.mkdir()
    shutil.copy(graviton_bundle, dist / graviton_bundle.name)
    build_lambda_zip(PROJECT_ROOT, dist, deps=False)

    def no_build(*a, **kw):
        raise AssertionError("built again")

    monkeypatch.setattr(aws_cmd, "build_bundle", no_build)
    monkeypatch.setattr(aws_cmd, "build_lambda_zip", no_build)

    def bundle(config: Path, **kw) -> tuple[int, str]:
        out = io.StringIO()
        ns = {"config": str(config), "out": tmp_path / "unused", "upload": True, "efs_utils_deb": None, "built": dist}
        args = argparse.Namespace(**{**ns, **kw})
        try:
            return aws_cmd.cmd_bundle(args, Console(file=out, width=200)), out.getvalue()
        except UsageError as e:
            return e.exit_code, str(e)

    x86 = tmp_path / "x86.yaml"
    x86.write_text(
        "fleet: {instance_types: [m7i.large]}\n" + section + "sites: [{id: a, start_url: 'http://a.test'}]\n"
    )
    arm = tmp_path / "arm.yaml"
    arm.write_text(
        "fleet: {instance_types: [t4g.large]}\n" + section + "sites: [{id: a, start_url: 'http://a.test'}]\n"
    )
    refused = [bundle(x86), bundle(arm), bundle(same, upload=False)]
    assert [code for code, _ in refused] == [2, 2, 2]
    assert refused[0][1].endswith("built for linux aarch64, CPython 3.11, the instances are linux x86_64, CPython 3.11")
    assert "holds the crawler project teamcrawlers 3.0.0 (sha256:" in refused[1][1]
    assert refused[1][1].endswith("the config ships none")
    assert refused[2][1] == "--built uploads a bundle built before: give --upload too"
    assert all("\n" not in line for _, line in refused)
    assert "Contents" not in s3.list_objects_v2(Bucket=aws.bucket)  # nothing uploaded

    code, printed = bundle(same)
    assert code == 0, printed
    assert f"uploading the bundle built in {dist}" in printed
    body = s3.get_object(Bucket=aws.bucket, Key=aws.bundle_key)
    assert body["Body"].read() == graviton_bundle.read_bytes()
    assert body["Metadata"] == dict(zip(S3_METADATA, ("aarch64", "3.11"), strict=True))
    assert s3.head_object(Bucket=aws.bucket, Key="bundle/gridfleet-lambda.zip")["ContentLength"] > 0
    hub_config = s3.get_object(Bucket=aws.bucket, Key=aws.hub_config_key)["Body"].read().decode()
    assert "teamcrawlers" in hub_config  # the installed project by name, version and hash


@pytest.mark.slow
def test_upload_built_refuses_a_bundle_of_another_gridfleet(graviton_bundle, tmp_path, monkeypatch):
    monkeypatch.setattr(built, "gridfleet_version", lambda: "9.9.9")
    dist = tmp_path / "dist"
    dist.mkdir()
    shutil.copy(graviton_bundle, dist / graviton_bundle.name)
    (dist / built.LAMBDA_ZIP).write_bytes(b"PK")
    with pytest.raises(UsageError, match=r"holds gridfleet 0\.1\.0, this is gridfleet 9\.9\.9$"):
        built.check_built(dist, GRAVITON, None)
    (dist / graviton_bundle.name).write_bytes(b"not a tar")
    with pytest.raises(UsageError, match="not a bundle"):
        built.check_built(dist, GRAVITON, None)


@pytest.mark.slow
def test_two_bundles_built_at_once_from_one_checkout_each_hold_gridfleets_wheel(tmp_path):
    """pip builds gridfleet's wheel in the checkout itself: two builds at once (two stacks deployed side by side)
    took each other's build directory and one failed. They take turns now, and both bundles come out whole."""
    from concurrent.futures import ThreadPoolExecutor

    jar = tmp_path / "selenium-server.jar"
    jar.write_bytes(b"PK fake jar")
    target = platform_of(load_config_text(tmp_path))

    def build(n: int) -> list[str]:
        out = build_bundle(PROJECT_ROOT, tmp_path / f"dist{n}", jar, target=target, deps=False)
        with tarfile.open(out) as tar:
            return [m for m in tar.getnames() if m.startswith("wheels/gridfleet-")]

    with ThreadPoolExecutor(2) as pool:
        built_ = list(pool.map(build, (1, 2)))
    assert all(len(w) == 1 for w in built_), built_


def load_config_text(tmp_path: Path):
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text("sites: [{id: a, start_url: 'http://a.test/'}]\n")
    return load_config(cfg)
