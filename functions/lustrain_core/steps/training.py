"""start_training: the SageMaker training job of a run, started with the state machine's task token in hand.

The state machine invokes this step with `lambda:invoke.waitForTaskToken` and waits: the job's end arrives later
as an EventBridge event, and on_training_event answers the token. The token (up to 2048 chars, too long for a
tag) is kept in the tokens table under the training job's name, with the job id and where to archive, BEFORE
CreateTrainingJob: an event can never find a job it cannot answer for. The training job is recorded in the job's
`resources` before it is created too, so teardown can stop it on any failure path (a job never created is simply
not found there).

Names are unique forever in SageMaker, so every attempt gets a new one: `<spec name>-<8 hex of job id>-<attempt>`,
the attempt counted atomically in the job record.

A run never has two training jobs InProgress. A retried invocation (Lambda timed out, or its answer was lost, after
the job was created) adopts the job of the record's latest attempt, whatever its state and the state of its token,
as long as next_attempt has not judged that attempt (`judged_attempt` in the record):

- its token still waits (the job runs, or its end has not been answered yet): the token is moved to this task, and
  the job's events answer it;
- its end was answered already, to the token of the task's earlier try, which no longer waits: the end is given
  to this task as start_training's own error, the one on_training_event sent (CapacityError, TrainingStopped,
  ...), or TrainingJobCompleted carrying the training output for a completed job (the state machine takes it as
  the task's result); a job still running under an answered token gets the new token.

A new attempt starts only when no job of the run's earlier attempts is InProgress or Stopping: otherwise
TrainingJobStillRunning, and the run ends with its teardown stopping the live job.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import boto3
from botocore.exceptions import ClientError

from lustrain_core import aws_requests
from lustrain_core.aws_errors import CONDITION_FAILED, QUOTA_REFUSED, error_code, training_job_missing
from lustrain_core.config import Settings
from lustrain_core.document import Job, Run
from lustrain_core.errors import (
    ALL_ERRORS,
    MISSING,
    BudgetExceeded,
    LustrainError,
    QuotaExceeded,
    SpecInvalid,
    TrainingFailed,
    TrainingJobCompleted,
    TrainingJobStillRunning,
)
from lustrain_core.launch_plan import archive_target

# the name of an attempt's job is the launch plan's decision; operate and the steps look it up here too
from lustrain_core.launch_plan import training_job_name as training_job_name
from lustrain_core.spec import secret_name
from lustrain_core.steps import queue, records, training_plans
from lustrain_core.steps.budget import (
    MIN_RUNTIME_SECONDS,
    AttemptBudget,
    attempt_budget,
    attempt_cost_usd,
    billed_seconds,
)
from lustrain_core.teams import SESSION_TAG as TEAM_SESSION_TAG

#: the tokens item outlives the longest possible run by this much, then DynamoDB's TTL removes it
TOKEN_GRACE_SECONDS = 24 * 3600
RESOURCE_TYPE = "training_job"

WAITING = "waiting"
CALLBACK_SENT = "callback_sent"

#: the stack's role start_training creates training jobs from, in a session tagged with the run (run_session_tags)
LAUNCHER_ROLE_SETTING = "LUSTRAIN_LAUNCHER_ROLE_ARN"
RUN_TAG = "lustrain-run"
RESUME_TAG = "lustrain-resume"
#: the SageMaker job's own name: the log streams its role may write (<job name>/...)
JOB_TAG = "lustrain-job"
#: code.secrets, one tag each, numbered from 1 in the order of their names: a Secrets Manager secret's name (what its
#: ARN holds after "secret:") or an SSM parameter's (after "parameter/"); the role reads no secret no tag names
SECRET_TAG = "lustrain-secret-{}"  # noqa: S105 (a tag key, not a secret)
PARAMETER_TAG = "lustrain-parameter-{}"


def secret_session_tags(secrets: dict[str, str]) -> list[dict[str, str]]:
    """The session tags that name a run's code.secrets (at most spec.MAX_SECRETS, the policy's slots)."""
    tags = []
    for slot, (_, arn) in enumerate(sorted(secrets.items()), start=1):
        key = SECRET_TAG if arn.split(":")[2] == "secretsmanager" else PARAMETER_TAG
        tags.append({"Key": key.format(slot), "Value": secret_name(arn)})
    return tags


def run_session_tags(job: Job, training_job: str) -> list[dict[str, str]]:
    """The launcher session's tags, which SageMaker chains to the job's session of its execution role: the run's
    id and team (its results folder <prefix><team>/<job id>/ and its team's secrets), the SageMaker job's name (its
    log streams), for a run continuing another's checkpoint, that run's id as its record gives it (read-only
    there, in the same team's folder), and each secret code.secrets names (the only ones the role reads)."""
    tags = [
        {"Key": RUN_TAG, "Value": job.job_id},
        {"Key": TEAM_SESSION_TAG, "Value": job.launch.team},
        {"Key": JOB_TAG, "Value": training_job},
    ]
    if job.launch.resume is not None and job.launch.resume.run:
        tags.append({"Key": RESUME_TAG, "Value": job.launch.resume.run})
    return tags + secret_session_tags(job.spec.code.secrets)


def launcher(sts: Any, sagemaker: Any, settings: Settings, job: Job, training_job: str) -> Any:
    """A SageMaker client signed by a session of the stack's launcher role tagged with the run and the SageMaker
    job it creates, `training_job` (sts:AssumeRole with Tags); `sagemaker` itself where the stack names no launcher
    role (its jobs' role then reaches no run's objects)."""
    role_arn = settings.extra.get(LAUNCHER_ROLE_SETTING, "").strip()
    if not role_arn or sts is None:
        return sagemaker
    credentials = sts.assume_role(
        RoleArn=role_arn,
        RoleSessionName=job.job_id[:64],
        Tags=run_session_tags(job, training_job),
        DurationSeconds=900,
    )["Credentials"]
    return boto3.session.Session().client(
        "sagemaker",
        region_name=sagemaker.meta.region_name,
        endpoint_url=sagemaker.meta.endpoint_url,
        config=sagemaker.meta.config,
        aws_access_key_id=credentials["AccessKeyId"],
        aws_secret_access_key=credentials["SecretAccessKey"],
        aws_session_token=credentials["SessionToken"],
    )


def build_training_request(
    document: dict[str, Any],
    *,
    training_job_name: str,
    settings: Settings,
) -> dict[str, Any]:
    """The whole CreateTrainingJob request of a run, from the state document (job, network, filesystem, code)."""
    return aws_requests.training_job(
        Run.parse(document, "network", "filesystem", "code"), training_job_name, settings
    )


# --------------------------------------------------------------------------- the tokens table


def token_key(name: str) -> dict[str, Any]:
    """The tokens table's key of a training job."""
    return {"training_job_name": {"S": name}}


def get_token_item(ddb: Any, settings: Settings, name: str) -> dict[str, Any] | None:
    answer = ddb.get_item(TableName=settings.tokens_table, Key=token_key(name), ConsistentRead=True)
    item = answer.get("Item")
    return records.from_item(item) if item else None


def describe_training_job(sagemaker: Any, name: str) -> dict[str, Any] | None:
    """DescribeTrainingJob's answer, or None where SageMaker knows no such job."""
    try:
        return dict(sagemaker.describe_training_job(TrainingJobName=name))
    except ClientError as exc:
        if training_job_missing(exc):
            return None
        raise


def ended_attempt(
    training_job: str, status: str, *, ddb: Any, sagemaker: Any, settings: Settings
) -> tuple[records.JobRecord, dict[str, Any]] | str:
    """The run and DescribeTrainingJob's answer of an attempt an event says ended with `status`, once both bear it
    out: the job is attempt n of a run of this stack (start_training names it "<spec name>-<8 hex>-<n>"), and
    SageMaker says that status. Otherwise why not, in words. A function can be invoked with any payload: what it
    tells of an attempt is what SageMaker says, never the event's words."""
    job_id, _, number = training_job.rpartition("-")
    record = records.get(ddb, settings.jobs_table, job_id) if job_id and number.isdigit() else None
    if record is None or training_job_name(record.name, job_id, int(number)) != training_job:
        return "the training job is no run's of this stack"
    described = describe_training_job(sagemaker, training_job)
    if described is None:
        return "SageMaker knows no such training job: not announced"
    said = str(described.get("TrainingJobStatus", ""))
    if said != status:
        return f"the event says {status}, SageMaker says {said or 'nothing'}: not announced"
    return record, described


def _job_status(sagemaker: Any, name: str) -> str | None:
    description = describe_training_job(sagemaker, name)
    return None if description is None else str(description["TrainingJobStatus"])


#: a training job in one of these still holds (or is releasing) its instances
LIVE = frozenset({"InProgress", "Stopping"})


def _adopt(
    ddb: Any, sagemaker: Any, settings: Settings, job: Job, token: str, record: records.JobRecord
) -> dict[str, Any] | None:
    """A retried invocation: the job of the latest attempt not yet judged, whatever its state, now answers to this
    task's token (or its answered end is given to this task). None when there is no such job."""
    if record.attempt_judged:
        return None
    attempts = record.attempt
    name = training_job_name(job.spec.name, job.job_id, attempts)
    status = _job_status(sagemaker, name)
    if status is None:
        return None  # the attempt's start never created its job (SageMaker refused it, or it stopped before)
    for _ in range(2):  # a second look when the token's state changed under us
        item = get_token_item(ddb, settings, name)
        if item is not None and item.get("status") == CALLBACK_SENT and status not in LIVE:
            _answered_end(item, name, status)
        if _move_token(ddb, settings, job, name, attempts, token, item):
            return {"training_job_name": name, "attempt": attempts, "adopted": True, "status": status}
    raise RuntimeError(f"the tokens item of {name} kept changing while start_training adopted the job")


def _move_token(
    ddb: Any, settings: Settings, job: Job, name: str, attempt: int, token: str, item: dict[str, Any] | None
) -> bool:
    """The job's tokens item now waits with `token`; False when the item changed since it was read."""
    if item is None:  # a job without its item (it outlived the item's TTL): the item is made again
        try:
            _store_token(ddb, settings, job, name, attempt, token, time.time())
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                return False
            raise
        return True
    try:
        ddb.update_item(
            TableName=settings.tokens_table,
            Key=token_key(name),
            UpdateExpression="SET #token = :token, #status = :waiting, adopted_at = :now REMOVE outcome, answered_at",
            ConditionExpression="#token = :was AND #status = :status",
            ExpressionAttributeNames={"#token": "token", "#status": "status"},
            ExpressionAttributeValues={
                ":token": {"S": token},
                ":was": {"S": str(item.get("token"))},
                ":status": {"S": str(item.get("status"))},
                ":now": {"S": records.now_iso()},
                ":waiting": {"S": WAITING},
            },
        )
    except ClientError as exc:
        if error_code(exc) == CONDITION_FAILED:
            return False
        raise
    return True


def _answered_end(item: dict[str, Any], name: str, status: str) -> None:
    """Give this task the end on_training_event answered to the earlier try's token: raise it."""
    outcome = item.get("outcome") or {}
    if status == "Completed" and outcome.get("training_job_name") == name:
        raise TrainingJobCompleted(json.dumps(outcome))
    error = ALL_ERRORS.get(str(outcome.get("error")), TrainingFailed)
    cause = str(outcome.get("cause") or f"training job {name} ended {status}")
    raise error(cause, training_job_name=name, adopted=True)


def _live_jobs(sagemaker: Any, run: Run, upto: int) -> tuple[list[str], float]:
    """The run's jobs of attempts 1..upto still InProgress or Stopping, and what those attempts cost."""
    live: list[str] = []
    spent = 0.0
    for earlier in range(1, upto + 1):
        name = training_job_name(run.job.spec.name, run.job.job_id, earlier)
        try:
            described = sagemaker.describe_training_job(TrainingJobName=name)
        except ClientError as exc:
            if training_job_missing(exc):
                continue  # an attempt SageMaker refused: nothing billed
            raise
        if described.get("TrainingJobStatus") in LIVE:
            live.append(f"{name} ({described['TrainingJobStatus']})")
        spent += attempt_cost_usd(run, billed_seconds(described))
    return live, spent


def _store_token(
    ddb: Any,
    settings: Settings,
    job: Job,
    name: str,
    attempt: int,
    token: str,
    now: float,
    budget: AttemptBudget | None = None,
) -> None:
    compute = job.spec.compute
    longest = max(compute.max_runtime_hours, compute.wait_hours or 0) * 3600
    item = {
        "training_job_name": name,
        "token": token,
        "job_id": job.job_id,
        "attempt": attempt,
        "archive_target": archive_target(settings, job.job_id),
        "spot": job.spec.compute.spot,
        # what the budget left this attempt; where it `binds` (it set MaxRuntimeInSeconds), reaching that runtime
        # ends the run BudgetExceeded
        "budget": budget.to_dict() if budget is not None else None,
        "status": WAITING,
        "created_at": records.now_iso(),
        "expires_at": int(now + longest + TOKEN_GRACE_SECONDS),
    }
    ddb.put_item(
        TableName=settings.tokens_table,
        Item={key: records.to_attribute(value) for key, value in item.items()},
        ConditionExpression="attribute_not_exists(training_job_name)",
    )


def attempt_runtime(
    run: Run, sagemaker: Any, budget: AttemptBudget | None, now: float
) -> tuple[int | None, AttemptBudget | None]:
    """The runtime the attempt's StoppingCondition gets (None: compute.max_runtime_hours) and its budget.
    What the budget leaves, or for a run on a training plan that runtime capped to its capacity's usable end, from
    the capacity's start (steps/training_plans.job_runtime_seconds: the wait Pending for a Scheduled capacity is not
    run time). Where the plan's end sets it, the budget does not bind (reaching it is not BudgetExceeded)."""
    runtime = budget.runtime_seconds if budget is not None else None
    plan = run.job.launch.training_plan
    if plan is None:
        return runtime, budget
    compute = run.job.spec.compute
    wanted = runtime if runtime is not None else run.job.launch.max_runtime_seconds
    described = training_plans.describe(sagemaker, plan.arn)
    allowed = training_plans.job_runtime_seconds(
        described, now, instance_type=compute.instance_type, instance_count=compute.instance_count, runtime_s=wanted
    )
    if allowed is None or allowed < MIN_RUNTIME_SECONDS:
        raise QuotaExceeded(
            f"the training plan {plan.name} has no reserved capacity left for {compute.instance_count} x "
            f"{compute.instance_type} with {MIN_RUNTIME_SECONDS} s before its usable end (each ends for its jobs "
            f"{training_plans.TERMINATION_LEAD_S // 60} minutes before its end)",
            quota_code="training-plan",
            quota_name=f"training plan {plan.name}",
            plan_status=str(described.get("Status")),
        )
    if budget is not None and budget.binds and allowed < budget.runtime_seconds:
        budget = replace(budget, binds=False)
    return allowed, budget


def start_training(
    document: dict[str, Any],
    *,
    sagemaker: Any,
    ddb: Any,
    settings: Settings,
    clock: Callable[[], float] = time.time,
    sts: Any = None,
) -> dict[str, Any]:
    """Start (or adopt) the run's training job; returns {training_job_name, attempt} while the task waits.
    The job is created in a launcher session tagged with the run (`launcher`, with `sts`)."""
    run = Run.parse(document, "network", "filesystem", "code")
    job = run.job
    token = document.get("task_token")
    if not token or not isinstance(token, str):
        raise SpecInvalid.one(
            "task_token",
            token or MISSING,
            "start_training runs as a waitForTaskToken task: pass $$.Task.Token",
        )
    record = records.require(ddb, settings.jobs_table, job.job_id)
    try:
        adopted = _adopt(ddb, sagemaker, settings, job, token, record)
    except LustrainError:
        queue.release_hold(ddb, settings, job.spec.compute, job.job_id)
        raise
    if adopted is not None:
        queue.release_hold(ddb, settings, job.spec.compute, job.job_id)
        return adopted

    live, spent = _live_jobs(sagemaker, run, record.attempt)
    if live:
        queue.release_hold(ddb, settings, job.spec.compute, job.job_id)
        raise TrainingJobStillRunning(
            f"run {job.job_id} still has {', '.join(live)}: no other training job starts beside a live one",
            training_jobs=live,
        )
    attempt = records.count_attempt(ddb, settings.jobs_table, job.job_id)
    name = training_job_name(job.spec.name, job.job_id, attempt)
    budget = attempt_budget(run, spent, settings)
    if budget is not None and budget.runtime_seconds < MIN_RUNTIME_SECONDS:
        raise BudgetExceeded(
            f"the budget of ${budget.limit_usd:,.2f} ({budget.source}) leaves attempt {attempt} "
            f"{budget.runtime_seconds} s of training after ${budget.spent_usd:,.2f} spent by the attempts before "
            f"it: under the {MIN_RUNTIME_SECONDS} s worth starting a fleet for",
            **budget.to_dict(),
        )
    runtime, budget = attempt_runtime(run, sagemaker, budget, clock())
    request = aws_requests.training_job(run, name, settings, runtime)
    _store_token(ddb, settings, job, name, attempt, token, clock(), budget)
    records.add_resources(ddb, settings.jobs_table, job.job_id, [{"type": RESOURCE_TYPE, "id": name}])
    try:
        launcher(sts, sagemaker, settings, job, request["TrainingJobName"]).create_training_job(**request)
    except ClientError as exc:
        if _job_status(sagemaker, name) is not None:
            # The job exists though the answer was an error: a 5xx after SageMaker committed it, or botocore's
            # retry meeting the job its first try created. It is this run's, and its token already waits for it:
            # starting another attempt would pay for a second fleet.
            queue.release_hold(ddb, settings, job.spec.compute, job.job_id)
            return {"training_job_name": name, "attempt": attempt, "adopted": True}
        ddb.delete_item(TableName=settings.tokens_table, Key=token_key(name))
        if error_code(exc) == QUOTA_REFUSED:
            # another workload took the quota since the admission: the run goes back to the queue, in its place
            # (the run policy's quota class; next_attempt does not count it as an attempt)
            queue.release_hold(ddb, settings, job.spec.compute, job.job_id)
            compute = job.spec.compute
            raise QuotaExceeded(
                f"SageMaker refused {compute.instance_count} x {compute.instance_type}: "
                f"{exc.response.get('Error', {}).get('Message', '')} (quota "
                f"'{job.launch.quota.name}'; back to the capacity queue)",
                training_job_name=name,
                instance_type=compute.instance_type,
                instance_count=compute.instance_count,
            ) from exc
        raise
    # the job exists and holds its instances in SageMaker's count: the queue's promise is kept
    queue.release_hold(ddb, settings, job.spec.compute, job.job_id)
    return {
        "training_job_name": name,
        "attempt": attempt,
        "adopted": False,
        "image": request["AlgorithmSpecification"]["TrainingImage"],
        "max_runtime_seconds": request["StoppingCondition"]["MaxRuntimeInSeconds"],
        "budget": budget.to_dict() if budget is not None else None,
    }
