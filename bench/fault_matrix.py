"""The fault matrix: every forward state of a run x every transient fault, plus each failure a run can end in.

Each case is one whole run on the twin (the real state machine and handlers, the stand-in trainer of
tests/e2e/stub_trainer, spec tests/e2e/matrix.yaml renamed after the case) with one fault armed for that run
alone. Runs whose stack settings agree share one twin and run at once, so the matrix costs about as long as its
slowest runs, not their sum. A case is correct when its run ends as expected, the fault did fire, a run that
succeeds has archived its model, and nothing the run created is left: no VPC, subnet, route table, endpoint or
security group, no file system, and no training job still InProgress when the run ended.

Expected endings, as the state machine (statemachine/training_job.asl.json) decides them:
- throttling, service-error: every Task state retries AwsThrottled / AwsUnavailable, and a failed asynchronous
  invocation of on_training_event is retried by Lambda -> SUCCEEDED;
- lost-create (create_network, create_filesystem, check_filesystem, start_training): the step's first Create* call
  is done but answers 500; the retry finds what it made (by tag, ClientRequestToken, the link's path, the job's
  name) -> SUCCEEDED, with one training job and nothing leaked;
- lambda-timeout: every Task state retries Sandbox.Timedout once, and every handler is idempotent: the retry
  finds what the timed-out invocation did (start_training adopts the training job the lost answer had started,
  rather than starting a second fleet) -> SUCCEEDED; on_training_event is retried by Lambda itself;
- the run policy (lustrain_core.recovery): capacity-error (every attempt) -> FAILED CapacityError after
  compute.max_attempts (3) training jobs; capacity-error-once and hardware-failure -> SUCCEEDED with two; user-error
  -> FAILED TrainingFailed after one; next_attempt's transient faults, after a first attempt with no capacity ->
  SUCCEEDED with two;
- quota-taken-once (SageMaker refuses the first CreateTrainingJob: ResourceLimitExceeded) -> back to the capacity
  queue, admitted again, SUCCEEDED with one training job (the refused one never existed);
- lost-create-subnet, -route-table, -group, -endpoint (create_network's CreateSubnet, CreateRouteTable,
  CreateSecurityGroup, CreateVpcEndpoint answered 500 after they were done): the retry finds each by the run's
  tags (the endpoint also by its ClientToken) -> SUCCEEDED with nothing leaked;
- timeout-mid-delete (the teardown's invocation answers Sandbox.Timedout at its first Delete* call and its handler
  deletes on beside the retry) and twice-at-once (two teardowns of the run at once) -> SUCCEEDED, nothing left;
- from outside the run while its job trains (OUTSIDE_ACTS): the sweeper at the run's deadline stops the
  execution and tears the run down -> ABORTED, nothing left; a forged ABORTED execution event for the live run,
  or for another state machine's execution of its name, a forged Failed event for its training job, and its first
  attempt's Failed event replayed while the second trains change nothing -> SUCCEEDED;
- fsx-failed, quota, stopped -> FAILED with the error class named for each;
- silent (the training job never reports) -> the task's HeartbeatSeconds fires States.Timeout -> the teardown
  must stop the job -> FAILED with TrainingTimedOut (a Fail state may not raise a States.* name; the Cause keeps
  it). That case runs in a twin of its own, whose heartbeat is a few seconds.

    .venv/bin/python bench/fault_matrix.py      prints the table, then cases=, correct=, leaks=, wall_s= lines;
                                                exit 1 if any case is wrong
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import boto3
import yaml
from lustrain_core.spec import JobSpec, validate_spec

from lustrain.twin import faults
from lustrain.twin.rehearse import (
    REGION,
    archived_objects,
    bucket_of,
    ensure_bucket,
    ensure_data,
    execution_history,
    latest_event_id,
    operator_session,
    registered_job,
    resources_left,
    submittable,
    twin,
)

E2E = Path(__file__).resolve().parents[1] / "tests" / "e2e"
SPEC = E2E / "matrix.yaml"
#: every case runs 1 instance at once; the account's quota leaves room for all of them
QUOTA = 64
#: the heartbeat of the `silent` case's twin: long enough for the steps before the training job
HEARTBEAT_S = 4
#: a job that must still be training when it is stopped (or when its run ends, or an event is forged) keeps
#: busy this long
BUSY_TRAINING_S = 30
#: the matrix waits for as long as its runs make progress (a state entered, a job's status, an event delivered):
#: it gives up only after this long with none at all, four times the longest quiet stretch a case has by design
#: (a job training BUSY_TRAINING_S with nothing to report), so a busy machine slows the matrix but never fails it
STALL_S = 4 * BUSY_TRAINING_S
#: How often the watch lists the executions: each look lists every execution of the machine (about 60 in the
#: matrix), which the twin serializes anew; a second is soon enough for runs that last tens of seconds (looking
#: every quarter second, the matrix took 125 CPU-seconds instead of 112: bench/suite_cpu.py tests/e2e/test_fault_matrix.py)
POLL_S = 1.0
#: how often the watch looks for progress (every running execution's newest event): a stall is a matter of
#: minutes, and each look asks Step Functions once per running run
PROGRESS_LOOK_S = 5.0
#: the template parameters a twin runs with, per group of cases; the default group's are rehearse's own
HEARTBEAT_PARAMETERS = {"TrainingHeartbeatSeconds": str(HEARTBEAT_S), "TrainingTimeoutSeconds": "600"}

Printer = Callable[[str], None]


@dataclass(frozen=True)
class Case:
    step: str
    fault: str
    status: str
    error: str | None = None
    parameters: tuple[tuple[str, str], ...] = ()
    hyperparameters: tuple[tuple[str, Any], ...] = ()
    #: training jobs the run must start: 1, unless the run policy starts another attempt after a failure
    training_jobs: int = 1
    #: faults armed with this one, for a step that only runs after another fault (next_attempt: a failed attempt)
    also: tuple[tuple[str, str], ...] = ()
    #: the run's training job trains until the bench releases it (OUTSIDE_ACTS: once what it did was handled)
    held: bool = False

    @property
    def forged(self) -> bool:
        """Something the bench itself does to the run (OUTSIDE_ACTS), not a fault of the twin."""
        return self.fault in OUTSIDE_ACTS

    @property
    def name(self) -> str:
        """The spec's name (and so the run's): the case itself, as AWS names allow."""
        return f"{self.step}-{self.fault}".replace("_", "-")

    @property
    def expected(self) -> str:
        return self.status + (f" {self.error}" if self.error else "")

    @property
    def raised(self) -> str | None:
        """The error the fault makes the step's task fail with, which the execution history must show.

        on_training_event is no task of the state machine: its failures show in Lambda's retries, not here."""
        if self.step == "on_training_event":
            return None
        if (self.step, self.fault) == ("start_training", "lost-create"):
            return None  # start_training finds the job behind the 500 itself and keeps it: no task fails
        return _RAISED.get(self.fault)

    def __str__(self) -> str:
        return f"{self.step}:{self.fault}"


