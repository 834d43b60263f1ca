"""A SageMaker training job's life on this machine: the real entry point, run on CPU, under SageMaker's contract.

moto stores a training job and calls it Completed at once. The twin's SageMaker patch (patches/sagemaker.py) hands
each new job to this module instead, which lives the job the way SageMaker would, in a background thread:

    InProgress/Starting -> Downloading (code, the Lustre "mount", S3 channels) -> Training (the entry point)
    -> Uploading (model.tar.gz, output.tar.gz, checkpoints) -> Completed | Failed | Stopped

and emits an EventBridge "SageMaker Training Job State Change" event at each change, as SageMaker does (it may
send several per change; consumers must cope with repeats either way).

How the cloud maps onto one machine:
- Instances: SageMaker's torchrun launcher starts InstanceCount x GPUs-per-instance workers. Here each instance is
  one CPU worker process, capped at `max_processes` (2 by default, for a 2-core machine): world size
  = min(InstanceCount, max_processes). SM_HOSTS still lists every instance (algo-1..algo-N); this is algo-1.
- /opt/ml: each job gets a work directory with the same layout (code/, input/data/<channel>/, input/config/,
  model/, output/data/, checkpoints/), and the SM_* variables point into it.
- FSx for Lustre: a FileSystemDataSource channel is "mounted" by filling its directory from the S3 prefixes
  linked to the file system (the twin's FSx patch knows the links). As on SageMaker, DirectoryPath must start
  with "/<MountName>" and the file system must be AVAILABLE, else the job fails to mount.
- Checkpoints: CheckpointConfig.S3Uri is copied into the local checkpoint directory before training (so a rerun
  resumes) and back to S3 at the end. SM_CHECKPOINT_DIR names the local directory, because the trainer cannot
  use /opt/ml/checkpoints here.
- Stop: SIGTERM to the launcher (torchrun forwards it to every worker), then `stop_grace_s` (SageMaker's 120 s)
  before SIGKILL. MaxRuntimeInSeconds ends the job the same way, as Stopped with SecondaryStatus
  MaxRuntimeExceeded; a manual StopTrainingJob ends as Stopped/Stopped. The model is uploaded in both cases.

S3 and FSx are read and written through moto's backend objects, in this process: the simulator works the same
under mock_aws and in server mode, and never reaches for a network endpoint.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

log = logging.getLogger("lustrain.twin.sagemaker")

EVENT_SOURCE = "aws.sagemaker"
EVENT_DETAIL_TYPE = "SageMaker Training Job State Change"
CAPACITY_ERROR = (
    "CapacityError: Unable to provision requested ML compute capacity. "
    "Please retry using a different ML instance type."
)
TERMINAL = frozenset({"Completed", "Failed", "Stopped"})
#: The step of the state machine whose faults (lustrain.twin.faults) this simulator fires.
FAULT_STEP = "start_training"
#: DescribeTrainingJob's FailureReason is at most 1024 characters.
_FAILURE_REASON_MAX = 1024
#: The current host's name, as SageMaker names the first instance of a job.
CURRENT_HOST = "algo-1"
#: The longest a job waits for the Lambda invocation that created it to return (Lambda's maximum timeout).
CREATOR_WAIT_S = 900.0
#: How many times the `repeat-events` fault delivers each event.
REPEATED_EVENT_COPIES = 3

#: SageMaker's StatusMessage for each secondary status (as seen in DescribeTrainingJob).
_STATUS_MESSAGES = {
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


@dataclass(frozen=True)
class Settings:
    """How the simulator runs jobs. `configure()` changes them; the environment gives the starting values."""

    #: Seconds between CreateTrainingJob (or the return of the Lambda invocation that called it) and the job's
    #: first event. The first event must come after the start_training Lambda has returned: a SendTaskSuccess
    #: from inside the invocation that received the task token is lost on moto 5.2.5 (DESIGN), and a fast
    #: failure would send one. Under mock_aws the job waits for that invocation's thread to end, then this
    #: long, for the state machine to take the invocation's answer; in server mode the request arrives on a
    #: server thread and this delay is all there is.
    start_delay_s: float = 1.0
    #: Seconds a stopped trainer gets between SIGTERM and SIGKILL (SageMaker gives 120).
    stop_grace_s: float = 120.0
    #: At most this many worker processes per job, whatever the InstanceCount.
    max_processes: int = 2
    #: Where job work directories go (default: the system temp directory).
    work_root: Path | None = None
    #: What the `stopped` fault leaves of MaxRuntimeInSeconds: the job is stopped this long after training starts.
    stopped_fault_runtime_s: float = 1.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        defaults = cls()
        root = env.get("LUSTRAIN_TWIN_WORK_ROOT")
        return cls(
            start_delay_s=float(env.get("LUSTRAIN_TWIN_SM_START_DELAY", defaults.start_delay_s)),
            stop_grace_s=float(env.get("LUSTRAIN_TWIN_SM_STOP_GRACE", defaults.stop_grace_s)),
            max_processes=max(1, int(env.get("LUSTRAIN_TWIN_SM_MAX_PROCESSES", defaults.max_processes))),
            work_root=Path(root) if root else None,
        )


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
        self.secondary_status = "Starting"
        self.transitions: list[dict[str, Any]] = [self._transition_record("Starting", self.creation_time)]
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
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
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
            return out

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
                self.failure_reason = failure_reason[:_FAILURE_REASON_MAX]
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


LogListener = Callable[[str, str], None]


class Simulator:
    """Every simulated job of this process, and the threads that run them."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings.from_env()
        self._jobs: dict[str, SimulatedJob] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._listeners: list[LogListener] = []
        self._lock = threading.Lock()

    def launch(self, job: SimulatedJob) -> None:
        """Take a job just created; its life starts in a thread after `start_delay_s`, never in the caller's."""
        from lustrain.twin import faults

        for fault in faults.TRAINING_JOB_FAULTS:
            if faults.consume(FAULT_STEP, fault):
                job.fault = fault
                break
        if faults.consume(FAULT_STEP, "repeat-events"):
            job.event_copies = REPEATED_EVENT_COPIES
        if job.fault == "silent":
            job.event_copies = 0
        thread = threading.Thread(
            target=_JobRun(job, self).run, name=f"sagemaker-job-{job.name}", daemon=True
        )
        with self._lock:
            self._jobs[job.arn] = job
            self._threads[job.arn] = thread
        thread.start()

    def subscribe(self, listener: LogListener) -> Callable[[], None]:
        """Call `listener(job_name, line)` for each line a trainer prints; returns the unsubscribe function."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return unsubscribe

    def publish_line(self, job: SimulatedJob, line: str) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(job.name, line)
            except Exception:
                log.exception("log listener failed on a line of %s", job.name)

    def jobs(self) -> list[JobView]:
        with self._lock:
            jobs = list(self._jobs.values())
        return [j.view() for j in jobs]

    def wait_all(self, timeout: float | None = None) -> list[JobView]:
        """Wait until every job launched so far has finished; TimeoutError names those still running."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads.items())
        for _arn, thread in threads:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(remaining)
        running = [j for j in self.jobs() if not j.done]
        if running:
            names = ", ".join(f"{j.name} ({j.status}/{j.secondary_status})" for j in running)
            raise TimeoutError(f"simulated training jobs still running after {timeout} s: {names}")
        return self.jobs()

    def reset(self, timeout: float = 30.0) -> None:
        """Stop every running job at once (no grace) and forget them all: a fresh twin, as after moto's reset."""
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.request_stop()
            _kill(job._process)
        with contextlib.suppress(TimeoutError):
            self.wait_all(timeout)
        with self._lock:
            self._jobs.clear()
            self._threads.clear()


