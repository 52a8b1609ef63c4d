"""The shapes of the ids gridfleet puts into keys, paths and tags: run ids and site ids.

One rule for each, matched whole (`fullmatch`: a trailing newline is not a valid
id), used wherever an id enters (the config, the command line, a Lambda event)
and again wherever an id read back from AWS becomes a path or a key.
"""

from __future__ import annotations

import datetime as dt
import re

#: A run id: the day's date by default (2026-11-21), or any name an operator gives.
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RUN_ID_RULE = "letters, digits, '.', '_' or '-', starting with a letter or digit (max 64)"

#: A site id (also the name of its profile directory and lock file, and the first part of its result key).
SITE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SITE_ID_RULE = "letters, digits, '.', '_' or '-', starting with a letter or digit (max 128)"


def is_run_id(value: object) -> bool:
    return isinstance(value, str) and RUN_ID_RE.fullmatch(value) is not None


def is_site_id(value: object) -> bool:
    return isinstance(value, str) and SITE_ID_RE.fullmatch(value) is not None


def check_run_id(value: object, what: str = "run id") -> str:
    """`value` if it is a run id, else ValueError naming it (ids read back from AWS pass here again)."""
    if not is_run_id(value):
        raise ValueError(f"{what} {value!r} is not a run id ({RUN_ID_RULE})")
    return value  # type: ignore[return-value]


def check_site_id(value: object, what: str = "site id") -> str:
    """`value` if it is a site id, else ValueError naming it."""
    if not is_site_id(value):
        raise ValueError(f"{what} {value!r} is not a site id ({SITE_ID_RULE})")
    return value  # type: ignore[return-value]


def default_run_id(now: float) -> str:
    """The run id of a run started at `now` without one: the day's date in UTC (2026-11-21)."""
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%d")
