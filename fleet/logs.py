"""Logging: every record about a site says which run, site, node and attempt.

`event(log, "kill", site=..., attempt=..., ...)` logs one line
`kill site=zdnet attempt=2 node=i-0abc reason=hang path=local`; the fields also
travel on the record (`record.fields`) for handlers that want them structured.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

_ORDER = ("run_id", "site", "attempt", "instance_id", "node")


def _fmt_value(v: Any) -> str:
    s = str(v)
    return f'"{s}"' if (" " in s or not s) else s


def format_fields(fields: dict[str, Any]) -> str:
    keys = [k for k in _ORDER if k in fields] + [k for k in fields if k not in _ORDER]
    return " ".join(f"{k}={_fmt_value(fields[k])}" for k in keys if fields[k] is not None)


def event(log: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    if log.isEnabledFor(level):
        text = f"{name} {format_fields(fields)}".rstrip()
        log.log(level, text, extra={"event": name, "fields": fields})


def setup(level: int = logging.INFO, stream: TextIO | None = None, prefix: str = "") -> None:
    """Configure the root logger once per process: time, level, logger, message."""
    handler = logging.StreamHandler(stream or sys.stderr)
    fmt = f"%(asctime)s %(levelname)-5s {prefix}%(name)s: %(message)s"
    handler.setFormatter(logging.Formatter(fmt, datefmt="%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("botocore", "boto3", "urllib3", "selenium", "werkzeug", "paramiko"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
