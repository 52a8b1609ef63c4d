"""Crawlers without a browser, for tests of the agent with real crawler processes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from node.crawler import BaseCrawler


class QuickCrawler(BaseCrawler):
    needs_browser = False

    def crawl(self):
        for page in (1, 2):
            self.status("URL_CALL", f"{self.ctx.start_url}?page={page}")
            time.sleep(0.05)
            self.pages += 1
            self.status("CALL_DONE", f"{self.ctx.start_url}?page={page}")
        return [{"id": f"{self.ctx.site}-{i}"} for i in range(3)]


class SavingCrawler(BaseCrawler):
    """Two pages, a checkpoint after each (its items go to a part beside the result)."""

    needs_browser = False

    def crawl(self):
        for page in (1, 2):
            self.status("URL_CALL", f"{self.ctx.start_url}?page={page}")
            self.pages += 1
            self.status("CALL_DONE", f"{self.ctx.start_url}?page={page}")
            nxt = f"{self.ctx.start_url}?page={page + 1}" if page < 2 else None
            self.save(nxt, [{"id": f"{self.ctx.site}-{page}"}])
        return []


class HangCrawler(BaseCrawler):
    """Starts a helper process (as a browser would), then hangs in URL_CALL."""

    needs_browser = False

    def crawl(self):
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        Path(self.options["pid_file"]).write_text(str(helper.pid))
        self.status("URL_CALL", self.ctx.start_url)
        time.sleep(300)
        return []


class FailingCrawler(BaseCrawler):
    """A site that always answers with an error page."""

    needs_browser = False

    def crawl(self):
        from node.crawler import CrawlError

        self.status("URL_CALL", self.ctx.start_url)
        raise CrawlError(f"HTTP 500 from {self.ctx.start_url}")


class FailingInSessionCrawler(FailingCrawler):
    """An error page as a browser crawl sees it: a Grid session was reported first, so the agent asks for evidence
    (the agent's capture is the test's; no browser runs)."""

    def crawl(self):
        self.ctx.emit(event="session", id="no-browser-session")
        return super().crawl()
