"""The fleet.yaml model: what a run, its fleet, its AWS resources and its sites are.

Validated once at load by pydantic (unknown keys are errors, units are in the
names), then frozen. Nothing here reads the environment; callers pass values in.

The package holds the rest of the config: the `aws:` and `crawlers:` sections
(`fleet.config.aws`, `fleet.config.crawlers`), the bounded YAML reader
(`fleet.config.guard`), loading from a file with line numbers in errors
(`fleet.config.load`), and what the config asks of the code bundle
(`fleet.config.bundle`).
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fleet.config.aws import AwsConfig, image_problem
from fleet.config.crawlers import PROJECT_PROBLEM, CrawlersConfig, crawler_roots
from fleet.crawl import contract
from fleet.crawl.crawlers import BUILTIN_OPTIONS, crawler_problem
from fleet.errors import quote
from fleet.outputs.checkpoint import SAVE_PAGES, SAVE_S
from fleet.platform import fleet_arch
from fleet.record.blocked import MAX_MARKERS, marker_problem
from fleet.record.failures import RULE_KEY, RetryPolicy
from fleet.record.ids import SITE_ID_RULE, is_site_id

#: Replaced by the demo site server's base URL on the embedded default.
DEMO_PLACEHOLDER = "{demo}"
#: The same demo server reached as `localhost`: another origin (its robots.txt has a Crawl-delay), another domain.
DEMO_LOCALHOST_PLACEHOLDER = "{demo-localhost}"


class _Model(BaseModel):
    # allow_inf_nan: `.inf` or `1e309` as a duration would pass `gt=0` and break the first sleep or deadline
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SchemaError(ValueError):
    """The problems of an `expect.fields` schema, each where in it (raised so the loader locates each one)."""

    def __init__(self, problems: list[tuple[tuple[str | int, ...], str]]):
        super().__init__("; ".join(msg for _, msg in problems))
        self.problems = problems


class ExpectConfig(_Model):
    """A site's data contract (`fleet.crawl.contract`): a result that breaks it is quarantined and the site FAILED."""

    min_items: int | None = Field(None, ge=0, strict=True, description="the fewest items a result may have")
    min_pages: int | None = Field(None, ge=0, strict=True, description="the fewest pages a result may have")
    fields: dict[str, Any] | None = Field(None, description="a JSON Schema (draft 2020-12) every item must fit")
    max_drop: float | None = Field(
        None,
        ge=0,
        le=1,
        strict=True,
        description="the largest fall in items against the previous COMPLETED run (0.5: half)",
    )

    @field_validator("fields")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        problems = contract.schema_problems(v) if v is not None else []
        if problems:
            raise SchemaError(problems)
        return v

    def rules(self) -> dict[str, Any]:
        """The keys set, as plain values."""
        return self.model_dump(mode="json", exclude_none=True)


class RetryRuleConfig(_Model):
    """A `run.retry` rule: each key unset (None) keeps the default rule's (docs/guide/failures.md)."""

    retry: bool | None = Field(None, description="retry (while attempts remain) or fail at once")
    backoff_s: float | None = Field(None, ge=0, le=86400, description="the wait before the first retry")
    factor: float | None = Field(None, ge=1, le=10, description="each further retry waits this much longer")
    max_s: float | None = Field(None, ge=0, le=86400, description="the longest wait, Retry-After included")
    other_node: bool | None = Field(None, description="the retry avoids the node the attempt failed on")


def _retry_rule(v: Any) -> Any:
    """`fail` and `retry` are short for {retry: false} and {retry: true}."""
    if isinstance(v, dict | RetryRuleConfig):
        return v
    if v in ("fail", "retry"):
        return {"retry": v == "retry"}
    raise ValueError("must be fail, retry, or a mapping of retry, backoff_s, factor, max_s, other_node")


def _retry_keys(v: dict[str, Any]) -> dict[str, Any]:
    for key in v:
        if not RULE_KEY.fullmatch(key):
            raise ValueError(f"{quote(key)} is no failure class or http_<status 400-599>")
    return v


