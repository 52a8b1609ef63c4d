"""`gridfleet run` and `gridfleet rerun`: one run of the crawl, written once for every environment.

The same `Hub` runs on the embedded default (`--local`) and on AWS, with the
adapters its environment (cli/envs/base.py) gives. `--resume` continues the run if it
exists (after its hub died) and starts it if not, so the hub instance's boot
script and the external watchdog can both say `run --resume` for the day's run.
A rerun reopens sites of a run and leaves the rest to whoever finishes the run:
a live hub, a hub instance started for it, or this command.
"""

from __future__ import annotations

import argparse
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from cli.commands.rerun import Choice, choose, forced_keys, reopen
from cli.envs import choose as where
from cli.envs.base import Environment, RunHold
from cli.report.check import CheckReport, attach, check_run
from cli.views.plain import say
from cli.views.run import print_sites
from fleet.aws.clients import AwsClients
from fleet.aws.metrics import CloudWatchSink
from fleet.clock import Clock, SystemClock
from fleet.config import Config
from fleet.config.load import load_config
from fleet.errors import UsageError
from fleet.logs import event
from fleet.outputs.results import LOCAL_ROLE, ResultStore
from fleet.outputs.summary import build_summary, export, site_entry
from fleet.record.ids import default_run_id
from fleet.record.messages import SiteQueue
from fleet.record.partition import RunInfo
from fleet.record.table import StateTable
from hub.loop import EXIT_FAILED_SITES, EXIT_OK, Hub, RunOutcome
from hub.monitor import HubMonitor
from hub.providers.base import ComputeProvider

log = logging.getLogger("gridfleet")


def check_existing(
    existing: RunInfo | None, run_id: str, resume: bool, hub_alive: Callable[[str], bool], me: str
) -> None:
    if existing is None:
        if resume:
            log.info("run %s does not exist yet: starting it", run_id)
        return
    if not resume:
        raise UsageError(f"run {run_id} already exists; pass --resume to continue it or --run-id to start another")
    # The same hub instance started again (a stopped hub restarted) is not another hub.
    if not existing.finished and existing.hub_id and existing.hub_id != me and hub_alive(existing.hub_id):
        raise UsageError(f"run {run_id} is held by a hub that is still running ({existing.hub_id})")


def export_finished(
    table: StateTable, results: ResultStore, run_id: str, out: Path, console: Console, role: str = LOCAL_ROLE
) -> int:
    rows = table.read_run(run_id)
    assert rows.run is not None
    summary = build_summary(
        rows.run,
        rows.sites,
        left_running=0,
        finished_at=rows.run.finished_at or time.time(),
        finish_reason="done",
        unreadable=rows.notes.found,
    )
    summary["pacing"] = table.read_pacing(run_id)
    path = export(out, summary, rows.sites, results, role)
    print_sites(console, run_id, summary["sites"], summary["counts"])
    console.print(f"run {run_id} had already finished; summary: {path}")
    return EXIT_FAILED_SITES if summary["counts"]["FAILED"] else EXIT_OK


def report_finished_export(summary: dict[str, Any], path: Path, run_id: str, resume: bool, console: Console) -> int:
    """A finished run the stores forgot (the embedded default): `--resume` reports it; a new run of its id is
    refused."""
    if not resume:
        raise UsageError(
            f"run {run_id} already finished ({path}); pass --run-id to start another, or --resume to see how it ended"
        )
    counts = summary.get("counts") or {}
    print_sites(console, run_id, summary.get("sites") or {}, counts)
    console.print(f"run {run_id} had already finished; nothing to resume. summary: {path}")
    return EXIT_FAILED_SITES if counts.get("FAILED") else EXIT_OK


class HubStopped(BaseException):
    """SIGTERM on AWS: the hub's instance shuts down (stopped or terminated, by EC2, the watchdog or an operator),
    and systemd stops the run's service. The nodes go on; a new hub resumes the run (the watchdog starts one).
    A BaseException, as KeyboardInterrupt is: the hub's loop logs and survives any Exception, never this."""


def _on_sigterm(local: bool) -> None:
    """SIGTERM ends the hub as Ctrl-C does on the embedded default (its nodes are this machine's processes,
    torn down with it), and on AWS without touching the fleet: the instance is going, not the run."""

    def handler(signum: int, frame: Any) -> None:
        if local:
            raise KeyboardInterrupt
        raise HubStopped("stopped by SIGTERM (the hub's instance shuts down): the run's nodes go on and the next hub "
                         "resumes the run")  # fmt: skip

    signal.signal(signal.SIGTERM, handler)


