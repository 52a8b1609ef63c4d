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


def test_the_grid_node_has_a_second_slot_for_the_next_sites_browser_while_the_last_one_closes():
    spec = GridNodeSpec(
        jar=Path("/x.jar"), grid_url="http://127.0.0.1:4444", publish="tcp://a:1", subscribe="tcp://a:2"
    )
    node = tomllib.loads(render_toml(spec, "i-1", 5555))["node"]
    # the Grid caps max-sessions at the machine's cores unless told otherwise: a 1-vCPU node would get one slot
    assert node["max-sessions"] == 2 and node["override-max-sessions"] is True
    [driver] = node["driver-configuration"]
    assert driver["max-sessions"] == 2
    assert json.loads(driver["stereotype"])["gridfleet:node"] == "i-1"  # the slots are this node's agent's only
