"""The plan `run --dry-run` prints on AWS: what the run would launch, write and kill, and what only AWS knows
(the AMI behind an SSM parameter, the instance profile, the table, queue and bucket, amazon-efs-utils, the run),
asked read-only. AWS failures are not raised: each is printed as what the failed question was and why. Every
line holds strings of the config or of AWS's answers, and is printed as plain text (`cli.views.plain.say`).

It asks the AWS environment through `AwsRun`, the few things it needs, so that the environment can hand itself
over without this module knowing it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from botocore.exceptions import BotoCoreError, ClientError
from rich.console import Console

from cli.envs.aws_account import efs_utils_ready
from cli.envs.identity import identify
from cli.views.plain import say
from fleet.aws.clients import AwsClients
from fleet.aws.errors import CREATE_ADVICE, CREDENTIALS_ADVICE, Kind, aws_failure
from fleet.aws.queue import SqsSiteQueue
from fleet.aws.results import S3ResultStore
from fleet.aws.table import DynamoStateTable
from fleet.config import Config
from fleet.errors import GridfleetError, MissingResource
from fleet.outputs.results import result_key
from hub.plan import run_date_for


class AwsRun(Protocol):
    """What the dry run reads of the AWS environment."""

    @property
    def config(self) -> Config: ...

    @property
    def clients(self) -> AwsClients: ...

    @property
    def table(self) -> DynamoStateTable: ...

    @property
    def queue(self) -> SqsSiteQueue: ...

    @property
    def results(self) -> S3ResultStore: ...

    def run_config_key(self, run_id: str) -> str: ...

    def node_user_data(self, run_id: str, hub_address: str) -> str: ...

    def resolve_ami(self) -> str: ...

    def check_instance_profile(self) -> None: ...


def missing_line(missing: list[str]) -> str:
    """One line for the fleet's resources that do not exist."""
    return "; ".join(missing) + f": {CREATE_ADVICE}"


#: A hub address as long as any IPv4, for measuring the nodes' user-data when the real one is not known here.
STAND_IN_ADDRESS = "255.255.255.255"


@dataclass
class _Questions:
    """The dry run's read-only questions to AWS, and what came of them.

    Without credentials none is asked. After an answer that says the credentials themselves are wrong, no
    other is asked either: each would fail alike.
    """

    why_not: str | None  # why AWS is not asked (anymore)
    advice: str = CREDENTIALS_ADVICE  # what to do about it
    unresolved: list[str] = field(default_factory=list)  # what could not be asked
    problems: list[str] = field(default_factory=list)  # what AWS's answers show to be wrong
    missing: list[str] = field(default_factory=list)  # the fleet's resources that do not exist

    def ask(self, what: str, question: Callable[[], str], *, resource: bool = False) -> str:
        if self.why_not is not None:
            self.unresolved.append(what)
            return f"not resolved: {self.why_not}"
        try:
            return question()
        except MissingResource as e:
            (self.missing if resource else self.problems).append(str(e))
            return f"MISSING: {e}"
        except (ClientError, BotoCoreError) as e:
            failure = aws_failure(e)
            assert failure is not None  # every ClientError and BotoCoreError is one
            if failure.kind is Kind.NO_CREDENTIALS:
                self.why_not, self.advice = failure.problem, failure.advice
                self.unresolved.append(what)
                return f"not resolved: {failure.problem}"
            if failure.kind is Kind.BAD_CREDENTIALS:
                self.why_not, self.advice = failure.problem, failure.advice
            self.problems.append(failure.line())
            return f"not resolved: {failure.problem} ({failure.call})"


def dry_run(env: AwsRun, run_id: str, console: Console) -> int:
    """Print what a run would do and touch; ask AWS only what Describe/Get/List/Head calls answer.

    Everything known from the config and the code is printed first. What only AWS knows (the AMI behind an SSM
    parameter, the instance profile, the table, queue and bucket, whether the nodes have amazon-efs-utils, the run)
    is asked when there are credentials, and otherwise named as not resolved, which is no error: exit 0 when the
    config is sound. An answer that shows something wrong (a resource missing, access denied, credentials expired,
    a stock node image without the amazon-efs-utils package in the bucket) is printed where it belongs, and the
    command then fails with one line naming the first such problem.
    """
    config, aws, fleet = env.config, env.config.aws, env.config.fleet
    problems: list[str] = []
    out = functools.partial(say, console)
    nodes = min(fleet.max_nodes, len(config.sites))
    market = ("spot" + (", on-demand fallback" if fleet.on_demand_fallback else "")) if fleet.spot else "on-demand"
    out(f"run {run_id} on AWS ({aws.region}): dry run, nothing is created, launched or written")
    out(
        f"  sites:      {len(config.sites)} ({', '.join(s.id for s in config.sites[:8])}"
        f"{', ...' if len(config.sites) > 8 else ''})",
    )
    out(
        f"  nodes:      up to {nodes} x {'/'.join(fleet.instance_types)} ({market}), "
        f"IMDSv2 required, shutdown = terminate, tagged gridfleet:stack={aws.stack} "
        f"gridfleet:run_id={run_id}",
    )
    out(
        f"  network:    subnets {', '.join(aws.subnet_ids) or '-'}; security groups "
        f"{', '.join(aws.security_group_ids) or '-'}",
    )
    _print_user_data(env, run_id, console, problems)
    asked = _Questions(None if env.clients.has_credentials() else "no AWS credentials")
    _print_answers(env, run_id, console, asked, problems)
    out(
        f"  writes:     the run's items in {aws.table}, one message per attempt in {aws.queue_name}, "
        f"s3://{aws.bucket}/{env.run_config_key(run_id)} (the nodes' config), "
        f"s3://{aws.bucket}/{result_key('<site>', run_date_for(run_id, time.time()), run_id)} per site, "
        f"s3://{aws.bucket}/runs/{run_id}/summary.json and report.html at the end"
        f"{f', metrics in CloudWatch {config.metrics.namespace}' if config.metrics.cloudwatch else ''}",
    )
    out(
        f"  kills:      {'node watchdog -> ' if fleet.node_watchdog else ''}SSM"
        f"{' -> SSH as ' + aws.ssh_user if aws.ssh_key_path else ''} -> TerminateInstances; "
        f"hub self-stop: {aws.hub_self_stop}",
    )

    for p in problems:
        out(p, label="problem:", label_style="red")
    if asked.unresolved:
        out(
            f"not resolved: {', '.join(asked.unresolved)} ({asked.why_not}: {asked.advice}; "
            f"then the dry run asks AWS, read-only)",
        )
    if problems:
        more = f" (and {len(problems) - 1} more problem(s) above)" if len(problems) > 1 else ""
        raise GridfleetError(f"dry run: {problems[0]}{more}")
    return 0


