"""`gridfleet crawl SITE` through the real command line, in this process: bad input (one line, exit 2), the
output (items as JSON lines on stdout, a line per page and per checkpoint on stderr), `--max-pages`, the site's
rate as a local pause, errors (one line, exit 1) and the site's own profile under its lock.

Sites are crawled without a browser: the `api` crawler against the real demo server on 127.0.0.1, and two
crawlers of this module by dotted path, as a user's crawler is named. The browser's part (chromedriver,
Chromium, screenshots) is the e2e test's (tests/e2e/test_crawl_cmd.py).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cli.main import main
from cli.views.crawl import CrawlOutput, Enough
from embedded.demo_server import DemoServer
from fleet.clock import FakeClock
from node import browser
from node.crawler import BaseCrawler

API_OPTIONS = "{items: items, next: next, token_param: token}"


class SavedAtTheEndCrawler(BaseCrawler):
    """Reports its pages by status steps alone (no open()/get_json()), saves a checkpoint per page, and returns
    its items only at the end, as a crawler may."""

    needs_browser = False

    def crawl(self):
        items = []
        for page in (1, 2, 3):
            self.pace()
            url = f"{self.ctx.start_url}?page={page}"
            self.status("URL_CALL", url)
            self.pages += 1
            self.status("CALL_DONE", url)
            new = [{"id": f"{page}-{i}"} for i in range(2)]
            items += new
            self.save(f"{self.ctx.start_url}?page={page + 1}" if page < 3 else None, new)
        return items


class SharedIdCrawler(BaseCrawler):
    """Three functions documented on one page, each found by that page's link; one entry without a link."""

    needs_browser = False

    def crawl(self):
        self.pace()
        found = [{"id": "http://a.test/str", "name": f"fn{i}"} for i in range(3)] + [{"id": None, "name": "orphan"}]
        items, _ = self.fresh(found)
        self.save(None, items)
        return items


class ProfileWriterCrawler(BaseCrawler):
    """Leaves a file in its profile, as Chromium does."""

    needs_browser = False

    def crawl(self):
        (Path(self.ctx.profile_dir) / "Cookies").write_text("made by this crawl")
        return [{"id": "1"}]


class BrowserArgsCrawler(BaseCrawler):
    """Asks for a browser (so chromedriver starts, as the user Chromium would run as) and hands out, as its one
    item, the arguments Chromium would get, without starting it."""

    def crawl(self):
        return [{"id": "args", "args": list(self.ctx.chrome_extra_args)}]


class BrokenCrawler(BaseCrawler):
    needs_browser = False

    def crawl(self):
        raise ValueError("the selector broke\n  at line 7 of some stack")


@pytest.fixture
def demo():
    with DemoServer() as server:
        yield server


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """`gridfleet ARGV` in this process: (exit code, stdout, stderr)."""
    monkeypatch.setenv("GRIDFLEET_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as e:  # argparse's own errors
            code = e.code if isinstance(e.code, int) else 1
        finally:
            root.handlers[:], root.level = handlers, level
        out, err = capsys.readouterr()
        return code, out, err

    return run


def write_config(tmp_path, sites: str, extra: str = "") -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(textwrap.dedent(extra) + "sites:\n" + textwrap.dedent(sites))
    return str(path)


def page_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("page ")]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["crawl", "nope"], "{F}: no site 'nope' (sites: shop, demo)"),
        (["crawl", "shop", "--max-pages", "0"], "argument --max-pages: '0': a whole number of pages, at least 1"),
        (["crawl", "shop", "--max-pages", "two"], "argument --max-pages: 'two': a whole number of pages"),
        (["crawl", "demo"], "{F}: site demo: start_url '{demo}/s/x/' uses {demo}: pass --demo-url URL or start"),
        (["crawl", "demo", "--demo-url", "ftp://x"], "argument --demo-url: 'ftp://x' is not an http(s) URL"),
        (["crawl", "shop", "--screenshot", "{F}/shots"], "--screenshot {F}/shots: not a writable directory"),
        (["crawl", "shop", "--profiles-root", "/tmp"], "--profiles-root /tmp: only with --profile"),
    ],
)
def test_bad_input_is_one_line_naming_what_and_where_exit_2(tmp_path, cli, argv, expected):
    sites = '- {id: shop, start_url: "http://a.test/"}\n- {id: demo, start_url: "{demo}/s/x/"}\n'
    config = write_config(tmp_path, sites)
    code, out, err = cli(*[a.replace("{F}", config) for a in argv], "--config", config)
    lines = err.splitlines()
    said = lines[next((i for i, line in enumerate(lines) if "error:" in line), 0) :]  # after argparse's usage
    assert code == 2, err
    assert len(said) == 1 and expected.replace("{F}", config) in said[0], err
    assert out == "" and "Traceback" not in err


