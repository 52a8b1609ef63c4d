"""`gridfleet`: the command line. Its exit codes, and what each means, are `hub.loop.EXIT_CODES`.

This module is the parser (one small function per command), the table of commands and the outer edge that
turns errors into one line and an exit code; each command's body lives in a module of its topic. Nothing here
loads the embedded stack, the simulator or the node agent: the commands that need them import them.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from cli.commands import aws as aws_cmd
from cli.commands import config as config_cmd
from cli.commands import crawl as crawl_cmd
from cli.commands import inspect as inspect_cmd
from cli.commands import local as local_cmd
from cli.commands import run as run_cmd
from cli.commands import simulate as sim_cli
from fleet.aws.errors import aws_failure
from fleet.errors import GridfleetError, quote
from fleet.logs import setup
from fleet.record.ids import RUN_ID_RULE, SITE_ID_RULE, is_run_id, is_site_id
from hub.loop import EXIT_CODES, EXIT_ERROR, EXIT_INTERRUPTED

log = logging.getLogger("gridfleet")
DEFAULT_CONFIG = "fleet.yaml"

Command = Callable[[argparse.Namespace, Console], int]


def _run_id(value: str) -> str:
    if not is_run_id(value):
        raise argparse.ArgumentTypeError(f"{quote(value)} is not a run id: {RUN_ID_RULE}, e.g. 2026-11-21")
    return value


def _site_id(value: str) -> str:
    if not is_site_id(value):
        raise argparse.ArgumentTypeError(f"{quote(value)} is not a site id: {SITE_ID_RULE}")
    return value


def _positive(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = -1.0
    if not x > 0:
        raise argparse.ArgumentTypeError(f"{quote(value)}: a number of seconds above 0")
    return x


def _runs_out(p: argparse.ArgumentParser, text: str = "where runs/<run_id>/ goes (default: %(default)s)") -> None:
    p.add_argument("--out", type=Path, default=Path("runs"), help=text)


# --- one function per command's arguments, in the order `--help` lists them ---------------------------------
def _validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("validate", help="check a fleet.yaml and print what it describes")
    p.add_argument("--config", required=True, help="the fleet.yaml to check")


def _run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="run the crawl of every site in the config until each is done",
        description="Seed the sites, launch nodes, watch for hangs and lost nodes, retry up to "
        "run.max_attempts, then terminate the fleet and write runs/<run_id>/summary.json.",
    )
    p.add_argument("--config", default=DEFAULT_CONFIG, help="fleet.yaml (default: %(default)s)")
    p.add_argument(
        "--local",
        action="store_true",
        help="the embedded default: moto server, a local Selenium Grid and local node processes",
    )
    p.add_argument("--run-id", type=_run_id, help="the run's id (default: today's UTC date, e.g. 2026-11-21)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an existing run (after the hub was killed) from the table and the nodes",
    )
    p.add_argument("--dry-run", action="store_true", help="print what would be done; start nothing")
    p.add_argument(
        "--full",
        action="store_true",
        help="crawl incremental sites whole: ignore their high-water marks (which are renewed after)",
    )
    _runs_out(p)


def _rerun(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "rerun",
        help="crawl chosen sites of a run again, or all its FAILED sites (--failed)",
        description="Queue the sites again with max_attempts fresh attempts, through the same hub and "
        "nodes. On the embedded default this drives the run to its end on the running "
        "local stack; on AWS it starts a hub from aws.hub_launch_template when none runs. "
        "With --config on the embedded default, reopened sites take their spec from it.",
    )
    p.add_argument("sites", nargs="*", metavar="SITE", type=_site_id, help="site ids to crawl again")
    p.add_argument("--failed", action="store_true", help="every FAILED site of the run")
    p.add_argument(
        "--force",
        action="store_true",
        help="also crawl sites that have a result (the old one is kept as result.replaced-<time>.json)",
    )
    p.add_argument("--run-id", type=_run_id, help="default: the latest run")
    p.add_argument("--config", help="fleet.yaml: the run is on AWS (or, with --local, the sites' specs)")
    p.add_argument("--local", action="store_true", help="the run is on the local stack (the default without --config)")
    _runs_out(p)


def _render(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "render",
        help="print the cloud-init user-data of the hub or of a node",
        description="Print the rendered cloud-config (for the launch template, or to review it).",
    )
    p.add_argument("role", choices=("hub", "node"))
    p.add_argument("--config", default=DEFAULT_CONFIG, help="fleet.yaml (default: %(default)s)")
    p.add_argument("--run-id", type=_run_id, help="node: the run (default: today's UTC date)")
    p.add_argument("--hub-address", help="node: the hub's private address (default: aws.hub_address)")
    p.add_argument(
        "--script", action="store_true", help="print the boot script the user-data carries (gzip-compressed there)"
    )


def _aws(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "aws",
        help="AWS housekeeping: `aws preflight` says whether the account is ready for a run; "
        "`aws bootstrap` creates the table, queue + DLQ and bucket",
        description="preflight: read the account (read-only) and say, one line per check, what is ready for the "
        "first night and what is not; exit 0 when everything is, 1 with each problem, 2 for bad input. "
        "bootstrap: create the table, the queue and its DLQ and the bucket when missing (dev accounts, moto).",
    )
    p.add_argument(
        "action",
        choices=("preflight", "bootstrap"),
        help="preflight: is the account ready? bootstrap: create what is missing, idempotently",
    )
    p.add_argument("--config", required=True, help="the fleet.yaml the runs will use")
    p.add_argument(
        "--tf-output",
        help="preflight: a file holding `terraform output -json`, compared with the config's aws: section",
    )


def _bundle(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bundle", help="build the code bundle and the Lambda package; --upload puts them in S3")
    p.add_argument(
        "--config", default=DEFAULT_CONFIG, help="fleet.yaml (its bucket and keys; uploaded as the hub's config)"
    )
    p.add_argument("--out", type=Path, default=Path("dist"), help="where to build (default: %(default)s)")
    p.add_argument("--upload", action="store_true", help="upload the bundle, the Lambda package and the config")
    p.add_argument("--efs-utils-deb", help="an amazon-efs-utils .deb to upload beside the bundle (for AMIs without it)")
    p.add_argument(
        "--built",
        type=Path,
        metavar="DIR",
        help="with --upload: upload the bundle and Lambda package `--out DIR` built before (the ones a node image "
        "was baked from) instead of building again; refused unless they are this gridfleet's, for the config's "
        "platform and crawler project",
    )


def _config(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("config", help="`config from-terraform`: the aws: section of fleet.yaml from Terraform")
    p.add_argument("action", choices=("from-terraform",))
    p.add_argument("--tf-output", default="-", help="a file holding `terraform output -json` (default: stdin)")


def _status(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("status", help="the sites of a run: status, attempt, node, last update, reason")
    p.add_argument("--run-id", type=_run_id, help="default: the latest run")
    p.add_argument("--json", action="store_true", help='{"run_id", "sites", "counts"} as JSON')
    p.add_argument(
        "--config",
        help="read the run on AWS, from the resources this fleet.yaml names "
        "(default: the local stack, else runs/<run_id>/summary.json)",
    )
    p.add_argument("--local", action="store_true", help="read the run on the local stack")
    _runs_out(p, "where to look for summaries (default: %(default)s)")


def _watch(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "watch",
        help="follow a run live until it finishes: progress bar, counts, open sites",
        description="Refreshes every --interval seconds until the run finishes; exits 0 when every "
        "site COMPLETED, 3 when some FAILED (as `run` does).",
    )
    p.add_argument("--run-id", type=_run_id, help="default: the latest run")
    p.add_argument("--config", help="follow the run on AWS, in the resources this fleet.yaml names")
    p.add_argument("--local", action="store_true", help="follow the run on the local stack")
    _runs_out(p, "where to look for summaries (default: %(default)s)")
    p.add_argument("--interval", type=_positive, default=2.0, help="seconds between refreshes (default: %(default)s)")


def _report(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        help="write a self-contained HTML report of a run (timeline, cost, diff)",
        description="One HTML file: the sites, a timeline of every attempt on every node, durations, "
        "estimated cost (node-seconds x fleet.hourly_price) and the difference from the "
        "previous run under the same runs directory.",
    )
    p.add_argument("--run-id", type=_run_id, help="default: the latest run under --runs")
    p.add_argument("--out", type=Path, help="the HTML file (default: runs/<run_id>/report.html)")
    p.add_argument(
        "--runs", type=Path, default=Path("runs"), help="where the runs' summaries are (default: %(default)s)"
    )
    p.add_argument("--config", help="fleet.yaml whose fleet.hourly_price prices the node-seconds")


def _check(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check",
        help="assert a finished run kept every promise (exit 0) or list what broke (exit 1)",
        description="Every site terminal; attempts within max_attempts and never overlapping; one "
        "result per COMPLETED site; no instance or message of the run left; the DLQ "
        "reported; on the embedded default, the demo server's own count of fetches. A finished local run "
        "whose stack has stopped is checked from runs/<run_id>/ (its exported results, and what the run's own "
        "check found in the stores at its end).",
    )
    p.add_argument("--run-id", type=_run_id, help="default: the latest run")
    p.add_argument("--config", help="the run is on AWS, in the resources this fleet.yaml names")
    p.add_argument("--local", action="store_true", help="the run is on the local stack (the default without --config)")
    _runs_out(p, "where a finished local run's summary is, once its stack has stopped (default: %(default)s)")


def _teardown(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("teardown", help="end a run now: terminate its nodes, mark open sites FAILED/killed")
    p.add_argument("--run-id", type=_run_id, help="default: the latest run")
    p.add_argument("--config", help="the run is on AWS, in the resources this fleet.yaml names")
    p.add_argument("--local", action="store_true", help="the run is on the local stack (the default without --config)")
    p.add_argument("--out", type=Path, default=Path("runs"))


def _local(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("local", help="the embedded default's stack (moto server, Selenium Grid, demo sites)")
    p.add_argument(
        "action",
        choices=("up", "down", "status"),
        help="up: start and leave running; down: stop it and every node; status: components and URLs",
    )
    p.add_argument(
        "--twin",
        action="store_true",
        help="the EC2 twin instead (root only): moto as AWS, the stack deployed as infra/terraform defines it, "
        "and every instance it starts booted for real from its user-data; the day's run starts by its schedule",
    )
    p.add_argument("--config", help="with --twin up: fleet.yaml whose sites the twin's stack runs "
                   "(default examples/twin.yaml; {demo} is the twin's demo server)")  # fmt: skip


def _logs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "logs",
        help="a run's hub and node logs from CloudWatch Logs (boot, agent, crawler, Grid)",
        description="Read back the logs the hub and the nodes of a run shipped to the stack's CloudWatch Logs "
        "groups (one stream per instance), oldest first; they outlive the instances.",
    )
    p.add_argument("--run-id", type=_run_id, required=True, help="the run")
    p.add_argument("--node", help="only this instance (a node or the hub), e.g. i-0123456789abcdef0")
    p.add_argument("--site", help="only the lines about this site")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="fleet.yaml naming the stack (default: %(default)s)")


def _ship_logs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "ship-logs",
        help="what hub and node instances run: follow log files and ship their lines to CloudWatch Logs",
        description="Follow FILEs (from where the last shipping stopped) and put each new line into one stream "
        "of a CloudWatch Logs group, until SIGTERM, then flush; with --once, ship what is there and exit.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="log files to follow (a missing one is waited for)")
    p.add_argument("--config", required=True, help="fleet.yaml (region, endpoint)")
    p.add_argument("--group", required=True, help="the log group, e.g. /gridfleet/node")
    p.add_argument("--stream", required=True, help="the stream, <run_id>/<instance id>")
    p.add_argument("--state", type=Path, required=True, help="a directory keeping how far each file was shipped")
    p.add_argument("--once", action="store_true", help="ship what the files hold now, then exit")


def _grid_secret(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "grid-secret",
        help="what the hub instance runs: the run's Grid secret, the Grid hub's config and curl's credentials from it",
        description="Write the run's Grid secret, the Selenium Grid hub's config (its nodes' registration secret "
        "and its router's user and password) and a curl config holding that user and password, each file mode "
        "0600. The secret is the one --current holds for --run-id (the run's nodes have it), else a new random "
        "one, whose SSM parameter value then goes to --parameter-file. Nothing secret is printed.",
    )
    p.add_argument("--run-id", required=True, help="the run the hub boots for (its instance tag gridfleet:run_id)")
    p.add_argument(
        "--current",
        type=Path,
        help="the SSM parameter's value as read at this boot (`aws ssm get-parameter` into a 0600 file); "
        "default: none could be read",
    )
    p.add_argument("--secret-file", type=Path, required=True, help="where the secret goes")
    p.add_argument("--hub-config", type=Path, required=True, help="the Grid hub's config (its --config)")
    p.add_argument("--curl-config", type=Path, required=True, help="the router's credentials for `curl -K`")
    p.add_argument(
        "--parameter-file",
        type=Path,
        required=True,
        help="the parameter's new value (the run id and the secret), to put when the secret is new; "
        "removed when the secret was kept",
    )


def _node(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub.add_parser("node", help="the node agent, as cloud-init runs it (see `gridfleet node --help`)", add_help=False)


def _cmd_logs(args: argparse.Namespace, console: Console) -> int:
    from cli.commands.logs import cmd_logs

    return cmd_logs(args, console)


def _cmd_ship_logs(args: argparse.Namespace, console: Console) -> int:
    from cli.commands.logs import cmd_ship_logs

    return cmd_ship_logs(args, console)


PARSERS = (
    _validate,
    _run,
    _rerun,
    _render,
    _aws,
    _bundle,
    _config,
    _status,
    _watch,
    _report,
    _check,
    _teardown,
    _local,
    _logs,
    _ship_logs,
    _grid_secret,
    sim_cli.add_parser,
    crawl_cmd.add_parser,
    _node,
)

COMMANDS: dict[str, Command] = {
    "validate": config_cmd.cmd_validate,
    "run": run_cmd.cmd_run,
    "render": aws_cmd.cmd_render,
    "aws": aws_cmd.cmd_aws,
    "bundle": aws_cmd.cmd_bundle,
    "config": config_cmd.cmd_config,
    "status": inspect_cmd.cmd_status,
    "watch": inspect_cmd.cmd_watch,
    "report": inspect_cmd.cmd_report,
    "rerun": run_cmd.cmd_rerun,
    "check": inspect_cmd.cmd_check,
    "teardown": inspect_cmd.cmd_teardown,
    "local": local_cmd.cmd_local,
    "simulate": sim_cli.cmd_simulate,
    "crawl": crawl_cmd.cmd_crawl,
    "logs": _cmd_logs,
    "ship-logs": _cmd_ship_logs,
    "grid-secret": aws_cmd.cmd_grid_secret,
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gridfleet",
        description="Run a daily crawl on a self-healing Selenium Grid fleet (EC2 spot, or this machine).",
        epilog="Exit codes: " + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items()) + ".",
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in PARSERS:
        add(sub)
    for name, p in sub.choices.items():
        if name != "node":  # the node agent's own program parses its own arguments
            _verbose_here_too(p)
    return ap


def _verbose_here_too(p: argparse.ArgumentParser) -> None:
    """`-v` after the command as before it (`gridfleet crawl -v SITE`, `gridfleet -v crawl SITE`): the same flag.
    Left out, it leaves what was given before the command as it was (a default would overwrite it)."""
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["node"]:  # the node agent is its own program: hub and node never import each other
        os.execv(sys.executable, [sys.executable, "-m", "node", *argv[1:]])
    args = build_parser().parse_args(argv)
    setup(logging.DEBUG if args.verbose else logging.INFO)
    console = Console(width=None if sys.stdout.isatty() else 160, soft_wrap=True)
    try:
        return COMMANDS[args.command](args, console)
    except GridfleetError as e:
        print(f"gridfleet: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("gridfleet: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except run_cmd.HubStopped as e:
        print(f"gridfleet: {e}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as e:  # the outer edge: an AWS failure is one line; anything else is a bug, with its traceback
        failure = aws_failure(e)
        if failure is None:
            raise
        log.debug("aws-failure kind=%s", failure.kind.value, exc_info=True)
        print(f"gridfleet: error: {failure.line()}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
