"""`gridfleet crawl SITE` with a real chromedriver and Chromium on a demo site server started here: the `links`
crawler's items on stdout, a line per page on stderr, `--max-pages`, `--screenshot`, an HTTP 500 as exit 1, and
no chromedriver or Chromium left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

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
    assert failed.stderr.splitlines()[-1] == f"gridfleet: error: broken: HTTP 500 from {url}"
    assert "Traceback" not in failed.stderr

    left = [
        f"{p.pid} {' '.join(p.cmdline)[:100]}" for p in procs.find(procs.scan(with_cmdline=True), GRIDFLEET_ROLE=mark)
    ]
    assert left == []
