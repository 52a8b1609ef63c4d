"""The local stack's real Selenium Grid takes only what shows the stack's Grid secret: a Grid node without the
registration secret (or with another) never registers, and a client without the router's credentials gets
HTTP 401, while the node and the crawler, given the secret's file, register and crawl through it. Real Grid hub,
Grid node, chromedriver and Chromium; nothing is faked."""

from __future__ import annotations

import json
import stat
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException

from cli.envs.grid_jar import find_grid_jar, grid_jar_candidates
from embedded.stack import LocalStack, StackState
from fleet.grid_auth import GridSecret, grid_request
from node import browser
from node.crawler import BaseCrawler, CrawlContext
from node.grid_node import GridNode, GridNodeSpec
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    jar = find_grid_jar(grid_jar_candidates(ROOT))
    s = LocalStack(tmp_path_factory.mktemp("home"), grid_jar=jar)
    try:
        yield s, s.up()
    finally:
        s.down(quiet=True)


def spec(st: StackState, jar: Path, secret: GridSecret | None) -> GridNodeSpec:
    # a short registration period: a refused node gives up (and says so in its log) within seconds
    return GridNodeSpec(
        jar=jar,
        grid_url=st.grid_url,
        publish=st.grid_publish,
        subscribe=st.grid_subscribe,
        secret=secret,
        register_period_s=4,
        register_cycle_s=1,
    )


def listed_nodes(st: StackState) -> str:
    """The router's /status, read with the stack's credentials, as text."""
    with urllib.request.urlopen(grid_request(st.grid_url + "/status", st.secret), timeout=10) as r:
        return r.read().decode()


@pytest.mark.parametrize("secret", [None, GridSecret.make()], ids=["no-secret", "another-secret"])
def test_a_grid_node_without_the_stacks_secret_cannot_register(stack, tmp_path, secret):
    s, st = stack
    assert s.grid_jar is not None
    node_id = f"i-intruder-{'none' if secret is None else 'other'}"
    node = GridNode(spec(st, s.grid_jar, secret), node_id, tmp_path / "node")
    try:
        with pytest.raises(RuntimeError, match="refused this Grid node's registration"):
            node.start(timeout_s=120)
        log = (tmp_path / "node" / "grid-node.log").read_text()
        assert log.count("Sending registration event") >= 2  # it tried, and was not taken
        assert not browser.grid_node_ready(st.grid_url, node_id, secret=st.secret)
        assert node_id not in listed_nodes(st)
    finally:
        node.stop()


class _Title(BaseCrawler):
    def crawl(self):  # pragma: no cover - the test drives `driver` itself
        return []


def test_only_clients_with_the_credentials_reach_the_grid(stack, tmp_path):
    s, st = stack
    assert s.grid_jar is not None and st.secret is not None
    assert stat.S_IMODE(s.grid_secret_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(s.grid_config_file.stat().st_mode) == 0o600
    node_id = "i-member"
    node = GridNode(spec(st, s.grid_jar, GridSecret.read(s.grid_secret_file)), node_id, tmp_path / "node")
    node.start(timeout_s=120)
    try:
        assert stat.S_IMODE((tmp_path / "node" / "grid-node.toml").stat().st_mode) == 0o600
        assert browser.grid_node_ready(st.grid_url, node_id, secret=st.secret)
        assert not browser.grid_node_ready(st.grid_url, node_id)  # /status itself needs the credentials

        caps = browser.capabilities(CHROMIUM, browser.chrome_args(tmp_path / "profile", ("--no-sandbox",)), node_id, 30)
        req = urllib.request.Request(
            st.grid_url + "/session", data=json.dumps({"capabilities": {"alwaysMatch": caps}}).encode(), method="POST"
        )
        req.add_header("Content-Type", "application/json")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=30)
        assert refused.value.code == 401
        with pytest.raises(WebDriverException):
            webdriver.Remote(st.grid_url, options=webdriver.ChromeOptions())

        ctx = CrawlContext(
            site="s",
            start_url="data:,",
            options={},
            attempt=1,
            node_id=node_id,
            grid_url=st.grid_url,
            profile_dir=str(tmp_path / "profile"),
            chrome_extra_args=("--no-sandbox",),  # root here: Chromium refuses its sandbox
            page_load_timeout_s=30,
            grid_secret=GridSecret.read(s.grid_secret_file),
        )
        crawler = _Title(ctx)
        crawler.driver.get("data:text/html,<title>through the router</title>")
        assert crawler.driver.title == "through the router"
        session_id = crawler.driver.session_id
        assert not browser.end_session(st.grid_url, session_id)  # without the credentials: refused
        assert browser.end_session(st.grid_url, session_id, secret=st.secret)
        crawler._driver = None  # its session is ended
        # the router hears of the ended session from the node's events, a moment later
        wait_for(lambda: browser.node_sessions(st.grid_url, node_id, secret=st.secret) == [], timeout=30)
    finally:
        node.stop()


def test_a_run_on_the_stack_crawls_through_the_locked_grid_and_logs_none_of_its_secret(gf):
    assert gf.run("local", "up", timeout=120).returncode == 0
    secret = GridSecret(json.loads(gf.stack_file.read_text())["grid_secret"])
    cfg = gf.write_config(
        "one.yaml",
        """\
        run: {hang_after_s: 30, watch_interval_s: 1}
        fleet: {max_nodes: 1, idle_exit_s: 4}
        hub: {port: 0}
        sites:
          - {id: one, start_url: "{demo}/s/one/?pages=2"}
        """,
    )
    run = gf.run("run", "--local", "--config", str(cfg), "--run-id", "locked", timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert gf.summary("locked")["sites"]["one"]["run_status"] == "COMPLETED"
    assert json.loads(gf.stack_file.read_text())["grid_secret"] == secret.value  # the run used that stack's Grid
    logs = {"hub": run.stdout + run.stderr}
    for f in [*(gf.cwd / "runs" / "locked" / "nodes").glob("*/*.log"), *(gf.home / "local" / "logs").glob("*.log")]:
        logs[str(f)] = f.read_text(errors="replace")
    assert any("grid-node.log" in name for name in logs) and any(name.endswith("grid.log") for name in logs)
    shown = (secret.value, secret.password, secret.registration_secret, secret.authorization.split()[1])
    assert [(name, s[:4]) for name, text in logs.items() for s in shown if s in text] == []