_RAISED = {
    "throttling": "AwsThrottled",
    "service-error": "AwsUnavailable",
    **{name: "AwsUnavailable" for name in faults.LOST_CREATES},
    "lambda-timeout": "Sandbox.Timedout",
    "timeout-mid-delete": "Sandbox.Timedout",
    "silent": "States.Timeout",
}

#: What the bench itself does to a run while it trains (its training job Training), from outside the run: forged
#: and replayed events (as someone who may put events on the account's bus, or a delivery repeated much later),
#: which must change nothing, and the sweeper judging the run at its deadline.
OUTSIDE_ACTS: dict[str, str] = {
    # the sweeper looks at the run the moment it is past its deadline (sweep.deadline), while it still trains
    "at-deadline": "the sweeper, at the run's deadline",
    # on_execution_end: "Step Functions Execution Status Change" ABORTED for the live run's execution
    "forged-abort": "an ABORTED event for the live run's execution",
    # the same, but the execution is another state machine's with the live run's execution name
    "forged-abort-other": "an ABORTED event for another state machine's execution of the run's name",
    # on_training_event: "SageMaker Training Job State Change" Failed for the live training job
    "forged-failed": "a Failed event for the live training job",
    # on_training_event: the first attempt's last event (Failed, no capacity) again, while the second trains
    "replayed-event": "the first attempt's Failed event again, while the second attempt trains",
}


