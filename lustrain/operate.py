"""Operate runs of a deployed stack (or of `lustrain local up`): list them, look at one, cancel one.

The same functions serve the CLI (`lustrain runs`, `status`, `cancel`) and a notebook (`import lustrain`):

    stack = lustrain.Stack.locate("lustrain")          # the stack's outputs: state machine, jobs table, buckets
    for run in lustrain.runs(stack): print(run.name, run.state, run.cost_so_far_usd)
    lustrain.status(stack, "gpt-small").timeline
    lustrain.cancel(stack, "gpt-small")

A RUN is named by its job id, its execution's name or ARN, or its spec name; a spec name that several runs share
is ambiguous, and the error lists them. Against the twin, set AWS_ENDPOINT_URL to the URL `lustrain local up`
prints and use its stack (lustrain-twin).
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import boto3
from botocore.exceptions import ClientError
from lustrain_core.aws_errors import training_job_missing
from lustrain_core.errors import LustrainError, UsageInvalid
from lustrain_core.steps import prepare, records
from lustrain_core.steps.budget import cost_so_far_usd
from lustrain_core.steps.execution_end import CANCEL_ERROR
from lustrain_core.steps.notify import cause_text
from lustrain_core.steps.records import JobRecord
from lustrain_trainer.metrics import EVALUATION, STEP

DEFAULT_STACK = "lustrain"
#: the trainer's log lines name their step (its MetricDefinitions' `step` reads the same)
STEP_IN_LOG = re.compile(r"\bstep=(\d+)")
ENDED = frozenset({"SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"})
FINISHED = records.FINISHED
#: the state `runs` and `status` show for a record that says RUNNING though no execution carries its run: a function
#: invoked alone registered it (`sam local invoke`, `lustrain local invoke`), or its execution is gone. `lustrain
#: cancel` ends it at once, the sweeper at its next round (steps/sweep.py end_records_left_running).
ORPHANED = "ORPHANED"


class RunNotFound(LustrainError):
    """No run of the stack is named so (or the name is ambiguous)."""


@dataclass(frozen=True)
class Stack:
    """Where a stack keeps its runs: the CloudFormation outputs of a deployed (or twin) lustrain stack."""

    name: str
    state_machine_arn: str
    jobs_table: str
    jobs_bucket: str
    artifacts_bucket: str
    session: Any = field(default=None, compare=False, repr=False)
    #: the MLflow tracking server the stack logs its runs to (its MlflowTrackingUri output), None where none
    mlflow_tracking_uri: str | None = None

    @classmethod
    def locate(cls, name: str = DEFAULT_STACK, session: Any = None) -> Stack:
        session = session or boto3.Session()
        try:
            stacks = session.client("cloudformation").describe_stacks(StackName=name)["Stacks"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ValidationError":
                raise UsageInvalid.one("--stack", name, "no such CloudFormation stack in this account and region") from None
            raise
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}
        needed = ("StateMachineArn", "JobsTableName", "JobsBucketName", "ArtifactsBucketName")
        missing = [key for key in needed if key not in outputs]
        if missing:
            raise UsageInvalid.one("--stack", name, f"is not a lustrain stack: no output {', '.join(missing)}")
        return cls(
            name=name,
            state_machine_arn=outputs["StateMachineArn"],
            jobs_table=outputs["JobsTableName"],
            jobs_bucket=outputs["JobsBucketName"],
            artifacts_bucket=outputs["ArtifactsBucketName"],
            session=session,
            mlflow_tracking_uri=outputs.get("MlflowTrackingUri") or None,
        )

    def client(self, service: str) -> Any:
        return (self.session or boto3.Session()).client(service)

    def session_credentials(self) -> Any:
        return (self.session or boto3.Session()).get_credentials()

    def execution_arn(self, execution: str) -> str:
        arn = records.execution_arn(self.state_machine_arn, execution)
        if arn is None:
            raise UsageInvalid.one("--stack", self.name, "its StateMachineArn output is not a state machine's ARN")
        return arn


# --------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class RunSummary:
    job_id: str
    name: str
    execution: str | None
    state: str
    attempt: int
    instances: int
    instance_type: str
    created_at: str
    elapsed_s: float
    cost_so_far_usd: float
    budget_usd: float | None
    error: str | None
    #: train, or prepare for a data preparation run (kind: prepare: its stages are processing jobs)
    kind: str = records.TRAIN

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _records(stack: Stack, unrecorded: bool = True) -> list[JobRecord]:
    """Every run's record, oldest first: the jobs table's, and (unless told not to) one for each execution that
    recorded no run."""
    found = records.scan(stack.client("dynamodb"), stack.jobs_table)
    if unrecorded:
        found += _unrecorded(stack, {r.execution for r in found if r.execution})
    return sorted(found, key=lambda r: r.created_at)


def _unrecorded(stack: Stack, recorded: set[str]) -> list[JobRecord]:
    """A record for each execution of the stack that register_job never recorded: a spec it refused (the
    execution FAILED with SpecInvalid or SpecForbidden), or one still being registered (RUNNING). The run is named
    by its execution; its error is the execution's, its cause the error's message. An execution that SUCCEEDED
    without a record was a duplicate drop: its run is the first drop's, listed once."""
    sfn = stack.client("stepfunctions")
    found: list[JobRecord] = []
    try:
        for page in sfn.get_paginator("list_executions").paginate(stateMachineArn=stack.state_machine_arn):
            for listed in page.get("executions", []):
                if listed["name"] in recorded or listed["status"] == "SUCCEEDED":
                    continue
                found.append(_execution_record(sfn.describe_execution(executionArn=listed["executionArn"])))
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in {"StateMachineDoesNotExist", "ExecutionDoesNotExist"}:
            return found
        raise
    return found


