"""A data preparation run's own IAM role: its processing jobs reach this run's objects, and nothing of another run's.

CreateProcessingJob passes no session tags (botocore's model has no SessionChainingConfig for it), so the per-run
scope a training job's session gets from its tags cannot be given to a role that every preparation shares: a spec
author's own `code` would run with it and reach every run's outputs. Each preparation gets a role of its own
instead, made by its first look (steps/prepare.look) before any processing job, and deleted by its teardown:

- its name is the run's (`role_name`), under the path /lustrain/<region>/<stack>/, which the stack's grants name;
- SageMaker alone may assume it, for this account (the trust policy, as every SageMaker role of the stack);
- its permissions boundary is the stack's PrepareProcessingBoundary, the most a preparation may ever do (read the
  stack's allowed data and outputs, write its allowed outputs, its network interfaces, logs and image): the
  function making the role may create it only with that boundary, so no policy written here can grant more;
- its one inline policy (`policy_document`) names this run's objects alone: its code bundle, its source and
  tokenizer (read), its output (read, write, delete: a rerun clears a part's leftovers), the buckets they are in
  (list), plus what every processing job needs (its network interfaces, its log streams, its image);
- it carries the run's lustrain:job-id and the stack's lustrain:created-by tags: teardown and the sweeper delete
  only a role that carries both.

IAM is eventually consistent: a role SageMaker is handed at once may not be assumable yet. The look that creates the
role starts no job; the next look, a minute later (steps/prepare.LOOK_EVERY_SECONDS), does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from botocore.exceptions import ClientError

from lustrain_core import leftovers
from lustrain_core import resources as registry
from lustrain_core.aws_errors import error_code
from lustrain_core.aws_requests import kms_key
from lustrain_core.config import Settings
from lustrain_core.errors import SpecInvalid
from lustrain_core.launch_plan import TAG_CREATED_BY, TAG_JOB_ID, tag_dict
from lustrain_core.prepare_plan import PrepareRun
from lustrain_core.steps import records

#: IAM's answer to a call it refuses (the twin answers the same)
ACCESS_DENIED = frozenset({"AccessDenied", "AccessDeniedException"})
#: the run's ledger entry type (teardown deletes it after the processing jobs and the network)
RESOURCE_TYPE = registry.IAM_ROLE.name
#: The stack setting naming the permissions boundary every preparation's role is created with
BOUNDARY_SETTING = "LUSTRAIN_PREPARE_BOUNDARY_ARN"
#: the role's one inline policy
POLICY_NAME = "this-run"
SUFFIX = "-prep"
#: IAM's longest role name
MAX_NAME = 64
#: the CloudWatch Logs group SageMaker writes processing jobs' output to (steps/prepare.LOG_GROUP)
LOG_GROUP = "/aws/sagemaker/ProcessingJobs"


def trust_policy(account: str) -> dict[str, Any]:
    """SageMaker alone may assume the role, and only for this account's jobs (the confused-deputy guard)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "sagemaker.amazonaws.com"},
                "Action": "sts:AssumeRole",
                "Condition": {"StringEquals": {"aws:SourceAccount": account}},
            }
        ],
    }


def role_name(job_id: str) -> str:
    """The run's role name: <job id>-prep, or, for a job id too long for IAM's 64 characters, its start and a hash
    of the whole (two runs never share a role)."""
    name = f"{job_id}{SUFFIX}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:8]
    return f"{job_id[: MAX_NAME - len(SUFFIX) - 9].rstrip('-')}-{digest}{SUFFIX}"


def role_path(settings: Settings) -> str:
    """Where the stack's preparation roles live: IAM is global, so the region is in the path with the stack."""
    return leftovers.role_path(settings.region, settings.stack_name)


def roles_left(iam: Any, settings: Settings) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """Every role under the stack's path, with its tags: what the sweeper checks for preparation roles whose run's
    teardown never ran."""
    return leftovers.roles_under(iam, role_path(settings))


def boundary_arn(settings: Settings) -> str:
    found = settings.extra.get(BOUNDARY_SETTING, "").strip()
    if not found.startswith("arn:"):
        raise ValueError(f"stack setting {BOUNDARY_SETTING} is not set: the preparation roles' permissions boundary")
    return found


def _s3_arn(partition: str, uri: str, suffix: str = "") -> str:
    return f"arn:{partition}:s3:::{uri.removeprefix('s3://')}{suffix}"


def _bucket(uri: str) -> str:
    return uri.removeprefix("s3://").split("/", 1)[0]


def _prefix(uri: str) -> str:
    return uri if uri.endswith("/") else uri + "/"


