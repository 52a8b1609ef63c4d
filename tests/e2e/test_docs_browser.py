"""The docs site in a real headless Chromium, served over HTTP from 127.0.0.1 as a reader would open it: the
sidebar leads to every section and a click reaches the page, code blocks are highlighted, the command-line
reference shows, and the search (Sphinx's own, from searchindex.js, offline) finds a word on several pages.

One screenshot of each page opened goes to $GRIDFLEET_DOCS_SHOTS when it is set (to show them), else to a
temporary directory.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.e2e.test_report import CHROMEDRIVER, CHROMIUM, chromium
from tests.infra.test_docs_site import build_site

pytestmark = pytest.mark.e2e

#: The root toctree's sections: every page's sidebar links to each (paths from the site's root).
SECTIONS = (
    "start/index.html",
    "guide/index.html",
    "aws/index.html",
    "reference/index.html",
    "architecture/index.html",
    "development/index.html",
)
#: A word on several pages, for the search.
WORD = "heartbeat"
WAIT_S = 30


@pytest.fixture(autouse=True)
def _prerequisites():
    """Replaces the tier's check: this test needs the browser and its driver, not the Grid (java, server jar)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not installed (make setup): the docs site is checked in a real browser")


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The site built once for the module, served from 127.0.0.1 on a free port: its root URL."""
    site = build_site(tmp_path_factory.mktemp("docs-site") / "html")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, name="docs-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("GRIDFLEET_DOCS_SHOTS")
    path = Path(where) if where else tmp_path_factory.mktemp("docs-shots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def open_page(driver: webdriver.Chrome, url: str) -> None:
    driver.get(url)
    WebDriverWait(driver, WAIT_S).until(lambda d: d.execute_script("return document.readyState") == "complete")


def heading(driver: webdriver.Chrome) -> str:
    return driver.find_element(By.CSS_SELECTOR, "article h1").text.rstrip("#¶ ").strip()


def sidebar_sections(driver: webdriver.Chrome, root: str) -> set[str]:
    """The sections the sidebar's first level links to, as paths from the site's root."""
    links = driver.find_elements(By.CSS_SELECTOR, ".sidebar-tree li.toctree-l1 > a")
    assert links and all(a.is_displayed() for a in links), "the sidebar is not shown"
    return {str(a.get_attribute("href")).removeprefix(root) for a in links}


def test_the_index_leads_by_a_click_to_a_guide_page_and_the_sidebar_to_every_section(served, browser, shots):
    open_page(browser, served)
    assert heading(browser) == "gridfleet"
    assert sidebar_sections(browser, served) == set(SECTIONS)
    browser.save_screenshot(str(shots / "index.png"))

    browser.find_element(By.CSS_SELECTOR, 'article a[href="guide/index.html"]').click()
    WebDriverWait(browser, WAIT_S).until(lambda d: d.current_url == served + "guide/index.html")
    assert heading(browser) == "Guide"
    browser.find_element(By.CSS_SELECTOR, 'article a[href="fleet-yaml.html"]').click()
    WebDriverWait(browser, WAIT_S).until(lambda d: d.current_url == served + "guide/fleet-yaml.html")
    assert heading(browser) == "fleet.yaml: describing a crawl"
    assert sidebar_sections(browser, served) == set(SECTIONS)


def test_a_guide_page_shows_its_code_blocks_highlighted(served, browser, shots):
    open_page(browser, served + "guide/fleet-yaml.html")
    blocks = browser.find_elements(By.CSS_SELECTOR, "article div.highlight-yaml pre")
    assert blocks and blocks[0].is_displayed()
    tokens = blocks[0].find_elements(By.CSS_SELECTOR, "span[class]")
    assert len(tokens) > 10
    colours = {t.value_of_css_property("color") for t in tokens}
    assert len(colours) > 1, "the code block's tokens are all one colour: the highlighting's stylesheet is missing"
    assert "max_attempts" in blocks[0].text
    browser.save_screenshot(str(shots / "guide.png"))


def test_the_command_line_reference_is_a_page_of_the_site(served, browser, shots):
    open_page(browser, served + "reference/cli.html")
    assert heading(browser)
    assert "gridfleet" in browser.find_element(By.TAG_NAME, "article").text
    current = browser.find_elements(By.CSS_SELECTOR, ".sidebar-tree li.current > a")
    assert served + "reference/index.html" in {a.get_attribute("href") for a in current}
    browser.save_screenshot(str(shots / "cli.png"))


def test_the_search_finds_a_word_on_several_pages(served, browser, shots):
    open_page(browser, served + f"search.html?q={WORD}")
    summary = WebDriverWait(browser, WAIT_S).until(
        lambda d: next(
            (p for p in d.find_elements(By.CSS_SELECTOR, "#search-results p.search-summary") if p.text), None
        )
    )
    assert summary.text.startswith("Search finished, found")
    results = browser.find_elements(By.CSS_SELECTOR, "#search-results ul.search li a")
    pages = {str(a.get_attribute("href")).split("#")[0] for a in results}
    assert len(pages) >= 3, summary.text
    assert served + "architecture/hub.html" in pages
    browser.save_screenshot(str(shots / "search.png"))
