"""Custom metrics: what a node counts about its jobs, and CloudWatch's `put_metric_data` in batches.

Nodes push their own figures two ways: to CloudWatch (when `metrics.cloudwatch`
is on) with a `WorkerId` dimension, and onto their node item in the table with
every heartbeat (`JobStats`), from which the hub's `/metrics` serves them to
Prometheus. Nodes never open a port of their own, and a restarted hub loses
nothing: the counters live with the node that counted them.

Publishing is best effort: a metric that cannot be sent is logged and dropped,
never allowed to stop a crawl or a run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.record.readback import as_count, as_number

log = logging.getLogger("gridfleet.metrics")

#: `put_metric_data` takes at most 1000 data per call (and 1 MB); stay well under both.
BATCH = 500


@dataclass
class JobStats:
    """A node's counters since it started: jobs that produced a result, their seconds, and errors by type."""

    completed: int = 0
    seconds_sum: float = 0.0
    timed: int = 0  # jobs whose duration is in seconds_sum (every ended job, with or without a result)
    errors: dict[str, int] = field(default_factory=dict)

    def job(self, seconds: float, error_type: str | None = None) -> None:
        self.timed += 1
        self.seconds_sum += max(0.0, seconds)
        if error_type is None:
            self.completed += 1
        else:
            self.errors[error_type] = self.errors.get(error_type, 0) + 1

    def to_plain(self) -> dict[str, Any]:
        return {
            "completed": self.completed,
            "seconds_sum": round(self.seconds_sum, 3),
            "timed": self.timed,
            "errors": dict(self.errors),
        }

    @classmethod
    def from_plain(cls, d: Mapping[str, Any] | None) -> JobStats:
        """The counters as a node item holds them, read back: a node writes them, so a value that is no count (or a
        seconds sum that is no number) reads as 0, and at most MAX_ERROR_TYPES error types are kept."""
        d = d if isinstance(d, Mapping) else {}
        errors = d.get("errors")
        kept = list(errors.items())[:MAX_ERROR_TYPES] if isinstance(errors, Mapping) else []
        return cls(
            as_count(d.get("completed")) or 0,
            as_number(d.get("seconds_sum")) or 0.0,
            as_count(d.get("timed")) or 0,
            {str(k)[:64]: as_count(v) or 0 for k, v in kept},
        )


#: Error types a node item's counters are read back with (the rest are dropped: a Prometheus label each).
MAX_ERROR_TYPES = 32


@dataclass(frozen=True)
class Datum:
    name: str
    value: float
    unit: str = "Count"  # a CloudWatch unit: Count, Seconds, Percent, None
    dims: tuple[tuple[str, str], ...] = ()

    def to_api(self, ts: float) -> dict[str, Any]:
        d: dict[str, Any] = {"MetricName": self.name, "Value": float(self.value), "Unit": self.unit, "Timestamp": ts}
        if self.dims:
            d["Dimensions"] = [{"Name": k, "Value": v} for k, v in self.dims]
        return d


class CloudWatchSink:
    """Buffers data and sends them with `put_metric_data` in batches; `client=None` is a sink that drops all."""

    def __init__(self, client: Any | None, namespace: str, clock: Any = None):
        self.client = client
        self.namespace = namespace
        self._now = clock.now if clock is not None else time.time
        self._buffer: list[dict[str, Any]] = []
        self.sent = 0
        self.dropped = 0

    @property
    def enabled(self) -> bool:
        return self.client is not None

    def add(self, data: Sequence[Datum] | Datum) -> None:
        if self.client is None:
            return
        ts = self._now()
        for d in [data] if isinstance(data, Datum) else data:
            self._buffer.append(d.to_api(ts))

    def flush(self) -> int:
        """Send what is buffered; returns how many data went out (failures are logged and dropped)."""
        if self.client is None or not self._buffer:
            return 0
        pending, self._buffer = self._buffer, []
        sent = 0
        for i in range(0, len(pending), BATCH):
            chunk = pending[i : i + BATCH]
            try:
                self.client.put_metric_data(Namespace=self.namespace, MetricData=chunk)
                sent += len(chunk)
            except Exception as e:  # noqa: BLE001 - metrics are a report, never a reason to stop
                self.dropped += len(chunk)
                log.warning(
                    "metrics-dropped namespace=%s data=%d error=%s: %s", self.namespace, len(chunk), type(e).__name__, e
                )
        self.sent += sent
        return sent


def node_job_data(worker_id: str, seconds: float, error_type: str | None) -> list[Datum]:
    """What a node sends when a job (one attempt) ends."""
    w = (("WorkerId", worker_id),)
    out = [Datum("JobDuration", seconds, "Seconds", w)]
    if error_type is None:
        out.append(Datum("JobsCompleted", 1, "Count", w))
    else:
        out.append(Datum("JobErrors", 1, "Count", w + (("ErrorType", error_type),)))
    return out


def node_heartbeat(worker_id: str) -> Datum:
    return Datum("Heartbeat", 1, "Count", (("WorkerId", worker_id),))