class _JobRun:
    """One job's thread: each phase moves the job on, or raises JobFailure with SageMaker's FailureReason."""

    def __init__(self, job: SimulatedJob, simulator: Simulator) -> None:
        self.job = job
        self.sim = simulator
        self.settings = simulator.settings

    def run(self) -> None:
        job = self.job
        try:
            if job.created_by is not None and job.created_by is not threading.current_thread():
                job.created_by.join(CREATOR_WAIT_S)
            if job._stop.wait(self.settings.start_delay_s):
                self._finish_stopped(upload=False)
                return
            if job.fault == "silent":
                self._hold_silently()
                return
            self._publish()
            if job.fault == "capacity-error":
                raise JobFailure(CAPACITY_ERROR)
            layout = self._prepare()
            self._advance("Downloading")
            with job._lock:
                job.training_start_time = now()
            code_dir = self._fetch_code(layout)
            channels = self._fill_channels(layout)
            self._restore_checkpoints(layout)
            if job._stop.is_set():
                self._finish_stopped(upload=False)
                return
            self._advance("Training")
            rc, stderr_tail, command = self._train(layout, code_dir, channels)
            if job.stop_reason:
                self._finish_stopped(upload=True, layout=layout)
            elif rc != 0:
                self._upload_after_failure(layout)
                raise JobFailure(_algorithm_error(layout, rc, stderr_tail, command))
            else:
                self._advance("Uploading")
                self._upload(layout, with_model=True)
                self._finish("Completed", "Completed")
        except JobFailure as failure:
            self._finish("Failed", "Failed", failure.reason)
        except Exception as error:
            log.exception("simulated training job %s broke", job.name)
            self._finish("Failed", "Failed", f"InternalServerError: the twin's simulator failed: {error!r}")
        finally:
            job._done.set()

    # --- status and events ----------------------------------------------------------------------------------

    def _publish(self) -> None:
        from lustrain.twin.patches import eventbridge

        job = self.job
        with job._lock:
            detail = job.event_detail()
            job.events.append((job.status, job.secondary_status))
        try:
            for _ in range(job.event_copies):
                eventbridge.emit(
                    EVENT_SOURCE, EVENT_DETAIL_TYPE, detail, job.region, job.account, resources=[job.arn]
                )
        except Exception:
            # As on AWS, an event that cannot be delivered does not change the job's fate.
            log.exception("could not emit %s/%s of %s", job.status, job.secondary_status, job.name)

    def _publish_stopping(self) -> None:
        """The Stopping event, once: StopTrainingJob moves the status, the job's thread announces it."""
        if ("Stopping", "Stopping") not in self.job.events:
            self._publish()

    def _advance(self, secondary: str) -> None:
        """Move to an InProgress secondary status, unless a stop has taken over the job's status."""
        with self.job._lock:
            if self.job.status != "InProgress":
                return
            self.job._move("InProgress", secondary)
        self._publish()

    def _finish(self, status: str, secondary: str, failure_reason: str | None = None) -> None:
        self.job._move(status, secondary, failure_reason)
        self._publish()

    def _hold_silently(self) -> None:
        """The `silent` fault: no event ever leaves the job, which holds its instances until it is stopped (or
        reaches MaxRuntimeInSeconds), as a job whose events are lost looks to whoever waits for them."""
        job = self.job
        max_runtime = _max_runtime_s(job)
        if not job._stop.wait(max_runtime):
            with job._lock:
                job.stop_reason = "MaxRuntimeExceeded"
                job._move("Stopping", "Stopping")
        self._finish_stopped(upload=False)

    def _finish_stopped(self, *, upload: bool, layout: _Layout | None = None) -> None:
        self._publish_stopping()
        if upload and layout is not None:
            self._upload(layout, with_model=True)
        secondary = "MaxRuntimeExceeded" if self.job.stop_reason == "MaxRuntimeExceeded" else "Stopped"
        self._finish("Stopped", secondary)

    # --- the instance -----------------------------------------------------------------------------------------

    def _prepare(self) -> _Layout:
        root = self.settings.work_root or Path(tempfile.gettempdir()) / "lustrain-twin-sagemaker"
        workdir = root / f"{self.job.name}-{uuid.uuid4().hex[:8]}"
        layout = _Layout(workdir)
        layout.create()
        with self.job._lock:
            self.job.workdir = workdir
            self.job.log_path = layout.log
        return layout

    def _fetch_code(self, layout: _Layout) -> Path:
        hps = _decoded_hyperparameters(self.job.request.get("HyperParameters") or {})
        program = hps.get("sagemaker_program")
        submit = hps.get("sagemaker_submit_directory")
        if not program or not submit:
            raise JobFailure(
                "AlgorithmError: the twin runs script-mode jobs only: HyperParameters sagemaker_program and "
                "sagemaker_submit_directory (s3://.../sourcedir.tar.gz) are required"
            )
        bucket, key = _split_s3_uri(str(submit))
        data = _s3_get(self.job.account, bucket, key)
        if data is None:
            raise JobFailure(
                f"ClientError: Data download failed: the source directory {submit} does not exist "
                "(HyperParameters.sagemaker_submit_directory)"
            )
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            archive.extractall(layout.code, filter="data")
        return layout.code

    def _fill_channels(self, layout: _Layout) -> dict[str, Path]:
        channels: dict[str, Path] = {}
        for channel in self.job.request.get("InputDataConfig") or []:
            name = channel["ChannelName"]
            target = layout.channel(name)
            source = channel.get("DataSource", {})
            if "FileSystemDataSource" in source:
                _mount_lustre(self.job.account, self.job.region, source["FileSystemDataSource"], target)
            elif "S3DataSource" in source:
                _download_s3_channel(self.job, source["S3DataSource"], target)
            else:
                raise JobFailure(
                    f"ClientError: channel {name!r}: the twin supports FileSystemDataSource and S3DataSource "
                    f"channels only (got {sorted(source)})"
                )
            channels[name] = target
        return channels

    def _checkpoint_s3(self) -> str | None:
        config = self.job.request.get("CheckpointConfig") or {}
        uri = config.get("S3Uri")
        return str(uri) if uri else None

    def _restore_checkpoints(self, layout: _Layout) -> None:
        uri = self._checkpoint_s3()
        if uri is None:
            return
        bucket, prefix = _split_s3_uri(uri)
        for key, data in _s3_list(self.job.account, bucket, _as_dir_prefix(prefix)):
            _write_below(layout.checkpoints, key[len(_as_dir_prefix(prefix)) :], data)

    def _train(
        self, layout: _Layout, code_dir: Path, channels: dict[str, Path]
    ) -> tuple[int, list[str], list[str]]:
        job = self.job
        hps = _decoded_hyperparameters(job.request.get("HyperParameters") or {})
        env = _training_env(job, layout, channels, hps)
        command = self._command(job, code_dir, hps)
        _write_configs(job, layout, hps)
        launched = command
        if job.fault == "training-error":
            launched = [
                sys.executable,
                "-c",
                "import sys; sys.stderr.write('Traceback (most recent call last):\\n'); "
                "sys.stderr.write('RuntimeError: injected fault training-error "
                "(lustrain rehearse --inject start_training:training-error)\\n'); sys.exit(1)",
            ]
        max_runtime = _max_runtime_s(job)
        if job.fault == "stopped":
            max_runtime = min(max_runtime, self.settings.stopped_fault_runtime_s)
        started = job.training_start_time or now()
        deadline = time.monotonic() + max(0.0, max_runtime - (now() - started).total_seconds())

        stderr_tail: deque[str] = deque(maxlen=20)
        with layout.log.open("a", encoding="utf-8") as log_file:
            process = subprocess.Popen(
                launched,
                cwd=code_dir,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            with job._lock:
                job._process = process
            write_lock = threading.Lock()
            readers = [
                threading.Thread(target=self._pump, args=(stream, log_file, write_lock, tail), daemon=True)
                for stream, tail in ((process.stdout, None), (process.stderr, stderr_tail))
            ]
            for reader in readers:
                reader.start()
            rc = self._supervise(process, deadline)
            # The instance goes away with its trainer: a worker the launcher left behind would also hold the
            # pipes open (what it printed stays readable).
            _kill(process)
            for reader in readers:
                reader.join()
        with job._lock:
            job._process = None
        return rc, list(stderr_tail), command

    def _command(self, job: SimulatedJob, code_dir: Path, hps: dict[str, Any]) -> list[str]:
        program = str(hps["sagemaker_program"])
        if not (code_dir / program).is_file():
            raise JobFailure(
                f'AlgorithmError: ExecuteUserScriptError:\nExitCode 2\nErrorMessage "No such file: {program} '
                f'is not in the source directory {hps["sagemaker_submit_directory"]}"\nCommand "{program}"'
            )
        args = _hyperparameter_args(hps)
        if str(hps.get("sagemaker_torch_distributed_enabled", "false")).lower() == "true":
            processes = min(job.instance_count, self.settings.max_processes)
            return [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nnodes",
                "1",
                "--nproc_per_node",
                str(processes),
                program,
                *args,
            ]
        if program.endswith(".sh"):
            return ["/bin/sh", program, *args]
        return [sys.executable, program, *args]

    def _pump(
        self,
        stream: io.BufferedReader | None,
        log_file: io.TextIOWrapper,
        write_lock: threading.Lock,
        tail: deque[str] | None,
    ) -> None:
        if stream is None:
            return
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            with write_lock:
                log_file.write(line + "\n")
                log_file.flush()
            if tail is not None and line.strip():
                tail.append(line)
            self.job.record_metrics(line)
            self.sim.publish_line(self.job, line)
        stream.close()

    def _supervise(self, process: subprocess.Popen[bytes], deadline: float) -> int:
        """Wait for the trainer; on StopTrainingJob or MaxRuntime, SIGTERM, then SIGKILL after the grace."""
        job = self.job
        terminated_at: float | None = None
        while True:
            try:
                return process.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
            if terminated_at is None:
                if time.monotonic() >= deadline:
                    with job._lock:
                        if job.status == "InProgress":
                            job.stop_reason = "MaxRuntimeExceeded"
                            job._move("Stopping", "Stopping")
                if job.stop_reason:
                    self._publish_stopping()
                    with contextlib.suppress(ProcessLookupError):
                        process.send_signal(signal.SIGTERM)
                    terminated_at = time.monotonic()
            elif time.monotonic() - terminated_at >= self.settings.stop_grace_s:
                _kill(process)

    # --- results ----------------------------------------------------------------------------------------------

    def _output_prefix(self) -> tuple[str, str]:
        output = (self.job.request.get("OutputDataConfig") or {}).get("S3OutputPath", "")
        bucket, prefix = _split_s3_uri(str(output))
        return bucket, f"{_as_dir_prefix(prefix)}{self.job.name}/output/"

    def _upload(self, layout: _Layout, *, with_model: bool) -> None:
        bucket, prefix = self._output_prefix()
        try:
            if with_model:
                key = f"{prefix}model.tar.gz"
                _s3_put(self.job.account, bucket, key, _tar_gz(layout.model))
                with self.job._lock:
                    self.job.model_artifacts = f"s3://{bucket}/{key}"
            _s3_put(self.job.account, bucket, f"{prefix}output.tar.gz", _tar_gz(layout.output_data))
            self._save_checkpoints(layout)
        except _MissingBucket as missing:
            raise JobFailure(
                f"ClientError: Artifact upload failed: bucket {missing.bucket} does not exist "
                "(OutputDataConfig.S3OutputPath / CheckpointConfig.S3Uri)"
            ) from None

    def _upload_after_failure(self, layout: _Layout) -> None:
        with contextlib.suppress(JobFailure):
            self._upload(layout, with_model=False)

    def _save_checkpoints(self, layout: _Layout) -> None:
        uri = self._checkpoint_s3()
        if uri is None:
            return
        bucket, prefix = _split_s3_uri(uri)
        for path in sorted(p for p in layout.checkpoints.rglob("*") if p.is_file()):
            key = _as_dir_prefix(prefix) + path.relative_to(layout.checkpoints).as_posix()
            _s3_put(self.job.account, bucket, key, path.read_bytes())


@dataclass(frozen=True)
class _Layout:
    """A job's /opt/ml, under its work directory."""

    root: Path
    code: Path = field(init=False)
    input: Path = field(init=False)
    model: Path = field(init=False)
    output: Path = field(init=False)
    output_data: Path = field(init=False)
    checkpoints: Path = field(init=False)
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        for name, sub in (
            ("code", "code"),
            ("input", "input"),
            ("model", "model"),
            ("output", "output"),
            ("output_data", "output/data"),
            ("checkpoints", "checkpoints"),
        ):
            object.__setattr__(self, name, self.root / sub)
        object.__setattr__(self, "log", self.root / f"{CURRENT_HOST}.log")

    @property
    def config(self) -> Path:
        return self.input / "config"

    def channel(self, name: str) -> Path:
        return self.input / "data" / name

    def create(self) -> None:
        for path in (
            self.code,
            self.config,
            self.input / "data",
            self.model,
            self.output_data,
            self.checkpoints,
        ):
            path.mkdir(parents=True, exist_ok=True)


# --- the SageMaker training contract ---------------------------------------------------------------------------


def _decoded_hyperparameters(raw: dict[str, str]) -> dict[str, Any]:
    """SageMaker script mode sends every value JSON-encoded ('"s3://b/k"', '3'); plain strings are kept."""
    decoded: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            decoded[key] = json.loads(value)
        except (TypeError, ValueError):
            decoded[key] = value
    return decoded


def _user_hyperparameters(hps: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in hps.items() if not k.startswith("sagemaker_")}


def _hyperparameter_args(hps: dict[str, Any]) -> list[str]:
    """The entry point's arguments, `--key value` in key order, as the SageMaker training toolkit builds them."""
    args: list[str] = []
    for key, value in sorted(_user_hyperparameters(hps).items()):
        shown = json.dumps(value) if isinstance(value, dict | list) else str(value)
        args += [f"--{key}", shown]
    return args


def _training_env(
    job: SimulatedJob, layout: _Layout, channels: dict[str, Path], hps: dict[str, Any]
) -> dict[str, str]:
    hosts = [f"algo-{i}" for i in range(1, job.instance_count + 1)]
    user_hps = _user_hyperparameters(hps)
    program = str(hps.get("sagemaker_program", ""))
    resource_config = {
        "current_host": CURRENT_HOST,
        "current_instance_type": job.instance_type,
        "hosts": hosts,
        "network_interface_name": "eth0",
    }
    input_data_config = {
        c["ChannelName"]: {k: v for k, v in c.items() if k not in ("ChannelName", "DataSource")}
        for c in job.request.get("InputDataConfig") or []
    }
    training_env = {
        "job_name": job.name,
        "current_host": CURRENT_HOST,
        "current_instance_type": job.instance_type,
        "hosts": hosts,
        "num_gpus": 0,
        "num_cpus": os.cpu_count() or 1,
        "hyperparameters": user_hps,
        "additional_framework_parameters": {k: v for k, v in hps.items() if k.startswith("sagemaker_")},
        "channel_input_dirs": {name: str(path) for name, path in channels.items()},
        "input_dir": str(layout.input),
        "input_config_dir": str(layout.config),
        "input_data_config": input_data_config,
        "model_dir": str(layout.model),
        "output_dir": str(layout.output),
        "output_data_dir": str(layout.output_data),
        "module_dir": str(hps.get("sagemaker_submit_directory", "")),
        "module_name": program.removesuffix(".py"),
        "user_entry_point": program,
        "resource_config": resource_config,
        "network_interface_name": "eth0",
        "log_level": 20,
    }
    from lustrain.twin.patches.lambda_invoke import environment_copy

    env = environment_copy()
    env.update({str(k): str(v) for k, v in (job.request.get("Environment") or {}).items()})
    env.update(
        {
            "SM_MODEL_DIR": str(layout.model),
            "SM_OUTPUT_DIR": str(layout.output),
            "SM_OUTPUT_DATA_DIR": str(layout.output_data),
            "SM_INPUT_DIR": str(layout.input),
            "SM_INPUT_CONFIG_DIR": str(layout.config),
            "SM_CHANNELS": json.dumps(sorted(channels)),
            "SM_HPS": json.dumps(user_hps),
            "SM_HOSTS": json.dumps(hosts),
            "SM_CURRENT_HOST": CURRENT_HOST,
            "SM_CURRENT_INSTANCE_TYPE": job.instance_type,
            "SM_NUM_GPUS": "0",
            "SM_NUM_CPUS": str(os.cpu_count() or 1),
            "SM_NETWORK_INTERFACE_NAME": "eth0",
            "SM_USER_ENTRY_POINT": program,
            "SM_MODULE_NAME": program.removesuffix(".py"),
            "SM_MODULE_DIR": str(hps.get("sagemaker_submit_directory", "")),
            "SM_USER_ARGS": json.dumps(_hyperparameter_args(hps)),
            "SM_RESOURCE_CONFIG": json.dumps(resource_config),
            "SM_INPUT_DATA_CONFIG": json.dumps(input_data_config),
            "SM_TRAINING_ENV": json.dumps(training_env),
            "SM_CHECKPOINT_DIR": str(layout.checkpoints),
            "TRAINING_JOB_NAME": job.name,
            "TRAINING_JOB_ARN": job.arn,
            # Lines must reach the log (and the CLI) as they are printed, and two workers share two cores.
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(layout.code), env.get("PYTHONPATH", "")])),
        }
    )
    for name, path in channels.items():
        env[f"SM_CHANNEL_{name.upper()}"] = str(path)
    for key, value in user_hps.items():
        env[f"SM_HP_{key.upper()}"] = json.dumps(value) if isinstance(value, dict | list) else str(value)
    return env


