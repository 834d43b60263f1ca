"""on_training_event: EventBridge's "SageMaker Training Job State Change" -> heartbeat, or archive and call back.

Events of jobs this stack did not start are ignored; repeated events archive once and call back once. What is done
follows DescribeTrainingJob, for the run's current attempt only: a forged or replayed event changes nothing.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from lustrain_core import clients
from lustrain_core.aws_errors import translate_aws_errors
from lustrain_core.config import Settings
from lustrain_core.steps import events

logger = Logger(service="lustrain")


@translate_aws_errors()
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    change = events.parse_state_change(event)
    result = events.on_training_event(
        change,
        sfn=clients.client("stepfunctions"),
        ddb=clients.client("dynamodb"),
        s3=clients.client("s3"),
        sagemaker=clients.client("sagemaker"),
        settings=Settings.from_env(),
    )
    logger.info("training job state change handled", extra={"event": result})
    return result
