"""A SageMaker Processing job's life on this machine: N instances as N local processes, under SageMaker's contract.

moto 5.2.5 stores a processing job as Completed the moment it is created, runs nothing and emits no event. The
twin's patch (patches/processing.py) hands each new job to this module, which lives it as SageMaker does
("How Amazon SageMaker Processing Runs Your Processing Container Image", SageMaker Developer Guide):

    InProgress -> (inputs downloaded to each instance, the container started on every instance)
    -> Completed (every container exited 0; outputs uploaded) | Failed (one exited non-zero) | Stopped

with an EventBridge "SageMaker Processing Job State Change" event (source aws.sagemaker) at each status change,
whose detail is what DescribeProcessingJob answers (ProcessingJobName, ProcessingJobStatus, ProcessingJobArn,
FailureReason, ...), as for training jobs.

How the cloud maps onto one machine:
- Instances: each of ProcessingResources.ClusterConfig.InstanceCount instances (algo-1..algo-N) is one local
  process running AppSpecification.ContainerEntrypoint + ContainerArguments, all at once. Each has its own
  /opt/ml under the job's work directory (<workdir>/algo-K/), with config/resourceconfig.json
  ({"current_host": "algo-K", "hosts": [...]}, as SageMaker writes it for processing containers). An argument
  naming /opt/ml/... names its place under the instance's own directory; LUSTRAIN_OPT_ML names that directory
  (a twin-only variable: a container finds /opt/ml where it is, a local process cannot).
- ProcessingInputs (S3Input, File mode) are downloaded, as the job's execution role, to each instance's LocalPath
  (FullyReplicated: all of it to every instance; ShardedByS3Key: the sorted objects dealt out by instance).
  ProcessingOutputs (S3Output, EndOfJob) are uploaded from each instance's LocalPath after its container exits 0.
- The container's own AWS calls: the processes get the execution role's credentials and AWS_ENDPOINT_URL naming
  an S3 endpoint of the twin on this machine (moto's server, sharing this process's backends), since the
  worker reads and writes S3 itself (boto3). The twin authorizes the downloads and uploads SageMaker makes as
  the role, but not the container's own calls through that endpoint: a known difference from AWS.
- Network: with NetworkConfig.VpcConfig, the job's subnet must reach S3 (a gateway endpoint or a route), else
  the job fails as a training job does (network.py).
- Logs: each instance's output goes to /aws/sagemaker/ProcessingJobs, stream "<job name>/algo-K-<epoch seconds>",
  written as the job's role.
- Stop: SIGTERM to every instance's process, then `stop_grace_s` before SIGKILL. MaxRuntimeInSeconds ends the
  job the same way, as Failed with the reason "Max runtime exceeded" (the twin's wording: what SageMaker's
  FailureReason says then is not checked against AWS).
- Not enforced here (the README's known differences): the processing instance quotas ("ml.<type> for processing
  job usage"), the image pull (the image's python3 is this machine's), and the rule that a LocalPath lies under
  /opt/ml/processing/.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from botocore.exceptions import ClientError

from lustrain.twin.simulator import events, network
from lustrain.twin.simulator.job import EVENT_SOURCE, FAILURE_REASON_MAX, JobFailure, epoch_ms, now
from lustrain.twin.simulator.launcher import niced
from lustrain.twin.simulator.lifecycle import kill
from lustrain.twin.simulator.storage import JobStorage, denied_text, split_s3_uri, write_below

log = logging.getLogger("lustrain.twin.sagemaker")

EVENT_DETAIL_TYPE = "SageMaker Processing Job State Change"
LOG_GROUP = "/aws/sagemaker/ProcessingJobs"
TERMINAL = frozenset({"Completed", "Failed", "Stopped"})
#: the twin's name for where an instance's /opt/ml is (a container has it at /opt/ml itself)
OPT_ML_VARIABLE = "LUSTRAIN_OPT_ML"
#: SageMaker's FailureReason when MaxRuntimeInSeconds ends a processing job
MAX_RUNTIME_REASON = "Max runtime exceeded"

#: authorize(service, operation, params) as the job's role; raises ClientError when refused
Authorize = Callable[[str, str, dict[str, Any]], None]

#: every processing job started in this process, for reset()
_LIVE: list[ProcessingJob] = []
_LIVE_LOCK = threading.Lock()


def reset(timeout: float = 30.0) -> None:
    """Stop every processing job at once (no grace: its processes are killed) and forget them, as the training
    simulator's reset does: a fresh twin."""
    with _LIVE_LOCK:
        jobs, _LIVE[:] = list(_LIVE), []
    for job in jobs:
        job.request_stop()
        job._stop.set()
        for process in list(job._processes):
            kill(process)
    deadline = time.monotonic() + timeout
    for job in jobs:
        job._done.wait(max(0.0, deadline - time.monotonic()))