def _write_configs(job: SimulatedJob, layout: _Layout, hps: dict[str, Any]) -> None:
    """/opt/ml/input/config/*.json, which some trainers read instead of the SM_* variables."""
    hosts = [f"algo-{i}" for i in range(1, job.instance_count + 1)]
    files = {
        "hyperparameters.json": {k: json.dumps(v) for k, v in _user_hyperparameters(hps).items()},
        "resourceconfig.json": {"current_host": CURRENT_HOST, "hosts": hosts},
        "inputdataconfig.json": {
            c["ChannelName"]: {k: v for k, v in c.items() if k not in ("ChannelName", "DataSource")}
            for c in job.request.get("InputDataConfig") or []
        },
    }
    for name, content in files.items():
        (layout.config / name).write_text(json.dumps(content, indent=2), encoding="utf-8")


def _algorithm_error(layout: _Layout, rc: int, stderr_tail: list[str], command: list[str]) -> str:
    """FailureReason as the SageMaker training toolkit reports a failed script (or the script's failure file)."""
    failure_file = layout.output / "failure"
    if failure_file.is_file() and failure_file.read_text(encoding="utf-8").strip():
        return f"AlgorithmError: {failure_file.read_text(encoding='utf-8').strip()}"
    shown_cmd = " ".join(command)
    head = f'AlgorithmError: ExecuteUserScriptError:\nExitCode {rc}\nErrorMessage "'
    tail = f'"\nCommand "{shown_cmd}", exit code: {rc}'
    room = _FAILURE_REASON_MAX - len(head) - len(tail)
    message = "\n".join(stderr_tail)
    if len(message) > room:
        message = message[-max(room, 0) :]
    return f"{head}{message}{tail}"


