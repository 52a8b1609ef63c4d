"""AWS commands: `render`, `aws bootstrap`, `bundle`, and the plan `run --dry-run` prints on AWS."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from botocore.exceptions import ClientError, NoCredentialsError
from rich.console import Console

from cloud_init import HubUserData, RenderError, render_hub
from fleet.bootstrap import ensure_resources
from fleet.config import Config
from fleet.errors import GridfleetError, MissingResource, UsageError
from hub import aws_env
from hub.bundle import build_bundle, build_lambda_zip
from hub.local_env import PROJECT_ROOT, grid_jar_candidates, gridfleet_home
from fleet.local.stack import find_grid_jar

log = logging.getLogger("gridfleet")


def hub_params(config: Config) -> HubUserData:
    aws = config.aws
    return HubUserData(region=aws.region, bucket=aws.bucket, bundle_key=aws.bundle_key,
                       hub_config_key=aws.hub_config_key, grid_port=aws.grid_port,
                       grid_publish_port=aws.grid_publish_port, grid_subscribe_port=aws.grid_subscribe_port,
                       install_dir=aws.install_dir, state_dir=aws.state_dir, self_stop=aws.hub_self_stop,
                       imds_url=aws.imds_url)


def cmd_render(args: argparse.Namespace, console: Console, config: Config) -> int:
    if args.role == "hub":
        try:
            text = render_hub(hub_params(config))
        except RenderError as e:
            raise UsageError(f"the hub's user-data cannot be made from this config: {e}") from None
    else:
        from hub.loop import default_run_id

        hub_address = args.hub_address or config.aws.hub_address
        if not hub_address:
            raise UsageError("rendering node user-data needs the hub's address: --hub-address or aws.hub_address")
        run_id = args.run_id or default_run_id(time.time())
        text = aws_env.connect(config).node_user_data(run_id, hub_address)
    print(text, end="")
    return 0


def cmd_bootstrap(args: argparse.Namespace, console: Console, config: Config) -> int:
    env = aws_env.connect(config)
    try:
        created = ensure_resources(env.clients, visibility_timeout_s=int(max(30, config.run.heartbeat_timeout_s)))
    except NoCredentialsError:
        raise MissingResource("no AWS credentials: configure a profile, environment variables or a role") from None
    except ClientError as e:
        raise GridfleetError(f"AWS refused: {e}") from None
    for line in created:
        console.print(f"created {line}")
    aws = config.aws
    console.print(f"{'all present' if not created else 'ready'}: table {aws.table}, queue {aws.queue_name} "
                  f"(DLQ {aws.dlq_name}), bucket {aws.bucket} in {aws.region}")
    return 0


def cmd_bundle(args: argparse.Namespace, console: Console, config: Config) -> int:
    jar = find_grid_jar(grid_jar_candidates(gridfleet_home()))
    console.print("building the code bundle (wheels of gridfleet and its dependencies, the Selenium server jar)")
    bundle = build_bundle(PROJECT_ROOT, args.out, jar)
    console.print(f"  {bundle} ({bundle.stat().st_size // 1024} KiB)")
    console.print("building the Lambda package")
    zipped = build_lambda_zip(PROJECT_ROOT, args.out)
    console.print(f"  {zipped} ({zipped.stat().st_size // 1024} KiB)")
    if not args.upload:
        console.print("not uploaded (pass --upload to put them in the bucket)")
        return 0
    aws = config.aws
    s3 = aws_env.connect(config).clients.client("s3")
    folder = str(Path(aws.bundle_key).parent)
    uploads = [(bundle, aws.bundle_key), (zipped, f"{folder}/gridfleet-lambda.zip"),
               (Path(args.config), aws.hub_config_key)]
    if args.efs_utils_deb:
        uploads.append((Path(args.efs_utils_deb), f"{folder}/amazon-efs-utils.deb"))
    try:
        for path, key in uploads:
            s3.upload_file(str(path), aws.bucket, key)
            console.print(f"uploaded s3://{aws.bucket}/{key}")
    except NoCredentialsError:
        raise MissingResource("no AWS credentials: configure a profile, environment variables or a role") from None
    except ClientError as e:
        raise GridfleetError(f"upload to s3://{aws.bucket} failed: {e}") from None
    return 0


def dry_run(env: aws_env.AwsEnv, run_id: str, console: Console) -> int:
    """Print what a run would do and touch: only Describe/Get/List/Head calls are made."""
    config, aws = env.config, env.config.aws
    problems: list[str] = []
    try:
        env.preflight()
        resources = "present"
    except MissingResource as e:
        resources = f"MISSING: {e}"
        problems.append(str(e))
    try:
        ami = env.resolve_ami()
    except MissingResource as e:
        ami = f"MISSING: {e}"
        problems.append(str(e))
    ident = aws_env.identify(aws.imds_url)
    hub_address = aws.hub_address or ident.address or "<aws.hub_address is needed off EC2>"
    try:
        user_data = env.node_user_data(run_id, hub_address)
        ud = f"{len(user_data.encode())} bytes of cloud-config (limit 16384)"
    except (GridfleetError, ValueError) as e:
        ud = f"cannot render: {e}"
        problems.append(ud)
    nodes = min(config.fleet.max_nodes, len(config.sites))
    market = "spot" + (", on-demand fallback" if config.fleet.on_demand_fallback else "") if config.fleet.spot \
        else "on-demand"
    console.print(f"run {run_id} on AWS ({aws.region}) — dry run, nothing is created, launched or written")
    console.print(f"  sites:      {len(config.sites)} ({', '.join(s.id for s in config.sites[:8])}"
                  f"{', ...' if len(config.sites) > 8 else ''})")
    console.print(f"  nodes:      up to {nodes} x {'/'.join(config.fleet.instance_types)} ({market}), "
                  f"IMDSv2 required, shutdown = terminate")
    console.print(f"              subnets {', '.join(aws.subnet_ids) or '-'}; security groups "
                  f"{', '.join(aws.security_group_ids) or '-'}; profile {aws.instance_profile or '-'}; AMI {ami}")
    console.print(f"  user-data:  {ud}; EFS {aws.efs_id or '-'} at {aws.efs_mount}; hub Grid {hub_address}:"
                  f"{aws.grid_port}")
    console.print(f"  state:      DynamoDB {aws.table}, SQS {aws.queue_name} (DLQ {aws.dlq_name}), S3 {aws.bucket}: "
                  f"{resources}")
    console.print(f"  writes:     s3://{aws.bucket}/{env.run_config_key(run_id)} (the nodes' config), "
                  f"s3://{aws.bucket}/<site>/<YYYYMMDD>/result.json per site")
    console.print(f"  kills:      SSM{' -> SSH as ' + aws.ssh_user if aws.ssh_key_path else ''} -> "
                  f"TerminateInstances; hub self-stop: {aws.hub_self_stop}")
    for p in problems:
        console.print(f"[red]problem:[/] {p}")
    return 1 if problems else 0
