"""What a node works with: its settings, and the parts of it that an attempt uses (`node.attempt`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.clock import Clock
from fleet.config import Config
from fleet.config.rules import rule_fields
from fleet.outputs.results import LOCAL_ROLE, ResultStore, writer_id
from fleet.protocol import CrawlEndKind, NodeRules
from fleet.record.messages import SiteQueue
from fleet.record.state import SiteRecord
from fleet.record.table import StateTable
from node.closing import Closer
from node.evidence import Capture
from node.runner import CrawlProcess
from profiles import NO_MOUNTS, ProfileStore, SiteMounts

StartCrawl = Callable[[dict[str, Any], Path], CrawlProcess]
Cleanup = Callable[[Path, "str | None", bool], None]  # (profile, Grid session id, forced)


@dataclass(frozen=True, kw_only=True)
class NodeKit:
    """What an attempt works with of the node that claimed it; `node.agent` makes one for each attempt.

    Who and when: the node's settings, the run's date, its clock. The run's stores. The node's machine: browser
    profiles, crawler processes and their browsers' ends. And what the attempt tells the node: that it is busy,
    that the attempt ended (for the metrics), that it beat."""

    s: AgentSettings
    run_date: str
    clock: Clock
    table: StateTable
    queue: SiteQueue
    results: ResultStore
    profiles: ProfileStore
    state_dir: Path  # the crawler's log, and `crawler.json` (what the hub's kill goes by)
    start_crawl: StartCrawl
    prepare_crawl: Callable[[], None]  # readies the next crawler process while this one's pages load
    cleanup: Cleanup
    closer: Closer  # closes a saved crawl's browser (in the background on a real node)
    capture: Capture | None  # reads a Grid session's evidence before the cleanup ends it (None: none kept)
    spot_notice: Callable[[], object]  # truthy once EC2 announced the instance's interruption
    busy: Callable[[SiteRecord], None]  # the node item says busy with this site
    job_ended: Callable[[float, CrawlEndKind | None, str | None], None]  # (claimed at, end kind or None, error)
    metric_beat: Callable[[], None]  # the node's CloudWatch heartbeat, when due
    mounts: SiteMounts = NO_MOUNTS  # the site's own directory, mounted for its crawl (AWS; nothing locally)
    grid_up: Callable[[], bool] = lambda: True  # the Grid hub answers and lists this node (False: its hub is lost)


@dataclass(frozen=True, kw_only=True)
class AgentSettings(NodeRules):
    """The protocol's rules, and what only a real node needs: who it is, its lock wait, its browser."""

    run_id: str
    instance_id: str
    lock_timeout_s: float = 60
    grid_url: str = ""
    grid_secret_file: str = ""  # the Grid secret's file (its router's credentials); "": a Grid without them
    chromium: str = "/usr/bin/chromium"
    chrome_args: tuple[str, ...] = ()
    page_load_timeout_s: float = 600
    user_agent: str = ""  # every request of the crawl sends it ("": Chromium's own); robots.txt is read for it
    #: how a crawler reaches the state table for its rate-limit slots: {table, region, endpoint_url, local}
    limits_table: tuple[tuple[str, Any], ...] = ()
    #: whose prefix of the bucket the node writes under (`fleet.outputs.results.staging_prefix`): its credentials'
    #: `aws:userid` on AWS, `<role id>:<instance id>`; "": a node with no IAM role (`local:<instance id>`)
    writer: str = ""

    @property
    def writer_id(self) -> str:
        return self.writer or writer_id(LOCAL_ROLE, self.instance_id)

    @classmethod
    def from_config(cls, c: Config, run_id: str, instance_id: str, grid_url: str, local: bool = False) -> AgentSettings:
        return cls(
            **rule_fields(c),
            run_id=run_id,
            instance_id=instance_id,
            lock_timeout_s=c.run.lock_timeout_s,
            grid_url=grid_url,
            chromium=c.browser.chromium,
            chrome_args=c.browser.extra_args,
            page_load_timeout_s=c.browser.page_load_timeout_s,
            user_agent=c.politeness.agent,
            limits_table=(
                ("table", c.aws.table),
                ("region", c.aws.region),
                ("endpoint_url", c.aws.endpoint_url),
                ("local", local),
            ),
        )
