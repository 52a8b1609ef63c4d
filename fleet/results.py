"""Where a run's results go in the result store, and the store as the code that uses it sees it (`ResultStore`).

A result belongs to its run. The daily run (its id is its date, `2026-11-21`, written so)
keeps the key `<site>/<YYYYMMDD>/result.json`; any other run of that date (a
manual run, a demo) stores its result beside it,
`<site>/<YYYYMMDD>/<run_id>/result.json`, never over it and never instead of it
(`20261121` is such another run: only the dashed date is the daily run's id).
Within a run, a result already stored means the site is done (a retry skips it).

A result that breaks its site's data contract (`fleet.contract`) is not the result: it is kept in quarantine,
`<site>/<YYYYMMDD>[/<run_id>]/quarantine/<attempt>.json` (`quarantine_key`), a name no result key, listing of
results or skip check ever takes for one.

Evidence of an attempt that ended badly (a screenshot, the page's HTML, its
console, a record) goes beside the run's result:
`<site>/<YYYYMMDD>[/<run_id>]/evidence/<attempt>/<file>`, one of `EVIDENCE_FILES`.

The items each checkpoint saved go beside it too, one part object per checkpoint
(`fleet.checkpoint`): `<site>/<YYYYMMDD>[/<run_id>]/parts/<attempt>-<claim>/<seq>.json`.

`put_new` writes only a key that does not exist: of two writers (a zombie node
and the attempt that replaced it) exactly one result lands and nothing is
overwritten. The S3 adapter is `fleet.aws.results`; the tests and the simulator
use an in-memory one.
"""

from __future__ import annotations

from typing import Protocol

from fleet.ids import check_run_id, check_site_id


def is_daily_run(run_id: str, run_date: str) -> bool:
    """Whether `run_id` is the day's run of `run_date` (YYYYMMDD): its id is that date as the daily run's id is
    written (`fleet.ids.default_run_id`: 2026-11-21), and only so. Any other id, `20261121` or `20261121--` too,
    keeps its own keys under its own name: two run ids never share a result, its evidence or its parts."""
    return len(run_date) == 8 and run_id == f"{run_date[:4]}-{run_date[4:6]}-{run_date[6:]}"


def result_key(site: str, run_date: str, run_id: str | None = None) -> str:
    """Where a run's result of a site goes: the daily run's (`run_id` None, or the date itself) at
    `<site>/<YYYYMMDD>/result.json`, any other run's at `<site>/<YYYYMMDD>/<run_id>/result.json`."""
    if run_id is None or is_daily_run(run_id, run_date):
        return f"{site}/{run_date}/result.json"
    return f"{site}/{run_date}/{run_id}/result.json"


def checked_result_key(site: str, run_date: str, run_id: str | None = None) -> str:
    """`result_key` with the ids and the date checked again (they may come back from AWS): ValueError when one is not
    what it claims. A key read back from the table is never used as it was read: it is derived again here."""
    _check_ids(site, run_date, run_id)
    return result_key(site, run_date, run_id)


def is_result_key(key: str) -> bool:
    """Whether `key` is one `result_key` makes: `<site>/<YYYYMMDD>/result.json` or
    `<site>/<YYYYMMDD>/<run_id>/result.json` (not the daily run's date), with the ids valid."""
    parts = key.split("/")
    if len(parts) not in (3, 4) or parts[-1] != "result.json":
        return False
    try:
        return checked_result_key(parts[0], parts[1], parts[2] if len(parts) == 4 else None) == key
    except ValueError:
        return False


def quarantine_key(key: str, attempt: int) -> str:
    """Where attempt `attempt`'s result that broke the contract is kept, beside the result at `key` (a `result_key`):
    `.../quarantine/<attempt>.json`. Not `quarantine/result.json`: that is the result of a run named `quarantine`."""
    if not is_result_key(key):
        raise ValueError(f"{key!r} is not a result key")
    _count(attempt, "attempt", 1, 999_999)
    return f"{key.rpartition('/')[0]}/quarantine/{attempt}.json"


#: The files an evidence record may hold: every key written or read back under `evidence/` names one of them.
EVIDENCE_FILES = ("evidence.json", "screenshot.png", "page.html", "console.json")


def _check_ids(site: str, run_date: str, run_id: str | None) -> None:
    check_site_id(site)
    if run_id is not None:
        check_run_id(run_id)
    if not (len(run_date) == 8 and run_date.isdigit() and run_date.isascii()):
        raise ValueError(f"run date {run_date!r} is not YYYYMMDD")


