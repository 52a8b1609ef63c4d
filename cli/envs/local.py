"""The embedded default as an Environment: the local stack's moto server is AWS, local processes are the nodes.

`GRIDFLEET_HOME` (default `~/.gridfleet`, `/var/lib/gridfleet` for root) holds the stack (`local/`), local
instances, and `efs/` (profiles and locks, kept like EFS across runs). A run on the stack keeps the config its
nodes use in `local/runs/<run_id>/fleet.yaml`, by which `status`, `check` and `rerun` find the run's table,
queue and bucket again. moto keeps nothing once the stack stops: a finished run lives on in its export, runs/.

The stack (embedded.stack) is imported inside the functions that start or read it, never with this module, so
that `gridfleet --help` and the AWS commands do not load it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from cli.envs.base import RunHold, StoresOf
from cli.envs.crawl_user import CrawlUser, reach_crawl_user
from cli.envs.grid_jar import find_grid_jar, grid_jar_candidates
from cli.envs.home import gridfleet_home
from cli.packaging.crawler_ship import install_local, installed_config, project_of
from cli.packaging.requirements import install as install_requirements
from cli.packaging.requirements import requirements_root
from cli.report.check import CheckReport
from cli.views.plain import say
from fleet.aws.bootstrap import ensure_resources
from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.clock import Clock, SystemClock
from fleet.config import Config
from fleet.config.load import dump_config, load_config
from fleet.crawl.project import CrawlerProject
from fleet.errors import UsageError
from fleet.outputs.results import LOCAL_ROLE
from fleet.record.partition import RunInfo
from hub.control.local import LocalNodeControl
from hub.loop import EXIT_OK, RunOutcome
from hub.providers.local import LocalProvider, local_hub_id

if TYPE_CHECKING:
    from embedded.stack import LocalStack, StackState

log = logging.getLogger("gridfleet")

#: What a local node leaves in its state directory that is worth keeping with the run.
NODE_LOGS = ("node.log", "crawler.log", "grid-node.log", "instance.json")


def make_stack(
    home: Path, config: Config | None = None, *, need_jar: bool = True, progress: Callable[[str], None] = lambda _: None
) -> LocalStack:
    from embedded.stack import LocalStack

    jar = find_grid_jar(grid_jar_candidates(home)) if need_jar else None
    timeout = config.local.grid_session_request_timeout_s if config else 60
    return LocalStack(home, grid_jar=jar, session_request_timeout_s=timeout, progress=progress)


def effective_config(config: Config, state: StackState, cpus: int | None = None) -> Config:
    """The config nodes get: AWS is the stack's moto server, `{demo}` is the demo server, and no more
    nodes than this machine can run (`local.max_nodes`)."""
    sites = tuple(s.model_copy(update={"start_url": s.url_for(state.demo_url)}) for s in config.sites)
    cap = config.local.node_cap(cpus or os.cpu_count() or 1)
    fleet = config.fleet
    if fleet.max_nodes > cap:
        log.info(
            "embedded default: at most %d local nodes on this machine (fleet.max_nodes is %d; "
            "set local.max_nodes to change)",
            cap,
            fleet.max_nodes,
        )
        fleet = fleet.model_copy(update={"max_nodes": cap})
    return config.with_endpoint(state.moto_url).model_copy(update={"sites": sites, "fleet": fleet})


def installed_crawlers(stack: LocalStack) -> Path:
    """Where the stack's local nodes import crawler projects from: a copy per content hash."""
    return stack.dir / "crawlers"


def run_config(stack: LocalStack, run_id: str) -> Config | None:
    """The effective config a run on this stack used (its table, queue and bucket names); its crawlers are found
    in the stack's copy of the crawler project it names, as its nodes found them."""
    path = stack.dir / "runs" / run_id / "fleet.yaml"
    return load_config(path, installed_root=installed_crawlers(stack)) if path.is_file() else None


def latest_run_on_stack(stack: LocalStack) -> str | None:
    runs = stack.dir / "runs"
    if not runs.is_dir():
        return None
    dirs = sorted((p for p in runs.iterdir() if (p / "fleet.yaml").is_file()), key=lambda p: p.stat().st_mtime)
    return dirs[-1].name if dirs else None


