"""The EC2 twin as a service of its own: `gridfleet local up --twin` starts it, `down --twin` ends it.

``python -m twin.serve --home DIR --config FILE`` starts the twin (`TwinStack`), serves the demo sites
on its bridge, deploys a stack on it as an operator would (`deploy`: the sites of FILE, `{demo}` standing for
the demo server), then sets the day's start (the starter's schedule) to a minute that comes at least
`START_AFTER_S` after the stack is ready, as an operator would change the rule's schedule, loads the stack's
schedules (the start, daily at that minute; the watchdog every two minutes) and runs until SIGTERM or SIGINT,
when it ends every instance and stops. The deployment takes from under a minute to a few on two cores, so the
start is set only once it is done: set before, it could have passed by then, and the run would wait for the
same minute tomorrow. `DIR/state.json` says how far it got (`starting`, `ready`, `failed` with the error,
`stopped`), with its pid, its AWS endpoint, the stack, the operator's fleet.yaml and when the start fires
(`start_at`, epoch seconds); its log is `DIR/twin.log`.
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
START_AFTER_S = 45  # the least time from `ready` to the day's start: enough to read what `up` prints


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


def schedule_start(twin: Any, stack: str, now: float) -> tuple[str, float]:
    """Set the starter's rule to the first whole minute at least `START_AFTER_S` after `now`, daily, and load the
    stack's schedules; the cron expression and when it fires next (epoch seconds)."""
    from twin.schedules import cron_at, stack_handlers

    start = cron_at(
        now + START_AFTER_S + 59
    )  # the minute of that moment fires at its :00, START_AFTER_S or more from now
    rule = f"{stack}-start"
    twin.client("events").put_rule(Name=rule, ScheduleExpression=start, State="ENABLED")
    timers = twin.load_schedules(stack_handlers(twin.lambda_clients, twin.clock), prefix=stack)
    return start, min(t.next_at for t in timers if t.rule == rule)


def serve(home: Path, config: Path, stack: str, stop: threading.Event) -> None:
    from embedded.demo_server import DemoServer
    from twin.deploy import deploy
    from twin.instance import network
    from twin.stack import TwinStack

    twin = TwinStack(home / "root", stack=stack)
    demo = DemoServer(host=network.HOST_ADDRESS, port=network.WEB_PORT)
    try:
        twin.start()
        demo.start()
        write_state(home, state="starting", step="deploying the stack", endpoint=twin.endpoint, stack=stack)
        variables = {"name_prefix": stack, "bucket_name": f"{stack}-results"}
        deployed = deploy(twin, home / "operator", fleet_of(config, demo.base_url), variables)
        start, start_at = schedule_start(twin, stack, time.time())
        twin.run()
        write_state(home, state="ready", endpoint=twin.endpoint, stack=stack, region=twin.region, start_schedule=start,
                    start_at=start_at, config=str(deployed.config_path), demo=demo.base_url)  # fmt: skip
        stop.wait()
    finally:
        twin.stop()
        demo.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m twin.serve", description=__doc__)
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
