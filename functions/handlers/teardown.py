"""teardown: delete what the run created (file system, then network), keep what it must. Output: $.teardown.

Runs on success and from every Catch; raises TeardownIncomplete (retried by the state machine) while resources
are still draining when the function's time runs short.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from lustrain_core import clients
from lustrain_core.aws_errors import translate_aws_errors
from lustrain_core.config import Settings
from lustrain_core.steps import teardown

logger = Logger(service="lustrain")


@translate_aws_errors()
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    settings = Settings.from_env()
    result = teardown.teardown(
        event,
        ec2=clients.client("ec2"),
        fsx=clients.client("fsx"),
        ddb=clients.client("dynamodb"),
        sagemaker=clients.client("sagemaker"),
        settings=settings,
        clock=teardown.clock_for(context, settings),
    )
    logger.info("teardown done", extra={"teardown": result})
    return result
