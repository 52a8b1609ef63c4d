"""Counting requests per time window, for the rate-limit tests."""

from __future__ import annotations


def max_in_window(times: list[float], window_s: float = 1.0) -> int:
    """The most of `times` any closed window of `window_s` seconds holds."""
    ts = sorted(times)
    best, j = 0, 0
    for i, t in enumerate(ts):
        while ts[j] < t - window_s - 1e-9:
            j += 1
        best = max(best, i - j + 1)
    return best
