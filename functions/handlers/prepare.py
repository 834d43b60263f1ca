"""prepare: one look at a data preparation run (kind: prepare): start its next stage's SageMaker Processing job or
read the running one (steps/prepare.look).

Input: the state document with $.job (register_job's, kind prepare), $.network, $.code and the previous look's
$.prepare. Output: $.prepare = {done, stage, status, wait_seconds}; stage is None once every stage Completed.
Raises PrepareFailed, with SageMaker's reason, for a stage that Failed or was Stopped.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from lustrain_core import clients
from lustrain_core.aws_errors import translate_aws_errors
from lustrain_core.config import Settings
from lustrain_core.steps import prepare

logger = Logger(service="lustrain")


@translate_aws_errors()
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    result = prepare.look(
        event,
        sagemaker=clients.client("sagemaker"),
        iam=clients.client("iam"),
        ddb=clients.client("dynamodb"),
        settings=Settings.from_env(),
    )
    logger.info("data preparation looked at", extra=result)
    return result
