"""`gridfleet`: the command line (DESIGN 8). Exit codes: 0 every site COMPLETED, 3 some FAILED,
2 invalid config or usage (nothing launched), 1 any other error."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from fleet.clock import SystemClock
from fleet.config_load import load_config
from fleet.errors import GridfleetError, MissingResource, UsageError
from fleet.logs import setup
from hub import local_env
from hub.loop import EXIT_ERROR, EXIT_OK, Hub, default_run_id
from hub.providers.local import local_hub_id
from hub.summary import build_summary, counts, export, site_entry
from hub.teardown import teardown_run
from hub.views import print_sites

log = logging.getLogger("gridfleet")
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DEFAULT_CONFIG = "fleet.yaml"


def _run_id(value: str) -> str:
    if not RUN_ID_RE.match(value):
        raise argparse.ArgumentTypeError(f"{value!r}: letters, digits, '.', '_' or '-' (max 64), e.g. 2026-11-21")
    return value


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
    p.add_argument("--out", type=Path, default=Path("runs"), help="where runs/<run_id>/ goes (default: %(default)s)")

    p = sub.add_parser("status", help="the sites of a run: status, attempt, node, last update, reason")
    p.add_argument("--run-id", type=_run_id, help="default: the latest run")
    p.add_argument("--json", action="store_true", help='{"run_id", "sites", "counts"} as JSON')
    p.add_argument("--config", help="fleet.yaml naming the table (default: the run's own config on the local stack)")
    p.add_argument("--out", type=Path, default=Path("runs"), help="where to look for summaries (default: %(default)s)")

    p = sub.add_parser("teardown", help="end a run now: terminate its nodes, mark open sites FAILED/killed")
    p.add_argument("--run-id", type=_run_id, help="default: the latest run")
    p.add_argument("--out", type=Path, default=Path("runs"))

    p = sub.add_parser("local", help="the embedded default's stack (moto server, Selenium Grid, demo sites)")
    p.add_argument("action", choices=("up", "down", "status"),
                   help="up: start and leave running; down: stop it and every node; status: components and URLs")

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
    config = load_config(args.config)
    run_id = args.run_id or default_run_id(time.time())
    if not args.local:
        raise UsageError("runs on AWS are not available in this version; use --local for the embedded default")
    if args.dry_run:
        return _dry_run(config, run_id, console)
    home = local_env.gridfleet_home()
    local_env.preflight(config)
    stack = local_env.make_stack(home, config, progress=lambda m: log.info("stack: %s", m))
    state = stack.running()
    started_here = state is None  # this run owns the stack: it stops it however the run ends
    adopted = state is not None and state.owner_run == run_id  # a crashed earlier hub of this run started it
    if state is None:
        log.info("stack: starting the embedded default (moto server, Selenium Grid, demo sites)")
        state = stack.up(owner_run=run_id)
    finished = False
    try:
        env = local_env.connect(stack, state, config, bootstrap=True)
        existing = env.table.get_run(run_id)
        clock = SystemClock()
        provider = env.provider(run_id, clock)
        if existing is not None and not args.resume:
            raise UsageError(f"run {run_id} already exists on this stack; pass --resume to continue it "
                             f"or --run-id to start another")
        if existing is None and args.resume:
            raise UsageError(f"there is no run {run_id} to resume on the stack in {stack.dir}")
        if existing is not None and not existing.finished and existing.hub_id \
                and provider.hub_alive(existing.hub_id):
            raise UsageError(f"run {run_id} is held by a hub that is still running ({existing.hub_id})")
        env.write_config(run_id)
        hub = Hub(run_id=run_id, config=env.config, table=env.table, queue=env.queue, results=env.results,
                  provider=provider, control=env.control(run_id), clock=clock, out_dir=args.out, hub_id=local_hub_id())
        if existing is not None and existing.finished:
            outcome_code = _export_finished(env, run_id, args.out, console)
            finished = True
            return outcome_code
        log.info("run %s: %d sites, up to %d nodes; Grid %s, demo sites %s", run_id, len(config.sites),
                 env.config.fleet.max_nodes, state.grid_url, state.demo_url)
        _term_as_interrupt()
        try:
            outcome = hub.run()
        except KeyboardInterrupt:
            log.warning("interrupted: terminating the run's nodes")
            hub.executor.teardown(why="interrupted")
            finished = adopted
            raise
        finished = True
        env.export_node_logs(run_id, args.out)
        rows = env.table.read_run(run_id)
        print_sites(console, run_id, {r.site: site_entry(r) for r in rows.sites}, outcome.counts)
        console.print(f"summary: {outcome.summary_path}  (node logs: {args.out / run_id / 'nodes'})")
        return outcome.exit_code
    finally:
        if started_here or (adopted and finished):
            stack.down(quiet=True)


def _term_as_interrupt() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _export_finished(env: local_env.LocalEnv, run_id: str, out: Path, console: Console) -> int:
    rows = env.table.read_run(run_id)
    assert rows.run is not None
    summary = build_summary(rows.run, rows.sites, left_running=0, finished_at=rows.run.finished_at or time.time(),
                            finish_reason="done")
    path = export(out, summary, rows.sites, env.results)
    print_sites(console, run_id, summary["sites"], summary["counts"])
    console.print(f"run {run_id} had already finished; summary: {path}")
    return 3 if summary["counts"]["FAILED"] else 0


def _dry_run(config, run_id: str, console: Console) -> int:
    nodes = min(config.fleet.max_nodes, config.local.node_cap(os.cpu_count() or 1), len(config.sites))
    console.print(f"run {run_id} (dry run, nothing started): {len(config.sites)} sites, {nodes} local nodes, "
                  f"max_attempts {config.run.max_attempts}, hang_after_s {config.run.hang_after_s:g}")
    for s in config.sites:
        console.print(f"  {s.id:<24} {s.crawler:<8} {s.start_url}")
    return EXIT_OK


# --- status ------------------------------------------------------------------------------------
def _source(args: argparse.Namespace, need_run: bool = True):
    """(LocalEnv or None, run_id) for commands that read a run: the local stack if it is up."""
    home = local_env.gridfleet_home()
    stack = local_env.make_stack(home, need_jar=False)
    state = stack.running()
    run_id = args.run_id
    if state is None:
        return None, run_id
    run_id = run_id or local_env.latest_run_on_stack(stack)
    config = load_config(args.config) if getattr(args, "config", None) else (
        local_env.run_config(stack, run_id) if run_id else None)
    if config is None:
        return None, run_id
    return local_env.connect(stack, state, config, bootstrap=False), run_id


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    env, run_id = _source(args)
    data = None
    if env is not None and run_id:
        rows = env.table.read_run(run_id)
        if rows.run is not None:
            data = {"run_id": run_id, "sites": {r.site: site_entry(r) for r in sorted(rows.sites, key=lambda r: r.site)},
                    "counts": counts(rows.sites)}
    if data is None:
        data = _status_from_summary(args.out, run_id)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print_sites(console, data["run_id"], data["sites"], data["counts"], limit_full=10**6)
    return EXIT_OK


def _status_from_summary(out: Path, run_id: str | None) -> dict[str, Any]:
    if run_id is None:
        found = sorted(out.glob("*/summary.json"), key=lambda p: p.stat().st_mtime) if out.is_dir() else []
        if not found:
            raise MissingResource("no run to show: no local stack is up and no runs/*/summary.json here "
                                  "(use --run-id, --out, or start one with `gridfleet run --local`)")
        path = found[-1]
    else:
        path = out / run_id / "summary.json"
        if not path.is_file():
            raise MissingResource(f"run {run_id}: not on a running local stack, and no {path}")
    summary = json.loads(path.read_text())
    return {"run_id": summary["run_id"], "sites": summary["sites"], "counts": summary.get("counts") or
            {k: sum(1 for s in summary["sites"].values() if s["run_status"] == k)
             for k in ("QUEUED", "RUN", "COMPLETED", "FAILED")}}


# --- teardown ------------------------------------------------------------------------------------
def cmd_teardown(args: argparse.Namespace, console: Console) -> int:
    env, run_id = _source(args)
    if env is None or not run_id:
        raise MissingResource("no local stack with a run is up; nothing to tear down")
    clock = SystemClock()
    provider = env.provider(run_id, clock)
    result = teardown_run(run_id, env.table, provider, clock)
    rows = env.table.read_run(run_id)
    summary = build_summary(rows.run, rows.sites, left_running=result.left_running, finished_at=clock.now(),
                            finish_reason="teardown")
    path = export(args.out, summary, rows.sites, env.results)
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
    "status": cmd_status,
    "teardown": cmd_teardown,
    "local": cmd_local,
}

if __name__ == "__main__":
    raise SystemExit(main())