# --- FSx for Lustre -------------------------------------------------------------------------------------------


def _mount_error(file_system_id: str, directory_path: str, cause: str, remedy: str) -> JobFailure:
    # The shape of SageMaker's own mount failures ("ClientError: Unable to mount file system: <id>, directory
    # path: <path>. <cause>. Please ensure <remedy>"), as AWS reports them for FSx and EFS channels.
    return JobFailure(
        f"ClientError: Unable to mount file system: {file_system_id}, directory path: {directory_path}. "
        f"{cause}. Please ensure {remedy}."
    )


def _mount_lustre(account: str, region: str, source: dict[str, Any], target: Path) -> None:
    fs_id = str(source.get("FileSystemId", ""))
    path = str(source.get("DirectoryPath", ""))
    if source.get("FileSystemType") != "FSxLustre":
        raise _mount_error(
            fs_id,
            path,
            f"File system type {source.get('FileSystemType')} is not simulated by the twin",
            "that the channel uses FileSystemType FSxLustre",
        )
    description = _file_system(account, region, fs_id)
    if description is None:
        raise _mount_error(
            fs_id,
            path,
            "File system does not exist",
            "that the file system exists in this account and region and has not been deleted",
        )
    lifecycle = description.get("Lifecycle", "AVAILABLE")
    if lifecycle != "AVAILABLE":
        raise _mount_error(
            fs_id,
            path,
            f"File system is {lifecycle}, not AVAILABLE",
            "that the file system is AVAILABLE before the training job starts",
        )
    mount_name = str((description.get("LustreConfiguration") or {}).get("MountName", ""))
    parts = PurePosixPath(path).parts
    if not mount_name or len(parts) < 2 or parts[0] != "/" or parts[1] != mount_name:
        raise _mount_error(
            fs_id,
            path,
            "No such file or directory",
            f"that the directory path starts with the file system's mount name (/{mount_name}), as in "
            f"/{mount_name}/<path in the file system>, and that the directory exists",
        )
    inside = PurePosixPath("/", *parts[2:])
    if not _fill_from_links(account, fs_id, inside, target):
        raise _mount_error(
            fs_id,
            path,
            "No such file or directory",
            f"that {inside} exists in the file system: it must be, or lie under, a path linked to an S3 "
            "data repository that holds objects",
        )


