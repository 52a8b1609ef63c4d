"""The two Lambdas around the hub: the daily starter and the watchdog.

The starter (EventBridge schedule) starts a hub instance for the day's run: a
stopped hub instance if one is configured, else one from the hub launch
template. It never starts a second hub for a run that has a live one, and does
nothing for a run that is already FINISHED.

The watchdog (every 2 minutes) makes one pass:

1. For each recent RUNNING run it observes the hub's heartbeat on its own clock.
   It never compares the hub's epoch values with its own time: it keeps, on the
   run item, the heartbeat value it last saw (`watch_hb`) and when it first saw
   that value (`watch_since`). A value unchanged for `hub_stale_s` with no hub
   instance pending or running means the hub is gone: a new one is started for
   the same run id and resumes it. The restart is claimed by a conditional write
   of `watch_restart_at`, so watchdogs racing on the same observation start at
   most one hub.
2. A run abandoned (still RUNNING `run_grace_s` after its deadline: its hub is
   gone or stuck) is ended: its open sites are marked FAILED with reason
   `deadline`, the run FINISHED, and its summary put in the bucket
   (`runs/<run_id>/summary.json`), so how it ended outlives the table.
3. Instances of the stack tagged with a run id whose run is FINISHED, abandoned
   or has no run item at all (after `hub_stale_s` from launch, the time a new
   hub has to create it) are terminated, and so is every STOPPED instance of the
   stack that no configuration keeps (a stopped instance bills for its volume
   every day). The configured reusable hub instance is stopped instead, so the
   starter can start it again. Instances of another stack (`gridfleet:stack`),
   and instances without the tags, are never touched.

Configuration comes from environment variables, read only in the handlers:
GRIDFLEET_REGION (required), GRIDFLEET_TABLE, GRIDFLEET_STACK, GRIDFLEET_BUCKET,
GRIDFLEET_ENDPOINT_URL, GRIDFLEET_HUB_LAUNCH_TEMPLATE and/or
GRIDFLEET_HUB_INSTANCE_ID (at least one), GRIDFLEET_HUB_STALE_S,
GRIDFLEET_RUN_GRACE_S, GRIDFLEET_LOOKBACK_RUNS.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from fleet.aws.archive import RunArchive, S3RunArchive
from fleet.aws.clients import AwsClients, error_code
from fleet.clock import Clock, SystemClock
from fleet.codec import RUN_ITEM, HistoryEvent, num
from fleet.config import AwsConfig
from fleet.ids import is_run_id
from fleet.logs import event
from fleet.state import Reason, RunState
from fleet.aws.table import DynamoStateTable
from fleet.aws.tags import LIVE_STATES, ROLE_HUB, ROLE_NODE, TAG_ROLE, TAG_RUN_ID, TAG_STACK, filters, instance_tags, tags_of
from hub.loop import default_run_id
from fleet.summary import build_summary
from hub.teardown import fail_open_sites

log = logging.getLogger("gridfleet.lambdas")

#: States of an instance that is not running but still exists (and bills for its volumes).
STOPPED_STATES = ("stopping", "stopped")

ENV_REGION = "GRIDFLEET_REGION"
ENV_TABLE = "GRIDFLEET_TABLE"
ENV_STACK = "GRIDFLEET_STACK"
ENV_BUCKET = "GRIDFLEET_BUCKET"
ENV_ENDPOINT_URL = "GRIDFLEET_ENDPOINT_URL"
ENV_HUB_LAUNCH_TEMPLATE = "GRIDFLEET_HUB_LAUNCH_TEMPLATE"
ENV_HUB_INSTANCE_ID = "GRIDFLEET_HUB_INSTANCE_ID"
ENV_HUB_STALE_S = "GRIDFLEET_HUB_STALE_S"
ENV_RUN_GRACE_S = "GRIDFLEET_RUN_GRACE_S"
ENV_LOOKBACK_RUNS = "GRIDFLEET_LOOKBACK_RUNS"

DEFAULT_TABLE = "TrendlyzeStatus"
DEFAULT_STACK = "gridfleet"
DEFAULT_HUB_STALE_S = 600.0
DEFAULT_RUN_GRACE_S = 3600.0
DEFAULT_LOOKBACK_RUNS = 7

TERMINATE_BATCH = 100  # instance ids per TerminateInstances / StopInstances call
_CLIENT_TOKEN_MAX = 64  # RunInstances ClientToken: at most 64 ASCII characters
_STACK_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,31}")  # the rule of fleet.yaml's aws.stack

# Attributes the watchdog keeps on the run item (the hub never writes them).
WATCH_HB = "watch_hb"  # the hub_heartbeat value last seen, as a string
WATCH_SINCE = "watch_since"  # watchdog clock when that value was first seen
WATCH_RESTART_AT = "watch_restart_at"  # watchdog clock of the last hub restart it claimed
HUB_STARTS = "hub_starts"  # hubs started for the run by the starter or the watchdog


# --- settings -------------------------------------------------------------------


@dataclass(frozen=True)
class LambdaSettings:
    region: str
    table: str = DEFAULT_TABLE
    stack: str = DEFAULT_STACK  # the stack's name: only instances tagged gridfleet:stack=<stack> are touched
    bucket: str | None = None  # where the watchdog puts the summary of a run it ends
    endpoint_url: str | None = None
    hub_launch_template: str | None = None
    hub_instance_id: str | None = None
    hub_stale_s: float = DEFAULT_HUB_STALE_S
    run_grace_s: float = DEFAULT_RUN_GRACE_S
    lookback_runs: int = DEFAULT_LOOKBACK_RUNS

    def __post_init__(self) -> None:
        if not self.region:
            raise ValueError(f"{ENV_REGION} is required (the AWS region of the fleet)")
        if not self.table:
            raise ValueError(f"{ENV_TABLE} must not be empty")
        if not _STACK_RE.fullmatch(self.stack):
            raise ValueError(f"{ENV_STACK} must be the stack's name (letters, digits and '-', max 32), "
                             f"got {self.stack!r}")
        if not self.hub_launch_template and not self.hub_instance_id:
            raise ValueError(f"set {ENV_HUB_LAUNCH_TEMPLATE} (the hub launch template's name) "
                             f"and/or {ENV_HUB_INSTANCE_ID} (a stopped hub instance to start)")
        if self.hub_stale_s <= 0:
            raise ValueError(f"{ENV_HUB_STALE_S} must be > 0, got {self.hub_stale_s}")
        if self.run_grace_s < 0:
            raise ValueError(f"{ENV_RUN_GRACE_S} must be >= 0, got {self.run_grace_s}")
        if self.lookback_runs < 1:
            raise ValueError(f"{ENV_LOOKBACK_RUNS} must be >= 1, got {self.lookback_runs}")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LambdaSettings:
        """Settings from environment variables; an empty value counts as unset."""
        region = _env_str(env, ENV_REGION)
        if region is None:
            raise ValueError(f"{ENV_REGION} is required (the AWS region of the fleet)")
        return cls(
            region=region,
            table=_env_str(env, ENV_TABLE) or DEFAULT_TABLE,
            stack=_env_str(env, ENV_STACK) or DEFAULT_STACK,
            bucket=_env_str(env, ENV_BUCKET),
            endpoint_url=_env_str(env, ENV_ENDPOINT_URL),
            hub_launch_template=_env_str(env, ENV_HUB_LAUNCH_TEMPLATE),
            hub_instance_id=_env_str(env, ENV_HUB_INSTANCE_ID),
            hub_stale_s=_env_num(env, ENV_HUB_STALE_S, DEFAULT_HUB_STALE_S, float),
            run_grace_s=_env_num(env, ENV_RUN_GRACE_S, DEFAULT_RUN_GRACE_S, float),
            lookback_runs=_env_num(env, ENV_LOOKBACK_RUNS, DEFAULT_LOOKBACK_RUNS, int),
        )


def _env_str(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def _env_num(env: Mapping[str, str], name: str, default: Any, kind: Callable[[str], Any]) -> Any:
    raw = _env_str(env, name)
    if raw is None:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {raw!r}") from None


# --- the run item, as the watchdog sees it ----------------------------------------


class RunItems:
    """Raw reads and conditional writes of run items, for the watchdog's own attributes.

    `DynamoStateTable` models only the hub's fields; the watchdog's attributes live
    on the same item and are written here, each write conditional on what was read.
    """

    def __init__(self, client: Any, table_name: str):
        self._c = client
        self.name = table_name
        self._ser = TypeSerializer()
        self._de = TypeDeserializer()

    @classmethod
    def of(cls, table: DynamoStateTable) -> RunItems:
        return cls(table._c, table.name)

    def _key(self, run_id: str) -> dict[str, Any]:
        return {"run_id": {"S": run_id}, "Site": {"S": RUN_ITEM}}

    def get(self, run_id: str) -> dict[str, Any] | None:
        """The run item with every attribute (numbers as Decimal), or None."""
        out = self._c.get_item(TableName=self.name, Key=self._key(run_id), ConsistentRead=True)
        item = out.get("Item")
        return {k: self._de.deserialize(v) for k, v in item.items()} if item else None

    def update(self, run_id: str, update: str, condition: str | None, names: dict[str, str],
               values: dict[str, Any]) -> bool:
        """Apply `update` to an existing run item if `condition` holds; False when it does not."""
        kwargs: dict[str, Any] = {
            "TableName": self.name, "Key": self._key(run_id), "UpdateExpression": update,
            "ConditionExpression": "attribute_exists(Site)" + (f" AND ({condition})" if condition else ""),
            "ExpressionAttributeNames": names,
        }
        if values:
            kwargs["ExpressionAttributeValues"] = {k: self._ser.serialize(v) for k, v in values.items()}
        try:
            self._c.update_item(**kwargs)
            return True
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                return False
            raise

    def note_hub_start(self, run_id: str) -> None:
        """Count a hub started for the run (no-op while the run has no item yet)."""
        self.update(run_id, "ADD #n :one", None, {"#n": HUB_STARTS}, {":one": 1})

    def observe(self, run_id: str, seen: str, prev_seen: str | None, now: float) -> bool:
        """Record a new heartbeat value first seen at `now`, if no other watchdog recorded one since."""
        names = {"#hb": WATCH_HB, "#since": WATCH_SINCE}
        values: dict[str, Any] = {":hb": seen, ":now": num(now)}
        if prev_seen is None:
            cond = "attribute_not_exists(#hb)"
        else:
            cond = "#hb = :prev"
            values[":prev"] = prev_seen
        return self.update(run_id, "SET #hb = :hb, #since = :now", cond, names, values)

    def claim_restart(self, run_id: str, item: Mapping[str, Any], now: float) -> bool:
        """Claim the restart of the run's hub, from the observation in `item`.

        Holds only while the item is as read: same heartbeat, same observation,
        no restart claimed since. The claim also restarts the observation, so
        the new hub gets its own `hub_stale_s`. Of watchdogs racing on the same
        observation, exactly one gets True.
        """
        names = {"#st": "status", "#hb": WATCH_HB, "#since": WATCH_SINCE, "#ra": WATCH_RESTART_AT,
                 "#hub": "hub_heartbeat"}
        values: dict[str, Any] = {":running": "RUNNING", ":hb": item[WATCH_HB], ":since": item[WATCH_SINCE],
                                  ":now": num(now)}
        cond = "#st = :running AND #hb = :hb AND #since = :since"
        if item.get("hub_heartbeat") is None:
            cond += " AND attribute_not_exists(#hub)"
        else:
            cond += " AND #hub = :hub"
            values[":hub"] = item["hub_heartbeat"]
        if item.get(WATCH_RESTART_AT) is None:
            cond += " AND attribute_not_exists(#ra)"
        else:
            cond += " AND #ra = :ra"
            values[":ra"] = item[WATCH_RESTART_AT]
        return self.update(run_id, "SET #ra = :now, #since = :now", cond, names, values)

    def release_restart(self, run_id: str, item: Mapping[str, Any], claimed_at: float) -> bool:
        """Undo a claim whose restart failed, so the next pass may try again."""
        names = {"#since": WATCH_SINCE, "#ra": WATCH_RESTART_AT}
        values: dict[str, Any] = {":claimed": num(claimed_at), ":since": item[WATCH_SINCE]}
        if item.get(WATCH_RESTART_AT) is None:
            update = "SET #since = :since REMOVE #ra"
        else:
            update = "SET #since = :since, #ra = :ra"
            values[":ra"] = item[WATCH_RESTART_AT]
        return self.update(run_id, update, "#ra = :claimed", names, values)


def heartbeat_token(item: Mapping[str, Any]) -> str:
    """The hub heartbeat of a run item as an opaque value: only equality means anything."""
    hb = item.get("hub_heartbeat")
    return "-" if hb is None else str(hb)


def is_abandoned(item: Mapping[str, Any], now: float, settings: LambdaSettings) -> bool:
    """A RUNNING run still not finished `run_grace_s` after its deadline."""
    deadline = item.get("deadline_at")
    return item.get("status") == "RUNNING" and deadline is not None and now > float(deadline) + settings.run_grace_s


# --- EC2 --------------------------------------------------------------------------


def _instances(ec2: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
    for page in ec2.get_paginator("describe_instances").paginate(**kwargs):
        for reservation in page.get("Reservations", []):
            yield from reservation.get("Instances", [])


def _state(instance: Mapping[str, Any]) -> str:
    return instance.get("State", {}).get("Name", "")


def hub_instances(ec2: Any, run_id: str, stack: str) -> list[dict[str, Any]]:
    """Every hub instance of the stack tagged with the run, in any state."""
    return list(_instances(ec2, Filters=filters(stack, run_id=run_id, role=ROLE_HUB)))


def live_hub_ids(ec2: Any, run_id: str, stack: str) -> list[str]:
    return sorted(i["InstanceId"] for i in hub_instances(ec2, run_id, stack) if _state(i) in LIVE_STATES)


def _describe_one(ec2: Any, instance_id: str) -> dict[str, Any] | None:
    try:
        found = list(_instances(ec2, InstanceIds=[instance_id]))
    except ClientError as e:
        if error_code(e) in ("InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"):
            return None
        raise
    return found[0] if found else None


def client_token(run_id: str, previous_starts: int) -> str:
    """RunInstances idempotency token: the same for a retry, new for each later hub of the run."""
    token = f"gridfleet-hub-{run_id}-{previous_starts}"
    if len(token) <= _CLIENT_TOKEN_MAX:
        return token
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:32]
    return f"gridfleet-hub-{digest}-{previous_starts}"


# --- the starter ----------------------------------------------------------------------


def start_hub(settings: LambdaSettings, ec2: Any, table: DynamoStateTable, clock: Clock,
              run_id: str | None = None) -> dict[str, Any]:
    """Start a hub for `run_id` (default: today's run) unless one is live or the run is done."""
    run_id = run_id or default_run_id(clock.now())
    hubs = hub_instances(ec2, run_id, settings.stack)
    live = sorted((i for i in hubs if _state(i) in LIVE_STATES), key=lambda i: i["InstanceId"])
    if live:
        first = live[0]["InstanceId"]
        reason = f"hub instance {first} of the run is {_state(live[0])}"
        event(log, "hub-refused", run_id=run_id, instance_id=",".join(i["InstanceId"] for i in live), reason=reason)
        return {"action": "refused", "run_id": run_id, "reason": reason, "instance_id": first}

    items = RunItems.of(table)
    item = items.get(run_id)
    if item is not None and item.get("status") == "FINISHED":
        reason = "the run is FINISHED"
        event(log, "hub-skipped", run_id=run_id, reason=reason)
        return {"action": "skipped", "run_id": run_id, "reason": reason, "instance_id": None}

    if settings.hub_instance_id:
        inst = _describe_one(ec2, settings.hub_instance_id)
        state = _state(inst) if inst else "missing"
        if inst is not None and tags_of(inst).get(TAG_STACK) != settings.stack:
            state = f"{state} but not tagged {TAG_STACK}={settings.stack} (another stack's, or untagged)"
        elif state == "stopped":
            iid = settings.hub_instance_id
            ec2.create_tags(Resources=[iid], Tags=[{"Key": TAG_RUN_ID, "Value": run_id},
                                                   {"Key": TAG_ROLE, "Value": ROLE_HUB}])
            ec2.start_instances(InstanceIds=[iid])
            items.note_hub_start(run_id)
            event(log, "hub-started", run_id=run_id, instance_id=iid, how="start")
            return {"action": "started", "run_id": run_id, "instance_id": iid, "how": "start"}
        reason = f"hub instance {settings.hub_instance_id} is {state}"
        if not settings.hub_launch_template:
            event(log, "hub-refused", logging.WARNING, run_id=run_id, instance_id=settings.hub_instance_id,
                  reason=reason)
            return {"action": "refused", "run_id": run_id, "reason": reason,
                    "instance_id": settings.hub_instance_id}
        event(log, "hub-instance-unusable", run_id=run_id, instance_id=settings.hub_instance_id,
              reason=reason + ", launching from the template instead")

    previous = max(len(hubs), int((item or {}).get(HUB_STARTS, 0)))
    out = ec2.run_instances(
        LaunchTemplate={"LaunchTemplateName": settings.hub_launch_template},
        MinCount=1, MaxCount=1, ClientToken=client_token(run_id, previous),
        TagSpecifications=[{"ResourceType": "instance", "Tags": instance_tags(settings.stack, run_id, ROLE_HUB)},
                           {"ResourceType": "volume", "Tags": instance_tags(settings.stack, run_id, ROLE_HUB)}],
    )
    iid = out["Instances"][0]["InstanceId"]
    items.note_hub_start(run_id)
    event(log, "hub-started", run_id=run_id, instance_id=iid, how="run", template=settings.hub_launch_template,
          previous_hubs=previous)
    return {"action": "started", "run_id": run_id, "instance_id": iid, "how": "run"}


# --- the watchdog ---------------------------------------------------------------------


def watch(settings: LambdaSettings, ec2: Any, table: DynamoStateTable, clock: Clock,
          archive: RunArchive | None = None) -> dict[str, Any]:
    """One watchdog pass: restart the hubs of stale runs, end abandoned ones (their summary to `archive`), then
    clean up orphaned and stopped instances."""
    now = clock.now()
    items = RunItems.of(table)
    result: dict[str, Any] = {"restarted": [], "terminated": [], "stopped": [], "observed": [], "ended": []}
    for entry in table.list_runs()[-settings.lookback_runs:]:
        _watch_run(settings, ec2, table, clock, items, entry.run_id, now, result, archive)
    _clean_orphans(settings, ec2, items, now, result)
    event(log, "watch-pass", restarted=len(result["restarted"]), terminated=len(result["terminated"]),
          stopped=len(result["stopped"]), observed=len(result["observed"]), ended=len(result["ended"]))
    log.info("watch-result %s", json.dumps(result, sort_keys=True))
    return result


def _watch_run(settings: LambdaSettings, ec2: Any, table: DynamoStateTable, clock: Clock, items: RunItems,
               run_id: str, now: float, result: dict[str, Any], archive: RunArchive | None) -> None:
    item = items.get(run_id)
    if item is None or item.get("status") != "RUNNING":
        return
    observed: dict[str, Any] = {"run_id": run_id}
    result["observed"].append(observed)
    if is_abandoned(item, now, settings):
        observed["state"] = "abandoned"
        event(log, "run-abandoned", logging.WARNING, run_id=run_id,
              reason=f"RUNNING more than {settings.run_grace_s:.0f}s past its deadline; ending it")
        result["ended"].append(end_abandoned(settings, table, clock, run_id, archive))
        return

    seen = heartbeat_token(item)
    prev_seen = item.get(WATCH_HB)
    if prev_seen != seen or item.get(WATCH_SINCE) is None:
        won = items.observe(run_id, seen, prev_seen, now)
        observed.update(state="fresh", unchanged_s=0.0)
        if not won:
            observed["note"] = "observed by another watchdog"
        return

    unchanged = now - float(item[WATCH_SINCE])
    observed["unchanged_s"] = round(unchanged, 3)
    if unchanged < settings.hub_stale_s:
        observed["state"] = "ok"
        return

    live = live_hub_ids(ec2, run_id, settings.stack)
    if live:
        observed.update(state="stale-hub-alive", instance_ids=live)
        event(log, "hub-stale-but-alive", logging.WARNING, run_id=run_id, instance_id=",".join(live),
              reason=f"heartbeat unchanged for {unchanged:.0f}s but the hub instance is pending/running")
        return

    if not items.claim_restart(run_id, item, now):
        observed["state"] = "restart-claimed-elsewhere"
        event(log, "hub-restart-lost-race", run_id=run_id,
              reason="another watchdog claimed this restart or the run changed since it was read")
        return
    event(log, "hub-restart", logging.WARNING, run_id=run_id,
          reason=f"heartbeat unchanged for {unchanged:.0f}s and no hub instance is pending/running")
    try:
        out = start_hub(settings, ec2, table, clock, run_id=run_id)
    except Exception:
        items.release_restart(run_id, item, now)
        raise
    observed["state"] = "restart-" + out["action"]
    if out["action"] == "started":
        result["restarted"].append({"run_id": run_id, "instance_id": out["instance_id"], "how": out["how"],
                                    "unchanged_s": round(unchanged, 3)})
    else:
        observed["reason"] = out["reason"]


def end_abandoned(settings: LambdaSettings, table: DynamoStateTable, clock: Clock, run_id: str,
                  archive: RunArchive | None) -> dict[str, Any]:
    """End a run whose hub is gone past its deadline and grace, as its hub would have at the deadline: its open
    sites FAILED (`deadline`), the run FINISHED, its summary in the bucket. Its instances go in this same pass."""
    failed = fail_open_sites(table, run_id, Reason.DEADLINE, clock,
                             error=f"the run's hub was gone {settings.run_grace_s:.0f}s past the deadline")
    now = clock.now()
    table.add_history([HistoryEvent(run_id, now, "failed", {"site": name, "reason": str(Reason.DEADLINE),
                                                            "by": "watchdog"}, n)
                       for n, name in enumerate(failed, start=1)]
                      + [HistoryEvent(run_id, now, "finish", {"reason": "deadline", "by": "watchdog"},
                                      len(failed) + 1)])
    table.update_run(run_id, status=RunState.FINISHED, finished_at=now)
    rows = table.read_run(run_id)
    out: dict[str, Any] = {"run_id": run_id, "failed": failed, "summary": None}
    if rows.run is not None and archive is not None:
        summary = build_summary(rows.run, rows.sites, left_running=0, finished_at=now,
                                finish_reason="deadline (ended by the watchdog)")
        out["summary"] = f"s3://{settings.bucket}/{archive.put_summary(summary)}"
    event(log, "run-ended", logging.WARNING, run_id=run_id, failed=len(failed), summary=out["summary"],
          reason="abandoned: FAILED (deadline) what was open")
    return out


def orphan_reason(item: Mapping[str, Any] | None, launched_at: float | None, now: float,
                  settings: LambdaSettings) -> str | None:
    """Why an instance of the run in `item` must go, or None when it belongs to a live run."""
    if item is None:
        # A new hub creates its run item shortly after boot; give it the time a hub has to show a heartbeat.
        if launched_at is None or now - launched_at >= settings.hub_stale_s:
            return "no run item"
        return None
    status = item.get("status")
    if status == "FINISHED":
        return "run FINISHED"
    if is_abandoned(item, now, settings):
        return "run abandoned (RUNNING past deadline + grace)"
    return None


def _clean_orphans(settings: LambdaSettings, ec2: Any, items: RunItems, now: float,
                   result: dict[str, Any]) -> None:
    candidates = _instances(ec2, Filters=filters(settings.stack, states=LIVE_STATES + STOPPED_STATES))
    runs: dict[str, dict[str, Any] | None] = {}
    doomed: dict[tuple[str, str], list[dict[str, Any]]] = {}  # (run id, reason) -> entries
    for inst in candidates:
        tags = tags_of(inst)
        run_id = tags.get(TAG_RUN_ID)
        if _state(inst) in STOPPED_STATES:
            if inst["InstanceId"] == settings.hub_instance_id or tags.get(TAG_ROLE) not in (ROLE_HUB, ROLE_NODE):
                continue  # the reusable hub (stopped between runs on purpose), or not a fleet instance (the NAT)
            reason = "stopped, and kept by no configuration"
        elif not run_id or not is_run_id(run_id):
            continue
        else:
            if run_id not in runs:
                runs[run_id] = items.get(run_id)
            launch = inst.get("LaunchTime")
            reason = orphan_reason(runs[run_id], launch.timestamp() if launch else None, now, settings)
            if reason is None:
                continue
        doomed.setdefault((run_id or "-", reason), []).append(
            {"instance_id": inst["InstanceId"], "run_id": run_id, "role": tags.get(TAG_ROLE), "reason": reason,
             "state": _state(inst)})

    to_terminate: list[str] = []
    to_stop: list[str] = []
    for (run_id, reason), entries in sorted(doomed.items()):
        keep = [e for e in entries if e["instance_id"] == settings.hub_instance_id and e["state"] in LIVE_STATES]
        gone = [e for e in entries if e["instance_id"] != settings.hub_instance_id]
        if gone:
            event(log, "orphans-terminate", run_id=run_id,
                  instance_id=",".join(e["instance_id"] for e in gone), reason=reason)
            to_terminate += [e["instance_id"] for e in gone]
            result["terminated"] += gone
        if keep:
            event(log, "orphan-hub-stop", run_id=run_id, instance_id=settings.hub_instance_id,
                  reason=reason + "; the configured hub instance is stopped, not terminated")
            to_stop.append(settings.hub_instance_id)
            result["stopped"] += keep
    for i in range(0, len(to_terminate), TERMINATE_BATCH):
        ec2.terminate_instances(InstanceIds=to_terminate[i:i + TERMINATE_BATCH])
    if to_stop:
        ec2.stop_instances(InstanceIds=to_stop)


# --- the handlers ---------------------------------------------------------------------

ClientsFactory = Callable[[LambdaSettings], AwsClients]


def default_clients(settings: LambdaSettings) -> AwsClients:
    """Clients with the Lambda role's credentials (the default boto3 chain)."""
    return AwsClients(AwsConfig(region=settings.region, endpoint_url=settings.endpoint_url, table=settings.table))



def _event_run_id(event_in: Any) -> str | None:
    if not isinstance(event_in, Mapping) or event_in.get("run_id") in (None, ""):
        return None
    run_id = event_in["run_id"]
    if not is_run_id(run_id):
        raise ValueError(f"event run_id {run_id!r}: letters, digits, '.', '_' or '-' (max 64)")
    return run_id


def run_starter(event_in: Any, env: Mapping[str, str], *, clients_factory: ClientsFactory = default_clients,
                clock: Clock | None = None) -> dict[str, Any]:
    """The starter with its environment, clients and clock passed in."""
    settings = LambdaSettings.from_env(env)
    run_id = _event_run_id(event_in)
    clients = clients_factory(settings)
    table = DynamoStateTable(clients.client("dynamodb"), settings.table)
    return start_hub(settings, clients.client("ec2"), table, clock or SystemClock(), run_id=run_id)


def run_watchdog(event_in: Any, env: Mapping[str, str], *, clients_factory: ClientsFactory = default_clients,
                 clock: Clock | None = None) -> dict[str, Any]:
    """The watchdog with its environment, clients and clock passed in."""
    settings = LambdaSettings.from_env(env)
    clients = clients_factory(settings)
    table = DynamoStateTable(clients.client("dynamodb"), settings.table)
    archive = S3RunArchive(clients.client("s3"), settings.bucket) if settings.bucket else None
    return watch(settings, clients.client("ec2"), table, clock or SystemClock(), archive)


def _outermost(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)  # the Lambda runtime's root logger shows WARNING and up only
    try:
        return fn()
    except Exception as e:  # the handler's outermost level: log what failed, then fail the invocation
        event(log, f"{name}-failed", logging.ERROR, error=f"{type(e).__name__}: {e}")
        log.debug("%s failure", name, exc_info=True)
        raise


def starter_handler(event: Any, context: Any) -> dict[str, Any]:
    """Lambda entry point of the daily starter; `event["run_id"]` overrides today's run id."""
    return _outermost("starter", lambda: run_starter(event, os.environ))


def watchdog_handler(event: Any, context: Any) -> dict[str, Any]:
    """Lambda entry point of the watchdog (one pass per invocation)."""
    return _outermost("watchdog", lambda: run_watchdog(event, os.environ))
