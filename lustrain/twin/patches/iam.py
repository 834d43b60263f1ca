"""Where moto meets the twin's IAM: roles that services must be able to assume, and calls made as those roles.

- CreateFunction: Lambda refuses a role its trust policy does not let lambda.amazonaws.com assume
  (InvalidParameterValueException "The role defined for the function cannot be assumed by Lambda.", as AWS).
- The state machine's Task states call Lambda with the state machine's role, as Step Functions does: moto's
  interpreter builds its Lambda client with fixed keys; the twin gives it the credentials of a session of the
  execution role (Principal states.amazonaws.com must be trusted), so lambda:InvokeFunction is authorized
  against that role's policies like every other call.
- Every boto3 call signed with a role session's credentials is authorized (lustrain.twin.iam.enforce), bucket
  policies included. moto's own bucket-policy check is turned off: it treats a statement whose Condition does not
  hold as a Deny, so the stack's "deny unless TLS" statement refused every request.
"""

from __future__ import annotations

import functools
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from moto.awslambda.exceptions import InvalidParameterValueException
from moto.awslambda.models import LambdaBackend
from moto.iam.access_control import PermissionResult
from moto.s3.models import FakeBucket
from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils

from lustrain.twin.iam import enforce

_PATCHED = "_lustrain_twin_iam"
LAMBDA_SERVICE = "lambda.amazonaws.com"
STATES_SERVICE = "states.amazonaws.com"


def _create_function(original: Any, self: LambdaBackend, spec: dict[str, Any]) -> Any:
    role = str(spec.get("Role", ""))
    if not enforce.trust_allows(role, LAMBDA_SERVICE, source_account=self.account_id).allowed:
        raise InvalidParameterValueException("The role defined for the function cannot be assumed by Lambda.")
    return original(self, spec)


def _state_machine_client(original: Any, region: str, service: str, state_credentials: Any = None) -> Any:
    role_arn = getattr(state_credentials, "role_arn", None)
    client = original(region=region, service=service, state_credentials=state_credentials)
    if not role_arn:
        return client
    try:
        _, credentials = enforce.assume(str(role_arn), "lustrain-twin-states", service=STATES_SERVICE)
    except enforce.NotAssumable:
        raise ClientError(
            {
                "Error": {
                    "Code": "AccessDeniedException",
                    "Message": "Neither the global service principal states.amazonaws.com, nor the regional one "
                    f"is authorized to assume the provided role {role_arn}.",
                },
                "ResponseMetadata": {"HTTPStatusCode": 400},
            },
            "AssumeRole",
        ) from None
    return boto3.client(
        service,
        region_name=region,
        aws_access_key_id=credentials["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=credentials["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=credentials["AWS_SESSION_TOKEN"],
        endpoint_url=client.meta.endpoint_url if not _intercepting() else None,
        config=Config(parameter_validation=False, retries={"max_attempts": 0, "total_max_attempts": 1}),
    )


def _intercepting() -> bool:
    from moto.core.models import botocore_stubber

    return bool(botocore_stubber.enabled)


def _bucket_permission(self: FakeBucket, action: str, resource: str) -> PermissionResult:
    return PermissionResult.NEUTRAL


def install() -> None:
    if getattr(LambdaBackend, _PATCHED, False):
        return
    enforce.install()
    FakeBucket.get_permission = _bucket_permission  # type: ignore[method-assign]
    original_create = LambdaBackend.create_function

    @functools.wraps(original_create)
    def create_function(self: LambdaBackend, spec: dict[str, Any]) -> Any:
        return _create_function(original_create, self, spec)

    LambdaBackend.create_function = create_function  # type: ignore[method-assign]
    original_client = lambda_eval_utils.boto_client_for  # type: ignore[attr-defined]
    lambda_eval_utils.boto_client_for = functools.partial(  # type: ignore[attr-defined]
        _state_machine_client, original_client
    )
    setattr(LambdaBackend, _PATCHED, True)