def _execution_record(execution: dict[str, Any]) -> JobRecord:
    """What a run's record would say of an execution that has none: named by the execution and the spec's key."""
    try:
        dropped = json.loads(execution.get("input") or "{}")["detail"]
        bucket, key = str(dropped["bucket"]["name"]), str(dropped["object"]["key"])
    except (ValueError, KeyError, TypeError):
        bucket, key = "", ""
    record = JobRecord(
        job_id=execution["name"],
        execution=execution["name"],
        created_at=_iso(execution["startDate"]),
        spec={"name": key.rsplit("/", 1)[-1].rsplit(".", 1)[0]},
        source={"uri": f"s3://{bucket}/{key}"} if key else {},
        unrecorded=True,
    )
    if execution["status"] == "RUNNING":
        return record
    return dataclasses.replace(
        record,
        status="FAILED",
        finished_at=_iso(execution.get("stopDate") or execution["startDate"]),
        error={"Error": execution.get("error") or execution["status"], "Cause": execution.get("cause") or ""},
    )


def _execution(stack: Stack, record: JobRecord) -> dict[str, Any] | None:
    if not record.execution:
        return None
    try:
        return dict(stack.client("stepfunctions").describe_execution(executionArn=stack.execution_arn(record.execution)))
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ExecutionDoesNotExist":
            return None
        raise


def training_jobs(stack: Stack, record: JobRecord) -> list[dict[str, Any]]:
    """Every training attempt of the run, oldest first (attempt n's job is named by start_training's rule)."""
    sagemaker = stack.client("sagemaker")
    found = []
    for name in record.training_job_names():
        try:
            found.append(dict(sagemaker.describe_training_job(TrainingJobName=name)))
        except ClientError as exc:
            if not training_job_missing(exc):
                raise
    return found


def _summary(stack: Stack, record: JobRecord, now: float) -> RunSummary:
    execution = _execution(stack, record)
    state = record.status or "UNKNOWN"
    if execution is not None and execution["status"] != "RUNNING":
        # the execution's end is the truth for a run whose teardown has not written the record yet
        state = state if record.finished else str(execution["status"])
    elif execution is None and not record.finished and not record.unrecorded:
        state = ORPHANED
    started = record.started_at or now
    ended = record.ended_at if state != "RUNNING" else None
    # a data preparation run's instances are its processing jobs' (its spec has no compute section)
    preparation = prepare.of_record(record)
    return RunSummary(
        job_id=record.job_id,
        name=record.name,
        execution=record.execution or None,
        state=state,
        attempt=record.attempt,
        instances=preparation.instances if preparation is not None else record.instance_count,
        instance_type=preparation.instance_type if preparation is not None else record.instance_type,
        created_at=record.created_at,
        elapsed_s=round((ended or now) - started, 1),
        cost_so_far_usd=cost_so_far_usd(record, training_jobs(stack, record), now),
        budget_usd=record.budget_usd,
        error=record.error_name,
        kind=records.TRAIN if preparation is None else records.PREPARE,
    )


