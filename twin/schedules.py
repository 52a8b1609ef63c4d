"""EventBridge schedules that fire: moto stores a stack's rules and never fires them; here they fire.

Each enabled rule with a schedule expression, and each of its targets that is a Lambda function, becomes a
`Timer`: when the caller's clock passes the rule's next time, the function's handler (the `Handler` moto stored
for it, e.g. `lambdas.starter.handler`) is called in this process with the function's environment variables and
the target's input, as Lambda would call it. Nothing sleeps: the caller drives the clock (`fire_due(now)`), so
a week of schedules runs in a test as fast as its handlers do.

Schedule expressions are EventBridge's: `rate(N minute[s]|hour[s]|day[s])`, counted from when the timers were
loaded (the rule's creation, as on AWS), and `cron(minutes hours day-of-month month day-of-week year)` in UTC,
with `*`, `?`, lists, ranges, steps and the names of months and days. `L`, `W` and `#` are refused.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("gridfleet.twin")

#: A handler as the schedules call it: (event, environment variables) -> its result.
Handler = Callable[[Any, Mapping[str, str]], Any]

_MONTHS = {m: i for i, m in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split(), 1)}
_DAYS = {d: i for i, d in enumerate("SUN MON TUE WED THU FRI SAT".split(), 1)}  # EventBridge: 1 = Sunday
_RANGES = {"minutes": (0, 59), "hours": (0, 23), "dom": (1, 31), "month": (1, 12), "dow": (1, 7), "year": (1970, 2199)}
_RATE_UNITS = {"minute": 60, "minutes": 60, "hour": 3600, "hours": 3600, "day": 86400, "days": 86400}
_SEARCH_DAYS = 5 * 366  # a cron that matches no day within five years never fires


class ScheduleError(ValueError):
    """A schedule expression this twin cannot fire; the message names it and why."""


def _values(text: str, name: str, expr: str) -> frozenset[int] | None:
    """The values of one cron field; None for `*` or `?` (any)."""
    if text in ("*", "?"):
        return None
    low, high = _RANGES[name]
    names = _MONTHS if name == "month" else _DAYS if name == "dow" else {}
    out: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"(\*|[A-Z0-9]+)(?:-([A-Z0-9]+))?(?:/([0-9]+))?", part.upper())
        if not m:
            raise ScheduleError(f"{expr}: {name} field {text!r} is not supported (L, W and # are not)")
        first, last, step = m.groups()

        def number(token: str) -> int:
            if token not in names and not token.isdigit():
                raise ScheduleError(f"{expr}: {name} value {token!r} is not supported (L, W and # are not)")
            value = names[token] if token in names else int(token)
            if not low <= value <= high:
                raise ScheduleError(f"{expr}: {name} value {token!r} is out of {low}-{high}")
            return value

        start = low if first == "*" else number(first)
        end = number(last) if last else (high if first == "*" or step else start)
        out.update(range(start, end + 1, int(step) if step else 1))
    return frozenset(out)


@dataclass(frozen=True)
class Cron:
    expr: str
    minutes: frozenset[int] | None
    hours: frozenset[int] | None
    dom: frozenset[int] | None
    month: frozenset[int] | None
    dow: frozenset[int] | None
    year: frozenset[int] | None

    def _day_matches(self, day: dt.date) -> bool:
        weekday = day.isoweekday() % 7 + 1  # Monday = 1 in Python, 2 in EventBridge
        return (
            (self.year is None or day.year in self.year)
            and (self.month is None or day.month in self.month)
            and (self.dom is None or day.day in self.dom)
            and (self.dow is None or weekday in self.dow)
        )

    def next_after(self, t: float) -> float:
        """The first time this cron fires strictly after `t` (epoch seconds, UTC)."""
        start = dt.datetime.fromtimestamp(t, dt.UTC)
        hours = sorted(self.hours if self.hours is not None else range(24))
        minutes = sorted(self.minutes if self.minutes is not None else range(60))
        for offset in range(_SEARCH_DAYS):
            day = start.date() + dt.timedelta(days=offset)
            if not self._day_matches(day):
                continue
            for hour in hours:
                for minute in minutes:
                    at = dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=dt.UTC).timestamp()
                    if at > t:
                        return at
        return math.inf


@dataclass(frozen=True)
class Rate:
    period_s: float
    anchor: float

    def next_after(self, t: float) -> float:
        steps = math.floor((t - self.anchor) / self.period_s) + 1
        return self.anchor + max(1, steps) * self.period_s


def parse(expr: str, anchor: float) -> Cron | Rate:
    """A schedule expression; `anchor` is when a rate's count starts."""
    m = re.fullmatch(r"rate\(\s*([0-9]+)\s+([a-z]+)\s*\)", expr.strip())
    if m:
        count, unit = int(m.group(1)), m.group(2)
        if unit not in _RATE_UNITS or count < 1 or (count == 1) != (not unit.endswith("s")):
            raise ScheduleError(f"{expr}: a rate is N minute(s), hour(s) or day(s), singular for 1")
        return Rate(count * _RATE_UNITS[unit], anchor)
    m = re.fullmatch(r"cron\((.*)\)", expr.strip())
    fields = m.group(1).split() if m else []
    if len(fields) != 6:
        raise ScheduleError(f"{expr}: not rate(...) or cron(minutes hours day-of-month month day-of-week year)")
    if (fields[2] == "?") == (fields[4] == "?"):
        raise ScheduleError(f"{expr}: exactly one of day-of-month and day-of-week must be ?")
    names = ("minutes", "hours", "dom", "month", "dow", "year")
    values = [_values(text, name, expr) for text, name in zip(fields, names, strict=True)]
    return Cron(expr, *values)


