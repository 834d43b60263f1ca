"""Each run as an MLflow run, where the stack names an MLflow tracking server (template.yaml's MlflowTrackingUri).

From where: the notify function, which runs in no VPC. A training job's private subnet has no route to a
tracking server (SageMaker's managed one would need an interface endpoint, `aws.sagemaker.<region>.experiments`,
in every run's network), and SageMaker's PyTorch training image ships neither mlflow nor the sagemaker-mlflow
plugin. So the run is logged from its moments, as the notices are:
- **each training attempt's end** (SageMaker's state change, as DescribeTrainingJob bears it out): the MLflow run
  is found or made (named by the job id, in the experiment named by the stack; the spec's fields as params), and
  the attempt's metrics are logged from its log at their steps (rank 0's lines on algo-1, read through the job's
  MetricDefinitions, as SageMaker and `lustrain report` read them), with the attempt's status as a tag;
- **the run's end** (the state machine's notify; an execution stopped, timed out, or dead of an error no Catch
  sees): the MLflow run ends FINISHED, FAILED or KILLED, and the model's S3 location is its artifact
  `lustrain/model.json` and its tag `lustrain.model_s3_uri`.
MLflow is a view of the run: a call that fails is logged and given up, and never holds the run up.

It speaks MLflow's REST API (`/api/2.0/mlflow/...`) with the standard library and botocore, both in every Lambda
bundle, rather than carry the mlflow client and the sagemaker-mlflow plugin (tens of MB, and seconds of import at
each cold start) for a handful of calls. A SageMaker managed server is called as the sagemaker-mlflow plugin calls
it: `https://<region>.experiments.sagemaker.aws`, the header `x-mlflow-sm-tracking-server-arn`, and requests
signed with SigV4 for the service `sagemaker-mlflow` (IAM actions `sagemaker-mlflow:*`). Any other tracking URI is
a server's https:// URL (without authentication), or http:// on 127.0.0.1 (the twin's tests).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.exceptions import BotoCoreError, ClientError

from lustrain_core import metric_lines
from lustrain_core.config import Settings
from lustrain_core.steps import executions, records
from lustrain_core.steps.events import ENDED, TrainingJobStateChange
from lustrain_core.steps.records import JobRecord
from lustrain_core.steps.training import describe_training_job, ended_attempt

#: the stack's setting (template.yaml: MlflowTrackingUri) and the bucket and prefix where a server's artifact store
#: lets the function write (MlflowArtifactStoreUri)
URI_SETTING = "LUSTRAIN_MLFLOW_TRACKING_URI"
ARTIFACT_STORE_SETTING = "LUSTRAIN_MLFLOW_ARTIFACT_STORE"
SERVER_ARN = re.compile(
    r"arn:(?P<partition>aws[a-z-]*):sagemaker:(?P<region>[a-z0-9-]+):\d{12}:mlflow-tracking-server/[A-Za-z0-9-]+"
)
#: the tag that names the lustrain run of an MLflow run (the run is also named by it)
JOB_TAG = "lustrain.job_id"
MODEL_TAG = "lustrain.model_s3_uri"
MODEL_ARTIFACT = "lustrain/model.json"
TIMEOUT_S = 10.0
#: MLflow's limits on one log-batch request (mlflow/utils/validation.py)
MAX_METRICS_PER_BATCH, MAX_PARAMS_PER_BATCH, MAX_PARAM_VALUE = 1000, 100, 6000
#: where SageMaker writes a training job's log: one stream per host, `<job>/algo-<n>-<epoch seconds>`; rank 0,
#: which logs the metrics, is on algo-1
TRAINING_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
#: a run's end, as the state machine's notify or its execution's status tells it, in MLflow's RunStatus
STATUS_OF_OUTCOME = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
STATUS_OF_EXECUTION = {"ABORTED": "KILLED", "TIMED_OUT": "FAILED", "FAILED": "FAILED"}


class TrackingError(Exception):
    """An MLflow call that failed: its HTTP status and MLflow's error_code where the server gave them."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def configured(settings: Settings) -> bool:
    return bool(settings.extra.get(URI_SETTING, "").strip())