class ProcessingJob:
    """A processing job's state, moved by its thread and read by the patched API."""

    def __init__(self, *, request: dict[str, Any], arn: str, account: str, region: str) -> None:
        self.request = json.loads(json.dumps(request, default=str))
        self.name: str = request["ProcessingJobName"]
        self.arn = arn
        self.account = account
        self.region = region
        self.creation_time = now()
        self.last_modified_time = self.creation_time
        self.start_time: datetime | None = None
        self.end_time: datetime | None = None
        self.status = "InProgress"
        self.failure_reason: str | None = None
        self.exit_message: str | None = None
        self.credentials: dict[str, str] = {}
        self.created_by: threading.Thread | None = None
        self.workdir: Path | None = None
        self.events: list[str] = []
        self.log_streams: list[str] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._processes: list[subprocess.Popen[bytes]] = []

    @property
    def instance_count(self) -> int:
        return int(self.request["ProcessingResources"]["ClusterConfig"].get("InstanceCount", 1))

    @property
    def instance_type(self) -> str:
        return str(self.request["ProcessingResources"]["ClusterConfig"]["InstanceType"])

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def describe(self) -> dict[str, Any]:
        """DescribeProcessingJob's answer: the request as stored, and the job's progress."""
        with self._lock:
            answer: dict[str, Any] = {
                key: value for key, value in self.request.items() if key not in ("Tags",)
            }
            answer.update(
                ProcessingJobArn=self.arn,
                ProcessingJobStatus=self.status,
                CreationTime=self.creation_time,
                LastModifiedTime=self.last_modified_time,
            )
            if self.start_time is not None:
                answer["ProcessingStartTime"] = self.start_time
            if self.end_time is not None:
                answer["ProcessingEndTime"] = self.end_time
            if self.failure_reason is not None:
                answer["FailureReason"] = self.failure_reason
            if self.exit_message is not None:
                answer["ExitMessage"] = self.exit_message
            return answer

    def event_detail(self) -> dict[str, Any]:
        detail = self.describe()
        for key in ("CreationTime", "LastModifiedTime", "ProcessingStartTime", "ProcessingEndTime"):
            if isinstance(detail.get(key), datetime):
                detail[key] = int(epoch_ms(detail[key]))
        return detail

    def move(self, status: str, failure_reason: str | None = None) -> None:
        with self._lock:
            self.status = status
            self.last_modified_time = now()
            if status in TERMINAL:
                self.end_time = self.last_modified_time
            if failure_reason is not None:
                self.failure_reason = failure_reason[:FAILURE_REASON_MAX]

    def request_stop(self) -> bool:
        """StopProcessingJob: InProgress -> Stopping; the thread stops the containers. False when already over."""
        with self._lock:
            if self.status != "InProgress":
                return False
            self.move("Stopping")
        self._stop.set()
        return True


class _LogStream(events.LogStream):
    """An instance's stream in the processing jobs' log group."""

    log_group = LOG_GROUP
    kind = "processing job"

    def _opened(self) -> None:
        """DescribeProcessingJob names no log stream."""


