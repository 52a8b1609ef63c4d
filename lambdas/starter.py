"""The daily starter (an EventBridge schedule): start a hub instance for the day's run.

It starts the configured stopped hub instance if there is one, else a hub from the hub launch template. It never
starts a second hub for a run that has a live one, and does nothing for a run that is already FINISHED. The
watchdog restarts a run's hub through the same `start_hub`.

`read` gathers what the decision needs, `decide` (pure) turns it into actions, `apply` makes the EC2 calls and
counts the start on the run item, so the decision can be tested with no AWS at all.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleet.aws import ec2 as ec2_api
from fleet.aws.ec2 import Instance
from fleet.clock import Clock, SystemClock
from fleet.logs import event
from fleet.record.ids import default_run_id
from fleet.record.run_item import RunWatch
from fleet.record.state import RunState
from fleet.record.table import WatchTable
from fleet.record.tags import ROLE_HUB, TAG_STACK
from lambdas.runtime import ClientsFactory, default_clients, event_run_id, log, outermost, state_table
from lambdas.settings import LambdaSettings

__all__ = ["LambdaSettings", "start_hub", "run_starter", "handler", "decide", "client_token"]

_CLIENT_TOKEN_MAX = 64  # RunInstances ClientToken: at most 64 ASCII characters


@dataclass(frozen=True)
class StarterView:
    """What the starter reads before it decides."""

    run_id: str
    hubs: tuple[Instance, ...]  # the run's hub instances of the stack, in any state
    watch: RunWatch | None  # the run item, if the run has one yet
    configured: Instance | None = None  # settings.hub_instance_id as EC2 knows it (None: unknown to EC2)


@dataclass(frozen=True)
class Refuse:
    run_id: str
    reason: str
    instance_id: str
    live: tuple[str, ...] = ()  # the run's live hubs, when they are why
    warn: bool = False


@dataclass(frozen=True)
class Skip:
    run_id: str
    reason: str


@dataclass(frozen=True)
class Fallback:
    """The configured hub instance cannot be started: a hub from the template instead."""

    run_id: str
    instance_id: str
    reason: str


@dataclass(frozen=True)
class StartStopped:
    run_id: str
    instance_id: str


@dataclass(frozen=True)
class Launch:
    run_id: str
    template: str
    previous: int  # hubs the run had before this one (each later hub gets its own client token)


StarterAction = Refuse | Skip | Fallback | StartStopped | Launch


def client_token(run_id: str, previous_starts: int) -> str:
    """RunInstances idempotency token: the same for a retry, new for each later hub of the run."""
    token = f"gridfleet-hub-{run_id}-{previous_starts}"
    if len(token) <= _CLIENT_TOKEN_MAX:
        return token
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:32]
    return f"gridfleet-hub-{digest}-{previous_starts}"


def configured_state(inst: Instance | None, stack: str) -> str:
    """The configured hub instance's state, or why it is not this stack's to start."""
    if inst is None:
        return "missing"
    if inst.stack != stack:
        return f"{inst.state} but not tagged {TAG_STACK}={stack} (another stack's, or untagged)"
    return inst.state


def decide(view: StarterView, settings: LambdaSettings) -> list[StarterAction]:
    """What to do for the run: refuse (a hub is live), skip (FINISHED), start the stopped hub, or launch one."""
    live = sorted((i for i in view.hubs if i.live), key=lambda i: i.id)
    if live:
        reason = f"hub instance {live[0].id} of the run is {live[0].state}"
        return [Refuse(view.run_id, reason, live[0].id, tuple(i.id for i in live))]
    if view.watch is not None and view.watch.run.status is RunState.FINISHED:
        return [Skip(view.run_id, "the run is FINISHED")]
    actions: list[StarterAction] = []
    if settings.hub_instance_id:
        state = configured_state(view.configured, settings.stack)
        if state == "stopped":
            return [StartStopped(view.run_id, settings.hub_instance_id)]
        reason = f"hub instance {settings.hub_instance_id} is {state}"
        if not settings.hub_launch_template:
            return [Refuse(view.run_id, reason, settings.hub_instance_id, warn=True)]
        actions.append(
            Fallback(view.run_id, settings.hub_instance_id, f"{reason}, launching from the template instead")
        )
    assert settings.hub_launch_template  # LambdaSettings requires the template or the instance
    previous = max(len(view.hubs), view.watch.hub_starts if view.watch else 0)
    return actions + [Launch(view.run_id, settings.hub_launch_template, previous)]


def read(settings: LambdaSettings, ec2: Any, table: WatchTable, run_id: str) -> StarterView:
    configured = ec2_api.find(ec2, settings.hub_instance_id) if settings.hub_instance_id else None
    hubs = ec2_api.describe(ec2, settings.stack, run_id=run_id, role=ROLE_HUB)  # in any state
    return StarterView(run_id, tuple(hubs), table.get_run_watch(run_id), configured)


def apply(actions: Sequence[StarterAction], settings: LambdaSettings, ec2: Any, table: WatchTable) -> dict[str, Any]:
    """Carry the decision out; the answer is the last action's (the one that ends the decision)."""
    out: dict[str, Any] = {}
    for a in actions:
        match a:
            case Refuse():
                event(
                    log,
                    "hub-refused",
                    logging.WARNING if a.warn else logging.INFO,
                    run_id=a.run_id,
                    instance_id=",".join(a.live) or a.instance_id,
                    reason=a.reason,
                )
                out = {"action": "refused", "run_id": a.run_id, "reason": a.reason, "instance_id": a.instance_id}
            case Skip():
                event(log, "hub-skipped", run_id=a.run_id, reason=a.reason)
                out = {"action": "skipped", "run_id": a.run_id, "reason": a.reason, "instance_id": None}
            case Fallback():
                event(log, "hub-instance-unusable", run_id=a.run_id, instance_id=a.instance_id, reason=a.reason)
            case StartStopped():
                ec2_api.tag_and_start(ec2, a.instance_id, a.run_id)
                table.add_hub_start(a.run_id)
                event(log, "hub-started", run_id=a.run_id, instance_id=a.instance_id, how="start")
                out = {"action": "started", "run_id": a.run_id, "instance_id": a.instance_id, "how": "start"}
            case Launch():
                iid = ec2_api.run_hub(ec2, a.template, settings.stack, a.run_id, client_token(a.run_id, a.previous))
                table.add_hub_start(a.run_id)
                event(
                    log,
                    "hub-started",
                    run_id=a.run_id,
                    instance_id=iid,
                    how="run",
                    template=a.template,
                    previous_hubs=a.previous,
                )
                out = {"action": "started", "run_id": a.run_id, "instance_id": iid, "how": "run"}
    return out


def start_hub(
    settings: LambdaSettings, ec2: Any, table: WatchTable, clock: Clock, run_id: str | None = None
) -> dict[str, Any]:
    """Start a hub for `run_id` (default: today's run) unless one is live or the run is done."""
    run_id = run_id or default_run_id(clock.now())
    return apply(decide(read(settings, ec2, table, run_id), settings), settings, ec2, table)


def run_starter(
    event_in: Any,
    env: Mapping[str, str],
    *,
    clients_factory: ClientsFactory = default_clients,
    clock: Clock | None = None,
) -> dict[str, Any]:
    """The starter with its environment, clients and clock passed in."""
    settings = LambdaSettings.from_env(env)
    run_id = event_run_id(event_in)
    clients = clients_factory(settings)
    return start_hub(
        settings, clients.client("ec2"), state_table(clients, settings), clock or SystemClock(), run_id=run_id
    )


def handler(event_in: Any, context: Any) -> dict[str, Any]:
    """Lambda entry point of the daily starter; `event["run_id"]` overrides today's run id."""
    return outermost("starter", lambda: run_starter(event_in, os.environ))
