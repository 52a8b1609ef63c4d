"""The node's own kill command inside a twin instance, for the SSM and SSH tests: `gridfleet node kill` at the
path the hub runs it by (`hub.control.command.DEFAULT_GRIDFLEET_BIN`), and a crawl it can kill.

An instance has no install of gridfleet here, so `gridfleet` there is a two-line script that runs this
checkout's `node.main` with the instance's own python3 and this environment's site-packages (both Python
3.11), read from where they lie on the host. A checkout under a path the instance masks (/tmp, /root) cannot
be reached that way: the test is skipped, saying so.
"""

from __future__ import annotations

import shlex
import sysconfig
from pathlib import Path

import pytest

from hub.control.command import DEFAULT_GRIDFLEET_BIN, DEFAULT_STATE_DIR

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(sysconfig.get_paths()["purelib"]).resolve()
_RUN = "import sys; sys.path[:0] = sys.argv[1:3]; from node.main import main; sys.exit(main(sys.argv[3:]))"
_WRITE = (
    "import sys; sys.path[:0] = sys.argv[1:3]; from pathlib import Path; from fleet.crawl import crawlerfile;"
    "crawlerfile.write(Path(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))"
)


def install_gridfleet(box) -> None:
    """`gridfleet node ...` in the instance, at the node's path; skips the test where it cannot be."""
    if box.host_path(str(ROOT)) is not None or box.host_path(str(SITE)) is not None:
        pytest.skip(f"{ROOT} or {SITE} lies under a path the instance masks")
    target = box.host_path(DEFAULT_GRIDFLEET_BIN)
    target.parent.mkdir(parents=True, exist_ok=True)
    paths = f"{shlex.quote(str(ROOT))} {shlex.quote(str(SITE))}"
    target.write_text(f'#!/bin/sh\n[ "$1" = node ] && shift\nexec python3 -I -c {shlex.quote(_RUN)} {paths} "$@"\n')
    target.chmod(0o755)


def start_crawl(box, site: str, attempt: int) -> str:
    """A process in the instance standing for the crawler of `site`/`attempt`, in crawler.json; its pid there."""
    pid = box.run(["sh", "-c", "setsid sleep 600 >/dev/null 2>&1 & echo $!"]).stdout.strip()
    argv = ["python3", "-I", "-c", _WRITE, str(ROOT), str(SITE), DEFAULT_STATE_DIR, site, str(attempt), pid]
    wrote = box.run(argv)
    assert wrote.returncode == 0, wrote.stderr
    return pid


def running(box, pid: str) -> bool:
    """The process runs in the instance (a zombie does not: the instance's init has yet to reap it)."""
    state = box.run(["ps", "-o", "stat=", "-p", pid]).stdout.strip()
    return bool(state) and not state.startswith("Z")
