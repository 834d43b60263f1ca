"""on_execution_end: an execution of the state machine ended ABORTED, TIMED_OUT or FAILED (EventBridge's "Step
Functions Execution Status Change"): once DescribeExecution confirms the end, for the stack's own state machine,
tear its run down now, since no Catch ran (steps/execution_end.py).

Returns and logs what was done; raises TeardownIncomplete while resources still drain (Lambda retries the event,
the sweeper is the backstop).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from lustrain_core import clients
from lustrain_core.aws_errors import translate_aws_errors
from lustrain_core.config import Settings
from lustrain_core.steps import execution_end, teardown

logger = Logger(service="lustrain")


@translate_aws_errors()
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    settings = Settings.from_env()
    result = execution_end.on_execution_end(
        event,
        sfn=clients.client("stepfunctions"),
        ec2=clients.client("ec2"),
        fsx=clients.client("fsx"),
        sagemaker=clients.client("sagemaker"),
        ddb=clients.client("dynamodb"),
        sns=clients.client("sns"),
        settings=settings,
        clock=teardown.clock_for(context, settings),
    )
    logger.info("execution end handled", extra={"execution_end": result})
    return result