def _file_system(account: str, region: str, fs_id: str) -> dict[str, Any] | None:
    from moto.fsx.models import fsx_backends

    backend = fsx_backends[account][region]
    fs = backend.file_systems.get(fs_id)
    return None if fs is None else dict(fs.to_dict())


def _fill_from_links(account: str, fs_id: str, inside: PurePosixPath, target: Path) -> bool:
    """Copy what the file system shows at `inside` from its linked S3 prefixes; False if nothing is there."""
    from lustrain.twin.patches.fsx import linked_paths

    found = inside == PurePosixPath("/")
    for fs_path, s3_uri in linked_paths(fs_id).items():
        link = PurePosixPath("/", fs_path)
        bucket, prefix = _split_s3_uri(s3_uri)
        prefix = _as_dir_prefix(prefix)
        if inside == link or link in inside.parents:
            below = inside.relative_to(link).as_posix()
            source_prefix = prefix if below == "." else _as_dir_prefix(prefix + below)
            destination = target
        elif inside in link.parents:
            source_prefix = prefix
            destination = target / link.relative_to(inside)
            destination.mkdir(parents=True, exist_ok=True)
            found = True
        else:
            continue
        for key, data in _s3_list(account, bucket, source_prefix):
            _write_below(destination, key[len(source_prefix) :], data)
            found = True
    return found


