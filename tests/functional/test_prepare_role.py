"""A data preparation run's own IAM role (steps/prepare_role) on the twin's IAM: it reaches its own code, source and
output and nothing of another run's, stays within the stack's boundary whatever its policy says, is refused when a
role of its name is not this run's, and its run's teardown deletes it (and only it)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from infra_support import REGION, MinuteLeft, torn_down
from lustrain_core.config import Settings
from lustrain_core.errors import SpecInvalid
from lustrain_core.images import prepare_image
from lustrain_core.prepare_plan import PrepareRun
from lustrain_core.steps import prepare_role, records, sweep, teardown

from lustrain.twin.iam import enforce
from lustrain.twin.iam.actions import Need
from lustrain.twin.iam.policy import Principal

ACCOUNT = "123456789012"
CODE = "s3://lustrain-test-artifacts/code/corpus-0123abcd/5e5e/sourcedir.tar.gz"
# the stack's most: data under s3://data/, outputs under s3://out/ (PrepareProcessingBoundary's shape)
BOUNDARY = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": ["arn:aws:s3:::data/*", "arn:aws:s3:::out/*"]},
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::lustrain-test-artifacts/code/*"},
        {
            "Effect": "Allow",
            "Action": ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
            "Resource": "arn:aws:s3:::out/*",
        },
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::*"},
        {"Effect": "Allow", "Action": ["ec2:*", "logs:*", "ecr:*"], "Resource": "*"},
    ],
}


def _run(job_id: str = "corpus-0123abcd", output: str = "s3://out/team-a/shards/") -> PrepareRun:
    return PrepareRun(
        job_id=job_id,
        source="s3://data/team-a/text/",
        output=output,
        tokenizer="bpe:4096",
        instances=2,
        instance_type="ml.c5.xlarge",
    )


@pytest.fixture
def stack(aws: Settings) -> Settings:
    iam = boto3.client("iam", region_name=REGION)
    arn = iam.create_policy(PolicyName="boundary", PolicyDocument=json.dumps(BOUNDARY))["Policy"]["Arn"]
    return dataclasses.replace(aws, extra={**aws.extra, prepare_role.BOUNDARY_SETTING: arn})


def _look(settings: Settings, run: PrepareRun, iam: Any = None) -> str | None:
    """One look's ensure (with the twin's IAM, or `iam`): the role's ARN, or None while it is not ready to hand to
    SageMaker."""
    ddb = boto3.client("dynamodb", region_name=REGION)
    if records.get(ddb, settings.jobs_table, run.job_id) is None:
        records.put_new(ddb, settings.jobs_table, records.JobRecord(job_id=run.job_id))
    tags = [
        {"Key": "lustrain:job-id", "Value": run.job_id},
        {"Key": "lustrain:created-by", "Value": settings.stack_name},
    ]
    return prepare_role.ensure(
        iam or boto3.client("iam", region_name=REGION),
        ddb,
        run,
        code_s3_uri=CODE,
        image_uri=prepare_image(REGION),
        tags=tags,
        settings=settings,
    )


def _made(settings: Settings, run: PrepareRun) -> str:
    """The run's role as the looks make it: the first makes it and starts nothing, the next hands it over."""
    assert _look(settings, run) is None
    role = _look(settings, run)
    assert role is not None
    return role


def _allowed(role: str, action: str, resource: str, **context: Any) -> bool:
    principal = Principal.role_session(role, "SageMaker")
    _, decision = enforce.decide(
        principal, Need(action, resource, context), region=REGION, service=action.split(":")[0], operation="check"
    )
    return decision.allowed


