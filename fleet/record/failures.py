"""Why an attempt failed, by class, and what each class's retry is: one classification for the node agent,
`gridfleet crawl` and the simulator.

A failed attempt has a class (`FailureClass`), and for an HTTP answer its status. The crawler process classes its
own exception (`of_exception`): an HTTP status (`of_status`; 401, 403 and 429 are `blocked`, as is a page that
shows a challenge), a network failure by Chromium's `net::ERR_*` code or Python's exception (`dns`, `connect`,
`tls`, `timeout`), else `error`. What the node sees from outside gives the rest: `hang` (its watchdog or the
hub's), `crash` (the crawler process or its browser died), `contract`, `robots`.

`run.retry` maps a class (or one HTTP status, `http_404`) to a rule: retry or fail, after what backoff, and
whether on another node. `RetryPolicy.decide` turns a failure into the site's next step.
"""

from __future__ import annotations

import re
import socket
import ssl
import urllib.error
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from enum import StrEnum
from typing import Any

from fleet.record.state import Reason


class FailureClass(StrEnum):
    DNS = "dns"  # the host's name did not resolve
    CONNECT = "connect"  # no connection (refused, reset, unreachable)
    TLS = "tls"  # the TLS handshake or the certificate failed
    TIMEOUT = "timeout"  # the page or the connection took longer than allowed
    HTTP_4XX = "http_4xx"  # the site answered 4xx (401, 403 and 429 are `blocked`)
    HTTP_5XX = "http_5xx"  # the site answered 5xx
    BLOCKED = "blocked"  # 401, 403, 429, or a page that shows a challenge or "access denied" (`blocked_markers`)
    HANG = "hang"  # a navigation made no progress for `run.hang_after_s`
    CRASH = "crash"  # the crawler process or its browser died, or the browser never started
    CONTRACT = "contract"  # the result broke the site's data contract
    ROBOTS = "robots"  # the site's robots.txt disallows its start URL
    ERROR = "error"  # the crawler's own exception


def known_class(value: object) -> FailureClass | None:
    """`value` as a class, or None (a value read back from the table, which nodes write to)."""
    try:
        return FailureClass(value) if isinstance(value, str) else None
    except ValueError:
        return None


def known_status(value: object) -> int | None:
    """`value` as an HTTP status (100-599), or None (a number read back from the table is a Decimal)."""
    if isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value():
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599 else None


#: The statuses that mean the site refused the crawler rather than failed.
BLOCKING_STATUSES = frozenset({401, 403, 429})
#: The longest `Retry-After` taken as given; a longer one waits this long (the most the retry rule allows anyway).
RETRY_AFTER_MAX_S = 24 * 3600.0


@dataclass(frozen=True)
class Failure:
    cls: FailureClass
    status: int | None = None  # the HTTP status, for http_4xx, http_5xx and blocked-by-status
    retry_after_s: float | None = None  # the answer's Retry-After, in seconds

    @property
    def label(self) -> str:
        """How reports name it: `http_4xx 404`, `blocked 403`, `timeout`."""
        return f"{self.cls} {self.status}" if self.status is not None else str(self.cls)

    @property
    def key(self) -> str | None:
        """The `run.retry` key of its status (`http_404`), which comes before its class's."""
        return f"http_{self.status}" if self.status is not None else None


def of_status(status: int, retry_after_s: float | None = None) -> Failure | None:
    """The failure an HTTP answer of `status` is (None for < 400)."""
    if status in BLOCKING_STATUSES:
        return Failure(FailureClass.BLOCKED, status, retry_after_s)
    if 400 <= status < 500:
        return Failure(FailureClass.HTTP_4XX, status, retry_after_s)
    if 500 <= status <= 599:
        return Failure(FailureClass.HTTP_5XX, status, retry_after_s)
    return None


def retry_after(value: str | None) -> float | None:
    """A `Retry-After` header's delay in seconds (only its delta-seconds form; a date or garbage gives None)."""
    if value is None or not value.strip().isdigit():
        return None
    return min(float(value.strip()), RETRY_AFTER_MAX_S)