def _beside_result(site: str, run_date: str, run_id: str | None, folder: str) -> str:
    """`<site>/<YYYYMMDD>[/<run_id>]/<folder>/`, the ids checked again: ValueError when one is not what it claims."""
    _check_ids(site, run_date, run_id)
    return result_key(site, run_date, run_id).rpartition("/")[0] + f"/{folder}/"


def evidence_prefix(site: str, run_date: str, run_id: str | None = None) -> str:
    """Where the evidence of a run's attempts of a site goes: beside its result, `.../evidence/`. The ids are
    checked again (they may come back from AWS): ValueError when one is not what it claims."""
    return _beside_result(site, run_date, run_id, "evidence")


def _count(value: object, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} {value!r} is not an integer from {low} to {high}")
    return value


def part_key(site: str, run_date: str, run_id: str | None, attempt: int, claim: int, seq: int) -> str:
    """`<site>/<YYYYMMDD>[/<run_id>]/parts/<attempt>-<claim>/<seq>.json`: the `seq`-th checkpoint part of the
    attempt whose claim made the record's version `claim`. Every part is checked (the numbers come back from the
    table): ValueError for a bad id or number."""
    _count(attempt, "attempt", 1, 999_999)
    _count(claim, "claim version", 1, 10**12)
    _count(seq, "part number", 1, 999_999)
    return f"{_beside_result(site, run_date, run_id, 'parts')}{attempt}-{claim}/{seq:06d}.json"


def evidence_key(site: str, run_date: str, run_id: str | None, attempt: int, name: str) -> str:
    """`<site>/<YYYYMMDD>[/<run_id>]/evidence/<attempt>/<name>`; ValueError for a bad id, attempt or name."""
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError(f"attempt {attempt!r} is not a positive integer")
    if name not in EVIDENCE_FILES:
        raise ValueError(f"{name!r} is not an evidence file ({', '.join(EVIDENCE_FILES)})")
    return f"{evidence_prefix(site, run_date, run_id)}{attempt}/{name}"


def parse_evidence_key(prefix: str, key: str) -> tuple[int, str] | None:
    """(attempt, file) of a key listed under `prefix`, or None when it is not one `evidence_key` makes."""
    if not key.startswith(prefix):
        return None
    attempt, _, name = key[len(prefix) :].partition("/")
    if not (attempt.isdigit() and attempt.isascii() and len(attempt) <= 6) or int(attempt) < 1:
        return None
    return (int(attempt), name) if name in EVIDENCE_FILES else None


#: Media types a browser opens as a document, scripts and all.
DOCUMENT_TYPES = frozenset({"text/html", "application/xhtml+xml", "image/svg+xml", "text/xml", "application/xml"})
#: How a file the crawled page wrote is stored: as text, to be downloaded.
PAGE_TEXT = "text/plain; charset=utf-8"


def evidence_headers(key: str, content_type: str) -> dict[str, str]:
    """The object headers an evidence file is stored with. The page's own HTML (`page.html`), or anything a
    browser would open as a document, is stored as plain text to download: opened from the bucket as HTML it
    would run the crawled page's scripts on the bucket's origin, which is the run report's."""
    media = content_type.partition(";")[0].strip().lower()
    if key.rpartition("/")[2] == "page.html" or media in DOCUMENT_TYPES:
        return {"ContentType": PAGE_TEXT, "ContentDisposition": "attachment"}
    return {"ContentType": content_type}


def aside_key(key: str, suffix: str) -> str:
    """`site/20261121/result.json` -> `site/20261121/result.replaced-<suffix>.json` (kept, no longer the result)."""
    stem, dot, ext = key.rpartition(".")
    return f"{stem}.replaced-{suffix}.{ext}" if dot else f"{key}.replaced-{suffix}"


class ResultStore(Protocol):
    """The result store: S3 on AWS and on the embedded default (`fleet.aws.results`), in memory in the tests and the
    simulator."""

    def exists(self, key: str) -> bool: ...
    def put_new(self, key: str, body: bytes) -> bool:
        """Write `body` unless the key exists; True if this call wrote it."""

    def get(self, key: str) -> bytes:
        """The object's bytes; a key that does not exist raises as S3 does (a ClientError `NoSuchKey`)."""

    def put_evidence(self, key: str, body: bytes, content_type: str) -> None:
        """Write one file of an attempt's evidence (a later capture of the same attempt replaces it)."""

    def put_part(self, key: str, body: bytes) -> None:
        """Write one checkpoint part (a later write of the same part, with more items, replaces it)."""

    def keys(self, prefix: str) -> list[str]: ...
    def set_aside(self, key: str, suffix: str) -> str | None:
        """Move a result out of the way (a forced rerun); returns where it went, None if there was none."""