def monitor_for(run_id: str, config: Config, queue: SiteQueue, clients: AwsClients, clock: Clock) -> HubMonitor:
    cw = CloudWatchSink(
        clients.client("cloudwatch") if config.metrics.cloudwatch else None, config.metrics.namespace, clock
    )
    return HubMonitor(run_id, config, queue, clock, cw)


def _serve(hub: Hub) -> Any:
    """The dashboard, /status and /metrics while the run goes; a port in use costs the dashboard, not the run."""
    cfg = hub.config.hub
    if not cfg.http or hub.monitor is None:
        return None
    from hub.http_server import HubServer

    try:
        server = HubServer(hub.monitor.status, hub.monitor.registry, bind=cfg.bind, port=cfg.port).start()
    except OSError as e:
        log.warning(
            "dashboard-unavailable bind=%s port=%d error=%s (set hub.port, or 0 for any free port)",
            cfg.bind,
            cfg.port,
            e,
        )
        return None
    event(log, "dashboard", run_id=hub.run_id, url=server.url, metrics=server.url + "metrics")
    return server


def _drive(hub: Hub, *, local: bool) -> RunOutcome:
    _on_sigterm(local)
    server = _serve(hub)
    try:
        return hub.run()
    except KeyboardInterrupt:
        log.warning("interrupted: terminating the run's nodes")
        hub.executor.teardown(why="interrupted")
        raise
    except HubStopped as e:
        log.warning("%s", e)
        raise
    finally:
        if server is not None:
            server.stop()


def _report(
    console: Console,
    table: StateTable,
    run_id: str,
    outcome: RunOutcome,
    extra: str = "",
    report: CheckReport | None = None,
) -> None:
    rows = table.read_run(run_id)
    print_sites(console, run_id, {r.site: site_entry(r) for r in rows.sites}, outcome.counts)
    if report is not None:
        for text in report.violations:
            say(console, text, label="check violation:", label_style="red")
        console.print(
            f"check: {'OK' if report.ok else f'{len(report.violations)} violation(s)'}"
            f"{f', {len(report.notes)} note(s)' if report.notes else ''}"
            f", false_losses {report.false_losses}"
        )
    console.print(f"summary: {outcome.summary_path}{extra}")


def _publish(outcome: RunOutcome, env: Environment) -> None:
    """Put the run's summary and report in the bucket (`runs/<run_id>/`), where they outlive the table's TTL.
    A failure is logged, and the run's own files stay on disk: the run's result does not depend on it."""
    from cli.report.page import publish

    bucket = env.config.aws.bucket
    try:
        report = publish(outcome.summary_path, env.archive, prices=env.config.fleet.hourly_price)
    except Exception as e:  # noqa: BLE001 - the record is also on disk; a lost upload must not fail the run
        event(
            log,
            "archive-failed",
            logging.ERROR,
            run_id=outcome.run_id,
            bucket=bucket,
            error=f"{type(e).__name__}: {e}",
            kept=str(outcome.summary_path),
        )
        return
    event(log, "archived", run_id=outcome.run_id, bucket=bucket, summary=f"runs/{outcome.run_id}/", report=str(report))


def demo_stats(demo_url: str) -> dict[str, Any] | None:
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(demo_url + "/_stats", timeout=10) as r:
            return json.loads(r.read())["sites"]
    except (OSError, ValueError, KeyError):
        return None


# --- run ----------------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace, console: Console) -> int:
    config = load_config(args.config)
    run_id = args.run_id or default_run_id(time.time())
    return run(where.for_run(args, config), args, run_id, console)


