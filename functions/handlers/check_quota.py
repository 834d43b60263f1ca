"""check_quota: is there room in the account's SageMaker quota for the run's instances? Output: $.quota."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from lustrain_core import clients
from lustrain_core.aws_errors import translate_aws_errors
from lustrain_core.config import Settings
from lustrain_core.steps import quota

logger = Logger(service="lustrain")


@translate_aws_errors()
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    result = quota.check_quota(
        event,
        quotas=clients.client("service-quotas"),
        sagemaker=clients.client("sagemaker"),
        settings=Settings.from_env(),
    )
    logger.info("quota checked", extra={"quota": result})
    return result
