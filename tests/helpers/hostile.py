"""Bodies anyone allowed to send to the site queue could send: a node whose browser a page took over has the
node's role, and so may send SQS any body up to its 256 KB. The unit tests decode them and run an agent over them
on the in-memory queue; the adapter tests send them to SQS on the moto server."""

from __future__ import annotations

import json

from fleet.record.messages import encode

RUN = "2026-11-21"  # the run of tests.helpers.fake_node's Rig

#: SQS's largest body, in bytes.
SQS_MAX_BODY = 262_144


def body(**fields: object) -> str:
    """A body with the fields of a site message, each as given (the honest run, site and attempt when left out)."""
    return json.dumps({"run_id": RUN, "site": "s1", "attempt": 1, **fields})


def _largest() -> str:
    """A body of SQS's largest size: a site message whose site id fills it."""
    empty = body(site="")
    return body(site="s" * (SQS_MAX_BODY - len(empty)))


#: Bodies that are no site message: decode makes each a BadMessage.
NOT_SITE_MESSAGES: dict[str, str] = {
    "a list": json.dumps([RUN, "s1", 1]),
    "a string": json.dumps("s1"),
    "a number": "1",
    "null": "null",
    "no attempt": json.dumps({"run_id": RUN, "site": "s1"}),
    "numbers for ids": body(run_id=20261121, site=1),
    "a list for a site": body(site=["s1"]),
    "attempt a float": body(attempt=1.0),
    "attempt a bool": body(attempt=True),
    "attempt a string": body(attempt="1"),
    "attempt null": body(attempt=None),
    "attempt NaN": body().replace('"attempt": 1', '"attempt": NaN'),
    "attempt of 4000 digits": body().replace('"attempt": 1', '"attempt": ' + "9" * 4000),
    "attempt of 5000 digits": body().replace('"attempt": 1', '"attempt": ' + "9" * 5000),  # past json's own limit
    "attempt negative": body(attempt=-1),
    "attempt 0": body(attempt=0),
    "attempt past the range": body(attempt=10**9),
    "a body of 256 KB": _largest(),
    "invalid JSON": body()[:-1],
    "not JSON at all": "attempt 1 of s1, please",
    "nested 256 KB deep": "[" * SQS_MAX_BODY,
    "an empty run id": body(run_id=""),
    "a run id of 2 KB": body(run_id="r" * 2048),
    "an empty site id": body(site=""),
    "a site id of 2 KB": body(site="s" * 2048),
    "a site id ending in a newline": body(site="s1\n"),
    "a site id that is a path": body(site="../s1"),
    "a site id with a terminal escape": body(site="\x1b[2J\x1b[31ms1"),
    "a site id with a lone surrogate": body().replace('"site": "s1"', '"site": "\\ud800"'),
}

#: Bodies of the shape of a site message that no record explains: a site the node's run does not have, a run
#: that does not exist.
NO_RECORD: dict[str, str] = {
    "an unknown site of the node's run": encode(RUN, "nope", 1),
    "a site of another run": encode("another-run", "s1", 1),
}

HOSTILE: dict[str, str] = {**NOT_SITE_MESSAGES, **NO_RECORD}
