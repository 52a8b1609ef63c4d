"""AWS commands: `render`, `aws bootstrap`, `bundle`, `grid-secret` (the AWS hub's), and the plan `run --dry-run`
prints on AWS.

AWS failures are not caught here: they reach the command line's outer edge, which words them in one
line (fleet.aws.errors). The dry run is the exception: it prints what each failed question was and why.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from cli.envs import aws as aws_env
from cli.envs.aws_plan import missing_line
from cli.envs.grid_jar import find_grid_jar, grid_jar_candidates
from cli.envs.home import PROJECT_ROOT, gridfleet_home
from cli.packaging.built import check_built
from cli.packaging.bundle import build_bundle, build_lambda_zip
from cli.packaging.crawler_ship import CrawlerShipment, installed_config, shipment_of
from cloud_init import HubUserData, RenderError, boot_script, render_hub
from fleet.aws.bootstrap import ensure_resources
from fleet.config import Config
from fleet.config.bundle import platform_of
from fleet.config.load import dump_config, load_config
from fleet.errors import MissingResource, UsageError, quote
from fleet.grid_auth import make_hub_files
from fleet.platform import S3_METADATA, BundlePlatform
from fleet.record.ids import RUN_ID_RULE, default_run_id, is_run_id

log = logging.getLogger("gridfleet")


def hub_params(config: Config) -> HubUserData:
    aws = config.aws
    return HubUserData(
        region=aws.region,
        bucket=aws.bucket,
        bundle_key=aws.bundle_key,
        hub_config_key=aws.hub_config_key,
        grid_secret_parameter=aws.grid_secret_parameter,
        grid_secret_key=aws.kms_key_alias,
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


#: The most `--current` can hold: an SSM parameter's value (4 KB), with room for a line's end.
CURRENT_MAX_CHARS = 4097


def cmd_grid_secret(args: argparse.Namespace, console: Console) -> int:
    """`gridfleet grid-secret`, which the hub's boot script runs: the files of the run's Grid secret, nothing
    printed of it."""
    if not is_run_id(args.run_id):
        raise UsageError(f"--run-id {quote(args.run_id)} is not a run id ({RUN_ID_RULE})")
    current = None
    if args.current is not None:
        try:
            with open(args.current, encoding="utf-8", errors="replace") as f:
                current = f.read(CURRENT_MAX_CHARS + 1)  # an SSM parameter's value: 4 KB at most
        except OSError as e:
            raise MissingResource(f"cannot read --current {args.current}: {e.strerror}") from None
        if len(current) > CURRENT_MAX_CHARS:
            raise UsageError(f"--current {args.current} holds more than an SSM parameter can")
    kept = make_hub_files(
        args.secret_file,
        args.hub_config,
        args.curl_config,
        run_id=args.run_id,
        current=current,
        parameter_file=args.parameter_file,
    )
    if kept:
        said = f"the SSM parameter holds its Grid secret already, kept in {args.secret_file}"
    else:
        said = f"a new Grid secret in {args.secret_file}, the parameter's new value in {args.parameter_file}"
    console.print(f"run {args.run_id}: {said}; the Grid hub's config in {args.hub_config}")
    return 0


def cmd_aws(args: argparse.Namespace, console: Console) -> int:
    """`gridfleet aws preflight|bootstrap`."""
    if args.action == "preflight":
        from cli.commands.preflight import cmd_preflight

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
    if args.built is not None and not args.upload:
        raise UsageError("--built uploads a bundle built before: give --upload too")
    config = load_config(args.config)
    s3 = None
    if args.upload:  # before a build of minutes: the credentials work and the bucket is there
        env = aws_env.connect(config)
        try:
            env.results.check_exists()
        except MissingResource as e:
            raise MissingResource(missing_line([str(e)])) from None
        s3 = env.clients.client("s3")
    crawlers = shipment_of(config)
    target = platform_of(config)
    if args.built is not None and s3 is not None:
        built = check_built(args.built, target, crawlers)
        console.print(f"uploading the bundle built in {args.built} for {target.describe()} (not building again)")
        return _upload(args, console, config, crawlers, target, s3, built.bundle, built.lambda_zip, args.built)
    jar = find_grid_jar(grid_jar_candidates(gridfleet_home()))
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
    return _upload(args, console, config, crawlers, target, s3, bundle, zipped, args.out)


def _upload(
    args: argparse.Namespace,
    console: Console,
    config: Config,
    crawlers: CrawlerShipment | None,
    target: BundlePlatform,
    s3: Any,
    bundle: Path,
    zipped: Path,
    out: Path,
) -> int:
    """Upload the bundle (tagged with its target), the Lambda package, the hub's config and the efs-utils .deb."""
    aws = config.aws
    folder = str(Path(aws.bundle_key).parent)
    hub_config = Path(args.config)
    if crawlers is not None:  # the hub's config names what the bundle installed, not a directory of this machine
        hub_config = out / "fleet.yaml"
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
