"""The news crawler against saved pages: the way a crawler author tests a crawler before any run.

The saved pages (`pages/`, saved from the demo server's news site `news` with `pages=2&per_page=2`: two
listing pages of two articles each, the articles linked relatively, so both listings link `a1/index.html`) are
served on 127.0.0.1, and `gridfleet crawl` runs the crawler with a local
Chromium, as it does for its author: its items come out as JSON lines.
"""

from __future__ import annotations

import functools
import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.e2e

CONFIG = """\
crawlers: {{project: {project}}}
sites:
  - {{id: news, start_url: "{url}/p1/index.html", crawler: "newscrawlers.news:NewsCrawler"}}
"""


@pytest.fixture
def saved_pages():
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(HERE / "pages"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_news_crawler_reads_every_article_of_every_listing(saved_pages, tmp_path):
    config = tmp_path / "fleet.yaml"
    config.write_text(CONFIG.format(project=HERE.parent, url=saved_pages))
    p = subprocess.run(
        [sys.executable, "-m", "cli.main", "crawl", "news", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    items = [json.loads(line) for line in p.stdout.splitlines()]
    assert [i["title"] for i in items] == ["Story news-1-1", "Story news-1-2", "Story news-2-1", "Story news-2-2"]
    assert items[2]["id"] == f"{saved_pages}/p2/a1/index.html"  # not the p1 article both listings call a1
    assert items[0]["date"] == "2026-01-09T22:25:00Z"
    assert items[0]["summary"] == "airport library ferry tunnel harbour budget"
    assert items[3]["body"].startswith("election ferry harvest budget")
