"""Evidence of an attempt that ended badly: what its browser showed, read over WebDriver before it is closed.

When an attempt ends as an error, a hang or a kill (the hub's or the node's),
its crawler process is already gone but its browser still runs under the Grid
node until the agent's cleanup kills it. In between, the agent asks the Grid
for the session's last URL, a screenshot, the page's HTML and the browser's
console log: plain WebDriver HTTP calls, so one path covers all three ends
whatever the crawler was doing. A hung page usually keeps chromedriver busy
with its navigation, so WebDriver does not answer: after `FIRST_ANSWER_S` of
silence the screenshot (and the URL being loaded) is read over the Chrome
DevTools protocol instead (node.devtools, the Grid's `se/cdp` endpoint of the
session, which does not go through chromedriver), and the record says what
WebDriver did not answer (`answered: false` and why) and where the screenshot
came from (`screenshot_from`).

Everything is bounded: the calls share one time budget (`CAPTURE_BUDGET_S`),
each a plain HTTP or websocket timeout of what is left of it; a response is
read up to `MAX_RESPONSE_BYTES`; the HTML and the console are capped before
they are kept.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleet.grid_auth import GridSecret, grid_request
from fleet.outputs.results import EVIDENCE_TYPES, ResultStore, evidence_key
from fleet.protocol import CrawlEndKind

#: The time all calls of one capture share; the attempt's kill never waits for it (the crawler is killed first).
CAPTURE_BUDGET_S = 5.0
#: How long the first WebDriver call may take before chromedriver is taken for busy (a hung navigation) and the
#: rest of the budget goes to the screenshot over DevTools. A browser that answers does so in milliseconds.
FIRST_ANSWER_S = 2.5
#: A WebDriver response read beyond this is dropped (a screenshot of a huge viewport, a page of many MB).
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
#: The page's HTML kept, in characters (the rest is cut, and the record says so).
HTML_MAX_CHARS = 1_000_000
#: Console entries kept (the last ones) and the length kept of each message.
CONSOLE_MAX_ENTRIES = 200
CONSOLE_MESSAGE_MAX_CHARS = 2_000
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: A WebDriver session id as the Grid makes them (a UUID, or chromedriver's hex): nothing that reshapes a URL.
SESSION_ID_RE = re.compile(r"[A-Za-z0-9-]{1,128}")

#: The files of an evidence record, with their content types (`fleet.outputs.results.EVIDENCE_TYPES`: the page's own
#: HTML is kept as text, never served as a page).
SCREENSHOT, HTML, CONSOLE, RECORD = "screenshot.png", "page.html", "console.json", "evidence.json"
CONTENT_TYPES = EVIDENCE_TYPES


class NoAnswer(Exception):
    """The browser (or its Grid) did not answer in time, or not at all; args[0] says how."""


class Busy(NoAnswer):
    """No answer within the call's timeout: chromedriver (or the Grid) is there but busy."""


@dataclass
class Evidence:
    answered: bool
    why: str | None = None  # when not answered: why
    url: str | None = None
    screenshot: bytes | None = None
    html: str | None = None
    console: list[dict[str, Any]] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)  # what was cut or dropped to stay bounded
    elapsed_s: float = 0.0
    screenshot_from: str | None = None  # "webdriver", or "devtools" when WebDriver did not answer

    def files(self, meta: dict[str, Any]) -> dict[str, tuple[bytes, str]]:
        """name -> (body, content type): the record (`meta` plus what was captured) and what was captured."""
        out: dict[str, tuple[bytes, str]] = {}
        if self.screenshot is not None:
            out[SCREENSHOT] = (self.screenshot, CONTENT_TYPES[SCREENSHOT])
        if self.html is not None:
            out[HTML] = (self.html.encode("utf-8", "replace"), CONTENT_TYPES[HTML])
        if self.answered:
            out[CONSOLE] = (json.dumps(self.console, indent=1).encode(), CONTENT_TYPES[CONSOLE])
        record = {
            **meta,
            "answered": self.answered,
            "why": self.why,
            "url": self.url,
            "screenshot_from": self.screenshot_from if self.screenshot is not None else None,
            "files": sorted(out),
            "truncated": self.truncated,
            "console_entries": len(self.console),
            "elapsed_s": round(self.elapsed_s, 3),
        }
        out[RECORD] = (json.dumps(record, indent=1).encode(), CONTENT_TYPES[RECORD])
        return out


