"""next_attempt: after a training attempt ended without a model, decide by the run policy whether another starts.

Input: the state document with $.failure (the training task's error and cause). Output: $.recovery (the attempts
so far, retry, wait_seconds, reason, spent_usd). lustrain_core.recovery holds the policy; steps/attempts.py applies it.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from lustrain_core import clients
from lustrain_core.aws_errors import translate_aws_errors
from lustrain_core.config import Settings
from lustrain_core.document import dumped
from lustrain_core.steps import attempts

logger = Logger(service="lustrain")


@translate_aws_errors()
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    decided = attempts.next_attempt(
        event,
        sagemaker=clients.client("sagemaker"),
        ddb=clients.client("dynamodb"),
        settings=Settings.from_env(),
        fsx=clients.client("fsx"),
    )
    result = dumped(decided)
    logger.info("next attempt decided", extra={"recovery": {k: v for k, v in result.items() if k != "attempts"}})
    return result
