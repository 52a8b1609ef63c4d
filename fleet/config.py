"""The fleet.yaml model: what a run, its fleet, its AWS resources and its sites are.

Validated once at load by pydantic (unknown keys are errors, units are in the
names), then frozen. Nothing here reads the environment; callers pass values in.
Loading from a file, with line numbers in errors, is in `fleet.config_load`.
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator

from fleet.config_crawlers import PROJECT_PROBLEM, CrawlersConfig, crawler_roots
from fleet.crawlers import BUILTIN_CRAWLERS, BUILTIN_OPTIONS, crawler_problem
from fleet.ids import SITE_ID_RULE, is_site_id

#: Replaced by the demo site server's base URL on the embedded default.
DEMO_PLACEHOLDER = "{demo}"


class _Model(BaseModel):
    # allow_inf_nan: `.inf` or `1e309` as a duration would pass `gt=0` and break the first sleep or deadline
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RunConfig(_Model):
    max_attempts: int = Field(3, ge=1, le=100, description="attempts (claims) per site before FAILED")
    hang_after_s: float = Field(120, gt=0, description="URL_CALL unchanged this long = hung")
    heartbeat_timeout_s: float = Field(90, gt=0, description="no heartbeat this long = lost")
    watch_interval_s: float = Field(30, gt=0, description="longest sleep of the hub between ticks")
    deadline_s: float = Field(21600, gt=0, description="the run ends, unfinished sites FAILED/deadline")
    spot_requeue_cap: int = Field(3, ge=0, description="spot interruptions requeued without spending an attempt")
    enqueue_grace_s: float = Field(15, gt=0, description="a QUEUED site without its message this long gets one")
    browser_start_timeout_s: float = Field(120, gt=0, description="a crawl whose browser has not started by then fails")
    lock_timeout_s: float = Field(60, ge=0, description="longest wait for a site's profile lock")
    order: Literal["longest_first", "config"] = Field(
        "longest_first",
        description="seeding order: longest expected crawl first (from the previous run), or the order of `sites`",
    )
    feed: Literal["metered", "all"] = Field("metered", description="first messages: as the nodes need them, or all")


class FleetConfig(_Model):
    max_nodes: int = Field(20, ge=1, le=10000)
    min_nodes: int = Field(0, ge=0, description="nodes kept launched while sites remain open, even if fewer are queued")
    sites_per_node: int = Field(0, ge=0, description="0 = until the queue is empty; 1 = one site then exit")
    instance_types: tuple[str, ...] = Field(("t3.medium", "t3a.medium"), min_length=1)
    spot: bool = True
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


AMI_PATTERN = r"^(ami-[0-9a-f]{8,17}|/[A-Za-z0-9_./-]{1,2047})$"  # an AMI id, or an SSM parameter name


class AwsConfig(_Model):
    region: str = "ap-northeast-2"
    stack: str = Field(
        "gridfleet",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,31}$",
        description="the stack's name (Terraform's name_prefix): every instance is tagged gridfleet:stack=<stack>, "
        "and nothing of another stack in the account is listed, adopted or terminated",
    )
    endpoint_url: str | None = None
    table: str = "TrendlyzeStatus"
    queue: str = "trendlyze-sites"
    queue_fifo: bool = Field(
        False,
        description="a FIFO queue: each (run, site, attempt) message is sent at most once within SQS's "
        "5-minute deduplication window, even if a restarted hub sends it again",
    )
    dlq: str | None = Field(None, description="dead-letter queue name; default <queue>-dlq")
    max_receive_count: int = Field(10, ge=2, description="receives before a message goes to the DLQ")
    bucket: str = "trendlyze-results"
    efs_id: str | None = None
    efs_access_point_id: str | None = Field(None, description="nodes mount EFS through this access point")
    subnet_ids: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    instance_profile: str | None = None
    ami: str | None = Field(None, pattern=AMI_PATTERN, description="an AMI id, or an SSM parameter holding one")
    node_ami: str | None = Field(None, pattern=AMI_PATTERN, description="nodes' AMI (a baked image); default aws.ami")
    key_name: str | None = None
    node_launch_template: str | None = Field(
        None, description="launch nodes from this template (type, subnet, market and user-data overridden)"
    )
    hub_launch_template: str | None = Field(
        None, description="`gridfleet rerun` on AWS starts a hub from this template when none runs"
    )
    result_ttl_days: int = Field(1, ge=1, description="expireAt = run end + this many days")
    max_retries: int = Field(8, ge=0, description="botocore 'standard' retry attempts per call")
    # Where nodes find the hub, the code and the run's config.
    hub_address: str | None = Field(
        None, description="address nodes reach the hub's Grid on; default the hub's private IPv4 from IMDS"
    )
    grid_port: int = Field(4444, ge=1, le=65535)
    grid_publish_port: int = Field(4442, ge=1, le=65535)
    grid_subscribe_port: int = Field(4443, ge=1, le=65535)
    node_port: int = Field(5555, ge=1, le=65535)
    bundle_key: str = Field("bundle/gridfleet-bundle.tar.gz", description="S3 key of the code bundle")
    hub_config_key: str = Field("config/fleet.yaml", description="S3 key of the config the hub instance runs")
    run_config_key: str = Field("runs/{run_id}/fleet.yaml", description="S3 key of a run's config, for its nodes")
    install_dir: str = "/opt/gridfleet"
    state_dir: str = "/var/lib/gridfleet"
    efs_mount: str = "/efs"
    # How the hub kills a crawl on a node (SSM, then SSH, then TerminateInstances).
    ssm_timeout_s: float = Field(60, gt=0)
    ssh_user: str = "admin"
    ssh_key_path: str | None = Field(None, description="private key the hub uses for SSH to nodes; none: no SSH")
    ssh_host_keys: Literal["console", "accept-new"] = Field(
        "console", description="console: trust only the host keys the node printed to its EC2 console output"
    )
    hub_self_stop: Literal["shutdown", "terminate", "none"] = Field(
        "shutdown", description="what the hub instance does to itself once the run is over and the fleet is gone"
    )
    imds_url: str = Field("http://169.254.169.254", description="instance metadata service (IMDSv2)")

    @property
    def queue_name(self) -> str:
        """The site queue's name: `queue`, plus the `.fifo` a FIFO queue's name must end with."""
        return self.queue if not self.queue_fifo or self.queue.endswith(".fifo") else f"{self.queue}.fifo"

    @property
    def dlq_name(self) -> str:
        """`dlq`, default <queue>-dlq; a FIFO queue's DLQ is a FIFO queue too (queue x.fifo: DLQ x-dlq.fifo)."""
        if not self.queue_fifo:
            return self.dlq or f"{self.queue}-dlq"
        name = self.dlq or f"{self.queue.removesuffix('.fifo')}-dlq"
        return name if name.endswith(".fifo") else f"{name}.fifo"

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and urlsplit(v).scheme not in ("http", "https"):
            raise ValueError("must be an http(s) URL")
        return v