def _print_user_data(env: AwsRun, run_id: str, console: Console, problems: list[str]) -> None:
    """The nodes' user-data, rendered for the hub's address (a stand-in when this host cannot know it)."""
    aws = env.config.aws
    ident = identify(aws.imds_url)
    hub_address = aws.hub_address or ident.address
    if aws.hub_address:
        hub = f"{hub_address} (aws.hub_address)"
    elif hub_address:
        hub = f"{hub_address} (this EC2 instance's private IPv4)"
    else:
        hub = (
            "the hub instance's private IPv4 (this host is not on EC2 and aws.hub_address is unset: "
            "a hub run from here would need it)"
        )
    try:
        size = len(env.node_user_data(run_id, hub_address or STAND_IN_ADDRESS).encode())
        user_data = f"{size} bytes of cloud-config (limit 16384){'' if hub_address else ', with a stand-in address'}"
    except GridfleetError as e:
        user_data = f"cannot be made: {e}"
        problems.append(str(e))
    say(console, f"  user-data:  {user_data}; `gridfleet render node` prints it")
    say(
        console,
        f"              fetches s3://{aws.bucket}/{aws.bundle_key} and s3://{aws.bucket}/"
        f"{env.run_config_key(run_id)}, mounts each claimed site's access point of EFS {aws.efs_id or '-'} at "
        f"{aws.efs_mount}/<site>, joins the Grid on port {aws.grid_port}",
    )
    say(console, f"  hub:        {hub}")


def _print_answers(env: AwsRun, run_id: str, console: Console, asked: _Questions, problems: list[str]) -> None:
    """What only AWS knows: the AMI, the instance profile, the table, queue and bucket, amazon-efs-utils, the run."""
    aws = env.config.aws
    node_ami = aws.node_ami or aws.ami
    if aws.node_launch_template:
        ami = f"from launch template {aws.node_launch_template}" + (f" (overridden: {node_ami})" if node_ami else "")
    elif not node_ami:
        ami = "MISSING: aws.ami is not set (an AMI id, or an SSM parameter name)"
        problems.append("aws.ami is not set")
    elif node_ami.startswith("/"):
        ami = f"{node_ami} (SSM parameter) -> " + asked.ask(f"the AMI behind {node_ami}", env.resolve_ami)
    else:
        ami = node_ami
    say(console, f"  AMI:        {ami}")
    if aws.instance_profile and not aws.node_launch_template:
        profile = asked.ask("the instance profile", _answer(env.check_instance_profile, "exists"))
        say(console, f"  profile:    {aws.instance_profile}: {profile}")
    table = asked.ask("the table", _answer(lambda: env.table.check_exists(), "present"), resource=True)
    say(console, f"  table:      DynamoDB {aws.table}: {table}")
    queue = asked.ask("the queue", _answer(lambda: env.queue.check_exists(), "present"), resource=True)
    say(console, f"  queue:      SQS {aws.queue_name} (DLQ {aws.dlq_name}): {queue}")
    bucket = asked.ask("the bucket", _answer(lambda: env.results.check_exists(), "present"), resource=True)
    say(console, f"  bucket:     S3 {aws.bucket}: {bucket}")
    if bucket == "present" or asked.why_not is not None:  # a stock boot installs amazon-efs-utils from the bucket
        efs_utils = asked.ask(
            "whether the nodes have amazon-efs-utils", lambda: efs_utils_ready(env.config, env.clients)
        )
        say(console, f"  efs-utils:  {efs_utils}")
    if table == "present" or asked.why_not is not None:
        say(console, f"  run:        {asked.ask(f'whether run {run_id} exists', lambda: _run_state(env, run_id))}")
    if asked.missing:
        problems.append(missing_line(asked.missing))
    problems += asked.problems


def _answer(check: Callable[[], None], answer: str) -> Callable[[], str]:
    """A question whose answer is `answer` when `check` passes."""

    def question() -> str:
        check()
        return answer

    return question


def _run_state(env: AwsRun, run_id: str) -> str:
    existing = env.table.get_run(run_id)
    if existing is None:
        return f"{run_id} does not exist yet: `run` starts it"
    if existing.finished:
        return f"{run_id} has finished: `run --resume` exports its summary, `run` refuses the id"
    return f"{run_id} exists and is open: `run --resume` continues it, `run` refuses the id"
