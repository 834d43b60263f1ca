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
- fsx-failed, quota, stopped -> FAILED with the error class named for each;
- silent (the training job never reports) -> the task's HeartbeatSeconds fires States.Timeout -> the teardown
  must stop the job -> FAILED with TrainingTimedOut (a Fail state may not raise a States.* name; the Cause keeps
  it). That case runs in a twin of its own, whose heartbeat is a few seconds.

    .venv/bin/python bench/fault_matrix.py      prints the table; exit 1 if any case is wrong
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
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
#: a job that must still be training when it is stopped (or when its run ends) keeps busy this long
BUSY_TRAINING_S = 30
TIMEOUT_S = 300
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
    "lost-create": "AwsUnavailable",
    "lambda-timeout": "Sandbox.Timedout",
    "silent": "States.Timeout",
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
    matrix += [Case(step, "lost-create", "SUCCEEDED") for step in faults.FAULTS["lost-create"]]
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
    """matrix.yaml as the run `name`: its own name, its own output prefix."""
    doc = yaml.safe_load(SPEC.read_text())
    doc["name"] = name
    doc["output"]["s3_uri"] = f"s3://lustrain-example-results/{name}/"
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


def watch(
    machine_arn: str,
    specs: dict[str, JobSpec],
    *,
    timeout_s: float,
    sfn: Any = None,
    on_end: Callable[[Ended], None] | None = None,
) -> list[Ended]:
    """Wait until every spec has a run and every execution of the machine has ended, in the order they end.

    What a run left behind is counted the moment it ends (a training job still InProgress then is a leak, even
    if it finishes later); a duplicate execution owns nothing, so nothing is counted for it."""
    sfn = sfn or boto3.client("stepfunctions", region_name=REGION)
    started = time.monotonic()
    names: dict[str, str] = {}
    ended: dict[str, Ended] = {}
    deadline = started + timeout_s
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
            )
            if on_end is not None:
                on_end(ended[arn])
        if set(specs) <= set(names.values()) and all(e["status"] != "RUNNING" for e in executions):
            return list(ended.values())
        if time.monotonic() > deadline:
            waiting = sorted(
                {names.get(e["executionArn"], "?") for e in executions if e["status"] == "RUNNING"}
            )
            missing = sorted(set(specs) - set(names.values()))
            raise TimeoutError(
                f"after {timeout_s:.0f} s, still running: {', '.join(waiting) or 'none'}; "
                f"never started: {', '.join(missing) or 'none'}"
            )
        time.sleep(0.25)


def _task_errors(history: list[dict[str, Any]]) -> list[str]:
    failed = ("TaskFailed", "TaskTimedOut", "LambdaFunctionFailed", "LambdaFunctionTimedOut")
    errors = []
    for event in history:
        if event["type"] in failed:
            details = next((v for k, v in event.items() if k.endswith("EventDetails")), {})
            errors.append(str(details.get("error")))
    return errors


# ------------------------------------------------------------------------------------------------- the matrix


def run_group(
    group: list[Case], parameters: dict[str, str], say: Printer, timeout_s: float = TIMEOUT_S
) -> list[Result]:
    """Run the cases of one group at once on a twin of their own."""
    from lustrain.twin import simulator
    from lustrain.twin.patches import fsx, service_quotas

    specs = {case.name: spec_for(case.name, case.hyperparameters) for case in group}
    with twin(parameters) as stack:
        any_spec = next(iter(specs.values()))
        service_quotas.set_quota(any_spec.compute.instance_type, QUOTA, REGION)
        fsx.configure(polls=1)
        for case in group:
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
        ended = watch(
            stack.outputs["StateMachineArn"],
            specs,
            timeout_s=timeout_s,
            on_end=lambda e: say(f"{e.ended_s:6.1f}s  {e.name}: {e.status} {e.error or ''}"),
        )
        fired = {(f.run, f.step, f.fault) for f in faults.fired()}
        results = []
        for case in group:
            runs = [e for e in ended if e.name == case.name]
            archive = [o["key"] for o in archived_objects(stack, runs[0].job_id)[1]]
            # `quota` is read, never consumed: it took effect if check_quota refused a run the account has room for
            took_effect = (case.name, case.step, case.fault) in fired or (
                case.fault == "quota" and "QuotaExceeded" in runs[0].task_errors
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
    result = Result(case, run.status, run.error, run.task_errors, fired, run.leftovers, archive, training_jobs)
    if training_jobs != case.training_jobs:
        result.problems.append(
            f"{training_jobs} training jobs started for one run, expected {case.training_jobs}: a retried start "
            "must adopt its job, and only the run policy starts another attempt"
        )
    if len(runs) != 1:
        result.problems.append(f"one spec started {len(runs)} executions")
    if (run.status, run.error) != (case.status, case.error):
        result.problems.append(f"ended {result.got}, expected {case.expected}")
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
    correct = sum(r.correct for r in results)
    leaked = sum(len(r.leftovers) for r in results)
    lines.append("")
    lines.append(
        f"faults tried: {len(results)}, runs correct: {correct}/{len(results)}, resources leaked: {leaked}, "
        f"wall: {wall_s:.0f} s"
    )
    return "\n".join(lines)


def main() -> int:
    # moto's interpreter logs every failed state at ERROR: the table says what matters
    logging.getLogger("moto.stepfunctions").setLevel(logging.CRITICAL)
    started = time.monotonic()
    results = run_matrix(printer=lambda line: print(line, file=sys.stderr, flush=True))
    print(table(results, time.monotonic() - started))
    return 0 if all(r.correct for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
