"""The shapes of the ids gridfleet puts into keys, paths and tags: run ids, site ids and EC2 instance ids.

One rule for each, matched whole (`fullmatch`: a trailing newline is not a valid
id), used wherever an id enters (the config, the command line, a Lambda event)
and again wherever an id read back from AWS becomes a path or a key.
"""

from __future__ import annotations

import datetime as dt
import re

from fleet.errors import quote

#: A run id: the day's date by default (2026-11-21), or any name an operator gives.
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RUN_ID_RULE = "letters, digits, '.', '_' or '-', starting with a letter or digit (max 64)"

#: A site id (also the name of its profile directory and lock file, and the first part of its result key).
SITE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SITE_ID_RULE = "letters, digits, '.', '_' or '-', starting with a letter or digit (max 128)"

#: An EC2 instance id: `i-` and 8 hex digits (the old form) or 17 (the current one).
INSTANCE_ID_RE = re.compile(r"i-(?:[0-9a-f]{8}|[0-9a-f]{17})")
INSTANCE_ID_RULE = "'i-' and 8 or 17 lowercase hex digits"


#: A node's id as the hub and the nodes name it: an EC2 instance id, or a local or simulated node's (`i-local-<hex>`,
#: `i-000042`). Node items are keyed by it; a key that names none is no node item.
NODE_ID_RE = re.compile(r"i-[0-9A-Za-z-]{1,40}")


def is_node_id(value: object) -> bool:
    return isinstance(value, str) and NODE_ID_RE.fullmatch(value) is not None


def is_run_id(value: object) -> bool:
    return isinstance(value, str) and RUN_ID_RE.fullmatch(value) is not None


def is_site_id(value: object) -> bool:
    return isinstance(value, str) and SITE_ID_RE.fullmatch(value) is not None


def is_instance_id(value: object) -> bool:
    return isinstance(value, str) and INSTANCE_ID_RE.fullmatch(value) is not None


def check_run_id(value: object, what: str = "run id") -> str:
    """`value` if it is a run id, else ValueError naming it (ids read back from AWS pass here again)."""
    if not is_run_id(value):
        raise ValueError(f"{what} {quote(value)} is not a run id ({RUN_ID_RULE})")
    return value  # type: ignore[return-value]


def check_site_id(value: object, what: str = "site id") -> str:
    """`value` if it is a site id, else ValueError naming it."""
    if not is_site_id(value):
        raise ValueError(f"{what} {quote(value)} is not a site id ({SITE_ID_RULE})")
    return value  # type: ignore[return-value]


def check_instance_id(value: object, what: str = "instance id") -> str:
    """`value` if it is an EC2 instance id, else ValueError naming it (the ids EC2 answers with pass here)."""
    if not is_instance_id(value):
        raise ValueError(f"{what} {quote(value)} is not an EC2 instance id ({INSTANCE_ID_RULE})")
    return value  # type: ignore[return-value]


def default_run_id(now: float) -> str:
    """The run id of a run started at `now` without one: the day's date in UTC (2026-11-21)."""
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%d")