def parse_uri(uri: str) -> str:
    """The tracking URI as given, once it is one the function may call; a ValueError naming what is allowed."""
    uri = uri.strip()
    parsed = urllib.parse.urlsplit(uri)
    if SERVER_ARN.fullmatch(uri):
        return uri
    if parsed.scheme == "https" and parsed.hostname:
        return uri.rstrip("/")
    if parsed.scheme == "http" and parsed.hostname == "127.0.0.1":
        return uri.rstrip("/")
    raise ValueError(
        f"{URI_SETTING}={uri!r}: a SageMaker MLflow tracking server's ARN (arn:aws:sagemaker:REGION:ACCOUNT:"
        "mlflow-tracking-server/NAME), an https:// URL, or http://127.0.0.1 (tests)"
    )


@dataclass(frozen=True)
class Server:
    """An MLflow tracking server's REST API; `credentials` (botocore's) sign the calls to a SageMaker one."""

    uri: str
    credentials: Any = None
    #: time.monotonic() by which every call must have ended (the function's own time, less a margin); None: none
    deadline: float | None = None

    def timeout(self) -> float:
        """How long the next call may take: TIMEOUT_S, or what is left of the function's time."""
        if self.deadline is None:
            return TIMEOUT_S
        left = self.deadline - time.monotonic()
        if left < 1.0:
            raise TrackingError("out of time: the function's time is nearly spent, the rest is not logged")
        return min(TIMEOUT_S, left)

    @property
    def arn(self) -> re.Match[str] | None:
        return SERVER_ARN.fullmatch(self.uri)

    @property
    def base_url(self) -> str:
        arn = self.arn
        return f"https://{arn['region']}.experiments.sagemaker.aws" if arn else self.uri

    def call(
        self, method: str, path: str, body: dict[str, Any] | None = None, query: dict[str, str] | None = None
    ) -> dict[str, Any]:
        url = f"{self.base_url}/api/2.0/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = json.dumps(body).encode() if body is not None else None
        answer = self.send(method, url, data, "application/json")
        return dict(json.loads(answer or b"{}"))

    def send(self, method: str, url: str, data: bytes | None, content_type: str) -> bytes:
        headers = {"Content-Type": content_type, "User-Agent": "lustrain"}
        arn = self.arn
        if arn:
            if self.credentials is None:
                raise TrackingError("no AWS credentials to sign the call to a SageMaker MLflow tracking server")
            headers["x-mlflow-sm-tracking-server-arn"] = self.uri
            headers["X-Amz-Content-SHA256"] = hashlib.sha256(data or b"").hexdigest()
            signed = AWSRequest(method=method, url=url, data=data or b"", headers=headers)
            SigV4Auth(self.credentials, "sagemaker-mlflow", arn["region"]).add_auth(signed)
            headers = dict(signed.headers.items())
        request = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310 (parse_uri)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout()) as answer:  # noqa: S310
                return bytes(answer.read())
        except urllib.error.HTTPError as exc:
            with exc:
                said = exc.read()
            try:
                error = json.loads(said)
            except ValueError:
                error = {}
            code = error.get("error_code") if isinstance(error, dict) else None
            raise TrackingError(f"{method} {urllib.parse.urlsplit(url).path}: HTTP {exc.code} {code or ''}".strip(),
                                status=exc.code, code=code) from None


# -------------------------------------------------------------------------------------------- the MLflow run


