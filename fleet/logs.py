"""Logging: every record about a site says which run, site, node and attempt.

`event(log, "kill", site=..., attempt=..., ...)` logs a record whose fields
travel on it (`record.fields`). Where stderr is a terminal it reads
`kill site=zdnet attempt=2 node=i-0abc reason=hang path=local`; anywhere else
(files, journald, CloudWatch Logs) it is one JSON object per line with `ts`,
`level`, `logger`, `event`, `run_id`, `site`, `instance_id`, `attempt` and the
other fields, so a log pipeline can filter by site or node without parsing text.
`GRIDFLEET_LOG_FORMAT=json|text` overrides the choice.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
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


class JsonFormatter(logging.Formatter):
    """One JSON object per record: the event and its fields at the top level (`node` is named `instance_id`)."""

    def __init__(self, defaults: dict[str, Any] | None = None):
        super().__init__()
        self.defaults = defaults or {}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "fields", None)
        if fields is not None:
            out["event"] = getattr(record, "event", None)
            for k, v in fields.items():
                if v is not None:
                    out["instance_id" if k == "node" and "instance_id" not in fields else k] = _plain(v)
        else:
            out["event"] = "log"
            out["msg"] = record.getMessage()
        for k, v in self.defaults.items():
            out.setdefault(k, v)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def _plain(v: Any) -> Any:
    return v if isinstance(v, (str, int, float, bool)) else str(v)


def use_json(stream: TextIO, environ: dict[str, str] | None = None) -> bool:
    choice = (os.environ if environ is None else environ).get("GRIDFLEET_LOG_FORMAT", "").lower()
    if choice in ("json", "text"):
        return choice == "json"
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):
        return True


def setup(
    level: int = logging.INFO, stream: TextIO | None = None, prefix: str = "", defaults: dict[str, Any] | None = None
) -> None:
    """Configure the root logger once per process: JSON lines, or `time level logger: message` on a terminal.

    `defaults` are fields every JSON line carries unless the record has its own (a node's `instance_id`)."""
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    if use_json(stream):
        handler.setFormatter(JsonFormatter(defaults))
    else:
        fmt = f"%(asctime)s %(levelname)-5s {prefix}%(name)s: %(message)s"
        handler.setFormatter(logging.Formatter(fmt, datefmt="%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("botocore", "boto3", "urllib3", "selenium", "werkzeug", "paramiko"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
