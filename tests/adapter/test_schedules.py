"""EventBridge schedules stored in moto fire the Lambda handlers they target, on a clock the test drives.

moto stores rules, targets and functions and fires nothing: `twin.schedules` reads them back and calls each
target's handler in this process. The schedules are the stack's own (infra/terraform's defaults); the handlers
are recorders here (what a handler does is the Lambdas' tests' business), and the mapping of the Terraform
handler names to the real Lambdas is checked apart.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid
import zipfile

import boto3
import pytest

from fleet.clock import FakeClock
from tests.infra.test_terraform import config as terraform
from twin.schedules import Cron, Rate, ScheduleError, Schedules, parse, stack_handlers

REGION = "ap-northeast-2"


def at(text: str) -> float:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp()


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M %a")


@pytest.mark.parametrize(
    ("expr", "after", "then"),
    [
        ("cron(0 1 * * ? *)", "2026-11-24T00:30:00", "2026-11-24 01:00 Tue"),
        ("cron(0 1 * * ? *)", "2026-11-24T01:00:00", "2026-11-25 01:00 Wed"),  # strictly after
        ("cron(0 1 ? * MON-FRI *)", "2026-11-27T02:00:00", "2026-11-30 01:00 Mon"),  # Friday -> Monday
        ("cron(0 1 */3 * ? *)", "2026-11-29T02:00:00", "2026-12-01 01:00 Tue"),  # days 1, 4, 7 ... 28, 31
        ("cron(15,45 8-9 ? * 2 *)", "2026-11-23T08:20:00", "2026-11-23 08:45 Mon"),  # 2 = Monday
        ("cron(0 12 1 JAN ? 2027)", "2026-11-24T00:00:00", "2027-01-01 12:00 Fri"),
    ],
)
def test_a_cron_fires_next_at_the_time_eventbridge_would(expr, after, then):
    assert iso(parse(expr, 0).next_after(at(after))) == then


def test_a_rate_counts_from_when_it_was_loaded():
    rate = parse("rate(2 minutes)", at("2026-11-24T00:00:30"))
    assert isinstance(rate, Rate)
    assert iso(rate.next_after(at("2026-11-24T00:00:30"))) == "2026-11-24 00:02 Tue"
    assert rate.next_after(at("2026-11-24T00:04:30")) == at("2026-11-24T00:06:30")


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("cron(0 1 L * ? *)", "not supported"),
        ("cron(0 1 ? * 2#1 *)", "not supported"),
        ("cron(0 1 * * * *)", "exactly one of day-of-month and day-of-week"),
        ("cron(0 25 * * ? *)", "out of 0-23"),
        ("cron(0 1 * *)", "not rate"),
        ("rate(1 minutes)", "singular for 1"),
        ("rate(5 weeks)", "a rate is N minute"),
    ],
)
def test_what_the_twin_cannot_fire_is_refused_with_its_reason(expr, why):
    with pytest.raises(ScheduleError, match=why):
        parse(expr, 0)


def test_the_stacks_own_schedules_parse():
    tf = terraform()
    for variable in ("start_schedule", "watchdog_schedule"):
        schedule = parse(tf.default(variable), 0)
        assert isinstance(schedule, Cron | Rate)


def _zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("handler.py", "def handler(event, context):\n    return {}\n")
    return buf.getvalue()


@pytest.fixture
def stack(moto_endpoint):
    """The stack's two scheduled Lambdas and their rules, made in moto as infra/terraform makes them."""
    kw = {"endpoint_url": moto_endpoint, "region_name": REGION, "aws_access_key_id": "x", "aws_secret_access_key": "x"}
    events, lambdas, iam = (boto3.client(s, **kw) for s in ("events", "lambda", "iam"))
    prefix = f"gf{uuid.uuid4().hex[:8]}"
    role = iam.create_role(RoleName=f"{prefix}-lambda", AssumeRolePolicyDocument=json.dumps({"Statement": []}))
    tf = terraform()
    for name, handler, schedule in (
        ("start", "lambdas.starter.handler", tf.default("start_schedule")),
        ("watchdog", "lambdas.watchdog.handler", tf.default("watchdog_schedule")),
    ):
        fn = lambdas.create_function(
            FunctionName=f"{prefix}-{name}",
            Runtime="python3.11",
            Role=role["Role"]["Arn"],
            Handler=handler,
            Code={"ZipFile": _zip()},
            Environment={"Variables": {"GRIDFLEET_STACK": prefix, "GRIDFLEET_WHICH": name}},
        )
        events.put_rule(Name=f"{prefix}-{name}", ScheduleExpression=schedule, State="ENABLED")
        events.put_targets(Rule=f"{prefix}-{name}", Targets=[{"Id": name, "Arn": fn["FunctionArn"]}])
    events.put_rule(Name=f"{prefix}-off", ScheduleExpression="rate(1 minute)", State="DISABLED")
    return events, lambdas, prefix


