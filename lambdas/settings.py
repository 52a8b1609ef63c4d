"""What the starter and the watchdog are told by their environment, checked before either touches AWS.

Terraform sets these variables (infra/terraform/lambda.tf); they are read only by the handlers, so every other
function takes a `LambdaSettings` and tests build one directly. An empty value counts as unset:
GRIDFLEET_REGION (required), GRIDFLEET_TABLE, GRIDFLEET_STACK, GRIDFLEET_BUCKET, GRIDFLEET_ENDPOINT_URL,
GRIDFLEET_HUB_LAUNCH_TEMPLATE and/or GRIDFLEET_HUB_INSTANCE_ID (at least one), GRIDFLEET_HUB_STALE_S,
GRIDFLEET_RUN_GRACE_S, GRIDFLEET_LOOKBACK_RUNS, GRIDFLEET_NOTIFY_TOPIC_ARN (the SNS topic told of a run the
watchdog ends).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fleet.config import SNS_TOPIC_ARN_RE
from fleet.errors import quote

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
ENV_NOTIFY_TOPIC_ARN = "GRIDFLEET_NOTIFY_TOPIC_ARN"

DEFAULT_TABLE = "TrendlyzeStatus"
DEFAULT_STACK = "gridfleet"
DEFAULT_HUB_STALE_S = 600.0
DEFAULT_RUN_GRACE_S = 3600.0
DEFAULT_LOOKBACK_RUNS = 7

_STACK_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,31}")  # the rule of fleet.yaml's aws.stack


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
    notify_topic_arn: str | None = None  # the SNS topic the watchdog tells of each overdue run it ends

    def __post_init__(self) -> None:
        if not self.region:
            raise ValueError(f"{ENV_REGION} is required (the AWS region of the fleet)")
        if not self.table:
            raise ValueError(f"{ENV_TABLE} must not be empty")
        if not _STACK_RE.fullmatch(self.stack):
            raise ValueError(
                f"{ENV_STACK} must be the stack's name (letters, digits and '-', max 32), got {self.stack!r}"
            )
        if not self.hub_launch_template and not self.hub_instance_id:
            raise ValueError(
                f"set {ENV_HUB_LAUNCH_TEMPLATE} (the hub launch template's name) "
                f"and/or {ENV_HUB_INSTANCE_ID} (a stopped hub instance to start)"
            )
        if self.hub_stale_s <= 0:
            raise ValueError(f"{ENV_HUB_STALE_S} must be > 0, got {self.hub_stale_s}")
        if self.run_grace_s < 0:
            raise ValueError(f"{ENV_RUN_GRACE_S} must be >= 0, got {self.run_grace_s}")
        if self.lookback_runs < 1:
            raise ValueError(f"{ENV_LOOKBACK_RUNS} must be >= 1, got {self.lookback_runs}")
        if self.notify_topic_arn is not None and not re.fullmatch(SNS_TOPIC_ARN_RE, self.notify_topic_arn):
            raise ValueError(f"{ENV_NOTIFY_TOPIC_ARN} must be an SNS topic ARN, got {quote(self.notify_topic_arn)}")

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
            notify_topic_arn=_env_str(env, ENV_NOTIFY_TOPIC_ARN),
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
