"""`gridfleet`: the command line. Exit codes: 0 every site COMPLETED, 3 some FAILED,
2 invalid config or usage (nothing launched), 1 any other error."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from fleet.aws import archive as run_archive
from fleet.aws.errors import aws_failure
from fleet.clock import SystemClock
from fleet.config_load import load_config
from fleet.errors import GridfleetError, MissingResource, UsageError
from fleet.ids import RUN_ID_RULE, is_run_id
from fleet.logs import setup
from cli import aws as aws_cmd, aws_env, local_env, run as run_cmd
from hub.providers.ec2 import Ec2Provider
from cli import simulate as sim_cli
from hub.loop import EXIT_ERROR, EXIT_OK
from fleet.summary import build_summary, counts, export, site_entry, write_json
from hub.teardown import teardown_run
from cli.views import print_sites

log = logging.getLogger("gridfleet")
DEFAULT_CONFIG = "fleet.yaml"


def _run_id(value: str) -> str:
    if not is_run_id(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a run id: {RUN_ID_RULE}, e.g. 2026-11-21")
    return value


def _positive(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = -1.0
    if not x > 0:
        raise argparse.ArgumentTypeError(f"{value!r}: a number of seconds above 0")
    return x


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gridfleet",
        description="Run a daily crawl on a self-healing Selenium Grid fleet (EC2 spot, or this machine).",
        epilog="Exit codes: 0 all sites COMPLETED, 3 finished with FAILED sites, 2 bad config or usage, 1 error.",
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("validate", help="check a fleet.yaml and print what it describes")
    p.add_argument("--config", required=True, help="the fleet.yaml to check")

    p = sub.add_parser("run", help="run the crawl of every site in the config until each is done",
                       description="Seed the sites, launch nodes, watch for hangs and lost nodes, retry up to "
                                   "run.max_attempts, then terminate the fleet and write runs/<run_id>/summary.json.")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="fleet.yaml (default: %(default)s)")
    p.add_argument("--local", action="store_true",
                   help="the embedded default: moto server, a local Selenium Grid and local node processes")
    p.add_argument("--run-id", type=_run_id, help="the run's id (default: today's UTC date, e.g. 2026-11-21)")
    p.add_argument("--resume", action="store_true",
                   help="continue an existing run (after the hub was killed) from the table and the nodes")
    p.add_argument("--dry-run", action="store_true", help="print what would be done; start nothing")
    p.add_argument("--full", action="store_true",
                   help="crawl incremental sites whole: ignore their high-water marks (which are renewed after)")
    p.add_argument("--out", type=Path, default=Path("runs"), help="where runs/<run_id>/ goes (default: %(default)s)")

    p = sub.add_parser("rerun", help="crawl chosen sites of a run again, or all its FAILED sites (--failed)",
                       description="Queue the sites again with max_attempts fresh attempts, through the same hub and "
                                   "nodes. On the embedded default this drives the run to its end on the running "
                                   "local stack; on AWS it starts a hub from aws.hub_launch_template when none runs. "
                                   "With --config on the embedded default, reopened sites take their spec from it.")
    p.add_argument("sites", nargs="*", metavar="SITE", help="site ids to crawl again")
    p.add_argument("--failed", action="store_true", help="every FAILED site of the run")
    p.add_argument("--force", action="store_true",
                   help="also crawl sites that have a result (the old one is kept as result.replaced-<time>.json)")
    p.add_argument("--run-id", type=_run_id, help="default: the latest run")
    p.add_argument("--config", help="fleet.yaml: the run is on AWS (or, with --local, the sites' specs)")
    p.add_argument("--local", action="store_true", help="the run is on the local stack (the default without --config)")
    p.add_argument("--out", type=Path, default=Path("runs"), help="where runs/<run_id>/ goes (default: %(default)s)")

    p = sub.add_parser("render", help="print the cloud-init user-data of the hub or of a node",
                       description="Print the rendered cloud-config (for the launch template, or to review it).")
    p.add_argument("role", choices=("hub", "node"))
    p.add_argument("--config", default=DEFAULT_CONFIG, help="fleet.yaml (default: %(default)s)")
    p.add_argument("--run-id", type=_run_id, help="node: the run (default: today's UTC date)")
    p.add_argument("--hub-address", help="node: the hub's private address (default: aws.hub_address)")

    p = sub.add_parser("aws", help="AWS housekeeping: `aws bootstrap` creates the table, queue + DLQ and bucket")
    p.add_argument("action", choices=("bootstrap",),
                   help="bootstrap: create what is missing, idempotently (dev accounts, LocalStack, moto)")
    p.add_argument("--config", required=True)

    p = sub.add_parser("bundle", help="build the code bundle and the Lambda package; --upload puts them in S3")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="fleet.yaml (its bucket and keys; uploaded as the "
                                                            "hub's config)")
    p.add_argument("--out", type=Path, default=Path("dist"), help="where to build (default: %(default)s)")
    p.add_argument("--upload", action="store_true", help="upload the bundle, the Lambda package and the config")
    p.add_argument("--efs-utils-deb", help="an amazon-efs-utils .deb to upload beside the bundle (for AMIs "
                                           "without it)")

    p = sub.add_parser("config", help="`config from-terraform`: the aws: section of fleet.yaml from Terraform")
    p.add_argument("action", choices=("from-terraform",))
    p.add_argument("--tf-output", default="-", help="a file holding `terraform output -json` (default: stdin)")

    p = sub.add_parser("status", help="the sites of a run: status, attempt, node, last update, reason")
    p.add_argument("--run-id", type=_run_id, help="default: the latest run")
    p.add_argument("--json", action="store_true", help='{"run_id", "sites", "counts"} as JSON')
    p.add_argument("--config", help="read the run on AWS, from the resources this fleet.yaml names "
                                     "(default: the local stack, else runs/<run_id>/summary.json)")
    p.add_argument("--local", action="store_true", help="read the run on the local stack")
    p.add_argument("--out", type=Path, default=Path("runs"), help="where to look for summaries (default: %(default)s)")

    p = sub.add_parser("watch", help="follow a run live until it finishes: progress bar, counts, open sites",
                       description="Refreshes every --interval seconds until the run finishes; exits 0 when every "
                                   "site COMPLETED, 3 when some FAILED (as `run` does).")
    p.add_argument("--run-id", type=_run_id, help="default: the latest run")
    p.add_argument("--config", help="follow the run on AWS, in the resources this fleet.yaml names")
    p.add_argument("--local", action="store_true", help="follow the run on the local stack")
    p.add_argument("--out", type=Path, default=Path("runs"), help="where to look for summaries (default: %(default)s)")
    p.add_argument("--interval", type=_positive, default=2.0, help="seconds between refreshes (default: %(default)s)")

    p = sub.add_parser("report", help="write a self-contained HTML report of a run (timeline, cost, diff)",
                       description="One HTML file: the sites, a timeline of every attempt on every node, durations, "
                                   "estimated cost (node-seconds x fleet.hourly_price) and the difference from the "
                                   "previous run under the same runs directory.")
    p.add_argument("--run-id", type=_run_id, help="default: the latest run under --runs")
    p.add_argument("--out", type=Path, help="the HTML file (default: runs/<run_id>/report.html)")
    p.add_argument("--runs", type=Path, default=Path("runs"),
                   help="where the runs' summaries are (default: %(default)s)")
    p.add_argument("--config", help="fleet.yaml whose fleet.hourly_price prices the node-seconds")

    p = sub.add_parser("check", help="assert a finished run kept every promise (exit 0) or list what broke (exit 1)",
                       description="Every site terminal; attempts within max_attempts and never overlapping; one "
                                   "result per COMPLETED site; no instance or message of the run left; the DLQ "
                                   "reported; on the embedded default, the demo server's own count of fetches.")
    p.add_argument("--run-id", type=_run_id, help="default: the latest run")
    p.add_argument("--config", help="the run is on AWS, in the resources this fleet.yaml names")
    p.add_argument("--local", action="store_true", help="the run is on the local stack (the default without --config)")

    p = sub.add_parser("teardown", help="end a run now: terminate its nodes, mark open sites FAILED/killed")
    p.add_argument("--run-id", type=_run_id, help="default: the latest run")
    p.add_argument("--config", help="the run is on AWS, in the resources this fleet.yaml names")
    p.add_argument("--local", action="store_true", help="the run is on the local stack (the default without --config)")
    p.add_argument("--out", type=Path, default=Path("runs"))

    p = sub.add_parser("local", help="the embedded default's stack (moto server, Selenium Grid, demo sites)")
    p.add_argument("action", choices=("up", "down", "status"),
                   help="up: start and leave running; down: stop it and every node; status: components and URLs")

    sim_cli.add_parser(sub)

    sub.add_parser("node", help="the node agent, as cloud-init runs it (see `gridfleet node --help`)",
                   add_help=False)
    return ap


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
        return 130
    except Exception as e:  # the outer edge: an AWS failure is one line; anything else is a bug, with its traceback
        failure = aws_failure(e)
        if failure is None:
            raise
        log.debug("aws-failure kind=%s", failure.kind.value, exc_info=True)
        print(f"gridfleet: error: {failure.line()}", file=sys.stderr)
        return EXIT_ERROR


# --- validate ----------------------------------------------------------------------------
def cmd_validate(args: argparse.Namespace, console: Console) -> int:
    config = load_config(args.config)
    crawlers = sorted({s.crawler for s in config.sites})
    console.print(f"{args.config}: OK: {len(config.sites)} sites (crawlers: {', '.join(crawlers)}), "
                  f"max_nodes {config.fleet.max_nodes}, max_attempts {config.run.max_attempts}, "
                  f"hang_after_s {config.run.hang_after_s:g}, deadline_s {config.run.deadline_s:g}")
    return EXIT_OK


# --- run ------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace, console: Console) -> int:
    return run_cmd.cmd_run(args, console, load_config)


# --- aws: render, bootstrap, bundle ------------------------------------------------------------
def cmd_rerun(args: argparse.Namespace, console: Console) -> int:
    return run_cmd.cmd_rerun(args, console, load_config)


def cmd_render(args: argparse.Namespace, console: Console) -> int:
    return aws_cmd.cmd_render(args, console, load_config(args.config))


def cmd_aws(args: argparse.Namespace, console: Console) -> int:
    return aws_cmd.cmd_bootstrap(args, console, load_config(args.config))


def cmd_bundle(args: argparse.Namespace, console: Console) -> int:
    return aws_cmd.cmd_bundle(args, console, load_config(args.config))


def cmd_config(args: argparse.Namespace, console: Console) -> int:
    from cli import tf_config

    text, source = tf_config.read_source(args.tf_output)
    print(tf_config.render(tf_config.aws_section(text, source)), end="")
    return EXIT_OK


# --- status ------------------------------------------------------------------------------------
@dataclass
class Source:
    """Where a run's records are: the local stack's moto server, or the AWS resources of a config."""

    where: str
    table: Any
    results: Any
    provider: Callable[[str], Any]  # run id -> provider (to list and terminate its nodes)
    latest: Callable[[], str | None]
    queue: Any = None
    config: Any = None
    demo_url: str | None = None
    archive: Any = None  # the bucket's run archive (AWS): summaries of runs the table has forgotten


def _source(args: argparse.Namespace) -> Source | None:
    if args.config and not args.local:  # the run is on AWS
        env = aws_env.connect(load_config(args.config))
        env.preflight()
        archived = run_archive.S3RunArchive(env.clients.client("s3"), env.config.aws.bucket)

        def latest() -> str | None:
            runs = env.table.list_runs()
            return runs[-1].run_id if runs else run_archive.latest(archived)

        return Source("aws", env.table, env.results,
                      lambda run_id: Ec2Provider(env.ec2, env.config, ami="", user_data=lambda r: ""), latest,
                      env.queue, env.config, archive=archived)
    stack = local_env.make_stack(local_env.gridfleet_home(), need_jar=False)
    state = stack.running()
    run_id = args.run_id or (local_env.latest_run_on_stack(stack) if state else None)
    config = local_env.run_config(stack, run_id) if state and run_id else None
    if config is None:
        return None
    env = local_env.connect(stack, state, config, bootstrap=False)
    return Source("local", env.table, env.results, lambda rid: env.provider(rid, SystemClock()), lambda: run_id,
                  env.queue, env.config, state.demo_url)


def _status_data(src: Source | None, run_id: str | None, args: argparse.Namespace) -> dict[str, Any]:
    """The `status --json` shape (plus `finished`): from the live records, else from the run's summary.json."""
    if src is not None and run_id:
        rows = src.table.read_run(run_id)
        if rows.run is not None:
            return {"run_id": run_id, "sites": {r.site: site_entry(r) for r in sorted(rows.sites, key=lambda r: r.site)},
                    "counts": counts(rows.sites), "finished": rows.run.finished}
        if src.archive is not None:
            summary = _archived(src, run_id, args)
            return {"run_id": run_id, "sites": summary["sites"], "counts": summary.get("counts") or {},
                    "finished": True}
    return {**_status_from_summary(args.out, run_id), "finished": True}


