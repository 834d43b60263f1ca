"""A SageMaker job's execution role, as SageMaker takes it for a training job and a processing job alike: the role
assumed when the job is created (refused in SageMaker's words when it cannot be, or when it may not make the
instances' network interfaces in the job's VPC), the session tags chained from the creating session, and each of the
job's own calls authorized as that session through the policies on its network path. patches/sagemaker.py and
patches/processing.py both use it; neither imports the other for it."""

from __future__ import annotations

from typing import Any

from moto.sagemaker.exceptions import ValidationError
from moto.sagemaker.models import SageMakerModelBackend

from lustrain.twin.iam import enforce
from lustrain.twin.iam.actions import Need
from lustrain.twin.iam.policy import Policy, Principal
from lustrain.twin.simulator import ROLE_SESSION, SimulatedJob

SAGEMAKER_SERVICE = "sagemaker.amazonaws.com"
#: What SageMaker's VPC mode needs of the execution role, checked at CreateTrainingJob ("Give SageMaker Access to
#: Resources in your Amazon VPC": CreateTrainingJob API, Execution Role Permissions).
VPC_ACTIONS = (
    "CreateNetworkInterface",
    "CreateNetworkInterfacePermission",
    "DeleteNetworkInterface",
    "DeleteNetworkInterfacePermission",
    "DescribeNetworkInterfaces",
    "DescribeVpcs",
    "DescribeDhcpOptions",
    "DescribeSubnets",
    "DescribeSecurityGroups",
)


#: the session of its execution role each job's own calls are made as (by job ARN): its chained session tags
SESSIONS: dict[str, Principal] = {}


def chained_tags(request: dict[str, Any], caller: Principal | None) -> dict[str, str]:
    """The session tags SageMaker passes on to the execution role: the creating session's, when the request
    enables session tag chaining."""
    chaining = (request.get("SessionChainingConfig") or {}).get("EnableSessionTagChaining")
    if str(chaining).lower() != "true" or caller is None:
        return {}
    return caller.tags


def check_role(
    backend: SageMakerModelBackend, request: dict[str, Any], job_arn: str, caller: Principal | None = None
) -> dict[str, str]:
    """The execution role as SageMaker checks it; returns the credentials of the job's session of it."""
    role_arn = str(request.get("RoleArn", ""))
    tags = chained_tags(request, caller)
    try:
        principal, credentials = enforce.assume(
            role_arn,
            ROLE_SESSION,
            service=SAGEMAKER_SERVICE,
            source_account=backend.account_id,
            source_arn=job_arn,
            session_tags=tags,
        )
    except (enforce.NotAssumable, ValueError):
        raise ValidationError(
            f"Could not assume role {role_arn}. Please ensure that the role exists and allows principal "
            f"'{SAGEMAKER_SERVICE}' to assume the role"
            + (" and to tag the session (sts:TagSession) for session tag chaining." if tags else ".")
        ) from None
    SESSIONS[job_arn] = principal
    if request.get("VpcConfig"):
        for action in VPC_ACTIONS:
            _request, decision = enforce.decide(
                principal,
                Need(f"ec2:{action}", "*"),
                region=backend.region_name,
                service="ec2",
                operation=action,
            )
            if not decision.allowed:
                raise ValidationError(
                    f"The provided execution role does not have permissions to call {action} on EC2"
                )
    return credentials


def authorize_job(
    job: SimulatedJob, service: str, operation: str, params: dict[str, Any], gates: list[dict[str, Any]]
) -> None:
    """A call of the job's own, as its execution role, through the policies on its network path."""
    principal = SESSIONS.get(job.arn) or Principal.role_session(str(job.request["RoleArn"]), ROLE_SESSION)
    policies = [Policy.parse(f"vpc-endpoint-policy-{i}", gate) for i, gate in enumerate(gates)]
    enforce.authorize_call(principal, service, operation, params, job.region, gates=policies)
