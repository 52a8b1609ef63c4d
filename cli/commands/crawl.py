"""`gridfleet crawl SITE`: one site's crawler, here and now, outside any run (as `scrapy parse` is to scrapy).

No table, queue or fleet: the site's crawler class runs in this process on `BaseCrawler`'s own runtime (its
`open`, `get_json`, `save` and status steps) with a local Chromium. Its browser is a `chromedriver` started on a
free loopback port: it speaks the protocol a Grid speaks, so the crawler's `grid_url` points at it. Items go to
stdout as JSON lines while the crawl goes; each page (URL, HTTP status, time), each checkpoint (shown, never
stored) and the end go to stderr. The crawl's `pace` is where the site's rate becomes a local pause (no fleet-wide
slot: nothing else shares it here) and where `--max-pages` stops the crawler before its next request.

A crawler project's code is imported straight from its directory (an edit shows at the next crawl), its pinned
`crawlers.requirements` from their install under `$GRIDFLEET_HOME/local/requirements/<hash>/`, made by pip once
per hash of the pins and shared with `run --local` (cli.packaging.requirements).

Run as root, chromedriver and Chromium run as the crawl user with Chromium's sandbox on, as on the nodes
(`cli.commands.crawl_browser`). The node agent, the Chromium sandbox decision and the profile store are imported
inside the functions that use them, so `gridfleet --help` loads none of them.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console

from cli.commands.crawl_browser import LocalBrowser, for_aws, local_browser, refuse_no_sandbox_on_aws
from cli.packaging.crawler_ship import project_of
from cli.views.crawl import CrawlOutput, one_line
from fleet.clock import SystemClock
from fleet.config import Config, SiteConfig
from fleet.config.load import load_config
from fleet.errors import GridfleetError, UsageError, quote

log = logging.getLogger("gridfleet")

EXAMPLE = """example:
  gridfleet crawl site-01 --config examples/demo.yaml --demo-url http://127.0.0.1:8900 --max-pages 2 \\
      --screenshot shots/ > items.jsonl

