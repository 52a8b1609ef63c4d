"""Where a run's results go in the result store, and the store as the code that uses it sees it (`ResultStore`).

A result belongs to its run. The daily run (its id is its date, `2026-11-21`, written so)
keeps the key `<site>/<YYYYMMDD>/result.json`; any other run of that date (a
manual run, a demo) stores its result beside it,
`<site>/<YYYYMMDD>/<run_id>/result.json`, never over it and never instead of it
(`20261121` is such another run: only the dashed date is the daily run's id).
Within a run, a result already stored means the site is done (a retry skips it).

A result that breaks its site's data contract (`fleet.crawl.contract`) is not the result: it is kept in quarantine,
`<site>/<YYYYMMDD>[/<run_id>]/quarantine/<attempt>.json` (`quarantine_key`), a name no result key, listing of
results or skip check ever takes for one.

A node writes nothing at those keys: everything it writes is under its own prefix, `staging/<writer>/`
(`staging_prefix`; its writer id is its role's id and its instance id, `writer_id`, as STS puts them in its
session and the bucket's policy checks them), as new objects only: the result it staged
(`staged_result_key`), which the hub copies to the site's key (`ResultStore.promote`); the items of each
checkpoint save, one part object per checkpoint (`fleet.outputs.checkpoint`, `part_key`); an attempt's evidence (a
screenshot, the page's HTML, its console, a record: `evidence_key`, one of `EVIDENCE_FILES`) and a quarantined
result (`staged_quarantine_key`), which the export stores again beside the run's result as the hub's copy:
`<site>/<YYYYMMDD>[/<run_id>]/evidence/<attempt>/<file>` and `.../quarantine/<attempt>.json`.

`put_new` writes only a key that does not exist: of two writers (a zombie node
and the attempt that replaced it) exactly one result lands and nothing is
overwritten. The S3 adapter is `fleet.aws.results`; the tests and the simulator
use an in-memory one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from fleet.errors import quote
from fleet.record.ids import check_run_id, check_site_id


def is_daily_run(run_id: str, run_date: str) -> bool:
    """Whether `run_id` is the day's run of `run_date` (YYYYMMDD): its id is that date as the daily run's id is
    written (`fleet.record.ids.default_run_id`: 2026-11-21), and only so. Any other id, `20261121` or `20261121--` too,
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


def staged_quarantine_key(writer: str, site: str, run_date: str, run_id: str | None, attempt: int) -> str:
    """Where node `writer` keeps attempt `attempt`'s result that broke the contract, under its own prefix:
    `staging/<writer>/<site>/<YYYYMMDD>[/<run_id>]/quarantine/<attempt>.json` (the hub copies it beside the result,
    `quarantine_key`, when it exports)."""
    _count(attempt, "attempt", 1, 999_999)
    return f"{staged_beside(writer, site, run_date, run_id, 'quarantine')}{attempt}.json"


#: The files an evidence record may hold: every key written or read back under `evidence/` names one of them.
EVIDENCE_FILES = ("evidence.json", "screenshot.png", "page.html", "console.json")


def _check_ids(site: str, run_date: str, run_id: str | None) -> None:
    check_site_id(site)
    if run_id is not None:
        check_run_id(run_id)
    _check_date(run_date)


def _check_date(run_date: str) -> None:
    if not (len(run_date) == 8 and run_date.isdigit() and run_date.isascii()):
        raise ValueError(f"run date {run_date!r} is not YYYYMMDD")


def _beside_result(site: str, run_date: str, run_id: str | None, folder: str) -> str:
    """`<site>/<YYYYMMDD>[/<run_id>]/<folder>/`, the ids checked again: ValueError when one is not what it claims."""
    _check_ids(site, run_date, run_id)
    return result_key(site, run_date, run_id).rpartition("/")[0] + f"/{folder}/"


def evidence_prefix(site: str, run_date: str, run_id: str | None = None, writer: str | None = None) -> str:
    """Where the evidence of a run's attempts of a site goes: beside its result, `.../evidence/` (the hub's copy), or
    under node `writer`'s own prefix (what the node wrote). The ids are checked again (they may come back from
    AWS): ValueError when one is not what it claims."""
    if writer is not None:
        return staged_beside(writer, site, run_date, run_id, "evidence")
    return _beside_result(site, run_date, run_id, "evidence")


def _count(value: object, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} {value!r} is not an integer from {low} to {high}")
    return value


def part_key(
    site: str, run_date: str, run_id: str | None, attempt: int, claim: int, seq: int, writer: str | None = None
) -> str:
    """`staging/<writer>/<site>/<YYYYMMDD>[/<run_id>]/parts/<attempt>-<claim>/<seq>.json`: the `seq`-th checkpoint
    part of the attempt whose claim made the record's version `claim`, under the prefix of the node that held the
    claim (`writer` None: where nodes of an earlier version kept it, beside the result). Every part is checked (the
    numbers come back from the table): ValueError for a bad id or number."""
    _count(attempt, "attempt", 1, 999_999)
    _count(claim, "claim version", 1, 10**12)
    _count(seq, "part number", 1, 999_999)
    folder = (
        staged_beside(writer, site, run_date, run_id, "parts")
        if writer is not None
        else _beside_result(site, run_date, run_id, "parts")
    )
    return f"{folder}{attempt}-{claim}/{seq:06d}.json"