def _archived(src: Source, run_id: str, args: argparse.Namespace) -> dict[str, Any]:
    """A run's summary from the bucket, once the table has forgotten the run (its items expire a day later)."""
    summary = src.archive.get_summary(run_id)
    if summary is None:
        raise MissingResource(f"there is no run {run_id} in the table {args.config} names, and no "
                              f"s3://{src.archive.bucket}/runs/{run_id}/summary.json")
    return summary


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    src = _source(args)
    run_id = args.run_id or (src.latest() if src else None)
    data = _status_data(src, run_id, args)
    if args.json:
        data.pop("finished")
        print(json.dumps(data, indent=2))
    else:
        print_sites(console, data["run_id"], data["sites"], data["counts"], limit_full=10**6)
    return EXIT_OK


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    from fleet.config import FleetConfig
    from cli.report import write_report

    archive = _report_archive(args)
    if args.run_id:
        path = args.runs / args.run_id / "summary.json"
    else:
        path = _latest_summary(args.runs)
        if path is None and archive is not None and (latest := run_archive.latest(archive)):
            path = args.runs / latest / "summary.json"
        if path is None:
            raise MissingResource(f"no run to report on: no {args.runs}/*/summary.json (a run writes it when it ends)")
    if not path.is_file() and archive is not None:
        summary = archive.get_summary(path.parent.name)
        if summary is not None:  # the run's record in the bucket: kept beside the report here
            write_json(path, summary)
    if not path.is_file():
        raise MissingResource(f"no {path}: a run writes its summary when it ends (see `gridfleet status` meanwhile)"
                              + (f"; nor s3://{archive.bucket}/runs/{path.parent.name}/summary.json"
                                 if archive is not None else ""))
    prices = load_config(args.config).fleet.hourly_price if args.config else FleetConfig().hourly_price
    out = args.out or path.parent / "report.html"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        previous = run_archive.previous(archive, summary) if archive is not None else None
        write_report(path, out, prices=prices, previous=previous)
    except (ValueError, AttributeError, TypeError) as e:
        raise UsageError(f"{path}: not a run summary: {e}") from None
    console.print(f"report: {out}")
    return EXIT_OK


