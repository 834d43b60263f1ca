"""IAM in the twin: who makes each call, whether the role's policies allow it, and AWS's answer when not.

Identity is what it is on AWS: the credentials a call is signed with. A Lambda function runs with the temporary
credentials of its execution role (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN in its
environment), a training job with its SageMaker execution role's, the state machine with its role's. `assume()`
hands out such credentials once the role's trust policy lets the service assume it (as sts:AssumeRole would), and
remembers whose they are. Every boto3 call signed with them is then authorized before it is sent, against the
role's policies as moto holds them (inline and attached managed, AWS managed ones included) and the resource's
own policy (an S3 bucket policy): an explicit Deny wins, else an Allow allows, else the call is refused with the
error code the service uses and AWS's message. Calls signed with anything else (the person running the twin, the
tests' own set-up, moto's internals) are the account administrator's and pass.

A call to a service that goes on with its caller's permissions (forward access sessions: FSx's CreateFileSystem
reads the network with them) is authorized for those forward calls too, against the same policies, with
aws:CalledVia naming the service; a refused one fails the caller's call with the service's access denied error,
naming the forward call's action (actions.forward_calls says which calls do this).

Every decision is logged (`log()`): `make iam-report` reads which actions each function used and which grants
no run used.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from botocore.client import BaseClient
from botocore.exceptions import ClientError

from lustrain.twin.iam import world
from lustrain.twin.iam.actions import Call, Need, needs_of
from lustrain.twin.iam.policy import (
    ContextValue,
    Decision,
    Policy,
    Principal,
    Request,
    StatementRef,
    denial_message,
    evaluate,
)

_PATCHED = "_lustrain_twin_iam"

#: The error each service answers a refused call with: (code, HTTP status). The services' API references list
#: them under "Common Errors"; the JSON-protocol services not named here answer AccessDeniedException, 400.
DENIED: dict[str, tuple[str, int]] = {
    "s3": ("AccessDenied", 403),
    "ec2": ("UnauthorizedOperation", 403),
    "sns": ("AuthorizationError", 403),
    "sqs": ("AccessDenied", 403),
    "iam": ("AccessDenied", 403),
    "sts": ("AccessDenied", 403),
    "cloudwatch": ("AccessDenied", 403),
    "lambda": ("AccessDeniedException", 403),
}
DEFAULT_DENIED = ("AccessDeniedException", 400)


class NotAssumable(PermissionError):
    """A role's trust policy does not let the service assume it."""


@dataclass(frozen=True)
class Record:
    """One authorization the twin decided."""

    principal: str
    role_arn: str | None
    service: str
    operation: str
    action: str
    resource: str
    allowed: bool
    reason: str
    statements: tuple[StatementRef, ...]
    #: the request as IAM evaluated it (principal, action, resource, context): what a replay evaluates again
    request: Request | None = None


class _Log:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[Record] = []

    def add(self, record: Record) -> None:
        with self._lock:
            self._records.append(record)

    def records(self) -> list[Record]:
        with self._lock:
            return list(self._records)

    def clear(self) -> None:
        with self._lock:
            self._records.clear()


_log = _Log()


def log() -> list[Record]:
    """Every authorization decided so far in this process."""
    return _log.records()


def clear_log() -> None:
    _log.clear()


# --------------------------------------------------------------------------- identities


class _Identities:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, Principal] = {}

    def register(self, principal: Principal) -> dict[str, str]:
        # the session's tags are part of who it is: two sessions of one role with other tags hold other keys
        digest = hashlib.sha256(repr((principal.arn, principal.session_tags)).encode()).hexdigest().upper()
        key = f"ASIA{digest[:16]}"
        with self._lock:
            self._by_key[key] = principal
        return {
            "AWS_ACCESS_KEY_ID": key,
            "AWS_SECRET_ACCESS_KEY": digest[16:56],
            "AWS_SESSION_TOKEN": f"twin-session-{digest[:32]}",
        }

    def principal_of(self, access_key: str | None) -> Principal | None:
        if not access_key:
            return None
        with self._lock:
            return self._by_key.get(access_key)


_identities = _Identities()


