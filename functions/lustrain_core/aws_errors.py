"""AWS's errors as the steps judge them: by code, in one place, never by a message's wording.

`error_code` reads a ClientError's code; `not_found` says whether it means the resource is gone, with the codes
each service documents (EC2's InvalidXxx.NotFound, FSx's FileSystemNotFound, S3's NoSuchBucket, ...);
`training_job_missing` says it of DescribeTrainingJob, where AWS answers a job that does not exist with
ValidationException "Requested resource not found." (not the ResourceNotFound its model lists).

AWS's transient failures are renamed for the state machine: throttling -> AwsThrottled, 5xx -> AwsUnavailable.

botocore's standard retry mode already retries both inside each call; what still escapes has outlasted those
retries, and Step Functions' Retry on AwsThrottled / AwsUnavailable (with backoff) is the next line. Every other
ClientError passes through untouched: it is a real answer (NotFound, AccessDenied, ...) for the step to judge.

Use it around a handler's body, as a decorator or a context manager:

    @translate_aws_errors()
    def handler(event, context): ...

    with translate_aws_errors():
        ...
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from lustrain_core.errors import AwsThrottled, AwsUnavailable, LustrainError

#: The error codes AWS services use to say "slow down" (EC2, S3, DynamoDB, FSx, SageMaker, ...).
THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "RequestThrottledException",
        "ProvisionedThroughputExceededException",
        "SlowDown",
    }
)

#: Codes that mean "the service failed this time", whatever the HTTP status says.
UNAVAILABLE_CODES = frozenset(
    {
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "InternalError",
        "InternalFailure",
        "InternalServerError",
        "InternalServerException",
        "InternalServiceError",
        "Unavailable",
    }
)


#: The codes that mean "no such resource", as each service's API reference lists them.
NOT_FOUND_CODES = frozenset(
    {
        # EC2 (EC2 API reference, "Error codes")
        "InvalidVpcID.NotFound",
        "InvalidSubnetID.NotFound",
        "InvalidGroup.NotFound",
        "InvalidRouteTableID.NotFound",
        "InvalidVpcEndpointId.NotFound",
        "InvalidAssociationID.NotFound",
        "InvalidNetworkInterfaceID.NotFound",
        # IAM (IAM API reference, GetRole: NoSuchEntity)
        "NoSuchEntity",
        # FSx
        "FileSystemNotFound",
        "DataRepositoryAssociationNotFound",
        "DataRepositoryTaskNotFound",
        # S3 (a HEAD request has no body: its code is the HTTP status)
        "NoSuchBucket",
        "NoSuchKey",
        "NoSuchVersion",
        "404",
        "NotFound",
        # SageMaker, Step Functions, DynamoDB, Service Quotas
        "ResourceNotFound",
        "ResourceNotFoundException",
        "ExecutionDoesNotExist",
        "StateMachineDoesNotExist",
        "NoSuchResourceException",
    }
)
CONDITION_FAILED = "ConditionalCheckFailedException"
#: The codes a refused authorization comes back with (S3, EC2, SNS, the JSON services).
ACCESS_DENIED_CODES = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthorizationError"})
QUOTA_REFUSED = "ResourceLimitExceeded"


def error_code(exc: ClientError) -> str:
    """The error's code, as the service sent it."""
    return str(exc.response.get("Error", {}).get("Code", ""))


def explained(exc: ClientError) -> str:
    """The code, and for a refusal AWS's message (which names the action and the resource): for an error a person
    reads."""
    code = error_code(exc)
    message = str(exc.response.get("Error", {}).get("Message", ""))
    return f"{code}: {message}" if code in ACCESS_DENIED_CODES and message else code


def not_found(exc: ClientError) -> bool:
    """Whether the error says the resource does not exist."""
    return error_code(exc) in NOT_FOUND_CODES


def training_job_missing(exc: ClientError) -> bool:
    """Whether DescribeTrainingJob's error says there is no such job. AWS answers ValidationException "Requested
    resource not found."; the only other ValidationException it gives is for a name outside the pattern, which the
    names lustrain builds never are."""
    code = error_code(exc)
    return code in NOT_FOUND_CODES or (
        code == "ValidationException" and exc.operation_name in ("DescribeTrainingJob", "DescribeProcessingJob")
    )


def classify(exc: BaseException) -> LustrainError | None:
    """The retryable lustrain error for a transient AWS failure, or None when `exc` is not one."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = error_code(exc)
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        message = f"{exc.operation_name}: {code or status} {error.get('Message', '')}".rstrip()
        if code in THROTTLING_CODES or status == 429:
            return AwsThrottled(message, operation=exc.operation_name, code=code)
        if code in UNAVAILABLE_CODES or status >= 500:
            return AwsUnavailable(message, operation=exc.operation_name, code=code, status=status)
        return None
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        # no answer from AWS at all (endpoint unreachable, connect/read timeout, connection reset): as transient as a 503
        return AwsUnavailable(f"could not reach AWS: {exc}", code=type(exc).__name__)
    return None


@contextmanager
def translate_aws_errors() -> Iterator[None]:
    """Re-raise AWS throttling as AwsThrottled and AWS 5xx / broken connections as AwsUnavailable."""
    try:
        yield
    except (ClientError, BotoConnectionError, HTTPClientError) as exc:
        translated = classify(exc)
        if translated is None:
            raise
        raise translated from exc
