"""Least privilege, proven on the twin: each statement a run needs is needed, and each missing grant fails a run
with AccessDenied naming the action.

One rehearsal (whose first training attempt gets no capacity, so it makes a second) records every authorization
the twin's IAM decided. For each role, every statement that was the only grant of some request is removed in turn,
and that request is evaluated again: it must be refused, with the service's AccessDenied message naming the action.
Two runs then go for real on a template.yaml with a grant removed (the two grants the first wave lacked), and fail
naming the action.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from lustrain.twin.iam import enforce, usage
from lustrain.twin.rehearse import TEMPLATE, rehearse
from lustrain.twin.stack import copy_template

pytestmark = pytest.mark.slow

QUICK = Path(__file__).with_name("quick.yaml")


def client_as(credentials: dict[str, str], service: str) -> Any:
    """A client of `service` signed by a role session's credentials (enforce.assume's)."""
    return boto3.client(
        service,
        region_name="us-east-1",
        aws_access_key_id=credentials["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=credentials["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=credentials["AWS_SESSION_TOKEN"],
    )
#: Not called by a run that ends by itself: the sweeper runs on its schedule, on_execution_end for a run someone
#: stopped; tests/e2e/test_sweeper.py and tests/e2e/test_cancel.py prove their grants the same way. The prepare
#: function runs in a data preparation run only: tests/e2e/test_prepare_run.py proves its grants.
NOT_IN_A_RUN = {"SweepFunctionRole", "OnExecutionEndFunctionRole", "PrepareFunctionRole"}


@pytest.fixture(scope="module")
def uses() -> dict[str, usage.RoleUse]:
    found: dict[str, usage.RoleUse] = {}
    functions: list[str] = []

    def inspect(stack: Any, _result: Any) -> None:
        found.update(usage.collect(stack))
        functions.extend(f.logical_id + "Role" for f in stack.of_type("AWS::Lambda::Function"))

    enforce.clear_log()
    # a first attempt with no capacity: the run also decides on (and starts) a second attempt, so every function of
    # a run is called
    run = rehearse(QUICK, inject=["start_training:capacity-error-once"], inspect=inspect)
    assert run.status == "SUCCEEDED", (run.error, run.cause)
    assert len(run.attempts) == 2
    missing = set(functions) - NOT_IN_A_RUN - {lid for lid, use in found.items() if use.records}
    assert not missing, f"functions whose role made no call in a whole run: {sorted(missing)}"
    return found


def test_each_statement_a_run_needs_removed_refuses_its_request_naming_the_action(uses):
    checked = 0
    for logical_id, use in sorted(uses.items()):
        if not use.records:
            continue
        needed = usage.needed(use)
        assert needed, f"{logical_id}: its calls were allowed, but by no single statement of its own"
        for ref, records in needed.items():
            record = records[0]
            decision = usage.replay(record, usage.without(use.policies, ref))
            assert not decision.allowed, f"{logical_id} {ref}: {record.action} still allowed without it"
            message = usage.denial(record, decision)
            code = enforce.DENIED.get(record.service, enforce.DEFAULT_DENIED)[0]
            assert f"({code})" in message, message
            assert f"not authorized to perform: {record.action}" in message, message
            checked += 1
    assert checked >= 30


def without_action(template: dict[str, Any], function: str, sid: str, action: str) -> dict[str, Any]:
    for statement in template["Resources"][function]["Properties"]["Policies"]:
        for entry in statement.get("Statement", []) if isinstance(statement, dict) else []:
            if entry.get("Sid") == sid:
                entry["Action"] = [a for a in entry["Action"] if a != action]
                return template
    raise AssertionError(f"{function} has no statement {sid}")


@pytest.mark.parametrize(
    ("function", "sid", "action"),
    [
        ("RegisterJobFunction", "ReadDroppedSpecs", "s3:GetObjectVersion"),
        ("CheckFilesystemFunction", "LinkTaggedAssociations", "fsx:CreateDataRepositoryAssociation"),
        # a forward call: FSx reads the subnet with the function's permissions (aws:CalledVia fsx.amazonaws.com)
        ("CreateFilesystemFunction", "FsxReadsTheNetwork", "ec2:DescribeSubnets"),
    ],
)
def test_a_run_on_a_template_without_a_needed_grant_fails_with_access_denied_naming_it(function, sid, action):
    template = without_action(copy_template(TEMPLATE), function, sid, action)
    run = rehearse(QUICK, template=template)
    assert run.status == "FAILED"
    assert f"is not authorized to perform: {action}" in str(run.cause), run.cause
    assert run.resources_left == 0, run.leftovers


def test_no_role_of_the_stack_has_an_s3_object_action_on_a_bucket_it_does_not_name(uses):
    import sys

    sys.path.insert(0, str(TEMPLATE.parent / "bench"))
    from iam_report import wildcard_bucket_grants

    found = {lid: wildcard_bucket_grants(use.policies) for lid, use in uses.items()}
    assert {lid: grants for lid, grants in found.items() if grants} == {}
    from lustrain.twin.iam.policy import Policy

    star = Policy.parse(
        "probe", {"Statement": [{"Effect": "Allow", "Action": "s3:Get*", "Resource": "arn:aws:s3:::*/*"}]}
    )
    assert wildcard_bucket_grants([star]) == ["probe/0 s3:Get* arn:aws:s3:::*/*"]


def test_check_quota_may_read_a_default_quota_which_only_resource_star_grants(uses):
    # a quota never changed in the account has no applied value: check_quota reads the default, an action with no
    # resource type (Service Authorization Reference), authorized against "*"
    from lustrain.twin.iam.policy import Request

    use = uses["CheckQuotaFunctionRole"]
    principal = next(r.request.principal for r in use.records if r.request is not None)
    request = Request(principal, "servicequotas:GetAWSDefaultServiceQuota", "*", {})
    assert usage.evaluate(request, use.policies).allowed


def test_a_training_job_reaches_only_its_own_runs_code_checkpoints_results_and_never_an_archive():
    """Per-run scoping: start_training creates the job in a launcher session tagged lustrain-run = <job id>,
    lustrain-team = <team> and lustrain-job = <SageMaker job>, SageMaker chains the tags to the job's session of its
    execution role (SessionChainingConfig), and the role's grants name them. The run's own job wrote its model and
    checkpoints that way; a job of another run of the same team (the session SageMaker hands a job of run
    "intruder-0123abcd") is refused, naming the action and the object, when it reads or writes this run's code,
    checkpoints or results (its model, under the run's archive), plants a file in a folder inside this run's
    checkpoints named as its own run (IAM's * matches "/": <prefix>*/<run>/* once let it), lists this run's folder,
    writes this run's log stream, reads a secret of another team, or plants a manifest in the archive; the run's own
    job session may not write the archive's manifest either."""
    from lustrain.twin.iam.policy import Principal
    from lustrain.twin.rehearse import operator_session
    from lustrain.twin.simulator import ROLE_SESSION

    seen: dict[str, Any] = {}
    enforce.clear_log()  # this run's decisions alone (the module's first rehearsal made its own)

    def inspect(stack: Any, result: Any) -> None:
        role = stack.resources["SageMakerExecutionRole"].attrs["Arn"]
        own = [r for r in enforce.log() if r.role_arn == role and r.allowed and r.action == "s3:PutObject"]
        seen["own_sessions"] = {r.request.principal.session_tags for r in own if r.request is not None}
        s3 = operator_session().client("s3")
        artifacts = stack.outputs["ArtifactsBucketName"]
        keys = {
            bucket: [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
            for bucket in (artifacts, "lustrain-example-results")
        }
        job_id = result.job_id
        model_key = next(
            k for k in keys[artifacts] if k.startswith(f"archive/{job_id}/jobs/") and k.endswith("/output/model.tar.gz")
        )
        targets = {
            "code": (
                "s3:GetObject",
                artifacts,
                next(k for k in keys[artifacts] if k.startswith(f"code/{job_id}/")),
            ),
            "checkpoint": (
                "s3:PutObject",
                "lustrain-example-results",
                next(k for k in keys["lustrain-example-results"] if f"/{job_id}/checkpoints/" in k),
            ),
            # SageMaker uploaded the model under the run's archive (archive/<job id>/jobs/), nothing copied it
            "model": ("s3:GetObject", artifacts, model_key),
            "model-overwrite": ("s3:PutObject", artifacts, model_key),
            "archive": ("s3:PutObject", artifacts, f"archive/{job_id}/manifest.json"),
            "inside-checkpoints": (
                "s3:PutObject",
                "lustrain-example-results",
                f"default/{job_id}/checkpoints/intruder-0123abcd/step-999.json",
            ),
            "listing": ("s3:ListBucket", "lustrain-example-results", f"default/{job_id}/"),
        }
        # the SageMaker job the run's own session was tagged with (start_training's lustrain-job)
        training_job = dict(next(iter(seen["own_sessions"]))).get("lustrain-job", "none")
        seen["training_job"] = training_job
        # another team's secret, kept where the stack's default list puts team vision's
        secret = operator_session().client("secretsmanager").create_secret(
            Name=f"{stack.name}/vision/hf-token", SecretString="vision-only"
        )["ARN"]
        _intruder, credentials = enforce.assume(
            role,
            ROLE_SESSION,
            service="sagemaker.amazonaws.com",
            source_account=Principal.role_session(role, ROLE_SESSION).account,
            session_tags={
                "lustrain-run": "intruder-0123abcd",
                "lustrain-team": "default",
                "lustrain-job": "intruder-0123abcd-1",
            },
        )
        as_intruder = client_as(credentials, "s3")
        refused = {}
        for what, (action, bucket, key) in targets.items():
            try:
                if action == "s3:GetObject":
                    as_intruder.get_object(Bucket=bucket, Key=key)
                elif action == "s3:ListBucket":
                    as_intruder.list_objects_v2(Bucket=bucket, Prefix=key)
                else:
                    as_intruder.put_object(Bucket=bucket, Key=key, Body=b"planted")
            except ClientError as exc:
                refused[what] = (
                    exc.response["Error"]["Code"],
                    exc.response["Error"]["Message"],
                    action,
                    bucket,
                    key,
                )
        seen["refused"] = refused
        seen["targets"] = targets
        # the run's own job session writes its model under jobs/, never the archive's own files
        _own, own_credentials = enforce.assume(
            role,
            ROLE_SESSION,
            service="sagemaker.amazonaws.com",
            source_account=Principal.role_session(role, ROLE_SESSION).account,
            session_tags={"lustrain-run": job_id, "lustrain-team": "default", "lustrain-job": training_job},
        )
        as_run = client_as(own_credentials, "s3")
        try:
            as_run.put_object(Bucket=artifacts, Key=f"archive/{job_id}/manifest.json", Body=b"planted")
            seen["own_manifest"] = "written"
        except ClientError as exc:
            seen["own_manifest"] = exc.response["Error"]["Code"]
        # its own run's part of the results location is the intruder's to write, and to list
        as_intruder.put_object(
            Bucket="lustrain-example-results", Key="default/intruder-0123abcd/x", Body=b"own"
        )
        as_intruder.list_objects_v2(Bucket="lustrain-example-results", Prefix="default/intruder-0123abcd/")
        # the logs: the run's own streams are its job's alone; the intruder writes only its own job's
        intruder_logs = client_as(credentials, "logs")
        group = "/aws/sagemaker/TrainingJobs"
        intruder_logs.create_log_stream(logGroupName=group, logStreamName="intruder-0123abcd-1/algo-1-1")
        seen["logs"] = {}
        for stream in (f"{training_job}/algo-1-9999999999", f"{training_job}0/algo-1-1"):
            try:
                intruder_logs.create_log_stream(logGroupName=group, logStreamName=stream)
                seen["logs"][stream] = "created"
            except ClientError as exc:
                seen["logs"][stream] = exc.response["Error"]["Code"]
        intruder_secrets = client_as(credentials, "secretsmanager")
        try:
            intruder_secrets.get_secret_value(SecretId=secret)
            seen["secret"] = "read"
        except ClientError as exc:
            seen["secret"] = exc.response["Error"]["Code"]

    run = rehearse(QUICK, inspect=inspect)

    assert run.status == "SUCCEEDED", (run.error, run.cause)
    assert [dict(tags) for tags in seen["own_sessions"]] == [
        {"lustrain-run": run.job_id, "lustrain-team": "default", "lustrain-job": seen["training_job"]}
    ]
    assert seen["own_manifest"] == "AccessDenied"
    assert seen["secret"] == "AccessDeniedException"
    assert set(seen["logs"].values()) == {"AccessDeniedException"}, seen["logs"]
    assert set(seen["refused"]) == set(seen["targets"]), (
        f"not refused: {set(seen['targets']) - set(seen['refused'])}"
    )
    for code, message, action, bucket, key in seen["refused"].values():
        assert code == "AccessDenied"
        resource = f"arn:aws:s3:::{bucket}" if action == "s3:ListBucket" else f"arn:aws:s3:::{bucket}/{key}"
        assert f'not authorized to perform: {action} on resource: "{resource}"' in message
        assert "assumed-role/" in message and "/SageMaker " in message