#: Chromium's network error codes (as chromedriver reports them: `net::ERR_NAME_NOT_RESOLVED`), by class.
_NET_CODES: tuple[tuple[re.Pattern[str], FailureClass], ...] = (
    (re.compile(r"net::ERR_(NAME_NOT_RESOLVED|NAME_RESOLUTION_FAILED|DNS_\w+)"), FailureClass.DNS),
    (re.compile(r"net::ERR_(CERT_\w+|SSL_\w+|BAD_SSL_\w+|\w*TLS\w*)"), FailureClass.TLS),
    (re.compile(r"net::ERR_(CONNECTION_TIMED_OUT|TIMED_OUT)"), FailureClass.TIMEOUT),
    (
        re.compile(r"net::ERR_(CONNECTION_\w+|ADDRESS_\w+|INTERNET_DISCONNECTED|NETWORK_\w+|EMPTY_RESPONSE)"),
        FailureClass.CONNECT,
    ),
)


def of_text(text: str) -> FailureClass | None:
    """The class a network error's message names (Chromium's `net::ERR_*`), if any."""
    for pattern, cls in _NET_CODES:
        if pattern.search(text):
            return cls
    return None


def of_os_error(e: BaseException) -> FailureClass | None:
    """The class of a network exception Python raised (urllib wraps the cause in URLError.reason)."""
    cause: object = e.reason if isinstance(e, urllib.error.URLError) else e
    if isinstance(cause, socket.gaierror):
        return FailureClass.DNS
    if isinstance(cause, ssl.SSLError | ssl.CertificateError):
        return FailureClass.TLS
    if isinstance(cause, TimeoutError | socket.timeout):
        return FailureClass.TIMEOUT
    if isinstance(cause, ConnectionError | OSError):
        return FailureClass.CONNECT
    return None


def of_exception(e: BaseException) -> Failure:
    """The failure a crawler's exception is: its own (`classified`), Selenium's timeout, a network error by its
    type or message, else `error`."""
    own = getattr(e, "failure", None)
    if isinstance(own, Failure):
        return own
    if type(e).__name__ == "TimeoutException":  # selenium's page load timeout (not imported: no browser needed)
        return Failure(FailureClass.TIMEOUT)
    cls = of_os_error(e) if isinstance(e, OSError) else None
    return Failure(cls or of_text(str(e)) or FailureClass.ERROR)


#: The class of an attempt that ended for a reason of the site's own, when the node gave none. The fleet's reasons
#: (lost, spot, busy, deadline, killed, no-nodes) have none: they are not the site's failure.
_REASON_CLASS = {
    Reason.HANG: FailureClass.HANG,
    Reason.ERROR: FailureClass.ERROR,
    Reason.CONTRACT: FailureClass.CONTRACT,
    Reason.ROBOTS: FailureClass.ROBOTS,
}


def of_reason(reason: Reason) -> Failure | None:
    cls = _REASON_CLASS.get(reason)
    return None if cls is None else Failure(cls)


# --- retries -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryRule:
    """Retry (after `backoff_s`, growing by `factor` each failed attempt, at most `max_s`; on another node if
    `other_node`) or fail at once."""

    retry: bool = True
    backoff_s: float = 0.0
    factor: float = 2.0
    max_s: float = 900.0
    other_node: bool = False

    def delay(self, failures: int, retry_after_s: float | None = None) -> float:
        """The wait before the next attempt, the `failures`th failure of the site (1 = the first); a `Retry-After`
        the site gave replaces the backoff, within `max_s`."""
        if retry_after_s is not None:
            return min(retry_after_s, self.max_s)
        return min(self.backoff_s * self.factor ** max(0, failures - 1), self.max_s)


FAIL = RetryRule(retry=False)

#: The defaults of `run.retry`: a site that answers 404 or 410 is gone for today; one that says "too many
#: requests" or "unavailable" is asked again after its Retry-After or a minute; a blocked crawl waits 5 minutes
#: and goes to another node (another IP on AWS); a broken contract or robots.txt fails, since a retry gets the same.
DEFAULT_RULES: Mapping[str, RetryRule] = {
    "dns": RetryRule(backoff_s=30),
    "connect": RetryRule(backoff_s=15),
    "tls": RetryRule(backoff_s=30),
    "timeout": RetryRule(backoff_s=15),
    "http_4xx": RetryRule(backoff_s=30),
    "http_404": FAIL,
    "http_410": FAIL,
    "http_429": RetryRule(backoff_s=60),
    "http_5xx": RetryRule(backoff_s=30),
    "http_503": RetryRule(backoff_s=60),
    "blocked": RetryRule(backoff_s=300, other_node=True),
    "hang": RetryRule(),
    "crash": RetryRule(),
    "contract": FAIL,
    "robots": FAIL,
    "error": RetryRule(),
}

