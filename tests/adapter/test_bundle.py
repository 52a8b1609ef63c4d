"""The code bundle installs offline, as the boot scripts install it, and the Lambda package holds the handlers."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile

from cli.bundle import build_bundle, build_lambda_zip
from cli.crawler_ship import installed_config, shipment_of
from cli.local_env import PROJECT_ROOT
from fleet.config_load import dump_config, load_config
from tests.helpers.crawler_project import CRAWLER, make_project


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
    bundle = build_bundle(PROJECT_ROOT, tmp_path / "dist", jar, crawlers=crawlers)
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "opt", filter="data")
    assert "selenium-server.jar" in names
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
