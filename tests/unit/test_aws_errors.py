"""fleet.aws.errors: every kind of AWS failure becomes one line naming the call and what to do.

Errors are made as botocore makes them: a ClientError from an error response, botocore's own exceptions with
their keyword arguments. `name_calls` is checked on a real client whose calls a `before-send` hook answers (no
server: nothing leaves the process).
"""

from __future__ import annotations

import pytest
from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    PartialCredentialsError,
    ReadTimeoutError,
    UnknownEndpointError,
)

from fleet.aws.clients import AwsClients, StaticCredentials
from fleet.aws.errors import CREATE_ADVICE, AwsCall, Kind, aws_failure, one_line, stamp
from fleet.config.aws import AwsConfig


def client_error(
    code: str, operation: str, service: str | None, message: str = "", retries: int = 0, status: int = 400
) -> ClientError:
    meta = {"HTTPStatusCode": status, "RetryAttempts": retries}
    if service:
        meta["ServiceId"] = service
    return ClientError({"Error": {"Code": code, "Message": message}, "ResponseMetadata": meta}, operation)


CODES = [
    ("ExpiredToken", Kind.BAD_CREDENTIALS, "AWS credentials expired"),
    ("ExpiredTokenException", Kind.BAD_CREDENTIALS, "AWS credentials expired"),
    ("InvalidClientTokenId", Kind.BAD_CREDENTIALS, "AWS credentials not valid"),
    ("UnrecognizedClientException", Kind.BAD_CREDENTIALS, "AWS credentials not valid"),
    ("SignatureDoesNotMatch", Kind.BAD_CREDENTIALS, "AWS credentials not valid"),
    ("AuthFailure", Kind.BAD_CREDENTIALS, "AWS credentials not valid"),
    ("AccessDenied", Kind.ACCESS_DENIED, "access denied to dynamodb:Query"),
    ("AccessDeniedException", Kind.ACCESS_DENIED, "access denied to dynamodb:Query"),
    ("UnauthorizedOperation", Kind.ACCESS_DENIED, "access denied to dynamodb:Query"),
    ("Throttling", Kind.THROTTLED, "AWS throttled the call after 3 retries"),
    ("ThrottlingException", Kind.THROTTLED, "AWS throttled the call after 3 retries"),
    ("ProvisionedThroughputExceededException", Kind.THROTTLED, "AWS throttled the call after 3 retries"),
    ("RequestLimitExceeded", Kind.THROTTLED, "AWS throttled the call after 3 retries"),
    ("SlowDown", Kind.THROTTLED, "AWS throttled the call after 3 retries"),
    ("ResourceNotFoundException", Kind.MISSING, "the DynamoDB table does not exist"),
    ("ValidationException", Kind.REFUSED, "AWS refused the call"),
]


@pytest.mark.parametrize("code,kind,problem", CODES)
def test_each_error_code_is_one_line_naming_the_call(code, kind, problem):
    failure = aws_failure(client_error(code, "Query", "DynamoDB", retries=3))
    assert failure is not None and failure.kind is kind
    line = failure.line()
    assert line.startswith(problem) and f"(DynamoDB Query, {code})" in line
    assert "\n" not in line


def test_access_denied_names_the_action_and_resource_the_message_names():
    msg = (
        "User: arn:aws:sts::123456789012:assumed-role/ops/me is not authorized to perform: dynamodb:Query on "
        "resource: arn:aws:dynamodb:ap-northeast-2:123456789012:table/T because no identity-based policy allows "
        "the dynamodb:Query action"
    )
    line = one_line(client_error("AccessDeniedException", "Query", "DynamoDB", msg))
    assert line.startswith("access denied to dynamodb:Query on arn:aws:dynamodb:ap-northeast-2:123456789012:table/T")
    assert "allow dynamodb:Query in the IAM policy" in line


@pytest.mark.parametrize(
    "service,operation,code,action",
    [
        ("S3", "HeadBucket", "403", "s3:ListBucket"),  # a HEAD has no body: S3's code is the status
        ("S3", "HeadObject", "Forbidden", "s3:GetObject"),
        ("SQS", "SendMessageBatch", "AccessDenied", "sqs:SendMessage"),
        ("EFS", "DescribeFileSystems", "AccessDeniedException", "elasticfilesystem:DescribeFileSystems"),
        ("EC2", "RunInstances", "UnauthorizedOperation", "ec2:RunInstances"),
    ],
)
def test_access_denied_without_a_message_names_the_action_the_call_needs(service, operation, code, action):
    failure = aws_failure(client_error(code, operation, service, status=403))
    assert failure.kind is Kind.ACCESS_DENIED and failure.line().startswith(f"access denied to {action} (")