def runs(stack: Stack, now: float | None = None) -> list[RunSummary]:
    """Every run of the stack, oldest first."""
    moment = time.time() if now is None else now
    return [_summary(stack, record, moment) for record in _records(stack)]


def find_run(stack: Stack, run: str) -> JobRecord:
    """The record of the run named `run`: a job id, an execution name or ARN, or a spec name shared by no other.
    The jobs table is asked first; the executions that recorded no run only when it has none so named (`watch`
    asks at each look, and a stack's executions are many more than its refused ones)."""
    recorded = _records(stack, unrecorded=False)
    found = _named(recorded, run)
    if found is None:
        everything = recorded + _unrecorded(stack, {r.execution for r in recorded if r.execution})
        found = _named(everything, run)
    if found is None:
        raise UsageInvalid.one(
            "RUN", run, f"no run of stack {stack.name} has this job id, execution name or spec name"
        )
    return found


def _named(found: list[JobRecord], run: str) -> JobRecord | None:
    execution = run.rsplit(":", 1)[-1] if run.startswith("arn:") else run
    for exact in ([r for r in found if r.job_id == run], [r for r in found if r.execution == execution]):
        if exact:
            return exact[0]
    named = [r for r in found if r.name == run]
    if len(named) == 1:
        return named[0]
    if named:
        listed = ", ".join(f"{r.job_id} ({r.status}, {r.created_at})" for r in named)
        raise UsageInvalid.one("RUN", run, f"is the name of {len(named)} runs; name one by its job id: {listed}")
    return None


def started_from(stack: Stack, spec_s3_uri: str, timeout_s: float = 60.0, poll_s: float = 1.0) -> JobRecord | None:
    """The record of the run a dropped spec started (register_job writes it within seconds of the drop; a spec it
    refused is a FAILED run named by its execution, with the refusal as its error), or None when none appeared
    within `timeout_s` (the drop started no execution)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for record in _records(stack):
            registering = record.unrecorded and record.status == "RUNNING"
            if record.spec_uri == spec_s3_uri and not registering:
                return record
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)


# --------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class StateSpan:
    state: str
    entered_at: str
    exited_at: str | None
    seconds: float | None


@dataclass(frozen=True)
class RunStatus:
    run: RunSummary
    execution_status: str | None
    timeline: list[StateSpan]
    quota: dict[str, Any]
    #: the run's place in the capacity queue, as check_quota last recorded it: state (queued | admitted), pool,
    #: position and ahead_instances while queued, queued_s, admitted_at once admitted; {} before the first look
    queue: dict[str, Any]
    file_system: dict[str, Any] | None
    training_job: dict[str, Any] | None
    cause: str | None
    resources_left: list[dict[str, Any]]
    #: compute.training_plan as register_job found it (launch.TrainingPlan), with its status and free instances now
    training_plan: dict[str, Any] | None = None
    #: the model's evaluation as the training jobs report it (evaluation()); None before any figure
    evaluation: dict[str, Any] | None = None
    #: a data preparation run's stages that started: each processing job's stage, name, status, instances and
    #: failure reason (processing_jobs())
    stages: list[dict[str, Any]] = field(default_factory=list)
    #: where the run's MLflow run is (mlflow_run()), where the stack logs to MLflow
    mlflow: dict[str, Any] | None = None
    #: the warm pools its training jobs kept and what they billed (warm_pools()); None for a run that keeps none
    warm_pool: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _iso(moment: Any) -> str:
    return moment.astimezone(UTC).strftime(records.ISO_FORMAT) if isinstance(moment, datetime) else str(moment)


#: The history events that end an execution: a state still open then (the training state of a run stopped while
#: it trained: StopExecution runs no Catch, so the state never exits) ends with the execution.
EXECUTION_ENDS = frozenset({"ExecutionSucceeded", "ExecutionFailed", "ExecutionAborted", "ExecutionTimedOut"})


def timeline(history: list[dict[str, Any]]) -> list[StateSpan]:
    """Each state the execution entered, when, and for how long (None while it is in it)."""
    spans: list[StateSpan] = []
    open_at: dict[str, datetime] = {}
    order: list[str] = []
    closed: dict[int, tuple[datetime, datetime | None]] = {}
    for event in history:
        when = event["timestamp"]
        if event.get("type") in EXECUTION_ENDS:
            for index, (entered, exited) in closed.items():
                if exited is None:
                    closed[index] = (entered, when)
        elif "stateEnteredEventDetails" in event:
            name = event["stateEnteredEventDetails"]["name"]
            open_at[name] = when
            order.append(name)
            closed[len(order) - 1] = (when, None)
        elif "stateExitedEventDetails" in event:
            name = event["stateExitedEventDetails"]["name"]
            for index in range(len(order) - 1, -1, -1):
                if order[index] == name and closed[index][1] is None:
                    closed[index] = (closed[index][0], when)
                    break
    for index, name in enumerate(order):
        entered, exited = closed[index]
        spans.append(
            StateSpan(
                name,
                _iso(entered),
                _iso(exited) if exited else None,
                round((exited - entered).total_seconds(), 1) if exited else None,
            )
        )
    return spans


def _training_plan(stack: Stack, record: JobRecord) -> dict[str, Any] | None:
    """The run's training plan as recorded, and as DescribeTrainingPlan shows it now (when the caller may ask)."""
    plan = record.training_plan
    if not plan:
        return None
    shown = dict(plan)
    try:
        now = stack.client("sagemaker").describe_training_plan(TrainingPlanName=plan["arn"])
    except ClientError as exc:
        shown["now"] = f"not described ({exc.response.get('Error', {}).get('Code')})"
        return shown
    shown["now"] = {
        "status": now.get("Status"),
        "available_instances": now.get("AvailableInstanceCount"),
        "in_use_instances": now.get("InUseInstanceCount"),
    }
    return shown


