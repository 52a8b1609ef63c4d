"""The run report in a real headless Chromium: what a person opening the file sees."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from cli.report.page import write_report
from tests.unit.test_report import make_summary, previous_of, write_summary

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,1600",
)


@contextlib.contextmanager
def chromium(profile: Path, **capabilities: object) -> Iterator[webdriver.Chrome]:
    """Headless Chromium through its chromedriver, with its own profile directory; quit when the block ends."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (*ARGS, f"--user-data-dir={profile}"):
        options.add_argument(arg)
    for name, value in capabilities.items():
        options.set_capability(name, value)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(autouse=True)
def _prerequisites():
    """Replaces the tier's check: this test needs the browser and its driver, not the Grid (java, server jar)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed: the report is checked in a real browser")


@pytest.fixture
def browser(tmp_path: Path):
    with chromium(tmp_path / "chromium-profile") as driver:
        yield driver


def fill(driver: webdriver.Chrome, selector: str) -> str:
    return driver.execute_script(
        "return getComputedStyle(arguments[0]).fill", driver.find_element(By.CSS_SELECTOR, selector)
    )


def test_the_report_reads_as_intended_in_chromium(tmp_path, browser):
    summary = make_summary()
    write_summary(tmp_path / "runs", previous_of(summary))
    path = write_report(write_summary(tmp_path / "runs", summary), tmp_path / "report.html")
    browser.get(path.as_uri())

    assert browser.find_element(By.TAG_NAME, "h1").text == "Run 2026-11-21"

    bars = browser.find_elements(By.CSS_SELECTOR, "svg.timeline rect.bar")
    assert len(bars) == 8
    assert all(b.size["width"] > 0 and b.size["height"] > 0 for b in bars)
    assert fill(browser, "rect.bar.outcome-hang") != fill(browser, "rect.bar.outcome-completed")
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.timeline path.kill")) == 2

    failed = browser.find_element(By.CSS_SELECTOR, "#sites tr.failed")
    assert failed.is_displayed()
    assert failed.text.startswith("beta FAILED 3")
    assert "error: <script>alert('x')</script>" in failed.text  # shown as text, not run

    newly_failing = browser.find_element(By.ID, "newly-failing")
    assert newly_failing.is_displayed() and newly_failing.text == "beta"
