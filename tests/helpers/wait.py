"""Polling for tests that watch real processes: short intervals, a hard timeout, never a blind sleep."""

from __future__ import annotations

import time

import pytest


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.02):
    """Poll `predicate` until it returns something truthy; return that, or fail after `timeout`."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= end:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(interval)
