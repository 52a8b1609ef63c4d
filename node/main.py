"""`gridfleet node`: the node entrypoint, as cloud-init runs it on EC2 and the LocalProvider runs it locally.

Starts this node's Grid node (unless one runs already), runs the agent until
there is no more work, stops the Grid node, and exits; on EC2 the instance then
shuts down, which terminates it.

Chromium runs as the Grid node's user: the agent's own on EC2 (the boot script
starts the agent as the unprivileged crawl user), or `--grid-user` (a root
agent on the embedded default). The node decides once whether Chromium can keep
its sandbox there. When it cannot, a node on AWS crawls nothing: it says why on
its node item (state boot-failed, which the hub acts on) and exits; on the
embedded default it gives its crawlers `--no-sandbox` with a WARNING only when
`browser.allow_no_sandbox` is true, and otherwise refuses the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.aws.imds import Imds, ImdsError
from fleet.aws.metrics import CloudWatchSink
from fleet.aws.results import own_writer
from fleet.aws.stores import open_stores
from fleet.aws.table import DynamoStateTable
from fleet.clock import SystemClock
from fleet.config import Config
from fleet.config.bundle import bundle_mismatch
from fleet.config.load import load_config
from fleet.crawl import crawlerfile
from fleet.errors import ConfigError, GridfleetError, MissingResource, SandboxUnavailable
from fleet.grid_auth import read_optional
from fleet.logs import event, setup
from fleet.record.partition import NodeInfo
from node import browser, evidence
from node.agent import Agent, AgentSettings
from node.closing import Closer
from node.grid_node import GridNode, GridNodeSpec, RunAs
from node.runner import SpareCrawlers
from node.site_mounts import ask_main, ask_parser, serve_main, serve_parser
from node.spot import SpotWatcher
from profiles import NO_MOUNTS, ProfileStore, SocketMounts

log = logging.getLogger("gridfleet.node")
BOOT_FAILED = "boot-failed"  # the node item state the hub acts on (hub.plan.BOOT_FAILED)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gridfleet node",
        description="Run the node agent: take sites from the queue and crawl them until the queue is empty. "
        "`gridfleet node kill --site S --attempt N` ends one crawl on this node; `gridfleet node site-mounts` is "
        "the root helper that mounts a claimed site's EFS directory, `gridfleet node site-mount` asks it.",
    )
    ap.add_argument("--config", required=True, help="fleet.yaml (the hub's effective config)")
    ap.add_argument("--run-id", required=True, help="the run this node works for")
    ap.add_argument("--instance-id", help="this node's id (its Grid stereotype carries it); default: from IMDS")
    ap.add_argument("--imds-url", help="instance metadata service (default: aws.imds_url of the config)")
    ap.add_argument(
        "--state-dir",
        type=Path,
        default=Path("/var/lib/gridfleet"),
        help="where the agent keeps crawler.json and logs (default: %(default)s)",
    )
    ap.add_argument(
        "--profiles-root",
        type=Path,
        default=Path("/efs"),
        help="root of profiles/ and locks/, or with --site-mounts of the sites' mount points (default: %(default)s)",
    )
    ap.add_argument(
        "--site-mounts",
        type=Path,
        help="the socket of the node's site-mount helper (AWS): each claimed site's own EFS directory is mounted "
        "at <profiles root>/<site> for its crawl, with its profile and lock inside",
    )
    ap.add_argument("--grid-url", required=True, help="the Selenium Grid hub, e.g. http://127.0.0.1:4444")
    ap.add_argument(
        "--grid-secret-file",
        type=Path,
        help="the Grid's secret (its node registration secret and router password derive from it), in a file "
        "only this user reads; default: a Grid without them",
    )
    ap.add_argument("--grid-jar", type=Path, help="start this node's Grid node from this jar")
    ap.add_argument("--grid-publish", help="the Grid hub's event bus publish address (tcp://host:4442)")
    ap.add_argument("--grid-subscribe", help="the Grid hub's event bus subscribe address (tcp://host:4443)")
    ap.add_argument(
        "--grid-host",
        default="127.0.0.1",
        help="address this node's Grid node listens on and the hub reaches it at (its private IP on EC2)",
    )
    ap.add_argument("--grid-port", type=int, default=0, help="port of this node's Grid node (0: a free one)")
    ap.add_argument("--java", default="java")
    ap.add_argument(
        "--grid-user",
        help="run the Grid node (so chromedriver and Chromium) as this local user "
        "(needs root; default: this process's user)",
    )
    ap.add_argument("--local", action="store_true", help="AWS is the embedded default's moto server")
    return ap


def grid_user(name: str | None) -> RunAs | None:
    """The user to start the Grid node as, when it is another than this process's and it can be."""
    if not name:
        return None
    try:
        user = RunAs.lookup(name)
    except KeyError:
        event(
            log,
            "grid-user-missing",
            logging.WARNING,
            user=name,
            detail="no such user: the Grid node and Chromium run as this process's user",
        )
        return None
    if user.uid == os.geteuid():
        return None
    if os.geteuid() != 0:
        event(
            log,
            "grid-user-refused",
            logging.WARNING,
            user=name,
            detail="only root can start the Grid node as another user: it runs as this process's user",
        )
        return None
    return user


