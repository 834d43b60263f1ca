"""create_filesystem: the run's FSx for Lustre file system (or check the one to reuse). Output: $.filesystem."""

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
    made = filesystem.create_filesystem(
        event, fsx=clients.client("fsx"), ddb=clients.client("dynamodb"), settings=Settings.from_env()
    )
    result = dumped(made)
    logger.info("file system requested", extra={"filesystem": result})
    return result
