"""The Selenium server jar: what local nodes run as their Grid node, and what the bundle carries to instances."""

from __future__ import annotations

import os
from pathlib import Path

from cli.envs.home import PROJECT_ROOT
from fleet.errors import MissingResource

JAR_GLOB = "selenium-server-*.jar"


def grid_jar_candidates(home: Path, environ: dict[str, str] | None = None) -> list[Path]:
    """Where to look, first to last: `GRIDFLEET_GRID_JAR`, then the `vendor/` of the source tree, of the working
    directory and of `home`."""
    env = os.environ if environ is None else environ
    out = [Path(env["GRIDFLEET_GRID_JAR"])] if env.get("GRIDFLEET_GRID_JAR") else []
    return out + [PROJECT_ROOT / "vendor", Path.cwd() / "vendor", home / "vendor"]


def find_grid_jar(candidates: list[Path]) -> Path:
    """The Selenium server jar: the first candidate that is a jar, else the newest `selenium-server-*.jar` in the
    first candidate directory that has one."""
    for d in candidates:
        if d.is_file() and d.suffix == ".jar":
            return d
        if d.is_dir():
            jars = sorted(d.glob(JAR_GLOB))
            if jars:
                return jars[-1]
    raise MissingResource(
        "the Selenium server jar was not found (looked in "
        + ", ".join(str(c) for c in candidates)
        + "); run `make setup`"
    )
