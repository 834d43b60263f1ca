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
- Stop: SIGTERM to the container's first process, then `stop_grace_s` (SageMaker's 120 s) before SIGKILL. In
  SageMaker's PyTorch images that first process passes nothing on (container.sigterm_reaches_entry_point): the entry
  point is only killed; lustrain's trainer stops when its run's stop request asks (objects.py serves its reads). MaxRuntimeInSeconds ends the job the same way, as Stopped with SecondaryStatus
  MaxRuntimeExceeded; a manual StopTrainingJob ends as Stopped/Stopped. The model is uploaded in both cases.

The job's own calls (code and checkpoint downloads, checkpoint and model uploads, log writes) are made as its
SageMaker execution role and authorized by the twin's IAM, through the path its network gives it: a job whose
subnet or security groups cannot reach S3 fails as SageMaker fails it (network.py).

S3, FSx and CloudWatch Logs are read and written through moto's backend objects, in this process: the simulator
works the same under mock_aws and in server mode, and never reaches for a network endpoint.

The package's seams: job.py (the job's state, what DescribeTrainingJob and the events say), lifecycle.py (its
life in a thread; `Collaborators` are what it uses of the rest of the twin), container.py (the container's
contract), mounts.py (Lustre and S3 channels), network.py (reachability), storage.py (S3 as the job's role),
events.py (EventBridge events and CloudWatch logs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from lustrain.twin.simulator.job import (
    EVENT_DETAIL_TYPE,
    EVENT_SOURCE,
    ROLE_SESSION,
    TERMINAL,
    JobFailure,
    JobView,
    SimulatedJob,
)
from lustrain.twin.simulator.lifecycle import (
    CAPACITY_ERROR,
    FAULT_STEP,
    Collaborators,
    LogListener,
    Settings,
    Simulator,
)

__all__ = [
    "CAPACITY_ERROR",
    "EVENT_DETAIL_TYPE",
    "EVENT_SOURCE",
    "FAULT_STEP",
    "ROLE_SESSION",
    "TERMINAL",
    "Collaborators",
    "JobFailure",
    "JobView",
    "LogListener",
    "Settings",
    "SimulatedJob",
    "Simulator",
    "configure",
    "connect",
    "jobs",
    "launch",
    "reset",
    "settings",
    "subscribe",
    "wait_all",
]

_simulator = Simulator()


def connect(collaborators: Collaborators) -> None:
    """Hand the simulator what it uses of the twin (the SageMaker patch does, when it is installed)."""
    _simulator.collaborators = collaborators


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


def event_detail(name: str) -> dict[str, Any]:
    """The `detail` of the state-change event the job `name` would send now (the fault matrix replays and forges
    events from it)."""
    return _simulator.event_detail(name)


def wait_all(timeout: float | None = None) -> list[JobView]:
    return _simulator.wait_all(timeout)


def subscribe(listener: LogListener) -> Callable[[], None]:
    return _simulator.subscribe(listener)


def reset() -> None:
    from lustrain.twin.simulator import processing

    _simulator.reset()
    processing.reset()
