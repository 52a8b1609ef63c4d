"""robots.txt and the user agent: what the crawl may fetch (`node.robots`), the checks `BaseCrawler.open` and
`get_json` make (real HTTP on loopback, a server that records each request's User-Agent), the node ending a site
whose start URL is disallowed FAILED without a retry, and the counts and flags the record, summary, status and
report show."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from protego import Protego

from cli.report.items import left_out as report_left_out
from cli.views.run import left_out, totals_line
from embedded.demo_server import ROBOTS_TXT, DemoServer
from fleet.config import PolitenessConfig
from fleet.config.load import load_config
from fleet.outputs.summary import site_entry, totals
from fleet.record import ops
from fleet.record.codec import item_to_site, site_to_item
from fleet.record.state import Attempt, Counts, Reason, RunStatus, SiteRecord, SiteSpec
from node import child
from node.browser import chrome_args
from node.crawler import BaseCrawler, CrawlContext, RobotsDenied
from node.crawlers.api import ApiCrawler
from node.robots import Fetched, Robots, fetch_robots
from sim.memory import MemoryStateTable
from tests.helpers.fake_node import RUN, Rig, status

UA = "gridfleet/9.9 (+https://ops.example/crawler)"

# --- the decision ----------------------------------------------------------------------------------------------


def robots_of(answers: dict[str, Fetched]) -> tuple[Robots, list[str], list[str]]:
    fetched: list[str] = []
    paced: list[str] = []

    def fetch(url: str) -> Fetched:
        fetched.append(url)
        return answers[url]

    return Robots(UA, fetch, lambda url: paced.append("slot"), site="s1", node="i-1", attempt=1), fetched, paced


RULES = "User-agent: gridfleet\nDisallow: /private/\n\nUser-agent: *\nDisallow: /\n"


def test_the_rules_for_the_crawls_product_token_decide_and_each_host_is_fetched_once_and_paced():
    robots, fetched, paced = robots_of({"http://a.test/robots.txt": Fetched(200, RULES)})
    assert robots.allowed("http://a.test/shop?page=2")
    assert not robots.allowed("http://a.test/private/x")
    assert robots.allowed("http://a.test/")
    assert fetched == ["http://a.test/robots.txt"] and paced == ["slot"]


@pytest.mark.parametrize("code", [401, 403, 404, 410])
def test_a_robots_txt_answering_4xx_allows_everything_quietly(code, caplog):
    robots, _, _ = robots_of({"http://a.test/robots.txt": Fetched(code, error=f"HTTP {code}")})
    with caplog.at_level(logging.WARNING, logger="gridfleet.crawler"):
        assert robots.allowed("http://a.test/private/x")
    assert not caplog.records


@pytest.mark.parametrize("answer", [Fetched(503, error="HTTP 503"), Fetched(None, error="connection refused")])
def test_a_robots_txt_that_fails_or_never_answers_allows_everything_and_says_so(answer, caplog):
    robots, _, _ = robots_of({"http://a.test/robots.txt": answer})
    with caplog.at_level(logging.WARNING, logger="gridfleet.crawler"):
        assert robots.allowed("http://a.test/private/x")
    [line] = [r.getMessage() for r in caplog.records]
    assert "robots-unavailable site=s1 node=i-1 attempt=1" in line and "http://a.test/robots.txt" in line
    assert str(answer.error) in line


# --- a real server that records the User-Agent -----------------------------------------------------------------


class Site:
    """Loopback HTTP: `robots` as /robots.txt (None: 404), JSON elsewhere; each request's (path, User-Agent)."""

    def __init__(self, robots: str | None):
        self.seen: list[tuple[str, str | None]] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                site.seen.append((self.path, self.headers.get("User-Agent")))
                if self.path == "/robots.txt":
                    code, body, kind = (
                        (404, b"", "text/plain") if robots is None else (200, robots.encode(), "text/plain")
                    )
                else:
                    code, body, kind = 200, json.dumps({"path": self.path}).encode(), "application/json"
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def site_with():
    opened: list[Site] = []

    def make(robots: str | None) -> Site:
        opened.append(Site(robots))
        return opened[-1]

    yield make
    for s in opened:
        s.close()


class TwoPages(BaseCrawler):
    """A custom crawler that reads its start page, then /private/detail and /public/next, catching nothing."""

    needs_browser = False

    def crawl(self):
        base = self.ctx.start_url.split("/public/")[0]
        yield {"id": "start", **self.get_json(self.ctx.start_url)}
        for path in ("/private/detail", "/public/next"):
            yield {"id": path, **self.get_json(base + path)}


