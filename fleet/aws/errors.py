"""One line for an AWS failure: what went wrong, in which call, and what to do about it.

`aws_failure(e)` is a pure function from an exception to an `AwsFailure` (None when the
exception is not an AWS one). The command line's outer edge (`cli.main.main`) prints its
`line()` instead of a traceback, and the dry run uses it for the reason a question to AWS got
no answer, so every command words a failure the same way.

botocore names the operation of a `ClientError` but not the service, and names neither on
its own exceptions (no credentials, no connection). `name_calls`, registered by `AwsClients`
on every client it makes, leaves both on the error as it leaves the client: on the
response metadata of an error AWS answered, and on the exception otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any
from urllib.parse import urlsplit

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    CredentialRetrievalError,
    EndpointConnectionError,
    EndpointResolutionError,
    InvalidRegionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
    ReadTimeoutError,
    TokenRetrievalError,
    UnknownEndpointError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

#: What to do about a missing table, queue or bucket (also the advice of cli.envs.aws's preflight).
CREATE_ADVICE = "run `gridfleet aws bootstrap` or apply infra/terraform"

CREDENTIALS_ADVICE = (
    "configure a profile (`aws configure`, or AWS_PROFILE), the environment variables "
    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or an instance role"
)


class Kind(Enum):
    NO_CREDENTIALS = "no credentials"  # none found: nothing was sent
    BAD_CREDENTIALS = "bad credentials"  # expired or not valid: every call fails alike
    ACCESS_DENIED = "access denied"  # the identity lacks an IAM action
    NO_ANSWER = "no answer"  # the endpoint refused the connection or timed out
    NO_REGION = "no region"  # no region, or the service has no endpoint in it
    THROTTLED = "throttled"  # still throttled when botocore's retries were spent
    MISSING = "missing"  # the fleet's table, queue or bucket does not exist
    REFUSED = "refused"  # any other error AWS answered
    FAILED = "failed"  # any other failure of the SDK


@dataclass(frozen=True)
class AwsCall:
    service: str  # botocore's service id, as AWS writes it: "DynamoDB", "SQS", "S3", "SSM", "EC2", "IAM"
    operation: str | None = None  # "Query"; None when the client itself could not be made

    def __str__(self) -> str:
        return f"{self.service} {self.operation}" if self.operation else self.service

    @property
    def action(self) -> str | None:
        """The IAM action this call needs (most are `<service>:<operation>`)."""
        if not self.operation:
            return None
        prefix = self.service.lower().replace(" ", "-")
        return _ACTIONS.get((prefix, self.operation)) or f"{_PREFIXES.get(prefix, prefix)}:{self.operation}"


#: Calls gridfleet makes that IAM authorizes under another action.
_ACTIONS = {
    ("s3", "HeadBucket"): "s3:ListBucket",
    ("s3", "HeadObject"): "s3:GetObject",
    ("s3", "ListObjectsV2"): "s3:ListBucket",
    ("sqs", "SendMessageBatch"): "sqs:SendMessage",
    ("sqs", "DeleteMessageBatch"): "sqs:DeleteMessage",
    ("sqs", "ChangeMessageVisibilityBatch"): "sqs:ChangeMessageVisibility",
}
_PREFIXES = {"efs": "elasticfilesystem", "cloudwatch-logs": "logs", "service-quotas": "servicequotas"}


@dataclass(frozen=True)
class AwsFailure:
    kind: Kind
    problem: str  # what went wrong, e.g. "no AWS credentials"
    advice: str  # what to do
    call: AwsCall | None = None
    code: str | None = None  # AWS's error code, when AWS answered

    def line(self) -> str:
        where = ", ".join(str(x) for x in (self.call, self.code) if x)
        return f"{self.problem}{f' ({where})' if where else ''}: {self.advice}"


_EXPIRED = frozenset({"ExpiredToken", "ExpiredTokenException", "RequestExpired", "TokenRefreshRequired"})
_INVALID = frozenset(
    {
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "AuthFailure",
        "InvalidAccessKeyId",
        "InvalidToken",
        "IncompleteSignature",
        "MissingAuthenticationToken",
    }
)
_DENIED = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "Forbidden", "403"})
_THROTTLED = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "SlowDown",
        "TooManyRequestsException",
        "RequestThrottled",
        "RequestThrottledException",
    }
)
#: Error codes of a missing table, queue or bucket, by the service that answers them.
_MISSING = {
    "DynamoDB": frozenset({"ResourceNotFoundException"}),
    "SQS": frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}),
    "S3": frozenset({"NoSuchBucket"}),
}
_MISSING_WHAT = {"DynamoDB": "the DynamoDB table", "SQS": "the SQS queue", "S3": "the S3 bucket"}
_NOT_AUTHORIZED_RE = re.compile(r"not authorized to perform:?\s*([\w-]+:[\w*-]+)(?:\s+on resource:?\s*(\S+))?")

#: Where `name_calls` leaves the call on an error: the attribute of an exception, the key of an error response's
#: metadata (a ClientError is made from that response after the hooks have run).
_CALL_ATTR = "aws_call"
_SERVICE_KEY = "ServiceId"


def name_calls(service: str, client: Any) -> None:
    """Make the errors of `client`'s calls say which call they come from (see the module's docstring)."""
    label = str(client.meta.service_model.service_id)

    def answered(http_response: Any, parsed: Any, **_: Any) -> None:
        if http_response is not None and http_response.status_code >= 300 and isinstance(parsed, dict):
            parsed.setdefault("ResponseMetadata", {})[_SERVICE_KEY] = label

    def failed(exception: BaseException, event_name: str, **_: Any) -> None:
        stamp(exception, AwsCall(label, event_name.rsplit(".", 1)[-1]))

    client.meta.events.register(f"after-call.{client.meta.service_model.service_id.hyphenize()}", answered)
    client.meta.events.register(f"after-call-error.{client.meta.service_model.service_id.hyphenize()}", failed)


def stamp(e: BaseException, call: AwsCall) -> None:
    """Note on `e` the call it comes from (unless a nearer one already did)."""
    if getattr(e, _CALL_ATTR, None) is None:
        setattr(e, _CALL_ATTR, call)


def service_label(service: str) -> str:
    """botocore's service id of a service name ("dynamodb" -> "DynamoDB"), read from its model."""
    import botocore.session  # on first use, as fleet.aws.clients does

    try:
        return str(botocore.session.get_session().get_service_model(service).service_id)
    except BotoCoreError:
        return service