def experiment_id(server: Server, name: str) -> str:
    """The experiment's id, made on first use."""
    for _ in range(2):
        try:
            found = server.call("GET", "mlflow/experiments/get-by-name", query={"experiment_name": name})
            return str(found["experiment"]["experiment_id"])
        except TrackingError as exc:
            if exc.code != "RESOURCE_DOES_NOT_EXIST":
                raise
        try:
            return str(server.call("POST", "mlflow/experiments/create", {"name": name})["experiment_id"])
        except TrackingError as exc:
            if exc.code != "RESOURCE_ALREADY_EXISTS":  # made meanwhile by another invocation: read it again
                raise
    raise TrackingError(f"the experiment {name!r} could be neither read nor made")


def flat_params(value: Any, prefix: str = "") -> dict[str, str]:
    """The spec's fields as MLflow params: dotted names, each value its JSON (lists whole), at most MLflow's
    lengths; a field MLflow's names cannot hold is left out."""
    if isinstance(value, dict) and value:
        found: dict[str, str] = {}
        for key, item in value.items():
            found.update(flat_params(item, f"{prefix}{key}."))
        return found
    name = prefix.rstrip(".")
    if not name or len(name) > 250 or not re.fullmatch(r"[\w./ -]+", name):
        return {}
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return {name: text[:MAX_PARAM_VALUE]}


def _ms(iso: str | None) -> int | None:
    if not iso:
        return None
    from datetime import datetime

    try:
        return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


def _run_info(server: Server, run_id: str) -> dict[str, Any]:
    return dict(server.call("GET", "mlflow/runs/get", query={"run_id": run_id})["run"]["info"])


def mlflow_run(server: Server, settings: Settings, record: JobRecord, ddb: Any) -> dict[str, Any]:
    """The MLflow run of a lustrain run (its info), made with its params the first time.

    Two invocations may make one at once (an attempt's end and the run's end): the job record keeps the first
    noted (records.claim_mlflow_run, a conditional write), and the other deletes its own."""
    if record.mlflow_run:
        return _run_info(server, record.mlflow_run)
    experiment = experiment_id(server, settings.stack_name)
    made = server.call(
        "POST",
        "mlflow/runs/create",
        {
            "experiment_id": experiment,
            "run_name": record.job_id,
            "start_time": _ms(record.created_at) or int(time.time() * 1000),
            "tags": [
                {"key": JOB_TAG, "value": record.job_id},
                {"key": "lustrain.spec_name", "value": record.name},
                {"key": "lustrain.execution", "value": record.execution or ""},
                {"key": "mlflow.source.name", "value": f"lustrain stack {settings.stack_name}"},
            ],
        },
    )["run"]["info"]
    kept = records.claim_mlflow_run(ddb, settings.jobs_table, record.job_id, str(made["run_id"]))
    if kept != made["run_id"]:
        server.call("POST", "mlflow/runs/delete", {"run_id": made["run_id"]})
        return _run_info(server, kept)
    params = sorted(flat_params(record.spec).items())
    for start in range(0, len(params), MAX_PARAMS_PER_BATCH):
        batch = [{"key": k, "value": v} for k, v in params[start : start + MAX_PARAMS_PER_BATCH]]
        server.call("POST", "mlflow/runs/log-batch", {"run_id": made["run_id"], "params": batch})
    return dict(made)


def metric_key(name: str) -> str | None:
    """A MetricDefinition's name as an MLflow metric key: a character MLflow's names refuse becomes "_" (a SageMaker
    name such as `train:loss` may hold one), at most MLflow's 250; None for an empty one."""
    key = re.sub(r"[^\w./ :-]", "_", name)[:250]
    return key or None