def _listed_prefixes(code_dir: str, run: PrepareRun) -> list[str]:
    """The key prefixes the role may list (s3:prefix): its code's folder, its source, its output, its tokenizer."""
    uris = [code_dir, _prefix(run.source), _prefix(run.output)]
    if run.tokenizer.startswith("s3://"):
        uris.append(run.tokenizer)
    return sorted({uri.removeprefix("s3://").partition("/")[2] + "*" for uri in uris})


def policy_document(run: PrepareRun, code_s3_uri: str, image_uri: str, settings: Settings) -> dict[str, Any]:
    """The role's inline policy: this run's objects, and what any processing job needs."""
    partition, account = boundary_arn(settings).split(":")[1], _account(settings)
    region = settings.region
    code_dir = code_s3_uri.rsplit("/", 1)[0] + "/" if code_s3_uri.endswith(".tar.gz") else _prefix(code_s3_uri)
    reads = [_s3_arn(partition, code_dir, "*"), _s3_arn(partition, _prefix(run.source), "*")]
    if run.tokenizer.startswith("s3://"):
        reads.append(_s3_arn(partition, run.tokenizer))
    output = _s3_arn(partition, _prefix(run.output), "*")
    buckets = sorted({_bucket(u) for u in (code_s3_uri, run.source, run.output, run.tokenizer) if u.startswith("s3://")})
    registry, repository = image_uri.split(".", 1)[0], image_uri.split("/", 1)[1].split(":", 1)[0]
    statements: list[dict[str, Any]] = [
        {"Sid": "ReadItsCodeAndSource", "Effect": "Allow", "Action": "s3:GetObject", "Resource": reads},
        {
            "Sid": "ReadAndWriteItsOutput",
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
            "Resource": output,
        },
        {
            # listing shows keys' names: only inside its own code, source, output and tokenizer
            "Sid": "ListItsBuckets",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": [f"arn:{partition}:s3:::{b}" for b in buckets],
            "Condition": {"StringLike": {"s3:prefix": _listed_prefixes(code_dir, run)}},
        },
        {
            # SageMaker's VPC mode: the processing instances' interfaces in the run's subnet (no resource-level form)
            "Sid": "VpcModeNetworkInterfaces",
            "Effect": "Allow",
            "Action": [
                "ec2:CreateNetworkInterface",
                "ec2:CreateNetworkInterfacePermission",
                "ec2:DeleteNetworkInterface",
                "ec2:DeleteNetworkInterfacePermission",
                "ec2:DescribeNetworkInterfaces",
                "ec2:DescribeVpcs",
                "ec2:DescribeDhcpOptions",
                "ec2:DescribeSubnets",
                "ec2:DescribeSecurityGroups",
            ],
            "Resource": "*",
        },
        {
            "Sid": "LogGroup",
            "Effect": "Allow",
            "Action": ["logs:CreateLogGroup", "logs:DescribeLogStreams"],
            "Resource": [
                f"arn:{partition}:logs:{region}:{account}:log-group:{LOG_GROUP}",
                f"arn:{partition}:logs:{region}:{account}:log-group:{LOG_GROUP}:*",
            ],
        },
        {
            # the streams of its own stages' processing jobs (<job name>/algo-N-...), ending in the delimiter: no
            # other run's, now or in advance
            "Sid": "OwnLogStreams",
            "Effect": "Allow",
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
            "Resource": [
                f"arn:{partition}:logs:{region}:{account}:log-group:{LOG_GROUP}:log-stream:{run.job_name(stage)}/*"
                for stage in run.stages
            ],
        },
        {"Sid": "EcrLogin", "Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
        {
            "Sid": "PullThePreparationImage",
            "Effect": "Allow",
            "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
            "Resource": f"arn:{partition}:ecr:{region}:{registry}:repository/{repository}",
        },
    ]
    key = kms_key(settings)
    if key:
        statements.append(
            {
                "Sid": "UseTheRunKey",
                "Effect": "Allow",
                "Action": ["kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey"],
                "Resource": key,
            }
        )
        statements.append(
            {
                "Sid": "GrantTheRunKeyToAwsResources",
                "Effect": "Allow",
                "Action": "kms:CreateGrant",
                "Resource": key,
                "Condition": {"Bool": {"kms:GrantIsForAWSResource": "true"}},
            }
        )
    return {"Version": "2012-10-17", "Statement": statements}


#: How long after its creation a role SageMaker cannot assume yet is waited for (IAM spreads a new role in seconds;
#: a role still refused after this has a fault of its own)
SETTLE_SECONDS = 300


def is_new(iam: Any, job_id: str, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> bool:
    """Whether the run's role was made under SETTLE_SECONDS ago."""
    found = find(iam, role_name(job_id))
    made = found.get("CreateDate") if found is not None else None
    return isinstance(made, datetime) and (now() - made).total_seconds() < SETTLE_SECONDS


def _ours(role: dict[str, Any], job_id: str, settings: Settings) -> bool:
    tags = tag_dict(role.get("Tags"))
    return tags.get(TAG_JOB_ID) == job_id and tags.get(TAG_CREATED_BY) == settings.stack_name


def find(iam: Any, name: str) -> dict[str, Any] | None:
    """The role as GetRole gives it (its Tags and CreateDate included), or None where there is none."""
    return registry.describe(iam, registry.IAM_ROLE, name)


def ensure(
    iam: Any,
    ddb: Any,
    run: PrepareRun,
    *,
    code_s3_uri: str,
    image_uri: str,
    tags: list[dict[str, str]],
    settings: Settings,
) -> str | None:
    """The run's role, made where it is not there yet (recorded in the run's ledger before it is created, so that
    teardown deletes it whatever happens next), with its policy: its ARN, or None while it is not ready to hand to
    SageMaker (this call made the role or changed its policy, which IAM may not have spread yet, or IAM does not
    show yet what an earlier look made): the state machine looks again. A role of that name that is not this
    run's is refused, never used."""
    name = role_name(run.job_id)
    records.add_resources(ddb, settings.jobs_table, run.job_id, [{"type": RESOURCE_TYPE, "id": name}])
    # CreateRole first: a call naming a role that does not exist is authorized against role/<name>, without the
    # path the stack's grants name, so a look for it would be refused rather than told it is missing
    try:
        found: dict[str, Any] = dict(
            iam.create_role(
                RoleName=name,
                Path=role_path(settings),
                AssumeRolePolicyDocument=json.dumps(trust_policy(_account(settings))),
                PermissionsBoundary=boundary_arn(settings),
                Description=f"lustrain data preparation {run.job_id}: its processing jobs reach this run alone",
                Tags=tags,
            )["Role"]
        )
        created = True
    except ClientError as exc:
        # made by an earlier look (or a create that went through before a lost answer): checked as found
        if error_code(exc) != "EntityAlreadyExists":
            raise
        created = False
        try:
            looked = find(iam, name)
        except ClientError as denied:
            # a role of that name outside the stack's path: not one the stack may read, so not this run's
            if error_code(denied) not in ACCESS_DENIED:
                raise
            looked = {}
        if looked is None:
            return None  # there, and not yet shown by IAM (eventually consistent): look again
        found = looked
    if not created and not _ours(found, run.job_id, settings):
        raise SpecInvalid.one(
            "name",
            run.job_id,
            f"the IAM role {name} exists and is not this run's (its tags name another run or stack): lustrain will "
            "not hand it to SageMaker; give the spec another name",
        )
    document = policy_document(run, code_s3_uri, image_uri, settings)
    try:
        if _policy_of(iam, name) == document:
            return None if created else str(found["Arn"])
        iam.put_role_policy(RoleName=name, PolicyName=POLICY_NAME, PolicyDocument=json.dumps(document))
    except ClientError as exc:
        # a role just made, which IAM does not show yet to the calls that name it (NoSuchEntity), or whose boundary
        # the grant's condition does not see yet (AccessDenied): look again
        if created and error_code(exc) in ACCESS_DENIED | {"NoSuchEntity"}:
            return None
        raise
    return None


def _policy_of(iam: Any, name: str) -> dict[str, Any] | None:
    """The role's inline policy as IAM holds it (botocore decodes IAM's URL-encoded JSON), or None."""
    try:
        found = iam.get_role_policy(RoleName=name, PolicyName=POLICY_NAME)["PolicyDocument"]
    except ClientError as exc:
        if error_code(exc) == "NoSuchEntity":
            return None
        raise
    return dict(json.loads(unquote(found)) if isinstance(found, str) else found)


def _account(settings: Settings) -> str:
    return boundary_arn(settings).split(":")[4]


def delete(iam: Any, name: str, job_id: str, settings: Settings) -> str:
    """Delete the run's role: "deleted", "gone" (never made, or deleted before), or "foreign" (a role of that name
    without this run's and this stack's tags, left alone)."""
    found = find(iam, name)
    if found is None:
        return "gone"
    if not _ours(found, job_id, settings):
        return "foreign"
    try:
        for page in iam.get_paginator("list_role_policies").paginate(RoleName=name):
            for policy in page.get("PolicyNames", []):
                iam.delete_role_policy(RoleName=name, PolicyName=policy)
        iam.delete_role(RoleName=name)
    except ClientError as exc:
        if error_code(exc) == "NoSuchEntity":
            return "gone"
        raise
    return "deleted"