def test_a_bad_config_is_its_own_one_line_exit_2(tmp_path, cli):
    config = write_config(tmp_path, "- {id: shop, start_url: http://a.test/, options: {max_pages: -5}}\n")
    code, out, err = cli("crawl", "shop", "--config", config)
    assert code == 2 and out == ""
    assert err.splitlines() == [
        f"gridfleet: error: {config}:2: sites[0].options.max_pages: Input should be greater than or equal to 1"
    ]


def test_items_go_to_stdout_as_json_lines_and_each_page_and_checkpoint_to_stderr(tmp_path, cli, demo):
    url = f"{demo.base_url}/api/shop?pages=3&per_page=5"
    config = write_config(tmp_path, f'- {{id: shop, start_url: "{url}", crawler: api, options: {API_OPTIONS}}}\n')

    code, out, err = cli("crawl", "shop", "--config", config)

    assert code == 0, err
    items = [json.loads(line) for line in out.splitlines()]
    assert [i["id"] for i in items] == [f"shop-{p}-{i}" for p in (1, 2, 3) for i in range(1, 6)]
    pages = page_lines(err)
    assert len(pages) == 3 and all(": HTTP 200 in " in line for line in pages), err
    assert pages[0].startswith("page 1: HTTP 200") and pages[0].endswith(f": {url}")
    assert "token=" in pages[1] and pages[2].startswith("page 3:")
    checkpoints = [line for line in err.splitlines() if line.startswith("checkpoint after page")]
    assert len(checkpoints) == 3 and checkpoints[-1].endswith("5 new items, next none (the end)")
    assert err.splitlines()[-1].startswith("done: 15 items from 3 pages in ")


def test_max_pages_stops_the_crawler_before_its_next_request(tmp_path, cli, demo):
    url = f"{demo.base_url}/api/shop?pages=5&per_page=5"
    config = write_config(tmp_path, f'- {{id: shop, start_url: "{url}", crawler: api, options: {API_OPTIONS}}}\n')

    code, out, err = cli("crawl", "shop", "--config", config, "--max-pages", "2")

    assert code == 0, err
    assert len(out.splitlines()) == 10 and len(page_lines(err)) == 2
    assert err.splitlines()[-1].endswith("stopped after --max-pages 2")
    assert demo.stats()["sites"]["shop"]["hits"] == {"1": 1, "2": 1}  # page 3 never asked for


def test_a_crawler_that_hands_out_its_items_at_the_end_still_prints_the_pages_done_when_stopped(tmp_path, cli):
    crawler = f"{__name__}:SavedAtTheEndCrawler"
    config = write_config(tmp_path, f'- {{id: own, start_url: "http://a.test/", crawler: "{crawler}"}}\n')

    code, out, err = cli("crawl", "own", "--config", config, "--max-pages", "2")

    assert code == 0, err
    assert [json.loads(line)["id"] for line in out.splitlines()] == ["1-0", "1-1", "2-0", "2-1"]
    pages = page_lines(err)  # no status to show: the crawler fetched nothing through the runtime
    assert (
        len(pages) == 2 and pages[0].startswith("page 1: HTTP - in ") and pages[0].endswith(": http://a.test/?page=1")
    )


