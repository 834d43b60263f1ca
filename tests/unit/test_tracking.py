"""The run's MLflow logging (steps/tracking.py) without a server: which tracking URIs a stack may name, how a call
to SageMaker's managed MLflow is addressed and signed, the spec as params, and that a failure never raises."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from botocore.credentials import Credentials
from lustrain_core.config import Settings
from lustrain_core.steps import tracking
from lustrain_core.steps.records import JobRecord

ARN = "arn:aws:sagemaker:eu-west-1:123456789012:mlflow-tracking-server/team-server"


@pytest.mark.parametrize(
    "uri", [ARN, "https://mlflow.example.com", "https://mlflow.example.com/prefix/", "http://127.0.0.1:5000"]
)
def test_a_stack_may_name_a_sagemaker_server_an_https_server_or_a_local_one(uri):
    assert tracking.parse_uri(uri) == uri.rstrip("/")


@pytest.mark.parametrize(
    "uri",
    [
        "http://mlflow.example.com",  # in clear over the internet
        "http://10.0.0.5:5000",
        "file:///tmp/mlruns",
        "arn:aws:sagemaker:eu-west-1:123456789012:training-job/x",
        "databricks",
    ],
)
def test_any_other_tracking_uri_is_refused_naming_the_setting_and_what_is_allowed(uri):
    with pytest.raises(ValueError, match=r"LUSTRAIN_MLFLOW_TRACKING_URI=.*a SageMaker MLflow tracking server's ARN"):
        tracking.parse_uri(uri)


class Captured:
    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer, self.requests = answer, []

    def __call__(self, request: Any, timeout: float) -> Any:
        self.requests.append(request)
        body = json.dumps(self.answer).encode()

        class Answer:
            status = 200

            def read(self) -> bytes:
                return body

            def __enter__(self) -> Answer:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

        return Answer()


def test_a_sagemaker_server_is_called_as_the_sagemaker_mlflow_plugin_calls_it(monkeypatch):
    """https://<region>.experiments.sagemaker.aws, the server's ARN in x-mlflow-sm-tracking-server-arn, and SigV4
    for the service sagemaker-mlflow in the ARN's region, the body's hash signed with it."""
    captured = Captured({"experiment": {"experiment_id": "7"}})
    monkeypatch.setattr(tracking.urllib.request, "urlopen", captured)
    server = tracking.Server(ARN, Credentials("AKIDEXAMPLE", "secret"))
    body = {"name": "lustrain"}
    server.call("POST", "mlflow/experiments/create", body)
    (request,) = captured.requests
    headers = {k.lower(): v for k, v in request.header_items()}
    assert request.full_url == "https://eu-west-1.experiments.sagemaker.aws/api/2.0/mlflow/experiments/create"
    assert headers["x-mlflow-sm-tracking-server-arn"] == ARN
    assert "/eu-west-1/sagemaker-mlflow/aws4_request" in headers["authorization"]
    assert "x-mlflow-sm-tracking-server-arn" in headers["authorization"].split("SignedHeaders=")[1]
    assert headers["x-amz-content-sha256"] == hashlib.sha256(json.dumps(body).encode()).hexdigest()


def test_a_url_server_is_called_unsigned():
    server = tracking.Server("http://127.0.0.1:5000")
    assert server.base_url == "http://127.0.0.1:5000" and server.arn is None


def test_the_specs_fields_become_params_with_dotted_names_within_mlflows_limits():
    spec = {
        "name": "llama",
        "compute": {"instance_type": "ml.p4d.24xlarge", "instance_count": 50},
        "code": {"hyperparameters": {"preset": "70b", "lr": 0.0003}, "secrets": ["a", "b"]},
        "notes": "x" * 7000,
        "odd": {"key!": 1},
    }
    params = tracking.flat_params(spec)
    assert params["compute.instance_count"] == "50"
    assert params["code.hyperparameters.preset"] == "70b" and params["code.hyperparameters.lr"] == "0.0003"
    assert params["code.secrets"] == '["a", "b"]'
    assert len(params["notes"]) == tracking.MAX_PARAM_VALUE
    assert "odd.key!" not in params  # a name MLflow refuses is left out rather than fail the whole batch


def test_an_unreachable_server_is_told_in_the_answer_and_never_raised():
    record = JobRecord(job_id="quick-0123abcd", spec={"name": "quick"})
    settings = Settings(extra={tracking.URI_SETTING: "http://127.0.0.1:9"})  # the discard port: refused
    told = tracking.on_run_end(record, "FINISHED", ddb=None, sagemaker=None, s3=None, settings=settings, credentials=None)
    assert told["tracked"] is False and "URLError" in told["error"]


def test_a_data_preparation_is_no_mlflow_run():
    record = JobRecord(job_id="prep-0123abcd", kind="prepare", spec={"name": "prep"})
    settings = Settings(extra={tracking.URI_SETTING: "http://127.0.0.1:9"})
    told = tracking.on_run_end(record, "FINISHED", ddb=None, sagemaker=None, s3=None, settings=settings, credentials=None)
    assert told == {"tracked": False, "reason": "a data preparation trains no model"}


class Recorded:
    """An MLflow server that answers every call and keeps what it was sent."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, query: Any = None) -> dict[str, Any]:
        self.calls.append((method, path, body or {}))
        return {}


