"""How a crawler process paces its requests: the site's rate limit group, then the request's domain.

A request waits for its slot of the site's fleet-wide group (`fleet.aws.ratelimit`, if the site joins one), then
for its slot of its domain (`fleet.aws.pacing`): the domain's is taken last, so that no wait after it makes the
request later than the slot the domain's pace gave it. Each answer's status moves the domain's AutoThrottle
spacing and counts in the run's pacing of the domain (summary.json's `pacing`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from fleet.aws.ratelimit import PACE_MARGIN
from fleet.crawl.pacing import backs_off, base_spacing, domain_of


class Domains(Protocol):
    """The fleet-wide pace of each domain (`fleet.aws.pacing.DynamoDomainPacer`)."""

    def wait(self, domain: str, base: float) -> float: ...

    def answered(self, domain: str, base: float, status: int | None) -> float: ...

    def count(
        self, run_id: str, domain: str, base: tuple[float, str], answers: tuple[int, int], spacing_s: float
    ) -> None: ...


#: A crawl sends a domain's counters after this many answers, at a back-off, and when it ends (`flush`): a crawl
#: killed in between leaves at most this many answers uncounted in the report's pacing.
COUNT_EVERY = 10


class Pacer:
    """`CrawlContext.pace` and `CrawlContext.answered` of one crawl.

    `group` waits for the site's rate limit slot (None: the site has no group); `domains` paces domains for a
    run (`run_id`) at the configured `per_domain_s` (None: no configured rate)."""

    def __init__(
        self,
        group: Callable[[], None] | None,
        domains: Domains,
        run_id: str,
        per_domain_s: float | None = None,
    ):
        self.group, self.domains, self.run_id = group, domains, run_id
        self.per_domain_s = per_domain_s
        #: Per domain: its base spacing and where it came from, as its last request had them.
        self.bases: dict[str, tuple[float, str]] = {}
        #: Per domain: the answers not sent yet (requests, back-offs) and the spacing after the last.
        self.pending: dict[str, tuple[int, int, float]] = {}

    def pace(self, url: str, crawl_delay: float | None) -> None:
        if self.group is not None:
            self.group()
        domain = domain_of(url)
        if domain is None:
            return
        base = self.bases[domain] = base_spacing(crawl_delay, self.per_domain_s, PACE_MARGIN)
        self.domains.wait(domain, base[0])

    def answered(self, url: str, status: int | None) -> None:
        domain = domain_of(url)
        if domain is None:
            return
        base = self.bases.setdefault(domain, base_spacing(None, self.per_domain_s, PACE_MARGIN))
        spacing = self.domains.answered(domain, base[0], status)
        n, backoffs, _ = self.pending.get(domain, (0, 0, spacing))
        self.pending[domain] = (n + 1, backoffs + int(backs_off(status)), spacing)
        if n + 1 >= COUNT_EVERY or backs_off(status):
            self._send(domain)

    def flush(self) -> None:
        """Send every domain's counters not sent yet (the crawl ends)."""
        for domain in list(self.pending):
            self._send(domain)

    def _send(self, domain: str) -> None:
        n, backoffs, spacing = self.pending.pop(domain)
        self.domains.count(self.run_id, domain, self.bases[domain], (n, backoffs), spacing)


def table_client(spec: dict[str, Any]) -> Any:
    """The state table's DynamoDB client, as the job names it: {table, region, endpoint_url, local}."""
    from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
    from fleet.config.aws import AwsConfig

    aws = AwsConfig(region=spec["region"], endpoint_url=spec.get("endpoint_url"), table=spec["table"])
    return AwsClients(aws, credentials=LOCAL_CREDENTIALS if spec.get("local") else None).client("dynamodb")
