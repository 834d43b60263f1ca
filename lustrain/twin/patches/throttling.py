"""The throttling fault: the handler of a step gets ThrottlingException from its next AWS call.

The hook wraps `botocore.client.BaseClient._make_api_call`, the one method every boto3 client's operations go
through, so it reaches clients created before the twin started (lustrain_core.clients caches them). It raises
before the request is built: nothing reaches moto, so the throttled call has no side effect, and botocore's own
retries (which sit below this method) do not swallow it; the handler sees the error as it would after AWS
kept throttling through every botocore retry, and Step Functions' Retry is what clears it.
"""

from __future__ import annotations

import functools
from typing import Any

from botocore.client import BaseClient
from botocore.exceptions import ClientError

from lustrain.twin import faults

_PATCHED = "_lustrain_twin_throttling"


def throttling_error(operation_name: str) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"},
            "ResponseMetadata": {"HTTPStatusCode": 400, "RequestId": "lustrain-twin-throttled"},
        },
        operation_name,
    )


def install() -> None:
    original = BaseClient._make_api_call
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def make_api_call(self: BaseClient, operation_name: str, api_params: dict[str, Any]) -> Any:
        step = faults.current_step()
        if step is not None and faults.consume_throttling(step):
            raise throttling_error(operation_name)
        return original(self, operation_name, api_params)

    setattr(make_api_call, _PATCHED, True)
    BaseClient._make_api_call = make_api_call
