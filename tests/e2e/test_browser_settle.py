"""A crawler killed while the Grid creates its session, with a real Grid and Chromium: the node waits for that
creation to end, ends the session on the site's profile and kills what Chromium is left, so the next attempt's
browser is the only one on the profile."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from selenium import webdriver

from cli.envs.grid_jar import find_grid_jar, grid_jar_candidates
from fleet import procs
from node import browser
from profiles.store import remove_singletons

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
NODE_ID = "i-settle"
CHROMIUM = "/usr/bin/chromium"
ARGS = [*browser.BASE_ARGS, "--no-sandbox"]  # root here: Chromium refuses its sandbox

# The crawler's part: ask the Grid for a session on the profile and wait (the test kills it meanwhile).
CRAWLER = """
import json, sys
from selenium import webdriver
from tests.e2e.test_browser_settle import options
webdriver.Remote(sys.argv[1], options=options(json.loads(sys.argv[2])))
"""


def options(caps: dict) -> webdriver.ChromeOptions:
    """Selenium's options for `caps`, made as the crawler makes them."""
    opts = webdriver.ChromeOptions()
    chrome = caps["goog:chromeOptions"]
    opts.binary_location = chrome["binary"]
    for arg in chrome["args"]:
        opts.add_argument(arg)
    for key in ("browserName", browser.NODE_CAPABILITY, "timeouts"):
        opts.set_capability(key, caps[key])
    return opts


def _standalone_toml(port: int) -> str:
    stereotype = json.dumps({"browserName": "chrome", "platformName": "linux", browser.NODE_CAPABILITY: NODE_ID})
    return "\n".join(
        [
            "[server]",
            'host = "127.0.0.1"',
            f"port = {port}",
            "[node]",
            "detect-drivers = false",
            "max-sessions = 2",
            "override-max-sessions = true",
            "[[node.driver-configuration]]",
            'display-name = "chrome"',
            f"stereotype = {json.dumps(stereotype)}",
            'webdriver-executable = "/usr/bin/chromedriver"',
            "max-sessions = 2",
            "",
        ]
    )


@pytest.fixture
def grid(tmp_path):
    port = procs.free_port()
    conf = tmp_path / "grid.toml"
    conf.write_text(_standalone_toml(port))
    jar = find_grid_jar(grid_jar_candidates(Path.home()))
    with (tmp_path / "grid.log").open("wb") as out:
        proc = subprocess.Popen(
            ["java", "-jar", str(jar), "standalone", "--config", str(conf), "--selenium-manager", "false"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: browser.grid_node_ready(url, NODE_ID), 90, "the Grid to list its node", proc)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _wait(cond, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert proc is None or proc.poll() is None, f"the Grid exited while waiting for {what}"
        assert time.monotonic() < end, f"no sign of {what} in {timeout_s} s"
        time.sleep(0.05)


def _on_profile(profile: Path) -> list[int]:
    flag = f"--user-data-dir={profile}"
    return [p.pid for p in procs.scan() if p.alive and flag in procs.cmdline(p.pid)]


def test_a_crawler_killed_while_its_session_starts_leaves_no_browser_on_the_profile(grid, tmp_path):
    profile = tmp_path / "profile"
    profile.mkdir()
    caps = browser.capabilities(CHROMIUM, [*ARGS, f"--user-data-dir={profile}"], NODE_ID, 30)
    crawler = subprocess.Popen(
        [sys.executable, "-c", CRAWLER, grid, json.dumps(caps)], start_new_session=True, cwd=ROOT
    )
    try:
        _wait(lambda: (browser.node_sessions(grid, NODE_ID) or []) != [], 60, "the session being created")
    finally:
        os.killpg(crawler.pid, signal.SIGKILL)  # the hub's kill: the crawler never learns its session id
        crawler.wait()

    assert browser.settle_browser(grid, NODE_ID, profile, time.monotonic, time.sleep) is None
    assert browser.node_sessions(grid, NODE_ID) == []
    assert _on_profile(profile) == []

    # the next attempt takes the profile as the node does (Chromium's Singleton* files of the killed browser
    # removed) and its browser has it to itself
    remove_singletons(profile)
    driver = webdriver.Remote(grid, options=options(caps))
    try:
        driver.get("data:text/html,<title>next</title>")
        assert driver.title == "next"
    finally:
        driver.quit()


def test_a_grid_that_does_not_answer_is_said_within_the_bound(tmp_path):
    now = [0.0]
    url = f"http://127.0.0.1:{procs.free_port()}"  # nothing listens there
    problem = browser.settle_browser(url, NODE_ID, tmp_path, lambda: now[0], lambda s: now.__setitem__(0, now[0] + s))
    assert problem == f"the Grid did not answer after {browser.SETTLE_S:g} s"