@pytest.mark.parametrize(
    "service,operation,code,what",
    [
        ("DynamoDB", "DescribeTable", "ResourceNotFoundException", "the DynamoDB table"),
        ("SQS", "GetQueueUrl", "AWS.SimpleQueueService.NonExistentQueue", "the SQS queue"),
        ("SQS", "GetQueueUrl", "QueueDoesNotExist", "the SQS queue"),
        ("S3", "PutObject", "NoSuchBucket", "the S3 bucket"),
        ("S3", "HeadBucket", "404", "the S3 bucket"),
    ],
)
def test_a_missing_resource_says_how_to_create_it(service, operation, code, what):
    failure = aws_failure(client_error(code, operation, service, status=404))
    assert failure.kind is Kind.MISSING
    assert failure.line().startswith(f"{what} does not exist") and failure.line().endswith(
        f"{CREATE_ADVICE} (its name is in the config's aws: section)"
    )


def test_a_not_found_of_another_service_is_not_a_missing_fleet_resource():
    failure = aws_failure(client_error("ResourceNotFoundException", "GetFunction", "Lambda", "Function not found"))
    assert failure.kind is Kind.REFUSED and CREATE_ADVICE not in failure.line()
    assert failure.line() == "AWS refused the call (Lambda GetFunction, ResourceNotFoundException): Function not found"


def test_a_head_without_details_says_so():
    failure = aws_failure(client_error("400", "HeadBucket", "S3", status=400))
    assert failure.kind is Kind.REFUSED and "HTTP 400 without details" in failure.line()


def stamped(e: Exception, call: AwsCall) -> Exception:
    stamp(e, call)
    return e


SDK_ERRORS = [
    (NoCredentialsError(), Kind.NO_CREDENTIALS, "no AWS credentials (DynamoDB DescribeTable): configure a profile"),
    (
        PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY"),
        Kind.NO_CREDENTIALS,
        "incomplete AWS credentials",
    ),
    (NoRegionError(), Kind.NO_REGION, "no AWS region (DynamoDB DescribeTable): set aws.region"),
    (
        UnknownEndpointError(service_name="ssm", region_name="xx-nowhere-1"),
        Kind.NO_REGION,
        "no endpoint for DynamoDB in region xx-nowhere-1",
    ),
    (
        EndpointConnectionError(endpoint_url="http://127.0.0.1:9/", error=ConnectionRefusedError(111, "refused")),
        Kind.NO_ANSWER,
        "cannot reach http://127.0.0.1:9 (DynamoDB DescribeTable): check the network",
    ),
    (
        ConnectTimeoutError(endpoint_url="https://dynamodb.ap-northeast-2.amazonaws.com/"),
        Kind.NO_ANSWER,
        "no connection in time to https://dynamodb.ap-northeast-2.amazonaws.com (DynamoDB DescribeTable)",
    ),
    (ReadTimeoutError(endpoint_url="http://127.0.0.1:9/"), Kind.NO_ANSWER, "no answer in time from"),
    (
        ParamValidationError(report="Invalid type for parameter TableName"),
        Kind.FAILED,
        "the AWS call failed (ParamValidationError)",
    ),
]


@pytest.mark.parametrize(
    "error,kind,start", SDK_ERRORS, ids=lambda x: type(x).__name__ if isinstance(x, Exception) else None
)
def test_botocores_own_errors_name_the_call_they_were_stamped_with(error, kind, start):
    failure = aws_failure(stamped(error, AwsCall("DynamoDB", "DescribeTable")))
    assert failure.kind is kind and failure.line().startswith(start), failure.line()


def test_an_endpoint_name_that_does_not_resolve_is_a_region_without_the_service():
    class NameResolutionError(Exception):  # urllib3's, by name: botocore keeps it as the error's `error`
        pass

    dns = NameResolutionError("Failed to resolve 'ssm.xx-nowhere-1.amazonaws.com'")
    aws_host = EndpointConnectionError(endpoint_url="https://ssm.xx-nowhere-1.amazonaws.com/", error=dns)
    failure = aws_failure(stamped(aws_host, AwsCall("SSM", "GetParameter")))
    assert failure.kind is Kind.NO_REGION
    assert failure.line().startswith(
        "ssm.xx-nowhere-1.amazonaws.com does not resolve (SSM GetParameter): check aws.region"
    )
    own_host = EndpointConnectionError(endpoint_url="http://moto.invalid:5000/", error=dns)
    assert aws_failure(own_host).kind is Kind.NO_ANSWER


def test_an_upload_failure_is_the_client_error_it_wraps():
    try:
        try:
            raise client_error("AccessDenied", "PutObject", "S3", status=403)
        except ClientError as e:
            # as boto3 raises it: chained only implicitly, by being raised while handling the ClientError
            raise S3UploadFailedError(f"Failed to upload dist/b.tgz to b/k: {e}")  # noqa: B904
    except S3UploadFailedError as wrapped:
        assert one_line(wrapped).startswith("access denied to s3:PutObject (S3 PutObject, AccessDenied)")