def sandbox_args(user: RunAs | None, *, on_aws: bool, allow_no_sandbox: bool) -> tuple[str, ...]:
    """Nothing when Chromium, run as `user` (None: as this process), can have its sandbox; `--no-sandbox` when it
    cannot and may go on without it (`browser.sandbox_flags`); else SandboxUnavailable. Said once in the log."""
    if user is None:
        uid, gid, groups = os.geteuid(), os.getegid(), tuple(os.getgroups())
    else:
        uid, gid, groups = user.uid, user.gid, user.groups
    problem = browser.sandbox_problem(uid, gid, groups)
    try:
        flags = browser.sandbox_flags(problem, on_aws=on_aws, allow_no_sandbox=allow_no_sandbox)
    except SandboxUnavailable:
        event(log, "chromium-sandbox", logging.ERROR, uid=uid, sandbox="refused", reason=problem)
        raise
    if problem is None:
        event(log, "chromium-sandbox", uid=uid, sandbox="on")
    else:
        event(log, "chromium-sandbox", logging.WARNING, uid=uid, sandbox="off", reason=problem)
    return flags


def kill_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gridfleet node kill", description="Kill the crawler of one site and attempt on this node, if it runs."
    )
    ap.add_argument("--state-dir", type=Path, default=Path("/var/lib/gridfleet"))
    ap.add_argument("--site", required=True)
    ap.add_argument("--attempt", type=int, required=True)
    return ap


def kill_main(argv: list[str]) -> int:
    """`gridfleet node kill`: what SSM or SSH runs on a node to end one crawl (exit 0: it no longer runs)."""
    args = kill_parser().parse_args(argv)
    k = crawlerfile.kill(args.state_dir, args.site, args.attempt)
    print(f"{'ok' if k.ok else 'failed'}: {k.detail}")
    return 0 if k.ok else 1