@dataclass
class Result:
    case: Case
    status: str
    error: str | None
    #: the errors of the run's failed tasks and Lambda calls, in order (retried ones included)
    task_errors: list[str]
    fired: bool
    leftovers: list[str]
    archived: list[str]
    #: SageMaker training jobs the run created: a retried start must adopt its job, never start a second fleet
    training_jobs: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def got(self) -> str:
        return self.status + (f" {self.error}" if self.error else "")

    @property
    def correct(self) -> bool:
        return not self.problems


def cases() -> list[Case]:
    """Every forward state x {throttling, service-error, lambda-timeout}, then each failure of a run."""
    # a job that must still be training when something comes to stop it
    busy = (("sleep_s", BUSY_TRAINING_S),)
    matrix = [
        Case(step, fault, "SUCCEEDED") for step in faults.STEPS for fault in ("throttling", "service-error")
    ]
    for step in faults.STEPS:
        # start_training's job was created before the answer was lost: still running, the retry must adopt it
        extra = busy if step == "start_training" else ()
        matrix.append(Case(step, "lambda-timeout", "SUCCEEDED", hyperparameters=extra))
    # next_attempt runs after a failed attempt only: each of its cases' first attempt gets no capacity
    matrix = [
        replace(case, training_jobs=2, also=(("start_training", "capacity-error-once"),))
        if case.step == "next_attempt"
        else case
        for case in matrix
    ]
    # a create whose answer was lost: every step that creates what a run pays for, and each of create_network's
    # creates (only the S3 endpoint's takes an idempotency token; the others are found again by the run's tags)
    matrix += [
        Case(step, fault, "SUCCEEDED") for fault in faults.LOST_CREATES for step in faults.FAULTS[fault]
    ]
    matrix += [
        # the teardown cut off by its timeout mid-delete goes on deleting while its retry deletes too
        Case("teardown", "timeout-mid-delete", "SUCCEEDED"),
        # two teardowns of one run at once
        Case("teardown", "twice-at-once", "SUCCEEDED"),
    ]
    # from outside the run while it trains: the sweeper at the run's deadline stops it and tears it down, racing
    # the run's own steps and the teardown the stopped execution's end brings (on_execution_end); forged and
    # replayed events change nothing (the run trains on and succeeds)
    matrix += [
        Case("sweep", "at-deadline", "ABORTED", held=True),
        Case("on_execution_end", "forged-abort", "SUCCEEDED", held=True),
        Case("on_execution_end", "forged-abort-other", "SUCCEEDED", held=True),
        Case("on_training_event", "forged-failed", "SUCCEEDED", held=True),
        Case(
            "on_training_event",
            "replayed-event",
            "SUCCEEDED",
            held=True,
            training_jobs=2,
            also=(("start_training", "capacity-error-once"),),
        ),
    ]
    matrix += [
        # ended before any training job
        Case("create_filesystem", "fsx-failed", "FAILED", "FileSystemFailed", training_jobs=0),
        Case("check_quota", "quota", "FAILED", "QuotaExceeded", training_jobs=0),
        # the run policy: capacity is retried up to compute.max_attempts, then the run ends
        Case("start_training", "capacity-error", "FAILED", "CapacityError", training_jobs=3),
        Case("start_training", "capacity-error-once", "SUCCEEDED", training_jobs=2),
        # SageMaker refuses the first create (another workload took the quota): back to the queue, no job lost
        Case("start_training", "quota-taken-once", "SUCCEEDED", training_jobs=1),
        Case("start_training", "hardware-failure", "SUCCEEDED", training_jobs=2),
        # the user's own code error is not retried
        Case("start_training", "user-error", "FAILED", "TrainingFailed"),
        Case("start_training", "stopped", "FAILED", "TrainingStopped", hyperparameters=busy),
        Case(
            "start_training",
            "silent",
            "FAILED",
            "TrainingTimedOut",
            parameters=tuple(HEARTBEAT_PARAMETERS.items()),
        ),
    ]
    return matrix