stdout: one JSON line per item. stderr: a line per page (URL, HTTP status, time), per checkpoint, and the end.
Exit codes: 0 the crawl ended, 1 the site or its crawler failed (one line), 2 bad input (one line)."""


class CrawlFailed(GridfleetError):
    """The site answered with an error, or its crawler failed: one line, exit 1."""


def _failed_as(e: BaseException, config: Config) -> str:
    """`[<class>, a fleet would retry|fail] `: how a node would class the failure and what `run.retry` says."""
    from fleet.record.failures import Failure, FailureClass, of_exception
    from node.crawler import RobotsDenied

    failure = Failure(FailureClass.ROBOTS) if isinstance(e, RobotsDenied) else of_exception(e)
    rule = config.run.retry_policy.rule(failure)
    return f"[{failure.label}, a fleet would {'retry' if rule.retry else 'fail'}] "


def judge_contract(site: str, expect: dict[str, Any], out: CrawlOutput, pages: int, stopped: bool) -> None:
    """The crawl against the site's data contract (`expect`), as a node judges its result: each broken rule on
    stderr, and CrawlFailed (exit 1) naming them. `max_drop` needs the previous run's count, which only the
    fleet has: not judged here. A crawl `--max-pages` cut short is not judged."""
    from fleet.crawl.contract import broken

    if not expect:
        return
    if stopped:
        out.note("contract: not judged (the crawl was stopped by --max-pages)")
        return
    rules = broken(out.kept, pages, expect)
    drop = ", max_drop not judged here (it needs the previous run)" if "max_drop" in expect else ""
    if not rules:
        out.note(f"contract: kept ({', '.join(k for k in expect if k != 'max_drop') or 'no rule'}{drop})")
        return
    for rule in rules:
        out.note(f"contract broken: {rule}")
    more = f", and {len(rules) - 1} more above" if len(rules) > 1 else ""
    raise CrawlFailed(f"{site}: the result breaks its contract, a node would quarantine it: {rules[0]}{more}")


# --- the command line ---------------------------------------------------------------------------------------
def _page_count(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: a whole number of pages, at least 1")
    return n


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"{value!r} is not an http(s) URL")
    return value.rstrip("/")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "crawl",
        help="run one site's crawler here and now, outside any run: items to stdout, pages to stderr",
        description=textwrap.fill(
            "Run the crawler of one site of the config in this process with a local Chromium (a scratch "
            "profile, or the site's own with --profile): no table, queue or fleet. Items are printed as JSON "
            "lines; each page's URL, HTTP status and time, each checkpoint (shown, not stored) and the end on "
            "stderr. The site's rate limit is kept as a local pause between requests.",
            width=100,
        ),
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("site", metavar="SITE", help="the id of a site of the config")
    p.add_argument("--config", default="fleet.yaml", metavar="FILE", help="fleet.yaml (default: %(default)s)")
    p.add_argument("--max-pages", type=_page_count, metavar="N", help="stop after N pages (default: the crawler's)")
    p.add_argument(
        "--screenshot", type=Path, metavar="DIR", help="keep a PNG and the HTML of each page: DIR/001.png, 001.html"
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="use the site's own Chrome profile (cookies, sessions), holding its lock while crawling",
    )
    p.add_argument(
        "--profiles-root",
        type=Path,
        metavar="DIR",
        help="where profiles/ and locks/ are (default: $GRIDFLEET_HOME/efs, the local stack's; /efs on a node)",
    )
    p.add_argument(
        "--demo-url",
        type=_http_url,
        metavar="URL",
        help="what {demo} in start_url stands for (default: the running local stack's demo server)",
    )


def cmd_crawl(args: argparse.Namespace, console: Console) -> int:
    config = load_config(args.config)
    refuse_no_sandbox_on_aws(config, args.config)
    site = _site(config, args.site, args.config)
    start_url = _start_url(site, args.demo_url, args.config)
    profiles_root = _profiles_root(args)
    shots = _screenshot_dir(args.screenshot) if args.screenshot is not None else None
    _import_path(config)
    crawler_class = _crawler_class(site, args.config)
    group_s = config.rate_limits[site.rate_limit].per_s if site.rate_limit else None
    rates = [r for r in (group_s, site.politeness.per_domain_s or config.politeness.per_domain_s) if r]
    per_s = min(rates) if rates else None  # the slower of its group's and its domain's, as a local pause
    out = CrawlOutput(sys.stdout, sys.stderr, SystemClock(), shots=shots, max_pages=args.max_pages, per_s=per_s)
    with _profile(site.id, profiles_root, out.note) as profile_dir:
        if not getattr(crawler_class, "needs_browser", True):
            return crawl_site(site, start_url, crawler_class, out, config, None, profile_dir)
        aws = for_aws(config)
        with local_browser(config.browser, config.fleet.crawl_user, profile_dir, out.note, on_aws=aws) as browser:
            return crawl_site(site, start_url, crawler_class, out, config, browser, profile_dir)


# --- what the command resolves before anything starts (bad input: exit 2) ------------------------------------
def _import_path(config: Config) -> None:
    """The team's crawlers straight from their directory (an edit shows at the next crawl), and their pinned
    requirements from the install `run --local` uses too, made once per hash of the pins (a requirement that
    neither the pins nor gridfleet provide: one line, exit 2)."""
    project = project_of(config)
    if project is None:
        return
    from cli.envs.home import gridfleet_home
    from cli.packaging import requirements

    assert config.crawlers is not None
    given = config.crawlers.requirements
    pins = requirements.install(given, requirements.requirements_root(gridfleet_home()))
    provided = requirements.dists_in(pins) if pins is not None else []
    found = requirements.unmet(requirements.declared(project), provided)
    requirements.refuse_unmet(found, f"crawler project {project.root}", given)
    sys.path[:0] = [*project.source_roots, *([str(pins)] if pins is not None else [])]


def _site(config: Config, site_id: str, path: str) -> SiteConfig:
    try:
        return config.site(site_id)
    except KeyError:
        known = ", ".join(quote(s.id, 24, bare=True) for s in config.sites[:10]) + (
            ", ..." if len(config.sites) > 10 else ""
        )
        raise UsageError(f"{path}: no site {quote(site_id)} (sites: {known})") from None


def _start_url(site: SiteConfig, demo_url: str | None, path: str) -> str:
    """The site's start_url, `{demo}` replaced by --demo-url or the running local stack's demo server."""
    if not site.uses_demo:
        return site.start_url
    base = demo_url or _local_demo_url()
    if base is None:
        raise UsageError(
            f"{path}: site {site.id}: start_url {site.start_url!r} uses {{demo}}: "
            "pass --demo-url URL or start the local stack (`gridfleet local up`)"
        )
    return site.url_for(base)


def _local_demo_url() -> str | None:
    """The demo server of the running local stack, if one runs."""
    from cli.envs.home import gridfleet_home
    from cli.envs.local import make_stack

    state = make_stack(gridfleet_home(), need_jar=False).running()
    return state.demo_url if state is not None else None


def _profiles_root(args: argparse.Namespace) -> Path | None:
    """Where the site's own profile is, with --profile (None: a scratch profile)."""
    if not args.profile:
        if args.profiles_root is not None:
            raise UsageError(f"--profiles-root {args.profiles_root}: only with --profile")
        return None
    if args.profiles_root is not None:
        return Path(args.profiles_root)
    from cli.envs.home import gridfleet_home

    return gridfleet_home() / "efs"