class RunConfig(_Model):
    """How a run goes: attempts per site, the timeouts that find hangs and lost nodes, seeding, retries."""

    max_attempts: int = Field(3, ge=1, le=100, description="attempts (claims) per site before FAILED")
    hang_after_s: float = Field(120, gt=0, description="URL_CALL unchanged this long = hung")
    heartbeat_timeout_s: float = Field(90, gt=0, description="no heartbeat this long = lost")
    watch_interval_s: float = Field(30, gt=0, description="longest sleep of the hub between ticks")
    deadline_s: float = Field(21600, gt=0, description="the run ends, unfinished sites FAILED/deadline")
    spot_requeue_cap: int = Field(3, ge=0, description="spot interruptions requeued without spending an attempt")
    enqueue_grace_s: float = Field(15, gt=0, description="a QUEUED site without its message this long gets one")
    browser_start_timeout_s: float = Field(120, gt=0, description="a crawl whose browser has not started by then fails")
    lock_timeout_s: float = Field(60, ge=0, description="longest wait for a site's profile lock")
    checkpoint_pages: int = Field(
        SAVE_PAGES, ge=1, le=10000, description="a crawl's checkpointed pages are saved every this many pages"
    )
    checkpoint_s: float = Field(
        SAVE_S,
        gt=0,
        le=3600,
        description="... or this many seconds after the first unsaved page, whichever first: a retry after a "
        "node vanished repeats at most those pages",
    )
    order: Literal["longest_first", "config"] = Field(
        "longest_first",
        description="seeding order: longest expected crawl first (from the previous run), or the order of `sites`",
    )
    feed: Literal["metered", "all"] = Field("metered", description="first messages: as the nodes need them, or all")
    expect: ExpectConfig | None = Field(
        None, description="every site's data contract; a site's `expect` replaces its keys"
    )
    retry: Annotated[
        dict[str, Annotated[RetryRuleConfig, BeforeValidator(_retry_rule)]], AfterValidator(_retry_keys)
    ] = Field(
        default_factory=dict,
        description="by failure class (or http_<status>): fail, retry, or {retry, backoff_s, factor, max_s, "
        "other_node}, over the defaults",
    )

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy.of({k: v.model_dump(exclude_none=True) for k, v in self.retry.items()})


