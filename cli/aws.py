"""AWS commands: `render`, `aws bootstrap`, `bundle`, and the plan `run --dry-run` prints on AWS.

AWS failures are not caught here: they reach the command line's outer edge, which words them in one
line (fleet.aws.errors). The dry run is the exception: it prints what each failed question was and why.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from rich.console import Console

from cli import aws_env
from cli.bundle import build_bundle, build_lambda_zip
from cli.crawler_ship import installed_config, shipment_of
from cli.local_env import PROJECT_ROOT, grid_jar_candidates, gridfleet_home
from cli.preflight_checks import efs_utils_ready
from cloud_init import HubUserData, RenderError, boot_script, render_hub
from fleet.aws.bootstrap import ensure_resources
from fleet.aws.errors import CREDENTIALS_ADVICE, Kind, aws_failure
from fleet.config import Config
from fleet.config.bundle import platform_of
from fleet.config.load import dump_config, load_config
from fleet.errors import GridfleetError, MissingResource, UsageError
from fleet.ids import default_run_id
from fleet.platform import S3_METADATA
from fleet.results import result_key
from hub.plan import run_date_for

log = logging.getLogger("gridfleet")


def find_grid_jar(candidates: list[Path]) -> Path:
    """The Selenium server jar the bundle carries, found as the local stack finds it (imported only here)."""
    from embedded.stack import find_grid_jar as find

    return find(candidates)


def hub_params(config: Config) -> HubUserData:
    aws = config.aws
    return HubUserData(
        region=aws.region,
        bucket=aws.bucket,
        bundle_key=aws.bundle_key,
        hub_config_key=aws.hub_config_key,
        grid_port=aws.grid_port,
        grid_publish_port=aws.grid_publish_port,
        grid_subscribe_port=aws.grid_subscribe_port,
        install_dir=aws.install_dir,
        state_dir=aws.state_dir,
        self_stop=aws.hub_self_stop,
        imds_url=aws.imds_url,
        log_group=aws.log_group_hub if aws.ship_logs else "",
    )


def cmd_render(args: argparse.Namespace, console: Console) -> int:
    config = load_config(args.config)
    if args.role == "hub":
        try:
            text = render_hub(hub_params(config))
        except RenderError as e:
            raise UsageError(f"the hub's user-data cannot be made from this config: {e}") from None
    else:
        hub_address = args.hub_address or config.aws.hub_address
        if not hub_address:
            raise UsageError("rendering node user-data needs the hub's address: --hub-address or aws.hub_address")
        run_id = args.run_id or default_run_id(time.time())
        text = aws_env.connect(config).node_user_data(run_id, hub_address)
    print(boot_script(text) if args.script else text, end="")
    return 0


def cmd_aws(args: argparse.Namespace, console: Console) -> int:
    """`gridfleet aws preflight|bootstrap`."""
    if args.action == "preflight":
        from cli.preflight import cmd_preflight

        return cmd_preflight(args, console)
    return cmd_bootstrap(args, console)


def cmd_bootstrap(args: argparse.Namespace, console: Console) -> int:
    config = load_config(args.config)
    env = aws_env.connect(config)
    created = ensure_resources(env.clients, visibility_timeout_s=int(max(30, config.run.heartbeat_timeout_s)))
    for line in created:
        console.print(f"created {line}")
    aws = config.aws
    console.print(
        f"{'all present' if not created else 'ready'}: table {aws.table}, queue {aws.queue_name} "
        f"(DLQ {aws.dlq_name}), bucket {aws.bucket} in {aws.region}"
    )
    return 0


def cmd_bundle(args: argparse.Namespace, console: Console) -> int:
    """Build the bundle for the fleet's instances (their architecture and Python, whatever machine this is) and
    the Lambda package; with --upload, put them in the bucket, the bundle tagged with its target."""
    config = load_config(args.config)
    aws = config.aws
    s3 = None
    if args.upload:  # before a build of minutes: the credentials work and the bucket is there
        env = aws_env.connect(config)
        try:
            env.results.check_exists()
        except MissingResource as e:
            raise MissingResource(aws_env.missing_line([str(e)])) from None
        s3 = env.clients.client("s3")
    jar = find_grid_jar(grid_jar_candidates(gridfleet_home()))
    crawlers = shipment_of(config)
    target = platform_of(config)
    types = ", ".join(config.fleet.instance_types)
    console.print(
        f"building the code bundle for {target.describe()} (the instances: {types}): "
        "wheels of gridfleet and its dependencies, the Selenium server jar"
    )
    if crawlers is not None:
        b = crawlers.project.build
        console.print(f"  with the crawler project {b.name} {b.version} ({b.hash})")
    bundle = build_bundle(PROJECT_ROOT, args.out, jar, target=target, crawlers=crawlers)
    console.print(f"  {bundle} ({bundle.stat().st_size // 1024} KiB)")
    console.print("building the Lambda package")
    zipped = build_lambda_zip(PROJECT_ROOT, args.out)
    console.print(f"  {zipped} ({zipped.stat().st_size // 1024} KiB)")
    if s3 is None:
        console.print("not uploaded (pass --upload to put them in the bucket)")
        return 0
    folder = str(Path(aws.bundle_key).parent)
    hub_config = Path(args.config)
    if crawlers is not None:  # the hub's config names what the bundle installed, not a directory of this machine
        hub_config = args.out / "fleet.yaml"
        hub_config.write_text(dump_config(installed_config(config, crawlers.project), secrets=True))
    # the bundle's target travels with it, so its platform is known without downloading it
    tagged = {"Metadata": dict(zip(S3_METADATA, (target.machine, target.python), strict=True))}
    uploads: list[tuple[Path, str, dict[str, Any] | None]] = [
        (bundle, aws.bundle_key, tagged),
        (zipped, f"{folder}/gridfleet-lambda.zip", None),
        (hub_config, aws.hub_config_key, None),
    ]
    if args.efs_utils_deb:
        uploads.append((Path(args.efs_utils_deb), aws.efs_utils_key, None))
    for path, key, extra in uploads:
        s3.upload_file(str(path), aws.bucket, key, ExtraArgs=extra)
        console.print(f"uploaded s3://{aws.bucket}/{key}" + (f" ({target.describe()})" if extra else ""))
    return 0


# --- run --dry-run on AWS ---------------------------------------------------------------------------
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


def dry_run(env: aws_env.AwsEnv, run_id: str, console: Console) -> int:
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
    nodes = min(fleet.max_nodes, len(config.sites))
    market = ("spot" + (", on-demand fallback" if fleet.on_demand_fallback else "")) if fleet.spot else "on-demand"
    console.print(f"run {run_id} on AWS ({aws.region}): dry run, nothing is created, launched or written")
    console.print(
        f"  sites:      {len(config.sites)} ({', '.join(s.id for s in config.sites[:8])}"
        f"{', ...' if len(config.sites) > 8 else ''})"
    )
    console.print(
        f"  nodes:      up to {nodes} x {'/'.join(fleet.instance_types)} ({market}), "
        f"IMDSv2 required, shutdown = terminate, tagged gridfleet:stack={aws.stack} "
        f"gridfleet:run_id={run_id}"
    )
    console.print(
        f"  network:    subnets {', '.join(aws.subnet_ids) or '-'}; security groups "
        f"{', '.join(aws.security_group_ids) or '-'}"
    )
    _print_user_data(env, run_id, console, problems)
    asked = _Questions(None if env.clients.has_credentials() else "no AWS credentials")
    _print_answers(env, run_id, console, asked, problems)
    console.print(
        f"  writes:     the run's items in {aws.table}, one message per attempt in {aws.queue_name}, "
        f"s3://{aws.bucket}/{env.run_config_key(run_id)} (the nodes' config), "
        f"s3://{aws.bucket}/{result_key('<site>', run_date_for(run_id, time.time()), run_id)} per site, "
        f"s3://{aws.bucket}/runs/{run_id}/summary.json and report.html at the end"
        f"{f', metrics in CloudWatch {config.metrics.namespace}' if config.metrics.cloudwatch else ''}"
    )
    console.print(
        f"  kills:      {'node watchdog -> ' if fleet.node_watchdog else ''}SSM"
        f"{' -> SSH as ' + aws.ssh_user if aws.ssh_key_path else ''} -> TerminateInstances; "
        f"hub self-stop: {aws.hub_self_stop}"
    )

    for p in problems:
        console.print(f"[red]problem:[/] {p}")
    if asked.unresolved:
        console.print(
            f"not resolved: {', '.join(asked.unresolved)} ({asked.why_not}: {asked.advice}; "
            f"then the dry run asks AWS, read-only)"
        )
    if problems:
        more = f" (and {len(problems) - 1} more problem(s) above)" if len(problems) > 1 else ""
        raise GridfleetError(f"dry run: {problems[0]}{more}")
    return 0


def _print_user_data(env: aws_env.AwsEnv, run_id: str, console: Console, problems: list[str]) -> None:
    """The nodes' user-data, rendered for the hub's address (a stand-in when this host cannot know it)."""
    aws = env.config.aws
    ident = aws_env.identify(aws.imds_url)
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
    console.print(f"  user-data:  {user_data}; `gridfleet render node` prints it")
    console.print(
        f"              fetches s3://{aws.bucket}/{aws.bundle_key} and s3://{aws.bucket}/"
        f"{env.run_config_key(run_id)}, mounts EFS {aws.efs_id or '-'}"
        f"{f' (access point {aws.efs_access_point_id})' if aws.efs_access_point_id else ''} at "
        f"{aws.efs_mount}, joins the Grid on port {aws.grid_port}"
    )
    console.print(f"  hub:        {hub}")


def _print_answers(env: aws_env.AwsEnv, run_id: str, console: Console, asked: _Questions, problems: list[str]) -> None:
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
    console.print(f"  AMI:        {ami}")
    if aws.instance_profile and not aws.node_launch_template:
        profile = asked.ask("the instance profile", _answer(env.check_instance_profile, "exists"))
        console.print(f"  profile:    {aws.instance_profile}: {profile}")
    table = asked.ask("the table", _answer(lambda: env.table.check_exists(), "present"), resource=True)
    console.print(f"  table:      DynamoDB {aws.table}: {table}")
    queue = asked.ask("the queue", _answer(lambda: env.queue.check_exists(), "present"), resource=True)
    console.print(f"  queue:      SQS {aws.queue_name} (DLQ {aws.dlq_name}): {queue}")
    bucket = asked.ask("the bucket", _answer(lambda: env.results.check_exists(), "present"), resource=True)
    console.print(f"  bucket:     S3 {aws.bucket}: {bucket}")
    if bucket == "present" or asked.why_not is not None:  # a stock boot installs amazon-efs-utils from the bucket
        efs_utils = asked.ask(
            "whether the nodes have amazon-efs-utils", lambda: efs_utils_ready(env.config, env.clients)
        )
        console.print(f"  efs-utils:  {efs_utils}")
    if table == "present" or asked.why_not is not None:
        console.print(f"  run:        {asked.ask(f'whether run {run_id} exists', lambda: _run_state(env, run_id))}")
    if asked.missing:
        problems.append(aws_env.missing_line(asked.missing))
    problems += asked.problems


def _answer(check: Callable[[], None], answer: str) -> Callable[[], str]:
    """A question whose answer is `answer` when `check` passes."""

    def question() -> str:
        check()
        return answer

    return question


def _run_state(env: aws_env.AwsEnv, run_id: str) -> str:
    existing = env.table.get_run(run_id)
    if existing is None:
        return f"{run_id} does not exist yet: `run` starts it"
    if existing.finished:
        return f"{run_id} has finished: `run --resume` exports its summary, `run` refuses the id"
    return f"{run_id} exists and is open: `run --resume` continues it, `run` refuses the id"
