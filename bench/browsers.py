"""Chromium (`--headless=new`) against Chrome's headless shell on this machine, side by side.

For each browser binary: the start of chromedriver and the browser with the crawl's arguments (cold: a new
profile; warm: a profile used before), the peak memory (RSS summed over the browser's process tree, sampled
while a crawl runs), and whether what the nodes do works: the `links` crawler on a plain demo site and on a news
site with fields and detail pages, a page built by JavaScript, a screenshot, and the evidence capture (URL,
screenshot, HTML, console). The demo site server runs in this process.

    .venv/bin/python bench/browsers.py [--runs 4] [BINARY ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from embedded.demo_server import DemoServer  # noqa: E402
from fleet import procs  # noqa: E402
from node import evidence  # noqa: E402
from node.browser import STARTUP_PREFS, browser_name, chrome_args  # noqa: E402
from node.crawler import CrawlContext  # noqa: E402
from node.crawlers.links import LinksCrawler  # noqa: E402

BINARIES = ("/usr/bin/chromium", "/usr/lib/chromium/chromium-headless-shell")
CHROMEDRIVER = "/usr/bin/chromedriver"
SANDBOX = ("--no-sandbox",) if os.geteuid() == 0 else ()
JS_PAGE = (
    "data:text/html,<ul id=l></ul><script>for (let i = 0; i < 5; i++) {"
    "const a = document.createElement('a'); a.className = 'item'; a.href = '/x' + i; a.textContent = 'x' + i;"
    "document.getElementById('l').append(a) } console.log('built by js')</script>"
)


def rss_of_tree(pid: int) -> int:
    """Bytes resident in `pid` and its descendants."""
    total = 0
    for p in procs.descendants(procs.scan(), [pid]):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


class Peak:
    """Samples a process tree's RSS every 50 ms in a thread; `peak` is the largest sum seen."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_of_tree(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def start(binary: str, profile: Path) -> tuple[float, Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for a in chrome_args(profile, SANDBOX):
        opts.add_argument(a)
    opts.add_experimental_option("prefs", STARTUP_PREFS)
    opts.set_capability("browserName", browser_name(binary))
    t0 = time.monotonic()
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    return time.monotonic() - t0, driver


def starts(binary: str, runs: int, root: Path) -> tuple[list[float], list[float]]:
    cold, warm = [], []
    warm_profile = root / "warm"
    start(binary, warm_profile)[1].quit()  # used once before
    for i in range(runs):
        s, d = start(binary, root / f"cold{i}")
        d.quit()
        cold.append(s)
        s, d = start(binary, warm_profile)
        d.quit()
        warm.append(s)
    return cold, warm


def crawl(binary: str, url: str, options: dict[str, Any], profile: Path) -> tuple[dict[str, Any], LinksCrawler]:
    from selenium.webdriver.chrome.service import Service

    service = Service(CHROMEDRIVER)
    service.start()
    ctx = CrawlContext(
        site="bench",
        start_url=url,
        options=options,
        attempt=1,
        node_id="bench",
        grid_url=service.service_url,
        profile_dir=str(profile),
        chromium=binary,
        chrome_extra_args=SANDBOX,
    )
    crawler = LinksCrawler(ctx)
    peak = Peak(service.process.pid)
    try:
        result = crawler.run()
    finally:
        result_peak = peak.stop()
    crawler.service = service  # type: ignore[attr-defined]
    return {**result, "peak_rss": result_peak}, crawler


def checks(binary: str, demo: str, root: Path) -> dict[str, Any]:
    """What works with `binary`, and the peak memory of its crawls."""
    out: dict[str, Any] = {}
    plain, c1 = crawl(binary, f"{demo}/s/plain/?pages=3", {"item": "a.item", "next": "a.next"}, root / "p1")
    out["links: plain site, 3 pages"] = len(plain["items"]) == 30
    c1.driver.get(JS_PAGE)
    out["page built by JavaScript"] = len(c1.driver.find_elements("css selector", "a.item")) == 5
    out["screenshot"] = c1.driver.get_screenshot_as_png()[:8] == b"\x89PNG\r\n\x1a\n"
    ev = evidence.capture(c1.service.service_url, c1.driver.session_id)
    out["evidence: url, screenshot, html, console"] = bool(
        ev.answered and ev.screenshot and ev.html and "built by js" in str(ev.console)
    )
    c1.close()
    c1.service.stop()
    fields = {"title": "h2", "link": "a.title@href"}
    news_opts = {"item": "article.item", "next": "a.next", "max_pages": 2, "fields": fields}
    news_opts["detail"] = {"link": "link", "fields": {"body": "div.body"}}
    news, c2 = crawl(binary, f"{demo}/news/wire/p1/index.html?pages=2", news_opts, root / "p2")
    out["links: fields + detail pages"] = len(news["items"]) == 10 and all(i.get("body") for i in news["items"])
    c2.close()
    c2.service.stop()
    out["peak RSS, MB"] = max(plain["peak_rss"], news["peak_rss"]) / 2**20
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("binaries", nargs="*", default=list(BINARIES))
    args = ap.parse_args()
    rows = {}
    with DemoServer() as demo:
        for binary in args.binaries:
            root = Path(tempfile.mkdtemp(prefix="gridfleet-browsers-"))
            cold, warm = starts(binary, args.runs, root)
            rows[binary] = {
                "start cold, mean s": statistics.mean(cold),
                "start warm, mean s": statistics.mean(warm),
                **checks(binary, demo.base_url, root),
            }
    names = list(rows)
    print(f"{'':42s}" + "".join(f"{Path(b).name:>26s}" for b in names))
    for key in rows[names[0]]:
        cells = [rows[b][key] for b in names]
        text = [f"{c:26.2f}" if isinstance(c, float) else f"{('yes' if c else 'NO'):>26s}" for c in cells]
        print(f"{key:42s}" + "".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
