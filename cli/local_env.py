"""Wiring of the embedded default: the local stack, moto-backed adapters, local provider and control.

`GRIDFLEET_HOME` (default `~/.gridfleet`, `/var/lib/gridfleet` for root) holds
the stack (`local/`), local instances, and `efs/` (profiles and locks, kept
like EFS across runs).

A root hub's nodes start their Grid node, and so Chromium, as the crawl user
(`fleet.crawl_user`), so that no browser runs as root; the agents stay with
the invoking user (the project's Python may be where no other user can read
it). That needs the user, and everything the Grid node and Chromium open
reachable by it: checked once, and when it fails the nodes run as before
(Chromium as root, without its sandbox), said once in the log.
"""

from __future__ import annotations

import functools
import logging
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.aws.bootstrap import ensure_resources
from fleet.clock import Clock
from fleet.config import Config
from fleet.config_load import dump_config, load_config
from embedded.stack import LocalStack, StackState, check_tools, find_grid_jar
from fleet.aws.queue import SqsSiteQueue
from fleet.aws.results import S3ResultStore
from fleet.aws.table import DynamoStateTable
from hub.control.local import LocalNodeControl
from hub.providers.local import LocalProvider

PROJECT_ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("gridfleet")


#: root's GRIDFLEET_HOME: the crawl user must reach the profiles and the nodes' state, and root's home is closed.
ROOT_HOME = Path("/var/lib/gridfleet")


