"""The one message a run's end sends (fleet.yaml's `notify`), built from summaries, and how it is sent.

Pure: the message is built from this run's summary (`fleet.outputs.summary`), the previous run's and where the report
is, so its content is tested without AWS. Sending goes through `Channel`s (SNS and webhook in
`fleet.aws.notify`); `send_all` gives each channel its own bounded try and logs a failure as one line naming
the channel and why, never raising: a message that cannot be sent must not fail the run. A webhook URL is a
secret: only `redact_url`'s form of it (scheme and host) is ever logged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from fleet.logs import event
from fleet.outputs.summary import totals

log = logging.getLogger("gridfleet.notify")

#: Sites listed by name in each part of a message; the rest are counted (the report lists them all).
MAX_LISTED = 50
#: SNS refuses a subject over 100 characters.
MAX_SUBJECT = 100
#: A FAILED site's error is cut to this many characters (the summary keeps it whole).
MAX_ERROR = 200
#: Slack refuses a message of more than 50 blocks.
MAX_BLOCKS = 50
#: Slack refuses a section block's text over 3000 characters.
MAX_BLOCK_TEXT = 3000


@dataclass(frozen=True)
class Message:
    subject: str  # one line: the SNS subject, the first line of the text
    text: str  # plain text, the whole message

    def slack(self) -> dict[str, Any]:
        """The Slack-compatible JSON body: `text` (every receiver shows it), and the same in section blocks."""
        text = slack_escape(self.text)
        blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": t}} for t in _chunks(text)[:MAX_BLOCKS]]
        return {"text": text, "blocks": blocks}


class Channel(Protocol):
    @property
    def name(self) -> str:
        """How logs name the channel: `sns:<topic arn>`, `webhook:<scheme>://<host>` (never the whole URL)."""

    def send(self, message: Message) -> None:
        """Send once, within the channel's own timeout; raise on failure."""


@dataclass(frozen=True)
class Changes:
    """Sites whose end differs from the previous run's (sites in both runs only)."""

    previous_run: str | None
    newly_failing: tuple[str, ...] = ()
    fixed: tuple[str, ...] = ()


def _statuses(summary: Mapping[str, Any] | None) -> dict[str, str]:
    sites = (summary or {}).get("sites")
    if not isinstance(sites, Mapping):
        return {}
    return {str(k): str(e.get("run_status")) for k, e in sites.items() if isinstance(e, Mapping)}


def changes(summary: Mapping[str, Any], previous: Mapping[str, Any] | None) -> Changes:
    """Newly failing (COMPLETED before, FAILED now) and fixed (FAILED before, COMPLETED now), as the report says."""
    if not previous:
        return Changes(None)
    now, before = _statuses(summary), _statuses(previous)
    both = sorted(now.keys() & before.keys())
    return Changes(
        str(previous.get("run_id") or "?"),
        tuple(s for s in both if now[s] == "FAILED" and before[s] == "COMPLETED"),
        tuple(s for s in both if now[s] == "COMPLETED" and before[s] == "FAILED"),
    )


