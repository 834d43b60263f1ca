"""create_network: the run's VPC, private subnet, S3 endpoint and security group (or check the given subnet).

Output: $.network.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from lustrain_core import clients
from lustrain_core.aws_errors import translate_aws_errors
from lustrain_core.config import Settings
from lustrain_core.document import dumped
from lustrain_core.steps import network

logger = Logger(service="lustrain")


@translate_aws_errors()
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    made = network.create_network(
        event, ec2=clients.client("ec2"), ddb=clients.client("dynamodb"), settings=Settings.from_env()
    )
    result = dumped(made)
    logger.info("network ready", extra={"network": result})
    return result
