"""Watch for a spot interruption notice (IMDSv2 `spot/instance-action`), at most every 5 s.

EC2 gives two minutes' warning. The agent asks `notice()` on every wake-up;
the watcher calls the metadata service only when its interval has passed, and
once a notice is seen it stays seen.
"""

from __future__ import annotations

import logging
from typing import Any

from fleet.aws.imds import Imds, ImdsError
from fleet.clock import Clock

log = logging.getLogger("gridfleet.node")


class SpotWatcher:
    def __init__(self, imds: Imds, clock: Clock, interval_s: float = 5.0):
        self.imds = imds
        self.clock = clock
        self.interval_s = interval_s
        self.seen: dict[str, Any] | None = None
        self._next = float("-inf")
        self._warned = False

    def notice(self) -> dict[str, Any] | None:
        if self.seen is None and self.clock.monotonic() >= self._next:
            self._next = self.clock.monotonic() + self.interval_s
            try:
                self.seen = self.imds.spot_action()
            except ImdsError as e:
                if not self._warned:  # not fatal: the node keeps working and looks again
                    log.warning("spot-watch-unavailable error=%s", e)
                    self._warned = True
        return self.seen
