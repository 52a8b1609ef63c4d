"""The code bundle hub and nodes install at boot, and the Lambdas' package.

`gridfleet-bundle.tar.gz` holds `wheels/` (gridfleet and every dependency, pinned by constraints.txt, so instances
install with `pip --no-index`), `selenium-server.jar`, `deps.txt` (the file names of the dependencies' wheels,
sorted: the pinned dependency set, whose hash a baked node image records) and `platform.json` (the platform the
wheels are for, which the boot scripts compare with the instance's). The bundle is built for the instances'
platform (`fleet.platform`), whatever machine builds it: gridfleet's wheel and the crawler project's are pure
Python and built here; every dependency is fetched as the wheel for the instances' machine and Python.
`gridfleet-lambda.zip` holds the project's packages and the pure-Python dependencies the handlers import, built
for the Lambda runtime (Linux x86_64, CPython 3.11); boto3 comes with the runtime.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from cli.packaging.crawler_ship import CrawlerShipment, build_wheel
from cli.packaging.requirements import pinned
from fleet.errors import GridfleetError, UsageError
from fleet.platform import PLATFORM_FILE, BundlePlatform

#: What the Lambdas import of the project, as the import contracts allow them: the kernel, the handlers, the
#: user-data templates.
LAMBDA_PACKAGES = ("fleet", "lambdas", "cloud_init")
LAMBDA_DEPS = ("pydantic", "pyyaml", "jinja2")


def _run_pip(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def _tail(p: subprocess.CompletedProcess[str], lines: int = 5) -> str:
    return "\n".join((p.stderr or p.stdout).strip().splitlines()[-lines:])


def _pip(args: list[str]) -> subprocess.CompletedProcess[str]:
    p = _run_pip(args)
    if p.returncode != 0:
        raise GridfleetError(f"pip failed ({' '.join(args[:2])}): {_tail(p)}")
    return p


def _own_wheel(project: Path, into: Path) -> None:
    """gridfleet's wheel, built from the checkout at `project` into `into`. pip builds it in the checkout itself
    (setuptools' build/ and egg-info), so two builds of one checkout at once break each other: one at a time,
    held by an flock of the checkout's own (released however the build ends)."""
    name = hashlib.sha256(str(project.resolve()).encode()).hexdigest()[:16]
    lock = Path(tempfile.gettempdir()) / f"gridfleet-wheel-{name}.lock"
    fd = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _pip(["wheel", "-q", "--no-deps", "--wheel-dir", str(into), str(project)])
    finally:
        os.close(fd)


def dependency_set(wheels: Path) -> str:
    """deps.txt: the wheel file names of gridfleet's dependencies in `wheels`, one a line, sorted."""
    names = sorted(p.name for p in wheels.glob("*.whl") if not p.name.startswith("gridfleet-"))
    return "".join(f"{n}\n" for n in names)


def is_pure(wheel_name: str) -> bool:
    """Whether a wheel (by its file name's tags) is pure Python, so that it installs on any platform."""
    parts = wheel_name.removesuffix(".whl").split("-")
    return len(parts) >= 5 and parts[-2] == "none" and parts[-1] == "any"


@dataclass(frozen=True)
class Pin:
    """One dependency at its exact version, and whether the wheel pip chose for it here is pure Python (then it
    is the target's as well, and cannot be what lacks a wheel for it)."""

    requirement: str  # name==version
    portable: bool = False


def _download(requirements: Sequence[str], target: BundlePlatform, into: Path, *more: str) -> str | None:
    """`pip download` of wheels for `target`; None when it worked, else the end of what pip said."""
    p = _run_pip(["download", "-q", "--dest", str(into), *target.pip_args(), *more, *requirements])
    return None if p.returncode == 0 else _tail(p)


def fetch_dependencies(wheel: Path, constraints: Path, target: BundlePlatform, into: Path) -> None:
    """`wheel` and the wheels for `target` of everything it needs, at the versions `constraints` pins, into `into`."""
    if not (into / wheel.name).exists():
        shutil.copy2(wheel, into / wheel.name)  # pip copies it too, but only when all goes well
    if _download([str(wheel)], target, into, "--constraint", str(constraints)) is None:
        return
    # Some dependency has no wheel for the target (or the index failed): pip tells which only in prose, so the
    # set is resolved here, where every dependency can be had, and fetched pin by pin where it has to be.
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        _pip(
            ["install", "-q", "--dry-run", "--ignore-installed", "--report", str(report)]
            + ["--constraint", str(constraints), str(wheel)]
        )
        chosen = json.loads(report.read_text())["install"]
    pins = [
        Pin(f"{c['metadata']['name']}=={c['metadata']['version']}", is_pure(_file_name(c["download_info"]["url"])))
        for c in chosen
        if not c.get("is_direct")
    ]
    fetch_pinned(pins, target, into)


def _file_name(url: str) -> str:
    return unquote(urlsplit(url).path.rsplit("/", 1)[-1])


def fetch_pinned(pins: Sequence[Pin], target: BundlePlatform, into: Path) -> None:
    """A wheel for `target` of each pin into `into`, their dependencies not followed.

    A pin with no wheel for the target gets the wheel pip builds from its source here, if that is pure Python
    (it then runs anywhere); otherwise the build stops, naming the pin and the target.
    """
    if not pins or _download([p.requirement for p in pins], target, into, "--no-deps") is None:
        return
    # pip names the pin that has no wheel only in prose: each that may lack one is asked for alone
    lacking = [p.requirement for p in pins if not p.portable and _download([p.requirement], target, into, "--no-deps")]
    for requirement in lacking:
        _build_pure(requirement, target, into)
    rest = [p.requirement for p in pins if p.requirement not in lacking]
    failure = _download(rest, target, into, "--no-deps") if rest else None
    if failure is not None:
        raise GridfleetError(f"pip could not download the wheels for {target.describe()}: {failure}")


def _build_pure(requirement: str, target: BundlePlatform, into: Path) -> None:
    """The wheel of `requirement` built from its source here, into `into` if it is pure Python."""
    name = requirement.split("==", 1)[0]
    no_wheel = f"{requirement} has no wheel for {target.describe()}"
    with tempfile.TemporaryDirectory() as tmp:
        p = _run_pip(["wheel", "-q", "--no-deps", "--no-binary", name, "--wheel-dir", tmp, requirement])
        if p.returncode != 0:
            last = _tail(p, 1).removeprefix("ERROR: ")
            raise UsageError(f"{no_wheel}, and pip cannot build one from its source here ({last})")
        (wheel,) = Path(tmp).glob("*.whl")
        if not is_pure(wheel.name):
            raise UsageError(
                f"{no_wheel}, and its source builds a wheel for this machine only ({wheel.name}): "
                "pin a version that publishes wheels for the instances' platform"
            )
        shutil.move(wheel, into / wheel.name)


def _pure_here(wheel: Path, what: str, target: BundlePlatform) -> Path:
    """A wheel built on this machine goes into the bundle only if it is pure Python, so that it fits `target`."""
    if not is_pure(wheel.name):
        raise UsageError(
            f"{what} builds a wheel for this machine only ({wheel.name}), not for {target.describe()}: "
            "the bundle takes only pure-Python code built here"
        )
    return wheel


def _crawler_files(
    crawlers: CrawlerShipment, target: BundlePlatform, wheels: Path, tmp: Path
) -> list[tuple[Path, str]]:
    """The crawler project's wheel, its pinned requirements' wheels, `crawlers.txt` (what the instances install
    from them, one per line) and `crawlers.json` (its name, version and content hash)."""
    project = crawlers.project
    _pure_here(build_wheel(project, wheels), f"the crawler project {project.build.name}", target)
    pins = pinned(crawlers.requirements)
    fetch_pinned([Pin(p) for p in pins], target, wheels)
    listing, manifest = tmp / "crawlers.txt", tmp / "crawlers.json"
    listing.write_text("".join(f"{n}\n" for n in [project.build.name, *pins]))
    manifest.write_text(json.dumps(project.build.as_dict(), indent=1) + "\n")
    return [(listing, "crawlers.txt"), (manifest, "crawlers.json")]


def build_bundle(
    project: Path,
    out_dir: Path,
    jar: Path,
    *,
    target: BundlePlatform,
    deps: bool = True,
    crawlers: CrawlerShipment | None = None,
) -> Path:
    """The bundle for `target`: gridfleet's wheels, the jar, deps.txt and platform.json; with a crawler project,
    its wheels too, `crawlers.txt` and `crawlers.json`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "gridfleet-bundle.tar.gz"
    with tempfile.TemporaryDirectory() as tmp:
        wheels = Path(tmp) / "wheels"
        own = Path(tmp) / "own"
        _own_wheel(project, own)
        (wheel,) = own.glob("gridfleet-*.whl")
        wheels.mkdir()
        _pure_here(Path(shutil.copy2(wheel, wheels / wheel.name)), "gridfleet", target)
        if deps:
            fetch_dependencies(wheel, project / "constraints.txt", target, wheels)
        deps_txt, platform = Path(tmp) / "deps.txt", Path(tmp) / PLATFORM_FILE
        deps_txt.write_text(dependency_set(wheels))
        platform.write_text(target.to_json() + "\n")
        extra: list[tuple[Path, str]] = [(deps_txt, "deps.txt"), (platform, PLATFORM_FILE)]
        if crawlers is not None:
            extra += _crawler_files(crawlers, target, wheels, Path(tmp))
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
