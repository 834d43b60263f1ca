"""check_filesystem: one turn of the poll loop on the run's file system and its S3 links. Output: $.filesystem.

Reads the poll settings from $.poll ({initial_seconds, max_seconds, max_polls}) and returns the next wait. With
data.preload it then starts and watches the warm-up job (lustrain_core.steps.preload): lifecycle PRELOADING.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from lustrain_core import clients
from lustrain_core.aws_errors import translate_aws_errors
from lustrain_core.config import Settings
from lustrain_core.document import dumped
from lustrain_core.steps import filesystem

logger = Logger(service="lustrain")


@translate_aws_errors()
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    made = filesystem.check_filesystem(
        event,
        fsx=clients.client("fsx"),
        ddb=clients.client("dynamodb"),
        settings=Settings.from_env(),
        sagemaker=clients.client("sagemaker"),
        sts=clients.client("sts"),
    )
    result = dumped(made)
    logger.info("file system checked", extra={"filesystem": result})
    return result