#: `run.retry`'s keys: a class, or `http_<status>` for one status of 400-599.
RULE_KEY = re.compile(r"^(?:" + "|".join(c.value for c in FailureClass) + r"|http_[45][0-9][0-9])$")


def rule_from_config(value: Mapping[str, Any], base: RetryRule) -> RetryRule:
    """A rule as fleet.yaml writes it (a mapping of RetryRule's fields; `fail` is {retry: false}) over `base`."""
    return replace(base, **dict(value))


@dataclass(frozen=True)
class RetryPolicy:
    rules: Mapping[str, RetryRule] = field(default_factory=lambda: dict(DEFAULT_RULES))

    @classmethod
    def of(cls, overrides: Mapping[str, Mapping[str, Any]] | None) -> RetryPolicy:
        """The defaults with `run.retry`'s rules over them (a key's mapping over that key's default)."""
        rules = dict(DEFAULT_RULES)
        for key, value in (overrides or {}).items():
            base = rules.get(key)
            if base is None or not base.retry:  # a key that failed by default retries as its class does
                base = DEFAULT_RULES.get(_class_key(key), FAIL)
            rules[key] = rule_from_config(value, base if base.retry else RetryRule())
        return cls(rules)

    def rule(self, failure: Failure) -> RetryRule:
        """The rule of the failure's status if one is set, else its class's."""
        key = failure.key
        if key is not None and key in self.rules:
            return self.rules[key]
        return self.rules.get(str(failure.cls), RetryRule())

    def __hash__(self) -> int:  # NodeRules, which holds one, is hashed
        return hash(tuple(sorted(self.rules.items())))


def _class_key(key: str) -> str:
    """`http_404` -> `http_4xx`: the class a status key falls back on."""
    if key.startswith("http_4"):
        return "http_4xx"
    if key.startswith("http_5"):
        return "http_5xx"
    return key


@dataclass(frozen=True)
class Next:
    """What follows a failed attempt: retry (not before `not_before`, not on `avoid`) or fail."""

    retry: bool
    not_before: float | None = None
    avoid: str | None = None


def decide(policy: RetryPolicy, failure: Failure | None, *, failures: int, now: float, instance_id: str | None) -> Next:
    """The next step after the site's `failures`th failed attempt (the caller checks attempts remain); an attempt
    with no class (the node was lost) is retried at once."""
    if failure is None:
        return Next(True)
    rule = policy.rule(failure)
    if not rule.retry:
        return Next(False)
    wait = rule.delay(failures, failure.retry_after_s)
    return Next(True, now + wait if wait > 0 else None, instance_id if rule.other_node else None)


def failure_label(cls_value: object, status: object) -> str | None:
    """The label of a (class, status) read back (`http_4xx 404`), None if the class is none."""
    cls = known_class(cls_value)
    return None if cls is None else Failure(cls, known_status(status)).label


def failures_by_class(outcomes: list[tuple[str | None, int | None]]) -> dict[str, int]:
    """Counts of failed attempts by label (`http_4xx 404`, `timeout`), from (class, status) pairs read back."""
    out: dict[str, int] = {}
    for cls_value, status in outcomes:
        label = failure_label(cls_value, status)
        if label is not None:
            out[label] = out.get(label, 0) + 1
    return dict(sorted(out.items()))


def failure_of_event(value: object) -> Failure | None:
    """The failure a crawler process reported (`{"class", "status", "retry_after"}`), if it is one: it comes from
    code a page may have steered, so what is not a class, a status or a sane delay is none."""
    if not isinstance(value, Mapping):
        return None
    cls = known_class(value.get("class"))
    if cls is None:
        return None
    after = value.get("retry_after")
    ok = isinstance(after, int | float) and not isinstance(after, bool) and 0 <= after <= RETRY_AFTER_MAX_S
    return Failure(cls, known_status(value.get("status")), float(after) if ok else None)  # type: ignore[arg-type]


def failure_to_event(failure: Failure) -> dict[str, Any]:
    """The failure as the crawler process reports it (`failure_of_event` reads it)."""
    return {"class": str(failure.cls), "status": failure.status, "retry_after": failure.retry_after_s}