def test_items_left_out_are_shown_and_counted_at_the_end(tmp_path, cli):
    crawler = f"{__name__}:SharedIdCrawler"
    config = write_config(tmp_path, f'- {{id: own, start_url: "http://a.test/", crawler: "{crawler}"}}\n')

    code, out, err = cli("crawl", "own", "--config", config)

    assert code == 0, err
    assert [json.loads(line)["name"] for line in out.splitlines()] == ["fn0"]
    said = err.splitlines()
    assert said[-4:-1] == [
        'collision: id \'http://a.test/str\': kept {"id": "http://a.test/str", "name": "fn0"}, '
        'dropped {"id": "http://a.test/str", "name": "fn1"}',
        'collision: id \'http://a.test/str\': kept {"id": "http://a.test/str", "name": "fn0"}, '
        'dropped {"id": "http://a.test/str", "name": "fn2"}',
        'skipped 1 items with no id (first: {"id": null, "name": "orphan"})',
    ]
    assert said[-1].startswith("done: 1 items from 0 pages in ")
    assert said[-1].endswith("; left out: 2 collisions, 1 skipped (no id)")


def test_a_crawl_that_breaks_its_sites_contract_names_each_broken_rule_and_exits_1(tmp_path, cli, demo):
    url = f"{demo.base_url}/api/shop?pages=3&per_page=5"  # 15 items {id, title} on 3 pages
    schema = '{type: object, required: [price], properties: {title: {type: string, pattern: "^Item "}}}'
    sites = f'''- {{id: shop, start_url: "{url}", crawler: api, options: {API_OPTIONS},
               expect: {{min_items: 20, max_drop: 0.5, fields: {schema}}}}}\n'''
    config = write_config(tmp_path, sites, "run: {expect: {min_pages: 4}}\n")

    code, out, err = cli("crawl", "shop", "--config", config)

    assert code == 1 and len(out.splitlines()) == 15  # the items are printed all the same
    broken = [line.removeprefix("contract broken: ") for line in err.splitlines() if line.startswith("contract ")]
    assert broken[:2] == ["min_items: 15 items < 20", "min_pages: 3 pages < 4"], err
    assert broken[2] == "fields: item 0 (\"shop-1-1\"): 'price' is a required property"
    assert len(broken) == 8 and broken[-1] == "fields: 10 more items break it"  # 5 items named, the rest counted
    assert err.splitlines()[-1] == (
        "gridfleet: error: shop: the result breaks its contract, a node would quarantine it: "
        "min_items: 15 items < 20, and 7 more above"
    )


def test_a_crawl_that_keeps_its_contract_says_so_and_one_cut_short_is_not_judged(tmp_path, cli, demo):
    url = f"{demo.base_url}/api/shop?pages=3&per_page=5"
    sites = f'- {{id: shop, start_url: "{url}", crawler: api, options: {API_OPTIONS}, expect: {{min_items: 15}}}}\n'
    config = write_config(tmp_path, sites, "run: {expect: {min_pages: 3, max_drop: 0.5}}\n")

    code, _, err = cli("crawl", "shop", "--config", config)
    assert code == 0, err
    assert "contract: kept (min_pages, min_items, max_drop not judged here (it needs the previous run))" in err

    code, _, err = cli("crawl", "shop", "--config", config, "--max-pages", "1")
    assert code == 0 and "contract: not judged (the crawl was stopped by --max-pages)" in err


def test_an_http_error_ends_the_crawl_with_one_line_and_exit_1(tmp_path, cli, demo):
    url = f"{demo.base_url}/api/shop?pages=3&fail_attempts=99"
    config = write_config(tmp_path, f'- {{id: shop, start_url: "{url}", crawler: api, options: {API_OPTIONS}}}\n')

    code, out, err = cli("crawl", "shop", "--config", config)

    assert code == 1 and out == ""
    pages = page_lines(err)
    assert len(pages) == 1 and pages[0].startswith("page 1: HTTP 500 in "), err
    assert err.splitlines()[-1] == f"gridfleet: error: shop: [http_5xx 500, a fleet would retry] HTTP 500 from {url}"
    assert "Traceback" not in err