@dataclass
class Timer:
    rule: str
    function: str
    schedule: Cron | Rate
    handler: Handler
    env: Mapping[str, str]
    event: Any
    next_at: float = field(default=0.0)


@dataclass(frozen=True)
class Fired:
    rule: str
    function: str
    at: float
    result: Any = None
    error: str | None = None


class Schedules:
    """The stack's schedules, loaded from EventBridge and Lambda (moto), fired on the caller's clock."""

    def __init__(self, events: Any, lambdas: Any, handlers: Mapping[str, Handler]):
        self.events = events
        self.lambdas = lambdas
        self.handlers = handlers
        self.timers: list[Timer] = []

    def load(self, now: float, prefix: str = "") -> list[Timer]:
        """Every enabled scheduled rule (named with `prefix`) and its Lambda targets, next due after `now`."""
        self.timers = []
        for page in self.events.get_paginator("list_rules").paginate(NamePrefix=prefix):
            for rule in page.get("Rules", []):
                expr = rule.get("ScheduleExpression")
                if not expr or rule.get("State") == "DISABLED":
                    continue
                schedule = parse(expr, now)
                for target in self.events.list_targets_by_rule(Rule=rule["Name"]).get("Targets", []):
                    timer = self._timer(rule["Name"], schedule, target)
                    if timer is not None:
                        timer.next_at = schedule.next_after(now)
                        self.timers.append(timer)
        return self.timers

    def _timer(self, rule: str, schedule: Cron | Rate, target: Mapping[str, Any]) -> Timer | None:
        arn = str(target.get("Arn", ""))
        if ":function:" not in arn:
            log.warning("schedule-target-skipped rule=%s target=%s (not a Lambda function)", rule, arn)
            return None
        name = arn.rsplit(":function:", 1)[1].split(":")[0]
        conf = self.lambdas.get_function(FunctionName=name)["Configuration"]
        handler = self.handlers.get(conf.get("Handler", ""))
        if handler is None:
            raise ScheduleError(f"rule {rule}: function {name} has handler {conf.get('Handler')!r}, not one of "
                                f"{', '.join(sorted(self.handlers))}")  # fmt: skip
        env = dict((conf.get("Environment") or {}).get("Variables") or {})
        event = json.loads(target["Input"]) if target.get("Input") else {"source": "aws.events", "resources": [rule]}
        return Timer(rule, name, schedule, handler, env, event)

    def fire_due(self, now: float, *, catch_up: bool = True) -> list[Fired]:
        """Call every handler whose time has come by `now`, in time order: each once per time it was due, or,
        without `catch_up`, once for all its times due by `now` (at the last of them), as when the clock jumped
        over a stretch in which nothing ran."""
        fired: list[Fired] = []
        while True:
            due = [t for t in self.timers if t.next_at <= now]
            if not due:
                return fired
            timer = min(due, key=lambda t: (t.next_at, t.rule))
            at = timer.next_at
            while not catch_up and (later := timer.schedule.next_after(at)) <= now:
                at = later
            timer.next_at = timer.schedule.next_after(at)
            try:
                fired.append(Fired(timer.rule, timer.function, at, timer.handler(timer.event, timer.env)))
            except Exception as e:  # noqa: BLE001 - an invocation that fails is Lambda's to retry, not the clock's
                log.warning("schedule-invocation-failed rule=%s function=%s error=%s", timer.rule, timer.function, e)
                fired.append(Fired(timer.rule, timer.function, at, error=f"{type(e).__name__}: {e}"))

    def next_at(self) -> float:
        return min((t.next_at for t in self.timers), default=math.inf)


def cron_at(epoch: float) -> str:
    """A cron expression that fires daily at the minute of `epoch` (UTC)."""
    t = dt.datetime.fromtimestamp(epoch, dt.UTC)
    return f"cron({t.minute} {t.hour} * * ? *)"


def stack_handlers(clients_factory: Callable[..., Any], clock: Any) -> dict[str, Handler]:
    """The handlers of the stack's Lambdas (as infra/terraform names them), on the twin's clients and clock."""
    from lambdas.starter import run_starter
    from lambdas.watchdog import run_watchdog

    return {
        "lambdas.starter.handler": lambda e, env: run_starter(e, env, clients_factory=clients_factory, clock=clock),
        "lambdas.watchdog.handler": lambda e, env: run_watchdog(e, env, clients_factory=clients_factory, clock=clock),
    }