def _report_archive(args: argparse.Namespace) -> Any:
    """With --config, the bucket's run archive (summaries of runs the table forgot, and earlier runs to compare
    with); without, None: the report reads the runs directory only."""
    if not args.config:
        return None
    env = aws_env.connect(load_config(args.config))
    return run_archive.S3RunArchive(env.clients.client("s3"), env.config.aws.bucket)


def cmd_watch(args: argparse.Namespace, console: Console) -> int:
    from cli.views import watch

    src = _source(args)
    run_id = args.run_id or (src.latest() if src else None)
    first = _status_data(src, run_id, args)
    run_id = first["run_id"]
    state = {"data": first}

    def fetch() -> dict[str, Any]:
        try:
            state["data"] = _status_data(src, run_id, args)
        except MissingResource:
            raise
        except Exception as e:  # noqa: BLE001 - the local stack stops when its run ends: the summary tells the end
            try:
                state["data"] = {**_status_from_summary(args.out, run_id), "finished": True}
            except MissingResource:
                log.warning("watch: cannot read run %s right now (%s); trying again", run_id, e)
        return state["data"]

    return watch(fetch, console, interval_s=args.interval)


def _latest_summary(out: Path) -> Path | None:
    """The summary.json under `out` written last, if any."""
    found = sorted(out.glob("*/summary.json"), key=lambda p: p.stat().st_mtime) if out.is_dir() else []
    return found[-1] if found else None


