"""The commands that read a run, or end one: `status`, `watch`, `report`, `check`, `teardown`.

Each reads the run where it lives (cli/envs/base.py: on AWS with `--config`, else on the local stack that is up), and
falls back to what outlives the stores: the bucket's run archive on AWS (the table's items expire), the run's
summary under runs/ (the local stack keeps nothing once it stops).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from cli.envs import choose
from cli.envs.base import Environment
from cli.views.plain import say
from cli.views.run import print_sites
from fleet.aws.archive import S3RunArchive
from fleet.clock import SystemClock
from fleet.config.load import load_config
from fleet.errors import MissingResource, UsageError
from fleet.outputs import archive as run_archive
from fleet.outputs.summary import build_summary, counts, export, site_entry, totals, write_json
from hub.loop import EXIT_ERROR, EXIT_OK
from hub.teardown import teardown_run

if TYPE_CHECKING:
    from cli.report.check import CheckReport

log = logging.getLogger("gridfleet")

#: A summary's sites counted by status, for summaries written without their counts.
STATUSES = ("QUEUED", "RUN", "COMPLETED", "FAILED")


def latest(env: Environment | None) -> str | None:
    """The run last started where `env` looks, else the last the run archive holds (where it is read)."""
    if env is None:
        return None
    return env.latest_run() or (run_archive.latest(env.archive) if env.reads_archive else None)


def latest_summary(out: Path) -> Path | None:
    """The summary.json under `out` written last, if any."""
    found = sorted(out.glob("*/summary.json"), key=lambda p: p.stat().st_mtime) if out.is_dir() else []
    return found[-1] if found else None


def status_from_summary(out: Path, run_id: str | None) -> dict[str, Any]:
    """The `status --json` shape from the run's summary.json under `out` (default: the latest there)."""
    if run_id is None:
        found = latest_summary(out)
        if found is None:
            raise MissingResource(
                "no run to show: no local stack is up and no runs/*/summary.json here "
                "(use --run-id, --out, or start one with `gridfleet run --local`)"
            )
        path = found
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
    return {
        "run_id": summary["run_id"],
        "sites": summary["sites"],
        "counts": summary.get("counts")
        or {k: sum(1 for s in summary["sites"].values() if s["run_status"] == k) for k in STATUSES},
    }


def archived(env: Environment, run_id: str, config_path: str) -> dict[str, Any]:
    """A run's summary from the bucket, once the table has forgotten the run (its items expire a day later)."""
    summary = env.archive.get_summary(run_id)
    if summary is None:
        raise MissingResource(
            f"there is no run {run_id} in the table {config_path} names, and no "
            f"s3://{env.archive.bucket}/runs/{run_id}/summary.json"
        )
    return summary


def status_data(env: Environment | None, run_id: str | None, args: argparse.Namespace) -> dict[str, Any]:
    """The `status --json` shape (plus `finished`): from the live records, else from the run's summary.json."""
    if env is not None and run_id:
        rows = env.table.read_run(run_id)
        if rows.run is not None:
            sites = {r.site: site_entry(r) for r in sorted(rows.sites, key=lambda r: r.site)}
            return {"run_id": run_id, "sites": sites, "counts": counts(rows.sites), "finished": rows.run.finished}
        if env.reads_archive:
            summary = archived(env, run_id, args.config)
            return {
                "run_id": run_id,
                "sites": summary["sites"],
                "counts": summary.get("counts") or {},
                "finished": True,
            }
    if env is not None and env.reads_archive and not run_id:  # on AWS, before the first run (or its hub) began
        raise MissingResource(
            f"no run to show: the table {env.config.aws.table} and s3://{env.config.aws.bucket}/runs/ have none yet "
            "(a run appears once its hub has started it; use --run-id for one of your own)"
        )
    return {**status_from_summary(args.out, run_id), "finished": True}


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    env = choose.for_reading(args, load_config)
    run_id = args.run_id or latest(env)
    data = status_data(env, run_id, args)
    if args.json:
        data.pop("finished")
        data["totals"] = totals(data["sites"])
        print(json.dumps(data, indent=2))
    else:
        print_sites(console, data["run_id"], data["sites"], data["counts"], limit_full=10**6)
    return EXIT_OK


def cmd_watch(args: argparse.Namespace, console: Console) -> int:
    from cli.views.run import watch

    env = choose.for_reading(args, load_config)
    first = status_data(env, args.run_id or latest(env), args)
    run_id = first["run_id"]
    state = {"data": first}

    def fetch() -> dict[str, Any]:
        try:
            state["data"] = status_data(env, run_id, args)
        except MissingResource:
            raise
        except Exception as e:  # noqa: BLE001 - the local stack stops when its run ends: the summary tells the end
            try:
                state["data"] = {**status_from_summary(args.out, run_id), "finished": True}
            except MissingResource:
                log.warning("watch: cannot read run %s right now (%s); trying again", run_id, e)
        return state["data"]

    return watch(fetch, console, interval_s=args.interval)