#: the figures evaluation() gathers: the trainer's own metric names (lustrain_trainer.metrics)
EVALUATION_FIGURES = (STEP, "tokens_seen", "train_loss", *EVALUATION)


def evaluation(jobs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The model's evaluation from the run's training jobs (oldest first), as DescribeTrainingJob gives it: each
    figure the newest attempt's that reports it (FinalMetricDataList, the last value the trainer logged: a
    resumed attempt that has not evaluated yet leaves the previous attempt's figures in place; tokens_seen counts
    from the run's first step). `final` is true once the newest attempt Completed: its figures are then the ones
    its summary.json holds. No download: the same figures are the archive's final_metrics.json."""
    figures: dict[str, Any] = {}
    for job in jobs:
        for metric in job.get("FinalMetricDataList") or []:
            name = metric.get("MetricName")
            if name in EVALUATION_FIGURES:
                figures[name] = float(metric["Value"])
    if not any(name in figures for name in ("tokens_seen", "train_loss", *EVALUATION)):
        return None
    for name in (STEP, "tokens_seen"):
        if name in figures:
            figures[name] = int(figures[name])
    return {
        "final": bool(jobs) and jobs[-1].get("TrainingJobStatus") == "Completed",
        **{name: figures.get(name) for name in EVALUATION_FIGURES},
    }


def evaluation_text(shown: dict[str, Any]) -> str:
    """One line of an evaluation, as `status` and `report` show it:
    final at step 6: val_loss 2.4012, perplexity 11.04, 1.4521 bits/byte; train_loss 2.3456; 491,520 tokens seen"""
    parts = []
    for name, label, fmt in (("val_loss", "val_loss", "{:.4f}"), ("val_ppl", "perplexity", "{:,.2f}"),
                             ("val_bpb", "bits/byte", "{:.4f}")):
        if shown.get(name) is not None:
            value = fmt.format(shown[name])
            parts.append(f"{value} {label}" if name == "val_bpb" else f"{label} {value}")
    text = ", ".join(parts) or "no validation yet"
    if shown.get("train_loss") is not None:
        text += f"; train_loss {shown['train_loss']:.4f}"
    if shown.get("tokens_seen") is not None:
        text += f"; {shown['tokens_seen']:,} tokens seen"
    where = f" at step {shown[STEP]:,}" if shown.get(STEP) is not None else ""
    return f"{'final' if shown.get('final') else 'latest'}{where}: {text}"


def warm_pools(jobs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The warm pools the run's training jobs (oldest first) kept, as DescribeTrainingJob's WarmPoolStatus gives
    them: each one's status, its retained billable seconds (ResourceRetainedBillableTimeInSeconds) and what SageMaker
    bills for them ("ResourceRetainedBillableTimeInSeconds * InstanceCount", the API reference's WarmPoolStatus),
    with the totals; None for a run whose jobs keep none. An Available pool still bills, up to its job's
    KeepAlivePeriodInSeconds after the job's end."""
    pools = []
    for job in jobs:
        status = job.get("WarmPoolStatus")
        if not isinstance(status, dict) or not status.get("Status"):
            continue
        billed = int(status.get("ResourceRetainedBillableTimeInSeconds") or 0)
        resources = job.get("ResourceConfig") or {}
        instances = int(resources.get("InstanceCount") or 1)
        pools.append(
            {
                "training_job": job["TrainingJobName"],
                "status": status["Status"],
                "billed_s": billed,
                "instances": instances,
                "billed_instance_s": billed * instances,
                "keep_alive_s": resources.get("KeepAlivePeriodInSeconds"),
                "reused_by": status.get("ReusedByJob"),
            }
        )
    if not pools:
        return None
    return {
        "pools": pools,
        "billed_s": sum(p["billed_s"] for p in pools),
        "billed_instance_s": sum(p["billed_instance_s"] for p in pools),
        "available": [p["training_job"] for p in pools if p["status"] == "Available"],
    }


def warm_pool_text(shown: dict[str, Any]) -> str:
    """One line of the run's warm pools, as `status` and `report` show them:
    run-1 Terminated, 92 s billed x 2 instances = 184 instance-seconds"""
    parts = []
    for pool in shown["pools"]:
        text = (
            f"{pool['training_job']} {pool['status']}, {pool['billed_s']:,} s billed x {pool['instances']} "
            f"instance{'s' if pool['instances'] != 1 else ''} = {pool['billed_instance_s']:,} instance-seconds"
        )
        if pool["status"] == "Available" and pool.get("keep_alive_s"):
            text += f" (still billing, up to {int(pool['keep_alive_s']):,} s after the job's end)"
        elif pool.get("reused_by"):
            text += f" (taken over by {pool['reused_by']})"
        parts.append(text)
    return "; ".join(parts)


def processing_jobs(stack: Stack, record: JobRecord) -> list[dict[str, Any]]:
    """The stages of a data preparation run that have a processing job, in order; [] for a training run."""
    preparation = prepare.of_record(record)
    if preparation is None:
        return []
    found = []
    for stage in preparation.stages:
        job = prepare.describe(stack.client("sagemaker"), preparation.job_name(stage))
        if job is None:
            break
        found.append(
            {
                "stage": stage,
                "name": job["ProcessingJobName"],
                "status": job["ProcessingJobStatus"],
                "instances": job["ProcessingResources"]["ClusterConfig"]["InstanceCount"],
                "failure_reason": job.get("FailureReason"),
            }
        )
    return found


def status(stack: Stack, run: str, now: float | None = None, with_mlflow: bool = False) -> RunStatus:
    """One run: its summary, the state-by-state timeline, its quota, file system, training job and last metrics,
    the warm pools its jobs kept and their billed seconds;
    `with_mlflow`, where its MLflow run is (a call to the tracking server: `lustrain status` asks, the dashboard's
    looks and the report do not)."""
    moment = time.time() if now is None else now
    record = find_run(stack, run)
    summary = _summary(stack, record, moment)
    execution = _execution(stack, record)
    history: list[dict[str, Any]] = []
    if execution is not None:
        sfn = stack.client("stepfunctions")
        for page in sfn.get_paginator("get_execution_history").paginate(executionArn=execution["executionArn"]):
            history += page["events"]
    jobs = training_jobs(stack, record)
    training = None
    if jobs:
        latest = jobs[-1]
        training = {
            "name": latest["TrainingJobName"],
            "status": latest["TrainingJobStatus"],
            "secondary_status": latest.get("SecondaryStatus"),
            "failure_reason": latest.get("FailureReason"),
            "metrics": {m["MetricName"]: m["Value"] for m in latest.get("FinalMetricDataList", [])},
        }
    file_system = None
    fs_ids = record.resources_of(records.FILE_SYSTEM)
    if fs_ids:
        try:
            described = stack.client("fsx").describe_file_systems(FileSystemIds=fs_ids[-1:])["FileSystems"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "FileSystemNotFound":
                raise
            described = []
        if described:
            fs = described[0]
            lustre = fs.get("LustreConfiguration", {})
            file_system = {
                "id": fs["FileSystemId"],
                "lifecycle": fs.get("Lifecycle"),
                "deployment_type": lustre.get("DeploymentType"),
                "storage_gib": fs.get("StorageCapacity"),
            }
    cause = record.cause if record.error is not None else (execution or {}).get("cause")
    return RunStatus(
        training_plan=_training_plan(stack, record),
        evaluation=evaluation(jobs),
        run=summary,
        execution_status=(execution or {}).get("status"),
        timeline=timeline(history),
        quota=record.quota,
        queue=dict(record.queue),
        file_system=file_system,
        training_job=training,
        # in words: a Lambda function's error is its message (its stack trace stays in the function's log)
        cause=cause_text(cause) or None,
        # the ledger: what the run created and its teardown has not deleted (all it holds while it runs)
        resources_left=[dict(r) for r in record.resources],
        stages=processing_jobs(stack, record),
        mlflow=mlflow_run(stack, record) if with_mlflow else None,
        warm_pool=warm_pools(jobs),
    )


def mlflow_run(stack: Stack, record: JobRecord) -> dict[str, Any] | None:
    """Where the run's MLflow run is, read with the operator's credentials (they sign the calls to a SageMaker
    tracking server); what went wrong instead where the server cannot be read. None where the stack names none."""
    if not stack.mlflow_tracking_uri or record.kind != records.TRAIN:
        return None
    from lustrain_core.steps import tracking

    try:
        server = tracking.Server(tracking.parse_uri(stack.mlflow_tracking_uri), stack.session_credentials())
        return tracking.where(server, record)
    except (tracking.TrackingError, OSError, ValueError, KeyError) as exc:
        return {"tracking_uri": stack.mlflow_tracking_uri, "error": f"{type(exc).__name__}: {exc}"[:300]}


def progress(stack: Stack, run: str) -> tuple[int | None, int | None]:
    """(the last step the training log reports, the spec's max_steps hyperparameter): how far the model is."""
    record = find_run(stack, run)
    steps = [int(found.group(1)) for line in logs(stack, record.job_id) if (found := STEP_IN_LOG.search(line.message))]
    return (steps[-1] if steps else None), record.max_steps


#: How long `watch` waits, after the execution ended, for the run's teardown to write its end (a cancelled run's
#: teardown starts from the execution's end); past it, watch stops at the execution's status.
SETTLE_S = 120.0


def watch(stack: Stack, run: str, poll_s: float = 5.0, timeout_s: float | None = None) -> Iterator[RunStatus]:
    """The run's status every `poll_s` seconds, until the run has ended (its record SUCCEEDED or FAILED: the last
    status yielded is the end) or `timeout_s` passes."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    ended_at: float | None = None
    while True:
        now = status(stack, run)
        yield now
        if now.run.state in FINISHED or (deadline is not None and time.monotonic() > deadline):
            return
        if now.run.state != "RUNNING":
            ended_at = ended_at or time.monotonic()
            if time.monotonic() - ended_at > SETTLE_S:
                return
        time.sleep(poll_s)


@dataclass(frozen=True)
class Cancelled:
    job_id: str
    execution_arn: str
    stopped_at: str | None
    already_ended: str | None
    cause: str
    #: no execution carried the run: its record was ended here, and `left` is what it created (the sweeper's)
    orphaned: bool = False
    left: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cancel(stack: Stack, run: str) -> Cancelled:
    """Stop the run's execution; its teardown then starts from the execution's end (on_execution_end), which
    stops the training job and deletes what the run created. The cause names who cancelled it. A run no execution
    carries (ORPHANED) has its record ended here, FAILED with RunCancelled; what it created, if anything, is the
    sweeper's (its record then says the run ended and its execution is gone)."""
    record = find_run(stack, run)
    arn = stack.execution_arn(record.execution) if record.execution else ""
    described = _execution(stack, record)
    caller = stack.client("sts").get_caller_identity()["Arn"]
    cause = f"cancelled by {caller} with lustrain cancel"
    if described is None:
        if record.finished:
            return Cancelled(record.job_id, arn, record.finished_at, record.status, cause)
        why = "no execution carries the run (a function invoked alone registered it, or its execution is gone)"
        ended = records.end_if_running(
            stack.client("dynamodb"), stack.jobs_table, record.job_id,
            {"Error": CANCEL_ERROR, "Cause": f"{cause}: {why}"},
        )  # fmt: skip
        if not ended:  # a teardown ended it meanwhile
            again = find_run(stack, record.job_id)
            return Cancelled(record.job_id, arn, again.finished_at, again.status, cause)
        left = [dict(entry) for entry in record.resources]
        return Cancelled(record.job_id, arn, records.now_iso(), None, cause, orphaned=True, left=left)
    if described["status"] != "RUNNING":
        return Cancelled(record.job_id, arn, _iso(described.get("stopDate")), str(described["status"]), cause)
    answer = stack.client("stepfunctions").stop_execution(executionArn=arn, error=CANCEL_ERROR, cause=cause)
    return Cancelled(record.job_id, arn, _iso(answer.get("stopDate")), None, cause)


#: Where SageMaker writes a training job's output: one stream per host, `<job name>/algo-<n>-<epoch seconds>`.
TRAINING_LOG_GROUP = "/aws/sagemaker/TrainingJobs"


@dataclass(frozen=True)
class LogLine:
    timestamp_ms: int
    stream: str
    message: str

    @property
    def host(self) -> str:
        """algo-<n>, from the stream's name."""
        tail = self.stream.rsplit("/", 1)[-1]
        return tail.rsplit("-", 1)[0] if tail.count("-") >= 2 else tail

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "host": self.host}


def log_streams(record: JobRecord) -> list[tuple[str, str]]:
    """Where a run's jobs log: (log group, stream prefix) of each training attempt, or of each stage of a data
    preparation run (its processing jobs, /aws/sagemaker/ProcessingJobs)."""
    preparation = prepare.of_record(record)
    if preparation is not None:
        return prepare.log_streams(preparation)
    return [(TRAINING_LOG_GROUP, name + "/") for name in record.training_job_names()]


def logs(stack: Stack, run: str, since_ms: int | None = None) -> list[LogLine]:
    """The run's log lines (every training attempt or preparation stage, every host), merged in time order; only
    those after `since_ms` when given (what --follow asks for next)."""
    record = find_run(stack, run)
    client = stack.client("logs")
    lines: list[LogLine] = []
    for group, prefix in log_streams(record):
        params: dict[str, Any] = {"logGroupName": group, "logStreamNamePrefix": prefix}
        try:
            streams = [
                stream["logStreamName"]
                for page in client.get_paginator("describe_log_streams").paginate(**params)
                for stream in page.get("logStreams", [])
            ]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
                continue  # no job has written a line to this group in this account yet
            raise
        for stream in streams:
            request: dict[str, Any] = {"logGroupName": group, "logStreamName": stream, "startFromHead": True}
            if since_ms is not None:
                request["startTime"] = since_ms + 1
            while True:
                page = client.get_log_events(**request)
                lines += [LogLine(int(e["timestamp"]), stream, str(e["message"])) for e in page.get("events", [])]
                token = page.get("nextForwardToken")
                if not page.get("events") or token == request.get("nextToken"):
                    break
                request["nextToken"] = token
    return sorted(lines, key=lambda line: (line.timestamp_ms, line.stream))


def log_tail(stack: Stack, run: str, since_ms: int | None = None, limit: int = 50) -> list[LogLine]:
    """The lines of the run's current job's first host (rank 0, which logs the steps and metrics): its last
    `limit` lines, or those after `since_ms` when given. What a live view reads at each look: one stream,
    however many hosts the run has and however long its log already is."""
    record = find_run(stack, run)
    client = stack.client("logs")
    for group, prefix in reversed(log_streams(record)):
        try:
            listed = client.describe_log_streams(logGroupName=group, logStreamNamePrefix=prefix)["logStreams"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
                continue
            raise
        names = sorted(stream["logStreamName"] for stream in listed)
        if not names:
            continue  # this attempt or stage has written nothing yet: the one before it is the one going
        first = next((n for n in names if n[len(prefix) :].startswith("algo-1-")), names[0])
        request: dict[str, Any] = {"logGroupName": group, "logStreamName": first}
        if since_ms is None:
            page = client.get_log_events(**request, startFromHead=False, limit=limit)
            return [LogLine(int(e["timestamp"]), first, str(e["message"])) for e in page.get("events", [])]
        lines: list[LogLine] = []
        request.update(startTime=since_ms + 1, startFromHead=True)
        while True:
            page = client.get_log_events(**request)
            lines += [LogLine(int(e["timestamp"]), first, str(e["message"])) for e in page.get("events", [])]
            token = page.get("nextForwardToken")
            if not page.get("events") or token == request.get("nextToken"):
                return lines
            request["nextToken"] = token
    return []


def as_json(value: Any) -> str:
    return json.dumps(value.to_dict() if hasattr(value, "to_dict") else value, indent=2, default=str)