def finished_export(out: Path, run_id: str) -> dict[str, Any] | None:
    """The summary a finished run of this id exported under `out`, if any."""
    try:
        summary = json.loads((out / run_id / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and summary.get("finished_at") else None


def stack_stops(started_here: bool, adopted: bool, ended: bool) -> bool:
    """Whether a run's command stops the stack as it leaves: one it started, always (the run owned it); one a
    crashed earlier hub of the same run started, once the run reached an end here (after a failure it stays, for
    the next `--resume`); anybody else's, never."""
    return started_here or (adopted and ended)


def nodes_sandbox_problem(user: CrawlUser | None) -> str | None:
    """Why Chromium, run by local nodes as `user` (None: as this process), cannot have its sandbox, or None."""
    from node.browser import sandbox_problem
    from node.grid_node import RunAs

    if user is None:
        return sandbox_problem(os.geteuid(), os.getegid(), tuple(os.getgroups()))
    u = RunAs.lookup(user.name)
    return sandbox_problem(u.uid, u.gid, u.groups)


class LocalEnv(StoresOf):
    """The embedded default. Made before its stack runs (a run starts it in `hold`), or from a running stack
    (the commands that read a run); its stores exist while the stack runs."""

    where = "on the local stack"
    reads_archive = False

    def __init__(
        self,
        config: Config,
        *,
        stack: LocalStack | None = None,
        state: StackState | None = None,
        home: Path | None = None,
    ) -> None:
        self.given = config  # as loaded: the stack's addresses are filled in once it runs
        self.config = config
        self.home = home or (stack.root if stack is not None else gridfleet_home())
        self._stack = stack
        self.state: StackState | None = None
        if state is not None:
            self._attach(state)

    @property
    def stack(self) -> LocalStack:
        if self._stack is None:  # made when first needed: a dry run needs no Grid jar
            self._stack = make_stack(self.home, self.given, progress=lambda m: log.info("stack: %s", m))
        return self._stack

    def _attach(self, state: StackState) -> None:
        self.state = state
        self.config = effective_config(self.given, state)
        for made in ("clients", "stores"):  # made for another state of the stack, if any
            self.__dict__.pop(made, None)

    def _up(self) -> StackState:
        if self.state is None:
            raise RuntimeError("the local stack is not up: its stores exist only while it runs")
        return self.state

    # --- the stores ------------------------------------------------------------------------------------
    @functools.cached_property  # the stack comes up on first use, so this field of StoresOf is made late
    def clients(self) -> AwsClients:  # type: ignore[override]
        self._up()
        return AwsClients(self.config.aws, credentials=LOCAL_CREDENTIALS)

    @property
    def demo_url(self) -> str | None:
        return self.state.demo_url if self.state is not None else None

    # --- before the run ----------------------------------------------------------------------------------
    def preflight(self) -> None:
        from embedded.stack import check_tools

        check_tools("java", self.given.browser.chromium, self.given.browser.chromedriver)

    def can_crawl(self) -> None:
        self.crawl_user  # noqa: B018 -- decided before anything starts: a sandbox the nodes cannot have refuses here

    def dry_run(self, run_id: str, console: Console) -> int:
        config = self.given
        nodes = min(config.fleet.max_nodes, config.local.node_cap(os.cpu_count() or 1), len(config.sites))
        say(
            console,
            f"run {run_id} (dry run, nothing started): {len(config.sites)} sites, {nodes} local nodes, "
            f"max_attempts {config.run.max_attempts}, hang_after_s {config.run.hang_after_s:g}",
        )
        for s in config.sites:  # the config's strings as typed: no markup, control characters written out
            say(console, f"  {s.id:<24} {s.crawler:<8} {s.start_url}")
        return EXIT_OK

    def latest_run(self) -> str | None:
        return latest_run_on_stack(self.stack)

    def finished_export(self, run_id: str, out: Path) -> dict[str, Any] | None:
        return finished_export(out, run_id)

    def stores_up(self) -> bool:
        return self.state is not None or self.stack.running() is not None

    @contextmanager
    def hold(self, run_id: str) -> Iterator[RunHold]:
        self._install_crawlers()  # before the stack starts: a missing requirement is said in a moment
        state = self.stack.running()
        started_here = state is None
        adopted = state is not None and state.owner_run == run_id
        if state is None:
            log.info("stack: starting the embedded default (moto server, Selenium Grid, demo sites)")
            state = self.stack.up(owner_run=run_id)
        hold = RunHold()
        try:
            self._attach(state)
            self._name_crawlers()
            ensure_resources(self.clients, visibility_timeout_s=int(max(30, self.config.run.heartbeat_timeout_s)))
            yield hold
        finally:
            if stack_stops(started_here, adopted, hold.ended):
                self.stack.down(quiet=True)

    #: Where the local nodes import the crawler project and its pinned requirements from (empty: the config
    #: names no project), and the project installed there.
    crawler_path: tuple[Path, ...] = ()
    crawler_project: CrawlerProject | None = None

    def _install_crawlers(self) -> None:
        """Install the crawler project and its pinned requirements for the local nodes (each once per hash), before
        the stack starts: a requirement that neither the pins nor gridfleet provide is refused (exit 2) after
        seconds, not after the stack's start-up."""
        project = project_of(self.config)
        if project is None:
            return
        assert self.config.crawlers is not None
        requirements = self.config.crawlers.requirements
        pins = install_requirements(requirements, requirements_root(self.home))
        path = install_local(project, installed_crawlers(self.stack), pins, requirements)
        self.crawler_path = (path, pins) if pins is not None else (path,)
        self.crawler_project = project
        b = project.build
        log.info(
            "crawler project %s %s (%s): local nodes import it from %s",
            b.name,
            b.version,
            b.hash,
            os.pathsep.join(map(str, self.crawler_path)),
        )

    def _name_crawlers(self) -> None:
        """Give the hub and the nodes the config that names the crawler project by its identity."""
        if self.crawler_project is not None:
            self.config = installed_config(self.config, self.crawler_project)

    def config_path(self, run_id: str) -> Path:
        return self.stack.dir / "runs" / run_id / "fleet.yaml"

    def save_run_config(self, run_id: str) -> str:
        path = self.config_path(run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dump_config(self.config))
        return str(path)

    # --- the hub's seams ---------------------------------------------------------------------------------
    @functools.cached_property
    def crawl_user(self) -> CrawlUser | None:
        """Who local nodes run their Grid node and Chromium as (None: the nodes' own user); decided once, with
        whether Chromium may run there: SandboxUnavailable when it cannot have its sandbox and fleet.yaml's
        `browser.allow_no_sandbox` does not let it go without (the nodes' own rule, `node.browser.sandbox_flags`)."""
        from node.browser import sandbox_flags

        if self.stack.grid_jar is None:  # the nodes start no Grid node
            return None
        user, why_not = reach_crawl_user(self.config.fleet.crawl_user, self.stack, self.stack.grid_jar)
        problem = nodes_sandbox_problem(user)
        if problem is not None and why_not is not None:
            problem = f"{problem} ({why_not})"
        if sandbox_flags(problem, on_aws=False, allow_no_sandbox=self.config.browser.allow_no_sandbox):
            log.warning("embedded default: local nodes run Chromium without its sandbox (allowed): %s", problem)
        if user is not None:
            log.info(
                "embedded default: local nodes run their Grid node and Chromium as %s (uid %d)", user.name, user.uid
            )
        return user

    def provider(self, run_id: str, clock: Clock) -> LocalProvider:
        cfg_path = self.config_path(run_id)
        st, stack = self._up(), self.stack

        def node_command(run: str, iid: str, inst_dir: Path) -> list[str]:
            cmd = [
                sys.executable,
                "-m",
                "node",
                "--local",
                "--config",
                str(cfg_path),
                "--run-id",
                run,
                "--instance-id",
                iid,
                "--state-dir",
                str(inst_dir),
                "--profiles-root",
                str(stack.efs_root),
                "--grid-url",
                st.grid_url,
                "--grid-secret-file",
                str(stack.grid_secret_file),
                "--imds-url",
                f"{st.imds_url}/{iid}",
            ]
            jar, user = stack.grid_jar, self.crawl_user
            if jar is not None:
                cmd += [
                    "--grid-jar",
                    str(user.grid_jar if user else jar),
                    "--grid-publish",
                    st.grid_publish,
                    "--grid-subscribe",
                    st.grid_subscribe,
                ]
            if user is not None:
                cmd += ["--grid-user", user.name]
            return cmd

        env = {"PYTHONPATH": os.pathsep.join(map(str, self.crawler_path))} if self.crawler_path else None
        return LocalProvider(stack.instances_dir, stack.stack_id, node_command, clock, extra_env=env)

    def control(self, run_id: str, clock: Clock) -> LocalNodeControl:
        return LocalNodeControl(self.stack.instances_dir, self.stack.stack_id, run_id)

    def hub_id(self) -> str:
        return local_hub_id()

    def node_role(self) -> str:
        return LOCAL_ROLE

    def hub_alive(self, hub_id: str) -> bool:
        return self.provider("", SystemClock()).hub_alive(hub_id)  # a hub id reads the same for any run

    def announce(self, run_id: str) -> None:
        st = self._up()
        log.info(
            "run %s: %d sites, up to %d nodes; Grid %s, demo sites %s",
            run_id,
            len(self.config.sites),
            self.config.fleet.max_nodes,
            st.grid_url,
            st.demo_url,
        )

    # --- after the run -------------------------------------------------------------------------------------
    def export_node_logs(self, run_id: str, out: Path) -> Path:
        """Copy each local node's logs to `<out>/<run_id>/nodes/<instance>/` (moto keeps nothing)."""
        dest_root = out / run_id / "nodes"
        src = self.stack.instances_dir / run_id
        if not src.is_dir():
            return dest_root
        shutil.rmtree(dest_root, ignore_errors=True)
        for inst in sorted(p for p in src.iterdir() if p.is_dir()):
            dest = dest_root / inst.name
            dest.mkdir(parents=True, exist_ok=True)
            for name in NODE_LOGS:
                if (inst / name).is_file():
                    shutil.copyfile(inst / name, dest / name)
        return dest_root

    def finish(self, outcome: RunOutcome, report: CheckReport) -> int:
        return outcome.exit_code if report.ok else max(outcome.exit_code, 1)

    def rerun_hubs(self, run_id: str, run: RunInfo) -> list[str]:
        alive = not run.finished and run.hub_id and self.hub_alive(run.hub_id)
        return [run.hub_id] if alive and run.hub_id else []

    def hand_over(self, run_id: str, hubs: list[str], console: Console) -> bool:
        if not hubs:  # no hub instance to start here: this command drives the run to its end
            return False
        console.print(
            f"the run's hub ({', '.join(hubs)}) picks them up; follow with `gridfleet watch --run-id {run_id}`"
        )
        return True

    def for_run(self) -> LocalEnv:
        return LocalEnv(self.given, home=self.home)


# --- constructors ---------------------------------------------------------------------------------------
def for_run(config: Config) -> LocalEnv:
    """A run on the local stack: started when the run holds it, if none is up."""
    return LocalEnv(config)


def _running_stack() -> tuple[LocalStack, StackState | None]:
    stack = make_stack(gridfleet_home(), need_jar=False)
    return stack, stack.running()


def for_reading(run_id: str | None) -> LocalEnv | None:
    """The run (default: the latest) on the local stack that is up; None without one, or without that run."""
    stack, state = _running_stack()
    run_id = run_id or (latest_run_on_stack(stack) if state else None)
    config = run_config(stack, run_id) if state and run_id else None
    if config is None:
        return None
    return LocalEnv(config, stack=stack, state=state)


def local_nodes() -> LocalProvider:
    """The local nodes as the provider lists them, with or without a stack: a run's node still running is found
    (`check` of a finished run, from runs/)."""
    stack = make_stack(gridfleet_home(), need_jar=False)
    return LocalProvider(stack.instances_dir, stack.stack_id, lambda *_: [], SystemClock())


def for_rerun(run_id: str | None, config: Config | None) -> LocalEnv:
    """The run (default: the latest) on the local stack that is up, with `config` (else the run's own) for the
    specs of the sites it reopens. UsageError when there is no such stack or run."""
    stack, state = _running_stack()
    run_id = run_id or (latest_run_on_stack(stack) if state else None)
    if state is None or run_id is None:
        raise UsageError(
            "no local stack with a run is up: a rerun on the embedded default works on the stack that "
            "holds the run (moto keeps nothing once it stops). Start one with `gridfleet local up`, "
            "then `gridfleet run --local`; for a run on AWS pass --config"
        )
    config = config or run_config(stack, run_id)
    if config is None:
        raise UsageError(
            f"run {run_id} did not run on this stack (no {stack.dir / 'runs' / run_id / 'fleet.yaml'}); "
            f"pass --config with its fleet.yaml"
        )
    return LocalEnv(config, stack=stack, state=state)
