"""A scripted crawler process for agent tests, on a FakeClock.

It stands in for the real crawler process only where time must be injected:
`next_event` advances the fake clock instead of waiting, so a hang of any
length costs no wall time. The real process and pipe are covered by the
adapter tests in tests/adapter/test_agent_processes.py.
"""

from __future__ import annotations

from typing import Any

from fleet.clock import FakeClock
from node.runner import Exited

HANG = object()  # script entry: no more events until killed


class ScriptedCrawl:
    def __init__(self, clock: FakeClock, script: list, pid: int = 424242):
        self.clock = clock
        self.pid = pid
        self.started = clock.monotonic()
        self.script = list(script)  # (seconds after start, event dict) or HANG
        self.killed = False
        self.closed_with: float | None = None

    def next_event(self, timeout_s: float) -> dict[str, Any] | Exited | None:
        if self.killed:
            return Exited(-9)
        if not self.script:
            return Exited(0)
        head = self.script[0]
        if head is HANG:
            self.clock.advance(timeout_s)
            return None
        at, ev = head
        due = self.started + at
        if due <= self.clock.monotonic() + timeout_s:
            self.clock.advance(max(0.0, due - self.clock.monotonic()))
            self.script.pop(0)
            return ev
        self.clock.advance(timeout_s)
        return None

    def kill(self) -> None:
        self.killed = True

    def close(self, grace_s: float = 0) -> None:
        self.closed_with = grace_s
        self.killed = True


def status(s: str, url: str | None = None, pages: int = 0) -> dict[str, Any]:
    return {"event": "status", "site_status": s, "url": url, "pages": pages}


def pages_script(n: int, step: float = 1.0) -> list:
    """A healthy crawl of n pages, `step` seconds per page."""
    out: list = [(0.5, {"event": "session", "id": "sess-1"}), (0.6, status("RUNNING"))]
    t = 0.6
    for p in range(1, n + 1):
        out.append((t + 0.01, status("URL_CALL", f"http://x.test/?page={p}", p - 1)))
        t += step
        out.append((t, status("CALL_DONE", f"http://x.test/?page={p}", p)))
    out.append((t + 0.1, {"event": "result", "items": [{"id": f"i{p}"} for p in range(n)], "pages": n}))
    return out