def _value(value: float) -> float | str:
    """A metric's value in MLflow's JSON: a non-finite one as protobuf's JSON spells it (JSON has no NaN)."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def log_metrics(server: Server, run_id: str, lines: Iterable[tuple[int, str]], definitions: list[Any]) -> int:
    """Log each point of the lines at its step and time, a batch at a time as the lines are read (a long attempt's
    points are never held together); the same point logged twice (an event delivered twice, the run's end reading
    the last attempt again) is one entry of the metric's history. The number of points logged."""
    batch: list[dict[str, Any]] = []
    logged = 0
    for name, point in metric_lines.each_point(lines, definitions):
        key = metric_key(name)
        if key is None:
            continue
        batch.append({"key": key, "value": _value(point.value), "timestamp": point.timestamp_ms, "step": int(point.step)})
        if len(batch) == MAX_METRICS_PER_BATCH:
            server.call("POST", "mlflow/runs/log-batch", {"run_id": run_id, "metrics": batch})
            logged, batch = logged + len(batch), []
    if batch:
        server.call("POST", "mlflow/runs/log-batch", {"run_id": run_id, "metrics": batch})
        logged += len(batch)
    return logged


def attempt_lines(logs: Any, training_job: str) -> Iterator[tuple[int, str]]:
    """(timestamp ms, message) of the attempt's first host's log (rank 0 logs the metrics), page by page: a long
    attempt's log is never held whole."""
    pages = logs.get_paginator("filter_log_events").paginate(
        logGroupName=TRAINING_LOG_GROUP, logStreamNamePrefix=f"{training_job}/algo-1-"
    )
    try:
        for page in pages:
            for event in page.get("events", []):
                yield int(event["timestamp"]), str(event["message"])
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":  # no job has logged yet
            raise


def attempt_ended(
    server: Server, settings: Settings, record: JobRecord, described: dict[str, Any], *, logs: Any, ddb: Any
) -> dict[str, Any]:
    """Log an ended attempt (as DescribeTrainingJob gives it) to the run's MLflow run: its metrics, its status."""
    run = mlflow_run(server, settings, record, ddb)
    name = str(described["TrainingJobName"])
    attempt = name.rpartition("-")[2]
    definitions = (described.get("AlgorithmSpecification") or {}).get("MetricDefinitions") or []
    logged = log_metrics(server, run["run_id"], attempt_lines(logs, name), definitions)
    tags = [
        {"key": f"lustrain.attempt.{attempt}.training_job", "value": name},
        {"key": f"lustrain.attempt.{attempt}.status", "value": str(described.get("TrainingJobStatus", ""))},
    ]
    reason = described.get("FailureReason")
    if reason:
        tags.append({"key": f"lustrain.attempt.{attempt}.failure_reason", "value": str(reason)[:5000]})
    server.call("POST", "mlflow/runs/log-batch", {"run_id": run["run_id"], "tags": tags})
    return {"run_id": run["run_id"], "attempt": int(attempt), "metrics": logged}


def _artifact_store(settings: Settings) -> tuple[str, str] | None:
    """(bucket, key prefix) of the server's artifact store the function may write under, where the stack names it."""
    raw = settings.extra.get(ARTIFACT_STORE_SETTING, "").strip()
    if not raw.startswith("s3://"):
        return None
    bucket, _, prefix = raw[len("s3://") :].partition("/")
    return bucket, f"{prefix.strip('/')}/" if prefix.strip("/") else ""


def put_artifact(server: Server, settings: Settings, run: dict[str, Any], body: bytes, *, s3: Any) -> str:
    """Put `body` as the run's MODEL_ARTIFACT where the run's artifact URI says: through the server
    (mlflow-artifacts:, a server that serves its artifacts), or into S3 (a SageMaker server's artifact store) with
    the function's role, under the store the stack names. Where it went, or why it did not."""
    uri = str(run.get("artifact_uri") or "")
    if uri.startswith("mlflow-artifacts:"):
        path = urllib.parse.urlsplit(uri).path.lstrip("/")
        server.send("PUT", f"{server.base_url}/api/2.0/mlflow-artifacts/artifacts/{path}/{MODEL_ARTIFACT}", body,
                    "application/json")
        return f"{uri}/{MODEL_ARTIFACT}"
    if uri.startswith("s3://"):
        bucket, _, key = uri[len("s3://") :].partition("/")
        store = _artifact_store(settings)
        if store is None or store[0] != bucket or not key.startswith(store[1]):
            return f"not written: the run's artifacts are at {uri}, outside the stack's MlflowArtifactStoreUri"
        target = f"{key.rstrip('/')}/{MODEL_ARTIFACT}"
        s3.put_object(Bucket=bucket, Key=target, Body=body, ContentType="application/json")
        return f"s3://{bucket}/{target}"
    return f"not written: artifacts at {uri or 'no URI'} are not reachable from the function"