def _status_from_summary(out: Path, run_id: str | None) -> dict[str, Any]:
    if run_id is None:
        latest = _latest_summary(out)
        if latest is None:
            raise MissingResource("no run to show: no local stack is up and no runs/*/summary.json here "
                                  "(use --run-id, --out, or start one with `gridfleet run --local`)")
        path = latest
    else:
        path = out / run_id / "summary.json"
        if not path.is_file():
            raise MissingResource(f"run {run_id}: not on a running local stack, and no {path}")
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: not a run summary: {e}") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("sites"), dict) or "run_id" not in summary:
        raise UsageError(f"{path}: not a run summary (no run_id and sites)")
    return {"run_id": summary["run_id"], "sites": summary["sites"], "counts": summary.get("counts") or
            {k: sum(1 for s in summary["sites"].values() if s["run_status"] == k)
             for k in ("QUEUED", "RUN", "COMPLETED", "FAILED")}}


# --- check --------------------------------------------------------------------------------------
def cmd_check(args: argparse.Namespace, console: Console) -> int:
    from cli.check import check_archived, check_run

    src = _source(args)
    run_id = args.run_id or (src.latest() if src else None)
    if src is None or not run_id:
        raise MissingResource("no run to check: no local stack with a run is up (for a run on AWS pass --config)")
    stats = run_cmd.demo_stats(src.demo_url) if src.demo_url else None
    if src.archive is not None and src.table.get_run(run_id) is None:
        report = check_archived(_archived(src, run_id, args), results=src.results, queue=src.queue,
                                provider=src.provider(run_id), config=src.config)
    else:
        report = check_run(run_id, table=src.table, queue=src.queue, results=src.results,
                           provider=src.provider(run_id), config=src.config, demo_stats=stats, demo_url=src.demo_url)
    for text in report.violations:
        console.print(f"[red]violation:[/] {text}")
    for text in report.notes:
        console.print(f"note: {text}")
    for text in report.false_loss_details:
        console.print(f"loss: {text}")
    what = ", ".join(f"{n} {k}" for k, n in report.checked.items())
    console.print(f"run {run_id}: {'OK' if report.ok else f'{len(report.violations)} violation(s)'} ({what}"
                  f"{', demo server fetches' if stats is not None else ''}; false_losses {report.false_losses})")
    return EXIT_OK if report.ok else EXIT_ERROR