def test_a_crawler_bug_is_one_line_and_exit_1_its_traceback_only_with_verbose(tmp_path, cli):
    crawler = f"{__name__}:BrokenCrawler"
    config = write_config(tmp_path, f'- {{id: own, start_url: "http://a.test/", crawler: "{crawler}"}}\n')

    code, out, err = cli("crawl", "own", "--config", config)

    assert code == 1 and out == ""
    assert err.splitlines()[-1] == "gridfleet: error: own: [error, a fleet would retry] ValueError: the selector broke"
    assert "Traceback" not in err
    for verbose in (["-v", "crawl", "own"], ["crawl", "-v", "own"], ["crawl", "own", "--verbose"]):
        code, out, err = cli(*verbose, "--config", config)  # -v before the command or after it: the same
        assert code == 1 and out == "", verbose
        assert "Traceback (most recent call last)" in err and "in crawl" in err, verbose  # the debug log
        assert (
            err.splitlines()[-1] == "gridfleet: error: own: [error, a fleet would retry] ValueError: the selector broke"
        )


def test_the_sites_rate_is_kept_as_a_pause_between_its_requests(tmp_path, cli, demo):
    url = f"{demo.base_url}/api/shop?pages=3&per_page=5"
    sites = f'- {{id: shop, start_url: "{url}", crawler: api, rate_limit: g, options: {API_OPTIONS}}}\n'
    config = write_config(tmp_path, sites, "rate_limits: {g: {per_s: 10}}\n")

    code, _, err = cli("crawl", "shop", "--config", config)

    assert code == 0, err
    # The server's clock, not the crawl's: a busy machine delays one request more than the next on its way, so
    # the gaps it sees are the 0.11 s pause give or take that. Exact pacing is judged on an injected clock below;
    # here each gap shows a pause (without one, requests to this server come milliseconds apart).
    times = demo.stats()["sites"]["shop"]["times"]
    assert len(times) == 3 and all(b - a >= 0.05 for a, b in zip(times, times[1:], strict=False)), times


def test_pace_waits_out_the_gap_on_the_clock_it_is_given_and_stops_after_max_pages():
    clock = FakeClock()
    out = CrawlOutput(sys.stdout, sys.stderr, clock, max_pages=2, per_s=2)
    start = clock.monotonic()
    out.pace("http://a.test/1")
    assert clock.monotonic() == start  # the first request waits for nothing
    out.pace("http://a.test/2")
    assert clock.monotonic() - start == pytest.approx(0.55)  # 1.1 / per_s, as the fleet paces a group
    out.pages = 2
    with pytest.raises(Enough):
        out.pace("http://a.test/3")


def test_the_sites_own_profile_is_used_under_its_lock_and_refused_while_another_process_holds_it(tmp_path, cli, demo):
    url = f"{demo.base_url}/api/shop?pages=1"
    config = write_config(tmp_path, f'- {{id: shop, start_url: "{url}", crawler: api, options: {API_OPTIONS}}}\n')
    root = tmp_path / "efs"

    code, _, err = cli("crawl", "shop", "--config", config, "--profile", "--profiles-root", str(root))
    assert code == 0, err
    assert f"profile {root}/profiles/shop (locked)" in err and (root / "locks" / "shop.lock").exists()

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from profiles import ProfileStore; "
            f"held = ProfileStore({str(root)!r}).acquire('shop', 5); print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code, out, err = cli("crawl", "shop", "--config", config, "--profile", "--profiles-root", str(root))
    finally:
        holder.communicate("", timeout=10)
    assert code == 1 and out == ""
    assert err.splitlines()[-1].startswith("gridfleet: error: profile of site 'shop' is locked by another process")

    code, _, err = cli("crawl", "shop", "--config", config, "--profile", "--profiles-root", str(root))
    assert code == 0, err  # the lock was let go at the end of the first crawl, and by the holder