class HubConfig(_Model):
    """The hub's HTTP server: the live dashboard, /status and /metrics (Prometheus)."""

    http: bool = Field(True, description="serve the dashboard, /status and /metrics while the run goes")
    bind: str = Field("127.0.0.1", description="address to listen on; 0.0.0.0 exposes it to the network")
    port: int = Field(8787, ge=0, le=65535, description="0 = any free port (logged at start)")


class MetricsConfig(_Model):
    """Custom metrics in CloudWatch (the hub's fleet gauges, each node's jobs and heartbeat)."""

    cloudwatch: bool = Field(False, description="put_metric_data from the hub and the nodes")
    namespace: str = Field("gridfleet", min_length=1, max_length=255)
    interval_s: float = Field(60, gt=0, description="the hub publishes its gauges at most this often")


class BrowserConfig(_Model):
    chromium: str = "/usr/bin/chromium"
    chromedriver: str = "/usr/bin/chromedriver"
    extra_args: tuple[str, ...] = ()
    page_load_timeout_s: float = Field(600, gt=0)


class LocalConfig(_Model):
    """Settings of the embedded default's local stack."""

    grid_session_request_timeout_s: float = Field(60, gt=0)
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
        exclude=True,  # never dumped: the config nodes read (fleet.config_load.dump_config) carries no webhook
        description="POST the message as Slack-compatible JSON ({text, blocks}) to this http(s) URL",
    )
    timeout_s: float = Field(10, gt=0, le=60, description="longest wait for one channel's send")

    @field_validator("sns_topic_arn")
    @classmethod
    def _arn(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(SNS_TOPIC_ARN_RE, v):
            raise ValueError(f"must be an SNS topic ARN (arn:aws:sns:<region>:<12-digit account>:<topic>), got {v!r}")
        return v

    @field_validator("webhook_url")
    @classmethod
    def _webhook(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            parts = urlsplit(v.get_secret_value())
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("must be an http(s) URL")  # the value itself is not repeated: it is a secret
        return v

    @property
    def enabled(self) -> bool:
        return self.sns_topic_arn is not None or self.webhook_url is not None


class SiteConfig(_Model):
    id: str
    start_url: str
    crawler: str = "links"
    options: dict[str, Any] = Field(default_factory=dict)
    rate_limit: str | None = Field(None, description="the group of `rate_limits` whose rate this site's requests share")
    incremental: bool = Field(
        False,
        description="keep a high-water mark (the newest item ids) after each successful "
        "crawl; the next crawl stops at items already seen (`run --full` ignores it)",
    )

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not is_site_id(v):
            raise ValueError(f"{v!r} is not a site id: {SITE_ID_RULE}")
        return v

    @field_validator("start_url")
    @classmethod
    def _url(cls, v: str) -> str:
        probe = v.replace(DEMO_PLACEHOLDER, "http://demo.invalid", 1) if v.startswith(DEMO_PLACEHOLDER) else v
        parts = urlsplit(probe)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"must be an http(s) URL or start with {DEMO_PLACEHOLDER}, got {v!r}")
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
        return self.start_url.startswith(DEMO_PLACEHOLDER)

    def url_for(self, demo_base_url: str | None) -> str:
        if not self.uses_demo:
            return self.start_url
        if demo_base_url is None:
            raise ValueError(f"site {self.id}: {DEMO_PLACEHOLDER} needs the embedded default's demo server")
        return demo_base_url.rstrip("/") + self.start_url[len(DEMO_PLACEHOLDER) :]


class Config(_Model):
    run: RunConfig = Field(default_factory=RunConfig)
    fleet: FleetConfig = Field(default_factory=FleetConfig)
    aws: AwsConfig = Field(default_factory=AwsConfig)
    browser: BrowserConfig = Field(default_factory=BrowserConfig)
    local: LocalConfig = Field(default_factory=LocalConfig)
    hub: HubConfig = Field(default_factory=HubConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    notify: NotifyConfig = Field(default_factory=NotifyConfig)
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
                raise ValueError(f"group name {name!r} is not valid: {SITE_ID_RULE}")
        return groups

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
                    f"sites[{i}] (id {s.id!r}): rate_limit {s.rate_limit!r} is not a group of rate_limits"
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

    def with_endpoint(self, endpoint_url: str) -> Config:
        return self.model_copy(update={"aws": self.aws.model_copy(update={"endpoint_url": endpoint_url})})


class DuplicateSiteError(ValueError):
    """Raised inside validation so the loader can point at the duplicate's line."""

    def __init__(self, index: int, site_id: str, first: int):
        super().__init__(f"duplicate site id {site_id!r} (first at sites[{first}])")
        self.index = index
        self.site_id = site_id


__all__ = [
    "BUILTIN_CRAWLERS",
    "AwsConfig",
    "BrowserConfig",
    "Config",
    "DEMO_PLACEHOLDER",
    "FleetConfig",
    "HubConfig",
    "LocalConfig",
    "MetricsConfig",
    "RateLimitConfig",
    "RunConfig",
    "SiteConfig",
]