def call_of(e: BaseException) -> AwsCall | None:
    call = getattr(e, _CALL_ATTR, None)
    if isinstance(call, AwsCall):
        return call
    if isinstance(e, ClientError):
        service = e.response.get("ResponseMetadata", {}).get(_SERVICE_KEY)
        return AwsCall(service or "AWS", e.operation_name)
    return None


def aws_failure(e: BaseException) -> AwsFailure | None:
    """The failure `e` is, or None when `e` is not an AWS error (nor one that boto3 wrapped)."""
    err = _unwrap(e)
    if isinstance(err, ClientError):
        return _answered(err, call_of(err))
    if isinstance(err, BotoCoreError):
        return _unanswered(err, call_of(err))
    return None


def one_line(e: BaseException) -> str | None:
    failure = aws_failure(e)
    return failure.line() if failure else None


def _unwrap(e: BaseException) -> BaseException | None:
    """`e`, or the AWS error a boto3 or s3transfer exception wraps (an upload's S3UploadFailedError)."""
    seen = 0
    while e is not None and seen < 5:
        if isinstance(e, (ClientError, BotoCoreError)):
            return e
        if not type(e).__module__.startswith(("boto3", "s3transfer")):
            return None
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
        seen += 1
    return None


def _answered(e: ClientError, call: AwsCall | None) -> AwsFailure:
    error = e.response.get("Error", {})
    code = str(error.get("Code") or "")
    message = str(error.get("Message") or "").strip()
    meta = e.response.get("ResponseMetadata", {})
    service = call.service if call else "AWS"

    def failure(kind: Kind, problem: str, advice: str) -> AwsFailure:
        return AwsFailure(kind, problem, advice, call, code or None)

    if code in _EXPIRED:
        return failure(
            Kind.BAD_CREDENTIALS,
            "AWS credentials expired",
            "renew them (`aws sso login`, a new session token, or new keys) and try again",
        )
    if code in _INVALID:
        return failure(
            Kind.BAD_CREDENTIALS,
            "AWS credentials not valid",
            "check the keys this process runs with (AWS_PROFILE, AWS_ACCESS_KEY_ID, ~/.aws/credentials) "
            "and this machine's clock",
        )
    if code in _DENIED:
        named = _NOT_AUTHORIZED_RE.search(message)
        action = named.group(1) if named else (call.action if call else None)
        on = f" on {named.group(2)}" if named and named.group(2) else ""
        return failure(
            Kind.ACCESS_DENIED,
            f"access denied{f' to {action}' if action else ''}{on}",
            f"allow {action or 'it'} in the IAM policy of the identity these credentials belong to "
            f"(infra/terraform's roles grant what each gridfleet program needs)",
        )
    if code in _THROTTLED:
        retries = meta.get("RetryAttempts")
        tries = f" after {retries} {'retry' if retries == 1 else 'retries'}" if retries else ""
        return failure(
            Kind.THROTTLED, f"AWS throttled the call{tries}", "try again in a minute, or raise aws.max_retries"
        )
    no_bucket = call is not None and call.operation == "HeadBucket" and code in ("404", "NotFound")
    if code in _MISSING.get(service, ()) or no_bucket:
        name = f" {error['BucketName']!r}" if error.get("BucketName") else ""
        return failure(
            Kind.MISSING,
            f"{_MISSING_WHAT[service]}{name} does not exist{f' ({message})' if message and not name else ''}",
            f"{CREATE_ADVICE} (its name is in the config's aws: section)",
        )
    status = meta.get("HTTPStatusCode")
    return failure(
        Kind.REFUSED,
        "AWS refused the call",
        message or f"HTTP {status} without details; run with -v for the whole error",
    )