def run_ended(
    server: Server,
    settings: Settings,
    record: JobRecord,
    status: str,
    *,
    sagemaker: Any,
    s3: Any,
    ddb: Any,
    logs: Any = None,
) -> dict[str, Any]:
    """End the run's MLflow run with `status` (MLflow's RunStatus), and note where its model is."""
    run = mlflow_run(server, settings, record, ddb)
    names = record.training_job_names()
    # the last attempt, described once: its metrics read again, and its model where it completed
    described = (describe_training_job(sagemaker, names[-1]) or {}) if names else {}
    if logs is not None and names:
        definitions = (described.get("AlgorithmSpecification") or {}).get("MetricDefinitions") or []
        log_metrics(server, run["run_id"], attempt_lines(logs, names[-1]), definitions)
    model = _model_location(record, settings, described)
    written = put_artifact(
        server,
        settings,
        run,
        json.dumps({"job_id": record.job_id, "model_s3_uri": model, "status": status}, indent=2).encode(),
        s3=s3,
    )
    server.call(
        "POST",
        "mlflow/runs/log-batch",
        {"run_id": run["run_id"], "tags": [{"key": MODEL_TAG, "value": model}, {"key": "lustrain.outcome", "value": status}]},
    )
    ended = _ms(record.finished_at) or int(time.time() * 1000)
    server.call("POST", "mlflow/runs/update", {"run_id": run["run_id"], "status": status, "end_time": ended})
    return {"run_id": run["run_id"], "status": status, "model_s3_uri": model, "artifact": written}


def _model_location(record: JobRecord, settings: Settings, described: dict[str, Any]) -> str:
    """The last attempt's model (`described`: its DescribeTrainingJob) where it completed, else the run's archive
    (where every attempt's model is)."""
    from lustrain_core.launch_plan import archive_target

    artifacts = (described.get("ModelArtifacts") or {}).get("S3ModelArtifacts")
    if described.get("TrainingJobStatus") == "Completed" and artifacts:
        return str(artifacts)
    return archive_target(settings, record.job_id)


def where(server: Server, record: JobRecord) -> dict[str, Any]:
    """Where a team opens a run's MLflow run (`lustrain status`): its ids, and the page of a server with a URL; a
    SageMaker server's UI opens through a presigned URL, so the command that makes one."""
    shown: dict[str, Any] = {"tracking_uri": server.uri, "run_id": record.mlflow_run}
    if not record.mlflow_run:
        return shown
    info = _run_info(server, record.mlflow_run)
    shown["experiment_id"] = experiment = str(info["experiment_id"])
    if server.arn:
        name = server.uri.rsplit("/", 1)[-1]
        shown["open"] = f"aws sagemaker create-presigned-mlflow-tracking-server-url --tracking-server-name {name}"
    else:
        shown["url"] = f"{server.uri}/#/experiments/{experiment}/runs/{record.mlflow_run}"
    return shown


# ------------------------------------------------------------------------------------------ the run's moments


def server_of(settings: Settings, credentials: Any, deadline: float | None = None) -> Server:
    return Server(parse_uri(settings.extra[URI_SETTING]), credentials, deadline)


def on_training_change(
    change: Any,
    *,
    ddb: Any,
    sagemaker: Any,
    logs: Any,
    settings: Settings,
    credentials: Any,
    deadline: float | None = None,
) -> dict[str, Any]:
    """An attempt's end, as SageMaker bears it out: logged to the run's MLflow run. What was done, or why not."""
    found = ended_attempt(
        change.TrainingJobName, change.TrainingJobStatus, ddb=ddb, sagemaker=sagemaker, settings=settings
    )
    if isinstance(found, str):
        return {"tracked": False, "reason": found}
    record, described = found
    return _safely(
        lambda: attempt_ended(
            server_of(settings, credentials, deadline), settings, record, described, logs=logs, ddb=ddb
        )
    )


