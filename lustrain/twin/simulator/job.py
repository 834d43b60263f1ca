"""A training job's state as SageMaker keeps it: statuses, transitions, what DescribeTrainingJob and the events say.

`SimulatedJob` is shared by the job's thread (lifecycle.py, which moves it) and the patched API (which reads it).
"""

from __future__ import annotations

import functools
import json
import re
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from lustrain.twin import training_plans
from lustrain.twin.simulator.launcher import JobProcess

EVENT_SOURCE = "aws.sagemaker"
EVENT_DETAIL_TYPE = "SageMaker Training Job State Change"
TERMINAL = frozenset({"Completed", "Failed", "Stopped"})
#: DescribeTrainingJob's FailureReason is at most 1024 characters.
FAILURE_REASON_MAX = 1024
#: The session name of the execution role's credentials SageMaker uses for a job's own calls.
ROLE_SESSION = "SageMaker"
#: What a warm pool is matched by ("SageMaker managed warm pools", Matching training jobs): these request values
#: must be identical (VpcConfig's lists compared as sets)
WARM_POOL_MATCH = (
    "RoleArn",
    "ResourceConfig.InstanceCount",
    "ResourceConfig.InstanceType",
    "ResourceConfig.VolumeKmsKeyId",
    "ResourceConfig.VolumeSizeInGB",
    "VpcConfig.SecurityGroupIds",
    "VpcConfig.Subnets",
    "EnableInterContainerTrafficEncryption",
    "EnableNetworkIsolation",
)
#: Failures that still keep a pool (the guide: an algorithm or client error); any other may have harmed the cluster
_POOL_KEEPING_FAILURES = ("AlgorithmError", "ClientError")

#: SageMaker's StatusMessage for each secondary status (as seen in DescribeTrainingJob; Pending's as the SageMaker
#: Python SDK prints it, "Pending - Training job waiting for capacity": aws/deep-learning-containers PR #6299).
_STATUS_MESSAGES = {
    "Pending": "Training job waiting for capacity",
    "Starting": "Launching requested ML instances",
    "Downloading": "Downloading input data",
    "Training": "Training image download completed. Training in progress.",
    "Uploading": "Uploading generated training model",
    "Completed": "Training job completed",
    "Failed": "Training job failed",
    "Stopping": "Stopping the training job",
    "Stopped": "Training job stopped",
    "MaxRuntimeExceeded": "Training job stopped: it exceeded the maximum allowed runtime (MaxRuntimeInSeconds)",
}


class JobFailure(Exception):
    """The job cannot go on; `reason` is the FailureReason SageMaker would give."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def now() -> datetime:
    return datetime.now(UTC)


def epoch_ms(moment: datetime) -> str:
    """Times in SageMaker's EventBridge events are epoch milliseconds, as strings."""
    return str(int(moment.timestamp() * 1000))


