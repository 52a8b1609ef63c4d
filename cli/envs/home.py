"""Where gridfleet keeps its things on this machine, and where its source tree is."""

from __future__ import annotations

import os
from pathlib import Path

#: The source tree (the project's checkout, or the installed packages' parent directory).
PROJECT_ROOT = Path(__file__).resolve().parents[2]

#: root's GRIDFLEET_HOME: the crawl user must reach the profiles and the nodes' state, and root's home is closed.
ROOT_HOME = Path("/var/lib/gridfleet")


def gridfleet_home(environ: dict[str, str] | None = None, euid: int | None = None) -> Path:
    """`GRIDFLEET_HOME`, else /var/lib/gridfleet for root and ~/.gridfleet for anyone else."""
    env = os.environ if environ is None else environ
    if env.get("GRIDFLEET_HOME"):
        return Path(env["GRIDFLEET_HOME"])
    return ROOT_HOME if (os.geteuid() if euid is None else euid) == 0 else Path.home() / ".gridfleet"
