"""The state machine runs on moto 5.2.5's ASL interpreter: happy path, duplicate drop, failures, the poll loop.

The handlers here are stubs that return canned results shaped like the state document
(functions/handlers/__init__.py); they run in-process through the twin's Lambda patch, so raised exception class
names reach Retry/Catch as they do on AWS. What is under test is statemachine/training_job.asl.json itself: its
routing, its data flow, and its budget of transitions and Lambda calls.
"""

from __future__ import annotations

import io
import json
import re
import sys
import threading
import time
import types
import uuid
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from infra_support import any_role
from lustrain_core.document import Admission, Attempt, Code, Filesystem, Network, Recovery, dumped
from lustrain_core.errors import (
    FileSystemFailed,
    NetworkInvalid,
    PrepareFailed,
    QuotaExceeded,
    SpecInvalid,
    TeardownIncomplete,
)
from lustrain_core.steps import prepare
from lustrain_core.steps.filesystem import next_wait
from moto import mock_aws

ROOT = Path(__file__).resolve().parents[2]
ASL = ROOT / "statemachine" / "training_job.asl.json"
REGION = "us-east-1"
STUBS = "lustrain_asl_stubs"

#: Handler module -> the substitution holding its ARN (on_training_event is EventBridge's, not the machine's).
FUNCTIONS = {
    "register_job": "RegisterJobFunctionArn",
    "check_quota": "CheckQuotaFunctionArn",
    "create_network": "CreateNetworkFunctionArn",
    "create_filesystem": "CreateFilesystemFunctionArn",
    "check_filesystem": "CheckFilesystemFunctionArn",
    "upload_code": "UploadCodeFunctionArn",
    "start_training": "StartTrainingFunctionArn",
    "next_attempt": "NextAttemptFunctionArn",
    "teardown": "TeardownFunctionArn",
    "notify": "NotifyFunctionArn",
    "prepare": "PrepareFunctionArn",
}

#: The production poll schedule (template defaults): the first look after 480 s, then every 30 s.
PRODUCTION_POLL = {"initial_seconds": 480, "max_seconds": 30}


def render(substitutions: dict[str, Any]) -> str:
    """Fill the placeholders as CloudFormation does: plain text replacement, then it must be JSON."""
    text = ASL.read_text()
    missing = set(re.findall(r"\$\{([^}]+)\}", text)) - set(substitutions)
    assert not missing, f"no test value for {sorted(missing)}"
    text = re.sub(r"\$\{([^}]+)\}", lambda m: str(substitutions[m.group(1)]), text)
    json.loads(text)
    return text


