"""The `crawlers:` section of fleet.yaml: which crawler project the sites' crawlers come from.

On the operator's machine the section names the project's directory (`project`, relative to the config file)
and optionally a pinned requirements file. The configs gridfleet writes for the hub and the nodes carry
`installed` instead: the project's identity (name, version, content hash), its code installed beside gridfleet
(the bundle on AWS, a directory of the local stack on the embedded default), where its crawlers are found.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from fleet.crawl.project import CrawlerProject, ProjectError, pinned_requirements

#: Keys of the validation context `fleet.config.load` passes: the config file's directory, and the project
#: found there (or why not).
BASE_DIR = "base_dir"
PROJECT = "crawler_project"
PROJECT_PROBLEM = "crawler_project_problem"
#: The source roots of an installed copy of the project a config names by identity (`installed`), where a reader
#: of that config other than its hub and nodes finds it (a local stack's directory of installed projects).
INSTALLED_ROOTS = "crawler_installed_roots"


_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


class InstalledCrawlers(BaseModel):
    """The crawler project as installed beside gridfleet: which code the crawls run (`fleet.crawl.project`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=200, description="the project's name")
    version: str = Field(min_length=1, max_length=200, description="its version (a plain package's is 0)")
    hash: str = Field(pattern=_HASH.pattern, description="sha256 of the files it ships: the same files, the same hash")


class CrawlersConfig(BaseModel):
    """The crawler project the sites' crawlers come from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    project: str | None = Field(
        None,
        max_length=1024,
        description="the crawler project's directory (a pyproject.toml project or a package directory), "
        "relative to this file",
    )
    requirements: str | None = Field(
        None,
        max_length=1024,
        description="a pinned requirements file (name==version per line) of what the project needs beyond "
        "gridfleet's own dependencies, relative to this file",
    )
    installed: InstalledCrawlers | None = Field(
        None, description="written by gridfleet in the configs it gives the hub and nodes; not set by hand"
    )

    @field_validator("project")
    @classmethod
    def _project(cls, v: str | None, info: ValidationInfo) -> str | None:
        context: dict[str, Any] = info.context or {}
        if v is None or context.get(BASE_DIR) is None:
            return v
        if context.get(PROJECT_PROBLEM):
            raise ValueError(context[PROJECT_PROBLEM])
        return str(context[PROJECT].root)

    @field_validator("requirements")
    @classmethod
    def _requirements(cls, v: str | None, info: ValidationInfo) -> str | None:
        base = (info.context or {}).get(BASE_DIR)
        if v is None or base is None:
            return v
        path = (Path(base) / v).resolve()
        if not path.is_file():
            raise ValueError(f"{path}: no such file")
        try:
            pinned_requirements(path)
        except ProjectError as e:
            raise ValueError(str(e)) from None
        return str(path)

    @model_validator(mode="after")
    def _one_source(self) -> CrawlersConfig:
        if self.project is None and self.installed is None:
            raise ValueError("name the crawler project's directory in `project`")
        if self.requirements is not None and self.project is None:
            raise ValueError("`requirements` needs `project`")
        return self


def project_context(data: Any, base_dir: Path | None, installed_root: Path | None = None) -> dict[str, Any]:
    """The validation context for raw config data: the crawler project its `crawlers.project` names, found
    relative to `base_dir` (the config file's directory), or why it cannot be used. A config that names its
    project by identity (`installed`) finds its crawlers in that project's copy under `installed_root`, when
    given (a directory of copies, each named by the first 12 hex digits of its hash)."""
    context: dict[str, Any] = {BASE_DIR: base_dir}
    section = data.get("crawlers") if isinstance(data, dict) else None
    installed = section.get("installed") if isinstance(section, dict) else None
    digest = installed.get("hash") if isinstance(installed, dict) else None
    if installed_root is not None and isinstance(digest, str) and _HASH.fullmatch(digest):
        context[INSTALLED_ROOTS] = [str(installed_root / digest.partition(":")[2][:12])]
    project = section.get("project") if isinstance(section, dict) else None
    if base_dir is None or not isinstance(project, str) or not project or len(project) > 1024:
        return context
    try:
        context[PROJECT] = CrawlerProject.at((base_dir / project).resolve())
    except ProjectError as e:
        context[PROJECT_PROBLEM] = str(e)
    return context


def crawler_roots(context: dict[str, Any] | None) -> list[str] | None:
    """Where dotted crawler names must be found: the project's source roots (or its installed copy's); None: on
    the import path."""
    project = (context or {}).get(PROJECT)
    if project is not None:
        return list(project.source_roots)
    roots = (context or {}).get(INSTALLED_ROOTS)
    return list(roots) if roots else None