def evidence_key(
    site: str, run_date: str, run_id: str | None, attempt: int, name: str, writer: str | None = None
) -> str:
    """`<site>/<YYYYMMDD>[/<run_id>]/evidence/<attempt>/<name>` (the hub's copy), or the same under node `writer`'s
    prefix (what the node wrote); ValueError for a bad id, attempt or name."""
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError(f"attempt {attempt!r} is not a positive integer")
    if name not in EVIDENCE_FILES:
        raise ValueError(f"{name!r} is not an evidence file ({', '.join(EVIDENCE_FILES)})")
    return f"{evidence_prefix(site, run_date, run_id, writer)}{attempt}/{name}"


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
#: The type the hub stores each evidence file as (whatever the node that wrote it said).
EVIDENCE_TYPES = {
    "evidence.json": "application/json",
    "screenshot.png": "image/png",
    "page.html": PAGE_TEXT,
    "console.json": "application/json",
}


def evidence_headers(key: str, content_type: str) -> dict[str, str]:
    """The object headers an evidence file is stored with. The page's own HTML (`page.html`), or anything a
    browser would open as a document, is stored as plain text to download: opened from the bucket as HTML it
    would run the crawled page's scripts on the bucket's origin, which is the run report's."""
    media = content_type.partition(";")[0].strip().lower()
    if key.rpartition("/")[2] == "page.html" or media in DOCUMENT_TYPES:
        return {"ContentType": PAGE_TEXT, "ContentDisposition": "attachment"}
    return {"ContentType": content_type}


# --- what nodes write: under their own prefix ----------------------------------------------------------------------
#
# A node may write only under `staging/<writer>/` (infra/terraform: `staging/${aws:userid}/*`, and only as new
# objects): its writer id is its credentials' own `aws:userid`, which for an instance's role is `<role id>:<instance
# id>`, so no node can write under another's prefix, nor anywhere a reader takes a result, a part or evidence from
# without checking whose it is. The hub makes a staged result the site's result (a copy it makes itself, to the key
# `result_key` derives), and re-stores evidence when it exports; a retry reads the parts of the claims its
# checkpoint names, each from the prefix of the node that held that claim.

STAGING = "staging/"
#: A writer id: the role's unique id (IAM's `AROA...`, or `local` for the nodes of one machine, which have no IAM)
#: and the node's id, as `aws:userid` spells an instance role's session: `<role id>:<instance id>`.
ROLE_RE = re.compile(r"[A-Za-z0-9]{1,128}")
WRITER_RE = re.compile(rf"(?P<role>{ROLE_RE.pattern}):(?P<node>i-[0-9A-Za-z-]{{1,40}})")
#: The role part of the writer ids of nodes that have no IAM role (the embedded default, the simulator).
LOCAL_ROLE = "local"


def writer_id(role: str, node: str) -> str:
    """The writer id of node `node` whose role's unique id is `role`; ValueError when either is not of its shape."""
    return _checked_writer(f"{role}:{node}")


def _checked_writer(writer: str) -> str:
    if WRITER_RE.fullmatch(writer) is None:
        raise ValueError(f"writer {quote(writer)} is not <role id>:<node id>")
    return writer


def writer_node(writer: str) -> str | None:
    """The node a writer id names, or None when it is no writer id."""
    m = WRITER_RE.fullmatch(writer)
    return m["node"] if m else None


def staging_prefix(writer: str) -> str:
    """`staging/<writer>/`, everything node `writer` may write."""
    return f"{STAGING}{_checked_writer(writer)}/"


def staged_beside(writer: str, site: str, run_date: str, run_id: str | None, folder: str) -> str:
    """`staging/<writer>/<site>/<YYYYMMDD>[/<run_id>]/<folder>/`: what a node writes beside a run's result, under
    its own prefix (the ids checked again: ValueError)."""
    return staging_prefix(writer) + _beside_result(site, run_date, run_id, folder)


def staged_result_key(writer: str, site: str, run_date: str, run_id: str | None, attempt: int, claim: int) -> str:
    """Where node `writer` stages its result of the attempt `attempt` whose claim made the record's version `claim`:
    `staging/<writer>/<site>/<YYYYMMDD>[/<run_id>]/result/<attempt>-<claim>.json`, a new object only."""
    _count(attempt, "attempt", 1, 999_999)
    _count(claim, "claim version", 1, 10**12)
    return f"{staged_beside(writer, site, run_date, run_id, 'result')}{attempt}-{claim}.json"


