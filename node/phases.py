"""The seconds each phase of an attempt took, for the node's `completed` log line (and `bench/embedded.py`).

An attempt records the monotonic time at which it passes each mark; a phase is the time between two marks. The
crawler process adds what only it can time: `request_s`, from reading its job to the Grid's answer to its new
session request (the Grid routing the request, the Grid node starting chromedriver, chromedriver starting
Chromium). The result is saved while the crawler closes its browser, so `save_s` and `close_s` overlap; on a
real node the closing (`close_s`, `release_s`) also overlaps the node's next site (`node.closing`), and `busy_s`
ends when the node could take that site.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: name -> (the mark it starts at, the mark it ends at).
PHASES = {
    "setup_s": ("claim", "spawn"),  # the three below, and the crawler's job
    "check_s": ("claim", "checked"),  # is the result in S3 already? the node item says BUSY
    "lock_s": ("checked", "locked"),  # the profile lock, and Chrome's Singleton* files removed
    "browser_s": ("spawn", "session"),  # the crawler process handed its job, until its browser answered
    "crawl_s": ("session", "result"),  # the pages (and the checkpoint writes, made while the crawler goes on)
    "save_s": ("save", "saved"),  # heartbeat, result to S3, COMPLETED, message deleted
    "close_s": ("result", "closed"),  # the crawler quit its browser and exited
    "release_s": ("closed", "free"),  # a browser left behind killed, its Grid session ended, the lock released
    "busy_s": ("claim", "handed"),  # until the node could take its next site (a saved crawl closes meanwhile)
}


def phase_timings(
    marks: Mapping[str, float], extra: Mapping[str, float] | None = None, only: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Seconds per phase (of `only`, or all) whose two marks were passed, and `extra` (seconds measured
    otherwise), as text."""
    phases = {k: v for k, v in PHASES.items() if not only or k in only}
    out = {k: f"{marks[b] - marks[a]:.2f}" for k, (a, b) in phases.items() if a in marks and b in marks}
    out.update((k, f"{v:.2f}") for k, v in (extra or {}).items())
    return out
