"""Which environment a command's run lives in, from its parsed arguments: `--config` without `--local` is AWS,
anything else the local stack. Each backend's module is imported once chosen, so a command run against AWS never
loads the local stack, and the local backend never brings the stack with it until it needs it."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from cli.envs.base import Environment
from fleet.aws.archive import S3RunArchive
from fleet.config import Config

Load = Callable[[str], Config]


def on_aws(args: argparse.Namespace) -> bool:
    """`--config` names the AWS resources the run lives in, unless `--local` says it is on the local stack."""
    return bool(getattr(args, "config", None)) and not getattr(args, "local", False)


def for_run(args: argparse.Namespace, config: Config) -> Environment:
    """`run`: the local stack with `--local`, else AWS as the config names it."""
    if args.local:
        from cli.envs import local as local_env

        return local_env.for_run(config)
    from cli.envs import aws as aws_env

    return aws_env.for_run(config, args.config)


def for_reading(args: argparse.Namespace, load: Load) -> Environment | None:
    """`status`, `watch`, `check`, `teardown`: the run on AWS (its resources checked first), else on the local
    stack; None when no local stack with the run is up (a finished run is read from runs/ then)."""
    if on_aws(args):
        from cli.envs import aws as aws_env

        env = aws_env.connect(load(args.config), source=args.config)
        env.preflight()
        return env
    from cli.envs import local as local_env

    return local_env.for_reading(args.run_id)


def for_rerun(args: argparse.Namespace, load: Load) -> Environment:
    """`rerun`: the run on AWS, else on the running local stack (with `--config`, the sites' specs from it)."""
    if on_aws(args):
        from cli.envs import aws as aws_env

        return aws_env.connect(load(args.config), source=args.config)
    from cli.envs import local as local_env

    return local_env.for_rerun(args.run_id, load(args.config) if args.config else None)


def archive_for(args: argparse.Namespace, load: Load) -> S3RunArchive | None:
    """`report`: with `--config`, the bucket's run archive (summaries of runs the table forgot, and earlier runs
    to compare with); without, None: the report reads the runs directory only."""
    if not args.config:
        return None
    from cli.envs import aws as aws_env

    return aws_env.connect(load(args.config), source=args.config).archive