def spec_for(name: str, hyperparameters: Iterable[tuple[str, Any]] = ()) -> JobSpec:
    """matrix.yaml as the run `name`: its own name (its results in the default team's folder, under its own job id)."""
    doc = yaml.safe_load(SPEC.read_text())
    doc["name"] = name
    doc["output"]["s3_uri"] = "s3://lustrain-example-results/default/"
    doc["code"]["hyperparameters"] = {**doc["code"].get("hyperparameters", {}), **dict(hyperparameters)}
    return validate_spec(doc)


# ------------------------------------------------------------------------------------------- many runs at once


def drop_specs(jobs_bucket: str, docs: dict[str, dict[str, Any]], s3: Any = None) -> None:
    """Put every spec into the jobs bucket at once (jobs/<name>.yaml), as users dropping files would."""
    s3 = s3 or boto3.client("s3", region_name=REGION)
    for name, doc in docs.items():
        s3.put_object(Bucket=jobs_bucket, Key=f"jobs/{name}.yaml", Body=yaml.safe_dump(doc).encode())


def run_name(execution_input: str) -> str | None:
    """The spec name a run was started for, from its execution input (a dropped jobs/<name>.yaml, or inline)."""
    with contextlib.suppress(ValueError):
        return faults.run_of({"input": json.loads(execution_input)})
    return None


@dataclass
class Ended:
    """One execution, once it has ended: what the user sees of it, and what was left at that moment."""

    name: str
    execution_arn: str
    status: str
    error: str | None
    job_id: str | None
    #: register_job found the spec's run already registered: this execution did nothing (and owns nothing)
    duplicate: bool
    task_errors: list[str]
    leftovers: list[str]
    ended_s: float
    #: the execution's cause, when it failed (what the table shows of a run that ended other than expected)
    cause: str = ""


