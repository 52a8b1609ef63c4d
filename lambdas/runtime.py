"""What both Lambdas need around their logic: AWS clients, the state table, the event, the outermost handler.

The handlers read `os.environ` and build clients with the Lambda role's credentials; `run_starter` and
`run_watchdog` take both as arguments instead, so tests and `gridfleet` itself call the same code on moto.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from fleet.aws.clients import AwsClients
from fleet.aws.table import DynamoStateTable
from fleet.config.aws import AwsConfig
from fleet.errors import quote
from fleet.logs import event
from fleet.record.ids import RUN_ID_RULE, is_run_id
from lambdas.settings import LambdaSettings

log = logging.getLogger("gridfleet.lambdas")

ClientsFactory = Callable[[LambdaSettings], AwsClients]


def default_clients(settings: LambdaSettings) -> AwsClients:
    """Clients with the Lambda role's credentials (the default boto3 chain)."""
    return AwsClients(AwsConfig(region=settings.region, endpoint_url=settings.endpoint_url, table=settings.table))


def state_table(clients: AwsClients, settings: LambdaSettings) -> DynamoStateTable:
    return DynamoStateTable(clients.client("dynamodb"), settings.table)


def event_run_id(event_in: Any) -> str | None:
    """The run id an invocation names (`{"run_id": ...}`), or None for the default."""
    if not isinstance(event_in, Mapping) or event_in.get("run_id") in (None, ""):
        return None
    run_id = event_in["run_id"]
    if not is_run_id(run_id):
        raise ValueError(f"event run_id {quote(run_id)}: {RUN_ID_RULE}")
    return str(run_id)


def outermost(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run a handler's body: log what failed, then fail the invocation (Lambda retries it, then its DLQ)."""
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)  # the Lambda runtime's root logger shows WARNING and up only
    try:
        return fn()
    except Exception as e:
        event(log, f"{name}-failed", logging.ERROR, error=f"{type(e).__name__}: {e}")
        log.debug("%s failure", name, exc_info=True)
        raise
