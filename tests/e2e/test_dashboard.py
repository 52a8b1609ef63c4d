"""The dashboard in real headless Chromium: it follows the hub's status through /events and redraws in place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from hub.http_server import HubServer

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROME_ARGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
WAIT_S = 15


@pytest.fixture(autouse=True)
def _prerequisites():
    """Replaces the e2e suite's check: this test needs Chromium and its driver, not Java or the Grid."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.skip(f"{' and '.join(missing)} missing: install Debian's chromium and chromium-driver")


@pytest.fixture
def driver(tmp_path) -> WebDriver:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in CHROME_ARGS:
        options.add_argument(arg)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    drv = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield drv
    finally:
        drv.quit()


@pytest.fixture
def status() -> dict:
    return {
        "run_id": "2026-11-21",
        "finished": False,
        "updated_at": 1763700000.0,
        "counts": {"QUEUED": 1, "RUN": 1, "COMPLETED": 0, "FAILED": 0},
        "sites": {
            "a": {"run_status": "QUEUED", "site_status": "PENDING", "attemptCount": 0},
            "b": {"run_status": "RUN", "site_status": "URL_CALL", "attemptCount": 1, "instance_id": "i-0abc"},
        },
        "nodes": [
            {
                "instance_id": "i-0abc",
                "state": "busy",
                "site": "b",
                "heartbeat_age_s": 1.5,
                "instance_type": "t3.medium",
            }
        ],
        "kills": [],
        "queue": {"visible": 1, "in_flight": 1, "dlq": 0},
    }


@pytest.fixture
def server(status):
    hub = HubServer(lambda: status, poll_s=0.1).start()
    try:
        yield hub
    finally:
        hub.stop()


def test_the_page_follows_a_site_to_completed_and_lists_the_kill(driver, server, status):
    driver.get(server.url)
    wait = WebDriverWait(driver, WAIT_S)
    wait.until(lambda d: d.find_element(By.ID, "site-b").get_attribute("data-status") == "RUN")
    tile = driver.find_element(By.ID, "site-b")
    running_colour = tile.value_of_css_property("background-color")
    assert driver.title == "gridfleet — run 2026-11-21"
    assert driver.find_element(By.ID, "conn").text == "live"
    assert "URL_CALL" in tile.get_attribute("title")

    status["sites"]["b"] = {**status["sites"]["b"], "run_status": "COMPLETED", "site_status": "COMPLETED"}
    status["counts"] = {"QUEUED": 1, "RUN": 0, "COMPLETED": 1, "FAILED": 0}
    status["kills"] = [
        {"at": 1763699000.0, "site": "b", "attempt": 1, "instance_id": "i-<i>x</i>", "reason": "hang", "path": "ssm"}
    ]

    # The same element changes: tiles are updated in place, not redrawn.
    wait.until(lambda d: tile.get_attribute("data-status") == "COMPLETED")
    wait.until(lambda d: tile.value_of_css_property("background-color") != running_colour)
    wait.until(lambda d: d.find_element(By.ID, "count-COMPLETED").text == "1")
    assert driver.find_element(By.ID, "count-RUN").text == "0"
    kill = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#kills li"))
    assert len(kill) == 1
    assert "b attempt 1: hang via ssm on i-<i>x</i>" in kill[0].text  # data shown as text, never as markup
    assert driver.find_elements(By.CSS_SELECTOR, "#kills i") == []
