"""What the hub's dashboard shows and how it is kept current: the page, the run's status as JSON, and one
poller of that status shared by every open event stream.

Sharing the poller keeps what ``status()`` costs from growing with the number of open dashboards, and nothing is
polled while no one watches. ``status()`` reads the run's table, which can be briefly out of reach: its failure
is reported as `StatusUnavailable`, logged once per spell of failures, and never raised into the server.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources

log = logging.getLogger("gridfleet.http")

StatusFn = Callable[[], dict]

PAGE_HEADERS = {
    # The page is self-contained: it may run its own inline script and talk only to this server.
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'",
    "X-Content-Type-Options": "nosniff",
}


def page_html() -> bytes:
    """The dashboard page: self-contained, it fetches nothing but this server's /events stream."""
    return resources.files("hub").joinpath("dashboard.html").read_bytes()


class StatusUnavailable(Exception):
    """status() failed or returned something JSON cannot hold; args[0] says why."""


def status_json(status: StatusFn) -> str:
    """The run's status as JSON text, or StatusUnavailable."""
    try:
        return json.dumps(status())
    except Exception as exc:  # noqa: BLE001 - a failing status source must never fail the hub
        raise StatusUnavailable(f"{type(exc).__name__}: {exc}") from exc


class StatusFeed:
    """One poller of status() for every open event stream; `version` grows each time the JSON changes."""

    def __init__(self, status: StatusFn, poll_s: float, stopping: threading.Event) -> None:
        self._status = status
        self._poll_s = poll_s
        self._stopping = stopping
        self._changed = threading.Condition()
        self._wake = threading.Event()
        self._text: str | None = None
        self._version = 0
        self._viewers = 0
        self._failing = False

    def run(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            if self._watched():
                self._poll()
            self._wake.wait(self._poll_s)

    def close(self) -> None:
        """Release every waiting stream; call after `stopping` is set."""
        self._wake.set()
        with self._changed:
            self._changed.notify_all()

    @contextmanager
    def viewer(self) -> Iterator[None]:
        with self._changed:
            self._viewers += 1
            first = self._viewers == 1
            if first:
                self._text = None  # polled before a pause in watching: possibly long out of date
        if first:
            self._wake.set()
        try:
            yield
        finally:
            with self._changed:
                self._viewers -= 1

    def wait_newer(self, seen: int, timeout_s: float) -> tuple[int, str] | None:
        """(version, text) newer than version `seen`; None after `timeout_s` or once the server stops."""
        with self._changed:
            self._changed.wait_for(lambda: self._stopping.is_set() or self._has_newer(seen), timeout_s)
            text = self._text
            if self._stopping.is_set() or text is None or self._version <= seen:
                return None
            return self._version, text

    def _has_newer(self, seen: int) -> bool:
        return self._text is not None and self._version > seen

    def _watched(self) -> bool:
        with self._changed:
            return self._viewers > 0

    def _poll(self) -> None:
        try:
            text = status_json(self._status)
        except StatusUnavailable as exc:
            self._note_failure(exc)
            return
        if self._failing:
            self._failing = False
            log.info("the run's status can be read again")
        with self._changed:
            if text != self._text:
                self._text = text
                self._version += 1
                self._changed.notify_all()

    def _note_failure(self, exc: StatusUnavailable) -> None:
        if not self._failing:
            self._failing = True
            log.warning("cannot read the run's status for the dashboard: %s", exc.args[0])
        else:
            log.debug("still cannot read the run's status: %s", exc.args[0])