class ProcessingRun:
    """One processing job's thread."""

    def __init__(
        self,
        job: ProcessingJob,
        *,
        authorize: Authorize,
        emit: events.Emit,
        environment: Callable[[], dict[str, str]],
        s3_endpoint: Callable[[], str],
        work_root: Path | None,
        start_delay_s: float,
        stop_grace_s: float,
        niceness: int,
    ) -> None:
        self.job = job
        self.authorize = authorize
        self.emit = emit
        self.environment = environment
        self.s3_endpoint = s3_endpoint
        self.work_root = work_root
        self.start_delay_s = start_delay_s
        self.stop_grace_s = stop_grace_s
        self.niceness = niceness
        self.storage = JobStorage(job.account, authorize)
        self.hosts = [f"algo-{k}" for k in range(1, job.instance_count + 1)]

    def start(self) -> threading.Thread:
        with _LIVE_LOCK:
            _LIVE.append(self.job)
        thread = threading.Thread(target=self.run, name=f"processing-{self.job.name}", daemon=True)
        thread.start()
        return thread

    # --- the job --------------------------------------------------------------------------------------------

    def run(self) -> None:
        job = self.job
        try:
            creator = job.created_by
            if creator is not None and creator is not threading.current_thread():
                creator.join(900.0)
            if job._stop.wait(self.start_delay_s):
                self._finish("Stopped")
                return
            with job._lock:
                job.start_time = now()
            self._publish()
            path = network.NetworkView.of(job.account, job.region).s3_path(
                (job.request.get("NetworkConfig") or {}).get("VpcConfig")
            )
            if path.problem is not None:
                raise JobFailure(network.unreachable_s3("Downloading input data"))
            roots = self._lay_out()
            self._download_inputs(roots)
            codes = self._run_containers(roots)
            if job._stop.is_set():
                self._finish("Stopped")
                return
            if job.status == "Failed":
                return
            failed = [(host, rc, tail) for host, (rc, tail) in codes.items() if rc != 0]
            if failed:
                host, rc, tail = failed[0]
                raise JobFailure(
                    f"AlgorithmError: See job logs for more information\n{host} exited with code {rc}: "
                    + "\n".join(tail)
                )
            self._upload_outputs(roots)
            self._finish("Completed")
        except JobFailure as failure:
            self._finish("Failed", failure.reason)
        except Exception as error:  # the twin's own fault: say so, as SageMaker's InternalServerError would
            log.exception("simulated processing job %s broke", job.name)
            self._finish("Failed", f"InternalServerError: the twin's simulator failed: {error!r}")
        finally:
            job._done.set()

    def _publish(self) -> None:
        with self.job._lock:
            detail = self.job.event_detail()
            self.job.events.append(self.job.status)
        try:
            self.emit(
                EVENT_SOURCE,
                EVENT_DETAIL_TYPE,
                detail,
                self.job.region,
                self.job.account,
                [self.job.arn],
            )
        except Exception:
            log.exception("could not emit %s of %s", self.job.status, self.job.name)

    def _finish(self, status: str, failure_reason: str | None = None) -> None:
        with self.job._lock:
            if self.job.status in TERMINAL:
                return
        self.job.move(status, failure_reason)
        self._publish()

    # --- the instances --------------------------------------------------------------------------------------

    def _lay_out(self) -> dict[str, Path]:
        root = self.work_root or Path(tempfile.gettempdir()) / "lustrain-twin-processing"
        workdir = root / f"{self.job.name}-{uuid.uuid4().hex[:8]}"
        with self.job._lock:
            self.job.workdir = workdir
        roots = {}
        for host in self.hosts:
            opt_ml = workdir / host
            (opt_ml / "config").mkdir(parents=True)
            (opt_ml / "config" / "resourceconfig.json").write_text(
                json.dumps({"current_host": host, "hosts": self.hosts})
            )
            roots[host] = opt_ml
            # SageMaker makes each output's LocalPath before the container starts
            for given in (self.job.request.get("ProcessingOutputConfig") or {}).get("Outputs") or []:
                if given.get("S3Output"):
                    self._local(opt_ml, str(given["S3Output"]["LocalPath"])).mkdir(
                        parents=True, exist_ok=True
                    )
        return roots

    @staticmethod
    def _local(opt_ml: Path, container_path: str) -> Path:
        """Where a container path under /opt/ml/ is on this instance's directory."""
        relative = PurePosixPath(container_path).relative_to("/opt/ml")
        return opt_ml.joinpath(*relative.parts)

    def _download_inputs(self, roots: dict[str, Path]) -> None:
        for given in self.job.request.get("ProcessingInputs") or []:
            source = given.get("S3Input")
            if not source:
                continue
            bucket, prefix = split_s3_uri(str(source["S3Uri"]))
            try:
                found = sorted(self.storage.list(bucket, prefix))
            except ClientError as refused:
                raise JobFailure(
                    f"ClientError: Failed to download data. {denied_text(refused)} ({source['S3Uri']})"
                ) from None
            if not found:
                raise JobFailure(
                    f'ClientError: No S3 objects found under S3 URL "{source["S3Uri"]}" given in input '
                    f"data source. Please ensure that the bucket exists in the selected region "
                    f"({self.job.region}), that objects exist under that S3 prefix, and that the "
                    f'role "{self.job.request["RoleArn"]}" has "s3:ListBucket" permissions on '
                    f'bucket "{bucket}".'
                )
            sharded = source.get("S3DataDistributionType") == "ShardedByS3Key"
            for index, host in enumerate(self.hosts):
                target = self._local(roots[host], str(source["LocalPath"]))
                target.mkdir(parents=True, exist_ok=True)
                mine = found[index :: len(self.hosts)] if sharded else found
                for key, data in mine:
                    relative = key[len(prefix) :].lstrip("/") if key != prefix else PurePosixPath(key).name
                    write_below(target, relative, data)

    def _run_containers(self, roots: dict[str, Path]) -> dict[str, tuple[int, list[str]]]:
        spec = self.job.request["AppSpecification"]
        base = self.environment()
        base.update(self.job.request.get("Environment") or {})
        base.update(
            AWS_ACCESS_KEY_ID=self.job.credentials.get("AccessKeyId", "twin"),
            AWS_SECRET_ACCESS_KEY=self.job.credentials.get("SecretAccessKey", "twin"),
            AWS_SESSION_TOKEN=self.job.credentials.get("SessionToken", ""),
            AWS_DEFAULT_REGION=self.job.region,
            AWS_REGION=self.job.region,
            AWS_ENDPOINT_URL=self.s3_endpoint(),
            PYTHONUNBUFFERED="1",
            # the image's python3 is this machine's (the one the twin runs on, with numpy and tokenizers)
            PATH=os.pathsep.join([os.path.dirname(sys.executable), base.get("PATH", os.defpath)]),
        )
        for variable in ("AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE"):
            base.pop(variable, None)
        runs: dict[str, tuple[subprocess.Popen[bytes], _LogStream, deque[str], threading.Thread]] = {}
        for host in self.hosts:
            opt_ml = roots[host]
            command = [
                str(self._local(opt_ml, item)) if item.startswith("/opt/ml/") else item
                for item in [
                    *(spec.get("ContainerEntrypoint") or []),
                    *(spec.get("ContainerArguments") or []),
                ]
            ]
            if command and command[0] in ("python", "python3"):
                command[0] = sys.executable  # the image's python is this machine's
            env = {**base, OPT_ML_VARIABLE: str(opt_ml)}
            process = subprocess.Popen(
                niced(command, self.niceness),
                cwd=opt_ml,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            stream = _LogStream(self.job, self.authorize, host)  # type: ignore[arg-type]
            tail: deque[str] = deque(maxlen=10)
            reader = threading.Thread(target=self._pump, args=(process, stream, tail), daemon=True)
            reader.start()
            runs[host] = (process, stream, tail, reader)
            with self.job._lock:
                self.job._processes.append(process)
                self.job.log_streams.append(stream.name)
        max_runtime = float(
            (self.job.request.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds", 86400)
        )
        deadline = time.monotonic() + max_runtime
        while any(process.poll() is None for process, *_ in runs.values()):
            if self.job._stop.wait(0.05):
                self._stop_all(runs)
                break
            if time.monotonic() > deadline:
                self._stop_all(runs)
                self._finish("Failed", MAX_RUNTIME_REASON)
                break
        codes = {}
        for host, (process, stream, tail, reader) in runs.items():
            reader.join()
            stream.flush()
            codes[host] = (process.wait(), list(tail))
        return codes

    def _stop_all(self, runs: dict[str, Any]) -> None:
        for process, *_ in runs.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        for process, *_ in runs.values():
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill(process)

    @staticmethod
    def _pump(process: subprocess.Popen[bytes], stream: _LogStream, tail: deque[str]) -> None:
        assert process.stdout is not None
        for raw in iter(process.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            stream.write(line)
            if line.strip():
                tail.append(line)
        process.stdout.close()

    def _upload_outputs(self, roots: dict[str, Path]) -> None:
        outputs = (self.job.request.get("ProcessingOutputConfig") or {}).get("Outputs") or []
        for given in outputs:
            target = given.get("S3Output")
            if not target:
                continue
            bucket, prefix = split_s3_uri(str(target["S3Uri"]))
            for host in self.hosts:
                local = self._local(roots[host], str(target["LocalPath"]))
                for path in sorted(p for p in local.rglob("*") if p.is_file()):
                    key = "/".join(
                        part for part in (prefix.rstrip("/"), path.relative_to(local).as_posix()) if part
                    )
                    try:
                        self.storage.put(bucket, key, path.read_bytes())
                    except ClientError as refused:
                        raise JobFailure(
                            f"ClientError: Failed to upload output {given['OutputName']}: {denied_text(refused)}"
                        ) from None
