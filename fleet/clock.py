"""Time, passed in. Code that decides asks a Clock; tests hand it a FakeClock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch by this host's clock."""

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps; only differences mean anything."""

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class FakeClock:
    """A clock that moves only when told to (or when slept on)."""

    def __init__(self, start: float = 1_800_000_000.0):
        self._now = start
        self._mono = 1000.0

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self._mono += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