def watch(
    machine_arn: str,
    specs: dict[str, JobSpec],
    *,
    stall_s: float = STALL_S,
    sfn: Any = None,
    on_end: Callable[[Ended], None] | None = None,
    on_poll: Callable[[dict[str, str]], None] | None = None,
) -> list[Ended]:
    """Wait until every spec has a run and every execution of the machine has ended, in the order they end.

    What a run left behind is counted the moment it ends (a training job still InProgress then is a leak, even
    if it finishes later); a duplicate execution owns nothing, so nothing is counted for it. The wait has no
    deadline of its own: it lasts while the runs make progress (`_progress`), and TimeoutError names what was
    still running after `stall_s` seconds without any. `on_poll` sees the executions known so far (ARN -> spec
    name) at each look."""
    sfn = sfn or boto3.client("stepfunctions", region_name=REGION)
    started = time.monotonic()
    names: dict[str, str] = {}
    ended: dict[str, Ended] = {}
    progress: tuple[Any, ...] = ()
    progressed = looked = started
    while True:
        executions = [
            e
            for page in sfn.get_paginator("list_executions").paginate(stateMachineArn=machine_arn)
            for e in page["executions"]
        ]
        for execution in executions:
            arn = execution["executionArn"]
            if arn not in names:
                names[arn] = run_name(sfn.describe_execution(executionArn=arn)["input"]) or "?"
            if execution["status"] == "RUNNING" or arn in ended:
                continue
            described = sfn.describe_execution(executionArn=arn)
            history = execution_history(sfn, arn)
            job = registered_job(history)
            duplicate = bool(job.get("duplicate"))
            spec = specs.get(names[arn])
            left = resources_left(job.get("job_id"), spec)[0] if spec is not None and not duplicate else []
            ended[arn] = Ended(
                name=names[arn],
                execution_arn=arn,
                status=described["status"],
                error=described.get("error"),
                job_id=job.get("job_id"),
                duplicate=duplicate,
                task_errors=_task_errors(history),
                leftovers=left,
                ended_s=round(time.monotonic() - started, 1),
                cause=str(described.get("cause") or ""),
            )
            if on_end is not None:
                on_end(ended[arn])
        if set(specs) <= set(names.values()) and all(e["status"] != "RUNNING" for e in executions):
            return list(ended.values())
        if on_poll is not None:
            on_poll(dict(names))
        running = [e["executionArn"] for e in executions if e["status"] == "RUNNING"]
        if time.monotonic() - looked >= PROGRESS_LOOK_S:
            now, looked = _progress(sfn, running, len(executions), len(ended)), time.monotonic()
            if now != progress:
                progress, progressed = now, looked
        if time.monotonic() - progressed > stall_s:
            waiting = sorted({names.get(arn, "?") for arn in running})
            missing = sorted(set(specs) - set(names.values()))
            raise TimeoutError(
                f"no progress for {stall_s:.0f} s ({time.monotonic() - started:.0f} s in all); still running: "
                f"{', '.join(waiting) or 'none'}; never started: {', '.join(missing) or 'none'}"
            )
        time.sleep(POLL_S)


def _progress(sfn: Any, running: list[str], executions: int, ended: int) -> tuple[Any, ...]:
    """What changes while runs make progress: executions started and ended, the events in the histories of those
    running, the simulated training jobs' statuses and events, and EventBridge's deliveries."""
    from lustrain.twin import simulator
    from lustrain.twin.patches import eventbridge

    jobs = tuple(sorted((j.name, j.status, j.secondary_status, len(j.events)) for j in simulator.jobs()))
    histories = sum(latest_event_id(sfn, arn) for arn in running)
    return executions, ended, histories, jobs, len(eventbridge.deliveries())


