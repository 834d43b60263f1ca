"""A training job's life, in a thread of its own, as SageMaker lives it.

    InProgress/Starting -> Downloading (code, the Lustre "mount", S3 channels, checkpoints) -> Training (the
    entry point) -> Uploading (model.tar.gz, output.tar.gz, or their files for CompressionType NONE; checkpoints)
    -> Completed | Failed | Stopped

Each phase moves the job on or raises JobFailure with the FailureReason SageMaker would give. What the job needs
from the rest of the twin is handed in (`Collaborators`): the EventBridge to emit on, FSx's descriptions and
links, this machine's environment, and the IAM that authorizes the job's own calls as its execution role.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import logging
import os
import re
import shutil
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from botocore.exceptions import ClientError

from lustrain.twin import faults, training_plans
from lustrain.twin.simulator import container, endpoint, events, launcher, mounts, network
from lustrain.twin.simulator.container import TENSORBOARD_DEFAULT_PATH, Layout, in_layout
from lustrain.twin.simulator.job import JobFailure, JobView, SimulatedJob, max_runtime_s, now
from lustrain.twin.simulator.launcher import JobProcess
from lustrain.twin.simulator.objects import ObjectEndpoint
from lustrain.twin.simulator.secrets import SecretsEndpoints
from lustrain.twin.simulator.storage import (
    InvalidUri,
    JobStorage,
    MissingBucket,
    as_dir_prefix,
    denied_text,
    split_s3_uri,
    tar_gz,
    write_below,
)

log = logging.getLogger("lustrain.twin.sagemaker")

CAPACITY_ERROR = (
    "CapacityError: Unable to provision requested ML compute capacity. "
    "Please retry using a different ML instance type."
)
#: SageMaker's FailureReason when an instance of the job fails under it (the `hardware-failure` fault)
INTERNAL_ERROR = "InternalServerError: We encountered an internal error. Please try again."
#: A committed checkpoint of the trainer (its manifest: trainer/lustrain_trainer/checkpoint.py), and how often the
#: fault looks for one
CHECKPOINT_FILE = re.compile(r"^step-(\d+)\.json$")
HARDWARE_POLL_S = 0.005
#: An ECR image URI: REGISTRY.dkr.ecr.REGION.amazonaws.com[.cn]/REPOSITORY[:TAG|@DIGEST]
ECR_IMAGE = re.compile(r"^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/([^:@]+)")
#: The step of the state machine whose faults (lustrain.twin.faults) this simulator fires.
FAULT_STEP = "start_training"
#: The longest a job waits for the Lambda invocation that created it to return (Lambda's maximum timeout).
CREATOR_WAIT_S = 900.0
#: How often a job waiting for its creator looks whether it was stopped meanwhile.
CREATOR_POLL_S = 0.05
#: How many times the `repeat-events` fault delivers each event.
REPEATED_EVENT_COPIES = 3
#: SageMaker's FailureReason for a job on a training plan Pending for its capacity for 2 days ("Training plans
#: utilization for SageMaker training jobs" names the error; the words after it are the twin's)
INSUFFICIENT_CAPACITY = (
    "InsufficientCapacityError: The training job was pending for the reserved capacity of its training plan for "
    "2 days and was terminated."
)
#: How often a job Pending for its training plan's capacity looks at the plan's clock (a `shift` moves it).
PENDING_POLL_S = 0.05

#: authorize(job, service, operation, params, gates): raise the service's ClientError when the job's execution
#: role may not make the call; `gates` are the policies on the path (the VPC endpoint's).
JobAuthorize = Callable[[SimulatedJob, str, str, dict[str, Any], list[dict[str, Any]]], None]


@dataclass(frozen=True)
class Collaborators:
    """What the simulator uses of the rest of the twin (patches/sagemaker.py wires them)."""

    emit: events.Emit
    describe_file_system: mounts.DescribeFileSystem
    linked_paths: mounts.LinkedPaths
    #: this machine's environment, the base of the trainer's
    environment: Callable[[], dict[str, str]]
    authorize: JobAuthorize
    #: what jobs wrote on the file systems (None: nothing stays after a job)
    lustre_files: mounts.LustreFiles | None = None


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
    #: Where job work directories go. By default the system temp directory, where each job's directory is removed
    #: when the job ends (or the twin stops): what a job leaves is in S3, on its file system and in CloudWatch
    #: (its log), as on SageMaker. A directory given here (LUSTRAIN_TWIN_WORK_ROOT) keeps them, to be looked at.
    work_root: Path | None = None
    #: What the `stopped` fault leaves of MaxRuntimeInSeconds: the job is stopped this long after training starts.
    stopped_fault_runtime_s: float = 1.0
    #: Seconds a cold job spends launching its instances (Starting) before it downloads; a job that takes a warm
    #: pool over skips them, which is what a warm pool buys
    provision_s: float = 0.0
    #: Twin seconds per second of KeepAlivePeriodInSeconds: how long a warm pool waits for the next job here
    keep_alive_scale: float = 1.0
    #: The training processes' CPU priority (nice), below the control plane's. On AWS the trainer has instances
    #: of its own and never delays a Lambda, a poll or a timer; on one machine a trainer at full speed would take
    #: their CPU, so its control plane would answer late. A trainer that trains until something stops it (a budget,
    #: a cancel) takes only the CPU nothing else here wants. 0 runs it at the twin's own priority.
    trainer_nice: int = 10
    #: Whether a job's Python entry point (or torchrun) is forked from the twin's fork server, which has imported
    #: torch once (launcher.py), instead of starting an interpreter of its own. Off: LUSTRAIN_TWIN_FORK_SERVER=0.
    fork_server: bool = True

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
            provision_s=float(env.get("LUSTRAIN_TWIN_SM_PROVISION_S", defaults.provision_s)),
            keep_alive_scale=float(env.get("LUSTRAIN_TWIN_SM_KEEP_ALIVE_SCALE", defaults.keep_alive_scale)),
            trainer_nice=int(env.get("LUSTRAIN_TWIN_SM_TRAINER_NICE", defaults.trainer_nice)),
            fork_server=env.get("LUSTRAIN_TWIN_FORK_SERVER", "1") != "0",
        )


LogListener = Callable[[str, str], None]


class Simulator:
    """Every simulated job of this process, and the threads that run them."""

    def __init__(self, settings: Settings | None = None, collaborators: Collaborators | None = None) -> None:
        self.settings = settings or Settings.from_env()
        self.collaborators = collaborators
        self._jobs: dict[str, SimulatedJob] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._listeners: list[LogListener] = []
        self._lock = threading.Lock()
        # a twin that stops (`lustrain local up` ended, a test process exits) removes its jobs' temp directories
        atexit.register(self._remove_temp_workdirs)

    def launch(self, job: SimulatedJob) -> None:
        """Take a job just created; its life starts in a thread after `start_delay_s`, never in the caller's."""
        if self.collaborators is None:
            raise RuntimeError(
                "the SageMaker simulator is not connected to the twin: call lustrain.twin.patches.install()"
            )
        for fault in faults.TRAINING_JOB_FAULTS:
            if faults.consume(FAULT_STEP, fault):
                job.fault = fault
                break
        if faults.consume(FAULT_STEP, "repeat-events"):
            job.event_copies = REPEATED_EVENT_COPIES
        if job.fault == "silent":
            job.event_copies = 0
        thread = threading.Thread(
            target=_JobRun(job, self, self.collaborators).run, name=f"sagemaker-job-{job.name}", daemon=True
        )
        with self._lock:
            self._jobs[job.arn] = job
            self._threads[job.arn] = thread
        thread.start()

    def _remove_temp_workdirs(self) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            kill(job._process)
            remove_temp_workdir(job)

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

    def event_detail(self, name: str) -> dict[str, Any]:
        """The detail of the event the job named `name` sends of its state now (KeyError: no such job)."""
        with self._lock:
            job = next((j for j in self._jobs.values() if j.name == name), None)
        if job is None:
            raise KeyError(name)
        with job._lock:
            return job.event_detail()

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
            # a job a test moved to an end by hand (no longer InProgress) is not stopped by request_stop: its
            # thread would wait out the start delay
            job.discarded = True
            job._stop.set()
            kill(job._process)
        with contextlib.suppress(TimeoutError):
            self.wait_all(timeout)
        with self._lock:
            self._jobs.clear()
            self._threads.clear()


