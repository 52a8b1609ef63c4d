"""Chromium for one crawl: its options, and closing it for sure when the crawl is cut short.

The browser runs under the Grid node (Grid node -> chromedriver -> Chromium),
not under the crawler process, so killing a hung crawler leaves it open. After
any crawl the agent kills the Chromium whose `--user-data-dir` is the site's
profile (with its helpers) and asks the Grid to end the session, freeing the
node's slot for the next site. A crawler killed while the Grid still created its
session never learnt its id: the agent then waits for that creation to end and
ends whatever session of this node runs on the profile (`settle_browser`).

Chromium keeps its sandbox on unless it cannot have it: when it would run as
root (it refuses to start there with the sandbox), or when the machine denies
the user namespaces the sandbox is built on. The node decides that once, for
the user its Grid node runs Chromium as (`sandbox_problem`). Without the sandbox
a node on AWS does not crawl at all; the embedded default crawls with
`--no-sandbox` only when fleet.yaml's `browser.allow_no_sandbox` says it may
(`sandbox_flags`, the one rule the node and `gridfleet crawl` follow).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet import procs
from fleet.errors import SandboxUnavailable
from fleet.grid_auth import GridSecret, grid_request
from node.evidence import SESSION_ID_RE

log = logging.getLogger("gridfleet.node")

#: Flags Chromium needs to run headless on a server, with no network beyond the crawl.
BASE_ARGS = (
    "--headless=new",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
)

NODE_CAPABILITY = "gridfleet:node"
LOGGING_PREFS = "goog:loggingPrefs"

#: Open a blank tab at start. A fresh profile otherwise opens the new-tab page, which waits on the
#: network, and chromedriver holds the first navigation until it settles (5-10 s seen with a few
#: browsers starting at once on two cores: long enough to look like a hang).
STARTUP_PREFS = {
    "session.restore_on_startup": 4,
    "session.startup_urls": ["about:blank"],
    "homepage": "about:blank",
    "homepage_is_newtabpage": False,
}


NO_SANDBOX = "--no-sandbox"

#: The WebDriver browserName of Chrome's headless shell. chromedriver opens the shell's first page itself only when
#: asked for it by this name (the shell opens none by itself), and the Grid node's stereotype must say the same.
HEADLESS_SHELL = "chrome-headless-shell"

#: Switches of the kernel that deny unprivileged user namespaces, with the value that denies them. Debian's
#: kernels have the second, Ubuntu's the third; a file that is absent switches nothing.
USERNS_SWITCHES = (
    ("user/max_user_namespaces", "0"),
    ("kernel/unprivileged_userns_clone", "0"),
    ("kernel/apparmor_restrict_unprivileged_userns", "1"),
)


def chrome_args(profile_dir: Path, extra: tuple[str, ...] = (), user_agent: str = "") -> list[str]:
    """Chromium's arguments for a crawl; `extra` carries `--no-sandbox` when the node found it needed, `user_agent`
    the crawl's user agent (fleet.yaml's `politeness`; "": Chromium's own)."""
    agent = [f"--user-agent={user_agent}"] if user_agent else []
    return [*BASE_ARGS, f"--user-data-dir={profile_dir}", *agent, *extra]


def sandbox_problem(
    uid: int, gid: int, groups: tuple[int, ...] = (), sysctl_dir: Path = Path("/proc/sys"), probe: bool = True
) -> str | None:
    """Why Chromium run as `uid` cannot have its sandbox, or None when it can.

    Chromium refuses to run as root with its sandbox on; elsewhere the sandbox
    needs unprivileged user namespaces. The kernel's switches are read first
    (they name the reason), then, with `probe`, `unshare --user` is run as that
    user, which also catches what no switch shows (a container's seccomp
    filter). Probing as another user than this process's needs root.
    """
    if uid == 0:
        return "Chromium would run as root, where it refuses its sandbox"
    for name, denies in USERNS_SWITCHES:
        try:
            value = (sysctl_dir / name).read_text().strip()
        except OSError:
            continue
        if value == denies:
            return f"the kernel denies unprivileged user namespaces ({name.replace('/', '.')} = {value})"
    unshare = shutil.which("unshare") if probe else None
    if unshare is None:
        return None
    other = uid != os.geteuid()
    try:
        r = subprocess.run(
            [unshare, "--user", "true"],
            capture_output=True,
            text=True,
            timeout=10,
            user=uid if other else None,
            group=gid if other else None,
            extra_groups=list(groups) if other else None,
        )
    except (OSError, subprocess.SubprocessError):
        return None  # a probe that cannot run decides nothing: the sandbox stays on
    if r.returncode != 0:
        return f"user namespaces are denied to uid {uid}: {(r.stderr or r.stdout).strip() or r.returncode}"
    return None


def sandbox_flags(problem: str | None, *, on_aws: bool, allow_no_sandbox: bool) -> tuple[str, ...]:
    """Chromium's arguments for its sandbox, given `sandbox_problem`'s answer: none when it has it; `--no-sandbox`
    when it has not and, off AWS, `browser.allow_no_sandbox` lets it go on; else SandboxUnavailable, saying why."""
    if problem is None:
        return ()
    if on_aws:
        raise SandboxUnavailable(f"Chromium cannot have its sandbox: {problem}; a node on AWS never crawls without it")
    if not allow_no_sandbox:
        raise SandboxUnavailable(
            f"Chromium cannot have its sandbox: {problem}; "
            "set browser.allow_no_sandbox: true in fleet.yaml to crawl without it on this machine"
        )
    return (NO_SANDBOX,)