def trust_allows(
    role_arn: str,
    service: str,
    *,
    source_account: str | None = None,
    source_arn: str | None = None,
    session_tags: dict[str, str] | None = None,
    caller: Principal | None = None,
) -> Decision:
    """Whether `service` (or the role session `caller`) may assume the role: its trust policy, with the
    aws:Source* keys AWS sends. Session tags also need sts:TagSession there, with aws:RequestTag/<key> and
    aws:TagKeys in the context (IAM User Guide, "Passing session tags in AWS STS": "the role's trust policy must
    allow sts:TagSession")."""
    account = role_arn.split(":")[4]
    trust = world.trust_policy(role_arn)
    if trust is None:
        return Decision(False, "implicit", ())
    context: dict[str, ContextValue] = {}
    if source_account:
        context["aws:SourceAccount"] = source_account
    if source_arn:
        context["aws:SourceArn"] = source_arn
    who = caller or Principal.aws_service(service, account)
    if caller is not None:
        context.update(_principal_context(caller))
    request = Request(who, "sts:AssumeRole", role_arn, context)
    decision = evaluate(request, (), (trust,))
    if decision.allowed and session_tags:
        tagged = {
            **context,
            **{f"aws:RequestTag/{key}": value for key, value in session_tags.items()},
            "aws:TagKeys": sorted(session_tags),
        }
        decision = evaluate(Request(who, "sts:TagSession", role_arn, tagged), (), (trust,))
    return decision


def assume(
    role_arn: str,
    session: str,
    *,
    service: str,
    source_account: str | None = None,
    source_arn: str | None = None,
    session_tags: dict[str, str] | None = None,
    caller: Principal | None = None,
) -> tuple[Principal, dict[str, str]]:
    """A session of the role for `service` (or for the role session `caller`, sts:AssumeRole) with
    `session_tags`, and its credentials; NotAssumable when the trust policy says no."""
    decision = trust_allows(
        role_arn,
        service,
        source_account=source_account,
        source_arn=source_arn,
        session_tags=session_tags,
        caller=caller,
    )
    if not decision.allowed:
        exists = world.find_role(role_arn) is not None
        who = caller.arn if caller is not None else service
        raise NotAssumable(
            f"{who} cannot assume {role_arn}"
            + (" with session tags" if session_tags else "")
            + ": "
            + ("its trust policy does not allow it" if exists else "the role does not exist")
        )
    principal = Principal.role_session(role_arn, session, session_tags)
    return principal, _identities.register(principal)


def principal_of(access_key: str | None) -> Principal | None:
    return _identities.principal_of(access_key)


# --------------------------------------------------------------------------- deciding


def _principal_context(principal: Principal) -> dict[str, ContextValue]:
    """What IAM knows of a role session: its account, role and session tags (aws:PrincipalTag/<key>)."""
    context: dict[str, ContextValue] = {
        "aws:PrincipalAccount": principal.account,
        "aws:PrincipalType": "AssumedRole",
    }
    if principal.role_arn:
        context["aws:PrincipalArn"] = principal.role_arn
    for key, value in principal.session_tags:
        context[f"aws:PrincipalTag/{key}"] = value
    return context


def _context(principal: Principal, region: str, need: Need) -> dict[str, ContextValue]:
    context: dict[str, ContextValue] = {
        **_principal_context(principal),
        "aws:RequestedRegion": region,
        # every call to AWS is made over TLS (boto3 refuses plain HTTP to AWS's endpoints); the twin's own
        # endpoint is HTTP, which says nothing of the calls it stands for
        "aws:SecureTransport": True,
    }
    if need.via:
        # a forward call: a service calling on with its caller's credentials (IAM User Guide, "AWS global
        # condition context keys": aws:CalledVia, aws:CalledViaFirst, aws:CalledViaLast, aws:ViaAWSService)
        context["aws:CalledVia"] = list(need.via)
        context["aws:CalledViaFirst"] = need.via[0]
        context["aws:CalledViaLast"] = need.via[-1]
        context["aws:ViaAWSService"] = True
    parts = need.resource.split(":", 5)
    if len(parts) == 6:
        if parts[4]:
            context["aws:ResourceAccount"] = parts[4]
        tags = world.MotoState(principal.account).tags(need.resource)
        for key, value in (tags or {}).items():
            context[f"aws:ResourceTag/{key}"] = value
    context.update(need.context)
    return context