def _unanswered(e: BotoCoreError, call: AwsCall | None) -> AwsFailure:
    def failure(kind: Kind, problem: str, advice: str) -> AwsFailure:
        return AwsFailure(kind, problem, advice, call)

    if isinstance(e, (NoCredentialsError, PartialCredentialsError)):
        problem = "no AWS credentials" if isinstance(e, NoCredentialsError) else f"incomplete AWS credentials ({e})"
        return failure(Kind.NO_CREDENTIALS, problem, CREDENTIALS_ADVICE)
    if isinstance(e, (CredentialRetrievalError, TokenRetrievalError)):
        return failure(
            Kind.BAD_CREDENTIALS,
            f"AWS credentials could not be loaded ({e})",
            "renew them (`aws sso login` for an SSO profile) and try again",
        )
    if isinstance(e, NoRegionError):
        return failure(Kind.NO_REGION, "no AWS region", "set aws.region in the config")
    if isinstance(e, UnknownEndpointError):
        region = e.kwargs.get("region_name")
        return failure(
            Kind.NO_REGION,
            f"no endpoint for {call.service if call else e.kwargs.get('service_name')} in region {region}",
            "set aws.region to a region that offers it",
        )
    if isinstance(e, (EndpointResolutionError, InvalidRegionError)):
        return failure(Kind.NO_REGION, f"no AWS endpoint can be made ({e})", "check aws.region")
    if isinstance(e, EndpointConnectionError) and _name_not_resolved(e):
        host = urlsplit(str(e.kwargs.get("endpoint_url") or "")).hostname or "the endpoint"
        if host.endswith((".amazonaws.com", ".amazonaws.com.cn")):
            return failure(
                Kind.NO_REGION,
                f"{host} does not resolve",
                "check aws.region (the service may not be offered in it) and this machine's DNS",
            )
        return failure(Kind.NO_ANSWER, f"{host} does not resolve", "check aws.endpoint_url and this machine's DNS")
    endpoint = _endpoint(e.kwargs.get("endpoint_url"))
    if isinstance(e, ReadTimeoutError):
        return failure(
            Kind.NO_ANSWER,
            f"no answer in time from {endpoint}",
            "check the network and aws.endpoint_url, then try again",
        )
    if isinstance(e, ConnectTimeoutError):
        return failure(
            Kind.NO_ANSWER,
            f"no connection in time to {endpoint}",
            "check the network (or proxy, or firewall) and aws.endpoint_url, then try again",
        )
    if isinstance(e, BotoConnectionError):  # refused, reset, closed
        return failure(
            Kind.NO_ANSWER,
            f"cannot reach {endpoint}",
            "check the network (or proxy) and aws.endpoint_url, then try again",
        )
    return failure(Kind.FAILED, f"the AWS call failed ({type(e).__name__})", f"{e}; run with -v for the whole error")


def _endpoint(url: Any) -> str:
    """The endpoint of a request URL (its scheme, host and port, without the bucket and key of an S3 call)."""
    parts = urlsplit(str(url or ""))
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else "the AWS endpoint"


def _name_not_resolved(e: EndpointConnectionError) -> bool:
    cause = e.kwargs.get("error")
    names = {type(c).__name__ for c in (cause, getattr(cause, "__cause__", None), getattr(cause, "__context__", None))}
    return "NameResolutionError" in names or "gaierror" in names or "Failed to resolve" in str(cause or "")
