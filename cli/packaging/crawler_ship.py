"""The crawler project, made importable where the crawlers run.

On the embedded default it is installed once per content hash into a directory of the local stack
(`<home>/local/crawlers/<hash>/`), which the local nodes get on their `PYTHONPATH` beside its pinned requirements
(installed once per hash of the pins, `<home>/local/requirements/<hash>/`: cli.packaging.requirements): a changed
project is a new hash, so the next run picks up the new version and a run in progress keeps the one it started
with. For AWS, `gridfleet bundle` builds its wheel into the bundle beside the wheels of its pinned requirements
(fetched for the instances' platform), and the instances install it beside gridfleet with `pip --no-index`.

What the project needs beyond gridfleet's own dependencies must be pinned in `crawlers.requirements`; anything
its metadata requires that neither gridfleet's environment nor those requirements provide is refused here, before
a node could fail on it.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cli.packaging.requirements import dists_in, pip, refuse_unmet, unmet
from fleet.config import Config
from fleet.config.crawlers import InstalledCrawlers
from fleet.crawl.project import CrawlerProject, ProjectError, copy_shipped
from fleet.errors import UsageError

log = logging.getLogger("gridfleet")

#: A file in the bundle naming the crawler project (name, version, hash): what the instances install.
MANIFEST = "crawlers.json"

#: The file that marks a project's install as whole (an install without it is done again, as is one made before
#: the pins were installed apart, which marked itself `.complete` and held them).
INSTALLED = ".installed"


@dataclass(frozen=True)
class CrawlerShipment:
    """A crawler project and the pinned requirements that go with it."""

    project: CrawlerProject
    requirements: str | None = None


def shipment_of(config: Config) -> CrawlerShipment | None:
    project = project_of(config)
    if project is None:
        return None
    assert config.crawlers is not None
    return CrawlerShipment(project, config.crawlers.requirements)


def project_of(config: Config) -> CrawlerProject | None:
    """The crawler project a loaded config names (its path already made absolute by the loader)."""
    section = config.crawlers
    if section is None or section.project is None:
        return None
    try:
        return CrawlerProject.at(Path(section.project))
    except ProjectError as e:
        raise UsageError(f"crawlers.project: {e}") from None


def installed_config(config: Config, project: CrawlerProject) -> Config:
    """The config the hub and nodes get: the project's identity instead of its directory."""
    installed = InstalledCrawlers(**project.build.as_dict())
    assert config.crawlers is not None
    section = config.crawlers.model_copy(update={"project": None, "requirements": None, "installed": installed})
    return config.model_copy(update={"crawlers": section})


def staged_source(project: CrawlerProject, into: Path) -> Path:
    """The project's shipped files copied into `into`, to install or build from; a plain package directory is
    wrapped in a Python project, so that it builds into a wheel like any other."""
    name = project.build.name
    if project.kind != "package":
        return _copy_checked(project, into)
    _copy_checked(project, into / name)
    (into / "pyproject.toml").write_text(
        "[build-system]\nrequires = ['setuptools>=68']\nbuild-backend = 'setuptools.build_meta'\n\n"
        f"[project]\nname = '{name}'\nversion = '{project.build.version}'\n\n"
        f"[tool.setuptools]\npackages = {{find = {{include = ['{name}', '{name}.*']}}}}\n"
    )
    return into


def _copy_checked(project: CrawlerProject, into: Path) -> Path:
    """Copy the files the project's hash covers; refuse a project whose files changed since it was read, so that
    what ships is what its recorded hash names."""
    try:
        copied = copy_shipped(project.root, into)
    except (ProjectError, OSError) as e:
        raise UsageError(f"crawler project: {e}") from None
    if copied != project.build.hash:
        raise UsageError(f"crawler project {project.root}: its files changed while it was shipped: run again")
    return into


def install_local(
    project: CrawlerProject, root: Path, requirements_site: Path | None = None, requirements: str | None = None
) -> Path:
    """The directory local nodes import the project from, installed there once per content hash; refused (one
    line, exit 2) when the project needs what neither gridfleet's environment nor the installed pins
    (`requirements_site`, cli.packaging.requirements.install, from the file `requirements`) provide. The check
    runs on every call, as the pins beside an installed project may change."""
    target = root / project.build.short
    if not (target / INSTALLED).is_file():
        _install_project(project, root, target)
    provided = dists_in(requirements_site) if requirements_site is not None else []
    refuse_unmet(unmet(dists_in(target), provided), f"crawler project {project.build.name}", requirements)
    return target


def _install_project(project: CrawlerProject, root: Path, target: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    log.info(
        "crawler project %s %s (%s): installing for the local nodes",
        project.build.name,
        project.build.version,
        project.build.short,
    )
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        staging = Path(tmp) / "site"
        if project.kind == "package":
            _copy_checked(project, staging / project.build.name)
        else:
            source = staged_source(project, Path(tmp) / "src")
            pip(["install", "-q", "--no-deps", "--target", str(staging), str(source)], "install it")
        (staging / INSTALLED).write_text(project.build.hash + "\n")
        if (target / INSTALLED).is_file():  # another run installed the same hash meanwhile: theirs is in use
            return
        if target.exists():
            shutil.rmtree(target)  # an interrupted install of the same hash
        staging.rename(target)


def build_wheel(project: CrawlerProject, wheels: Path) -> Path:
    """The project's wheel, built here into `wheels`. Its pinned requirements are fetched apart, as wheels for the
    instances' platform (cli.packaging.bundle); this one is built on this machine, so the bundle checks that it is
    pure."""
    with tempfile.TemporaryDirectory() as tmp:
        source = staged_source(project, Path(tmp) / "src")
        built = Path(tmp) / "wheel"
        pip(["wheel", "-q", "--no-deps", "--wheel-dir", str(built), str(source)], "build its wheel")
        (wheel,) = built.glob("*.whl")
        wheels.mkdir(parents=True, exist_ok=True)
        return Path(shutil.move(wheel, wheels / wheel.name))