@functools.cache
def describe_members() -> frozenset[str]:
    """What DescribeTrainingJob returns, per the botocore model: the stored request is echoed through this."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    return frozenset(model.operation_model("DescribeTrainingJob").output_shape.members)


@dataclass(frozen=True)
class JobView:
    """One simulated job as tests and the CLI see it."""

    name: str
    arn: str
    status: str
    secondary_status: str
    failure_reason: str | None
    model_artifacts: str | None
    metrics: dict[str, float]
    events: tuple[tuple[str, str], ...]
    log_path: Path | None
    workdir: Path | None
    done: bool


class SimulatedJob:
    """A training job's state, shared by the job's thread (which moves it) and the patched API (which reads it)."""

    def __init__(self, *, request: dict[str, Any], arn: str, account: str, region: str) -> None:
        self.request = json.loads(json.dumps(request, default=str))
        self.name: str = request["TrainingJobName"]
        self.arn = arn
        self.account = account
        self.region = region
        self.creation_time = now()
        self.last_modified_time = self.creation_time
        self.status = "InProgress"
        # a job on a training plan whose capacity has not started waits Pending for it (simulator/lifecycle.py)
        self.secondary_status = "Pending" if training_plans.waits_for_capacity(self.request) else "Starting"
        self.transitions: list[dict[str, Any]] = [
            self._transition_record(self.secondary_status, self.creation_time)
        ]
        self.failure_reason: str | None = None
        self.training_start_time: datetime | None = None
        self.training_end_time: datetime | None = None
        self.model_artifacts: str | None = None
        self.metrics: dict[str, tuple[float, datetime]] = {}
        self.fault: str | None = None
        #: How many times each event is emitted (the `repeat-events` fault: SageMaker may send one more than once;
        #: the `silent` fault: none gets through).
        self.event_copies = 1
        self.stop_reason: str | None = None
        self.workdir: Path | None = None
        self.log_path: Path | None = None
        self.events: list[tuple[str, str]] = []
        #: The in-process Lambda invocation (its thread) that called CreateTrainingJob, if any.
        self.created_by: threading.Thread | None = None
        #: The execution role's credentials, handed out when CreateTrainingJob found that SageMaker may assume
        #: the role: the job's own calls (code, checkpoints, model, logs, metrics) are made, and authorized, as it.
        self.credentials: dict[str, str] = {}
        #: The CloudWatch Logs stream of this host, once the job has started writing it.
        self.log_stream: str | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        #: the twin was reset: the job's thread ends where it is, saying nothing more (no move, no event)
        self.discarded = False
        self._done = threading.Event()
        self._process: JobProcess | None = None
        #: the warm pool: how long it is kept (KeepAlivePeriodInSeconds), whether the warm pool quota let SageMaker
        #: keep it, whether this job took a matching pool over, and what became of its own
        self.keep_alive_s = int(
            (self.request.get("ResourceConfig") or {}).get("KeepAlivePeriodInSeconds") or 0
        )
        self.pool_granted = False
        self.took_pool = False
        self.reused_by: str | None = None
        self.reused_at: datetime | None = None
        self.pool_terminated_at: datetime | None = None
        #: twin seconds per second of KeepAlivePeriodInSeconds (the simulator's keep_alive_scale)
        self.keep_alive_scale = 1.0
        self._metric_patterns = [
            (d["Name"], re.compile(d["Regex"]))
            for d in self.request.get("AlgorithmSpecification", {}).get("MetricDefinitions", [])
        ]

    # --- reading --------------------------------------------------------------------------------------------

    @property
    def instance_count(self) -> int:
        return int(self.request.get("ResourceConfig", {}).get("InstanceCount", 1))

    @property
    def instance_type(self) -> str:
        return str(self.request.get("ResourceConfig", {}).get("InstanceType", ""))

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def describe(self) -> dict[str, Any]:
        """DescribeTrainingJob's answer: the request as stored, and where the job has got to."""
        with self._lock:
            out: dict[str, Any] = {
                k: json.loads(json.dumps(v)) for k, v in self.request.items() if k in describe_members()
            }
            out.update(
                TrainingJobName=self.name,
                TrainingJobArn=self.arn,
                TrainingJobStatus=self.status,
                SecondaryStatus=self.secondary_status,
                CreationTime=self.creation_time,
                LastModifiedTime=self.last_modified_time,
                SecondaryStatusTransitions=[dict(t) for t in self.transitions],
            )
            if self.training_start_time is not None:
                out["TrainingStartTime"] = self.training_start_time
            if self.training_end_time is not None:
                out["TrainingEndTime"] = self.training_end_time
                if self.training_start_time is not None:
                    seconds = max(
                        1, round((self.training_end_time - self.training_start_time).total_seconds())
                    )
                    out["TrainingTimeInSeconds"] = seconds
                    out["BillableTimeInSeconds"] = seconds
            if self.status == "Failed" and self.failure_reason:
                out["FailureReason"] = self.failure_reason
            if self.metrics:
                out["FinalMetricDataList"] = [
                    {"MetricName": name, "Value": value, "Timestamp": at}
                    for name, (value, at) in self.metrics.items()
                ]
            if self.model_artifacts:
                out["ModelArtifacts"] = {"S3ModelArtifacts": self.model_artifacts}
            pool = self.warm_pool_status()
            if pool is not None:
                out["WarmPoolStatus"] = pool
            return out

    # --- the warm pool ---------------------------------------------------------------------------------------

    def match_key(self) -> tuple[Any, ...]:
        """The request values a warm pool is matched by."""
        values: list[Any] = []
        for path in WARM_POOL_MATCH:
            value: Any = self.request
            for part in path.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            values.append(tuple(sorted(value)) if isinstance(value, list) else value)
        return tuple(values)

    def _pool_kept(self) -> bool:
        if not (self.keep_alive_s and self.pool_granted and self.status in TERMINAL):
            return False
        if self.status == "Failed":
            return (self.failure_reason or "").startswith(_POOL_KEEPING_FAILURES)
        # a job stopped before its cluster was launched has no pool to keep
        return self.status == "Completed" or self.training_start_time is not None

    def pool_expiry(self) -> datetime | None:
        if not self._pool_kept() or self.training_end_time is None:
            return None
        return self.training_end_time + timedelta(seconds=self.keep_alive_s * self.keep_alive_scale)

    def pool_available(self, at: datetime | None = None) -> bool:
        with self._lock:
            expiry = self.pool_expiry()
            moment = at or now()
            return (
                expiry is not None
                and self.reused_by is None
                and self.pool_terminated_at is None
                and moment < expiry
            )

    def warm_pool_status(self) -> dict[str, Any] | None:
        """DescribeTrainingJob's WarmPoolStatus: absent for a job that keeps no pool and took none."""
        if not self.keep_alive_s:
            return None
        if self.status not in TERMINAL:
            return {"Status": "InUse"} if self.took_pool else None
        end = self.training_end_time or now()

        def billed(until: datetime) -> int:
            return max(0, round((until - end).total_seconds() / self.keep_alive_scale))

        expiry = self.pool_expiry()
        if expiry is None:
            return {"Status": "Terminated", "ResourceRetainedBillableTimeInSeconds": 0}
        if self.reused_by is not None and self.reused_at is not None:
            return {
                "Status": "Reused",
                "ResourceRetainedBillableTimeInSeconds": billed(self.reused_at),
                "ReusedByJob": self.reused_by,
            }
        ended = min(expiry, self.pool_terminated_at or expiry)
        moment = now()
        if moment < ended:
            return {"Status": "Available", "ResourceRetainedBillableTimeInSeconds": billed(moment)}
        return {"Status": "Terminated", "ResourceRetainedBillableTimeInSeconds": billed(ended)}

    def hand_pool_to(self, name: str) -> None:
        with self._lock:
            self.reused_by, self.reused_at = name, now()

    def terminate_pool(self) -> bool:
        """The pool ends before its time (SageMaker's patch update, or a KeepAlivePeriodInSeconds set to 0)."""
        with self._lock:
            if not self.pool_available():
                return False
            self.pool_terminated_at = now()
            return True

    def update_keep_alive(self, seconds: int) -> str | None:
        """UpdateTrainingJob's ResourceConfig.KeepAlivePeriodInSeconds: why SageMaker refuses it, or None once done.

        "When the training job is complete and the warm pool status is Available, then you can update the
        KeepAlivePeriodInSeconds value"; 0 terminates the pool ("To manually terminate a warm pool, set the
        KeepAlivePeriodInSeconds value to 0", SageMaker Developer Guide, "Use SageMaker AI managed warm pools"): it
        shows Terminated and its ResourceRetainedBillableTimeInSeconds stops growing. Another value keeps the pool
        that long after the job's end (one already past ends it now). DescribeTrainingJob's ResourceConfig keeps
        the value the job was created with."""
        with self._lock:
            pool = self.warm_pool_status()
            state = (pool or {}).get("Status")
            if state != "Available":
                held = f"its warm pool is {state}" if state else "it has no warm pool"
                return (
                    f"Training job {self.name} is {self.status} and {held}: KeepAlivePeriodInSeconds can be "
                    "updated only when the training job is complete and its warm pool is Available."
                )
            if seconds == 0:
                self.terminate_pool()
                return None
            end = self.training_end_time or now()
            if end + timedelta(seconds=seconds * self.keep_alive_scale) <= now():
                self.pool_terminated_at = now()  # already past: it ends now, billed until now
            else:
                self.keep_alive_s = seconds
            return None

    def event_detail(self) -> dict[str, Any]:
        """The `detail` of the EventBridge event: the description, times as epoch-ms strings, Tags as a map."""
        detail: dict[str, Any] = _times_as_epoch_ms(self.describe())
        detail["Tags"] = {t["Key"]: t["Value"] for t in self.request.get("Tags") or []}
        return detail

    def view(self) -> JobView:
        with self._lock:
            return JobView(
                name=self.name,
                arn=self.arn,
                status=self.status,
                secondary_status=self.secondary_status,
                failure_reason=self.failure_reason,
                model_artifacts=self.model_artifacts,
                metrics={k: v for k, (v, _) in self.metrics.items()},
                events=tuple(self.events),
                log_path=self.log_path,
                workdir=self.workdir,
                done=self.done,
            )

    # --- moving -----------------------------------------------------------------------------------------------

    @staticmethod
    def _transition_record(status: str, at: datetime) -> dict[str, Any]:
        return {"Status": status, "StartTime": at, "StatusMessage": _STATUS_MESSAGES.get(status, status)}

    def _move(self, status: str, secondary: str, failure_reason: str | None = None) -> None:
        with self._lock:
            at = now()
            if self.transitions and "EndTime" not in self.transitions[-1]:
                self.transitions[-1]["EndTime"] = at
            self.transitions.append(self._transition_record(secondary, at))
            self.status, self.secondary_status = status, secondary
            self.last_modified_time = at
            if failure_reason is not None:
                self.failure_reason = failure_reason[:FAILURE_REASON_MAX]
            if status in TERMINAL:
                self.training_end_time = at
                self.transitions[-1]["EndTime"] = at

    def record_metrics(self, line: str) -> None:
        for name, pattern in self._metric_patterns:
            match = pattern.search(line)
            if not match:
                continue
            try:
                value = float(match.group(1) if match.groups() else match.group(0))
            except (ValueError, IndexError):
                continue
            with self._lock:
                self.metrics[name] = (value, now())

    def request_stop(self) -> bool:
        """StopTrainingJob: InProgress -> Stopping at once; the job's thread then stops the trainer."""
        with self._lock:
            if self.status != "InProgress":
                return False
            self.stop_reason = "Stopped"
            self._move("Stopping", "Stopping")
        self._stop.set()
        return True


def _times_as_epoch_ms(value: Any) -> Any:
    if isinstance(value, datetime):
        return epoch_ms(value)
    if isinstance(value, dict):
        return {k: _times_as_epoch_ms(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_times_as_epoch_ms(v) for v in value]
    return value


def max_runtime_s(job: SimulatedJob) -> float:
    """The job's StoppingCondition.MaxRuntimeInSeconds (SageMaker's default: a day)."""
    return float((job.request.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds", 86400))