class _JobRun:
    """One job's thread: each phase moves the job on, or raises JobFailure with SageMaker's FailureReason."""

    def __init__(self, job: SimulatedJob, simulator: Simulator, collaborators: Collaborators) -> None:
        self.job = job
        self.sim = simulator
        self.settings = simulator.settings
        self.parts = collaborators
        self.network = network.NetworkView.of(job.account, job.region)
        self.gates: list[dict[str, Any]] = []
        #: S3 as the job's role sees it, through its network's endpoint
        self.storage = JobStorage(job.account, self._authorize)
        #: S3 as FSx sees it (its service-linked role reads and exports the linked prefixes)
        self.fsx_storage = JobStorage(job.account, lambda service, operation, params: None)
        self.mounts: list[mounts.Mount] = []
        self.logs = events.LogStream(job, self._authorize)
        #: the `hardware-failure` fault took the trainer's instance away
        self.hardware_failed = False
        #: Secrets Manager and SSM as the job's process reaches them, while it runs
        self.secrets: SecretsEndpoints | None = None
        #: S3's objects as the job's process reads them (its stop request), while it runs
        self.objects: ObjectEndpoint | None = None

    def _wait_for_creator(self) -> None:
        """Until the invocation that created the job has returned (its events come after its answer, as on AWS),
        or the job is stopped meanwhile: a stop (or the twin's reset) never waits on a caller that goes on."""
        creator = self.job.created_by
        if creator is None or creator is threading.current_thread():
            return
        deadline = time.monotonic() + CREATOR_WAIT_S
        while creator.is_alive() and not self.job._stop.is_set() and time.monotonic() < deadline:
            creator.join(CREATOR_POLL_S)

    def _pending_for_capacity(self) -> bool:
        """A job on a training plan whose capacity has not started (created Pending: job.py) waits for it, as
        "Training plans utilization for SageMaker training jobs" says: until the capacity is active (then it goes on
        as any job, Starting), a StopTrainingJob, or 2 days Pending (Failed, InsufficientCapacityError). The wait is
        not run time: MaxRuntimeInSeconds is how long a job "can run", and MaxPendingTimeInSeconds, the wait's own
        counter, does not count a wait for a Scheduled plan or between its capacities (botocore's StoppingCondition),
        which is all the twin models. The wait is measured on the plan's clock (training_plans.capacity_wait), which
        `shift` moves. True when the job ended while it waited."""
        job = self.job
        if job.secondary_status != "Pending":
            return False
        # its first event (Pending) comes after the creator's answer, as every job's first event does
        if job._stop.wait(self.settings.start_delay_s):
            if not job.discarded:
                self._finish_stopped(upload=False)
            return True
        self._publish()
        began: float | None = None
        while True:
            wait = training_plans.capacity_wait(job.request)
            if began is None and wait is not None:  # Pending since its creation, on the plan's clock
                began = wait.clock - (now() - job.creation_time).total_seconds()
            # (a plan gone from the twin, reset under the job, leaves nothing to wait for)
            if wait is None or began is None or wait.starts_in == 0:
                with job._lock:
                    if job.status == "InProgress":
                        job._move("InProgress", "Starting")  # announced once launched, as a cold job's is
                return False
            waited = wait.clock - began
            if wait.starts_in is None or waited >= training_plans.PENDING_LIMIT_S:
                raise JobFailure(INSUFFICIENT_CAPACITY)
            if job._stop.wait(PENDING_POLL_S):
                if not job.discarded:
                    self._finish_stopped(upload=False)
                return True

    def _authorize(self, service: str, operation: str, params: dict[str, Any]) -> None:
        self.parts.authorize(self.job, service, operation, params, self.gates if service == "s3" else [])

    def _reach_s3(self, phase: str) -> None:
        path = self.network.s3_path(self.job.request.get("VpcConfig"))
        if path.problem is not None:
            log.info("training job %s cannot reach S3: %s", self.job.name, path.problem)
            raise JobFailure(network.unreachable_s3(phase))
        self.gates = [path.endpoint_policy] if path.endpoint_policy is not None else []

    def run(self) -> None:
        job = self.job
        try:
            self._wait_for_creator()
            if self._pending_for_capacity():
                return
            launching = 0.0 if job.took_pool else self.settings.provision_s
            if job._stop.wait(self.settings.start_delay_s + launching):
                if not job.discarded:
                    self._finish_stopped(upload=False)
                return
            if job.fault == "silent":
                self._hold_silently()
                return
            self._publish()
            if job.fault in ("capacity-error", "capacity-error-once"):
                raise JobFailure(CAPACITY_ERROR)
            # the fork server imports torch while the job downloads (a no-op once it runs); a ContainerEntrypoint
            # (a data warm-up) is no Python entry point to fork
            launcher.warm(self.settings.fork_server and not container.replaces_entry_point(job))
            self._pull_image()
            layout = self._prepare()
            self._advance("Downloading")
            with job._lock:
                job.training_start_time = now()
            self._reach_s3("Data download")
            # a job with its own ContainerEntrypoint runs no script-mode code (a data warm-up)
            code_dir = layout.code if container.entrypoint(job, layout) else self._fetch_code(layout)
            channels = self._fill_channels(layout)
            self._restore_checkpoints(layout)
            if job._stop.is_set():
                self._finish_stopped(upload=False)
                return
            self._advance("Training")
            if job.instance_count > 1 and not self.network.instances_reach_each_other(
                job.request.get("VpcConfig"), job.instance_type
            ):
                raise JobFailure(network.distributed_failure(job.instance_count))
            rc, stderr_tail, command = self._train(layout, code_dir, channels)
            self._export()
            if job.fault == "hardware-failure" and not job.stop_reason:
                # the instance failed before the job could end: what the trainer checkpointed is in S3 (SageMaker
                # syncs the checkpoint directory while the job runs)
                self._upload_after_failure(layout)
                raise JobFailure(INTERNAL_ERROR)
            if job.stop_reason:
                self._finish_stopped(upload=True, layout=layout)
            elif rc != 0:
                self._upload_after_failure(layout)
                raise JobFailure(container.algorithm_error(layout, rc, stderr_tail, command))
            else:
                self._advance("Uploading")
                self._upload(layout, with_model=True)
                self._finish("Completed", "Completed")
        except JobFailure as failure:
            self._finish("Failed", "Failed", failure.reason)
        except InvalidUri as bad:
            self._finish("Failed", "Failed", f"ClientError: {bad}")
        except Exception as error:
            log.exception("simulated training job %s broke", job.name)
            self._finish("Failed", "Failed", f"InternalServerError: the twin's simulator failed: {error!r}")
        finally:
            if self.secrets is not None:
                self.secrets.close()
            if self.objects is not None:
                self.objects.close()
            self.logs.flush()
            remove_temp_workdir(job)
            job._done.set()

    # --- status and events ----------------------------------------------------------------------------------

    def _publish(self) -> None:
        events.publish(self.job, self.parts.emit)

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
        if not job._stop.wait(max_runtime_s(job)):
            with job._lock:
                job.stop_reason = "MaxRuntimeExceeded"
                job._move("Stopping", "Stopping")
        self._finish_stopped(upload=False)

    def _finish_stopped(self, *, upload: bool, layout: Layout | None = None) -> None:
        self._publish_stopping()
        if upload and layout is not None:
            self._upload(layout, with_model=True)
        secondary = "MaxRuntimeExceeded" if self.job.stop_reason == "MaxRuntimeExceeded" else "Stopped"
        self._finish("Stopped", secondary)

    # --- the instance -----------------------------------------------------------------------------------------

    def _prepare(self) -> Layout:
        root = self.settings.work_root or temp_root()
        workdir = root / f"{self.job.name}-{uuid.uuid4().hex[:8]}"
        layout = Layout(workdir)
        layout.create()
        with self.job._lock:
            self.job.workdir = workdir
            self.job.log_path = layout.log
        return layout

    def _pull_image(self) -> None:
        """The instances pull the training image from ECR with the execution role's credentials."""
        image = str((self.job.request.get("AlgorithmSpecification") or {}).get("TrainingImage", ""))
        found = ECR_IMAGE.match(image)
        if found is None:
            return  # not an ECR image: nothing the role is asked for
        registry, repository = found.group(1), found.group(3)
        try:
            self._authorize("ecr", "GetAuthorizationToken", {})
            for operation in ("BatchCheckLayerAvailability", "GetDownloadUrlForLayer", "BatchGetImage"):
                self._authorize("ecr", operation, {"registryId": registry, "repositoryName": repository})
        except ClientError as refused:
            raise JobFailure(
                f"ClientError: Cannot pull the training image {image} with the execution role: {denied_text(refused)}"
            ) from None

    def _fetch_code(self, layout: Layout) -> Path:
        hps = container.decoded_hyperparameters(self.job.request.get("HyperParameters") or {})
        program = hps.get("sagemaker_program")
        submit = hps.get("sagemaker_submit_directory")
        if not program or not submit:
            raise JobFailure(
                "AlgorithmError: the twin runs script-mode jobs only: HyperParameters sagemaker_program and "
                "sagemaker_submit_directory (s3://.../sourcedir.tar.gz) are required"
            )
        bucket, key = split_s3_uri(str(submit))
        data = self._download(lambda: self.storage.get(bucket, key))
        if data is None:
            raise JobFailure(
                f"ClientError: Data download failed: the source directory {submit} does not exist "
                "(HyperParameters.sagemaker_submit_directory)"
            )
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            archive.extractall(layout.code, filter="data")
        return layout.code

    @staticmethod
    def _download(read: Callable[[], Any]) -> Any:
        try:
            return read()
        except ClientError as refused:
            raise JobFailure(
                f"ClientError: Data download failed:Failed to download data. {denied_text(refused)}"
            ) from None

    def _fill_channels(self, layout: Layout) -> dict[str, Path]:
        channels: dict[str, Path] = {}
        for channel in self.job.request.get("InputDataConfig") or []:
            name = channel["ChannelName"]
            target = layout.channel(name)
            source = channel.get("DataSource", {})
            if "FileSystemDataSource" in source:
                mount = mounts.mount_lustre(
                    source["FileSystemDataSource"],
                    target,
                    account=self.job.account,
                    region=self.job.region,
                    describe=self.parts.describe_file_system,
                    linked_paths=self.parts.linked_paths,
                    fsx_storage=self.fsx_storage,
                    files=self.parts.lustre_files,
                )
                self.mounts.append(mount)
            elif "S3DataSource" in source:
                self._download(
                    functools.partial(
                        mounts.download_s3_channel, self.job, source["S3DataSource"], target, self.storage
                    )
                )
            else:
                raise JobFailure(
                    f"ClientError: channel {name!r}: the twin supports FileSystemDataSource and S3DataSource "
                    f"channels only (got {sorted(source)})"
                )
            channels[name] = target
        return channels

    def _export(self) -> None:
        """What the job wrote in its read-write Lustre channels reaches their linked S3 prefixes (AutoExport)."""
        for mount in self.mounts:
            if self.parts.lustre_files is not None:
                mounts.keep_changes(mount, self.parts.lustre_files)
            mounts.export_changes(mount, self.fsx_storage)

    def _checkpoint_s3(self) -> str | None:
        config = self.job.request.get("CheckpointConfig") or {}
        uri = config.get("S3Uri")
        return str(uri) if uri else None

    def _restore_checkpoints(self, layout: Layout) -> None:
        uri = self._checkpoint_s3()
        if uri is None:
            return
        bucket, prefix = split_s3_uri(uri)
        try:
            found = self._download(lambda: self.storage.list(bucket, as_dir_prefix(prefix)))
        except MissingBucket:
            found = []
        for key, data in found:
            write_below(layout.checkpoints, key[len(as_dir_prefix(prefix)) :], data)

    def _train(
        self, layout: Layout, code_dir: Path, channels: dict[str, Path]
    ) -> tuple[int, list[str], list[str]]:
        job = self.job
        hps = container.decoded_hyperparameters(job.request.get("HyperParameters") or {})
        env = container.training_env(job, layout, channels, hps, self.parts.environment())
        # the job's network reaches S3 (its gateway endpoint) and code.secrets' services (their interface endpoints)
        # and nothing else: no NAT, no other endpoint. Every other service's calls go where nothing listens, and
        # fail at once as they time out on AWS (the twin's own address, which the twin's process may carry, is
        # never the job's way in)
        for name in [name for name in env if name.startswith("AWS_ENDPOINT_URL") or name == "MOTO_PORT"]:
            del env[name]
        env["AWS_ENDPOINT_URL"] = endpoint.unused_address()
        env.update(self._secrets_endpoints())
        env.update(self._object_endpoint())
        # the image's torch, not this machine's: its torchrun's grace after a forwarded SIGTERM
        env.update(container.image_environment(job))
        command = container.entrypoint(job, layout) or container.command(
            job, code_dir, hps, self.settings.max_processes
        )
        container.write_configs(job, layout, hps)
        launched = command
        if job.fault == "user-error":
            launched = [
                sys.executable,
                "-c",
                "import sys; sys.stderr.write('Traceback (most recent call last):\\n'); "
                "sys.stderr.write('RuntimeError: injected fault user-error "
                "(lustrain rehearse --inject start_training:user-error)\\n'); sys.exit(1)",
            ]
        max_runtime = max_runtime_s(job)
        if job.fault == "stopped":
            max_runtime = min(max_runtime, self.settings.stopped_fault_runtime_s)
        started = job.training_start_time or now()
        deadline = time.monotonic() + max(0.0, max_runtime - (now() - started).total_seconds())

        stderr_tail: deque[str] = deque(maxlen=20)
        with layout.log.open("a", encoding="utf-8") as log_file:
            process = launcher.start(
                launched,
                cwd=code_dir,
                env=env,
                niceness=self.settings.trainer_nice,
                fork_server=self.settings.fork_server,
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
            if job.fault == "hardware-failure":
                threading.Thread(
                    target=self._fail_hardware_after_checkpoint, args=(layout, process), daemon=True
                ).start()
            rc = self._supervise(process, deadline)
            # The instance goes away with its trainer: a worker the launcher left behind would also hold the
            # pipes open (what it printed stays readable).
            kill(process)
            for reader in readers:
                reader.join()
        with job._lock:
            job._process = None
        return rc, list(stderr_tail), command

    def _secrets_endpoints(self) -> dict[str, str]:
        """Secrets Manager and SSM for the job's process, through its network and as its role (secrets.py)."""
        vpc_config = self.job.request.get("VpcConfig")
        self.secrets = SecretsEndpoints(
            self.job.account,
            self.job.region,
            self._authorize,
            lambda service: self.network.interface_endpoint_problem(vpc_config, service),
        )
        self.secrets.start()
        return self.secrets.environment()

    def _object_endpoint(self) -> dict[str, str]:
        """S3's objects for the job's process, through its network and as its role (objects.py)."""
        path = self.network.s3_path(self.job.request.get("VpcConfig"))
        self.objects = ObjectEndpoint(self.storage, reachable=path.problem is None)
        self.objects.start()
        return self.objects.environment()

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
            self.logs.write(line)
            if tail is not None and line.strip():
                tail.append(line)
            self.job.record_metrics(line)
            self.sim.publish_line(self.job, line)
        stream.close()

    def _fail_hardware_after_checkpoint(self, layout: Layout, process: JobProcess) -> None:
        """The `hardware-failure` fault: the moment the trainer's first checkpoint is in place, its instance goes
        (the trainer is killed where it stands, with what it has checkpointed). A thread of its own, polling the
        checkpoint directory: the trainer's log lines reach the simulator too late to time it by them."""
        while process.poll() is None:
            if any(CHECKPOINT_FILE.match(p.name) for p in layout.checkpoints.glob("step-*.json")):
                self.hardware_failed = True
                log.info(
                    "training job %s: hardware failure injected after its first checkpoint", self.job.name
                )
                kill(process)
                return
            time.sleep(HARDWARE_POLL_S)

    def _supervise(self, process: JobProcess, deadline: float) -> int:
        """Wait for the trainer; on StopTrainingJob or MaxRuntime, SIGTERM to the container's first process, then
        SIGKILL after the grace. In SageMaker's PyTorch images that first process passes nothing on
        (container.sigterm_reaches_entry_point): the entry point is only killed."""
        job = self.job
        signalled = container.sigterm_reaches_entry_point(job)
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
                    if signalled:
                        with contextlib.suppress(ProcessLookupError):
                            process.send_signal(signal.SIGTERM)
                    terminated_at = time.monotonic()
            elif time.monotonic() - terminated_at >= self.settings.stop_grace_s:
                kill(process)

    # --- results ----------------------------------------------------------------------------------------------

    def _output_prefix(self) -> tuple[str, str]:
        output = (self.job.request.get("OutputDataConfig") or {}).get("S3OutputPath", "")
        bucket, prefix = split_s3_uri(str(output))
        return bucket, f"{as_dir_prefix(prefix)}{self.job.name}/output/"

    def _upload(self, layout: Layout, *, with_model: bool) -> None:
        self._reach_s3("Artifact upload")
        bucket, prefix = self._output_prefix()
        config = self.job.request.get("OutputDataConfig") or {}
        try:
            if config.get("CompressionType") == "NONE":
                # uncompressed: /opt/ml/model's files under output/model/ (the model artifacts are that prefix)
                # and /opt/ml/output/data's under output/data/, each object as it is
                if with_model:
                    self._put_tree(bucket, f"{prefix}model/", layout.model)
                    with self.job._lock:
                        self.job.model_artifacts = f"s3://{bucket}/{prefix}model/"
                self._put_tree(bucket, f"{prefix}data/", layout.output_data)
            else:
                if with_model:
                    key = f"{prefix}model.tar.gz"
                    self.storage.put(bucket, key, tar_gz(layout.model))
                    with self.job._lock:
                        self.job.model_artifacts = f"s3://{bucket}/{key}"
                self.storage.put(bucket, f"{prefix}output.tar.gz", tar_gz(layout.output_data))
            self._save_tensorboard(layout)
            self._save_checkpoints(layout)
        except MissingBucket as missing:
            raise JobFailure(
                f"ClientError: Artifact upload failed: bucket {missing.bucket} does not exist "
                "(OutputDataConfig.S3OutputPath / CheckpointConfig.S3Uri)"
            ) from None
        except ClientError as refused:
            raise JobFailure(
                f"ClientError: Artifact upload failed:Failed to upload data. {denied_text(refused)}"
            ) from None

    def _put_tree(self, bucket: str, prefix: str, directory: Path) -> None:
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            self.storage.put(bucket, prefix + path.relative_to(directory).as_posix(), path.read_bytes())

    def _upload_after_failure(self, layout: Layout) -> None:
        with contextlib.suppress(JobFailure):
            self._upload(layout, with_model=False)

    def _save_tensorboard(self, layout: Layout) -> None:
        """TensorBoardOutputConfig: LocalPath's files under <S3OutputPath><job name>/tensorboard-output/, as
        SageMaker uploads them (it does so while the job runs too; the twin at the job's end)."""
        config = self.job.request.get("TensorBoardOutputConfig")
        if not config:
            return
        local = Path(in_layout(layout, str(config.get("LocalPath") or TENSORBOARD_DEFAULT_PATH)))
        if not local.is_relative_to(layout.root) or not local.is_dir():
            return
        bucket, prefix = split_s3_uri(str(config["S3OutputPath"]))
        self._put_tree(bucket, f"{as_dir_prefix(prefix)}{self.job.name}/tensorboard-output/", local)

    def _save_checkpoints(self, layout: Layout) -> None:
        uri = self._checkpoint_s3()
        if uri is None:
            return
        bucket, prefix = split_s3_uri(uri)
        for path in sorted(p for p in layout.checkpoints.rglob("*") if p.is_file()):
            key = as_dir_prefix(prefix) + path.relative_to(layout.checkpoints).as_posix()
            self.storage.put(bucket, key, path.read_bytes())


def temp_root() -> Path:
    """Where jobs' directories go when the twin is given no work_root."""
    return Path(tempfile.gettempdir()) / "lustrain-twin-sagemaker"


def remove_temp_workdir(job: SimulatedJob) -> None:
    """The job's directory under the system temp directory, removed once the job has ended (its outputs are in
    S3 and on its file system, its log in CloudWatch); one under a work_root given to the twin stays."""
    if job.workdir is not None and job.workdir.parent == temp_root():
        shutil.rmtree(job.workdir, ignore_errors=True)


def kill(process: JobProcess | None) -> None:
    """SIGKILL the trainer's whole process tree: its process group, and every descendant (torchrun starts each
    worker in a session of its own), as an instance that goes away takes all its processes with it."""
    if process is None:
        return
    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    for child in descendants:
        with contextlib.suppress(psutil.Error):
            child.kill()
