"""The EC2 twin as a service of its own: `gridfleet local up --twin` starts it, `down --twin` ends it.

``python -m embedded.twin.serve --home DIR --config FILE`` starts the twin (`TwinStack`), serves the demo sites
on its bridge, deploys a stack on it as an operator would (`deploy`: the sites of FILE, `{demo}` standing for
the demo server), loads the stack's schedules (the day's start one minute after the deployment, then daily at
that minute; the watchdog every two minutes) and runs until SIGTERM or SIGINT, when it ends every instance
and stops. `DIR/state.json` says how far it got (`starting`, `ready`, `failed` with the error, `stopped`),
with its pid, its AWS endpoint, the stack and the operator's fleet.yaml; its log is `DIR/twin.log`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from fleet.config import DEMO_PLACEHOLDER

STATE = "state.json"
LOG = "twin.log"


def write_state(home: Path, **fields: Any) -> None:
    path = home / STATE
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps({"pid": os.getpid(), **fields}, indent=1))
    tmp.replace(path)


def read_state(home: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((home / STATE).read_text()))
    except (OSError, ValueError):
        return None


def fleet_of(config: Path, demo_url: str) -> dict[str, Any]:
    """The operator's fleet.yaml for the twin: FILE's, `{demo}` replaced, the crawler project's paths made
    absolute (the deployed fleet.yaml lies elsewhere), its `aws:` keys left to the stack."""
    doc = yaml.safe_load(config.read_text()) or {}
    for site in doc.get("sites", []):
        site["start_url"] = str(site.get("start_url", "")).replace(DEMO_PLACEHOLDER, demo_url)
    crawlers = doc.get("crawlers") or {}
    for key in ("project", "requirements"):
        if crawlers.get(key):
            crawlers[key] = str((config.parent / str(crawlers[key])).resolve())
    return dict(doc)


def serve(home: Path, config: Path, stack: str, stop: threading.Event) -> None:
    from embedded.demo_server import DemoServer
    from embedded.schedules import cron_at, stack_handlers
    from embedded.twin import network
    from embedded.twin.deploy import deploy
    from embedded.twin.stack import TwinStack

    twin = TwinStack(home / "root", stack=stack)
    demo = DemoServer(host=network.HOST_ADDRESS)
    try:
        twin.start()
        demo.start()
        write_state(home, state="starting", step="deploying the stack", endpoint=twin.endpoint, stack=stack)
        start = cron_at(time.time() + 60)
        variables = {"name_prefix": stack, "bucket_name": f"{stack}-results", "start_schedule": start}
        deployed = deploy(twin, home / "operator", fleet_of(config, demo.base_url), variables)
        twin.load_schedules(stack_handlers(twin.lambda_clients, twin.clock), prefix=stack)
        twin.run()
        write_state(home, state="ready", endpoint=twin.endpoint, stack=stack, region=twin.region, start_schedule=start,
                    config=str(deployed.config_path), demo=demo.base_url)  # fmt: skip
        stop.wait()
    finally:
        twin.stop()
        demo.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m embedded.twin.serve", description=__doc__)
    p.add_argument("--home", required=True, help="the twin's directory (state, log, instances)")
    p.add_argument("--config", required=True, help="fleet.yaml whose sites the stack runs")
    p.add_argument("--stack", default="gftwin", help="the stack's name (Terraform's name_prefix)")
    args = p.parse_args(argv)
    home = Path(args.home)
    home.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    write_state(home, state="starting", step="starting the twin", stack=args.stack)
    try:
        serve(home, Path(args.config), args.stack, stop)
    except Exception as e:  # noqa: BLE001 - the state file carries the error to `local up --twin`
        logging.getLogger("gridfleet.twin").exception("twin-failed")
        write_state(home, state="failed", error=f"{type(e).__name__}: {e}", stack=args.stack)
        return 1
    write_state(home, state="stopped", stack=args.stack)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
