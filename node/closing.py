"""Closing a finished crawl while the node goes on: the crawler quitting its browser, the cleanup, the lock.

Once a crawl's result is saved (in S3, `COMPLETED`, its message deleted), what is left of the attempt is local:
the crawler quits its browser and exits, a browser left behind is killed, and the site's profile lock is released.
None of it writes to AWS. A `Closer` made with `background=True` runs that in a thread, so the node receives and
claims its next site meanwhile; that site's browser starts in the Grid node's second slot while this one closes
(`node.grid_node`). One closing at a time: the next waits for the one before, and so does
the node before it exits. By default (the tests' agents, the fault suite's) it runs inline.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("gridfleet.node")


class Closer:
    def __init__(self, background: bool = False):
        self.background = background
        self._thread: threading.Thread | None = None

    def run(self, close: Callable[[], None]) -> None:
        """Run `close` (in a thread when in the background), after the closing before it has ended."""
        self.wait()
        if not self.background:
            close()
            return
        self._thread = threading.Thread(target=self._guarded, args=(close,), name="gridfleet-close", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Return once no closing runs."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @staticmethod
    def _guarded(close: Callable[[], None]) -> None:
        try:
            close()
        except Exception:  # the outermost frame of the thread: a failed cleanup is logged, the node goes on
            log.exception("closing a finished crawl failed")