class Outsider:
    """Does each case's act from outside its run (OUTSIDE_ACTS) once the run's training job is Training, and says
    which it did (`sent`).

    Events come as EventBridge delivers them, through the stack's own rules, as from anyone allowed to put events
    on the account's default bus (or from a delivery repeated much later). The sweeper's look is the sweep
    function's own judgement of the one job (steps/sweep.py), with its settings, made in this process with the
    clock at the run's deadline (the twin cannot move a Lambda's clock; the other runs sharing the twin are not
    looked at): it stops the execution and tears the run down while the run's own steps go on."""

    def __init__(self, cases: list[Case], stack: Any, releases: Path, sfn: Any = None) -> None:
        self.pending = {case.name: case for case in cases if case.forged}
        self.releases = releases
        #: run -> the id of the event sent to it, until its deliveries are done and its job released
        self.in_flight: dict[str, str] = {}
        self.stack = stack
        self.machine_arn = stack.outputs["StateMachineArn"]
        self.sent: dict[str, str] = {}
        self.sfn = sfn or boto3.client("stepfunctions", region_name=REGION)

    def __call__(self, names: dict[str, str]) -> None:
        from lustrain.twin import simulator
        from lustrain.twin.patches import eventbridge

        if self.in_flight:
            # a held job trains on until its run has handled what was sent: only then can it end on its own
            busy = {d.event_id for d in eventbridge.deliveries() if d.status == "in-flight"}
            for run, event_id in list(self.in_flight.items()):
                if event_id not in busy:
                    (self.releases / run).touch()
                    del self.in_flight[run]
        if not self.pending:
            return
        training = [
            j for j in simulator.jobs() if (j.status, j.secondary_status) == ("InProgress", "Training")
        ]
        for run, case in list(self.pending.items()):
            # the replayed event is the first attempt's: it is sent while the second trains
            attempt = "2" if case.fault == "replayed-event" else "1"
            job = next(
                (
                    j
                    for j in training
                    if faults.spec_name_of(j.name) == run and j.name.rsplit("-", 1)[1] == attempt
                ),
                None,
            )
            execution_arn = next((arn for arn, name in names.items() if name == run), None)
            if job is None or execution_arn is None:
                continue
            self.in_flight[run] = self._send(case, job.name, job.arn, execution_arn)
            del self.pending[run]
            self.sent[run] = OUTSIDE_ACTS[case.fault]

    def _send(self, case: Case, job_name: str, job_arn: str, execution_arn: str) -> str:
        """Do the case's act; the id of the event sent ("" for the sweeper, which is done when this returns)."""
        from lustrain.twin import simulator
        from lustrain.twin.patches import eventbridge

        if case.fault == "at-deadline":
            self._sweep_at_deadline(job_name.rsplit("-", 1)[0])
            return ""
        if case.fault.startswith("forged-abort"):
            described = self.sfn.describe_execution(executionArn=execution_arn)
            if case.fault == "forged-abort-other":
                # the execution name is the live run's; the state machine is not the stack's
                machine_name = self.machine_arn.rsplit(":", 1)[1]
                execution_arn = execution_arn.replace(
                    f":execution:{machine_name}:", ":execution:another-machine:"
                )
            detail = {
                "executionArn": execution_arn,
                "stateMachineArn": self.machine_arn,
                "name": described["name"],
                "status": "ABORTED",
                "startDate": int(described["startDate"].timestamp() * 1000),
                "stopDate": int(time.time() * 1000),
                "input": None,
                "output": None,
                "error": None,
                "cause": None,
            }
            return eventbridge.emit(
                "aws.states",
                "Step Functions Execution Status Change",
                detail,
                REGION,
                resources=[execution_arn],
            )
        if case.fault == "forged-failed":
            detail = simulator.event_detail(job_name)
            detail.update(
                TrainingJobStatus="Failed", SecondaryStatus="Failed", FailureReason="AlgorithmError: forged"
            )
        else:
            job_name = job_name.rsplit("-", 1)[0] + "-1"
            detail = simulator.event_detail(job_name)
            job_arn = str(detail.get("TrainingJobArn", job_arn))
        return eventbridge.emit(
            "aws.sagemaker", "SageMaker Training Job State Change", detail, REGION, resources=[job_arn]
        )

    def _sweep_at_deadline(self, job_id: str) -> None:
        from lustrain_core.config import Settings
        from lustrain_core.steps import records
        from lustrain_core.steps import sweep as sweep_step
        from lustrain_core.steps.teardown_base import clock_for

        session = operator_session()
        function = self.stack.ref("SweepFunction")
        environment = session.client("lambda").get_function_configuration(FunctionName=function)[
            "Environment"
        ]
        settings = Settings.from_env({**environment["Variables"], "AWS_REGION": REGION})
        config = sweep_step.SweepSettings.from_settings(settings)
        aws = {name: session.client(name) for name in ("ec2", "fsx", "sagemaker", "dynamodb")}
        record = records.get(aws["dynamodb"], settings.jobs_table, job_id)
        due = sweep_step.deadline(record or {}, config.grace_hours)
        if due is None:
            raise RuntimeError(f"the record of {job_id} gives no deadline: {record}")
        found = sweep_step.find_tagged(aws["ec2"], aws["fsx"], aws["sagemaker"], settings.stack_name)
        report = sweep_step.SweepReport([], [], [])
        sweep_step._sweep_job(
            job_id,
            found.get(job_id, []),
            report,
            config,
            now=due + 1,
            sfn=self.sfn,
            ddb=aws["dynamodb"],
            ec2=aws["ec2"],
            fsx=aws["fsx"],
            sagemaker=aws["sagemaker"],
            settings=settings,
            clock=clock_for(None, settings),
        )
        if not report.swept:
            raise RuntimeError(f"the sweeper at the deadline of {job_id} swept nothing: {report.to_dict()}")