# --- teardown ------------------------------------------------------------------------------------
def cmd_teardown(args: argparse.Namespace, console: Console) -> int:
    src = _source(args)
    run_id = args.run_id or (src.latest() if src else None)
    if src is None or not run_id:
        raise MissingResource("no run to tear down: no local stack with a run is up (for a run on AWS pass --config)")
    clock = SystemClock()
    result = teardown_run(run_id, src.table, src.provider(run_id), clock)
    rows = src.table.read_run(run_id)
    summary = build_summary(rows.run, rows.sites, left_running=result.left_running, finished_at=clock.now(),
                            finish_reason="teardown")
    path = export(args.out, summary, rows.sites, src.results)
    console.print(f"run {run_id}: terminated {len(result.terminated)} nodes, {len(result.failed_sites)} open sites "
                  f"marked FAILED (killed); summary: {path}")
    return EXIT_OK if not result.left_running else EXIT_ERROR


# --- local -----------------------------------------------------------------------------------------
def cmd_local(args: argparse.Namespace, console: Console) -> int:
    home = local_env.gridfleet_home()
    stack = local_env.make_stack(home, need_jar=args.action == "up", progress=lambda m: console.print(m))
    if args.action == "up":
        st = stack.up()
        _print_stack(console, stack)
        console.print(f"stack directory: {st.dir}; stop it with `gridfleet local down`")
        return EXIT_OK
    if args.action == "down":
        n = stack.down(quiet=True)
        console.print(f"local stack stopped ({n} processes ended)" if n else "local stack was not running")
        return EXIT_OK
    _print_stack(console, stack)
    return EXIT_OK if stack.running() else 1


def _print_stack(console: Console, stack) -> None:
    from rich.table import Table

    t = Table(title=f"local stack ({stack.dir})", title_justify="left")
    for c in ("component", "state", "address", "pid"):
        t.add_column(c)
    for name, state, url, pid in stack.status():
        t.add_row(name, state, url, str(pid) if pid else "-")
    console.print(t)


COMMANDS = {
    "validate": cmd_validate,
    "run": cmd_run,
    "render": cmd_render,
    "aws": cmd_aws,
    "bundle": cmd_bundle,
    "config": cmd_config,
    "status": cmd_status,
    "watch": cmd_watch,
    "report": cmd_report,
    "rerun": cmd_rerun,
    "check": cmd_check,
    "teardown": cmd_teardown,
    "local": cmd_local,
    "simulate": sim_cli.cmd_simulate,
}

if __name__ == "__main__":
    raise SystemExit(main())