def failed_sites(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(site, reason) of every FAILED site, by site id; the reason with the error when there is one."""
    out = []
    for site, e in sorted((summary.get("sites") or {}).items()):
        if isinstance(e, Mapping) and e.get("run_status") == "FAILED":
            reason = str(e.get("failure_reason") or "unknown")
            error = e.get("error")
            out.append((str(site), f"{reason}: {_one_line(str(error))[:MAX_ERROR]}" if error else reason))
    return out


def totals_of(summary: Mapping[str, Any]) -> dict[str, int]:
    """A summary's `totals`, or (an older summary has none) those its sites' entries give."""
    given = summary.get("totals")
    if isinstance(given, Mapping) and all(isinstance(given.get(k), int) for k in ("items", "pages")):
        return {k: int(v) for k, v in given.items() if isinstance(v, int) and not isinstance(v, bool)}
    sites = summary.get("sites")
    return totals(sites if isinstance(sites, Mapping) else {})


def totals_lines(summary: Mapping[str, Any], previous: Mapping[str, Any] | None) -> list[str]:
    """The run's items and pages (against the previous run's items), and the items its attempts left out."""
    t = totals_of(summary)
    line = f"items: {t.get('items', 0):,} from {t.get('pages', 0):,} pages"
    if previous:
        before = totals_of(previous).get("items", 0)
        change = f", {(t.get('items', 0) - before) / before:+.0%}" if before else ""
        line += f" (previous run {before:,}{change})"
    line += f"; {t.get('pages_fetched', 0):,} pages fetched, retries included"
    left = f"left out: {t.get('collisions', 0):,} collisions (same id, other content), "
    left += f"{t.get('skipped', 0):,} items without an id"
    return [line, left]


def run_message(summary: Mapping[str, Any], previous: Mapping[str, Any] | None, report_at: str) -> Message:
    """The message of a finished run: counts, each FAILED site with its reason, what changed, where the report is."""
    run_id = str(summary.get("run_id") or "?")
    counts = summary.get("counts") or {}
    done, failed = int(counts.get("COMPLETED") or 0), int(counts.get("FAILED") or 0)
    total = len(summary.get("sites") or {})
    outcome = "all COMPLETED" if not failed else f"{failed} FAILED"
    subject = f"gridfleet run {run_id} finished: {outcome} ({done}/{total} COMPLETED)"
    lines = [subject, f"finish: {summary.get('finish_reason') or '-'}; COMPLETED {done}, FAILED {failed}"]
    lines += totals_lines(summary, previous)
    fails = failed_sites(summary)
    if fails:
        lines += ["", f"FAILED ({len(fails)}):", *_listed([f"- {s}: {why}" for s, why in fails])]
    ch = changes(summary, previous)
    if ch.previous_run is None:
        lines += ["", "no previous run to compare with"]
    else:
        lines += ["", f"since run {ch.previous_run}:"]
        lines += [f"newly failing ({len(ch.newly_failing)}): " + _names(ch.newly_failing)]
        lines += [f"fixed ({len(ch.fixed)}): " + _names(ch.fixed)]
    lines += ["", f"report: {report_at}"]
    return Message(_subject(subject), "\n".join(lines))


def overdue_message(run_id: str, failed: Sequence[str], grace_s: float, summary_at: str | None) -> Message:
    """The message of a run the watchdog ended: its hub was gone past the deadline and grace."""
    subject = f"gridfleet run {run_id} overdue: ended by the watchdog, {len(failed)} site(s) FAILED (deadline)"
    lines = [
        subject,
        f"the run was still RUNNING {grace_s:.0f}s past its deadline with no hub finishing it; "
        "its open sites are FAILED with reason deadline and the run is FINISHED",
    ]
    if failed:
        lines += ["", f"FAILED ({len(failed)}):", *_listed([f"- {s}: deadline" for s in failed])]
    lines += ["", f"summary: {summary_at or 'not archived (no bucket)'}"]
    return Message(_subject(subject), "\n".join(lines))


def send_all(channels: Iterable[Channel], message: Message, *, run_id: str) -> list[str]:
    """Send `message` on every channel; the names of those that took it. A failure is logged (one line: which
    channel, why) and the next channel is tried; nothing is raised."""
    sent = []
    for ch in channels:
        try:
            ch.send(message)
        except Exception as e:  # noqa: BLE001 - a lost message must never fail the run
            event(log, "notify-failed", logging.WARNING, run_id=run_id, channel=ch.name, error=_why(e))
            continue
        sent.append(ch.name)
        event(log, "notified", run_id=run_id, channel=ch.name)
    return sent


def redact_url(url: str) -> str:
    """What of a secret URL may be logged: its scheme and host (the path and query hold the secret)."""
    try:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.hostname or '?'}/..."
    except ValueError:  # a malformed IPv6 host: still a name to log, not a failure of the run
        return "?://?/..."


def slack_escape(text: str) -> str:
    """Slack reads &, < and > as markup: escaped, a site's error shows as written."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _why(e: BaseException) -> str:
    return _one_line(f"{type(e).__name__}: {e}")[:300]


def _one_line(s: str) -> str:
    return " ".join(s.split())


def _subject(s: str) -> str:
    s = _one_line(s)
    return s if len(s) <= MAX_SUBJECT else s[: MAX_SUBJECT - 3] + "..."


def _listed(lines: list[str]) -> list[str]:
    more = len(lines) - MAX_LISTED
    return lines[:MAX_LISTED] + ([f"... and {more} more (see the report)"] if more > 0 else [])


def _names(sites: Sequence[str]) -> str:
    if not sites:
        return "none"
    more = len(sites) - MAX_LISTED
    return ", ".join(sites[:MAX_LISTED]) + (f" ... and {more} more" if more > 0 else "")


def _chunks(text: str) -> list[str]:
    """The text cut at line ends into pieces a section block takes (a longer line is cut where it must be)."""
    out: list[str] = []
    cur = ""
    for line in text.split("\n"):
        while len(line) > MAX_BLOCK_TEXT:
            out += [cur] if cur else []
            out.append(line[:MAX_BLOCK_TEXT])
            cur, line = "", line[MAX_BLOCK_TEXT:]
        if cur and len(cur) + 1 + len(line) > MAX_BLOCK_TEXT:
            out.append(cur)
            cur = line
        else:
            cur = f"{cur}\n{line}" if cur else line
    return [c for c in [*out, cur] if c.strip()]