def context(start_url: str, events: list[dict], robots: bool = True, pace=lambda url, delay: None) -> CrawlContext:
    return CrawlContext(
        site="s1",
        start_url=start_url,
        options={},
        attempt=1,
        node_id="i-1",
        grid_url="",
        profile_dir="/nonexistent",
        page_load_timeout_s=5,
        emit=lambda **e: events.append(e),
        pace=pace,
        user_agent=UA,
        robots=robots,
    )


def test_every_request_sends_the_user_agent_and_robots_txt_is_fetched_once_with_it(site_with):
    site = site_with("User-agent: *\nDisallow: /nothing\n")
    events: list[dict] = []
    result = TwoPages(context(f"{site.url}/public/start", events)).run()
    assert [i["id"] for i in result["items"]] == ["start", "/private/detail", "/public/next"]
    assert [p for p, _ in site.seen] == ["/robots.txt", "/public/start", "/private/detail", "/public/next"]
    assert {ua for _, ua in site.seen} == {UA}
    assert result["robots_skipped"] == 0


def test_a_disallowed_later_page_is_skipped_counted_and_reported_and_a_crawler_that_does_not_catch_it_ends_there(
    site_with,
):
    site = site_with("User-agent: gridfleet\nDisallow: /private/\n")
    events: list[dict] = []
    result = TwoPages(context(f"{site.url}/public/start", events)).run()
    assert [i["id"] for i in result["items"]] == ["start"]  # it stopped at the page it may not fetch
    assert "/private/detail" not in [p for p, _ in site.seen]
    assert result["robots_skipped"] == 1
    [skip] = [e for e in events if e["event"] == "robots-skipped"]
    assert skip["url"] == f"{site.url}/private/detail"


def test_a_disallowed_start_url_is_robots_denied_before_any_page_is_fetched(site_with):
    site = site_with("User-agent: *\nDisallow: /\n")
    with pytest.raises(RobotsDenied, match="robots.txt disallows the start URL .*/public/start for gridfleet/9.9"):
        TwoPages(context(f"{site.url}/public/start", [])).run()
    assert [p for p, _ in site.seen] == ["/robots.txt"]


def test_robots_false_never_asks_robots_txt(site_with):
    site = site_with("User-agent: *\nDisallow: /\n")
    result = TwoPages(context(f"{site.url}/public/start", [], robots=False)).run()
    assert len(result["items"]) == 3 and "/robots.txt" not in [p for p, _ in site.seen]


def test_a_missing_robots_txt_allows_everything(site_with):
    site = site_with(None)
    result = TwoPages(context(f"{site.url}/public/start", [])).run()
    assert len(result["items"]) == 3 and result["robots_skipped"] == 0


def test_fetch_robots_sends_the_user_agent_and_reports_each_kind_of_answer(site_with):
    site = site_with("User-agent: *\nDisallow: /x\n")
    got = fetch_robots(f"{site.url}/robots.txt", UA)
    assert (got.status, got.text) == (200, "User-agent: *\nDisallow: /x\n") and site.seen == [("/robots.txt", UA)]
    assert fetch_robots(f"{site_with(None).url}/robots.txt", UA).status == 404
    site.close()
    gone = fetch_robots(f"{site.url}/robots.txt", UA, timeout_s=2)
    assert gone.status is None and gone.error


def test_chromium_is_started_with_the_user_agent(monkeypatch):
    assert f"--user-agent={UA}" in chrome_args(Path("/p"), (), UA)
    assert not any(a.startswith("--user-agent") for a in chrome_args(Path("/p")))
    from selenium import webdriver

    seen: dict[str, Any] = {}

    class Remote:
        session_id = "sess-1"

        def __init__(self, command_executor: str, options: Any, client_config: Any) -> None:
            seen["args"] = options.arguments

    monkeypatch.setattr(webdriver, "Remote", Remote)
    _ = TwoPages(context("http://a.test/", [])).driver
    assert f"--user-agent={UA}" in seen["args"]


def test_the_default_user_agent_names_gridfleet_its_version_and_the_contact_url():
    assert PolitenessConfig(contact_url="https://ops.example/bot").agent.endswith(" (+https://ops.example/bot)")
    assert PolitenessConfig().agent.startswith("gridfleet/")
    assert PolitenessConfig(user_agent="MyBot/1.0").agent == "MyBot/1.0"


# --- the demo server -----------------------------------------------------------------------------------------


def test_the_demo_robots_txt_allows_the_demo_sites_and_denies_the_robots_sites():
    rules = Protego.parse(ROBOTS_TXT.decode())
    config = load_config("examples/demo.yaml")
    base = "http://127.0.0.1:8900"
    urls = {s.id: s.url_for(base) for s in config.sites}
    denied = [site for site, u in urls.items() if not rules.can_fetch(u, UA)]
    assert len(urls) >= 80 and denied == ["robots-denied"]  # the demo's one site robots.txt is built to deny
    assert not rules.can_fetch(f"{base}/s/robots-denied/?pages=2", UA)
    assert not rules.can_fetch(f"{base}/api/robots-denied?pages=2", UA)
    assert rules.can_fetch(f"{base}/s/robots-later/?pages=3", UA)
    assert not rules.can_fetch(f"{base}/s/robots-later/?pages=3&page=2", UA)