def browser_name(chromium: str) -> str:
    """The browserName of the binary `chromium`: the headless shell (Chrome for Testing's `chrome-headless-shell`,
    Debian's `chromium-headless-shell`) is a browser of its own to chromedriver; any other Chromium is `chrome`."""
    return HEADLESS_SHELL if Path(chromium).name.endswith("headless-shell") else "chrome"


def capabilities(chromium: str, args: list[str], node_id: str, page_load_timeout_s: float) -> dict[str, Any]:
    return {
        "browserName": browser_name(chromium),
        "goog:chromeOptions": {"binary": chromium, "args": args, "prefs": STARTUP_PREFS},
        NODE_CAPABILITY: node_id,  # only this node's Grid slot matches: the browser runs where the profile is
        "timeouts": {"pageLoad": int(page_load_timeout_s * 1000)},
        LOGGING_PREFS: {"browser": "ALL"},  # the console, read as evidence when the attempt fails (node.evidence)
    }


def kill_browser(profile_dir: Path) -> int:
    """Kill the Chromium using `profile_dir` and its helper processes; return how many died."""
    flag = f"--user-data-dir={profile_dir}"

    def select(ps):
        return [p for p in ps if p.alive and flag in procs.cmdline(p.pid)]

    return procs.kill_tree(select, grace_s=1.0)


def end_session(grid_url: str, session_id: str, timeout_s: float = 10, secret: GridSecret | None = None) -> bool:
    """Ask the Grid to end a session (after its browser was killed, this just frees the slot)."""
    req = grid_request(f"{grid_url.rstrip('/')}/session/{session_id}", secret, method="DELETE")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return 200 <= r.status < 300
    except urllib.error.HTTPError as e:
        return e.code == 404  # already gone
    except OSError as e:
        log.debug("end-session failed session=%s error=%s", session_id, e)
        return False


#: How long a killed crawl's browser may still be starting under the Grid node before the node stops waiting.
SETTLE_S = 30.0
RESERVED = "reserved"  # the Grid's session id of a slot whose session is being created


def _grid_status(grid_url: str, timeout_s: float, secret: GridSecret | None) -> dict[str, Any] | None:
    """The Grid's `/status` document, or None when it does not answer with a JSON object (or refuses us)."""
    try:
        with urllib.request.urlopen(grid_request(f"{grid_url.rstrip('/')}/status", secret), timeout=timeout_s) as r:
            status = json.loads(r.read())
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def node_sessions(
    grid_url: str, node_id: str, timeout_s: float = 2, secret: GridSecret | None = None
) -> list[tuple[str, str | None]] | None:
    """The sessions in this node's Grid slots as (session id, Chromium's user data dir); the id is `RESERVED` while
    the session is being created. None when the Grid does not answer."""
    status = _grid_status(grid_url, timeout_s, secret)
    if status is None:
        return None
    out: list[tuple[str, str | None]] = []
    for node in status.get("value", {}).get("nodes", []):
        for slot in node.get("slots", []):
            session = slot.get("session")
            if slot.get("stereotype", {}).get(NODE_CAPABILITY) != node_id or not isinstance(session, dict):
                continue
            chrome = (session.get("capabilities") or {}).get("chrome")
            data_dir = chrome.get("userDataDir") if isinstance(chrome, dict) else None
            out.append((str(session.get("sessionId")), data_dir))
    return out


def settle_browser(
    grid_url: str,
    node_id: str,
    profile: Path,
    monotonic: Callable[[], float],
    sleep: Callable[[float], None],
    settle_s: float = SETTLE_S,
    secret: GridSecret | None = None,
) -> str | None:
    """After a crawler killed before it named its session: none of this node's sessions is still being created,
    each one on `profile` is ended, and no Chromium is left on it. Return what could not be made so, or None.

    A crawler killed while the Grid creates its session leaves the creation going: its Chromium may start after the
    kill, on the site's profile, beside the next attempt's. The agent crawls one site at a time, so a session of
    this node still being created now is that one."""
    end = monotonic() + settle_s
    while True:
        sessions = node_sessions(grid_url, node_id, secret=secret)
        if sessions is None:
            problem = "the Grid did not answer"
        else:
            for session_id, data_dir in sessions:
                if SESSION_ID_RE.fullmatch(session_id) and data_dir == str(profile):  # an id read back: checked
                    end_session(grid_url, session_id, secret=secret)
            if not any(sid == RESERVED or d == str(profile) for sid, d in sessions):
                kill_browser(profile)
                return None
            problem = "a session of this node is still being created"
        if monotonic() >= end:
            kill_browser(profile)
            return f"{problem} after {settle_s:g} s"
        sleep(0.2)


def grid_node_ready(grid_url: str, node_id: str, timeout_s: float = 2, secret: GridSecret | None = None) -> bool:
    """Whether the Grid lists an UP node whose stereotype carries `gridfleet:node=<node_id>`."""
    status = _grid_status(grid_url, timeout_s, secret)
    if status is None:
        return False
    for node in status.get("value", {}).get("nodes", []):
        if node.get("availability") != "UP":
            continue
        for slot in node.get("slots", []):
            if slot.get("stereotype", {}).get(NODE_CAPABILITY) == node_id:
                return True
    return False
