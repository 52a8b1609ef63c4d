"""Blocked pages: a site that answers a crawl with a challenge or an "access denied" page instead of its content.

A page is blocked when it answers 401, 403 or 429 (`fleet.record.failures.BLOCKING_STATUSES`), or when its title or the
start of its HTML matches a marker: the defaults below, for the interstitial pages of common bot defences, and a
site's own `blocked_markers:` (regular expressions, case-insensitive). A blocked page is never counted as crawled;
the attempt fails with class `blocked` and keeps its evidence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: How much of a page is looked at: its title and the start of its HTML (challenge pages are small).
MARKED_CHARS = 64 * 1024
#: The most markers a site may add, and the longest one.
MAX_MARKERS = 50
MARKER_MAX_CHARS = 200

#: Interstitial and refusal pages of common bot defences, as they announce themselves.
DEFAULT_MARKERS: tuple[str, ...] = (
    r"<title>\s*just a moment\.\.\.\s*</title>",  # Cloudflare's browser check
    r"/cdn-cgi/challenge-platform/",
    r"cf-browser-verification",
    r"attention required! \| cloudflare",
    r"_incapsula_resource",  # Imperva
    r"incapsula incident id",
    r"captcha-delivery\.com",  # DataDome
    r"id=\"px-captcha\"",  # HUMAN (PerimeterX)
    r"sucuri website firewall - access denied",
    r"<title>\s*access denied\s*</title>[\s\S]{0,2000}reference #",  # Akamai
    r"aws-waf-token",  # AWS WAF's challenge
)


def marker_problem(marker: object) -> str | None:
    """Why `marker` is not a usable marker (None: it is one)."""
    if not isinstance(marker, str) or not marker.strip():
        return "a marker must be a non-empty string"
    if len(marker) > MARKER_MAX_CHARS:
        return f"a marker is at most {MARKER_MAX_CHARS} characters"
    try:
        re.compile(marker)
    except re.error as e:
        return f"{marker!r} is not a regular expression: {e}"
    return None


class Markers:
    """The markers a site's pages are checked against: the defaults and its own."""

    def __init__(self, extra: Iterable[str] = ()):
        self.patterns = [re.compile(m, re.IGNORECASE) for m in (*DEFAULT_MARKERS, *extra)]

    def match(self, page: str) -> str | None:
        """The first marker `page` (its title and HTML) shows, as written; None if none."""
        head = page[:MARKED_CHARS]
        for p in self.patterns:
            if p.search(head):
                return p.pattern
        return None
