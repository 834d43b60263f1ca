"""Transient AWS faults: the handler of a step gets ThrottlingException, or a 500 InternalError, from its next call.

`throttling` / `throttling-always` raise ThrottlingException (HTTP 400, what most services answer when they
throttle); `service-error` raises InternalError (HTTP 500, what S3, EC2 and others answer when they fail a
request). The hook wraps `botocore.client.BaseClient._make_api_call`, the one method every boto3 client's
operations go through, so it reaches clients created before the twin started (lustrain_core.clients caches
them). It raises before the request is built: nothing reaches moto, so the failed call has no side effect, and
botocore's own retries (which sit below this method) do not swallow it; the handler sees the error as it would
after AWS kept failing through every botocore retry, and Step Functions' Retry is what clears it.

`lost-create` is the other kind of 500: the step's first Create* call is made, and what it creates exists, but
the handler gets InternalError instead of the answer (`lost-create-subnet` and its kin: that one Create* call).
Every call is also noted as the twin's activity (activity.py), which waits go by. `timeout-mid-delete` is marked
here too, at the step's first Delete* call (faults.cut_short_at).
"""

from __future__ import annotations

import functools
from typing import Any

from botocore.client import BaseClient
from botocore.exceptions import ClientError

from lustrain.twin import activity, faults

_PATCHED = "_lustrain_twin_throttling"


def _client_error(operation_name: str, code: str, message: str, status: int) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status, "RequestId": f"lustrain-twin-{code}"},
        },
        operation_name,
    )


def throttling_error(operation_name: str) -> ClientError:
    return _client_error(operation_name, "ThrottlingException", "Rate exceeded", 400)


def service_error(operation_name: str) -> ClientError:
    return _client_error(
        operation_name, "InternalError", "We encountered an internal error. Please try again.", 500
    )


def install() -> None:
    original = BaseClient._make_api_call
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def make_api_call(self: BaseClient, operation_name: str, api_params: dict[str, Any]) -> Any:
        activity.note()
        step = faults.current_step()
        if step is not None:
            if faults.consume_throttling(step):
                raise throttling_error(operation_name)
            if faults.consume(step, "service-error"):
                raise service_error(operation_name)
            if faults.consume_lost_create(step, operation_name):
                original(self, operation_name, api_params)
                raise service_error(operation_name)
            faults.cut_short_at(operation_name)
        return original(self, operation_name, api_params)

    setattr(make_api_call, _PATCHED, True)
    BaseClient._make_api_call = make_api_call