def _download_s3_channel(job: SimulatedJob, source: dict[str, Any], target: Path) -> None:
    uri = str(source.get("S3Uri", ""))
    data_type = source.get("S3DataType", "S3Prefix")
    if data_type != "S3Prefix":
        raise JobFailure(f"ClientError: S3DataType {data_type} is not simulated by the twin (use S3Prefix)")
    bucket, prefix = _split_s3_uri(uri)
    objects = []
    with contextlib.suppress(_MissingBucket):
        objects = _s3_list(job.account, bucket, prefix)
    if not objects:
        role = job.request.get("RoleArn", "")
        raise JobFailure(
            f'ClientError: No S3 objects found under S3 URL "{uri}" given in input data source. Please ensure '
            f"that the bucket exists in the selected region ({job.region}), that objects exist under that S3 "
            f'prefix, and that the role "{role}" has "s3:ListBucket" permissions on bucket "{bucket}".'
        )
    base = prefix if prefix.endswith("/") or not prefix else prefix.rsplit("/", 1)[0] + "/"
    for key, data in objects:
        _write_below(target, key[len(base) :] if key.startswith(base) else PurePosixPath(key).name, data)


# --- S3 through moto's backend ----------------------------------------------------------------------------------


class _MissingBucket(Exception):
    def __init__(self, bucket: str) -> None:
        super().__init__(bucket)
        self.bucket = bucket


