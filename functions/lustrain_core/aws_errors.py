"""AWS's transient failures, renamed for the state machine: throttling -> AwsThrottled, 5xx -> AwsUnavailable.

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


def classify(exc: BaseException) -> LustrainError | None:
    """The retryable lustrain error for a transient AWS failure, or None when `exc` is not one."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
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