def run(env: Environment, args: argparse.Namespace, run_id: str, console: Console) -> int:
    """The run `run_id` to its end, or what is known of its end; `args` as `gridfleet run` parses them."""
    if args.dry_run:
        return env.dry_run(run_id, console)
    env.preflight()
    done = env.finished_export(run_id, args.out)
    exported = args.out / run_id / "summary.json"
    if done is not None and not env.stores_up():  # reported as it is: no stack is started for it
        return report_finished_export(done, exported, run_id, args.resume, console)
    env.can_crawl()
    with env.hold(run_id) as hold:
        clock = SystemClock()
        provider = env.provider(run_id, clock)
        existing = env.table.get_run(run_id)
        if existing is None and done is not None:
            hold.end()
            return report_finished_export(done, exported, run_id, args.resume, console)
        hub_id = env.hub_id()
        check_existing(existing, run_id, args.resume, env.hub_alive, hub_id)
        if existing is not None and existing.finished:
            hold.end()
            return export_finished(env.table, env.results, run_id, args.out, console, env.node_role())
        env.save_run_config(run_id)
        hub = Hub(
            run_id=run_id,
            config=env.config,
            table=env.table,
            queue=env.queue,
            results=env.results,
            provider=provider,
            control=env.control(run_id, clock),
            clock=clock,
            out_dir=args.out,
            hub_id=hub_id,
            monitor=monitor_for(run_id, env.config, env.queue, env.clients, clock),
            full=getattr(args, "full", False),
            writer_role=env.node_role(),
        )
        env.announce(run_id)
        return _drive_to_end(env, hub, hold, provider, console, local=bool(getattr(args, "local", False)))


def _drive_to_end(
    env: Environment, hub: Hub, hold: RunHold, provider: ComputeProvider, console: Console, *, local: bool
) -> int:
    """Run the hub; then the run checks itself, keeps its record and says how it went."""
    try:
        outcome = _drive(hub, local=local)
    except (KeyboardInterrupt, HubStopped):
        hold.end()
        raise
    hold.end()
    run_id, out = hub.run_id, hub.out_dir
    logs = env.export_node_logs(run_id, out)
    report = check_run(
        run_id,
        table=env.table,
        queue=env.queue,
        results=env.results,
        provider=provider,
        config=env.config,
        demo_stats=demo_stats(env.demo_url) if env.demo_url else None,
        demo_url=env.demo_url,
    )
    attach(report, outcome.summary_path)
    _publish(outcome, env)
    _report(console, env.table, run_id, outcome, f"  (node logs: {logs})" if logs is not None else "", report)
    return env.finish(outcome, report)


# --- rerun ----------------------------------------------------------------------------------------------
def cmd_rerun(args: argparse.Namespace, console: Console) -> int:
    if bool(args.sites) == bool(args.failed):
        raise UsageError("name the sites to rerun, or pass --failed for every FAILED site of the run (not both)")
    env = where.for_rerun(args, load_config)
    env.preflight()
    env.can_crawl()
    return rerun(env, args, console)


def _choose_and_report(console: Console, run_id: str, records: dict[str, Any], args: argparse.Namespace) -> Choice:
    choice = choose(records, args.sites, failed=args.failed, force=args.force)
    for name, why in choice.skipped.items():
        console.print(f"{name}: not rerun: {why}")
    if not choice.sites:
        console.print(f"run {run_id}: nothing to rerun" + (" (no FAILED site)" if args.failed else ""))
    return choice


def rerun(env: Environment, args: argparse.Namespace, console: Console) -> int:
    """Reopen the chosen sites of the run and see it finished: by its live hub, by a hub started for it, or
    (where no hub can be started) by driving the run here, as `run --resume` does."""
    run_id = args.run_id or env.latest_run()
    rows = env.table.read_run(run_id) if run_id else None
    if run_id is None or rows is None or rows.run is None:
        raise UsageError(f"there is no run {run_id or '(none yet)'} {env.where}")
    records = {r.site: r for r in rows.sites}
    choice = _choose_and_report(console, run_id, records, args)
    if not choice.sites:
        return EXIT_OK
    forced_keys(run_id, rows.run.run_date, records, choice)  # a forged result key stops it before a hub starts
    hubs = env.rerun_hubs(run_id, rows.run)
    reopen(
        run_id=run_id,
        run=rows.run,
        records=records,
        choice=choice,
        table=env.table,
        queue=env.queue,
        results=env.results,
        config=env.config,
        now=time.time(),
    )
    console.print(f"run {run_id}: {len(choice.sites)} site(s) queued again: {', '.join(choice.sites)}")
    if env.hand_over(run_id, hubs, console):
        return EXIT_OK
    resume = argparse.Namespace(**{**vars(args), "resume": True, "dry_run": False})
    return run(env.for_run(), resume, run_id, console)