@dataclass(frozen=True)
class RunKeys:
    """The keys of one run's objects, for code that walks many of its sites (the export): the run id, its date and
    the nodes' role id are checked once, when `of` makes it, and each site's id once, by `site`; what is derived
    from them after that is not checked again. Attempt numbers and node ids still are, each where it is used."""

    run_id: str
    run_date: str
    role: str

    @classmethod
    def of(cls, run_id: str, run_date: str, role: str = LOCAL_ROLE) -> RunKeys:
        """ValueError, naming it, when the run id, the date (YYYYMMDD) or the role id is not one."""
        check_run_id(run_id)
        _check_date(run_date)
        if not ROLE_RE.fullmatch(role):
            raise ValueError(f"role id {quote(role)} is not one")
        return cls(run_id, run_date, role)

    def site(self, site: str) -> SiteKeys:
        """The keys of one site of the run; ValueError when `site` is not a site id."""
        check_site_id(site)
        return SiteKeys(self, site, result_key(site, self.run_date, self.run_id))


@dataclass(frozen=True)
class SiteKeys:
    """The keys of one site of a run (`RunKeys.site`): its result, and its attempts' evidence and quarantine."""

    run: RunKeys
    site: str
    result: str  # `result_key`

    def _beside(self, folder: str) -> str:
        return f"{self.result.rpartition('/')[0]}/{folder}/"

    def writer(self, node: str) -> str:
        """The writer id of the node that held an attempt (ValueError when the node is no node id)."""
        return writer_id(self.run.role, node)

    def staged_evidence_prefix(self, writer: str, attempt: int) -> str:
        """`staging/<writer>/<site>/<date>[/<run>]/evidence/<attempt>/`: what the node wrote of the attempt."""
        _count(attempt, "attempt", 1, 999_999)
        return f"{staging_prefix(writer)}{self._beside('evidence')}{attempt}/"

    def evidence(self, attempt: int, name: str) -> str:
        """The hub's copy of an evidence file, beside the result (`evidence_key`)."""
        _count(attempt, "attempt", 1, 999_999)
        if name not in EVIDENCE_FILES:
            raise ValueError(f"{name!r} is not an evidence file ({', '.join(EVIDENCE_FILES)})")
        return f"{self._beside('evidence')}{attempt}/{name}"

    def staged_quarantine(self, writer: str, attempt: int) -> str:
        """`staged_quarantine_key` of the attempt."""
        _count(attempt, "attempt", 1, 999_999)
        return f"{staging_prefix(writer)}{self._beside('quarantine')}{attempt}.json"

    def quarantine(self, attempt: int) -> str:
        """`quarantine_key` of the attempt: the hub's copy, beside the result."""
        _count(attempt, "attempt", 1, 999_999)
        return f"{self._beside('quarantine')}{attempt}.json"


def aside_key(key: str, suffix: str) -> str:
    """`site/20261121/result.json` -> `site/20261121/result.replaced-<suffix>.json` (kept, no longer the result)."""
    stem, dot, ext = key.rpartition(".")
    return f"{stem}.replaced-{suffix}.{ext}" if dot else f"{key}.replaced-{suffix}"


#: What `ResultStore.promote` answers.
PROMOTED, EXISTED, MISSING, TOO_LARGE = "promoted", "existed", "missing", "too-large"
#: The largest staged result the hub makes a site's result: S3's limit for a copy in one request (5 GiB).
RESULT_MAX_BYTES = 5 * 1024**3


class ResultStore(Protocol):
    """The result store: S3 on AWS and on the embedded default (`fleet.aws.results`), in memory in the tests and the
    simulator."""

    def exists(self, key: str) -> bool: ...
    def put_new(self, key: str, body: bytes) -> bool:
        """Write `body` unless the key exists; True if this call wrote it."""

    def get(self, key: str) -> bytes:
        """The object's bytes; a key that does not exist raises as S3 does (a ClientError `NoSuchKey`)."""

    def put_evidence(self, key: str, body: bytes, content_type: str) -> None:
        """The hub's copy of one file of an attempt's evidence, stored as `evidence_headers` says."""

    def put_staged(self, key: str, body: bytes, content_type: str = "application/json") -> bool:
        """What a node writes (a staged result, a part, evidence, a quarantined result), under its own prefix and
        only as a new object; True if this call wrote it, False when the key was there already."""

    def promote(self, staged: str, key: str) -> str:
        """Make the staged object `staged` the result at `key` (the hub's copy, with the result's own type and tag):
        PROMOTED; EXISTED when `key` holds a result already (it stays); MISSING when nothing is staged there;
        TOO_LARGE when the staged object is over RESULT_MAX_BYTES (nothing is copied)."""

    def keys(self, prefix: str) -> list[str]: ...
    def set_aside(self, key: str, suffix: str) -> str | None:
        """Move a result out of the way (a forced rerun); returns where it went, None if there was none."""