def test_the_api_crawler_of_the_demos_denied_site_is_robots_denied_and_the_crawler_process_says_robots(monkeypatch):
    with DemoServer() as demo:
        url = f"{demo.base_url}/api/robots-denied?pages=2"
        with pytest.raises(RobotsDenied):
            ApiCrawler(context(url, [])).run()
        assert "robots-denied" not in demo.stats()["sites"]
        job = {"site": "s1", "start_url": url, "crawler": "api", "attempt": 1, "node_id": "i-1", "grid_url": ""}
        job.update(profile_dir="/nonexistent", user_agent=UA)
        read, write = os.pipe()
        monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(job)))
        assert child.main(["--event-fd", str(write)]) == 1
        with os.fdopen(read, encoding="utf-8") as r:
            events = [json.loads(line) for line in r]
    [err] = [e for e in events if e["event"] == "error"]
    assert err["kind"] == "robots" and "robots.txt disallows the start URL" in err["message"]


# --- the node and the record ---------------------------------------------------------------------------------


def test_a_disallowed_start_url_ends_the_site_failed_robots_with_no_retry(tmp_path):
    denied = [
        (0.5, status("RUNNING")),
        (1.0, {"event": "error", "kind": "robots", "message": "robots.txt disallows the start URL http://x.test/"}),
    ]
    rig = Rig(tmp_path, [denied])
    rig.seed()
    rig.agent.run()
    rec = rig.site()
    assert (rec.run_status, rec.failure_reason, rec.attempt) == (RunStatus.FAILED, "robots", 1)
    assert "robots.txt disallows the start URL" in (rec.error or "")
    assert [a.outcome for a in rec.attempts] == ["robots"] and len(rig.crawls) == 1


def test_a_later_page_skipped_is_counted_on_the_attempt(tmp_path):
    script = [
        (0.5, status("RUNNING")),
        (0.6, {"event": "robots-skipped", "url": "http://x.test/private", "robots_skipped": 1}),
        (1.0, {"event": "result", "items": [{"id": "a"}], "pages": 1, "robots_skipped": 1}),
    ]
    rig = Rig(tmp_path, [script])
    rig.seed()
    rig.agent.run()
    rec = rig.site()
    assert rec.run_status is RunStatus.COMPLETED and rec.attempts[0].counts.robots_skipped == 1


def test_end_attempt_fails_a_robots_end_at_once_and_an_error_is_still_retried():
    table = MemoryStateTable()
    for reason, expected in ((Reason.ROBOTS, RunStatus.FAILED), (Reason.ERROR, RunStatus.QUEUED)):
        rec = ops.new_site(RUN, f"s-{reason}", SiteSpec("http://x.test/"), None)
        table.create_site(rec)
        rec = ops.claim(table, rec, "i-1", 1.0)
        new = ops.end_attempt(table, rec, reason=reason, now=2.0, max_attempts=3, spot_cap=3)
        assert (new.run_status, new.failure_reason, new.attempt) == (expected, str(reason), 1)


def record(robots: bool = True, skipped: int = 0) -> SiteRecord:
    counts = Counts(items=3, pages=2, robots_skipped=skipped)
    spec = SiteSpec("http://x.test/", robots=robots)
    return SiteRecord(
        RUN, "s1", spec, RunStatus.COMPLETED, attempts=(Attempt(1, "i-1", 0.0, 1.0, "completed", None, counts),)
    )


def test_the_record_keeps_the_sites_robots_flag_and_the_attempts_robots_skipped():
    back = item_to_site(site_to_item(record(robots=False, skipped=4)))
    assert back.spec.robots is False and back.attempts[0].counts == Counts(3, 2, robots_skipped=4)
    assert item_to_site(site_to_item(record())).spec.robots is True


def test_summary_status_and_report_show_pages_skipped_and_a_site_whose_robots_txt_is_ignored():
    skipped, ignored = site_entry(record(skipped=4)), site_entry(record(robots=False))
    assert skipped["attempts"][0]["robots_skipped"] == 4 and skipped["robots"] is True and ignored["robots"] is False
    assert totals({"a": skipped, "b": ignored})["robots_skipped"] == 4
    assert left_out(skipped) == "4 pages robots.txt disallows" and left_out(ignored) == "robots.txt ignored"
    assert "4 pages robots.txt disallows" in totals_line({"a": skipped})
    assert report_left_out(skipped)["robots_skipped"] == 4 and report_left_out(ignored)["robots_ignored"]
