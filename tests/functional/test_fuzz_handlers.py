"""Fuzzing every handler's event against moto: bad input gets a named error and creates nothing.

Each handler is called in-process, as Lambda would call it, with events hypothesis makes: arbitrary JSON objects,
and the handler's real input (the state document of a registered job, or an S3 / SageMaker event) with one to three
parts replaced, removed or retyped. Whatever the event:
- the handler returns a JSON object (strict JSON: Step Functions refuses NaN and Infinity), or raises one of
  lustrain_core.errors' classes, whose names the state machine catches; never KeyError, TypeError, botocore's
  ClientError or ParamValidationError, pydantic's ValidationError, ...;
- when it raises, nothing new exists: no VPC, subnet, security group, route table or endpoint, no file system,
  no training job, no S3 object, no task token.

Examples are derandomized (the same ones on every run) and the mock is one per group of handlers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from hypothesis import given
from hypothesis import strategies as st
from infra_support import invoke, stack_resources
from lustrain_core.errors import LustrainError
from moto import mock_aws
from training_support import held_training_jobs

UNIT = str(Path(__file__).resolve().parents[1] / "unit")
if UNIT not in sys.path:
    sys.path.insert(0, UNIT)

# the fuzz's vocabulary lives with the pure fuzz tests
from test_fuzz_spec import fuzz, json_objects, mutated, sample  # noqa: E402

pytestmark = pytest.mark.slow

REGION = "us-east-1"
ACCOUNT = "123456789012"
HANDLERS = sorted(
    p.stem for p in (Path(__file__).resolve().parents[2] / "functions" / "handlers").glob("*.py")
)
HANDLERS.remove("__init__")
#: handlers that take the state document of a run (the ones that may create what a run needs)
DOCUMENT_HANDLERS = (
    "check_quota",
    "create_network",
    "create_filesystem",
    "check_filesystem",
    "upload_code",
    "start_training",
    # a data preparation's look: a training run's document is refused (job.spec.kind), nothing started
    "prepare",
)
#: handlers started by something else than the run document: a drop or an execution's input, a SageMaker event
EVENT_HANDLERS = ("register_job", "on_training_event")
#: the Catch of the training task adds these to the run document before next_attempt
FAILURE = {
    "failure": {"Error": "InfrastructureError", "Cause": "InternalServerError: We encountered an internal error."},
    "recovery": {"attempts": []},
}
#: handlers that delete or report; they run in a world of their own, with nothing in it to wait for
CLEANUP_HANDLERS = ("teardown", "sweep", "notify", "on_execution_end")

ENV = {
    "JOBS_TABLE": "fuzz-jobs",
    "TOKENS_TABLE": "fuzz-tokens",
    "ARTIFACTS_BUCKET": "fuzz-artifacts",
    "SAGEMAKER_ROLE_ARN": f"arn:aws:iam::{ACCOUNT}:role/fuzz-sagemaker",
    "STACK_NAME": "fuzz",
    "LUSTRAIN_TEARDOWN_POLL_SECONDS": "0.05",
    # the stack's state machine, whose executions' ends on_execution_end verifies (none exists here)
    "LUSTRAIN_STATE_MACHINE_ARN": f"arn:aws:states:us-east-1:{ACCOUNT}:stateMachine:TrainingJobStateMachine-7Zk2Ld9QpX4r",
    "POWERTOOLS_LOG_LEVEL": "ERROR",
}
SPEC: dict[str, Any] = {
    "name": "fuzz",
    "compute": {"instance_count": 1, "max_runtime_hours": 1},
    "code": {"source": "s3://fuzz-code/fuzz/", "distribution": "none"},
    "data": {"s3_uri": "s3://fuzz-data/tokens/", "size_gib": 0.01},
    "output": {"s3_uri": "s3://fuzz-results/fuzz/"},
}

# --------------------------------------------------------------------------------------------- what to check


def _world() -> tuple[Any, ...]:
    """Everything a handler could create, as moto holds it."""
    from moto.dynamodb.models import dynamodb_backends
    from moto.ec2.models import ec2_backends
    from moto.fsx.models import fsx_backends
    from moto.s3.models import s3_backends
    from moto.sagemaker.models import sagemaker_backends

    ec2 = ec2_backends[ACCOUNT][REGION]
    objects = tuple(
        sorted(
            (name, key) for name, bucket in s3_backends[ACCOUNT]["aws"].buckets.items() for key in bucket.keys
        )
    )
    tokens = dynamodb_backends[ACCOUNT][REGION].tables[ENV["TOKENS_TABLE"]]
    return (
        tuple(sorted(ec2.vpcs)),
        tuple(sorted(s for zone in ec2.subnets.values() for s in zone)),
        tuple(sorted(g for groups in ec2.groups.values() for g in groups)),
        tuple(sorted(ec2.route_tables)),
        tuple(sorted(ec2.vpc_end_points)),
        tuple(sorted(fsx_backends[ACCOUNT][REGION].file_systems)),
        tuple(sorted(sagemaker_backends[ACCOUNT][REGION].training_jobs)),
        objects,
        len(tokens),
    )


def _context() -> Any:
    from lustrain.twin.patches.lambda_invoke import LambdaContext

    # teardown and sweep budget their waits from the time left: a few seconds here
    return LambdaContext("fuzz", "$LATEST", "arn:aws:lambda:::function:fuzz", 512, "fuzz", "g", "s", 32.0)


def call_and_check(handler: str, event: Any) -> None:
    """Call the handler; it must answer strict JSON or raise a named error, and a raise must leave no trace."""
    from importlib import import_module

    module = import_module(f"handlers.{handler}")
    before = _world()
    try:
        result = module.handler(event, _context())
    except LustrainError:
        assert _world() == before, f"{handler} failed and left something behind"
        return
    json.dumps(result, allow_nan=False)
    assert isinstance(result, dict)


# --------------------------------------------------------------------------------------------- the worlds


@contextlib.contextmanager
def _moto_world() -> Iterator[None]:
    from lustrain.twin import patches
    from lustrain.twin.patches import fsx, service_quotas

    patches.install()
    # a training job the fuzz starts (from a valid document) never gets going: nothing runs meanwhile
    with pytest.MonkeyPatch.context() as env, mock_aws(), held_training_jobs():
        for key, value in ENV.items():
            env.setenv(key, value)
        stack_resources(ENV["JOBS_TABLE"], ENV["TOKENS_TABLE"], ENV["ARTIFACTS_BUCKET"], env)
        s3 = boto3.client("s3", region_name=REGION)
        for bucket in ("fuzz-code", "fuzz-data", "fuzz-results"):
            s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket="fuzz-code", Key="fuzz/train.py", Body=b"print('step=1 train_loss=1.0')\n")
        s3.put_object(Bucket="fuzz-data", Key="tokens/shard-0.bin", Body=b"\x01" * 1024)
        service_quotas.set_quota("ml.p4d.24xlarge", 2, REGION)
        fsx.configure(polls=1)
        try:
            yield
        finally:
            fsx.configure()


def _invoke(handler: str, event: dict[str, Any]) -> dict[str, Any]:
    return invoke(handler, event, _context())


@pytest.fixture(scope="class")
def run_document() -> Iterator[dict[str, Any]]:
    """A world with one registered run, its network, file system and code made: the document to mutate."""
    with _moto_world():
        document: dict[str, Any] = {
            "job": _invoke("register_job", {"execution": "fuzz-1", "input": {"spec": SPEC}})
        }
        document["quota"] = _invoke("check_quota", document)
        document["network"] = _invoke("create_network", document)
        document["filesystem"] = _invoke("create_filesystem", document)
        document["filesystem"] = _invoke("check_filesystem", document)
        document["code"] = _invoke("upload_code", document)
        document["poll"] = {"initial_seconds": 1, "max_seconds": 2, "max_polls": 3}
        document["task_token"] = "fuzz-token"
        yield document


@pytest.fixture(scope="class")
def empty_world() -> Iterator[None]:
    with _moto_world():
        yield


# --------------------------------------------------------------------------------------------- the fuzz


def test_every_handler_is_fuzzed():
    assert set(HANDLERS) == {
        *DOCUMENT_HANDLERS,
        *CLEANUP_HANDLERS,
        *EVENT_HANDLERS,
        "next_attempt",
    }


#: A Lambda may be invoked with any JSON value, not only an object.
NOT_OBJECTS = [None, [], [{"job": {}}], "jobs/gpt.yaml", 7, 0.5, True]


@pytest.mark.usefixtures("run_document")
class TestRunHandlers:
    @pytest.mark.parametrize("handler", [*DOCUMENT_HANDLERS, *EVENT_HANDLERS, "next_attempt"])
    @pytest.mark.parametrize("event", NOT_OBJECTS, ids=repr)
    def test_a_json_value_that_is_not_an_object(self, handler, event):
        call_and_check(handler, event)

    @pytest.mark.parametrize("handler", [*DOCUMENT_HANDLERS, *EVENT_HANDLERS, "next_attempt"])
    @fuzz(25)
    @given(event=json_objects)
    def test_any_json_object(self, handler, event):
        call_and_check(handler, event)

    @pytest.mark.parametrize("handler", DOCUMENT_HANDLERS)
    @fuzz(80)
    @given(data=st.data())
    def test_the_run_document_with_parts_broken(self, run_document, handler, data):
        call_and_check(handler, mutated(run_document, data))

    @fuzz(80)
    @given(data=st.data())
    def test_next_attempt_with_the_failed_run_document_broken(self, run_document, data):
        call_and_check("next_attempt", mutated({**run_document, **FAILURE}, data))

    @fuzz(120)
    @given(data=st.data(), start=st.sampled_from(["register_job", "register_job_inline"]))
    def test_register_job_with_a_broken_start(self, data, start):
        call_and_check("register_job", mutated(sample(start), data))

    @fuzz(80)
    @given(data=st.data())
    def test_register_job_with_a_broken_spec(self, data):
        spec = mutated(SPEC, data)
        execution = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]
        call_and_check("register_job", {"execution": execution, "input": {"spec": spec}})

    @fuzz(100)
    @given(data=st.data(), name=st.sampled_from(["on_training_event", "on_training_event_failed"]))
    def test_on_training_event_with_a_broken_event(self, data, name):
        call_and_check("on_training_event", mutated(sample(name), data))


@pytest.mark.usefixtures("empty_world")
class TestCleanupHandlers:
    @pytest.mark.parametrize("handler", CLEANUP_HANDLERS)
    @pytest.mark.parametrize("event", NOT_OBJECTS, ids=repr)
    def test_a_json_value_that_is_not_an_object(self, handler, event):
        call_and_check(handler, event)

    @pytest.mark.parametrize("handler", CLEANUP_HANDLERS)
    @fuzz(25)
    @given(event=json_objects)
    def test_any_json_object(self, handler, event):
        call_and_check(handler, event)

    @pytest.mark.parametrize("handler", ["teardown", "notify", "on_execution_end"])
    @fuzz(80)
    @given(data=st.data())
    def test_their_sample_event_with_parts_broken(self, handler, data):
        call_and_check(handler, mutated(sample(handler), data))
