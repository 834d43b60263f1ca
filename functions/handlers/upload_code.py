"""upload_code: pack code.source into sourcedir.tar.gz, stored once per content hash. Output: $.code.

Runs in parallel with the file system's creation; raises SpecInvalid when code.entry_point is not in the code or
its metric_definitions.json breaks SageMaker's limits.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from lustrain_core import clients
from lustrain_core.aws_errors import translate_aws_errors
from lustrain_core.config import Settings
from lustrain_core.document import dumped
from lustrain_core.steps import code

logger = Logger(service="lustrain")


@translate_aws_errors()
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    result = dumped(code.upload_code(event, s3=clients.client("s3"), settings=Settings.from_env()))
    logger.info(
        "code bundled",
        extra={k: result[k] for k in ("submit_directory", "uploaded", "files", "bytes")},
    )
    return result