def _summary_path(args: argparse.Namespace, archive: S3RunArchive | None) -> Path:
    """Where the run's summary is (or goes, when it comes from the bucket): runs/<run_id>/summary.json."""
    if args.run_id:
        path = args.runs / args.run_id / "summary.json"
    else:
        path = latest_summary(args.runs)
        if path is None and archive is not None and (last := run_archive.latest(archive)):
            path = args.runs / last / "summary.json"
        if path is None:
            raise MissingResource(f"no run to report on: no {args.runs}/*/summary.json (a run writes it when it ends)")
    if not path.is_file() and archive is not None:
        summary = archive.get_summary(path.parent.name)
        if summary is not None:  # the run's record in the bucket: kept beside the report here
            write_json(path, summary)
    if not path.is_file():
        raise MissingResource(
            f"no {path}: a run writes its summary when it ends (see `gridfleet status` meanwhile)"
            + (f"; nor s3://{archive.bucket}/runs/{path.parent.name}/summary.json" if archive is not None else "")
        )
    return path


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    from cli.report.page import write_report
    from fleet.config import FleetConfig

    archive = choose.archive_for(args, load_config)
    path = _summary_path(args, archive)
    prices = load_config(args.config).fleet.hourly_price if args.config else FleetConfig.model_validate({}).hourly_price
    out = args.out or path.parent / "report.html"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        previous = run_archive.previous(archive, summary) if archive is not None else None
        write_report(path, out, prices=prices, previous=previous)
    except (ValueError, AttributeError, TypeError) as e:
        raise UsageError(f"{path}: not a run summary: {e}") from None
    console.print(f"report: {out}")
    return EXIT_OK


def _run_to_act_on(args: argparse.Namespace, what: str) -> tuple[Environment, str]:
    env = choose.for_reading(args, load_config)
    run_id = args.run_id or latest(env)
    if env is None or not run_id:
        raise MissingResource(f"no run to {what}: no local stack with a run is up (for a run on AWS pass --config)")
    return env, run_id


def cmd_check(args: argparse.Namespace, console: Console) -> int:
    from cli.commands.run import demo_stats
    from cli.report.check import check_archived, check_run

    env = choose.for_reading(args, load_config)
    run_id = args.run_id or latest(env)
    stats = None
    if env is None:  # no local stack with the run is up: the finished run as it was exported
        report = _check_exported(args)
        run_id = report.run_id
    elif not run_id:
        raise MissingResource("no run to check (pass --run-id)")
    elif env.reads_archive and env.table.get_run(run_id) is None:
        report = check_archived(
            archived(env, run_id, args.config),
            results=env.results,
            queue=env.queue,
            provider=env.provider(run_id, SystemClock()),
            config=env.config,
        )
    else:
        stats = demo_stats(env.demo_url) if env.demo_url else None
        report = check_run(
            run_id,
            table=env.table,
            queue=env.queue,
            results=env.results,
            provider=env.provider(run_id, SystemClock()),
            config=env.config,
            demo_stats=stats,
            demo_url=env.demo_url,
        )
    for text in report.violations:
        say(console, text, label="violation:", label_style="red")
    for text in report.notes:
        say(console, text, label="note:")
    for text in report.false_loss_details:
        say(console, text, label="loss:")
    what = ", ".join(f"{n} {k}" for k, n in report.checked.items())
    console.print(
        f"run {run_id}: {'OK' if report.ok else f'{len(report.violations)} violation(s)'} ({what}"
        f"{', demo server fetches' if stats is not None else ''}; false_losses {report.false_losses})"
    )
    return EXIT_OK if report.ok else EXIT_ERROR


def _check_exported(args: argparse.Namespace) -> CheckReport:
    """A finished local run, from `runs/<run_id>/` (default: the latest summary there), as `status` and `report`
    read it once its stack has stopped: nothing is started."""
    from cli.envs.local import local_nodes
    from cli.report.check import check_export

    path = args.out / args.run_id / "summary.json" if args.run_id else latest_summary(args.out)
    if path is None or not path.is_file():
        raise MissingResource(
            f"no run to check: no local stack with {'run ' + args.run_id if args.run_id else 'a run'} is up, and no "
            f"{path or args.out / '*' / 'summary.json'} (for a run on AWS pass --config)"
        )
    nodes = local_nodes()
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(summary, dict) or not isinstance(summary.get("sites"), dict) or "run_id" not in summary:
            raise ValueError("no run_id and sites")
        return check_export(summary, path.parent, nodes=nodes)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"{path}: not a run summary: {e}") from None


def cmd_teardown(args: argparse.Namespace, console: Console) -> int:
    env, run_id = _run_to_act_on(args, "tear down")
    clock = SystemClock()
    result = teardown_run(run_id, env.table, env.provider(run_id, clock), clock)
    rows = env.table.read_run(run_id)
    assert rows.run is not None  # teardown_run refuses a run the table does not hold
    summary = build_summary(
        rows.run,
        rows.sites,
        left_running=result.left_running,
        finished_at=clock.now(),
        finish_reason="teardown",
        unreadable=rows.notes.found,
    )
    path = export(args.out, summary, rows.sites, env.results, env.node_role())
    console.print(
        f"run {run_id}: terminated {len(result.terminated)} nodes, {len(result.failed_sites)} open sites "
        f"marked FAILED (killed); summary: {path}"
    )
    return EXIT_OK if not result.left_running else EXIT_ERROR