def test_help_explains_with_an_example(cli):
    code, out, _ = cli("crawl", "--help")
    assert code == 0
    assert "example:" in out and "gridfleet crawl site-01 --config" in out and "--max-pages N" in out


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another user needs root")
def test_a_root_crawl_gives_back_what_it_made_in_the_crawl_users_profile_and_the_lock_file(tmp_path, cli):
    crawler = f"{__name__}:ProfileWriterCrawler"
    config = write_config(tmp_path, f'- {{id: own, start_url: "http://a.test/", crawler: "{crawler}"}}\n')
    root = tmp_path / "efs"
    for d in (root / "profiles" / "own", root / "locks"):
        d.mkdir(parents=True)
        os.chown(d, 2000, 2000)  # as a node's store leaves them for its crawl user

    code, _, err = cli("crawl", "own", "--config", config, "--profile", "--profiles-root", str(root))

    assert code == 0, err
    made = root / "profiles" / "own" / "Cookies"
    assert made.read_text() == "made by this crawl"
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in (made, made.parent, root / "locks" / "own.lock")}
    assert owners == {(2000, 2000)}


@pytest.mark.parametrize("allow", [False, True])
def test_where_chromium_cannot_have_its_sandbox_the_crawl_goes_on_only_when_fleet_yaml_allows_it(
    tmp_path, cli, monkeypatch, allow
):
    """The seam: `node.browser.sandbox_problem`, the one probe of the sandbox, says it is unavailable. A real
    chromedriver starts when the crawl may go on; no Chromium does."""
    monkeypatch.setattr(browser, "sandbox_problem", lambda *a, **k: "the kernel denies it (injected)")
    crawler = f"{__name__}:BrowserArgsCrawler"
    config = write_config(
        tmp_path,
        f'- {{id: b, start_url: "http://b.test/", crawler: "{crawler}"}}\n',
        f"browser: {{allow_no_sandbox: {str(allow).lower()}, extra_args: [--lang=ko]}}\n",
    )
    code, out, err = cli("crawl", "b", "--config", config)
    if not allow:
        assert (code, out) == (1, "")
        assert err.splitlines() == [
            "gridfleet: error: Chromium cannot have its sandbox: the kernel denies it (injected); "
            "set browser.allow_no_sandbox: true in fleet.yaml to crawl without it on this machine"
        ]
        return
    assert code == 0, err
    assert [json.loads(line)["args"] for line in out.splitlines()] == [["--lang=ko", "--no-sandbox"]]
    warning = "WARNING: chromium without its sandbox (browser.allow_no_sandbox is true): the kernel denies it"
    assert sum(line.startswith(warning) for line in err.splitlines()) == 1, err


@pytest.mark.parametrize("sandbox", ["available", "unavailable"])
def test_allow_no_sandbox_with_an_aws_section_is_refused_before_anything_starts(tmp_path, cli, monkeypatch, sandbox):
    """On AWS the browser never runs without its sandbox: a config for AWS that allows it is refused in one line
    naming the setting, whether or not Chromium could have its sandbox here. The seam: `sandbox_problem`."""
    problem = None if sandbox == "available" else "the kernel denies it (injected)"
    monkeypatch.setattr(browser, "sandbox_problem", lambda *a, **k: problem)
    crawler = f"{__name__}:BrowserArgsCrawler"
    config = write_config(
        tmp_path,
        f'- {{id: b, start_url: "http://b.test/", crawler: "{crawler}"}}\n',
        "aws: {region: ap-northeast-2}\nbrowser: {allow_no_sandbox: true}\n",
    )
    code, out, err = cli("crawl", "b", "--config", config)
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"gridfleet: error: {config}: browser.allow_no_sandbox: true is refused with an aws: section: "
        "on AWS the browser never runs without its sandbox (it is for the embedded default only)"
    ]


def test_with_an_aws_section_a_chromium_without_its_sandbox_is_refused_as_a_node_on_aws_refuses_it(
    tmp_path, cli, monkeypatch
):
    """The nodes' rule on AWS, not the embedded default's: the line does not tell to set allow_no_sandbox."""
    monkeypatch.setattr(browser, "sandbox_problem", lambda *a, **k: "the kernel denies it (injected)")
    crawler = f"{__name__}:BrowserArgsCrawler"
    config = write_config(tmp_path, f'- {{id: b, start_url: "http://b.test/", crawler: "{crawler}"}}\n', "aws: {}\n")
    code, out, err = cli("crawl", "b", "--config", config)
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "gridfleet: error: Chromium cannot have its sandbox: the kernel denies it (injected); "
        "a node on AWS never crawls without it"
    ]
