"""A team's crawler project: the directory of site crawlers `fleet.yaml` names in `crawlers.project`.

Two shapes are accepted: a Python project (a directory with a `pyproject.toml` whose `[project]` table names it),
or a plain package directory (a directory with an `__init__.py`, imported by the directory's name). Its identity
is its name, its version (the pyproject's, or "0" for a plain package) and the hash of its content, so a result
can say which code produced it: the same files give the same hash on every machine.

Nothing here imports the project or runs its code: crawlers are found by path (`source_roots`), and the content
is read with bounds (files, bytes), so a directory that is not a crawler project costs a bounded amount of work.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

#: Directories and files that are not the project's content (build output, caches, version control, venvs).
SKIPPED_DIRS = frozenset(
    {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "build", "dist", ".mypy_cache", ".ruff_cache",
     ".pytest_cache", ".tox", "node_modules"}
)  # fmt: skip
SKIPPED_SUFFIXES = (".pyc", ".pyo", ".egg-info")

#: Bounds of the content walk: a crawler project is source code, not data.
MAX_FILES = 5000
MAX_BYTES = 64 * 2**20

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DIST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


class ProjectError(ValueError):
    """The directory is not a crawler project gridfleet can ship; the message says why."""


@dataclass(frozen=True)
class CrawlerBuild:
    """Which crawler code a run uses: recorded in the bundle, the run's config and its summary."""

    name: str
    version: str
    hash: str  # "sha256:<hex>" of the project's content

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "hash": self.hash}

    @property
    def short(self) -> str:
        """The first 12 hex digits of the hash: a directory name for an installed copy."""
        return self.hash.partition(":")[2][:12]


@dataclass(frozen=True)
class CrawlerProject:
    root: Path
    kind: str  # "pyproject" or "package"
    build: CrawlerBuild

    @property
    def source_roots(self) -> list[str]:
        """Where the project's top-level packages are found: the root or its `src/` for a Python project, the
        directory above a plain package."""
        if self.kind == "package":
            return [str(self.root.parent)]
        src = self.root / "src"
        return [str(src)] if src.is_dir() else [str(self.root)]

    @classmethod
    def at(cls, root: Path) -> CrawlerProject:
        if not root.is_dir():
            raise ProjectError(f"{root}: no such directory")
        pyproject = root / "pyproject.toml"
        if pyproject.is_file():
            name, version = _pyproject_identity(pyproject)
            kind = "pyproject"
        elif (root / "__init__.py").is_file():
            name, version, kind = root.name, "0", "package"
            if not _NAME.fullmatch(name):
                raise ProjectError(f"{root}: a package directory must be named like a Python module, not {name!r}")
        else:
            raise ProjectError(f"{root}: neither a pyproject.toml nor an __init__.py: not a Python project or package")
        return cls(root, kind, CrawlerBuild(name, version, content_hash(root)))


def _pyproject_identity(path: Path) -> tuple[str, str]:
    try:
        if path.stat().st_size > 1 * 2**20:
            raise ProjectError(f"{path}: larger than 1 MB: not a pyproject.toml")
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ProjectError(f"{path}: cannot be read: {e}") from None
    project = data.get("project")
    if not isinstance(project, dict) or not isinstance(project.get("name"), str):
        raise ProjectError(f"{path}: no [project] name")
    name = project["name"]
    if not _DIST_NAME.fullmatch(name):
        raise ProjectError(f"{path}: [project] name {name!r} is not a valid distribution name")
    version = project.get("version")
    if not isinstance(version, str) or not version:
        raise ProjectError(f"{path}: [project] version must be a string (a dynamic version cannot be recorded)")
    return name, version