def _task_errors(history: list[dict[str, Any]]) -> list[str]:
    failed = ("TaskFailed", "TaskTimedOut", "LambdaFunctionFailed", "LambdaFunctionTimedOut")
    errors = []
    for event in history:
        if event["type"] in failed:
            details = next((v for k, v in event.items() if k.endswith("EventDetails")), {})
            errors.append(str(details.get("error")))
    return errors


# ------------------------------------------------------------------------------------------------- the matrix


#: the twin's grace between a stop and SIGKILL during the matrix (SageMaker's is 120 s): its stand-in saves nothing
MATRIX_STOP_GRACE_S = 2.0


def run_group(group: list[Case], parameters: dict[str, str], say: Printer) -> list[Result]:
    """Run the cases of one group at once on a twin of their own."""
    from lustrain.twin import simulator
    from lustrain.twin.patches import fsx, service_quotas

    releases = Path(tempfile.mkdtemp(prefix="lustrain-matrix-"))
    specs = {
        case.name: spec_for(
            case.name,
            (*case.hyperparameters, *((("hold_until", str(releases / case.name)),) if case.held else ())),
        )
        for case in group
    }
    # SageMaker's PyTorch image passes no SIGTERM on: a job stopped at its MaxRuntimeInSeconds (the `stopped`
    # fault) is killed at the end of the grace, which the matrix, judging the control plane, keeps short
    before = simulator.settings()
    simulator.configure(stop_grace_s=MATRIX_STOP_GRACE_S)
    with contextlib.ExitStack() as restore, twin(parameters) as stack:
        restore.callback(lambda: simulator.configure(**before.__dict__))
        any_spec = next(iter(specs.values()))
        service_quotas.set_quota(any_spec.compute.instance_type, QUOTA, REGION)
        fsx.configure(polls=1)
        for case in group:
            if not case.forged:
                faults.inject(case.step, case.fault, run=case.name)
            for step, fault in case.also:
                faults.inject(step, fault, run=case.name)
        ensure_data(any_spec, say)
        ensure_bucket(bucket_of(any_spec.output.s3_uri))
        docs = {name: submittable(spec, E2E, stack.outputs, lambda _: None) for name, spec in specs.items()}
        drop_specs(stack.outputs["JobsBucketName"], docs)
        say(
            f"twin: {len(group)} runs dropped at once ({', '.join(sorted(parameters)) or 'default settings'})"
        )
        outsider = Outsider(group, stack, releases)
        ended = watch(
            stack.outputs["StateMachineArn"],
            specs,
            on_end=lambda e: say(f"{e.ended_s:6.1f}s  {e.name}: {e.status} {e.error or ''}"),
            on_poll=outsider,
        )
        fired = {(f.run, f.step, f.fault) for f in faults.fired()}
        results = []
        for case in group:
            runs = [e for e in ended if e.name == case.name]
            archive = [o["key"].rsplit("/", 1)[-1] for o in archived_objects(stack, runs[0].job_id)[1]]
            # `quota` is read, never consumed: it took effect if check_quota refused a run the account has room for
            took_effect = (
                (case.name, case.step, case.fault) in fired
                or (case.fault == "quota" and "QuotaExceeded" in runs[0].task_errors)
                or case.name in outsider.sent
            )
            results.append(_judge(case, runs, took_effect, archive, _training_jobs(case.name)))
        # a job nobody stopped would outlive the twin: stop what is left, it has been counted
        simulator.reset()
    return results


