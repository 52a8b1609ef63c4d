"""The code bundle hub and nodes install at boot, and the Lambdas' package.

`gridfleet-bundle.tar.gz` holds `wheels/` (gridfleet and every dependency, pinned
by constraints.txt, so instances install with `pip --no-index`),
`selenium-server.jar` and `deps.txt` (the file names of the dependencies' wheels,
sorted: the pinned dependency set, whose hash a baked node image records).
`gridfleet-lambda.zip` holds the project's packages and the pure-Python
dependencies the handlers import, built for the Lambda runtime (Linux x86_64,
CPython 3.11); boto3 comes with the runtime.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from cli.crawler_ship import CrawlerShipment, build_wheels
from fleet.errors import GridfleetError

PACKAGES = ("fleet", "hub", "node", "lambdas", "cli", "embedded", "cloud_init", "profiles")
LAMBDA_PACKAGES = ("fleet", "hub", "lambdas", "cloud_init")
LAMBDA_DEPS = ("pydantic", "pyyaml", "jinja2")


def _pip(args: list[str]) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-5:])
        raise GridfleetError(f"pip failed ({' '.join(args[:2])}): {tail}")


def dependency_set(wheels: Path) -> str:
    """deps.txt: the wheel file names of gridfleet's dependencies in `wheels`, one a line, sorted."""
    names = sorted(p.name for p in wheels.glob("*.whl") if not p.name.startswith("gridfleet-"))
    return "".join(f"{n}\n" for n in names)


def build_bundle(
    project: Path, out_dir: Path, jar: Path, *, deps: bool = True, crawlers: CrawlerShipment | None = None
) -> Path:
    """The bundle: gridfleet's wheels and the jar; with a crawler project, its wheels too, `crawlers.txt` (what
    the instances install from them, one per line) and `crawlers.json` (its name, version and content hash)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "gridfleet-bundle.tar.gz"
    with tempfile.TemporaryDirectory() as tmp:
        wheels = Path(tmp) / "wheels"
        pins = ["-c", str(project / "constraints.txt")] if deps else ["--no-deps"]
        _pip(["wheel", "-q", *pins, "--wheel-dir", str(wheels), str(project)])
        deps_txt = Path(tmp) / "deps.txt"
        deps_txt.write_text(dependency_set(wheels))
        extra: list[tuple[Path, str]] = [(deps_txt, "deps.txt")]
        if crawlers is not None:
            names = build_wheels(crawlers.project, crawlers.requirements, wheels)
            listing, manifest = Path(tmp) / "crawlers.txt", Path(tmp) / "crawlers.json"
            listing.write_text("".join(f"{n}\n" for n in names))
            manifest.write_text(json.dumps(crawlers.project.build.as_dict(), indent=1) + "\n")
            extra += [(listing, "crawlers.txt"), (manifest, "crawlers.json")]
        with tarfile.open(out, "w:gz") as tar:
            tar.add(wheels, arcname="wheels")
            tar.add(jar, arcname="selenium-server.jar")
            for path, name in extra:
                tar.add(path, arcname=name)
    return out


def build_lambda_zip(project: Path, out_dir: Path, *, deps: bool = True) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "gridfleet-lambda.zip"
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "lambda"
        if deps:
            _pip(
                [
                    "install",
                    "-q",
                    "--target",
                    str(target),
                    "--platform",
                    "manylinux2014_x86_64",
                    "--implementation",
                    "cp",
                    "--python-version",
                    "3.11",
                    "--only-binary=:all:",
                    "-c",
                    str(project / "constraints.txt"),
                    *LAMBDA_DEPS,
                ]
            )
        for pkg in LAMBDA_PACKAGES:
            shutil.copytree(project / pkg, target / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for path in sorted(target.rglob("*")):
                if path.is_file():
                    z.write(path, path.relative_to(target).as_posix())
    return out
