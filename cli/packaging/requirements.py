"""The crawlers' pinned requirements (`crawlers.requirements`): checked, and installed where crawlers run here.

Nothing is resolved for the crawlers: every instance installs exactly the pins (`pip --no-deps`), so what a pin
needs must be pinned too, or come with gridfleet's own environment. `unmet` names each requirement that neither
provides, with the distribution that needs it; the commands refuse such a set in one line, exit 2.

- `install` puts the pins, once per hash of the pins, into `<home>/local/requirements/<hash>/` (`pip install
  --no-deps --target`): `gridfleet crawl` puts that directory on its import path, and `run --local` on its
  nodes' `PYTHONPATH` beside the installed project. An edit of the project reuses it; a changed pin is a new hash.
- `check_up_front` asks the same question before anything is installed or started (`gridfleet validate`, and
  `run --local` before its stack starts): each pin's metadata comes from pip's resolver in a dry run
  (`pip install --dry-run --no-deps --report`), or from the install above when there is one already.

Markers are evaluated for this machine's Python; an extra's requirements are not followed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from fleet.crawl.project import CrawlerProject, ProjectError, pinned_requirements
from fleet.errors import UsageError

log = logging.getLogger("gridfleet")

#: The file that marks an install as whole: an install interrupted before it is done again.
COMPLETE = ".complete"


@dataclass(frozen=True)
class Dist:
    """A distribution as the check reads it: its name, version and `Requires-Dist` lines."""

    name: str
    version: str
    requires: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.name} {self.version}"


def pinned(requirements: str | None) -> list[str]:
    """The pinned lines of the requirements file (checked when the config loaded; read again here)."""
    if not requirements:
        return []
    try:
        return pinned_requirements(Path(requirements))
    except ProjectError as e:
        raise UsageError(str(e)) from None


#: The longest a pip run (a dry run or an install of the pins) may take: an index that stops answering ends in
#: one line, not a command that never returns.
PIP_TIMEOUT_S = 900


def pip(args: list[str], what: str) -> None:
    try:
        p = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UsageError(f"crawler project: pip could not {what}: no end after {PIP_TIMEOUT_S} s") from None
    if p.returncode != 0:
        lines = [line.strip() for line in (p.stderr or p.stdout).splitlines() if line.strip()]
        said = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR:")] or lines[-3:]
        raise UsageError(f"crawler project: pip could not {what}: {' '.join(said[-2:])}")


# --- the check --------------------------------------------------------------------------------------------
def unmet(dists: Iterable[Dist], provided: Iterable[Dist] = ()) -> list[str]:
    """Each requirement of `dists` that neither `dists`, `provided` nor gridfleet's environment satisfies, as
    `<who> needs <requirement>` (`, not <version>` when a version of it is there but does not fit)."""
    dists = list(dists)
    here = {_key(d.name): d.version for d in [*provided, *dists]}
    found: list[str] = []
    for dist in dists:
        for text in dist.requires:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            version = here.get(_key(req.name)) or _installed_version(req.name)
            if version is None:
                found.append(f"{dist} needs {req}")
            elif req.specifier and not req.specifier.contains(version, prereleases=True):
                found.append(f"{dist} needs {req}, not {version}")
    return sorted(set(found))


def refuse_unmet(found: Sequence[str], where: str, requirements: str | None) -> None:
    """One line naming what is missing and where it goes (UsageError, exit 2); nothing when nothing is."""
    if not found:
        return
    into = requirements or "a requirements file that `crawlers.requirements` names"
    raise UsageError(
        f"{where}: {'; '.join(found)}: neither gridfleet's environment nor crawlers.requirements provides "
        f"{'it' if len(found) == 1 else 'them'}: pin {'it' if len(found) == 1 else 'them'} (name==version) in {into}"
    )


def dists_in(*sites: Path) -> list[Dist]:
    """The distributions installed in the directories `sites`."""
    return [
        Dist(d.metadata["Name"], d.version, tuple(d.requires or ()))
        for d in importlib.metadata.distributions(path=[str(s) for s in sites])
    ]


def declared(project: CrawlerProject) -> list[Dist]:
    """The project itself as its pyproject.toml declares it (`[project] dependencies`); a plain package declares
    nothing. Read statically: nothing of the project is built or run."""
    if project.kind != "pyproject":
        return []
    try:
        data = tomllib.loads((project.root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return []  # read when the project was found: a file that changed since is the build's to refuse
    deps = data.get("project", {}).get("dependencies") or []
    b = project.build
    return [Dist(b.name, b.version, tuple(d for d in deps if isinstance(d, str)))]


def check_up_front(project: CrawlerProject | None, requirements: str | None, root: Path) -> None:
    """Refuse (one line, exit 2) a set of pins, and a project's declared dependencies, with a requirement
    neither the pins nor gridfleet's environment provides, before anything is installed or started: the pins'
    metadata from their install under `root` when there is one, else from pip's resolver in a dry run."""
    pins = pinned(requirements)
    site = root / pins_hash(pins)
    pinned_dists = dists_in(site) if (site / COMPLETE).is_file() else resolved(pins)
    refuse_unmet(unmet(pinned_dists), requirements or "crawlers.requirements", requirements)
    if project is not None:
        refuse_unmet(unmet(declared(project), pinned_dists), f"crawler project {project.root}", requirements)


def resolved(pins: Sequence[str]) -> list[Dist]:
    """Each pin's metadata, from pip's resolver in a dry run (nothing installed, no dependency followed)."""
    if not pins:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        pip(
            ["install", "-q", "--dry-run", "--no-deps", "--ignore-installed", "--report", str(report), *pins],
            f"find {', '.join(pins)}",
        )
        chosen = json.loads(report.read_text())["install"]
    return [
        Dist(c["metadata"]["name"], c["metadata"]["version"], tuple(c["metadata"].get("requires_dist") or ()))
        for c in chosen
    ]


# --- the install ------------------------------------------------------------------------------------------
def requirements_root(home: Path) -> Path:
    """Where the pins are installed, one directory per hash of them: beside the local stack's crawler installs."""
    return home / "local" / "requirements"


def pins_hash(pins: Sequence[str]) -> str:
    """12 hex digits of sha256 over the pins, sorted and normalised: the same pins give the same directory."""
    text = "\n".join(sorted(p.lower().replace("_", "-") for p in pins))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def install(requirements: str | None, root: Path) -> Path | None:
    """The directory the crawlers import their pins from (None: nothing pinned), installed under `root` once per
    hash of the pins; refused (one line, exit 2) when a pin needs what neither the pins nor gridfleet provide."""
    pins = pinned(requirements)
    if not pins:
        return None
    target = root / pins_hash(pins)
    if (target / COMPLETE).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    log.info("crawlers.requirements (%s): installing %s", target.name, ", ".join(pins))
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        staging = Path(tmp) / "site"
        pip(["install", "-q", "--no-deps", "--target", str(staging), *pins], "install crawlers.requirements")
        refuse_unmet(unmet(dists_in(staging)), str(requirements), requirements)
        (staging / COMPLETE).write_text("\n".join(pins) + "\n")
        if (target / COMPLETE).is_file():  # another command installed the same pins meanwhile: theirs is in use
            return target
        if target.exists():
            shutil.rmtree(target)  # an interrupted install of the same pins
        staging.rename(target)
    return target


def _key(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
