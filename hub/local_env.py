"""Wiring of the embedded default: the local stack, moto-backed adapters, local provider and control.

`GRIDFLEET_HOME` (default `~/.gridfleet`) holds the stack (`local/`), local
instances, and `efs/` (profiles and locks, kept like EFS across runs).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from fleet.aws import LOCAL_CREDENTIALS, AwsClients
from fleet.bootstrap import ensure_resources
from fleet.clock import Clock
from fleet.config import Config
from fleet.config_load import dump_config, load_config
from fleet.local.stack import LocalStack, StackState, check_tools, find_grid_jar
from fleet.queue import SqsSiteQueue
from fleet.results import S3ResultStore
from fleet.table import DynamoStateTable
from hub.control.local import LocalNodeControl
from hub.providers.local import LocalProvider

PROJECT_ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("gridfleet")


def gridfleet_home(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("GRIDFLEET_HOME") or Path.home() / ".gridfleet")


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

    def provider(self, run_id: str, clock: Clock) -> LocalProvider:
        cfg_path = self.config_path(run_id)
        st = self.state
        jar = self.stack.grid_jar

        def node_command(run: str, iid: str, inst_dir: Path) -> list[str]:
            cmd = [sys.executable, "-m", "node", "--local", "--config", str(cfg_path), "--run-id", run,
                   "--instance-id", iid, "--state-dir", str(inst_dir), "--profiles-root", str(self.stack.efs_root),
                   "--grid-url", st.grid_url, "--imds-url", f"{st.imds_url}/{iid}"]
            if jar is not None:
                cmd += ["--grid-jar", str(jar), "--grid-publish", st.grid_publish, "--grid-subscribe",
                        st.grid_subscribe]
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
