"""`gridfleet local up|down|status --twin`: the EC2 twin, started and stopped with one command (root only).

`up` starts the twin as a process of its own (`twin.serve`) and waits until the stack is deployed on
it; the day's run then starts by the starter's schedule, set once the stack is ready to a minute at least 45 s
later (`up` says when), and every instance boots for real.
`down` ends every instance and the twin; `status` lists the stack's instances.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fleet.errors import UsageError

UP_TIMEOUT_S = 600
DOWN_TIMEOUT_S = 120
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "twin.yaml"


def twin_home() -> Path:
    from cli.envs.home import gridfleet_home

    return gridfleet_home() / "twin"


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def cmd_twin(args: argparse.Namespace, console: Console) -> int:
    from twin.serve import read_state

    home = twin_home()
    state = read_state(home) or {}
    if args.action == "up":
        return _up(home, state, Path(args.config) if args.config else DEFAULT_CONFIG, console)
    if args.action == "down":
        return _down(home, state, console)
    return _status(state, console)


def _up(home: Path, state: dict[str, object], config: Path, console: Console) -> int:
    from twin.serve import read_state

    if os.geteuid() != 0:
        raise UsageError("the EC2 twin needs root (it makes network and mount namespaces)")
    if not config.is_file():
        raise UsageError(f"--config {config}: no such file")
    from fleet.config.load import load_config

    load_config(config)  # bad input is one line and exit 2 here, before anything starts
    if _alive(state.get("pid")) and state.get("state") in ("starting", "ready"):
        console.print(
            f"the twin is already {state['state']} (pid {state['pid']}); `gridfleet local down --twin` ends it"
        )
        return 0
    home.mkdir(parents=True, exist_ok=True)
    (home / "state.json").unlink(missing_ok=True)
    with (home / "twin.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "twin.serve", "--home", str(home), "--config", str(config)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            cwd=Path(__file__).resolve().parents[2],
        )  # fmt: skip
    deadline, said = time.monotonic() + UP_TIMEOUT_S, ""
    while time.monotonic() < deadline:
        state = read_state(home) or {}
        if state.get("step") and state["step"] != said:
            said = str(state["step"])
            console.print(f"twin: {said}")
        if state.get("state") == "ready":
            _print_ready(state, console)
            return 0
        if state.get("state") == "failed" or proc.poll() is not None:
            console.print(f"the twin did not start: {state.get('error', 'it exited')}; see {home / 'twin.log'}")
            return 1
        time.sleep(1)
    console.print(f"the twin is not ready after {UP_TIMEOUT_S} s; see {home / 'twin.log'}")
    return 1


def _print_ready(state: dict[str, object], console: Console) -> None:
    console.print(
        f"twin ready: AWS at {state['endpoint']} (moto), stack {state['stack']}, demo sites at {state['demo']}"
    )
    start_at = float(state["start_at"])  # type: ignore[arg-type]
    when = time.strftime("%H:%M:%S", time.gmtime(start_at))
    console.print(
        f"the day's run starts at {when} UTC (in {max(0, round(start_at - time.time()))} s), by the starter's "
        f"schedule {state['start_schedule']}, and again every day at that minute"
    )
    console.print(f"the operator's fleet.yaml: {state['config']}")
    console.print(
        f"follow it: AWS_ACCESS_KEY_ID=twin AWS_SECRET_ACCESS_KEY=twin gridfleet watch --config {state['config']}"
    )
    console.print("instances: `gridfleet local status --twin`; stop: `gridfleet local down --twin`")


def _down(home: Path, state: dict[str, object], console: Console) -> int:
    pid = state.get("pid")
    if not _alive(pid):
        console.print("the twin was not running")
        return 0
    assert isinstance(pid, int)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + DOWN_TIMEOUT_S
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    if _alive(pid):
        console.print(f"the twin (pid {pid}) is still ending its instances; see {home / 'twin.log'}")
        return 1
    console.print("the twin stopped: every instance ended")
    return 0


def _status(state: dict[str, object], console: Console) -> int:
    if not (_alive(state.get("pid")) and state.get("state") == "ready"):
        console.print(f"the twin is not running ({state.get('state', 'never started')})")
        return 1
    import boto3

    from fleet.aws import ec2 as ec2_api

    ec2 = boto3.client("ec2", region_name=str(state["region"]), endpoint_url=str(state["endpoint"]),
                       aws_access_key_id="twin", aws_secret_access_key="twin")  # fmt: skip
    t = Table(title=f"twin stack {state['stack']} at {state['endpoint']}", title_justify="left")
    for c in ("instance", "role", "run", "state", "address"):
        t.add_column(c)
    for i in ec2_api.describe(ec2, str(state["stack"])):
        t.add_row(i.id, i.role or "-", i.run_id or "-", i.state, i.private_ip or "-")
    console.print(t)
    return 0