def _split_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise JobFailure(f"ClientError: {uri!r} is not an s3:// URI")
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


def _as_dir_prefix(prefix: str) -> str:
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def _s3_backend(account: str) -> Any:
    from moto.s3.models import s3_backends

    return s3_backends[account]["aws"]


def _bucket(account: str, name: str) -> Any:
    from moto.s3.exceptions import MissingBucket

    try:
        return _s3_backend(account).get_bucket(name)
    except MissingBucket:
        raise _MissingBucket(name) from None


def _s3_get(account: str, bucket: str, key: str) -> bytes | None:
    try:
        _bucket(account, bucket)
    except _MissingBucket:
        return None
    found = _s3_backend(account).get_object(bucket, key)
    return None if found is None else bytes(found.value)


def _s3_list(account: str, bucket: str, prefix: str) -> list[tuple[str, bytes]]:
    backend = _s3_backend(account)
    keys, _folders, _truncated, _marker = backend.list_objects(
        _bucket(account, bucket), prefix, None, None, None
    )
    return [(k.name, bytes(k.value)) for k in keys if not k.name.endswith("/")]


def _s3_put(account: str, bucket: str, key: str, data: bytes) -> None:
    _bucket(account, bucket)
    _s3_backend(account).put_object(bucket, key, data)