def cap_html(html: str, limit: int = HTML_MAX_CHARS) -> tuple[str, bool]:
    """The HTML as kept, and whether it was cut."""
    return (html, False) if len(html) <= limit else (html[:limit], True)


def cap_console(entries: object, limit: int = CONSOLE_MAX_ENTRIES) -> tuple[list[dict[str, Any]], bool]:
    """The last `limit` console entries as {level, message, timestamp}, each message capped; and whether cut."""
    if not isinstance(entries, list):
        return [], False
    kept = []
    for e in entries[-limit:]:
        if not isinstance(e, dict):
            continue
        kept.append(
            {
                "level": str(e.get("level", ""))[:20],
                "message": str(e.get("message", ""))[:CONSOLE_MESSAGE_MAX_CHARS],
                "timestamp": e.get("timestamp") if isinstance(e.get("timestamp"), (int, float)) else None,
            }
        )
    return kept, len(entries) > limit


def png_of(value: object) -> bytes | None:
    """The screenshot's bytes from WebDriver's base64 answer, if they are a PNG."""
    if not isinstance(value, str):
        return None
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return data if data.startswith(PNG_MAGIC) else None


class _Session:
    """WebDriver calls on one session, each with the time left of a shared budget as its HTTP timeout."""

    def __init__(
        self,
        grid_url: str,
        session_id: str,
        budget_s: float,
        monotonic: Callable[[], float],
        secret: GridSecret | None = None,
    ):
        self.base = f"{grid_url.rstrip('/')}/session/{session_id}"
        self.secret = secret
        self.monotonic = monotonic
        self.start = monotonic()
        self.deadline = self.start + budget_s

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, within: float | None = None) -> Any:
        """The call's WebDriver value, waited for at most what is left of the budget (and at most `within`)."""
        left = self.deadline - self.monotonic()
        if left <= 0:
            raise NoAnswer("the capture's time budget is spent")
        if within is not None:
            left = min(left, within)
        data = None if body is None else json.dumps(body).encode()
        req = grid_request(f"{self.base}/{path}", self.secret, method=method, data=data)
        req.add_header("Content-Type", "application/json; charset=utf-8")
        try:
            with urllib.request.urlopen(req, timeout=left) as r:  # noqa: S310 - the Grid's http URL
                raw = r.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as e:  # WebDriver's error (no such session, unknown command): no value
            raise ValueError(f"{path}: HTTP {e.code}") from None
        except TimeoutError:
            raise Busy(f"no answer to {path} within {left:.1f} s") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, TimeoutError):
                raise Busy(f"no answer to {path} within {left:.1f} s") from None
            raise NoAnswer(f"{path}: {reason}") from None
        if len(raw) > MAX_RESPONSE_BYTES:
            raise ValueError(f"{path}: answer over {MAX_RESPONSE_BYTES} bytes")
        try:
            return json.loads(raw)["value"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{path}: not a WebDriver answer") from None


def capture(
    grid_url: str,
    session_id: str,
    budget_s: float = CAPTURE_BUDGET_S,
    monotonic: Callable[[], float] = time.monotonic,
    secret: GridSecret | None = None,
) -> Evidence:
    """What the session's browser shows now, within `budget_s` in all; never raises for what the browser does."""
    if not SESSION_ID_RE.fullmatch(session_id):
        return Evidence(answered=False, why=f"{session_id[:80]!r} is not a WebDriver session id")
    s = _Session(grid_url, session_id, budget_s, monotonic, secret)
    ev = Evidence(answered=False)
    try:
        url = s.call("GET", "url", within=FIRST_ANSWER_S)
        ev.answered, ev.url = True, url if isinstance(url, str) else None
        _read_rest(s, ev)
    except Busy as e:  # chromedriver waits on the page: the browser itself still answers DevTools
        ev.why = str(e.args[0])
        _devtools_screenshot(grid_url, session_id, s, ev)
    except NoAnswer as e:
        ev.why = str(e.args[0])
    except ValueError as e:  # the first call answered with an error: the session is gone
        ev.why = f"the session did not answer: {e}"
    ev.elapsed_s = monotonic() - s.start
    return ev


def _devtools_screenshot(grid_url: str, session_id: str, s: _Session, ev: Evidence) -> None:
    """The screenshot and the URL being loaded, over DevTools, within what is left of the budget; a failure is
    noted beside why WebDriver did not answer."""
    from node import devtools

    try:
        ev.screenshot, url = devtools.screenshot(
            grid_url, session_id, s.deadline, s.monotonic, s.secret, max_bytes=MAX_RESPONSE_BYTES
        )
    except devtools.DevToolsFailed as e:
        ev.truncated.append(f"screenshot over DevTools: {e.args[0]}")
        return
    ev.screenshot_from, ev.url = "devtools", url


def _read_rest(s: _Session, ev: Evidence) -> None:
    """The screenshot, the HTML and the console, each as far as it comes; a part that fails is noted and skipped."""
    for part in (SCREENSHOT, HTML, CONSOLE):
        try:
            if part == SCREENSHOT:
                ev.screenshot = png_of(s.call("GET", "screenshot"))
                if ev.screenshot is None:
                    ev.truncated.append("screenshot: not a PNG")
                else:
                    ev.screenshot_from = "webdriver"
            elif part == HTML:
                source = s.call("GET", "source")
                if isinstance(source, str):
                    ev.html, cut = cap_html(source)
                    if cut:
                        ev.truncated.append(f"page.html: cut to {HTML_MAX_CHARS} characters")
            else:
                ev.console, cut = cap_console(s.call("POST", "se/log", {"type": "browser"}))
                if cut:
                    ev.truncated.append(f"console: the last {CONSOLE_MAX_ENTRIES} entries kept")
        except ValueError as e:
            ev.truncated.append(f"{part}: {e}")
        except NoAnswer as e:
            ev.truncated.append(f"{part}: {e.args[0]}")
            return  # the budget is spent: what is left is not asked for


#: How attempts end that leave evidence: the crawler's error (or death), the node's watchdog, the hub's kill.
EVIDENCE_ENDS = frozenset({CrawlEndKind.ERROR, CrawlEndKind.HANG, CrawlEndKind.FENCED})

Capture = Callable[[str], Evidence]  # a Grid session id -> what its browser shows (bounded)


def keep(
    capture: Capture,
    results: ResultStore,
    where: tuple[str, str, str, int, str],
    meta: dict[str, Any],
    session_id: str,
) -> tuple[Evidence, str]:
    """Capture the session's evidence and put its files in the bucket under `where` = (site, run_date, run_id,
    attempt, writer): the node's own prefix, each file a new object (the hub stores them again beside the result
    when it exports); returns it and the key prefix. The ids are checked before they become keys (ValueError)."""
    site, run_date, run_id, attempt, writer = where
    key = evidence_key(site, run_date, run_id, attempt, RECORD, writer)
    ev = capture(session_id)
    files = ev.files(meta)
    for name in sorted(files, key=lambda n: n == RECORD):  # the record last: it lists the files before it
        body, content_type = files[name]
        results.put_staged(evidence_key(site, run_date, run_id, attempt, name, writer), body, content_type)
    return ev, key.rpartition("/")[0] + "/"
