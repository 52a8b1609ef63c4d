"""One interface to where a run lives, so that each command that reads or drives a run is written once.

A run lives on the embedded default (the local stack: its moto server is AWS, local processes are the nodes;
cli/envs/local.py) or on AWS (cli/envs/aws.py). Both give the same stores and the same seams the hub takes (a
provider, a node control); what only one of them does (start the stack, resolve the AMI, copy node logs, stop
the hub instance) stays behind the methods below, so the flows of the `run` and the reading commands never ask
which backend they hold. cli/envs/choose.py picks the backend from the parsed arguments.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from cli.report.check import CheckReport
from fleet.aws.archive import S3RunArchive
from fleet.aws.clients import AwsClients
from fleet.aws.queue import SqsSiteQueue
from fleet.aws.results import S3ResultStore
from fleet.aws.stores import Stores, open_stores
from fleet.aws.table import DynamoStateTable
from fleet.clock import Clock
from fleet.config import Config
from fleet.outputs.results import ResultStore
from fleet.record.messages import SiteQueue
from fleet.record.partition import RunInfo
from fleet.record.table import StateTable
from hub.control.base import NodeControl
from hub.loop import RunOutcome
from hub.providers.base import ComputeProvider


class StoresOf:
    """The run's stores, opened once from an environment's `clients` and `config` (both backends share them)."""

    config: Config
    clients: AwsClients

    @cached_property
    def stores(self) -> Stores:
        return open_stores(self.clients, self.config.aws)

    @property
    def table(self) -> DynamoStateTable:
        return self.stores.table

    @property
    def queue(self) -> SqsSiteQueue:
        return self.stores.queue

    @property
    def results(self) -> S3ResultStore:
        return self.stores.results

    @property
    def archive(self) -> S3RunArchive:
        return S3RunArchive(self.clients.client("s3"), self.config.aws.bucket)


class RunHold:
    """How a run ended in this command, for the environment holding what the run needs (the local stack)."""

    def __init__(self) -> None:
        self.ended = False

    def end(self) -> None:
        """The run reached an end here: it finished, was found finished, or was interrupted. Not called when the
        command fails on the way, so that what a crashed hub left stays for the next `--resume`."""
        self.ended = True


class Environment(Protocol):
    """Where a run lives. Every member means the same on each backend; the docstrings say where they differ."""

    @property
    def config(self) -> Config:
        """The config the hub and the nodes use (on the embedded default: with the stack's addresses filled in)."""

    @property
    def clients(self) -> AwsClients: ...

    @property
    def stores(self) -> Stores:
        """The run's table, queue and bucket (on the embedded default: the running stack's moto server)."""

    @property
    def table(self) -> StateTable: ...

    @property
    def queue(self) -> SiteQueue: ...

    @property
    def results(self) -> ResultStore: ...

    @property
    def archive(self) -> S3RunArchive:
        """The bucket's run archive (`runs/<run_id>/`), where a finished run's summary and report are put."""

    @property
    def reads_archive(self) -> bool:
        """Whether a run the table no longer holds is read back from the archive (AWS, where the table's items
        expire); the embedded default's bucket goes with its stack, and runs/<run_id>/ on disk is the record."""

    @property
    def demo_url(self) -> str | None:
        """The demo site server whose own count of fetches `check` reads (embedded default only)."""

    @property
    def where(self) -> str:
        """Where runs are looked up, as a message says it: "on the local stack", "in the table T"."""

    def preflight(self) -> None:
        """Fail before anything starts when what a run needs is missing: the local nodes' tools (Java,
        Chromium, chromedriver); on AWS the table, queue and bucket."""

    def can_crawl(self) -> None:
        """Fail before anything starts when this run's browsers could not crawl here (on the embedded default,
        Chromium without its sandbox that fleet.yaml does not allow); asked once a run is known to crawl."""

    def dry_run(self, run_id: str, console: Console) -> int:
        """Print what a run would do and start nothing."""

    def latest_run(self) -> str | None:
        """The run last started here, as the table (or the local stack) knows it."""

    def finished_export(self, run_id: str, out: Path) -> dict[str, Any] | None:
        """The summary a finished run of this id exported under `out`, when the stores may have forgotten the
        run (the embedded default: moto keeps nothing once its stack stops); None on AWS."""

    def stores_up(self) -> bool:
        """Whether the stores can be read without starting anything (the local stack runs; on AWS always)."""

    def hold(self, run_id: str) -> AbstractContextManager[RunHold]:
        """What the run needs, for as long as it needs it: the local stack (started, or adopted from a crashed
        hub of this run, and its resources made), nothing on AWS. The stores are open inside."""

    def provider(self, run_id: str, clock: Clock) -> ComputeProvider:
        """The run's nodes: local processes, or EC2 instances (launching needs an environment made for a run)."""

    def control(self, run_id: str, clock: Clock) -> NodeControl:
        """How the hub stops a crawl on a node: signals, or SSM then SSH."""

    def hub_id(self) -> str:
        """This process as a hub: `local:<pid>:<ticks>`, `ec2:<instance>` or `host:<name>:<pid>:<ticks>`."""

    def hub_alive(self, hub_id: str) -> bool: ...

    def node_role(self) -> str:
        """The nodes' role id, the first half of each node's writer id (`fleet.outputs.results.writer_id`): the unique
        id of the role of `aws.instance_profile` on AWS, `local` for nodes with no IAM role (the embedded default)."""

    def save_run_config(self, run_id: str) -> str:
        """Put the run's config where its nodes read it (the stack's runs/<id>/fleet.yaml, or the bucket);
        returns where."""

    def announce(self, run_id: str) -> None:
        """Log the line that starts a run: its sites, nodes and addresses."""

    def export_node_logs(self, run_id: str, out: Path) -> Path | None:
        """Copy the nodes' logs to `<out>/<run_id>/nodes/`; None where they stay on the nodes (AWS)."""

    def finish(self, outcome: RunOutcome, report: CheckReport) -> int:
        """What follows a run's end here (on AWS the hub instance stops itself), and the command's exit code: on
        the embedded default a broken promise fails it; on AWS it is the run's own (the check is in the summary)."""

    def rerun_hubs(self, run_id: str, run: RunInfo) -> list[str]:
        """The live hubs that hold the run and pick reopened sites up. UsageError, before anything is reopened,
        when none does and none could be started (AWS without a hub launch template)."""

    def hand_over(self, run_id: str, hubs: list[str], console: Console) -> bool:
        """Say who finishes a rerun: True when a hub does (a live one, or one started now from the launch
        template), False when this command must drive the run to its end itself (the embedded default)."""

    def for_run(self) -> Environment:
        """This environment as a run needs it (the local stack with its Grid jar, AWS able to launch nodes)."""
