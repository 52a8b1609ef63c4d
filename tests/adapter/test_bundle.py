"""The code bundle installs offline, as the boot scripts install it, and the Lambda package holds the handlers."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile

from cli.bundle import build_bundle, build_lambda_zip
from cli.local_env import PROJECT_ROOT


def test_the_bundle_installs_with_no_index_and_runs(tmp_path):
    jar = tmp_path / "selenium-server-4.48.0.jar"
    jar.write_bytes(b"PK fake jar")
    bundle = build_bundle(PROJECT_ROOT, tmp_path / "dist", jar)
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "opt", filter="data")
    assert "selenium-server.jar" in names
    wheels = [n for n in names if n.startswith("wheels/") and n.endswith(".whl")]
    assert any(n.startswith("wheels/gridfleet-") for n in wheels)
    assert not any("moto" in n for n in wheels)  # the embedded default's moto is not shipped to instances
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
    assert not any("__pycache__" in n for n in names)


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