def test_an_attempts_points_are_logged_a_batch_at_a_time_and_what_mlflow_cannot_take_is_made_fit_or_skipped():
    definitions = [
        {"Name": "step", "Regex": r"step=(\d+)"},
        {"Name": "train:loss", "Regex": r"loss=([^ ]+)"},  # a SageMaker-style name; nan and inf are logged
        {"Name": "grad norm!", "Regex": r"gn=([0-9.]+)"},  # a character MLflow refuses
        {"Name": "broken", "Regex": r"loss=[0-9.]+"},  # captures nothing: no point, no failure
        {"Name": "bad regex", "Regex": r"(unclosed"},
    ]
    lines = [(1000 + i, f"step={i} loss={1.0 / (i + 1)} gn=0.5") for i in range(1, 1201)]
    lines += [(5000, "step=1201 loss=nan gn=x"), (5001, "step=1202 loss=inf gn=1"), (5002, "no step here loss=1")]
    server = Recorded()
    logged = tracking.log_metrics(server, "run-1", iter(lines), definitions)  # type: ignore[arg-type]
    batches = [body["metrics"] for _, path, body in server.calls if path == "mlflow/runs/log-batch"]
    assert [len(b) for b in batches] == [1000, 1000, 403] and logged == 2403
    sent = [m for b in batches for m in b]
    assert {m["key"] for m in sent} == {"train:loss", "grad norm_"}
    assert [m["value"] for m in sent if m["step"] >= 1201 and m["key"] == "train:loss"] == ["NaN", "Infinity"]
    json.dumps(batches, allow_nan=False)  # what goes over the wire is JSON (which has no NaN)


class Bucket:
    def __init__(self) -> None:
        self.put: list[tuple[str, str]] = []

    def put_object(self, Bucket: str, Key: str, **_: Any) -> None:
        self.put.append((Bucket, Key))


@pytest.mark.parametrize(
    ("store", "artifact_uri", "written"),
    [
        ("s3://team-mlflow/store", "s3://team-mlflow/store/3/abc/artifacts", True),
        ("s3://team-mlflow", "s3://team-mlflow/3/abc/artifacts", True),
        ("s3://team-mlflow/store", "s3://team-mlflow/store-prod/3/abc/artifacts", False),  # a sibling prefix
        ("s3://team-mlflow/store", "s3://other-bucket/store/3/abc/artifacts", False),
        ("", "s3://team-mlflow/store/3/abc/artifacts", False),  # no store named: no grant to write with
    ],
)
def test_the_model_file_goes_into_s3_only_under_the_artifact_store_the_stack_names(store, artifact_uri, written):
    s3 = Bucket()
    settings = Settings(extra={tracking.ARTIFACT_STORE_SETTING: store})
    where = tracking.put_artifact(Recorded(), settings, {"artifact_uri": artifact_uri}, b"{}", s3=s3)  # type: ignore[arg-type]
    if written:
        bucket, _, key = artifact_uri.removeprefix("s3://").partition("/")
        assert s3.put == [(bucket, f"{key}/{tracking.MODEL_ARTIFACT}")] and where.startswith("s3://")
    else:
        assert s3.put == [] and where.startswith("not written")


def test_calls_stop_before_the_functions_time_is_spent_and_say_so():
    import time

    server = tracking.Server("http://127.0.0.1:9", deadline=time.monotonic() + 0.5)
    with pytest.raises(tracking.TrackingError, match="out of time"):
        server.call("GET", "mlflow/experiments/get-by-name", query={"experiment_name": "x"})
    assert tracking.Server("http://127.0.0.1:9", deadline=time.monotonic() + 30).timeout() == tracking.TIMEOUT_S


class _Execution:
    """DescribeExecution's answer for one execution: still running (whatever an event says of it)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def describe_execution(self, executionArn: str) -> dict[str, Any]:
        self.asked.append(executionArn)
        return {"executionArn": executionArn, "name": executionArn.rsplit(":", 1)[-1], "status": "RUNNING"}


class _Untouchable:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a forged execution end reached {name}: no MLflow run may change")


@pytest.mark.parametrize("status", ["ABORTED", "TIMED_OUT", "FAILED"])
def test_an_execution_end_step_functions_does_not_bear_out_ends_no_mlflow_run(status):
    machine = "arn:aws:states:us-east-1:123456789012:stateMachine:lustrain-runs"
    settings = Settings(
        extra={"LUSTRAIN_STATE_MACHINE_ARN": machine, "LUSTRAIN_MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}
    )
    execution = f"{machine.replace(':stateMachine:', ':execution:')}:run-1"
    event = {
        "source": "aws.states",
        "detail-type": "Step Functions Execution Status Change",
        "detail": {
            "executionArn": execution,
            "stateMachineArn": machine,
            "name": "run-1",
            "status": status,
            "stopDate": 1_800_000_000_000,
        },
    }
    sfn = _Execution()
    nobody = _Untouchable()
    answer = tracking.on_event(
        event, ddb=nobody, sagemaker=nobody, logs=nobody, s3=nobody, settings=settings, credentials=None, sfn=sfn
    )
    assert answer["tracked"] is False and answer["reason"].startswith("not verified: ")
    assert "DescribeExecution says RUNNING" in answer["reason"] and sfn.asked == [execution]