@dataclass
class Scenario:
    """What the stub handlers do in one test, and what they saw."""

    raise_at: dict[str, Exception] = field(default_factory=dict)
    duplicate: bool = False
    #: FSx is AVAILABLE once this much simulated time has passed (the stubs' clock, not the wall's).
    available_after_s: int = 0
    #: Seconds the Wait state really waits, whatever the simulated schedule says (keeps tests fast).
    real_wait_s: int | None = 0
    #: ("success", output) or ("failure", error, cause), sent by another thread after start_training returns;
    #: `trainings` (if any) answers the attempts in order and `training` every attempt after them.
    training: tuple[Any, ...] = ("success", {})
    trainings: list[tuple[Any, ...]] = field(default_factory=list)
    #: How many failed attempts next_attempt answers with another try (its wait: 0 s).
    retries: int = 0
    #: How many looks at the capacity queue answer "wait" before the one that admits (each visit of the queue:
    #: the first attempt's and every later one's)
    queued_looks: int = 0
    #: raised by the look that would admit instead (the queue's time ran out)
    queue_refusal: Exception | None = None
    #: register_job answers a data preparation run (kind: prepare) whose stages take this many looks in all before
    #: every one Completed
    prepare_looks: int | None = None
    #: the looks the preparation had before this execution's first (a run near the state machine's bound)
    prepare_looks_before: int = 0
    calls: list[tuple[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def called(self, name: str) -> list[Any]:
        return [event for step, event in self.calls if step == name]


SCENARIO = Scenario()

#: The twin's shrunk poll settings; a test asks for others with `@pytest.mark.parametrize("machine", [...],
#: indirect=True)`.
FAST_POLL = {"initial_seconds": 1, "max_seconds": 2, "max_polls": 36}


def _scheduled_wait(poll: dict[str, Any], polls: int) -> int:
    return next_wait(polls, {**poll, "max_polls": 1})


def _queue(event: dict[str, Any]) -> dict[str, Any]:
    """The capacity queue's answer: `queued_looks` waits (0 s here), then the admission (or the refusal)."""
    looks = len(SCENARIO.called("check_quota"))
    waiting = looks <= SCENARIO.queued_looks
    if not waiting and SCENARIO.queue_refusal is not None:
        raise SCENARIO.queue_refusal
    return dumped(
        Admission(
            admitted=not waiting,
            pool="ml.p4d.24xlarge#on-demand",
            order="2026-01-01T00:00:00Z#gpt-small-1a2b3c4d",
            position=1 if waiting else 0,
            queued_s=looks * 30,
            wait_seconds=0,
            quota_code="L-1",
            limit=4,
            in_use=4 if waiting else 0,
            requested=2,
            available=0 if waiting else 4,
        )
    )


def _filesystem(event: dict[str, Any], polls: int) -> dict[str, Any]:
    """$.filesystem after `polls` checks; 0 available_after_s stands for a reused, already AVAILABLE one."""
    elapsed = sum(_scheduled_wait(PRODUCTION_POLL, n) for n in range(polls))
    ready = SCENARIO.available_after_s == 0 or (polls > 0 and elapsed >= SCENARIO.available_after_s)
    wait = _scheduled_wait(event["poll"], polls) if SCENARIO.real_wait_s is None else SCENARIO.real_wait_s
    return dumped(
        Filesystem(
            file_system_id="fs-0123456789abcdef0",
            lifecycle="AVAILABLE" if ready else "CREATING",
            ready=ready,
            dns_name="fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
            mount_name="abcdefgh",
            directory_path="/abcdefgh/data",
            created=True,
            polls=polls,
            wait_seconds=wait,
        )
    )


def _stub(name: str, result: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    def handler(event: Any, context: Any) -> Any:
        with SCENARIO.lock:
            SCENARIO.calls.append((name, event))
        error = SCENARIO.raise_at.get(name)
        if error is not None:
            raise error
        return result(event)

    return handler


def _start_training(event: dict[str, Any]) -> dict[str, Any]:
    token = event["task_token"]

    def answer() -> None:
        # After the invocation has returned: a callback sent from inside it is lost on moto (DESIGN.md).
        time.sleep(0.3)
        sfn = boto3.client("stepfunctions", region_name=REGION)
        with SCENARIO.lock:
            outcome = SCENARIO.trainings.pop(0) if SCENARIO.trainings else SCENARIO.training
        if outcome[0] == "success":
            sfn.send_task_success(taskToken=token, output=json.dumps(outcome[1]))
        else:
            _, error, cause = outcome
            sfn.send_task_failure(taskToken=token, error=error, cause=cause)

    threading.Thread(target=answer, daemon=True).start()
    return {"training_job_name": "gpt-small-1a2b3c4d-1", "status": "InProgress"}


TRAINING_OUTPUT = {
    "training_job_name": "gpt-small-1a2b3c4d-1",
    "status": "Completed",
    "archive_s3_uri": "s3://lustrain-artifacts/archive/gpt-small-1a2b3c4d/",
    "manifest_s3_uri": "s3://lustrain-artifacts/archive/gpt-small-1a2b3c4d/manifest.json",
    "model_artifacts": "s3://results/gpt-small-1a2b3c4d-1/output/model.tar.gz",
    "metrics": {"train_loss": 1.25},
    "billable_seconds": 5400,
}

JOB = {
    "job_id": "gpt-small-1a2b3c4d",
    "spec": {"name": "gpt-small"},
    "plan": {"cost": {"total_usd": 123.45}},
    "source": {"bucket": "jobs", "key": "jobs/gpt-small.yaml"},
    "started_at": "2025-01-01T00:00:00Z",
}


PREPARE_JOB = {
    "job_id": "corpus-0badc0de",
    "kind": "prepare",
    "spec": {"kind": "prepare", "name": "corpus", "output": "s3://results/shards/"},
    "plan": {"kind": "prepare", "cost_usd": 2.5},
    "source": {"bucket": "jobs", "key": "jobs/corpus.yaml"},
    "started_at": "2025-01-01T00:00:00Z",
}


def _register(event: dict[str, Any]) -> dict[str, Any]:
    job = JOB if SCENARIO.prepare_looks is None else PREPARE_JOB
    return {**job, "duplicate": SCENARIO.duplicate}


def _prepare(event: dict[str, Any]) -> dict[str, Any]:
    """A look at the preparation's stages, stubbed: the next stage on each look, Completed after prepare_looks."""
    looks = event.get("prepare", {}).get("looks", SCENARIO.prepare_looks_before) + 1
    stages = ["plan", "work", "merge"]
    if looks >= (SCENARIO.prepare_looks or 0):
        return {"done": stages, "stage": None, "status": "Completed", "looks": looks, "wait_seconds": 0}
    done = stages[: min(looks - 1, 2)]
    return {
        "done": done,
        "stage": stages[len(done)],
        "status": "InProgress",
        "looks": looks,
        "wait_seconds": 0,
    }


def _next_attempt(event: dict[str, Any]) -> dict[str, Any]:
    """The run policy's decision, stubbed: retry the first `SCENARIO.retries` failed attempts, at once."""
    failure = event["failure"]
    done = event["recovery"]["attempts"]
    attempt = Attempt(
        attempt=len(done) + 1,
        training_job_name=f"gpt-small-1a2b3c4d-{len(done) + 1}",
        outcome="Failed",
        error=failure["Error"],
    )
    attempts = [*(Attempt.model_validate(a) for a in done), attempt]
    return dumped(
        Recovery(attempts=attempts, retry=len(attempts) <= SCENARIO.retries, wait_seconds=0, reason="stub")
    )


def _install_stubs() -> None:
    module = types.ModuleType(STUBS)
    results: dict[str, Callable[[Any], Any]] = {
        "register_job": _register,
        "check_quota": _queue,
        "create_network": lambda event: dumped(
            Network(
                vpc_id="vpc-0a1b2c3d4e5f60718",
                subnet_id="subnet-0f1e2d3c4b5a69788",
                security_group_ids=["sg-0123456789abcdef0"],
                created=True,
            )
        ),
        "create_filesystem": lambda event: _filesystem(event, 0),
        "check_filesystem": lambda event: _filesystem(event, event["filesystem"]["polls"] + 1),
        "upload_code": lambda event: dumped(
            Code(submit_directory="s3://lustrain-artifacts/code/x/sourcedir.tar.gz")
        ),
        "start_training": _start_training,
        "next_attempt": _next_attempt,
        "teardown": lambda event: {"deleted": ["fs-0123456789abcdef0", "vpc-1"], "kept": []},
        "notify": lambda event: {
            "message_id": "m-1",
            "outcome": "failed" if "error" in event else "succeeded",
        },
        "prepare": _prepare,
    }
    for name, result in results.items():
        setattr(module, name, _stub(name, result))
    sys.modules[STUBS] = module


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("stub.py", "")
    return buffer.getvalue()


@dataclass
class Machine:
    arn: str
    sfn: Any

    def run(self, execution_input: dict[str, Any], name: str = "", timeout_s: float = 60) -> dict[str, Any]:
        execution = self.sfn.start_execution(
            stateMachineArn=self.arn, name=name or f"run-{uuid.uuid4()}", input=json.dumps(execution_input)
        )
        deadline = time.monotonic() + timeout_s
        while True:
            described = self.sfn.describe_execution(executionArn=execution["executionArn"])
            if described["status"] != "RUNNING":
                break
            assert time.monotonic() < deadline, "the execution did not finish"
            time.sleep(0.05)
        history = self.sfn.get_execution_history(executionArn=execution["executionArn"], maxResults=1000)
        described["events"] = history["events"]
        return described


def entered(run: dict[str, Any]) -> list[str]:
    """Names of the states entered, in order (each one a state transition on AWS's bill)."""
    return [e["stateEnteredEventDetails"]["name"] for e in run["events"] if "stateEnteredEventDetails" in e]


def lambda_calls(run: dict[str, Any]) -> int:
    return sum(
        1 for e in run["events"] if e["type"] == "LambdaFunctionScheduled" or e["type"] == "TaskScheduled"
    )


@dataclass
class Stack:
    """One moto account for the module: the stub functions, and a state machine per poll setting."""

    role: str
    functions: dict[str, str]
    machines: dict[tuple[int, int, int], Machine] = field(default_factory=dict)

    def machine(self, poll: dict[str, int]) -> Machine:
        key = (poll["initial_seconds"], poll["max_seconds"], poll["max_polls"])
        if key not in self.machines:
            substitutions: dict[str, Any] = {
                **self.functions,
                "Partition": "aws",
                "RetryIntervalSeconds": 1,
                "TeardownRetryIntervalSeconds": 1,
                "TeardownRetryMaxDelaySeconds": 1,
                "TrainingHeartbeatSeconds": 30,
                "TrainingTimeoutSeconds": 60,
                "FilesystemPollInitialSeconds": key[0],
                "FilesystemPollMaxSeconds": key[1],
                "FilesystemPollMaxCount": key[2],
            }
            sfn = boto3.client("stepfunctions", region_name=REGION)
            name = "lustrain-test-{}-{}-{}".format(*key)
            arn = sfn.create_state_machine(name=name, definition=render(substitutions), roleArn=self.role)
            self.machines[key] = Machine(arn["stateMachineArn"], sfn)
        return self.machines[key]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    from lustrain.twin import patches

    patches.install()
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        iam = boto3.client("iam", region_name=REGION)
        role = any_role(iam, "lustrain-test", "lambda.amazonaws.com", "states.amazonaws.com")
        lam = boto3.client("lambda", region_name=REGION)
        functions = {
            key: lam.create_function(
                FunctionName=f"lustrain-{name.replace('_', '-')}",
                Runtime="python3.12",
                Role=role,
                Handler=f"{STUBS}.{name}",
                Code={"ZipFile": _zip()},
                Timeout=30,
            )["FunctionArn"]
            for name, key in FUNCTIONS.items()
        }
        yield Stack(role, functions)
    sys.modules.pop(STUBS, None)


@pytest.fixture
def machine(stack: Stack, request: pytest.FixtureRequest) -> Machine:
    global SCENARIO
    SCENARIO = Scenario()
    _install_stubs()
    return stack.machine(getattr(request, "param", FAST_POLL))


S3_EVENT = {
    "version": "0",
    "source": "aws.s3",
    "detail-type": "Object Created",
    "detail": {
        "bucket": {"name": "jobs"},
        "object": {"key": "jobs/gpt-small.yaml", "size": 321, "etag": "e"},
    },
}


@pytest.mark.parametrize("machine", [{**PRODUCTION_POLL, "max_polls": 36}], indirect=True)
def test_happy_path_stays_within_budget_for_a_ten_minute_file_system(machine: Machine) -> None:
    SCENARIO.available_after_s = 600
    SCENARIO.training = ("success", TRAINING_OUTPUT)

    run = machine.run(S3_EVENT)

    assert run["status"] == "SUCCEEDED", run.get("cause")
    summary = json.loads(run["output"])
    assert summary["outcome"] == "succeeded"
    assert summary["job_id"] == "gpt-small-1a2b3c4d"
    assert summary["archive_s3_uri"] == TRAINING_OUTPUT["archive_s3_uri"]
    assert summary["estimated_cost_usd"] == 123.45
    assert summary["training_billable_seconds"] == 5400
    assert summary["started_at"] and summary["finished_at"]
    assert summary["teardown"]["deleted"] == ["fs-0123456789abcdef0", "vpc-1"]
    assert summary["notify"]["outcome"] == "succeeded"
    # the first look after 480 s, then every 30 s: looks at 480, 510, 540, 570, 600 s -> AVAILABLE on the 5th,
    # noticed at once (this stub has no links)
    assert len(SCENARIO.called("check_filesystem")) == 5
    assert len(entered(run)) <= 40, entered(run)
    assert lambda_calls(run) <= 15
    assert "Tear down after failure" not in entered(run)


def test_a_queued_run_waits_before_anything_is_created_then_builds_once_admitted(machine: Machine) -> None:
    SCENARIO.queued_looks = 3
    SCENARIO.training = ("success", TRAINING_OUTPUT)

    run = machine.run(S3_EVENT)

    assert run["status"] == "SUCCEEDED", run.get("cause")
    steps = [step for step, _ in SCENARIO.calls]
    assert steps[:5] == ["register_job", "check_quota", "check_quota", "check_quota", "check_quota"]
    assert steps[5] == "create_network"
    assert entered(run).count("Wait for capacity") == 3
    # each look passes on what the last one said: the run keeps its place
    looks = SCENARIO.called("check_quota")
    assert [look.get("quota", {}).get("admitted") for look in looks] == [None, False, False, False]
    assert looks[1]["quota"]["order"] == "2026-01-01T00:00:00Z#gpt-small-1a2b3c4d"


def test_a_run_whose_queue_time_runs_out_ends_quota_exceeded_having_created_nothing(machine: Machine) -> None:
    SCENARIO.queued_looks = 2
    SCENARIO.queue_refusal = QuotaExceeded("waited 86400 s in the queue, compute.max_queue_hours=24")

    run = machine.run(S3_EVENT)

    assert run["status"] == "FAILED"
    assert run["error"] == "QuotaExceeded"
    steps = [step for step, _ in SCENARIO.calls]
    assert steps == ["register_job", "check_quota", "check_quota", "check_quota", "teardown", "notify"]
    (teardown,) = SCENARIO.called("teardown")
    assert teardown["error"]["Error"] == "QuotaExceeded"


def test_a_later_attempt_goes_back_through_the_queue_and_starts_on_the_same_network(machine: Machine) -> None:
    SCENARIO.trainings = [
        ("failure", "QuotaExceeded", "ResourceLimitExceeded: another workload took the quota")
    ]
    SCENARIO.training = ("success", TRAINING_OUTPUT)
    SCENARIO.retries = 1

    run = machine.run(S3_EVENT)

    assert run["status"] == "SUCCEEDED", run.get("cause")
    steps = [step for step, _ in SCENARIO.calls]
    assert steps.count("create_network") == 1 and steps.count("create_filesystem") == 1
    after = steps[steps.index("next_attempt") :]
    assert after[:3] == ["next_attempt", "check_quota", "start_training"]


def test_a_queue_answer_without_admitted_fails_catchably_not_with_states_runtime(machine: Machine) -> None:
    sys.modules[STUBS].check_quota = _stub("check_quota", lambda event: {"quota_code": "L-1"})  # type: ignore[attr-defined]

    run = machine.run(S3_EVENT)

    assert run["status"] == "FAILED"
    assert run["error"] == "QueueFailed"
    assert [step for step, _ in SCENARIO.calls] == ["register_job", "check_quota", "teardown", "notify"]


def test_each_handler_gets_the_document_and_its_result_lands_under_its_key(machine: Machine) -> None:
    SCENARIO.training = ("success", TRAINING_OUTPUT)

    run = machine.run(S3_EVENT, name=f"exec-{uuid.uuid4()}")

    assert run["status"] == "SUCCEEDED", run.get("cause")
    (register,) = SCENARIO.called("register_job")
    assert register == {"execution": run["name"], "input": S3_EVENT}
    (quota,) = SCENARIO.called("check_quota")
    assert quota == {"job": {**JOB, "duplicate": False}, "recovery": {"attempts": []}}
    (network,) = SCENARIO.called("create_network")
    assert set(network) == {"job", "quota", "recovery"}
    (create,) = SCENARIO.called("create_filesystem")
    assert create["poll"] == {"initial_seconds": 1, "max_seconds": 2, "max_polls": 36}
    (start,) = SCENARIO.called("start_training")
    assert set(start) == {"job", "quota", "network", "filesystem", "code", "task_token"}
    assert start["filesystem"]["lifecycle"] == "AVAILABLE"
    assert start["code"]["submit_directory"].endswith("sourcedir.tar.gz")
    (teardown,) = SCENARIO.called("teardown")
    assert teardown["training"] == TRAINING_OUTPUT
    assert "error" not in teardown


def test_a_duplicate_drop_stops_after_registration(machine: Machine) -> None:
    SCENARIO.duplicate = True

    run = machine.run(S3_EVENT)

    assert run["status"] == "SUCCEEDED"
    assert entered(run) == ["Register the job", "Is this a duplicate drop?", "Ignore the duplicate drop"]
    assert [step for step, _ in SCENARIO.calls] == ["register_job"]


def test_a_failure_is_torn_down_then_notified_and_fails_the_run_with_its_error(machine: Machine) -> None:
    SCENARIO.raise_at["create_network"] = NetworkInvalid("subnet-1 has 12 free addresses; the run needs 20")

    run = machine.run(S3_EVENT)

    assert run["status"] == "FAILED"
    assert run["error"] == "NetworkInvalid"
    assert "the run needs 20" in run["cause"]
    assert entered(run)[-4:] == [
        "Tear down after failure",
        "Notify of the failure",
        "Which error ends the run?",
        "Fail the run",
    ]
    (teardown,) = SCENARIO.called("teardown")
    assert teardown["error"]["Error"] == "NetworkInvalid"
    (notify,) = SCENARIO.called("notify")
    assert notify["error"]["Error"] == "NetworkInvalid"
    assert notify["teardown"]["deleted"]


def test_a_rejected_spec_is_notified_without_a_teardown(machine: Machine) -> None:
    SCENARIO.raise_at["register_job"] = SpecInvalid.one("compute.instance_count", 0, "must be >= 1")

    run = machine.run(S3_EVENT)

    assert run["status"] == "FAILED"
    assert run["error"] == "SpecInvalid"
    assert "compute.instance_count" in run["cause"]
    assert [step for step, _ in SCENARIO.calls] == ["register_job", "notify"]


def test_a_training_failure_reported_by_callback_is_torn_down(machine: Machine) -> None:
    SCENARIO.training = ("failure", "TrainingFailed", "AlgorithmError: loss is NaN")

    run = machine.run(S3_EVENT)

    assert run["status"] == "FAILED"
    assert run["error"] == "TrainingFailed"
    (teardown,) = SCENARIO.called("teardown")
    assert teardown["error"]["Error"] == "TrainingFailed"
    assert "training" not in teardown


def test_a_retried_attempt_starts_training_again_and_the_run_succeeds_listing_the_failed_one(
    machine: Machine,
) -> None:
    SCENARIO.trainings = [
        ("failure", "InfrastructureError", "InternalServerError: We encountered an internal error.")
    ]
    SCENARIO.training = ("success", TRAINING_OUTPUT)
    SCENARIO.retries = 1

    run = machine.run(S3_EVENT)

    assert run["status"] == "SUCCEEDED"
    assert len(SCENARIO.called("start_training")) == 2
    (decision,) = SCENARIO.called("next_attempt")
    assert decision["failure"]["Error"] == "InfrastructureError"
    assert "Wait before the next attempt" in entered(run)
    output = json.loads(run["output"])
    assert [a["training_job_name"] for a in output["failed_attempts"]] == ["gpt-small-1a2b3c4d-1"]
    (teardown,) = SCENARIO.called("teardown")
    assert "error" not in teardown


def test_a_retried_start_that_finds_its_job_completed_ends_the_run_with_that_jobs_output(
    machine: Machine,
) -> None:
    """start_training's retry found the attempt's job Completed and its end answered to the earlier try's token:
    it raises TrainingJobCompleted with the training output, which the state machine takes as $.training (no
    second job, no next_attempt)."""
    from lustrain_core.errors import TrainingJobCompleted

    SCENARIO.raise_at["start_training"] = TrainingJobCompleted(json.dumps(TRAINING_OUTPUT))

    run = machine.run(S3_EVENT)

    assert run["status"] == "SUCCEEDED", run.get("cause")
    summary = json.loads(run["output"])
    assert summary["training_job_name"] == TRAINING_OUTPUT["training_job_name"]
    assert summary["archive_s3_uri"] == TRAINING_OUTPUT["archive_s3_uri"]
    assert summary["training_billable_seconds"] == 5400
    assert len(SCENARIO.called("start_training")) == 1 and SCENARIO.called("next_attempt") == []
    (teardown,) = SCENARIO.called("teardown")
    assert "error" not in teardown and teardown["training"] == TRAINING_OUTPUT


def test_no_more_attempts_ends_the_run_with_the_last_attempts_error(machine: Machine) -> None:
    SCENARIO.training = (
        "failure",
        "CapacityError",
        "CapacityError: Unable to provision requested ML compute capacity.",
    )
    SCENARIO.retries = 2

    run = machine.run(S3_EVENT)

    assert run["status"] == "FAILED"
    assert run["error"] == "CapacityError"
    assert len(SCENARIO.called("start_training")) == 3
    (teardown,) = SCENARIO.called("teardown")
    assert teardown["error"]["Error"] == "CapacityError"


def test_a_training_failure_keeps_the_cause_sent_by_callback(machine: Machine) -> None:
    SCENARIO.training = ("failure", "TrainingFailed", "AlgorithmError: loss is NaN")

    run = machine.run(S3_EVENT)

    assert run.get("cause") == "AlgorithmError: loss is NaN"


def test_a_failing_file_system_fails_the_parallel_state_into_the_teardown(machine: Machine) -> None:
    SCENARIO.available_after_s = 10**6
    SCENARIO.raise_at["check_filesystem"] = FileSystemFailed("FSx reported FAILED: subnet has no free IPs")

    run = machine.run(S3_EVENT)

    assert run["status"] == "FAILED"
    assert run["error"] == "FileSystemFailed"
    assert "no free IPs" in run["cause"]
    assert "Tear down after failure" in entered(run)
    assert not SCENARIO.called("start_training")


@pytest.mark.slow
def test_teardown_incomplete_is_retried_until_the_network_interfaces_drain(machine: Machine) -> None:
    SCENARIO.training = ("success", TRAINING_OUTPUT)
    SCENARIO.raise_at["teardown"] = TeardownIncomplete("DependencyViolation: sg-1 has dependent ENIs")

    def drained() -> None:
        while len(SCENARIO.called("teardown")) < 2:
            time.sleep(0.05)
        SCENARIO.raise_at.pop("teardown")

    threading.Thread(target=drained, daemon=True).start()
    run = machine.run(S3_EVENT)

    assert run["status"] == "SUCCEEDED", run.get("cause")
    assert len(SCENARIO.called("teardown")) >= 2


@pytest.mark.slow
@pytest.mark.parametrize(
    "machine", [{"initial_seconds": 1, "max_seconds": 1, "max_polls": 36}], indirect=True
)
def test_the_poll_loop_waits_what_the_handler_asks_then_continues(machine: Machine) -> None:
    SCENARIO.available_after_s = 510  # the 2nd look, on the production schedule (480 + 30 s)
    SCENARIO.real_wait_s = None  # wait what the handler computes from the poll settings: 1 s
    SCENARIO.training = ("success", TRAINING_OUTPUT)

    run = machine.run(S3_EVENT)

    assert run["status"] == "SUCCEEDED", run.get("cause")
    waits = [
        json.loads(e["stateEnteredEventDetails"]["input"])["filesystem"]["wait_seconds"]
        for e in run["events"]
        if e["type"] == "WaitStateEntered"
    ]
    assert waits == [1, 1]
    assert [event["filesystem"]["polls"] for event in SCENARIO.called("check_filesystem")] == [0, 1]


@pytest.mark.parametrize("machine", [{**PRODUCTION_POLL, "max_polls": 3}], indirect=True)
def test_too_many_polls_give_up_with_file_system_failed(machine: Machine) -> None:
    SCENARIO.available_after_s = 10**6

    run = machine.run(S3_EVENT)

    assert run["status"] == "FAILED"
    assert run["error"] == "FileSystemFailed"
    last_poll = json.loads(run["cause"])
    assert last_poll["polls"] == 3
    assert last_poll["lifecycle"] == "CREATING"
    assert len(SCENARIO.called("check_filesystem")) == 3
    assert "Tear down after failure" in entered(run)


def test_a_poll_result_without_wait_seconds_fails_catchably_not_with_states_runtime(machine: Machine) -> None:
    # Guards the Choice in front of the Wait: SecondsPath on a missing field is an uncatchable States.Runtime.
    SCENARIO.available_after_s = 10**6
    sys.modules[STUBS].create_filesystem = _stub(  # type: ignore[attr-defined]
        "create_filesystem", lambda event: {"file_system_id": "fs-1", "lifecycle": "CREATING"}
    )

    run = machine.run(S3_EVENT)

    assert run["status"] == "FAILED"
    assert run["error"] == "FileSystemFailed"
    # torn down after the file system's failure, and notified last; the code's branch of the Parallel may still be
    # in its upload_code then (a Lambda invocation in flight is not cancelled when its Parallel fails), so its call
    # can land before or after teardown's
    steps = [step for step, _ in SCENARIO.calls]
    assert steps[-1] == "notify" and steps.index("teardown") > steps.index("create_filesystem")


# --- data preparation runs (kind: prepare) -------------------------------------------------------------------


def test_a_preparation_takes_its_own_path_network_code_looks_teardown(machine: Machine) -> None:
    SCENARIO.prepare_looks = 4

    run = machine.run(S3_EVENT)

    assert run["status"] == "SUCCEEDED", run.get("cause")
    steps = [step for step, _ in SCENARIO.calls]
    # no capacity queue, no file system, no training job
    assert steps == ["register_job", "create_network", "upload_code", *["prepare"] * 4, "teardown", "notify"]
    assert entered(run).count("Wait for the data preparation") == 3
    # each look passes on what the last one said, with the run's network and code
    looks = SCENARIO.called("prepare")
    assert [look.get("prepare", {}).get("looks") for look in looks] == [None, 1, 2, 3]
    assert all(look["network"]["subnet_id"] and look["code"]["submit_directory"] for look in looks)
    summary = json.loads(run["output"])
    assert summary == {
        "outcome": "succeeded",
        "kind": "prepare",
        "job_id": "corpus-0badc0de",
        "output_s3_uri": "s3://results/shards/",
        "stages": ["plan", "work", "merge"],
        "looks": 4,
        "started_at": "2025-01-01T00:00:00Z",
        "finished_at": summary["finished_at"],
        "estimated_cost_usd": 2.5,
        "teardown": {"deleted": ["fs-0123456789abcdef0", "vpc-1"], "kept": []},
        "notify": {"message_id": "m-1", "outcome": "succeeded"},
    }


@pytest.mark.parametrize("failing", ["create_network", "upload_code", "prepare"])
def test_a_preparation_that_fails_is_torn_down_and_ends_with_the_error(
    machine: Machine, failing: str
) -> None:
    SCENARIO.prepare_looks = 3
    SCENARIO.raise_at[failing] = PrepareFailed(
        "the data preparation job corpus-0badc0de-prep-work Failed: boom"
    )

    run = machine.run(S3_EVENT)

    assert (run["status"], run["error"]) == ("FAILED", "PrepareFailed")
    steps = [step for step, _ in SCENARIO.calls]
    assert steps[-2:] == ["teardown", "notify"] and "check_quota" not in steps
    (teardown,) = SCENARIO.called("teardown")
    assert teardown["error"]["Error"] == "PrepareFailed"


def test_a_preparation_that_outlasts_its_looks_is_torn_down(machine: Machine) -> None:
    SCENARIO.prepare_looks = prepare.MAX_LOOKS + 10
    SCENARIO.prepare_looks_before = prepare.MAX_LOOKS - 3

    run = machine.run(S3_EVENT)

    assert (run["status"], run["error"]) == ("FAILED", "PrepareFailed")
    assert len(SCENARIO.called("prepare")) == 3
    assert [step for step, _ in SCENARIO.calls][-2:] == ["teardown", "notify"]
    assert json.loads(run["cause"])["looks"] == prepare.MAX_LOOKS
