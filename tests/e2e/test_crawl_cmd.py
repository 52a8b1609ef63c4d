"""`gridfleet crawl SITE` with a real chromedriver and Chromium on a demo site server started here: the `links`
crawler's items on stdout, a line per page on stderr, `--max-pages`, `--screenshot`, an HTTP 500 as exit 1, and
no chromedriver or Chromium left behind; robots.txt honoured (or not, as a site says) and a site's contract judged."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from embedded.demo_server import DemoServer
from fleet import procs

pytestmark = pytest.mark.e2e

CONFIG = """\
sites:
  - {id: shop, start_url: "{demo}/s/shop/?pages=3", crawler: links, options: {item: a.item, next: a.next}}
  - {id: broken, start_url: "{demo}/s/broken/?fail_attempts=1000", crawler: links, options: {item: a.item}}
"""

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_crawl_runs_one_sites_crawler_with_a_local_chromium_and_leaves_nothing_running(tmp_path):
    config = tmp_path / "fleet.yaml"
    config.write_text(CONFIG)
    mark = f"crawl-e2e-{uuid.uuid4().hex[:8]}"  # inherited by chromedriver and Chromium: what is left is ours
    env = {**os.environ, "GRIDFLEET_HOME": str(tmp_path / "home"), "GRIDFLEET_ROLE": mark}
    shots = tmp_path / "shots"

    with DemoServer() as demo:

        def crawl(*args: str) -> subprocess.CompletedProcess:
            cmd = [sys.executable, "-m", "cli.main", "crawl", *args, "--config", str(config)]
            cmd += ["--demo-url", demo.base_url]
            return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

        whole = crawl("shop", "--screenshot", str(shots))
        first_two = crawl("shop", "--max-pages", "2")
        failed = crawl("broken")

    assert whole.returncode == 0, whole.stderr
    ids = [json.loads(line)["id"] for line in whole.stdout.splitlines()]
    assert ids == [f"shop-{page}-{i}" for page in (1, 2, 3) for i in range(1, 11)]
    pages = [line for line in whole.stderr.splitlines() if line.startswith("page ")]
    assert len(pages) == 3 and all(": HTTP 200 in " in line for line in pages), whole.stderr
    assert pages[0].endswith("/s/shop/?pages=3") and pages[2].endswith("&page=3")
    assert sorted(p.name for p in shots.iterdir()) == [f"00{n}.{ext}" for n in (1, 2, 3) for ext in ("html", "png")]
    assert all((shots / f"00{n}.png").read_bytes().startswith(PNG_SIGNATURE) for n in (1, 2, 3))
    html = (shots / "002.html").read_text()
    assert "shop-2-1" in html and "shop-1-1" not in html

    assert first_two.returncode == 0, first_two.stderr
    assert len(first_two.stdout.splitlines()) == 20
    assert sum(line.startswith("page ") for line in first_two.stderr.splitlines()) == 2

    assert failed.returncode == 1 and failed.stdout == ""
    url = f"{demo.base_url}/s/broken/?fail_attempts=1000"
    assert (
        failed.stderr.splitlines()[-1]
        == f"gridfleet: error: broken: [http_5xx 500, a fleet would retry] HTTP 500 from {url}"
    )
    assert "Traceback" not in failed.stderr

    left = [
        f"{p.pid} {' '.join(p.cmdline)[:100]}" for p in procs.find(procs.scan(with_cmdline=True), GRIDFLEET_ROLE=mark)
    ]
    assert left == []


SLOW = """\
sites:
  - {id: slow, start_url: "{demo}/s/slow/?pages=3&delay_s=1.5", crawler: links, options: {item: a.item, next: a.next}}