# --- files ------------------------------------------------------------------------------------------------------


def _write_below(root: Path, relative: str, data: bytes) -> None:
    """Write `relative` under `root`, refusing keys that would climb out of it ('..')."""
    parts = [p for p in PurePosixPath(relative).parts if p not in ("/", "")]
    if not parts or ".." in parts:
        return
    path = root.joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _tar_gz(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(directory.rglob("*")):
            archive.add(path, arcname=path.relative_to(directory).as_posix(), recursive=False)
    return buffer.getvalue()


def _kill(process: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL the trainer's whole process group (it was started in a session of its own)."""
    if process is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


# --- the module's simulator -------------------------------------------------------------------------------------

_simulator = Simulator()


def settings() -> Settings:
    return _simulator.settings


def configure(**changes: Any) -> Settings:
    """Change how jobs launched from now on run (start_delay_s, stop_grace_s, max_processes, work_root, ...)."""
    _simulator.settings = replace(_simulator.settings, **changes)
    return _simulator.settings


def launch(job: SimulatedJob) -> None:
    _simulator.launch(job)


def jobs() -> list[JobView]:
    return _simulator.jobs()


def wait_all(timeout: float | None = None) -> list[JobView]:
    return _simulator.wait_all(timeout)


def subscribe(listener: LogListener) -> Callable[[], None]:
    return _simulator.subscribe(listener)


def reset() -> None:
    _simulator.reset()


def _max_runtime_s(job: SimulatedJob) -> float:
    """The job's StoppingCondition.MaxRuntimeInSeconds (SageMaker's default: a day)."""
    return float((job.request.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds", 86400))