def _resource_policies(principal: Principal, need: Need) -> list[Policy]:
    if need.resource.startswith("arn:aws:s3:::"):
        bucket = need.resource.removeprefix("arn:aws:s3:::").split("/", 1)[0]
        found = world.bucket_policy(principal.account, bucket)
        return [found] if found else []
    return []


def decide(
    principal: Principal,
    need: Need,
    *,
    region: str,
    service: str,
    operation: str,
    gates: Sequence[Policy] = (),
) -> tuple[Request, Decision]:
    """Decide one authorization (and log it). `gates`: policies on the path that must also allow the request
    (the policy of the VPC endpoint a training job's S3 calls go through)."""
    request = Request(principal, need.action, need.resource, _context(principal, region, need))
    identity = world.role_policies(principal.role_arn) if principal.role_arn else []
    decision = evaluate(request, identity, _resource_policies(principal, need))
    boundary = world.permissions_boundary(principal.role_arn) if principal.role_arn else None
    if boundary is not None and decision.allowed:
        capped = evaluate(request, (boundary,))
        if not capped.allowed:
            decision = Decision(False, "boundary-deny" if capped.reason == "identity" else "boundary", capped.statements)
    for gate in gates:
        if not decision.allowed:
            break
        passed = evaluate(request, (), (gate,))
        if not passed.allowed:
            denied_by: Literal["endpoint", "endpoint-deny"] = (
                "endpoint-deny" if passed.reason == "resource" else "endpoint"
            )
            decision = Decision(False, denied_by, passed.statements)
    _log.add(
        Record(
            principal=principal.arn,
            role_arn=principal.role_arn,
            service=service,
            operation=operation,
            action=need.action,
            resource=need.resource,
            allowed=decision.allowed,
            reason=decision.reason,
            statements=decision.statements,
            request=request,
        )
    )
    return request, decision


def access_denied(service: str, operation: str, request: Request, decision: Decision) -> ClientError:
    """The ClientError a service answers a refused call with."""
    code, status = DENIED.get(service, DEFAULT_DENIED)
    message = denial_message(request, decision, quote_resource=service == "s3")
    if service == "ec2":
        # EC2 prefixes its own sentence and appends the (encoded) context of the decision
        detail = json.dumps({"allowed": False, "action": request.action, "resource": request.resource})
        encoded = base64.urlsafe_b64encode(detail.encode()).decode()
        message = (
            f"You are not authorized to perform this operation. {message}. "
            f"Encoded authorization failure message: {encoded}"
        )
    return ClientError(
        {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status, "RequestId": "lustrain-twin-iam"},
        },
        operation,
    )


def authorize(
    principal: Principal,
    needs: Iterable[Need],
    *,
    region: str,
    service: str,
    operation: str,
    gates: Sequence[Policy] = (),
) -> None:
    """Raise the service's access denied ClientError at the first need the principal's policies refuse."""
    for need in needs:
        request, decision = decide(
            principal, need, region=region, service=service, operation=operation, gates=gates
        )
        if not decision.allowed:
            raise access_denied(service, operation, request, decision)


def authorize_call(
    principal: Principal,
    service: str,
    operation: str,
    params: dict[str, Any],
    region: str,
    gates: Sequence[Policy] = (),
) -> None:
    """Authorize one API call as IAM would (the actions it needs, from the Service Authorization Reference)."""
    call = Call(service, operation, params, region, principal.account)
    needs = needs_of(call, world.MotoState(principal.account))
    authorize(principal, needs, region=region, service=service, operation=operation, gates=gates)


def _signing_key(client: BaseClient) -> str | None:
    credentials = getattr(client._request_signer, "_credentials", None)
    return None if credentials is None else str(credentials.access_key)


def install() -> None:
    """Authorize every boto3 call of a role session before botocore sends it (idempotent)."""
    original = BaseClient._make_api_call
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def make_api_call(self: BaseClient, operation_name: str, api_params: dict[str, Any]) -> Any:
        principal = principal_of(_signing_key(self))
        if principal is not None:
            service = self.meta.service_model.service_name
            authorize_call(principal, service, operation_name, api_params, self.meta.region_name)
        return original(self, operation_name, api_params)

    setattr(make_api_call, _PATCHED, True)
    BaseClient._make_api_call = make_api_call