def report_failure_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gridfleet node report-failure",
        description="Record that this node's bootstrap failed, and why, for the hub.",
    )
    ap.add_argument("--config", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--instance-id", required=True)
    ap.add_argument("--message", required=True)
    return ap


def report_failure_main(argv: list[str]) -> int:
    """`gridfleet node report-failure`: a node whose bootstrap failed says why, on its node item."""
    args = report_failure_parser().parse_args(argv)
    config = load_config(args.config)
    report_boot_failed(AwsClients(config.aws), config, args.run_id, args.instance_id, args.message)
    print(f"reported: {args.instance_id} {BOOT_FAILED}: {args.message}")
    return 0


def report_boot_failed(clients: AwsClients, config: Config, run_id: str, instance_id: str, why: str) -> None:
    """This node's item says it will not work, and why: the hub terminates it and, when no node of the run can
    work, ends the run with that reason."""
    now = time.time()
    table = DynamoStateTable(clients.client("dynamodb"), config.aws.table)
    table.put_node(NodeInfo(run_id, instance_id, BOOT_FAILED, now, now, error=why))


class _Usage(Exception):
    """A command line or config this node cannot start with (exit 2); args[0] says why."""


class NodeCommand(NamedTuple):
    """One of the node's own commands (`gridfleet node <word>`): its parser, and what runs it."""

    parser: Callable[[], argparse.ArgumentParser]
    main: Callable[[list[str]], int]


#: The node's own commands by their first word; anything else starts the agent.
COMMANDS: dict[str, NodeCommand] = {
    "kill": NodeCommand(kill_parser, kill_main),
    "report-failure": NodeCommand(report_failure_parser, report_failure_main),
    "site-mounts": NodeCommand(serve_parser, serve_main),
    "site-mount": NodeCommand(ask_parser, ask_main),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in COMMANDS:
        return COMMANDS[argv[0]].main(argv[1:])
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        config, imds = _config_and_identity(args)
        args.grid_secret = read_optional(args.grid_secret_file)
    except MissingResource as e:
        print(f"gridfleet node: {e}", file=sys.stderr)
        return 2
    except _Usage as e:
        print(f"gridfleet node: {e}", file=sys.stderr)
        return 2
    setup(prefix=f"[{args.instance_id}] ", defaults={"instance_id": args.instance_id, "run_id": args.run_id})
    args.state_dir.mkdir(parents=True, exist_ok=True)
    grid = None
    run_as = grid_user(args.grid_user) if args.grid_jar else None
    try:
        sandbox = sandbox_args(run_as, on_aws=not args.local, allow_no_sandbox=config.browser.allow_no_sandbox)
    except SandboxUnavailable as e:  # before any message is taken: no site waits on a node that cannot crawl
        return _refuse(args, config, e)
    spares = SpareCrawlers(args.state_dir / "crawler.log")
    closer = Closer(background=True)
    try:
        spares.prepare()  # its imports overlap the Grid node's start
        if args.grid_jar:
            if not (args.grid_publish and args.grid_subscribe):
                print("gridfleet node: --grid-jar needs --grid-publish and --grid-subscribe", file=sys.stderr)
                return 2
            grid = _start_grid(args, config, run_as)
        return _agent(args, config, imds, grid, run_as, sandbox, spares, closer).run()
    except GridfleetError as e:
        event(log, "node-error", logging.ERROR, run_id=args.run_id, node=args.instance_id, error=str(e))
        return e.exit_code
    except Exception:
        log.exception("node agent failed run_id=%s node=%s", args.run_id, args.instance_id)
        return 1
    finally:
        closer.wait()
        spares.close()
        if grid is not None:
            grid.stop()


def _refuse(args: argparse.Namespace, config: Config, e: SandboxUnavailable) -> int:
    """This node will not crawl: one line on stderr, and its node item says why."""
    print(f"gridfleet node: {e}", file=sys.stderr)
    try:
        report_boot_failed(_clients(args, config), config, args.run_id, args.instance_id, str(e))
    except Exception:  # the refusal stands; the hub then finds a node that never beat
        log.exception("reporting the refusal failed run_id=%s node=%s", args.run_id, args.instance_id)
    return e.exit_code


def _config_and_identity(args: argparse.Namespace) -> tuple[Config, Imds]:
    """The config, and the metadata service; fills in `args.instance_id` from it when not given."""
    try:
        config = load_config(args.config)
    except ConfigError as e:
        raise _Usage(str(e)) from None
    mismatch = bundle_mismatch(config, Path(config.aws.install_dir))
    if mismatch is not None and not args.local:
        raise _Usage(mismatch)
    imds = Imds(args.imds_url or config.aws.imds_url)
    if not args.instance_id:
        try:
            args.instance_id = imds.instance_id()
        except ImdsError as e:
            raise _Usage(f"no --instance-id and {e}") from None
    return config, imds


def _clients(args: argparse.Namespace, config: Config) -> AwsClients:
    return AwsClients(config.aws, credentials=LOCAL_CREDENTIALS if args.local else None)


def _start_grid(args: argparse.Namespace, config: Config, run_as: RunAs | None) -> GridNode:
    spec = GridNodeSpec(
        jar=args.grid_jar,
        grid_url=args.grid_url,
        publish=args.grid_publish,
        subscribe=args.grid_subscribe,
        chromedriver=config.browser.chromedriver,
        browser_name=browser.browser_name(config.browser.chromium),
        host=args.grid_host,
        port=args.grid_port,
        java=args.java,
        session_timeout_s=int(max(60, config.run.hang_after_s * 2)),
        secret=args.grid_secret,
    )
    grid = GridNode(spec, args.instance_id, args.state_dir, run_as=run_as)
    grid.start()
    return grid


def _settings(args: argparse.Namespace, config: Config, sandbox: tuple[str, ...], clients) -> AgentSettings:
    settings = AgentSettings.from_config(config, args.run_id, args.instance_id, args.grid_url, local=args.local)
    return dataclasses.replace(
        settings,
        chrome_args=(*settings.chrome_args, *sandbox),
        grid_secret_file=str(args.grid_secret_file or ""),
        # on AWS it writes under its credentials' own prefix; a local node has no IAM role
        writer="" if args.local else own_writer(clients.client("sts"), args.instance_id),
    )


def _agent(
    args: argparse.Namespace,
    config: Config,
    imds: Imds,
    grid: GridNode | None,
    run_as: RunAs | None,
    sandbox: tuple[str, ...],
    spares: SpareCrawlers,
    closer: Closer,
) -> Agent:
    clients = _clients(args, config)
    stores = open_stores(clients, config.aws)
    clock = SystemClock()
    secret = args.grid_secret

    def cleanup(profile: Path, session_id: str | None, forced: bool) -> None:
        # After a killed crawl its browser still runs under the Grid node: kill it, then free the slot.
        # After a clean end the crawler has quit its session; only a straggler is left to kill.
        killed = browser.kill_browser(profile)
        if session_id and (forced or killed):
            browser.end_session(args.grid_url, session_id, secret=secret)
        elif forced:  # killed before it named its session: the Grid may still be starting its browser
            problem = browser.settle_browser(
                args.grid_url, args.instance_id, profile, clock.monotonic, clock.sleep, secret=secret
            )
            if problem:
                event(log, "browser-unsettled", logging.WARNING, profile=profile.name, problem=problem)

    return Agent(
        _settings(args, config, sandbox, clients),
        table=stores.table,
        queue=stores.queue,
        results=stores.results,
        profiles=ProfileStore(
            args.profiles_root, owner=(run_as.uid, run_as.gid) if run_as else None, per_site=bool(args.site_mounts)
        ),
        mounts=SocketMounts(args.site_mounts) if args.site_mounts else NO_MOUNTS,
        start_crawl=spares.start,
        prepare_crawl=spares.prepare,
        closer=closer,
        cleanup=cleanup,
        capture=lambda session_id: evidence.capture(args.grid_url, session_id, secret=secret),
        clock=clock,
        state_dir=args.state_dir,
        healthy=grid.problem if grid is not None else (lambda: None),
        grid_up=(lambda: browser.grid_node_ready(args.grid_url, args.instance_id, secret=secret))
        if grid is not None
        else (lambda: True),
        spot_notice=SpotWatcher(imds, clock).notice,
        metrics=CloudWatchSink(
            clients.client("cloudwatch") if config.metrics.cloudwatch else None, config.metrics.namespace, clock
        ),
    )
