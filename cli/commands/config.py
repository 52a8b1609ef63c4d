"""The commands about a fleet.yaml itself: `validate` (what it describes) and `config from-terraform` (its
`aws:` section from Terraform's outputs). Neither talks to AWS or starts anything; `validate` asks pip's resolver
(a dry run) for the metadata of the crawlers' pinned requirements, unless they are installed here already."""

from __future__ import annotations

import argparse

from rich.console import Console

from cli.commands import tf_config
from cli.packaging.crawler_ship import project_of
from cli.views.plain import say
from fleet.config.load import load_config
from fleet.crawl.project import CrawlerProject
from hub.loop import EXIT_OK


def cmd_validate(args: argparse.Namespace, console: Console) -> int:
    config = load_config(args.config)
    crawlers = sorted({s.crawler for s in config.sites})
    say(
        console,
        f"{args.config}: OK: {len(config.sites)} sites (crawlers: {', '.join(crawlers)}), "
        f"max_nodes {config.fleet.max_nodes}, max_attempts {config.run.max_attempts}, "
        f"hang_after_s {config.run.hang_after_s:g}, deadline_s {config.run.deadline_s:g}",
    )
    section = config.crawlers
    project = project_of(config)
    build = project.build if project is not None else section.installed if section else None
    if build is not None:
        say(console, f"  crawler project {build.name} {build.version} ({build.hash})")
    if project is not None and section is not None:
        _check_requirements(project, section.requirements, console)
    return EXIT_OK


def _check_requirements(project: CrawlerProject, requirements: str | None, console: Console) -> None:
    """What the pins and the project's declared dependencies need is pinned or comes with gridfleet: else one
    line naming what and where, exit 2 (cli.packaging.requirements)."""
    from cli.envs.home import gridfleet_home
    from cli.packaging.requirements import check_up_front, pinned, requirements_root

    check_up_front(project, requirements, requirements_root(gridfleet_home()))
    if requirements:
        say(console, f"  crawlers.requirements {requirements}: {len(pinned(requirements))} pins, each one's needs met")


def cmd_config(args: argparse.Namespace, console: Console) -> int:
    text, source = tf_config.read_source(args.tf_output)
    print(tf_config.render(tf_config.aws_section(text, source)), end="")
    return EXIT_OK
