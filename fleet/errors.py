"""The exceptions gridfleet raises on purpose, each carrying what it is about.

The CLI maps them to exit codes (`exit_code`) and prints `str(e)` without a
traceback; anything else reaching the top is a bug and is logged with one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: An error line quotes at most this many characters of a value: a value of any length keeps its line short.
QUOTE_KEEP = 64


def quote(value: object, keep: int = QUOTE_KEEP, *, bare: bool = False) -> str:
    """`value` as an error line quotes it: its repr, or when that is long, the repr of its first characters and
    an ellipsis, then its length (`'aaaa…' (102400 characters)`), never more than about `keep` + 30 characters.
    `bare`: a string without its quotes (a number as written: `1111…` (5000 characters)), escapes still spelled out.

    Every value a message quotes from the input (the config, the command line, an event, an answer read back)
    goes through here (cloud_init, which imports nothing of the project, keeps a copy: `cloud_init.render`)."""
    text = value if isinstance(value, str) else repr(value)
    strip = 1 if isinstance(value, str) and bare else 0

    def shown(part: str) -> str:
        r = repr(part) if isinstance(value, str) else part
        return r[strip : len(r) - strip]

    if len(text) <= keep and len(shown(text)) <= keep + 2:
        return shown(text)
    n = min(len(text), keep)
    while n > 1 and len(shown(text[:n])) > keep + 2:  # escapes (\x1b, \u2028) are longer than their character
        n -= 1
    return f"{shown(text[:n] + '…')} ({len(text)} characters)"


class GridfleetError(Exception):
    """An error gridfleet raises on purpose: the command prints it as one line and exits with `exit_code`."""

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
        super().__init__(f"site {quote(site, bare=True)}: {what} {old} -> {new} is not a legal transition")


class StaleWrite(GridfleetError):
    """A conditional write lost: the record moved on (another writer, or a fenced-off node).

    `current` is the record as it is now, when the store returned it.
    """

    def __init__(self, run_id: str, site: str, expected: str, current: Any = None):
        self.run_id = run_id
        self.site = site
        self.current = current
        run, name = quote(run_id, bare=True), quote(site, bare=True)  # ids read back: cut, as every id a line shows
        super().__init__(f"run {run} site {name}: write refused, record is not at {expected}")