def _training_jobs(run: str) -> int:
    """How many training jobs the run `run` created (they are named `<spec name>-<8 hex>-<attempt>`)."""
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    return sum(
        1
        for page in sagemaker.get_paginator("list_training_jobs").paginate(NameContains=f"{run}-")
        for summary in page["TrainingJobSummaries"]
        if faults.spec_name_of(summary["TrainingJobName"]) == run
    )


def _judge(case: Case, runs: list[Ended], fired: bool, archive: list[str], training_jobs: int) -> Result:
    run = runs[0]
    result = Result(
        case, run.status, run.error, run.task_errors, fired, run.leftovers, archive, training_jobs
    )
    if training_jobs != case.training_jobs:
        result.problems.append(
            f"{training_jobs} training jobs started for one run, expected {case.training_jobs}: a retried start "
            "must adopt its job, and only the run policy starts another attempt"
        )
    if len(runs) != 1:
        result.problems.append(f"one spec started {len(runs)} executions")
    if (run.status, run.error) != (case.status, case.error):
        cause = f" ({run.cause[:300]})" if run.cause else ""
        result.problems.append(f"ended {result.got}, expected {case.expected}{cause}")
    if not fired:
        result.problems.append("the fault never fired")
    if case.raised is not None and case.raised not in run.task_errors:
        result.problems.append(f"no task failed with {case.raised} (task errors: {run.task_errors})")
    if run.leftovers:
        result.problems.append(f"left behind: {', '.join(run.leftovers)}")
    if run.status == "SUCCEEDED" and not {"manifest.json", "model.tar.gz"} <= set(archive):
        result.problems.append(f"succeeded without an archive of its model (archive: {archive})")
    return result


def run_matrix(selected: list[Case] | None = None, printer: Printer | None = None) -> list[Result]:
    """Every case (or those given), grouped by the stack settings they need; results in the cases' order."""
    say = printer or (lambda line: None)
    chosen = selected if selected is not None else cases()
    groups: dict[tuple[tuple[str, str], ...], list[Case]] = {}
    for case in chosen:
        groups.setdefault(case.parameters, []).append(case)
    by_case: dict[Case, Result] = {}
    for parameters, group in groups.items():
        for result in run_group(group, dict(parameters), say):
            by_case[result.case] = result
    return [by_case[case] for case in chosen]


def table(results: list[Result], wall_s: float) -> str:
    width = max(len(str(r.case)) for r in results)
    lines = [f"{'fault':<{width}}  {'expected':<26} {'got':<26} {'leaked':>6}  ok"]
    for r in results:
        lines.append(
            f"{r.case!s:<{width}}  {r.case.expected:<26} {r.got:<26} {len(r.leftovers):>6}  "
            + ("yes" if r.correct else "NO: " + "; ".join(r.problems))
        )
    lines.append("")
    lines += [f"{key}={value}" for key, value in summary(results, wall_s).items()]
    return "\n".join(lines)


def summary(results: list[Result], wall_s: float) -> dict[str, Any]:
    """The matrix in figures: cases tried, runs correct, resources left behind, and the wall time."""
    return {
        "cases": len(results),
        "correct": sum(r.correct for r in results),
        "leaks": sum(len(r.leftovers) for r in results),
        "wall_s": round(wall_s),
    }


def main() -> int:
    # moto's interpreter logs every failed state at ERROR: the table says what matters
    logging.getLogger("moto.stepfunctions").setLevel(logging.CRITICAL)
    started = time.monotonic()
    results = run_matrix(printer=lambda line: print(line, file=sys.stderr, flush=True))
    print(table(results, time.monotonic() - started))
    return 0 if all(r.correct for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