"""


def _chromium_on(profile_prefix: str) -> list[dict]:
    """Live Chromium processes (browser and helpers) whose profile starts with `profile_prefix`: their uids (real,
    effective, saved, file system), arguments, type and user namespace, read from /proc."""
    flag = f"--user-data-dir={profile_prefix}"
    out = []
    for p in procs.scan(with_cmdline=True):
        args = " ".join(p.cmdline).split()  # Chromium's helpers rewrite their command line as one string
        if not (p.alive and any(a.startswith(flag) for a in args)):
            continue
        try:
            status = Path(f"/proc/{p.pid}/status").read_text().splitlines()
            out.append(
                {
                    "uids": next(tuple(map(int, line.split()[1:])) for line in status if line.startswith("Uid:")),
                    "args": args,
                    "type": next((a.split("=", 1)[1] for a in args if a.startswith("--type=")), None),
                    "userns": os.readlink(f"/proc/{p.pid}/ns/user"),
                }
            )
        except OSError:  # exited meanwhile
            continue
    return out


def test_crawl_as_root_runs_chromium_as_the_crawl_user_with_its_sandbox(open_dir, tmp_path):
    """Read from /proc while the crawl runs (its pages answer slowly): the browser and every helper run as the
    crawl user when the command is root's (as the invoking user otherwise), without `--no-sandbox`, the renderers
    in a user namespace of their own (the sandbox's)."""
    uid = pwd.getpwnam("gridfleet").pw_uid if os.geteuid() == 0 else os.geteuid()  # fleet.crawl_user's default
    config = tmp_path / "fleet.yaml"
    config.write_text(SLOW)
    scratch = open_dir / "tmp"  # where the command makes its scratch profile: known, so its Chromium is found
    scratch.mkdir()
    env = {**os.environ, "GRIDFLEET_HOME": str(tmp_path / "home"), "TMPDIR": str(scratch)}
    with DemoServer() as demo:
        cmd = [sys.executable, "-m", "cli.main", "crawl", "slow", "--config", str(config), "--demo-url", demo.base_url]
        crawl = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            seen: list[dict] = []
            while crawl.poll() is None and not (
                any(b["type"] is None for b in seen) and any(b["type"] == "renderer" for b in seen)
            ):
                seen = _chromium_on(f"{scratch}/gridfleet-crawl-")
                time.sleep(0.1)
        finally:
            out, err = crawl.communicate(timeout=120)
    assert crawl.returncode == 0, err
    assert len(out.splitlines()) == 30
    main_process = next(b for b in seen if b["type"] is None)  # fails when the crawl ended before it was seen
    for b in seen:
        assert b["uids"] == (uid,) * 4, b
        assert "--no-sandbox" not in b["args"], b
    renderers = [b for b in seen if b["type"] == "renderer"]
    assert renderers and all(r["userns"] != main_process["userns"] for r in renderers), seen
    assert list(scratch.iterdir()) == []  # the scratch profile and the crawl user's HOME are gone


def test_the_sites_own_profile_is_the_browsers_while_it_crawls_and_its_owners_after(open_dir, tmp_path):
    config = tmp_path / "fleet.yaml"
    config.write_text(SLOW.replace("pages=3&delay_s=1.5", "pages=1"))
    efs = open_dir / "efs"  # a fresh store: the profile is made by this command, so its owner's
    env = {**os.environ, "GRIDFLEET_HOME": str(tmp_path / "home")}
    with DemoServer() as demo:
        cmd = [sys.executable, "-m", "cli.main", "crawl", "slow", "--config", str(config), "--demo-url", demo.base_url]
        crawl = subprocess.run(
            [*cmd, "--profile", "--profiles-root", str(efs)], cwd=tmp_path, env=env, capture_output=True, text=True
        )
    assert crawl.returncode == 0, crawl.stderr
    profile = efs / "profiles" / "slow"
    made = list(profile.rglob("*"))
    assert len(made) > 10  # Chromium's own files
    assert {(p.lstat().st_uid, p.lstat().st_gid) for p in [profile, *made]} == {(os.geteuid(), os.getegid())}


GOOD_CITIZEN = """\
sites:
  - {id: denied, start_url: "{demo}/s/robots-denied/?pages=2", crawler: links, options: {item: a.item, next: a.next}}
  - {id: later, start_url: "{demo}/s/robots-later/?pages=3", crawler: links, options: {item: a.item, next: a.next}}
  - id: ignored
    start_url: "{demo}/s/robots-later/?pages=3"
    crawler: links
    options: {item: a.item, next: a.next}
    politeness: {robots: false}
  - id: short
    start_url: "{demo}/s/short/?pages=3"
    crawler: links
    options: {item: a.item, next: a.next}
    expect: {min_items: 31, fields: {type: object, required: [href]}}
"""


def test_crawl_honours_robots_txt_and_judges_the_sites_contract_in_a_real_browser(tmp_path):
    """The demo's robots.txt denies robots-denied's start URL and robots-later's next pages: the first fails in one
    line, the second keeps its first page and counts the page it skipped, and `politeness: {robots: false}` crawls
    all three pages. A site whose 30 items break `min_items: 31` exits 1 naming the rule."""
    config = tmp_path / "fleet.yaml"
    config.write_text(GOOD_CITIZEN)
    env = {**os.environ, "GRIDFLEET_HOME": str(tmp_path / "home")}
    with DemoServer() as demo:

        def crawl(site: str) -> subprocess.CompletedProcess:
            cmd = [
                sys.executable,
                "-m",
                "cli.main",
                "crawl",
                site,
                "--config",
                str(config),
                "--demo-url",
                demo.base_url,
            ]
            return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

        denied, later, ignored, short = (crawl(site) for site in ("denied", "later", "ignored", "short"))

    assert denied.returncode == 1 and denied.stdout == ""
    assert denied.stderr.splitlines()[-1].startswith(
        "gridfleet: error: denied: [robots, a fleet would fail] robots.txt disallows the start URL "
    )
    assert later.returncode == 0 and len(later.stdout.splitlines()) == 10, later.stderr
    assert f"skipped: robots.txt disallows {demo.base_url}/s/robots-later/?pages=3&page=2" in later.stderr
    assert later.stderr.splitlines()[-1].endswith("1 pages skipped (robots.txt)")
    assert ignored.returncode == 0 and len(ignored.stdout.splitlines()) == 30, ignored.stderr
    assert "robots.txt ignored (politeness.robots: false)" in ignored.stderr
    assert short.returncode == 1 and len(short.stdout.splitlines()) == 30
    assert "contract broken: min_items: 30 items < 31" in short.stderr.splitlines()
    assert short.stderr.splitlines()[-1].endswith("a node would quarantine it: min_items: 30 items < 31")