def test_the_role_reaches_its_own_code_source_and_output_and_nothing_of_another_run(stack: Settings) -> None:
    run = _run()
    role = _made(stack, run)
    assert role == f"arn:aws:iam::{ACCOUNT}:role/lustrain/{REGION}/{stack.stack_name}/corpus-0123abcd-prep"
    assert _allowed(role, "s3:GetObject", "arn:aws:s3:::lustrain-test-artifacts/code/corpus-0123abcd/5e5e/x.py")
    assert _allowed(role, "s3:GetObject", "arn:aws:s3:::data/team-a/text/f00.txt")
    assert _allowed(role, "s3:PutObject", "arn:aws:s3:::out/team-a/shards/part-00000.bin")
    assert _allowed(role, "s3:DeleteObject", "arn:aws:s3:::out/team-a/shards/parts/part-00000.json")
    # another run's output, checkpoints, code and data: all within the stack's boundary, none this run's
    assert not _allowed(role, "s3:PutObject", "arn:aws:s3:::out/team-b/run-9/checkpoints/step-100/x")
    assert not _allowed(role, "s3:GetObject", "arn:aws:s3:::out/team-b/run-9/checkpoints/step-100/x")
    assert not _allowed(role, "s3:DeleteObject", "arn:aws:s3:::out/team-a/shards-old/index.json")
    assert not _allowed(role, "s3:GetObject", "arn:aws:s3:::lustrain-test-artifacts/code/other-run/5e5e/x.py")
    assert not _allowed(role, "s3:GetObject", "arn:aws:s3:::data/team-b/private.txt")
    assert not _allowed(role, "s3:PutObject", "arn:aws:s3:::data/team-a/text/planted.txt")
    # it lists only inside its own code, source and output: another run's folder's names stay unseen
    assert _allowed(role, "s3:ListBucket", "arn:aws:s3:::out", **{"s3:prefix": "team-a/shards/parts/"})
    assert _allowed(role, "s3:ListBucket", "arn:aws:s3:::data", **{"s3:prefix": "team-a/text/"})
    assert not _allowed(role, "s3:ListBucket", "arn:aws:s3:::out", **{"s3:prefix": "team-b/run-9/"})
    assert not _allowed(role, "s3:ListBucket", "arn:aws:s3:::out")
    # it writes only its own stages' log streams, never another run's (now, or one a later run will use)
    streams = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/sagemaker/ProcessingJobs:log-stream:"
    assert _allowed(role, "logs:PutLogEvents", streams + "corpus-0123abcd-prep-work/algo-2-1700000000")
    for theirs in ("corpus-0123abcd-prep-a-89abcdef-prep-work/algo-1-1", "other-89abcdef-prep-work/algo-1-1"):
        assert not _allowed(role, "logs:CreateLogStream", streams + theirs)
        assert not _allowed(role, "logs:PutLogEvents", streams + theirs)
    # looked at again, it is the same role and the same policy: ready to start a job with
    assert _look(stack, run) == role


def test_the_stacks_boundary_holds_whatever_the_roles_policy_grants(stack: Settings) -> None:
    # an output outside the stack's output prefixes: the role's own policy names it, the boundary does not
    role = _made(stack, _run(output="s3://elsewhere/shards/"))
    assert not _allowed(role, "s3:PutObject", "arn:aws:s3:::elsewhere/shards/part-00000.bin")
    principal = Principal.role_session(role, "SageMaker")
    request, decision = enforce.decide(
        principal,
        Need("s3:PutObject", "arn:aws:s3:::elsewhere/shards/part-00000.bin"),
        region=REGION,
        service="s3",
        operation="PutObject",
    )
    message = enforce.denial_message(request, decision)
    assert message.endswith("because no permissions boundary allows the s3:PutObject action"), message
    # and a policy written to reach further is still held by it
    iam = boto3.client("iam", region_name=REGION)
    wide = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    iam.put_role_policy(RoleName=role.rsplit("/", 1)[1], PolicyName="wide", PolicyDocument=json.dumps(wide))
    assert not _allowed(role, "s3:PutObject", "arn:aws:s3:::lustrain-test-artifacts/archive/run-9/model.tar.gz")
    assert _allowed(role, "s3:PutObject", "arn:aws:s3:::out/anything")