def _screenshot_dir(path: Path) -> Path:
    """DIR, created if missing; UsageError unless a file can be written in it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".gridfleet-probe-{uuid.uuid4().hex}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"--screenshot {path}: not a writable directory ({e.strerror or e})") from None
    return path


def _crawler_class(site: SiteConfig, path: str) -> type[Any]:
    from node.registry import load_crawler

    try:
        return load_crawler(site.crawler)
    except LookupError as e:
        raise UsageError(f"{path}: site {site.id}: {e}") from None
    except Exception as e:  # the crawler's module failed as it loaded: its own code, one line
        log.debug("loading the crawler failed site=%s", site.id, exc_info=True)
        raise CrawlFailed(f"site {site.id}: crawler {site.crawler}: {type(e).__name__}: {one_line(e)}") from None


# --- the profile and the browser (started here, stopped here, also on error or Ctrl-C) -----------------------
@contextlib.contextmanager
def _profile(site: str, root: Path | None, note: Callable[[str], None]) -> Iterator[Path]:
    """A scratch profile (removed after), or with `root` the site's own, its lock held throughout."""
    if root is None:
        with tempfile.TemporaryDirectory(prefix="gridfleet-crawl-") as scratch:
            yield Path(scratch)
        return
    from profiles import ProfileBusy, ProfileStore

    store = ProfileStore(root)
    try:
        held = store.acquire(site, timeout_s=0)
    except ProfileBusy as e:
        raise CrawlFailed(f"{e}: a node may be crawling it; try again later, or crawl without --profile") from None
    except OSError as e:
        raise UsageError(f"--profiles-root {root}: {e.strerror or e}") from None
    owner = held.path.stat()
    note(f"profile {held.path} (locked)")
    try:
        yield held.path
    finally:
        try:
            _hand_back(held.path, store.lock_path(site), (owner.st_uid, owner.st_gid))
        finally:
            held.release()


def _hand_back(profile: Path, lock_file: Path, owner: tuple[int, int]) -> None:
    """Run as root, the crawl made the profile the crawl user's (or root's, for a crawler without a browser): give
    it back to its owner, and the lock file to whoever owns the locks (a node's agent must open it again)."""
    if os.geteuid() != 0:
        return
    from profiles import give_to

    give_to(profile, *owner, walk=True)
    locks = lock_file.parent.stat()
    os.lchown(lock_file, locks.st_uid, locks.st_gid)


# --- the crawl ------------------------------------------------------------------------------------------------
def crawl_site(
    site: SiteConfig,
    start_url: str,
    crawler_class: type[Any],
    out: CrawlOutput,
    fleet_config: Config,
    browser: LocalBrowser | None,
    profile_dir: Path,
) -> int:
    """Run the site's crawler once (`browser` None: a crawler that needs none), with the fleet's user agent and
    the site's robots.txt as the nodes have them; 0 when it ended, CrawlFailed (exit 1) when it failed."""
    from node.browser import kill_browser
    from node.crawler import CrawlContext, CrawlError

    config = fleet_config.browser
    ctx = CrawlContext(
        site=site.id,
        start_url=start_url,
        options=site.options,
        attempt=1,
        node_id="crawl",
        grid_url=browser.grid_url if browser else "",
        profile_dir=str(profile_dir),
        chromium=config.chromium,
        chrome_extra_args=(*config.extra_args, *(browser.sandbox_args if browser else ())),
        page_load_timeout_s=config.page_load_timeout_s,
        emit=out.event,
        pace=out.pace,
        on_page=out.page,
        user_agent=fleet_config.politeness.agent,
        robots=site.politeness.robots,
    )
    robots = "" if site.politeness.robots else "; robots.txt ignored (politeness.robots: false)"
    out.note(f"crawl {site.id}: crawler {site.crawler}, from {start_url}, as {ctx.user_agent}{robots}")
    crawler = None
    try:
        crawler = crawler_class(ctx)
        stopped = out.run(crawler)
    except CrawlError as e:
        raise CrawlFailed(f"{site.id}: {_failed_as(e, fleet_config)}{one_line(e)}") from None
    except Exception as e:  # the crawler's own code or its browser: one line, the traceback with -v
        log.debug("crawl failed site=%s", site.id, exc_info=True)
        said = f"{type(e).__name__}: {one_line(getattr(e, 'msg', None) or e)}"
        raise CrawlFailed(f"{site.id}: {_failed_as(e, fleet_config)}{said}") from None
    finally:
        # After a Ctrl-C at a terminal chromedriver is gone too: quitting the session then needs no retry chatter.
        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
        try:
            if crawler is not None:
                crawler.close()
        except Exception:
            log.debug("closing the browser failed", exc_info=True)
        if browser is not None:
            kill_browser(profile_dir)  # a Chromium the session left behind (a crash, Ctrl-C mid-page)
    judge_contract(site.id, fleet_config.expect_of(site), out, crawler.pages, stopped)
    return 0