def test_other_errors_are_not_aws_failures_even_when_raised_while_handling_one():
    assert aws_failure(ValueError("x")) is None
    try:
        try:
            raise client_error("AccessDenied", "Query", "DynamoDB")
        except ClientError:
            raise KeyError("a bug in the handler")  # noqa: B904 - the implicit chaining is what is tested
    except KeyError as e:
        assert aws_failure(e) is None


def test_an_unstamped_client_error_still_names_its_operation():
    assert "(AWS Query, ThrottlingException)" in one_line(client_error("ThrottlingException", "Query", None))


class _Raw:
    def __init__(self, body: bytes):
        self.body = body

    def stream(self, **_):
        yield self.body


def test_clients_stamp_the_service_and_operation_on_every_error():
    """A real client of AwsClients; a `before-send` hook answers in place of a server, as the protocol would."""
    from botocore.awsrequest import AWSResponse

    def serve(service, client):
        def answer(request, **_):
            if "GetQueueUrl" in request.headers.get("X-Amz-Target", b"").decode():
                body = (
                    b'{"__type":"com.amazonaws.sqs#QueueDoesNotExist","message":"The specified queue does not exist."}'
                )
                return AWSResponse(request.url, 400, {"Content-Type": "application/x-amz-json-1.0"}, _Raw(body))
            raise ConnectTimeoutError(endpoint_url=request.url)

        client.meta.events.register(f"before-send.{service}", answer)

    aws = AwsConfig(endpoint_url="http://127.0.0.1:9", max_retries=0)
    clients = AwsClients(aws, credentials=StaticCredentials("k", "s"), on_client=(serve,))
    with pytest.raises(ClientError) as answered:
        clients.client("sqs").get_queue_url(QueueName="q")
    assert aws_failure(answered.value).call == AwsCall("SQS", "GetQueueUrl")
    assert aws_failure(answered.value).kind is Kind.MISSING
    with pytest.raises(ConnectTimeoutError) as unanswered:
        clients.client("dynamodb").describe_table(TableName="t")
    assert aws_failure(unanswered.value).call == AwsCall("DynamoDB", "DescribeTable")


def no_credentials(monkeypatch, tmp_path) -> None:
    """An environment in which botocore finds no credentials (and asks no instance metadata service)."""
    import os

    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_a_call_without_credentials_is_named_though_nothing_was_sent(monkeypatch, tmp_path):
    no_credentials(monkeypatch, tmp_path)
    clients = AwsClients(AwsConfig(endpoint_url="http://127.0.0.1:9", max_retries=0))
    assert not clients.has_credentials()
    with pytest.raises(NoCredentialsError) as e:
        clients.client("ssm").get_parameter(Name="/aws/service/debian/release/12/latest/amd64")
    assert one_line(e.value) == (
        "no AWS credentials (SSM GetParameter): configure a profile (`aws configure`, or "
        "AWS_PROFILE), the environment variables AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
        "or an instance role"
    )


def test_a_client_that_cannot_be_made_names_its_service():
    # The config refuses an empty aws.region as it loads; built without its checks, the clients still say it.
    clients = AwsClients(AwsConfig.model_construct(region=""), credentials=StaticCredentials("k", "s"))
    with pytest.raises(NoRegionError) as e:
        clients.client("dynamodb")
    assert one_line(e.value) == "no AWS region (DynamoDB): set aws.region in the config"


def test_throttling_is_named_once_botocores_retries_are_spent():
    """A `before-send` hook answers every DescribeTable with DynamoDB's ThrottlingException, as AWS would: botocore
    retries it (aws.max_retries: 1), gives up, and the line says how often it tried."""
    from botocore.awsrequest import AWSResponse

    sent = []

    def throttle(service, client):
        def answer(request, **_):
            sent.append(request.url)
            body = b'{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"Rate exceeded"}'
            return AWSResponse(request.url, 400, {"Content-Type": "application/x-amz-json-1.0"}, _Raw(body))

        client.meta.events.register(f"before-send.{service}", answer)

    clients = AwsClients(
        AwsConfig(endpoint_url="http://127.0.0.1:9", max_retries=1),
        credentials=StaticCredentials("k", "s"),
        on_client=(throttle,),
    )
    with pytest.raises(ClientError) as e:
        clients.client("dynamodb").describe_table(TableName="t")
    assert len(sent) == 2
    assert one_line(e.value) == (
        "AWS throttled the call after 1 retry (DynamoDB DescribeTable, ThrottlingException): "
        "try again in a minute, or raise aws.max_retries"
    )