def gridfleet_home(environ: dict[str, str] | None = None, euid: int | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("GRIDFLEET_HOME"):
        return Path(env["GRIDFLEET_HOME"])
    return ROOT_HOME if (os.geteuid() if euid is None else euid) == 0 else Path.home() / ".gridfleet"


@dataclass(frozen=True)
class CrawlUser:
    """The user local nodes start their Grid node as, and the Selenium jar that user can read."""

    name: str
    uid: int
    grid_jar: Path


def user_can(pw: pwd.struct_passwd, test: str, path: Path) -> bool:
    """Whether the user `pw` passes `test <test> <path>` (e.g. -r, -x), run as that user: the kernel's own
    answer, ACLs included (needs root)."""
    groups = os.getgrouplist(pw.pw_name, pw.pw_gid)
    try:
        r = subprocess.run(["test", test, str(path)], user=pw.pw_uid, group=pw.pw_gid, extra_groups=groups,
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def umask() -> int:
    """This process's umask, read without setting it (os.umask would change it for every thread meanwhile)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    return 0o022


def reach_crawl_user(name: str, stack: LocalStack, jar: Path, euid: int | None = None
                     ) -> tuple[CrawlUser | None, str | None]:
    """(the user, None) when local nodes can run their Grid node and Chromium as `name`; (None, why not) when
    they cannot; (None, None) when this process is not root (it runs nothing as root)."""
    if (os.geteuid() if euid is None else euid) != 0:
        return None, None
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return None, f"there is no user {name} (fleet.crawl_user; `make setup` run as root creates it)"
    if pw.pw_uid == 0:
        return None, f"the crawl user {name} is root"
    if umask() & 0o001:  # the nodes' state dirs are made later, with this umask
        return None, f"the umask {umask():04o} makes the nodes' state dirs closed to user {name}"
    for d in (stack.instances_dir, stack.efs_root / "profiles"):
        d.mkdir(parents=True, exist_ok=True)
        if not user_can(pw, "-x", d):
            return None, f"user {name} cannot reach {d} (GRIDFLEET_HOME must be traversable by it)"
    if not user_can(pw, "-r", jar):  # e.g. a checkout under /root: a copy beside the nodes' state
        copy = stack.dir / "grid" / jar.name
        if not copy.is_file() or copy.stat().st_size != jar.stat().st_size:
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(jar, copy.with_suffix(".part"))
            copy.with_suffix(".part").chmod(0o644)
            os.replace(copy.with_suffix(".part"), copy)
        if not user_can(pw, "-r", copy):
            return None, f"user {name} cannot read {jar} nor its copy {copy}"
        jar = copy
    return CrawlUser(name, pw.pw_uid, jar), None


def grid_jar_candidates(home: Path, environ: dict[str, str] | None = None) -> list[Path]:
    env = os.environ if environ is None else environ
    out = [Path(env["GRIDFLEET_GRID_JAR"])] if env.get("GRIDFLEET_GRID_JAR") else []
    return out + [PROJECT_ROOT / "vendor", Path.cwd() / "vendor", home / "vendor"]


def make_stack(home: Path, config: Config | None = None, *, need_jar: bool = True, progress=lambda _: None
               ) -> LocalStack:
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
        log.info("embedded default: at most %d local nodes on this machine (fleet.max_nodes is %d; "
                 "set local.max_nodes to change)", cap, fleet.max_nodes)
        fleet = fleet.model_copy(update={"max_nodes": cap})
    return config.with_endpoint(state.moto_url).model_copy(update={"sites": sites, "fleet": fleet})


@dataclass
class LocalEnv:
    home: Path
    stack: LocalStack
    state: StackState
    config: Config
    clients: AwsClients
    table: DynamoStateTable
    queue: SqsSiteQueue
    results: S3ResultStore

    def run_dir(self, run_id: str) -> Path:
        return self.stack.dir / "runs" / run_id

    def config_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "fleet.yaml"

    def write_config(self, run_id: str) -> Path:
        path = self.config_path(run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dump_config(self.config))
        return path

    @functools.cached_property
    def crawl_user(self) -> CrawlUser | None:
        """Who local nodes run their Grid node and Chromium as (None: the nodes' own user); decided once."""
        if self.stack.grid_jar is None:  # the nodes start no Grid node
            return None
        user, problem = reach_crawl_user(self.config.fleet.crawl_user, self.stack, self.stack.grid_jar)
        if problem is not None:
            log.warning("embedded default: local nodes run Chromium as root, without its sandbox: %s", problem)
        elif user is not None:
            log.info("embedded default: local nodes run their Grid node and Chromium as %s (uid %d)",
                     user.name, user.uid)
        return user

    def provider(self, run_id: str, clock: Clock) -> LocalProvider:
        cfg_path = self.config_path(run_id)
        st = self.state

        def node_command(run: str, iid: str, inst_dir: Path) -> list[str]:
            cmd = [sys.executable, "-m", "node", "--local", "--config", str(cfg_path), "--run-id", run,
                   "--instance-id", iid, "--state-dir", str(inst_dir), "--profiles-root", str(self.stack.efs_root),
                   "--grid-url", st.grid_url, "--imds-url", f"{st.imds_url}/{iid}"]
            jar, user = self.stack.grid_jar, self.crawl_user
            if jar is not None:
                cmd += ["--grid-jar", str(user.grid_jar if user else jar), "--grid-publish", st.grid_publish,
                        "--grid-subscribe", st.grid_subscribe]
            if user is not None:
                cmd += ["--grid-user", user.name]
            return cmd

        return LocalProvider(self.stack.instances_dir, self.stack.stack_id, node_command, clock)

    def control(self, run_id: str) -> LocalNodeControl:
        return LocalNodeControl(self.stack.instances_dir, self.stack.stack_id, run_id)

    def export_node_logs(self, run_id: str, out: Path) -> int:
        """Copy each local node's logs to `<out>/<run_id>/nodes/<instance>/` (moto keeps nothing)."""
        src = self.stack.instances_dir / run_id
        if not src.is_dir():
            return 0
        shutil.rmtree(out / run_id / "nodes", ignore_errors=True)
        n = 0
        for inst in sorted(p for p in src.iterdir() if p.is_dir()):
            dest = out / run_id / "nodes" / inst.name
            dest.mkdir(parents=True, exist_ok=True)
            for name in ("node.log", "crawler.log", "grid-node.log", "instance.json"):
                if (inst / name).is_file():
                    shutil.copyfile(inst / name, dest / name)
            n += 1
        return n


def connect(stack: LocalStack, state: StackState, config: Config, *, bootstrap: bool) -> LocalEnv:
    eff = effective_config(config, state)
    clients = AwsClients(eff.aws, credentials=LOCAL_CREDENTIALS)
    if bootstrap:
        ensure_resources(clients, visibility_timeout_s=int(max(30, eff.run.heartbeat_timeout_s)))
    return LocalEnv(
        home=stack.root, stack=stack, state=state, config=eff, clients=clients,
        table=DynamoStateTable(clients.client("dynamodb"), eff.aws.table),
        queue=SqsSiteQueue(clients.client("sqs"), eff.aws.queue_name, eff.aws.dlq_name),
        results=S3ResultStore(clients.client("s3"), eff.aws.bucket),
    )


def run_config(stack: LocalStack, run_id: str) -> Config | None:
    """The effective config a run on this stack used (its table, queue and bucket names)."""
    path = stack.dir / "runs" / run_id / "fleet.yaml"
    return load_config(path) if path.is_file() else None


def latest_run_on_stack(stack: LocalStack) -> str | None:
    runs = stack.dir / "runs"
    if not runs.is_dir():
        return None
    dirs = sorted((p for p in runs.iterdir() if (p / "fleet.yaml").is_file()), key=lambda p: p.stat().st_mtime)
    return dirs[-1].name if dirs else None


def preflight(config: Config, java: str = "java") -> None:
    check_tools(java, config.browser.chromium, config.browser.chromedriver)
