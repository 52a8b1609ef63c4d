"""The browser of `gridfleet crawl`: a chromedriver on a free loopback port, started as the user Chromium runs as.

Run as root, the command starts chromedriver, and so Chromium, as the crawl user (`fleet.crawl_user`), as the
embedded default's nodes start their Grid node: Chromium then keeps its sandbox. That user gets a scratch HOME of
its own and the profile for the crawl (the command gives a site's own profile back to its owner after). Run as
any other user, everything runs as that user. Where Chromium cannot have its sandbox, the nodes' rule decides
(`node.browser.sandbox_flags`): the crawl goes on with `--no-sandbox` only when `browser.allow_no_sandbox` says so,
and never with a config for AWS (one with an `aws:` section), where no node's browser runs without its sandbox: such
a config that sets it is refused before anything starts (`refuse_no_sandbox_on_aws`).

Selenium and the node's modules are imported inside the functions, so `gridfleet --help` loads none of them.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.envs.crawl_user import user_can
from cli.views.crawl import one_line
from fleet.config import BrowserConfig, Config
from fleet.errors import GridfleetError, UsageError

if TYPE_CHECKING:
    from node.grid_node import RunAs


class BrowserFailed(GridfleetError):
    """chromedriver is missing or did not start: one line, exit 1."""


@dataclass(frozen=True)
class LocalBrowser:
    """What the crawler gets: its `grid_url` (chromedriver's address) and Chromium's sandbox arguments."""

    grid_url: str
    sandbox_args: tuple[str, ...] = ()


def for_aws(config: Config) -> bool:
    """Whether `config` is one for AWS: its file has an `aws:` section (the embedded default's needs none)."""
    return "aws" in config.model_fields_set


def refuse_no_sandbox_on_aws(config: Config, path: str) -> None:
    """UsageError (exit 2) for a config for AWS that sets `browser.allow_no_sandbox`: a crawl here runs as a node
    would, and on AWS a node's browser never runs without its sandbox, whatever the setting says."""
    if config.browser.allow_no_sandbox and for_aws(config):
        raise UsageError(
            f"{path}: browser.allow_no_sandbox: true is refused with an aws: section: "
            "on AWS the browser never runs without its sandbox (it is for the embedded default only)"
        )


def browser_user(crawl_user: str, profile: Path) -> tuple[RunAs | None, str | None]:
    """(the user, None) when this root process can run Chromium as `crawl_user` on `profile`; (None, why not) when
    it cannot; (None, None) when this process is not root (Chromium runs as this user)."""
    from node.grid_node import RunAs

    if os.geteuid() != 0:
        return None, None
    try:
        user = RunAs.lookup(crawl_user)
    except KeyError:
        return None, f"there is no user {crawl_user} (fleet.crawl_user; `make setup` run as root creates it)"
    if user.uid == 0:
        return None, f"the crawl user {crawl_user} is root"
    if not user_can(pwd.getpwnam(crawl_user), "-x", profile.parent):
        return None, f"user {crawl_user} cannot reach {profile}"
    return user, None


def sandbox_args(
    browser: BrowserConfig,
    user: RunAs | None,
    why_not: str | None,
    note: Callable[[str], None],
    *,
    on_aws: bool = False,
) -> tuple[str, ...]:
    """Chromium's sandbox arguments as `user` (None: this process's), by the nodes' rule; SandboxUnavailable when
    it cannot have its sandbox and fleet.yaml does not let it go without (`on_aws`, a config for AWS: never)."""
    from node.browser import sandbox_flags, sandbox_problem

    if user is None:
        problem = sandbox_problem(os.geteuid(), os.getegid(), tuple(os.getgroups()))
    else:
        problem = sandbox_problem(user.uid, user.gid, user.groups)
    if problem is not None and why_not is not None:
        problem = f"{problem} ({why_not})"
    flags = sandbox_flags(problem, on_aws=on_aws, allow_no_sandbox=browser.allow_no_sandbox)
    if flags:
        note(f"WARNING: chromium without its sandbox (browser.allow_no_sandbox is true): {problem}")
    return flags


@contextlib.contextmanager
def _as_user(user: RunAs | None, profile: Path, note: Callable[[str], None]) -> Iterator[dict[str, Any]]:
    """Service's arguments that start chromedriver as `user`: its ids, a scratch HOME (removed after) and the
    profile its own; none for this process's user."""
    if user is None:
        yield {}
        return
    from profiles import give_to

    home = Path(tempfile.mkdtemp(prefix="gridfleet-crawl-home-"))
    try:
        os.chown(home, user.uid, user.gid)
        give_to(profile, user.uid, user.gid)
        note(f"chromium runs as {user.name} (uid {user.uid})")
        env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}  # they name this user's dirs
        env.update(HOME=str(home), USER=user.name, LOGNAME=user.name, TMPDIR=str(home))
        popen = {"user": user.uid, "group": user.gid, "extra_groups": list(user.groups), "cwd": str(home)}
        yield {"env": env, "popen_kw": popen}
    finally:
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def local_browser(
    browser: BrowserConfig, crawl_user: str, profile: Path, note: Callable[[str], None], *, on_aws: bool = False
) -> Iterator[LocalBrowser]:
    """A chromedriver on a free loopback port as the crawler's `grid_url`, run as the user Chromium may run as;
    stopped at the end. `on_aws`: the config is one for AWS (`for_aws`), whose rule for the sandbox holds here."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service

    if not os.access(browser.chromedriver, os.X_OK):
        raise BrowserFailed(
            f"no chromedriver at {browser.chromedriver}: install Debian's chromium-driver (`make setup`) "
            "or set browser.chromedriver"
        )
    user, why_not = browser_user(crawl_user, profile)
    flags = sandbox_args(browser, user, why_not, note, on_aws=on_aws)
    with _as_user(user, profile, note) as as_user:
        service = Service(executable_path=browser.chromedriver, **as_user)  # it accepts local connections only
        try:
            service.start()
        except WebDriverException as e:
            raise BrowserFailed(f"chromedriver {browser.chromedriver} did not start: {one_line(e.msg or e)}") from None
        try:
            yield LocalBrowser(f"http://127.0.0.1:{service.port}", flags)
        finally:
            service.stop()
