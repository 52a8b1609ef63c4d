"""The shapes of the JSON documents a run leaves behind, key by key: what each key holds, and when it is there.

`runs/<run_id>/summary.json` is written by `fleet.outputs.summary.build_summary` (its `sites` entries by
`site_entry` and `attempt_entry`), and then by the hub at the run's end (`hub.loop.Hub`: instances, pacing,
max_attempts, crawlers, queue) and by `gridfleet run`'s own check (`cli.report.check.attach`: check). A site's
result document is `node.result.RESULT`. Scripts read both: docs/reference/summary.md is generated from these
shapes, and a test holds what the writers write to them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from fleet.outputs.summary import UNREADABLE_LISTED
from fleet.record.failures import FailureClass
from fleet.record.state import Outcome, Reason, RunStatus, SiteStatus


@dataclass(frozen=True)
class Key:
    """One value of a JSON document. `type`: its JSON type (`string | null` when it may be null). An object has
    its own `keys`, or is a map whose every value is `each` (its keys are what `named` says); an array's items are
    `each`. `when`: when the key is there (empty: always). `values`: the strings it may hold, when they are few."""

    type: str
    meaning: str
    when: str = ""
    keys: Mapping[str, Key] | None = None
    each: Key | None = None
    named: str = ""
    values: tuple[str, ...] = ()


def _values(enum: type[StrEnum]) -> tuple[str, ...]:
    return tuple(m.value for m in enum)


COUNT = "integer | null"
_FAILED = "the attempt failed"

ATTEMPT: Mapping[str, Key] = {
    "instance_id": Key("string", "the node it ran on"),
    "start": Key("number", "when the node claimed it (epoch seconds)"),
    "end": Key("number | null", "when it ended; null: it runs"),
    "outcome": Key("string | null", "how it ended; null: it runs", values=_values(Outcome)),
    "kill_path": Key("string", "how it was killed: watchdog, local, ssm, ssh or terminate", when="it was killed"),
    "failure_class": Key("string", "why it failed, by class", when=_FAILED, values=_values(FailureClass)),
    "http_status": Key("integer | null", "the HTTP status it failed on, if it failed on one", when=_FAILED),
    "items": Key(
        COUNT, "the items it saved, not those of the checkpoint it resumed from (null: its node counted none)"
    ),
    "pages": Key(COUNT, "the pages it fetched"),
    "collisions": Key(COUNT, "items it left out: another of the same id and other content came first"),
    "skipped": Key(COUNT, "items it left out for want of an id"),
    "robots_skipped": Key(COUNT, "pages it did not fetch: the site's robots.txt disallows them"),
    "collided": Key("array", "the first ids that collided", when="it had collisions", each=Key("string", "an item id")),
}

_NOT_COMPLETED = "; null when COMPLETED"

SITE: Mapping[str, Key] = {
    "run_status": Key("string", "where the site is in the run", values=_values(RunStatus)),
    "site_status": Key("string", "what its crawl last reported", values=_values(SiteStatus)),
    "attemptCount": Key("integer", "attempts started (claims), spot requeues given back"),
    "failure_reason": Key(
        "string | null", "why its last attempt ended without a result" + _NOT_COMPLETED, values=_values(Reason)
    ),
    "failure_class": Key(
        "string | null", "the class of its last failed attempt" + _NOT_COMPLETED, values=_values(FailureClass)
    ),
    "http_status": Key("integer | null", "the HTTP status that attempt failed on, if any" + _NOT_COMPLETED),
    "retry_at": Key("number | null", "QUEUED after a failure: its next attempt starts after this (epoch seconds)"),
    "result_key": Key("string | null", "the S3 key of its result"),
    "items": Key("integer | null", "COMPLETED: the items of its result"),
    "pages": Key("integer", "the pages the crawl got to (COMPLETED: those of its result)"),
    "attempts": Key("array", "its attempts, oldest first", each=Key("object", "one attempt", keys=ATTEMPT)),
    "error": Key("string | null", "the error its last failed attempt recorded"),
    "instance_id": Key("string | null", "the node of its current or last attempt"),
    "lastUpdateEpoch": Key("number | null", "when its record last changed, by the writer's clock (epoch seconds)"),
    "spot_requeues": Key("integer", "attempts given back (a spot interruption, a busy profile): not counted"),
    "attemptBase": Key("integer", "attemptCount when an operator last reran it: max_attempts counts from here"),
    "robots": Key("boolean", "false: its robots.txt was ignored (fleet.yaml's politeness.robots)"),
}

_HUB_END = "the hub wrote the summary at the run's end"
_COUNTED = Key("integer", "how many")

SUMMARY: Mapping[str, Key] = {
    "run_id": Key("string", "the run's id"),
    "run_date": Key("string", "YYYYMMDD, the date part of the run's result keys"),
    "started_at": Key("number", "when the run started (epoch seconds)"),
    "finished_at": Key("number", "when it finished (epoch seconds)"),
    "sites": Key("object", "every site of the run", each=Key("object", "one site", keys=SITE), named="site id"),
    "nodes": Key(
        "object",
        "the run's nodes",
        keys={
            "launched": Key("integer", "nodes launched for the run"),
            "left_running": Key("integer", "nodes still running when the summary was written (not 0: exit 1)"),
        },
    ),
    "counts": Key("object", "sites by run status, every status named", each=_COUNTED, named="run status"),
    "totals": Key(
        "object",
        "the run's counts, from its sites' entries",
        keys={
            "items": Key("integer", "items of the COMPLETED sites' results"),
            "pages": Key("integer", "pages of the COMPLETED sites' results"),
            "pages_fetched": Key("integer", "pages every attempt fetched, retries included"),
            "collisions": Key(
                "integer", "items attempts left out: another of the same id and other content came first"
            ),
            "skipped": Key("integer", "items attempts left out for want of an id"),
            "robots_skipped": Key("integer", "pages robots.txt disallowed"),
        },
    ),
    "failures": Key(
        "object", "failed attempts by class", each=_COUNTED, named="class label (`timeout`, `http_4xx 404`)"
    ),
    "finish_reason": Key("string", "why the run ended", values=("done", "deadline", "no-nodes", "teardown")),
    "unreadable": Key(
        "object",
        "what the run's last read of the table could not read",
        keys={
            "values": Key("integer", "values read as absent"),
            "items": Key("integer", "items left out (site items no hub seeded, node items of no node, ...)"),
            "first": Key("array", f"the first {UNREADABLE_LISTED} of them", each=Key("string", "one, in a line")),
        },
    ),
    "instances": Key(
        "object",
        "each node of the run, for the report's cost",
        when=_HUB_END,
        named="instance id",
        each=Key(
            "object",
            "one node",
            keys={
                "type": Key("string | null", "its instance type (null: the provider did not say)"),
                "started_at": Key("number", "when its agent started (epoch seconds)"),
                "ended_at": Key("number", "its last heartbeat (epoch seconds)"),
                "sites_done": Key("integer", "sites it finished"),
            },
        ),
    ),
    "pacing": Key(
        "object",
        "each domain's pace in the run, from the nodes' pacing counters",
        when="the hub, or `gridfleet run` of a run already finished, wrote the summary",
        named="domain (host[:port])",
        each=Key(
            "object",
            "one domain",
            keys={
                "requests": Key("integer", "the pages it answered in the run"),
                "base_s": Key("number", "its base spacing between requests, in seconds"),
                "base_from": Key(
                    "string", "where that spacing came from", values=("none", "crawl-delay", "configured")
                ),
                "backoffs": Key("integer", "its back-offs (after a 429 or 503)"),
                "spacing_s": Key("number", "its spacing after the run's last answer, in seconds"),
            },
        ),
    ),
    "max_attempts": Key("integer", "run.max_attempts: what `gridfleet check` bounds attempts by", when=_HUB_END),
    "crawlers": Key(
        "object",
        "which code produced the results: the crawler project as installed",
        when=_HUB_END + ", with a crawler project",
        keys={
            "name": Key("string", "the project's name"),
            "version": Key("string", "its version"),
            "hash": Key("string", "sha256:<hex> of the files it ships"),
        },
    ),
    "queue": Key(
        "object",
        "the site queue's depths at the run's end",
        when=_HUB_END + ", and the depths could be read",
        keys={
            "visible": Key("integer", "messages waiting"),
            "in_flight": Key("integer", "messages received and not yet deleted"),
            "dlq": Key("integer", "messages in the dead-letter queue (see `gridfleet check`)"),
        },
    ),
    "check": Key(
        "object",
        "the run's own check, as `gridfleet check` makes it",
        when="`gridfleet run` checked the run its hub finished",
        keys={
            "ok": Key("boolean", "true: nothing broke"),
            "violations": Key("array", "each promise the run broke", each=Key("string", "one, in a line")),
            "notes": Key("array", "what is worth knowing but broke nothing", each=Key("string", "one, in a line")),
            "checked": Key("object", "what was checked, counted", each=_COUNTED, named="what (sites, kills, ...)"),
            "false_losses": Key("integer", "attempts that ended lost or spot, and nodes terminated as lost"),
            "false_loss_details": Key("array", "each of them", each=Key("string", "one, in a line")),
        },
    ),
}