def test_a_role_of_that_name_that_is_not_this_runs_is_refused_and_left_alone(stack: Settings) -> None:
    run = _run()
    iam = boto3.client("iam", region_name=REGION)
    trust = json.dumps(prepare_role.trust_policy(ACCOUNT))
    iam.create_role(
        RoleName=prepare_role.role_name(run.job_id),
        Path=prepare_role.role_path(stack),
        AssumeRolePolicyDocument=trust,
        Tags=[{"Key": "lustrain:job-id", "Value": "someone-else"}],
    )
    with pytest.raises(SpecInvalid) as exc:
        _look(stack, run)
    assert [e.path for e in exc.value.errors] == ["name"]
    assert "is not this run's" in str(exc.value)
    assert iam.list_role_policies(RoleName=prepare_role.role_name(run.job_id))["PolicyNames"] == []
    # and teardown keeps it
    assert prepare_role.delete(iam, prepare_role.role_name(run.job_id), run.job_id, stack) == "foreign"


def test_a_long_job_id_gets_a_role_name_iam_takes_and_two_runs_never_share_one() -> None:
    a, b = "x" * 50 + "-0123abcd", "x" * 50 + "-4567ef01"
    assert len(prepare_role.role_name(a)) <= 64 and prepare_role.role_name(a) != prepare_role.role_name(b)
    assert prepare_role.role_name("corpus-0123abcd") == "corpus-0123abcd-prep"


def test_teardown_deletes_the_runs_role_after_its_network_and_reports_it(stack: Settings) -> None:
    run = _run()
    role = _made(stack, run)
    name = role.rsplit("/", 1)[1]
    ddb = boto3.client("dynamodb", region_name=REGION)
    records.set_fields(ddb, stack.jobs_table, run.job_id, spec={"kind": "prepare", "name": "corpus"})
    result = torn_down(stack, run.job_id)
    assert {"type": "iam_role", "id": name} in result["deleted"]
    iam = boto3.client("iam", region_name=REGION)
    assert iam.list_roles(PathPrefix="/lustrain/")["Roles"] == []
    assert list(records.get(ddb, stack.jobs_table, run.job_id).resources) == []
    # a second teardown finds it gone
    again = torn_down(stack, run.job_id)
    assert again["deleted"] == []


def test_the_sweeper_deletes_a_role_whose_run_record_is_gone_and_leaves_any_other(stack: Settings) -> None:
    run = _run()
    role = _made(stack, run)
    ddb = boto3.client("dynamodb", region_name=REGION)
    ddb.delete_item(TableName=stack.jobs_table, Key={"job_id": {"S": run.job_id}})
    iam = boto3.client("iam", region_name=REGION)
    trust = json.dumps(prepare_role.trust_policy(ACCOUNT))
    # under the stack's path but another stack's run, and under no path of a stack's: neither is this stack's
    iam.create_role(
        RoleName="other-0badc0de-prep",
        Path=prepare_role.role_path(stack),
        AssumeRolePolicyDocument=trust,
        Tags=[{"Key": "lustrain:job-id", "Value": "other-0badc0de"}, {"Key": "lustrain:created-by", "Value": "prod"}],
    )
    iam.create_role(RoleName="someone-elses", AssumeRolePolicyDocument=trust)
    settings = dataclasses.replace(
        stack,
        extra={**stack.extra, "LUSTRAIN_STATE_MACHINE_ARN": f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:runs"},
    )

    result = sweep.sweep(
        ec2=boto3.client("ec2", region_name=REGION),
        fsx=boto3.client("fsx", region_name=REGION),
        sagemaker=boto3.client("sagemaker", region_name=REGION),
        sfn=boto3.client("stepfunctions", region_name=REGION),
        ddb=ddb,
        iam=iam,
        settings=settings,
        clock=teardown.clock_for(MinuteLeft(), settings),
    )

    name = role.rsplit("/", 1)[1]
    assert [(s["job_id"], s["type"], s["id"]) for s in result["swept"]] == [(run.job_id, "iam_role", name)]
    left = {r["RoleName"] for r in iam.list_roles()["Roles"]}
    assert name not in left and {"other-0badc0de-prep", "someone-elses"} <= left


class _CatchingUp:
    """IAM while it catches up: the role exists (CreateRole says so) but GetRole does not show it yet."""

    def create_role(self, **_: Any) -> None:
        raise ClientError({"Error": {"Code": "EntityAlreadyExists", "Message": "Role exists"}}, "CreateRole")

    def get_role(self, **_: Any) -> None:
        raise ClientError({"Error": {"Code": "NoSuchEntity", "Message": "cannot be found"}}, "GetRole")


def test_a_role_iam_does_not_show_yet_is_looked_at_again_not_refused(stack: Settings) -> None:
    assert _look(stack, _run(), _CatchingUp()) is None  # Pending: the next look asks again, the run goes on


def test_a_role_is_new_for_its_first_minutes_only(stack: Settings) -> None:
    from datetime import timedelta

    run = _run()
    _made(stack, run)
    iam = boto3.client("iam", region_name=REGION)
    made = iam.get_role(RoleName=prepare_role.role_name(run.job_id))["Role"]["CreateDate"]
    assert prepare_role.is_new(iam, run.job_id, now=lambda: made + timedelta(seconds=30))
    assert not prepare_role.is_new(iam, run.job_id, now=lambda: made + timedelta(seconds=prepare_role.SETTLE_SECONDS))
    assert not prepare_role.is_new(iam, "never-made-0000000a")


class _JustMade:
    """IAM right after a CreateRole: the role is made, but its policy's put is refused until IAM has spread it."""

    def create_role(self, **_: Any) -> dict[str, Any]:
        return {"Role": {"RoleName": "corpus-0123abcd-prep", "Arn": "arn:aws:iam::123456789012:role/x"}}

    def get_role_policy(self, **_: Any) -> None:
        raise ClientError({"Error": {"Code": "NoSuchEntity", "Message": "cannot be found"}}, "GetRolePolicy")

    def put_role_policy(self, **_: Any) -> None:
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "not authorized"}}, "PutRolePolicy")


