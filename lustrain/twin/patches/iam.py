"""Where moto meets the twin's IAM: roles that services must be able to assume, and calls made as those roles.

- CreateFunction: Lambda refuses a role its trust policy does not let lambda.amazonaws.com assume
  (InvalidParameterValueException "The role defined for the function cannot be assumed by Lambda.", as AWS).
- The state machine's Task states call Lambda with the state machine's role, as Step Functions does: moto's
  interpreter builds its Lambda client with fixed keys; the twin gives it the credentials of a session of the
  execution role (Principal states.amazonaws.com must be trusted), so lambda:InvokeFunction is authorized
  against that role's policies like every other call.
- sts:AssumeRole called by a role session (a function assuming another role, with session tags): the target
  role's trust policy must let the caller's role assume it, and with Tags also allow sts:TagSession (IAM User
  Guide, "Passing session tags in AWS STS"); else AccessDenied with AWS's wording. The credentials answered are
  the twin's, of a session that carries the tags (aws:PrincipalTag/<key>), so the calls made with them are
  authorized as that session. A caller that is not a role session (the person running the twin) gets moto's.
- Every boto3 call signed with a role session's credentials is authorized (lustrain.twin.iam.enforce), bucket
  policies included. moto's own bucket-policy check is turned off: it treats a statement whose Condition does not
  hold as a Deny, so the stack's "deny unless TLS" statement refused every request.
"""

from __future__ import annotations

import functools
import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from moto.awslambda.exceptions import InvalidParameterValueException
from moto.awslambda.models import LambdaBackend
from moto.core.responses import ActionResult
from moto.iam.access_control import PermissionResult
from moto.s3.models import FakeBucket
from moto.settings import moto_server_port
from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils
from moto.sts.exceptions import STSClientError
from moto.sts.responses import TokenResponse

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
    if not role_arn:
        return original(region=region, service=service, state_credentials=state_credentials)
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
    # moto's own client for a task (boto_client_for) reaches its server, where it does not intercept calls
    endpoint = None if _intercepting() else f"http://localhost:{moto_server_port()}"
    return _role_client(
        service,
        region,
        endpoint,
        credentials["AWS_ACCESS_KEY_ID"],
        credentials["AWS_SECRET_ACCESS_KEY"],
        credentials["AWS_SESSION_TOKEN"],
    )


@functools.lru_cache(maxsize=256)
def _role_client(
    service: str, region: str, endpoint: str | None, access_key: str, secret_key: str, token: str
) -> Any:
    """A task's client, signing as the state machine's role session: the trust policy is asked at every task
    (above), and a role session's keys are the same each time (enforce's identities), so its client is made once
    rather than at every task (two clients per task were a tenth of a run's CPU on the twin)."""
    return boto3.client(
        service,
        region_name=region,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        aws_session_token=token,
        endpoint_url=endpoint,
        config=Config(parameter_validation=False, retries={"max_attempts": 0, "total_max_attempts": 1}),
    )


def _intercepting() -> bool:
    from moto.core.models import botocore_stubber

    return bool(botocore_stubber.enabled)


def _session_tags(params: dict[str, Any]) -> dict[str, str]:
    tags = params.get("Tags") or []
    if isinstance(tags, dict):  # the query protocol's member list, as moto may hand it over
        tags = tags.get("member") or []
    return {str(tag["Key"]): str(tag["Value"]) for tag in tags}


def _assume_role(original: Any, self: TokenResponse) -> Any:
    caller = enforce.principal_of(self.get_access_key())
    if caller is None:
        return original(self)
    params = self._get_params()
    role_arn = str(params.get("RoleArn", ""))
    session = str(params.get("RoleSessionName", ""))
    tags = _session_tags(params)
    try:
        principal, credentials = enforce.assume(
            role_arn, session, service="sts", session_tags=tags, caller=caller
        )
    except (enforce.NotAssumable, ValueError):
        untagged = enforce.trust_allows(role_arn, "sts", caller=caller).allowed
        action = "sts:TagSession" if tags and untagged else "sts:AssumeRole"
        raise STSClientError(
            "AccessDenied",
            f"User: {caller.arn} is not authorized to perform: {action} on resource: {role_arn}",
        ) from None
    role_id = hashlib.sha256(role_arn.encode()).hexdigest()[:17].upper()
    return ActionResult(
        {
            "Credentials": {
                "AccessKeyId": credentials["AWS_ACCESS_KEY_ID"],
                "SecretAccessKey": credentials["AWS_SECRET_ACCESS_KEY"],
                "SessionToken": credentials["AWS_SESSION_TOKEN"],
                "Expiration": datetime.now(UTC)
                + timedelta(seconds=int(params.get("DurationSeconds") or 3600)),
            },
            "AssumedRoleUser": {"AssumedRoleId": f"AROA{role_id}:{session}", "Arn": principal.arn},
            "PackedPolicySize": len(tags),
        }
    )


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
    original_assume = TokenResponse.assume_role

    @functools.wraps(original_assume)
    def assume_role(self: TokenResponse) -> Any:
        return _assume_role(original_assume, self)

    TokenResponse.assume_role = assume_role  # type: ignore[method-assign]
    original_client = lambda_eval_utils.boto_client_for  # type: ignore[attr-defined]
    lambda_eval_utils.boto_client_for = functools.partial(  # type: ignore[attr-defined]
        _state_machine_client, original_client
    )
    setattr(LambdaBackend, _PATCHED, True)
