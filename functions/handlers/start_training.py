"""start_training: create the SageMaker training job and leave the task token for on_training_event to answer.

Invoked by `lambda:invoke.waitForTaskToken` with the state document plus "task_token"; returns at once with
{training_job_name, attempt} while the state machine waits for the job's end. Raises QuotaExceeded when SageMaker
answers ResourceLimitExceeded, and TrainingJobStillRunning rather than start a job beside a live one of the run; a
retried invocation adopts its attempt's job (steps/training.py).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from lustrain_core import clients
from lustrain_core.aws_errors import translate_aws_errors
from lustrain_core.config import Settings
from lustrain_core.steps import training

logger = Logger(service="lustrain")


@translate_aws_errors()
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    result = training.start_training(
        event,
        sagemaker=clients.client("sagemaker"),
        ddb=clients.client("dynamodb"),
        settings=Settings.from_env(),
        sts=clients.client("sts"),
    )
    logger.info("training job started", extra=result)
    return result
