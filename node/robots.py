"""robots.txt: whether the crawl may fetch a URL, by the rules the site gives the crawl's user agent.

Each host's robots.txt (`<scheme>://<host>/robots.txt`) is fetched once per crawl, the first time a URL of that
host is asked about: without the browser, with the crawl's user agent, a short timeout, and paced like every
request of the site. protego reads it (groups by product token, `*` and `$` patterns, Allow/Disallow precedence,
`Crawl-delay`, which paces the host's domain: `fleet.crawl.pacing`).
What its answer means:
- 2xx: its rules;
- 4xx (none there, or not for us): no rules, everything allowed;
- 5xx, or no answer at all: everything allowed, with a WARNING naming the site. RFC 9309 would have the crawl
  assume everything disallowed; a robots.txt that fails once would then fail the site's whole daily crawl, so the
  crawl goes on, as most crawlers' do, and the log says why.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from protego import Protego

log = logging.getLogger("gridfleet.crawler")

#: The longest wait for a robots.txt, and the most of it read (Google reads 500 KiB of it).
ROBOTS_TIMEOUT_S = 10.0
ROBOTS_MAX_BYTES = 512 * 1024


@dataclass(frozen=True)
class Fetched:
    """A robots.txt as it answered: its HTTP status (None: no answer), its text, and why it did not answer."""

    status: int | None
    text: str = ""
    error: str | None = None


Fetch = Callable[[str], Fetched]


def fetch_robots(url: str, user_agent: str, timeout_s: float = ROBOTS_TIMEOUT_S) -> Fetched:
    """GET `url` (a robots.txt) with `user_agent` (redirects followed, as urllib does)."""
    headers = {"User-Agent": user_agent} if user_agent else {}
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - http(s), from robots_url
            body = resp.read(ROBOTS_MAX_BYTES)
            return Fetched(resp.status, body.decode("utf-8", errors="replace"))
    except urllib.error.HTTPError as e:
        return Fetched(e.code, error=f"HTTP {e.code}")
    except (urllib.error.URLError, TimeoutError, OSError, ValueError) as e:
        return Fetched(None, error=str(getattr(e, "reason", e)))


def robots_url(url: str) -> str | None:
    """The robots.txt that rules `url`; None for a URL that is not http(s) with a host."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return None
    return f"{parts.scheme.lower()}://{parts.netloc}/robots.txt"


class Robots:
    """The robots.txt rules of each host a crawl visits, for its user agent; each fetched once.

    `fetch` reads one robots.txt, `pace` waits for its slot (given the robots.txt's URL) of the site's rate limit
    and of its domain; `fields` name the site, node and attempt on the log lines."""

    def __init__(self, user_agent: str, fetch: Fetch, pace: Callable[[str], None], **fields: object):
        self.user_agent = user_agent or "*"
        self.fetch, self.pace, self.fields = fetch, pace, fields
        self._rules: dict[str, Protego | None] = {}  # robots.txt URL -> its rules (None: everything allowed)

    def allowed(self, url: str) -> bool:
        where = robots_url(url)
        if where is None:
            return True
        if where not in self._rules:
            self._rules[where] = self._read(where)
        rules = self._rules[where]
        return rules is None or bool(rules.can_fetch(url, self.user_agent))

    def crawl_delay(self, url: str) -> float | None:
        """The `Crawl-delay` the robots.txt of `url`'s host gives the crawl's user agent, once it was read (never
        reads it); None without one."""
        where = robots_url(url)
        rules = self._rules.get(where) if where is not None else None
        delay = rules.crawl_delay(self.user_agent) if rules is not None else None
        return float(delay) if delay is not None and delay > 0 else None

    def _read(self, where: str) -> Protego | None:
        self.pace(where)
        got = self.fetch(where)
        if got.status is not None and 200 <= got.status < 300:
            return Protego.parse(got.text)
        if got.status is not None and 400 <= got.status < 500:
            return None
        log.warning(
            "robots-unavailable %s url=%s error=%s allowed=all (a robots.txt that does not answer rules nothing)",
            " ".join(f"{k}={v}" for k, v in self.fields.items()),
            where,
            got.error or f"HTTP {got.status}",
        )
        return None
