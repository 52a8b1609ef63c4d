"""The runs' record in the bucket: `runs/<run_id>/summary.json` and `runs/<run_id>/report.html`, and the record as
the code that uses it sees it (`RunArchive`).

The table forgets a run a day after it ends (its items carry a TTL); the bucket
keeps how every run ended. The hub puts both files there at the end of each run,
the watchdog puts the summary of a run it had to end, and `status`, `report` and
`check` read them back once the table has forgotten the run. The report's
"previous run" is found here too. Run ids read back from keys are checked again
before they are used (`fleet.record.ids`). The S3 adapter is `fleet.aws.archive`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from fleet.record.ids import is_run_id

PREFIX = "runs/"
SUMMARY = "summary.json"
REPORT = "report.html"


def summary_key(run_id: str) -> str:
    return f"{PREFIX}{run_id}/{SUMMARY}"


def report_key(run_id: str) -> str:
    return f"{PREFIX}{run_id}/{REPORT}"


def run_id_of(key: str) -> str | None:
    """`runs/<run_id>/summary.json` -> run_id, if the key is one and the id is a run id."""
    head, _, rest = key.partition(PREFIX)
    run_id, _, name = rest.partition("/")
    return run_id if head == "" and name == SUMMARY and is_run_id(run_id) else None


def is_summary(data: object) -> bool:
    return isinstance(data, dict) and isinstance(data.get("sites"), dict) and is_run_id(data.get("run_id"))


class RunArchive(Protocol):
    def put_summary(self, summary: Mapping[str, Any]) -> str: ...
    def put_report(self, run_id: str, html: str) -> str: ...
    def get_summary(self, run_id: str) -> dict[str, Any] | None: ...
    def summaries(self) -> list[tuple[float, str]]:
        """(time written, run id) of every archived summary, oldest first."""


def latest(archive: RunArchive) -> str | None:
    """The run whose summary was archived last."""
    found = archive.summaries()
    return found[-1][1] if found else None


def previous(archive: RunArchive, summary: Mapping[str, Any], look_at: int = 10) -> dict[str, Any] | None:
    """The archived run that started last before `summary`'s run (of the `look_at` archived last before it)."""
    start = summary.get("started_at")
    if not isinstance(start, (int, float)):
        return None
    earlier = [run_id for at, run_id in archive.summaries() if at <= start and run_id != summary.get("run_id")]
    return _latest_started(archive.get_summary(r) for r in reversed(earlier[-look_at:]))


def _latest_started(summaries: Iterable[dict[str, Any] | None]) -> dict[str, Any] | None:
    best = None
    for s in summaries:
        if s is not None and isinstance(s.get("started_at"), (int, float)):
            if best is None or s["started_at"] > best["started_at"]:
                best = s
    return best
