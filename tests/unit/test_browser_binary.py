"""The browser binary decides the WebDriver browserName, and the Grid node's stereotype and the crawler's
capabilities agree on it (chromedriver opens the headless shell's first page only when asked by that name)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from node.browser import HEADLESS_SHELL, browser_name, capabilities, chrome_args
from node.grid_node import GridNodeSpec, render_toml


@pytest.mark.parametrize(
    ("binary", "name"),
    [
        ("/usr/bin/chromium", "chrome"),
        ("/usr/lib/chromium/chromium", "chrome"),
        ("/usr/lib/chromium/chromium-headless-shell", HEADLESS_SHELL),
        ("/usr/bin/chromium-headless-shell", HEADLESS_SHELL),
        ("/opt/chrome-headless-shell/chrome-headless-shell", HEADLESS_SHELL),
        ("/opt/headless-shell-stuff/chrome", "chrome"),  # the file's name decides, not a folder's
    ],
)
def test_browser_name_of_a_binary(binary, name):
    assert browser_name(binary) == name


@pytest.mark.parametrize("binary", ["/usr/bin/chromium", "/usr/lib/chromium/chromium-headless-shell"])
def test_the_grid_nodes_stereotype_matches_what_the_crawler_asks_for(binary):
    spec = GridNodeSpec(jar=Path("x.jar"), grid_url="http://h:4444", publish="tcp://h:1", subscribe="tcp://h:2")
    spec = GridNodeSpec(**{**spec.__dict__, "browser_name": browser_name(binary)})
    [driver] = tomllib.loads(render_toml(spec, "i-1", 5555))["node"]["driver-configuration"]
    stereotype = json.loads(driver["stereotype"])
    caps = capabilities(binary, chrome_args(Path("/p")), "i-1", 60)
    assert caps["goog:chromeOptions"]["binary"] == binary
    for key in ("browserName", "gridfleet:node"):
        assert stereotype[key] == caps[key]
