"""notify: publish the run's outcome (error, archive, teardown, cost) to NOTIFY_TOPIC_ARN. Output: $.notify."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from lustrain_core import clients
from lustrain_core.aws_errors import translate_aws_errors
from lustrain_core.config import Settings
from lustrain_core.steps import notify

logger = Logger(service="lustrain")


@translate_aws_errors()
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    result = notify.notify(
        event, sns=clients.client("sns"), settings=Settings.from_env(), ddb=clients.client("dynamodb")
    )
    logger.info("outcome published", extra=result)
    return result
