"""Chromium never runs as root without its sandbox: on the embedded default a root run's browsers run as the crawl
user (a developer's own run: as that developer), sandboxed, read from the process table while a site crawls."""

from __future__ import annotations

import json
import os
import pwd
import time
from pathlib import Path

import pytest

from fleet import procs
from tests.e2e.conftest import attempts

pytestmark = pytest.mark.e2e

CONFIG = """\
run: {max_attempts: 2, hang_after_s: 20, heartbeat_timeout_s: 20, watch_interval_s: 1, deadline_s: 120}
fleet: {max_nodes: 1, idle_exit_s: 4}
sites:
  - {id: sbx, start_url: "{demo}/s/sbx/?pages=4&delay_s=1.5"}
"""


def browser_uid() -> int:
    """Whom Chromium must run as: the crawl user when the run is root's, else the user running it."""
    if os.geteuid() != 0:
        return os.geteuid()
    try:
        return pwd.getpwnam("gridfleet").pw_uid  # fleet.crawl_user's default
    except KeyError:
        pytest.fail("there is no user gridfleet: `make setup` run as root creates it")


def uids(pid: int) -> tuple[int, ...]:
    """Real, effective, saved and file-system uid (/proc/<pid> itself shows root for a non-dumpable process)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return tuple(int(x) for x in line.split()[1:])
    raise AssertionError(f"no Uid line for {pid}")


def browsers(flag: str) -> list[dict]:
    out = []
    for p in procs.scan(with_cmdline=True):
        args = " ".join(p.cmdline).split()  # Chromium's helpers rewrite their command line as one string
        if p.alive and flag in args:
            try:
                out.append(
                    {
                        "pid": p.pid,
                        "args": args,
                        "uids": uids(p.pid),
                        "userns": os.readlink(f"/proc/{p.pid}/ns/user"),
                        "type": next((a.split("=", 1)[1] for a in args if a.startswith("--type=")), None),
                    }
                )
            except OSError:  # exited meanwhile
                continue
    return out


def browsers_while_crawling(hub, flag: str, timeout_s: float = 60) -> list[dict]:
    """The site's Chromium processes once its browser and a renderer run (the run must still be going)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and hub.poll() is None:
        seen = browsers(flag)
        if any(b["type"] is None for b in seen) and any(b["type"] == "renderer" for b in seen):
            return seen
        time.sleep(0.2)
    raise AssertionError(f"no Chromium with {flag} while the run went (exit {hub.poll()})")


def test_chromium_of_a_crawl_runs_unprivileged_with_its_sandbox(gf):
    uid = browser_uid()
    cfg = gf.write_config("sandbox.yaml", CONFIG)
    hub = gf.start("run", "--local", "--config", str(cfg), "--run-id", "sandbox")
    flag = f"--user-data-dir={gf.home / 'efs' / 'profiles' / 'sbx'}"
    seen = browsers_while_crawling(hub, flag)

    for b in seen:
        assert b["uids"] == (uid,) * 4, b
        assert "--no-sandbox" not in b["args"], b
    main = next(b for b in seen if b["type"] is None)
    renderers = [b for b in seen if b["type"] == "renderer"]
    assert all(r["userns"] != main["userns"] for r in renderers), seen  # the sandbox's own user namespace

    assert hub.wait(timeout=90) == 0, (gf.cwd / "hub.log").read_text()[-3000:]
    s = gf.summary("sandbox")
    assert s["check"]["ok"], s["check"]
    assert [a["outcome"] for a in attempts(s, "sbx")] == ["completed"]  # none lost, none spot
    node = attempts(s, "sbx")[0]["instance_id"]
    said = [
        json.loads(line)
        for line in (gf.cwd / "runs" / "sandbox" / "nodes" / node / "node.log").read_text().splitlines()
        if line.startswith("{") and '"chromium-sandbox"' in line
    ]
    assert [(e["sandbox"], e["uid"]) for e in said] == [("on", uid)]
    assert gf.wait_no_leftovers() == []  # the crawl user's Chromium too, found by its profile
