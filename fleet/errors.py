"""The exceptions gridfleet raises on purpose, each carrying what it is about.

The CLI maps them to exit codes (`exit_code`) and prints `str(e)` without a
traceback; anything else reaching the top is a bug and is logged with one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class GridfleetError(Exception):
    exit_code = 1


class ConfigError(GridfleetError):
    """Invalid fleet.yaml. Holds one Problem per error (file, line, field, message)."""

    exit_code = 2

    def __init__(self, problems: Sequence[Any]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class UsageError(GridfleetError):
    """The command line asks for something that cannot be done as asked."""

    exit_code = 2


class MissingResource(GridfleetError):
    """An AWS resource or a local prerequisite the command needs does not exist."""


class SandboxUnavailable(GridfleetError):
    """Chromium cannot have its sandbox where it would run, and may not go on without it."""


class StackError(GridfleetError):
    """The embedded default's local stack could not be started or reached."""


class IllegalTransition(GridfleetError):
    """A state write that the site record's transition table forbids."""

    def __init__(self, site: str, what: str, old: Any, new: Any):
        self.site = site
        super().__init__(f"site {site}: {what} {old} -> {new} is not a legal transition")


class StaleWrite(GridfleetError):
    """A conditional write lost: the record moved on (another writer, or a fenced-off node).

    `current` is the record as it is now, when the store returned it.
    """

    def __init__(self, run_id: str, site: str, expected: str, current: Any = None):
        self.run_id = run_id
        self.site = site
        self.current = current
        super().__init__(f"run {run_id} site {site}: write refused, record is not at {expected}")
