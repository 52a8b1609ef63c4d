"""`gridfleet run`: one run of the crawl, on the embedded default (`--local`) or on AWS.

Both build the same `Hub` with other adapters behind the same seams. `--resume`
continues the run if it exists (after its hub died) and starts it if not, so
the hub instance's boot script and the external watchdog can both say
`run --resume` for the day's run.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from fleet.clock import SystemClock
from fleet.codec import RunInfo
from fleet.config import Config
from fleet.errors import UsageError
from fleet.logs import event
from fleet.aws.metrics import CloudWatchSink
from fleet.aws.results import ResultStore
from fleet.aws.table import StateTable
from cli import aws_env, local_env
from cli.check import CheckReport, attach, check_run
from hub.loop import EXIT_OK, Hub, RunOutcome
from hub.monitor import HubMonitor
from hub.providers.local import local_hub_id
from fleet.summary import build_summary, export, site_entry
from cli.views import print_sites

log = logging.getLogger("gridfleet")


def check_existing(existing: RunInfo | None, run_id: str, resume: bool, hub_alive: Callable[[str], bool],
                   me: str) -> None:
    if existing is None:
        if resume:
            log.info("run %s does not exist yet: starting it", run_id)
        return
    if not resume:
        raise UsageError(f"run {run_id} already exists; pass --resume to continue it or --run-id to start another")
    # The same hub instance started again (a stopped hub restarted) is not another hub.
    if not existing.finished and existing.hub_id and existing.hub_id != me and hub_alive(existing.hub_id):
        raise UsageError(f"run {run_id} is held by a hub that is still running ({existing.hub_id})")


def export_finished(table: StateTable, results: ResultStore, run_id: str, out: Path, console: Console) -> int:
    rows = table.read_run(run_id)
    assert rows.run is not None
    summary = build_summary(rows.run, rows.sites, left_running=0, finished_at=rows.run.finished_at or time.time(),
                            finish_reason="done")
    path = export(out, summary, rows.sites, results)
    print_sites(console, run_id, summary["sites"], summary["counts"])
    console.print(f"run {run_id} had already finished; summary: {path}")
    return 3 if summary["counts"]["FAILED"] else 0


def finished_export(out: Path, run_id: str) -> dict[str, Any] | None:
    """The summary a finished run of this id exported under `out`, if any."""
    import json

    path = out / run_id / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and summary.get("finished_at") else None


def report_finished_export(summary: dict[str, Any], path: Path, run_id: str, resume: bool, console: Console) -> int:
    """A finished run on the embedded default: `--resume` reports it; a new run of its id is refused."""
    if not resume:
        raise UsageError(f"run {run_id} already finished ({path}); pass --run-id to start another, "
                         f"or --resume to see how it ended")
    counts = summary.get("counts") or {}
    print_sites(console, run_id, summary.get("sites") or {}, counts)
    console.print(f"run {run_id} had already finished; nothing to resume. summary: {path}")
    return 3 if counts.get("FAILED") else EXIT_OK


def _term_as_interrupt() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def monitor_for(run_id: str, config: Config, queue: Any, clients: Any, clock: Any) -> HubMonitor:
    cw = CloudWatchSink(clients.client("cloudwatch") if config.metrics.cloudwatch else None,
                        config.metrics.namespace, clock)
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
        log.warning("dashboard-unavailable bind=%s port=%d error=%s (set hub.port, or 0 for any free port)",
                    cfg.bind, cfg.port, e)
        return None
    event(log, "dashboard", run_id=hub.run_id, url=server.url, metrics=server.url + "metrics")
    return server


def _drive(hub: Hub) -> RunOutcome:
    _term_as_interrupt()
    server = _serve(hub)
    try:
        return hub.run()
    except KeyboardInterrupt:
        log.warning("interrupted: terminating the run's nodes")
        hub.executor.teardown(why="interrupted")
        raise
    finally:
        if server is not None:
            server.stop()


def _report(console: Console, table: StateTable, run_id: str, outcome: RunOutcome, extra: str = "",
            report: CheckReport | None = None) -> None:
    rows = table.read_run(run_id)
    print_sites(console, run_id, {r.site: site_entry(r) for r in rows.sites}, outcome.counts)
    if report is not None:
        for text in report.violations:
            console.print(f"[red]check violation:[/] {text}")
        console.print(f"check: {'OK' if report.ok else f'{len(report.violations)} violation(s)'}"
                      f"{f', {len(report.notes)} note(s)' if report.notes else ''}"
                      f", false_losses {report.false_losses}")
    console.print(f"summary: {outcome.summary_path}{extra}")


def _publish(outcome: RunOutcome, clients: Any, config: Config) -> None:
    """Put the run's summary and report in the bucket (`runs/<run_id>/`), where they outlive the table's TTL.
    A failure is logged, and the run's own files stay on disk: the run's result does not depend on it."""
    from fleet.aws.archive import S3RunArchive
    from cli.report import publish

    archive = S3RunArchive(clients.client("s3"), config.aws.bucket)
    try:
        report = publish(outcome.summary_path, archive, prices=config.fleet.hourly_price)
    except Exception as e:  # noqa: BLE001 - the record is also on disk; a lost upload must not fail the run
        event(log, "archive-failed", logging.ERROR, run_id=outcome.run_id, bucket=config.aws.bucket,
              error=f"{type(e).__name__}: {e}", kept=str(outcome.summary_path))
        return
    event(log, "archived", run_id=outcome.run_id, bucket=config.aws.bucket, summary=f"runs/{outcome.run_id}/",
          report=str(report))


def demo_stats(demo_url: str) -> dict[str, Any] | None:
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(demo_url + "/_stats", timeout=10) as r:
            return json.loads(r.read())["sites"]
    except (OSError, ValueError, KeyError):
        return None


# --- the embedded default -----------------------------------------------------------------
def run_local(args: argparse.Namespace, config: Config, run_id: str, console: Console) -> int:
    if args.dry_run:
        nodes = min(config.fleet.max_nodes, config.local.node_cap(os.cpu_count() or 1), len(config.sites))
        console.print(f"run {run_id} (dry run, nothing started): {len(config.sites)} sites, {nodes} local nodes, "
                      f"max_attempts {config.run.max_attempts}, hang_after_s {config.run.hang_after_s:g}")
        for s in config.sites:
            console.print(f"  {s.id:<24} {s.crawler:<8} {s.start_url}")
        return EXIT_OK
    home = local_env.gridfleet_home()
    local_env.preflight(config)
    stack = local_env.make_stack(home, config, progress=lambda m: log.info("stack: %s", m))
    state = stack.running()
    # moto keeps nothing once its stack stops: a run that finished lives on only in its export.
    done = finished_export(args.out, run_id)
    if state is None and done is not None:
        return report_finished_export(done, args.out / run_id / "summary.json", run_id, args.resume, console)
    started_here = state is None  # this run owns the stack: it stops it however the run ends
    adopted = state is not None and state.owner_run == run_id  # a crashed earlier hub of this run started it
    if state is None:
        log.info("stack: starting the embedded default (moto server, Selenium Grid, demo sites)")
        state = stack.up(owner_run=run_id)
    finished = False
    try:
        env = local_env.connect(stack, state, config, bootstrap=True)
        clock = SystemClock()
        provider = env.provider(run_id, clock)
        existing = env.table.get_run(run_id)
        if existing is None and done is not None:
            finished = True
            return report_finished_export(done, args.out / run_id / "summary.json", run_id, args.resume, console)
        hub_id = local_hub_id()
        check_existing(existing, run_id, args.resume, provider.hub_alive, hub_id)
        if existing is not None and existing.finished:
            finished = True
            return export_finished(env.table, env.results, run_id, args.out, console)
        env.write_config(run_id)
        hub = Hub(run_id=run_id, config=env.config, table=env.table, queue=env.queue, results=env.results,
                  provider=provider, control=env.control(run_id), clock=clock, out_dir=args.out, hub_id=hub_id,
                  monitor=monitor_for(run_id, env.config, env.queue, env.clients, clock),
                  full=getattr(args, "full", False))
        log.info("run %s: %d sites, up to %d nodes; Grid %s, demo sites %s", run_id, len(config.sites),
                 env.config.fleet.max_nodes, state.grid_url, state.demo_url)
        try:
            outcome = _drive(hub)
        except KeyboardInterrupt:
            finished = adopted
            raise
        finished = True
        env.export_node_logs(run_id, args.out)
        report = check_run(run_id, table=env.table, queue=env.queue, results=env.results, provider=provider,
                           config=env.config, demo_stats=demo_stats(state.demo_url), demo_url=state.demo_url)
        attach(report, outcome.summary_path)
        _publish(outcome, env.clients, env.config)
        _report(console, env.table, run_id, outcome, f"  (node logs: {args.out / run_id / 'nodes'})", report)
        return outcome.exit_code if report.ok else max(outcome.exit_code, 1)
    finally:
        if started_here or (adopted and finished):
            stack.down(quiet=True)


# --- AWS ------------------------------------------------------------------------------------
def run_aws(args: argparse.Namespace, config: Config, run_id: str, console: Console) -> int:
    env = aws_env.connect(config)
    if args.dry_run:
        from cli.aws import dry_run

        return dry_run(env, run_id, console)
    env.preflight()
    ami = env.resolve_ami()
    ident = aws_env.identify(config.aws.imds_url)
    hub_address = config.aws.hub_address or ident.address
    if not hub_address:
        raise UsageError("aws.hub_address is not set and this host is not on EC2: nodes need the address of "
                         "the hub's Selenium Grid")
    provider = env.provider(ami, hub_address)
    existing = env.table.get_run(run_id)
    check_existing(existing, run_id, args.resume,
                   lambda hid: provider.hub_alive(hid) or aws_env.same_host_hub_alive(hid), ident.hub_id)
    if existing is not None and existing.finished:
        return export_finished(env.table, env.results, run_id, args.out, console)
    env.node_user_data(run_id, hub_address)  # renders (and checks) the nodes' user-data before anything starts
    key = env.upload_run_config(run_id)
    clock = SystemClock()
    hub = Hub(run_id=run_id, config=config, table=env.table, queue=env.queue, results=env.results,
              provider=provider, control=env.control(clock), clock=clock, out_dir=args.out,
              hub_id=ident.hub_id, monitor=monitor_for(run_id, config, env.queue, env.clients, clock),
              full=getattr(args, "full", False))
    log.info("run %s on AWS (%s): %d sites, up to %d nodes, Grid at %s:%d, node config s3://%s/%s", run_id,
             config.aws.region, len(config.sites), config.fleet.max_nodes, hub_address, config.aws.grid_port,
             config.aws.bucket, key)
    outcome = _drive(hub)
    report = check_run(run_id, table=env.table, queue=env.queue, results=env.results, provider=provider,
                       config=config)
    attach(report, outcome.summary_path)
    _publish(outcome, env.clients, config)
    _report(console, env.table, run_id, outcome, report=report)
    if outcome.left_running == 0:
        log.info("hub self-stop: %s", aws_env.self_stop(config.aws.hub_self_stop, ident, env.ec2))
    else:
        log.error("hub stays up: %d nodes could not be terminated", outcome.left_running)
    return outcome.exit_code


def cmd_run(args: argparse.Namespace, console: Console, load: Callable[[str], Config]) -> int:
    from hub.loop import default_run_id

    config = load(args.config)
    run_id = args.run_id or default_run_id(time.time())
    return (run_local if args.local else run_aws)(args, config, run_id, console)



# --- rerun ------------------------------------------------------------------------------------
def cmd_rerun(args: argparse.Namespace, console: Console, load: Callable[[str], Config]) -> int:
    if bool(args.sites) == bool(args.failed):
        raise UsageError("name the sites to rerun, or pass --failed for every FAILED site of the run (not both)")
    if args.config and not args.local:
        return _rerun_aws(args, load(args.config), console)
    return _rerun_local(args, load(args.config) if args.config else None, console)


def _choose_and_report(console: Console, run_id: str, records: dict[str, Any], args: argparse.Namespace):
    from cli.rerun import choose

    choice = choose(records, args.sites, failed=args.failed, force=args.force)
    for name, why in choice.skipped.items():
        console.print(f"{name}: not rerun: {why}")
    if not choice.sites:
        console.print(f"run {run_id}: nothing to rerun" + (" (no FAILED site)" if args.failed else ""))
    return choice


def _rerun_local(args: argparse.Namespace, config: Config | None, console: Console) -> int:
    from cli.rerun import reopen

    stack = local_env.make_stack(local_env.gridfleet_home(), need_jar=False)
    state = stack.running()
    run_id = args.run_id or (local_env.latest_run_on_stack(stack) if state else None)
    if state is None or run_id is None:
        raise UsageError("no local stack with a run is up: a rerun on the embedded default works on the stack that "
                         "holds the run (moto keeps nothing once it stops). Start one with `gridfleet local up`, "
                         "then `gridfleet run --local`; for a run on AWS pass --config")
    config = config or local_env.run_config(stack, run_id)
    if config is None:
        raise UsageError(f"run {run_id} did not run on this stack (no {stack.dir / 'runs' / run_id / 'fleet.yaml'}); "
                         f"pass --config with its fleet.yaml")
    local_env.preflight(config)
    env = local_env.connect(stack, state, config, bootstrap=False)
    rows = env.table.read_run(run_id)
    if rows.run is None:
        raise UsageError(f"there is no run {run_id} on the local stack")
    choice = _choose_and_report(console, run_id, {r.site: r for r in rows.sites}, args)
    if not choice.sites:
        return EXIT_OK
    provider = env.provider(run_id, SystemClock())
    hub_live = not rows.run.finished and rows.run.hub_id and provider.hub_alive(rows.run.hub_id)
    reopen(run_id=run_id, run=rows.run, records={r.site: r for r in rows.sites}, choice=choice, table=env.table,
           queue=env.queue, results=env.results, config=env.config, now=time.time())
    console.print(f"run {run_id}: {len(choice.sites)} site(s) queued again: {', '.join(choice.sites)}")
    if hub_live:
        console.print(f"the run's hub ({rows.run.hub_id}) picks them up; follow with `gridfleet watch --run-id {run_id}`")
        return EXIT_OK
    resume = argparse.Namespace(**{**vars(args), "resume": True, "dry_run": False})
    return run_local(resume, config, run_id, console)


def _rerun_aws(args: argparse.Namespace, config: Config, console: Console) -> int:
    from lambdas.handlers import LambdaSettings, live_hub_ids, start_hub
    from cli.rerun import reopen

    env = aws_env.connect(config)
    env.preflight()
    runs = env.table.list_runs()
    run_id = args.run_id or (runs[-1].run_id if runs else None)
    rows = env.table.read_run(run_id) if run_id else None
    if rows is None or rows.run is None:
        raise UsageError(f"there is no run {run_id or '(none yet)'} in the table {config.aws.table}")
    choice = _choose_and_report(console, run_id, {r.site: r for r in rows.sites}, args)
    if not choice.sites:
        return EXIT_OK
    hubs = live_hub_ids(env.ec2, run_id, config.aws.stack)
    if not hubs and not config.aws.hub_launch_template:
        raise UsageError("aws.hub_launch_template is not set, and no hub runs this run: a rerun on AWS starts a hub "
                         "from that template (`gridfleet config from-terraform` fills it in)")
    clock = SystemClock()
    reopen(run_id=run_id, run=rows.run, records={r.site: r for r in rows.sites}, choice=choice, table=env.table,
           queue=env.queue, results=env.results, config=config, now=clock.now())
    console.print(f"run {run_id}: {len(choice.sites)} site(s) queued again: {', '.join(choice.sites)}")
    if hubs:
        console.print(f"the run's hub ({', '.join(hubs)}) picks them up")
    else:
        settings = LambdaSettings(region=config.aws.region, table=config.aws.table, stack=config.aws.stack,
                                  bucket=config.aws.bucket, endpoint_url=config.aws.endpoint_url,
                                  hub_launch_template=config.aws.hub_launch_template)
        started = start_hub(settings, env.ec2, env.table, clock, run_id)
        console.print(f"hub: {started['action']} {started.get('instance_id') or ''} "
                      f"({started.get('reason') or started.get('how')}); it launches the nodes these sites need")
    console.print(f"follow with `gridfleet watch --config {args.config} --run-id {run_id}`")
    return EXIT_OK