class FleetConfig(_Model):
    """The nodes: how many, of which instance types and market, and the user the crawls run as."""

    max_nodes: int = Field(20, ge=1, le=10000, description="nodes of the run at once, at most")
    min_nodes: int = Field(0, ge=0, description="nodes kept launched while sites remain open, even if fewer are queued")
    sites_per_node: int = Field(0, ge=0, description="0 = until the queue is empty; 1 = one site then exit")
    instance_types: tuple[str, ...] = Field(
        ("t3.medium", "t3a.medium"),
        min_length=1,
        description="EC2 instance types of the nodes, tried in this order (all of one architecture)",
    )
    spot: bool = Field(True, description="launch nodes as spot instances; false: on demand")
    boot_timeout_s: float = Field(600, gt=0, description="a node that never heartbeats by then is replaced")
    idle_exit_s: float = Field(20, gt=0, description="a node with no message for this long exits")
    node_watchdog: bool = Field(True, description="nodes kill their own hung crawls (fastest kill path)")
    on_demand_fallback: bool = Field(True, description="launch on-demand when no spot capacity is left")
    crawl_user: str = Field(
        "gridfleet",
        pattern=r"^[a-z_][a-z0-9_-]{0,31}$",
        description="the unprivileged user a node's agent, Grid node and Chromium run as (Chromium keeps its "
        "sandbox on); it owns the sites' profiles and locks",
    )
    crawl_uid: int = Field(
        2000,
        ge=1000,
        le=60000,
        description="that user's uid and gid on AWS nodes (the EFS access point's POSIX "
        "user); on the embedded default the local user of that name is used",
    )
    max_launches: int | None = Field(None, ge=1, description="launches allowed per run; default 3 x max_nodes + sites")
    hourly_price: dict[str, float] = Field(
        default_factory=lambda: {"t3.medium": 0.0156, "t3a.medium": 0.0141, "local": 0.0},
        description="USD per node-hour by instance type, for the report's cost estimate (spot prices vary: set yours)",
    )

    @field_validator("instance_types")
    @classmethod
    def _one_architecture(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        fleet_arch(v)  # the bundle is built for the nodes' one architecture (fleet.platform)
        return v


class HubConfig(_Model):
    """The hub's HTTP server: the live dashboard, /status and /metrics (Prometheus)."""

    http: bool = Field(True, description="serve the dashboard, /status and /metrics while the run goes")
    bind: str = Field("127.0.0.1", description="address to listen on; 0.0.0.0 exposes it to the network")
    port: int = Field(8787, ge=0, le=65535, description="0 = any free port (logged at start)")


class MetricsConfig(_Model):
    """Custom metrics in CloudWatch (the hub's fleet gauges, each node's jobs and heartbeat)."""

    cloudwatch: bool = Field(False, description="put_metric_data from the hub and the nodes")
    namespace: str = Field("gridfleet", min_length=1, max_length=255, description="the metrics' CloudWatch namespace")
    interval_s: float = Field(60, gt=0, description="the hub publishes its gauges at most this often")


#: Chromium switches `browser.extra_args` may not carry, and why: the sandbox is the code's decision alone, and a
#: debugging port would hand the browser, the profile's cookies included, to whoever reaches it.
REFUSED_SWITCHES = {
    "no-sandbox": "the sandbox is decided by the code (see browser.allow_no_sandbox)",
    "remote-debugging-address": "it opens the browser, cookies included, to whoever reaches it",
    "remote-debugging-port": "it opens the browser, cookies included, to whoever reaches it",
    "remote-allow-origins": "it lets web pages drive the browser through its debugging port",
}


def switch_name(arg: str) -> str:
    """The name of the Chromium switch `arg` sets, as Chromium reads it: `--Name=value`, `-name` and ` --name `
    all give `name`."""
    return arg.strip().lstrip("-").split("=", 1)[0].strip().lower()


def _allowed_switch(arg: str) -> str:
    name = switch_name(arg)
    if name in REFUSED_SWITCHES:
        raise ValueError(f"{arg.strip()!r}: --{name} is not allowed in extra_args: {REFUSED_SWITCHES[name]}")
    return arg


class BrowserConfig(_Model):
    """The Chromium every crawl runs in, and its chromedriver."""

    chromium: str = Field("/usr/bin/chromium", description="the Chromium binary the crawls' browser runs")
    chromedriver: str = Field("/usr/bin/chromedriver", description="the chromedriver that starts it")
    extra_args: tuple[Annotated[str, AfterValidator(_allowed_switch)], ...] = Field(
        (), description="more Chromium switches for every crawl (the sandbox's and debugging ones are refused)"
    )
    page_load_timeout_s: float = Field(
        600, gt=0, description="longest page load, and longest answer to a crawler's own HTTP request"
    )
    allow_no_sandbox: bool = Field(
        False,
        strict=True,
        description="on the embedded default, crawl with `--no-sandbox` where Chromium cannot have its sandbox "
        "(a WARNING says so); otherwise that machine refuses to crawl. A node on AWS never crawls without it",
    )


class LocalConfig(_Model):
    """Settings of the embedded default's local stack."""

    grid_session_request_timeout_s: float = Field(
        60, gt=0, description="the local Grid's --session-request-timeout: how long a new session may wait for a slot"
    )
    max_nodes: int | None = Field(
        None, ge=1, description="local nodes at most (each is a JVM and a Chromium); default 2 x CPUs"
    )

    def node_cap(self, cpus: int) -> int:
        return self.max_nodes or max(2, 2 * cpus)


class RateLimitConfig(_Model):
    """A fleet-wide request rate shared by every node crawling a site of the group (`fleet.aws.ratelimit`)."""

    per_s: float = Field(
        gt=0,
        description="requests per second to the group's sites, by the whole fleet together; "
        "requests are paced about 1.1/per_s apart, never in bursts",
    )


#: An SNS topic's ARN (partition, region, 12-digit account, topic name; `.fifo` topics too).
SNS_TOPIC_ARN_RE = r"arn:aws(-[a-z]+)*:sns:[a-z]{2}(-[a-z]+)+-\d:\d{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?"


class NotifyConfig(_Model):
    """Where the message that a run ended (or was ended overdue by the watchdog) goes (fleet.yaml's `notify`).

    The webhook URL is a secret (whoever has it can post to the channel): it is kept as a `SecretStr`, so reprs,
    errors and logs show it masked, and it is never written back out (the config the nodes read has no webhook)."""

    sns_topic_arn: str | None = Field(None, description="publish the message to this SNS topic (arn:aws:sns:...)")
    webhook_url: SecretStr | None = Field(
        None,
        exclude=True,  # never dumped: the config nodes read (fleet.config.load.dump_config) carries no webhook
        description="POST the message as Slack-compatible JSON ({text, blocks}) to this http(s) URL",
    )
    timeout_s: float = Field(10, gt=0, le=60, description="longest wait for one channel's send")

    @field_validator("sns_topic_arn")
    @classmethod
    def _arn(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(SNS_TOPIC_ARN_RE, v):
            raise ValueError(
                f"must be an SNS topic ARN (arn:aws:sns:<region>:<12-digit account>:<topic>), got {quote(v)}"
            )
        return v

    @field_validator("webhook_url")
    @classmethod
    def _webhook(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            parts = urlsplit(v.get_secret_value())
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("must be an http(s) URL")  # the value itself is not repeated: it is a secret
            if "@" in parts.netloc:  # urllib would send no Basic auth from it, and its errors quote the URL
                raise ValueError("must not hold credentials (user:password@ before the host)")
        return v

    @property
    def enabled(self) -> bool:
        return self.sns_topic_arn is not None or self.webhook_url is not None


USER_AGENT_MAX_CHARS = 300


def _header_line(v: str) -> str:
    """A value sent in an HTTP header: printable ASCII on one line, not blank."""
    bad = next((c for c in v if not " " <= c <= "~"), None)
    if bad is not None:
        raise ValueError(f"must be printable ASCII on one line, got {quote(v)} (with {bad!r})")
    if not v.strip():
        raise ValueError("must not be blank")
    return v


def _contact_url(v: str) -> str:
    parts = urlsplit(v)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be an http(s) URL, got {quote(v)}")
    return _header_line(v)


HeaderLine = Annotated[str, Field(max_length=USER_AGENT_MAX_CHARS), AfterValidator(_header_line)]


class PolitenessConfig(_Model):
    """How the crawl introduces itself: the user agent every request sends (Chromium's, the crawlers' own
    requests', robots.txt's), and whose robots.txt rules it follows."""

    contact_url: Annotated[str, Field(max_length=USER_AGENT_MAX_CHARS), AfterValidator(_contact_url)] | None = Field(
        None,
        description="where a site's operator learns who crawls and how to reach them (a page of yours), in the "
        "default user agent",
    )
    user_agent: HeaderLine | None = Field(
        None, description="the whole user agent; default `gridfleet/<version> (+<contact_url>)`"
    )
    per_domain_s: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="requests per second to one domain (host[:port]), by the whole fleet together, for every site "
        "(a site's politeness.per_domain_s overrides it); default none: a domain is paced by its robots.txt "
        "Crawl-delay and by back-off on 429/503 only",
    )

    @property
    def agent(self) -> str:
        """The user agent the crawl sends."""
        if self.user_agent:
            return self.user_agent
        try:
            version = importlib.metadata.version("gridfleet")
        except importlib.metadata.PackageNotFoundError:
            version = "0"
        return f"gridfleet/{version} (+{self.contact_url})" if self.contact_url else f"gridfleet/{version}"


class SitePoliteness(_Model):
    """A site's own politeness: its robots.txt, and its pace over the fleet's `politeness`."""

    robots: bool = Field(
        True,
        strict=True,
        description="follow the site's robots.txt for the crawl's user agent; false ignores it (the report says so)",
    )
    per_domain_s: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="this site's requests per second to its domain, fleet-wide (default: politeness.per_domain_s)",
    )


class SiteConfig(_Model):
    """One site to crawl: its id, where its crawl starts, and the crawler that crawls it."""

    id: str = Field(description="the site's id: its name in the table, the result keys, the logs and the report")
    start_url: str = Field(description="where its crawl starts: an http(s) URL ({demo}/... on the embedded default)")
    crawler: str = Field(
        "links", description="a built-in crawler (links, api) or 'package.module:Class' of the project"
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="the crawler's options (a built-in crawler's are checked at load)"
    )
    rate_limit: str | None = Field(None, description="the group of `rate_limits` whose rate this site's requests share")
    incremental: bool = Field(
        False,
        description="keep a high-water mark (the newest item ids) after each successful "
        "crawl; the next crawl stops at items already seen (`run --full` ignores it)",
    )
    politeness: SitePoliteness = Field(default_factory=SitePoliteness)
    expect: ExpectConfig | None = Field(None, description="the site's data contract, key by key over `run.expect`")
    blocked_markers: tuple[str, ...] = Field(
        (),
        max_length=MAX_MARKERS,
        description="regular expressions (case-insensitive) that mark a page as blocked, beside the defaults",
    )

    @field_validator("blocked_markers")
    @classmethod
    def _markers(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for m in v:
            problem = marker_problem(m)
            if problem:
                raise ValueError(problem)
        return v

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not is_site_id(v):
            raise ValueError(f"{quote(v)} is not a site id: {SITE_ID_RULE}")
        return v

    @field_validator("start_url")
    @classmethod
    def _url(cls, v: str) -> str:
        probe = v
        for placeholder in (DEMO_PLACEHOLDER, DEMO_LOCALHOST_PLACEHOLDER):
            if v.startswith(placeholder):
                probe = v.replace(placeholder, "http://demo.invalid", 1)
        parts = urlsplit(probe)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(
                f"must be an http(s) URL or start with {DEMO_PLACEHOLDER} or {DEMO_LOCALHOST_PLACEHOLDER}, "
                f"got {quote(v)}"
            )
        return v

    @field_validator("crawler")
    @classmethod
    def _crawler(cls, v: str, info: ValidationInfo) -> str:
        if (info.context or {}).get(PROJECT_PROBLEM):
            return v  # the project cannot be read: that is said once, at crawlers.project
        problem = crawler_problem(v, crawler_roots(info.context))
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("options")
    @classmethod
    def _options(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """A built-in crawler's options must fit its model (OptionsError names each bad key); others are free."""
        model = BUILTIN_OPTIONS.get(info.data.get("crawler", ""))
        if model is not None:
            model.read(v)
        return v

    @property
    def uses_demo(self) -> bool:
        return self.start_url.startswith((DEMO_PLACEHOLDER, DEMO_LOCALHOST_PLACEHOLDER))

    def url_for(self, demo_base_url: str | None) -> str:
        """start_url, `{demo}` replaced by the demo server's base URL, `{demo-localhost}` by the same with the host
        `localhost` (its port kept)."""
        if not self.uses_demo:
            return self.start_url
        if demo_base_url is None:
            raise ValueError(f"site {self.id}: {DEMO_PLACEHOLDER} needs the embedded default's demo server")
        base = demo_base_url.rstrip("/")
        if self.start_url.startswith(DEMO_LOCALHOST_PLACEHOLDER):
            parts = urlsplit(base)
            local = parts._replace(netloc=f"localhost:{parts.port}" if parts.port else "localhost").geturl()
            return local + self.start_url[len(DEMO_LOCALHOST_PLACEHOLDER) :]
        return base + self.start_url[len(DEMO_PLACEHOLDER) :]


class Config(_Model):
    """fleet.yaml: a run, its fleet, its AWS resources and its sites."""

    run: RunConfig = Field(default_factory=RunConfig)
    fleet: FleetConfig = Field(default_factory=FleetConfig)
    aws: AwsConfig = Field(default_factory=AwsConfig)
    browser: BrowserConfig = Field(default_factory=BrowserConfig)
    local: LocalConfig = Field(default_factory=LocalConfig)
    hub: HubConfig = Field(default_factory=HubConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    notify: NotifyConfig = Field(default_factory=NotifyConfig)
    politeness: PolitenessConfig = Field(default_factory=PolitenessConfig)
    rate_limits: dict[str, RateLimitConfig] = Field(
        default_factory=dict, description="fleet-wide rate limits by group name; a site joins one by `rate_limit`"
    )
    crawlers: CrawlersConfig | None = Field(None, description="the crawler project the sites' crawlers come from")
    sites: tuple[SiteConfig, ...] = Field(min_length=1)

    @field_validator("rate_limits")
    @classmethod
    def _group_names(cls, groups: dict[str, RateLimitConfig]) -> dict[str, RateLimitConfig]:
        for name in groups:
            if not is_site_id(name):
                raise ValueError(f"group name {quote(name)} is not valid: {SITE_ID_RULE}")
        return groups

    @field_validator("aws")
    @classmethod
    def _image_architecture(cls, aws: AwsConfig, info: ValidationInfo) -> AwsConfig:
        """An image whose SSM parameter names another architecture than the instance types' would boot nodes
        that cannot install the bundle (built for the instance types): refused before anything launches."""
        fleet = info.data.get("fleet")  # validated before aws; absent when invalid, which is said at fleet
        arch = fleet_arch(fleet.instance_types) if isinstance(fleet, FleetConfig) else None
        problems = [p for key in ("ami", "node_ami") if arch and (p := image_problem(key, getattr(aws, key), arch))]
        if problems:
            raise ValueError("; ".join(problems))
        return aws

    @field_validator("sites", mode="after")
    @classmethod
    def _unique(cls, sites: tuple[SiteConfig, ...]) -> tuple[SiteConfig, ...]:
        seen: dict[str, int] = {}
        for i, s in enumerate(sites):
            if s.id in seen:
                raise DuplicateSiteError(i, s.id, seen[s.id])
            seen[s.id] = i
        return sites

    @model_validator(mode="after")
    def _min_max(self) -> Config:
        if self.fleet.min_nodes > self.fleet.max_nodes:
            raise ValueError(
                f"fleet.min_nodes ({self.fleet.min_nodes}) is larger than fleet.max_nodes ({self.fleet.max_nodes})"
            )
        return self

    @model_validator(mode="after")
    def _rate_limit_groups(self) -> Config:
        unknown = [
            (i, s)
            for i, s in enumerate(self.sites)
            if s.rate_limit is not None and s.rate_limit not in self.rate_limits
        ]
        if unknown:
            defined = ", ".join(sorted(self.rate_limits)) or "none"
            raise ValueError(
                "; ".join(
                    f"sites[{i}] (id {quote(s.id)}): rate_limit {quote(s.rate_limit)} is not a group of rate_limits"
                    for i, s in unknown
                )
                + f" (defined: {defined})"
            )
        return self

    @property
    def launch_budget(self) -> int:
        return self.fleet.max_launches or 3 * self.fleet.max_nodes + len(self.sites)

    def site(self, site_id: str) -> SiteConfig:
        for s in self.sites:
            if s.id == site_id:
                return s
        raise KeyError(site_id)

    def expect_of(self, site: SiteConfig) -> dict[str, Any]:
        """The data contract of `site`: `run.expect`, each key the site's `expect` sets replaced."""
        run = self.run.expect.rules() if self.run.expect else {}
        return {**run, **(site.expect.rules() if site.expect else {})}

    def with_endpoint(self, endpoint_url: str) -> Config:
        return self.model_copy(update={"aws": self.aws.model_copy(update={"endpoint_url": endpoint_url})})


class DuplicateSiteError(ValueError):
    """Raised inside validation so the loader can point at the duplicate's line."""

    def __init__(self, index: int, site_id: str, first: int):
        super().__init__(f"duplicate site id {quote(site_id)} (first at sites[{first}])")
        self.index = index
        self.site_id = site_id
