"""sweep: on a schedule, tear down what runs of this stack left behind (stopped or crashed executions, teardowns
that gave up, orphans without a job record). Returns and logs {swept, kept, skipped}.

The EventBridge Scheduled Event carries nothing the sweep needs (it reads the account's tagged resources), so an
invocation by hand with any event, `{}` included, sweeps the same way.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from lustrain_core import clients
from lustrain_core.aws_errors import translate_aws_errors
from lustrain_core.config import Settings
from lustrain_core.steps import sweep, teardown

logger = Logger(service="lustrain")


@translate_aws_errors()
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    settings = Settings.from_env()
    result = sweep.sweep(
        ec2=clients.client("ec2"),
        fsx=clients.client("fsx"),
        sagemaker=clients.client("sagemaker"),
        sfn=clients.client("stepfunctions"),
        ddb=clients.client("dynamodb"),
        iam=clients.client("iam"),
        settings=settings,
        clock=teardown.clock_for(context, settings),
    )
    logger.info(
        "sweep done",
        extra={"sweep": result, "swept": len(result["swept"]), "skipped": len(result["skipped"])},
    )
    return result