def test_a_policy_refused_just_after_the_role_was_made_is_put_again_at_the_next_look(stack: Settings) -> None:
    assert _look(stack, _run(), _JustMade()) is None


def test_the_sweepers_listing_passes_over_a_role_deleted_meanwhile(stack: Settings) -> None:
    iam = boto3.client("iam", region_name=REGION)
    trust = json.dumps(prepare_role.trust_policy(ACCOUNT))
    for name in ("a-0000000a-prep", "b-0000000b-prep"):
        iam.create_role(RoleName=name, Path=prepare_role.role_path(stack), AssumeRolePolicyDocument=trust)

    class DeletedMeanwhile:
        """ListRoles names both; the first is deleted (by its run's teardown) before its tags are read."""

        def get_paginator(self, operation: str) -> Any:
            real = iam.get_paginator(operation)
            if operation != "list_role_tags":
                return real

            class Tags:
                def paginate(self, RoleName: str) -> Any:
                    if RoleName.startswith("a-"):
                        raise ClientError({"Error": {"Code": "NoSuchEntity", "Message": "gone"}}, "ListRoleTags")
                    return real.paginate(RoleName=RoleName)

            return Tags()

    assert [name for name, _ in prepare_role.roles_left(DeletedMeanwhile(), stack)] == ["b-0000000b-prep"]


def test_an_explicit_deny_in_a_roles_boundary_is_told_as_such(stack: Settings) -> None:
    iam = boto3.client("iam", region_name=REGION)
    denying = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
            {"Effect": "Deny", "Action": "s3:PutObject", "Resource": "arn:aws:s3:::out/locked/*"},
        ],
    }
    boundary = iam.create_policy(PolicyName="denying", PolicyDocument=json.dumps(denying))["Policy"]["Arn"]
    role = iam.create_role(
        RoleName="bounded",
        AssumeRolePolicyDocument=json.dumps(prepare_role.trust_policy(ACCOUNT)),
        PermissionsBoundary=boundary,
    )["Role"]["Arn"]
    wide = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    iam.put_role_policy(RoleName="bounded", PolicyName="wide", PolicyDocument=json.dumps(wide))
    request, decision = enforce.decide(
        Principal.role_session(role, "SageMaker"),
        Need("s3:PutObject", "arn:aws:s3:::out/locked/x"),
        region=REGION,
        service="s3",
        operation="PutObject",
    )
    assert enforce.denial_message(request, decision).endswith("with an explicit deny in a permissions boundary")
    assert _allowed(role, "s3:PutObject", "arn:aws:s3:::out/open/x")
