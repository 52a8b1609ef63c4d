"""The one place that makes boto3 clients.

Every adapter receives its client from `AwsClients`, so the retry policy
(botocore's `standard` mode), timeouts, the endpoint (moto server on the
embedded default, or any `aws.endpoint_url`), the naming of failed calls
(`fleet.aws.errors`) and test hooks apply everywhere.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore import UNSIGNED
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError, NoRegionError

if TYPE_CHECKING:
    import boto3
    import botocore.loaders

from fleet.aws.errors import AwsCall, name_calls, service_label, stamp
from fleet.config.aws import AwsConfig

#: Error codes worth retrying by our own loops (botocore already retries these a few times).
RETRYABLE_CODES = frozenset(
    {
        "ThrottlingException",
        "Throttling",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ServiceUnavailable",
        "RequestTimeout",
    }
)


@dataclass(frozen=True)
class StaticCredentials:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None


#: Credentials for moto server on the embedded default (it accepts any).
LOCAL_CREDENTIALS = StaticCredentials("gridfleet-local", "gridfleet-local")

_loader_lock = threading.Lock()
_loader: botocore.loaders.Loader | None = None


def _session(**kwargs: Any) -> boto3.session.Session:
    """A boto3 session whose service models come from one loader per process. Each session would otherwise read
    and decode the models' JSON again, a tenth of a second of CPU per client: most of what a CLI command, a Lambda
    invocation or a test spends."""
    # boto3 and botocore's session are imported here, on first use: a tenth of a second that a command making no
    # AWS call (`gridfleet validate`, `--help`) does not spend.
    import boto3.session
    import botocore.loaders
    import botocore.session

    global _loader
    core = botocore.session.get_session()
    with _loader_lock:
        if _loader is None:
            _loader = botocore.loaders.create_loader()
        core.register_component("data_loader", _loader)
        session = boto3.session.Session(botocore_session=core, **kwargs)
        paths = _loader.search_paths  # boto3 adds its own data directory to the loader with every session
        paths[:] = list(dict.fromkeys(paths))
    return session


def is_transient(e: BaseException) -> bool:
    """An AWS error worth waiting out (throttling, a 5xx, a dropped connection), after botocore's own retries."""
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import ReadTimeoutError

    if isinstance(e, (BotoConnectionError, ReadTimeoutError, ConnectionError, TimeoutError)):
        return True
    if isinstance(e, ClientError):
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return error_code(e) in RETRYABLE_CODES or status >= 500
    return False


def error_code(e: BaseException) -> str | None:
    if isinstance(e, ClientError):
        return e.response.get("Error", {}).get("Code")
    return None


#: Callbacks given every new client of every AwsClients, after its own `on_client`: how tests reach the clients a
#: command makes for itself (to record its calls, or to answer them with failures moto cannot produce).
#: Empty outside tests.
CLIENT_HOOKS: list[Callable[[str, Any], None]] = []


class AwsClients:
    """boto3 clients for one AwsConfig, created once per service and shared.

    `on_client` callbacks get each new client (e.g. to register botocore event
    hooks that record or fail calls in tests).
    """

    def __init__(
        self,
        aws: AwsConfig,
        *,
        credentials: StaticCredentials | None = None,
        on_client: tuple[Callable[[str, Any], None], ...] = (),
    ):
        self.aws = aws
        kwargs: dict[str, Any] = {"region_name": aws.region}
        if credentials is not None:
            kwargs.update(
                aws_access_key_id=credentials.access_key_id,
                aws_secret_access_key=credentials.secret_access_key,
                aws_session_token=credentials.session_token,
            )
        self._session = _session(**kwargs)
        self._on_client = on_client
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._config = BotoConfig(
            region_name=aws.region,
            retries={"mode": "standard", "total_max_attempts": aws.max_retries + 1},
            connect_timeout=5,
            read_timeout=40,  # above SQS's longest long poll (20 s)
            max_pool_connections=20,
        )

    def client(self, service: str) -> Any:
        return self._client(service, self._config)

    def anonymous(self, service: str) -> Any:
        """A client that signs nothing, for what AWS publishes to everyone (the region's SSM agent package, which
        a stock boot reads with `--no-sign-request`): the same endpoint, retries and naming of calls."""
        return self._client(service, self._config.merge(BotoConfig(signature_version=UNSIGNED)), "anonymous ")

    def _client(self, service: str, config: BotoConfig, kind: str = "") -> Any:
        with self._lock:
            if kind + service not in self._clients:
                try:
                    if not self.aws.region:  # botocore would build an endpoint with an empty region in it
                        raise NoRegionError()
                    c = self._session.client(service, endpoint_url=self.aws.endpoint_url, config=config)
                except BotoCoreError as e:
                    stamp(e, AwsCall(service_label(service)))
                    raise
                name_calls(service, c)
                for hook in (*self._on_client, *CLIENT_HOOKS):
                    hook(service, c)
                self._clients[kind + service] = c
            return self._clients[kind + service]

    def has_credentials(self) -> bool:
        """Whether botocore finds any credentials (it looks without calling AWS; an IMDS lookup at most)."""
        return self._session.get_credentials() is not None