def test_two_days_of_the_stacks_schedules_fire_each_handler_when_due_with_its_environment(stack):
    events, lambdas, prefix = stack
    calls: list[tuple[str, float, str]] = []
    clock = FakeClock(at("2026-11-24T00:00:00"))

    def recorder(kind):
        return lambda event, env: calls.append((kind, clock.now(), env["GRIDFLEET_WHICH"])) or {"ok": kind}

    schedules = Schedules(events, lambdas, {"lambdas.starter.handler": recorder("starter"),
                                            "lambdas.watchdog.handler": recorder("watchdog")})  # fmt: skip
    timers = schedules.load(clock.now(), prefix)
    assert sorted(t.rule for t in timers) == [f"{prefix}-start", f"{prefix}-watchdog"]  # the disabled rule is not
    fired = []
    while clock.now() < at("2026-11-26T00:00:00"):
        clock.advance(60)  # the twin's clock, a minute at a time
        fired += schedules.fire_due(clock.now())
    starts = [f for f in fired if f.rule.endswith("-start")]
    assert [iso(f.at) for f in starts] == ["2026-11-24 01:00 Tue", "2026-11-25 01:00 Wed"]
    assert all(f.result == {"ok": "starter"} for f in starts)
    watchdogs = [f for f in fired if f.rule.endswith("-watchdog")]
    assert len(watchdogs) == 2 * 24 * 30  # rate(2 minutes) for two days
    assert {which for kind, _, which in calls} == {"start", "watchdog"}
    assert all(which == ("start" if kind == "starter" else "watchdog") for kind, _, which in calls)


def test_a_clock_that_jumps_fires_each_missed_time_once_in_order_and_a_failure_is_reported(stack):
    events, lambdas, prefix = stack
    seen = []

    def starter(event, env):
        raise RuntimeError("no hub template")

    schedules = Schedules(events, lambdas, {"lambdas.starter.handler": starter,
                                            "lambdas.watchdog.handler": lambda e, env: seen.append(e)})  # fmt: skip
    schedules.load(at("2026-11-24T00:00:00"), prefix)
    fired = schedules.fire_due(at("2026-11-24T01:05:00"))
    assert [f.at for f in fired] == sorted(f.at for f in fired)
    assert [f.error for f in fired if f.rule.endswith("-start")] == ["RuntimeError: no hub template"]
    assert len(seen) == 32 and seen[0]["source"] == "aws.events"  # 00:02 ... 01:04, the scheduled event
    assert schedules.fire_due(at("2026-11-24T01:05:00")) == []


def test_without_catch_up_a_jump_over_a_day_fires_each_schedule_once_at_its_last_time(stack):
    events, lambdas, prefix = stack
    seen: list[str] = []
    handlers = {name: (lambda e, env, n=name: seen.append(n)) for name in ("lambdas.starter.handler",
                                                                            "lambdas.watchdog.handler")}  # fmt: skip
    schedules = Schedules(events, lambdas, handlers)
    schedules.load(at("2026-11-24T00:00:00"), prefix)
    fired = schedules.fire_due(at("2026-11-25T01:05:00"), catch_up=False)
    assert sorted((f.rule.rsplit("-", 1)[1], iso(f.at)) for f in fired) == [
        ("start", "2026-11-25 01:00 Wed"),  # one start for the two days passed over, at the last
        ("watchdog", "2026-11-25 01:04 Wed"),  # one pass, not 750
    ]
    assert len(seen) == 2 and schedules.fire_due(at("2026-11-25T01:05:00"), catch_up=False) == []


def test_the_stacks_handler_names_are_the_lambdas_terraform_deploys():
    tf = terraform()
    named = {tf.locals["lambdas"][k]["handler"] for k in ("starter", "watchdog")}
    assert named == set(stack_handlers(lambda settings: None, FakeClock(0)))
