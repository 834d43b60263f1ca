"""check_quota: the capacity queue. Join the line for the run's instances, or be admitted when they fit the
SageMaker quota left (steps/queue.py). Output: $.quota (admitted, position, wait_seconds, the quota's numbers)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from lustrain_core import clients
from lustrain_core.aws_errors import translate_aws_errors
from lustrain_core.config import Settings
from lustrain_core.document import dumped
from lustrain_core.steps import queue

logger = Logger(service="lustrain")


@translate_aws_errors()
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    admission = queue.take_place(
        event,
        quotas=clients.client("service-quotas"),
        sagemaker=clients.client("sagemaker"),
        ddb=clients.client("dynamodb"),
        settings=Settings.from_env(),
    )
    result = dumped(admission)
    logger.info("admitted" if admission.admitted else "queued", extra={"quota": result})
    change = queue.change_of(event.get("quota"), admission)
    if change is not None:
        failed = queue.announce_change(
            clients.client("events"), str(event["job"]["job_id"]), change, admission
        )
        if failed:
            logger.warning("queue change not announced", extra={"change": change, "error": failed})
    return result