def shipped_files(root: Path) -> list[Path]:
    """The files of the project that ship, relative to `root`, sorted: what its hash covers and what is copied
    for the nodes or built into its wheel, so that two projects with one hash ship the same code.

    Left out, at any depth: the directories in SKIPPED_DIRS, names ending in SKIPPED_SUFFIXES, and anything that
    is not a regular file (sockets, FIFOs). A symbolic link to a file inside the project ships as that file's
    content under the link's name; a link to a directory, or one that resolves outside the project or to
    nothing, is refused (ProjectError naming the link). Bounded by MAX_FILES and MAX_BYTES."""
    base = root.resolve()
    found: list[Path] = []
    total = 0
    for here, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(SKIPPED_SUFFIXES))
        for name in dirs:
            if (Path(here) / name).is_symlink():
                _linked_file(Path(here) / name, base)  # refuses it, saying why
        for name in sorted(files):
            path = Path(here) / name
            if name.endswith(SKIPPED_SUFFIXES):
                continue
            if path.is_symlink():
                _linked_file(path, base)
            elif not path.is_file():
                continue
            found.append(path.relative_to(root))
            total += path.stat().st_size
            if len(found) > MAX_FILES or total > MAX_BYTES:
                raise ProjectError(
                    f"{root}: more than {MAX_FILES} files or {MAX_BYTES // 2**20} MB: not a crawler project"
                )
    return sorted(found)


def _linked_file(link: Path, base: Path) -> None:
    """Refuse a symbolic link that would ship anything but a file of the project itself."""
    target = link.resolve()
    if not target.is_relative_to(base):
        raise ProjectError(f"{link}: a symbolic link to {target}, outside the crawler project: not shipped")
    if not target.is_file():
        what = "a directory" if target.is_dir() else "nothing"
        raise ProjectError(f"{link}: a symbolic link to {what}: only links to files of the project are shipped")


def content_hash(root: Path) -> str:
    """sha256 over each shipped file's relative path and content, in path order: the same files give the same
    hash."""
    return _digest(root, shipped_files(root), None)


def copy_shipped(root: Path, into: Path) -> str:
    """Copy the project's shipped files into `into` (links become plain files) and return the hash of what was
    copied: it differs from the project's recorded hash if a file changed since the project was read."""
    into.mkdir(parents=True, exist_ok=True)
    return _digest(root, shipped_files(root), into)


def _digest(root: Path, files: list[Path], copy_to: Path | None) -> str:
    digest = hashlib.sha256()
    for rel in files:
        data = (root / rel).read_bytes()
        digest.update(rel.as_posix().encode() + b"\0" + str(len(data)).encode() + b"\0")
        digest.update(data)
        if copy_to is not None:
            (copy_to / rel).parent.mkdir(parents=True, exist_ok=True)
            (copy_to / rel).write_bytes(data)
    return "sha256:" + digest.hexdigest()


#: Bounds of a requirements file: a short list of pins, not data.
MAX_REQUIREMENT_LINES = 1000
MAX_REQUIREMENTS_BYTES = 256 * 2**10


def pinned_requirements(path: Path) -> list[str]:
    """The lines of a requirements file, each `name==version` (comments and blank lines skipped); anything
    else is refused, so that every instance installs exactly what was tried here."""
    # imported here: the Lambdas import the config, and their package carries no `packaging`
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        with path.open("rb") as f:
            raw = f.read(MAX_REQUIREMENTS_BYTES + 1)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ProjectError(f"{path}: cannot be read: {e}") from None
    lines = text.splitlines()
    if len(raw) > MAX_REQUIREMENTS_BYTES or len(lines) > MAX_REQUIREMENT_LINES:
        raise ProjectError(
            f"{path}: more than {MAX_REQUIREMENT_LINES} lines: not a requirements file of a crawler project"
        )
    out: list[str] = []
    for n, line in enumerate(lines, 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            req = Requirement(entry)
        except InvalidRequirement:
            req = None
        spec = list(req.specifier) if req else []
        if req is None or req.url or req.marker or len(spec) != 1 or spec[0].operator != "==" or "*" in spec[0].version:
            raise ProjectError(f"{path}:{n}: {entry!r} is not pinned: write it as name==version")
        out.append(f"{req.name}=={spec[0].version}")
    return out