def on_event(
    event: dict[str, Any],
    *,
    ddb: Any,
    sagemaker: Any,
    logs: Any,
    s3: Any,
    settings: Settings,
    credentials: Any,
    deadline: float | None = None,
    sfn: Any = None,
) -> dict[str, Any]:
    """An EventBridge event of the notify function's rules, told to MLflow where it is a moment MLflow keeps: an
    attempt's end, or an execution's end that the state machine's own notify does not see, once Step Functions bears
    it out (steps/executions.py `verified_end`, as the chat notice does: a forged end ends no MLflow run)."""
    kind, detail = event.get("detail-type"), event.get("detail")
    detail = detail if isinstance(detail, dict) else {}
    if event.get("source") == "aws.sagemaker" and kind == "SageMaker Training Job State Change":
        try:
            change = TrainingJobStateChange.model_validate(detail)
        except ValueError:
            return {"tracked": False, "reason": "not a SageMaker training job's state change"}
        if change.TrainingJobStatus not in ENDED:
            return {"tracked": False, "reason": f"the training job is {change.TrainingJobStatus}, not ended"}
        return on_training_change(
            change,
            ddb=ddb,
            sagemaker=sagemaker,
            logs=logs,
            settings=settings,
            credentials=credentials,
            deadline=deadline,
        )
    status, name = detail.get("status"), detail.get("name")
    if event.get("source") == "aws.states" and status in STATUS_OF_EXECUTION and isinstance(name, str) and name:
        ended = executions.verified_end(detail, sfn=sfn, settings=settings)
        if isinstance(ended, str):
            return {"tracked": False, "reason": f"not verified: {ended}"}
        record = records.find_by_execution(ddb, settings.jobs_table, name)
        if record is not None and status == "FAILED" and record.notice_sent:
            return {"tracked": False, "reason": "the state machine's notify ended the run's MLflow run"}
        return on_run_end(
            record,
            STATUS_OF_EXECUTION[status],
            ddb=ddb,
            sagemaker=sagemaker,
            s3=s3,
            settings=settings,
            credentials=credentials,
            logs=logs,
            deadline=deadline,
        )
    return {"tracked": False, "reason": "not a moment MLflow keeps"}


def on_run_end(
    record: JobRecord | None,
    status: str,
    *,
    ddb: Any,
    sagemaker: Any,
    s3: Any,
    settings: Settings,
    credentials: Any,
    logs: Any = None,
    deadline: float | None = None,
) -> dict[str, Any]:
    """The run's end (`status`, MLflow's RunStatus): its MLflow run ended, its model's location noted, and its last
    attempt's metrics read again (CloudWatch may not have had its last lines searchable when the attempt's end
    was told; the points logged then are kept once)."""
    if record is None:
        return {"tracked": False, "reason": "no run was registered"}
    if record.kind != records.TRAIN:
        return {"tracked": False, "reason": "a data preparation trains no model"}
    return _safely(
        lambda: run_ended(
            server_of(settings, credentials, deadline),
            settings,
            record,
            status,
            sagemaker=sagemaker,
            s3=s3,
            ddb=ddb,
            logs=logs,
        )
    )


def _safely(work: Any) -> dict[str, Any]:
    """MLflow never holds a run up: a failure is told (its class and what the server said), never raised."""
    try:
        return {"tracked": True, **work()}
    except TrackingError as exc:
        return {"tracked": False, "error": str(exc)}
    except (OSError, ValueError, KeyError, ClientError, BotoCoreError) as exc:  # unreachable, timed out, refused
        return {"tracked": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
