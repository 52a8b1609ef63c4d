"""Per-domain pacing: the sites of one domain share one pace, whichever nodes crawl them.

A domain is a URL's host, with its port when it is not the scheme's default: the origin whose robots.txt rules it
(`https://shop.example` and `https://shop.example:443` are one domain; `http://127.0.0.1:8000` and
`http://localhost:8000` are two). Its base spacing is the larger (slower) of its robots.txt `Crawl-delay` for the
crawl's user agent and the configured `politeness.per_domain_s`, each with a rate limit group's headroom (1.1 x the
Crawl-delay, 1.1/per_s);
with neither, the domain is not paced until it pushes back.

AutoThrottle: an answer 429 or 503 doubles the domain's spacing (from at least `FIRST_BACKOFF_S`, to at most
`MAX_SPACING_S`); each other answer below 400 takes it `RECOVERY` of the way back toward its base. Errors other
than those two, and requests that got no answer, leave it as it is.

The arithmetic and the summary's shape are here; the DynamoDB items are `fleet.aws.pacing`'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from fleet.record.readback import as_count, as_number

#: The sort key (`Site`) of a domain's item in the rate limits' partition (`fleet.aws.ratelimit.LIMITS_PARTITION`).
DOMAIN_PREFIX = "domain:"
#: The partition of a run's pacing counters (one item per domain): `#pacing:<run_id>`, apart from the run's own
#: partition, whose items the hub and `status` read as sites.
PACING_PARTITION_PREFIX = "#pacing:"

#: Answers that say "slow down".
BACKOFF_STATUSES = frozenset({429, 503})
#: The spacing of a first back-off of a domain that had none; the most a back-off makes it.
FIRST_BACKOFF_S = 1.0
MAX_SPACING_S = 60.0
#: The share of the way back to the base each successful answer recovers.
RECOVERY = 0.1
#: Within this of its base, a spacing is back at its base.
SETTLED_S = 0.01

#: Where a domain's base spacing came from.
FROM_CRAWL_DELAY = "crawl-delay"
FROM_CONFIG = "configured"
FROM_NONE = "none"

_DEFAULT_PORTS = {"http": 80, "https": 443}


def domain_of(url: str) -> str | None:
    """`host` or `host:port` (a port other than the scheme's default); None for a URL that is not http(s) with a
    host. Hosts are lower case; an IPv6 host keeps its brackets."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    name = f"[{host}]" if ":" in host else host
    return name if port is None or port == _DEFAULT_PORTS[scheme] else f"{name}:{port}"


def base_spacing(crawl_delay: float | None, per_s: float | None, margin: float) -> tuple[float, str]:
    """A domain's base spacing in seconds and where it came from: the larger of `margin` times its Crawl-delay
    and `margin / per_s` (the configured rate); (0, "none") with neither. A Crawl-delay over MAX_SPACING_S counts
    as MAX_SPACING_S: a crawl waiting minutes between pages could not be told from a stuck one. The margin is the
    rate limit groups' headroom for the request path's varying delay (`fleet.aws.ratelimit.PACE_MARGIN`)."""
    delay = margin * min(float(crawl_delay), MAX_SPACING_S) if crawl_delay is not None and crawl_delay > 0 else 0.0
    configured = margin / per_s if per_s else 0.0
    if delay <= 0 and configured <= 0:
        return 0.0, FROM_NONE
    return (delay, FROM_CRAWL_DELAY) if delay >= configured else (configured, FROM_CONFIG)


def spacing_read_back(value: object) -> float | None:
    """A domain's stored spacing as a node may have written it: a number within (0, MAX_SPACING_S], else none."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value == value and value > 0:
        return min(float(value), MAX_SPACING_S)
    return None


def backs_off(status: int | None) -> bool:
    return status in BACKOFF_STATUSES


def throttled(spacing: float, base: float, status: int | None) -> float:
    """The domain's spacing after an answer of `status` (None: no answer), from `spacing` (never below `base`)."""
    now = max(spacing, base)
    if backs_off(status):
        return max(base, min(MAX_SPACING_S, max(2 * now, FIRST_BACKOFF_S)))
    if status is None or status >= 400 or now <= base:
        return now
    recovered = now - RECOVERY * (now - base)
    return base if recovered - base < SETTLED_S else recovered


#: Domains the summary's pacing lists at most (the counters are the nodes' writes: a node can add any number).
MAX_PACED_DOMAINS = 1000
#: What a domain's key looks like (`domain_of`: a host, and a port when not the scheme's): anything else is no
#: domain a crawl counted.
_DOMAIN_KEY = re.compile(r"[a-z0-9.\[\]:_-]{1,300}")
_FROMS = frozenset({FROM_NONE, FROM_CRAWL_DELAY, FROM_CONFIG})


def pacing_section(items: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """summary.json's `pacing`: per domain, the pages it answered in the run, its base spacing and where it came
    from, its back-offs and its spacing after the run's last answer (from the run's pacing counters). The nodes
    write those counters: a key that is no domain, or one with no count of requests, is left out, a value that is
    none of its kind reads as 0, and at most MAX_PACED_DOMAINS are listed."""
    out: dict[str, dict[str, Any]] = {}
    for i in sorted(items, key=lambda i: str(i.get("Site"))):
        domain = i.get("Site")
        requests = as_count(i.get("requests"))
        if not isinstance(domain, str) or not _DOMAIN_KEY.fullmatch(domain) or requests is None:
            continue
        if len(out) >= MAX_PACED_DOMAINS:
            break
        base_from = i.get("base_from")
        out[domain] = {
            "requests": requests,
            "base_s": spacing_read_back(as_number(i.get("base_s"))) or 0.0,
            "base_from": base_from if base_from in _FROMS else FROM_NONE,
            "backoffs": as_count(i.get("backoffs")) or 0,
            "spacing_s": spacing_read_back(as_number(i.get("spacing_s"))) or 0.0,
        }
    return out
