"""The twin's SageMaker Processing jobs: checked as AWS checks them, lived by simulator/processing.py, stoppable.

moto 5.2.5 keeps a processing job as Completed the moment it is created (FakeProcessingJob), runs nothing and
emits no event. `install()` replaces CreateProcessingJob and DescribeProcessingJob and StopProcessingJob:

- CreateProcessingJob: the request's limits are the API model's (patches/validation.py: InstanceCount 1..100,
  VolumeSizeInGB 1..16384, MaxRuntimeInSeconds 1..777600, at most 10 inputs and 10 outputs, 100 environment
  variables of at most 256 characters, the name's pattern); the name is unique in the account and region, finished
  jobs included; the execution role as SageMaker checks it (SageMaker may assume it; with a VpcConfig the role may
  create the instances' network interfaces: patches/job_roles.check_role, shared with training jobs). moto's
  record is kept (ListProcessingJobs reads it, its status kept current); the job runs in a thread of its own.
- DescribeProcessingJob: the request as stored and the job's progress; "Requested resource not found." (AWS's
  ValidationException) for a name never created.
- StopProcessingJob: InProgress -> Stopping -> Stopped; ValidationException for a job that is not InProgress.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from typing import Any

from moto.core.responses import ActionResult, EmptyResult
from moto.sagemaker.exceptions import ValidationError
from moto.sagemaker.models import FakeProcessingJob, SageMakerModelBackend
from moto.sagemaker.responses import SageMakerResponse

from lustrain.twin import faults, simulator
from lustrain.twin.iam import enforce
from lustrain.twin.patches import job_roles, sagemaker
from lustrain.twin.simulator.processing import ProcessingJob, ProcessingRun

_PATCHED = "_lustrain_twin_processing"
_STATE = "_lustrain_twin_processing_jobs"

_server_lock = threading.Lock()
_server_url: str | None = None


def _jobs(backend: SageMakerModelBackend) -> dict[str, ProcessingJob]:
    jobs: dict[str, ProcessingJob] = backend.__dict__.setdefault(_STATE, {})
    return jobs


def jobs(account: str, region: str) -> dict[str, ProcessingJob]:
    """The twin's processing jobs of an account and region, by name."""
    from moto.sagemaker.models import sagemaker_backends

    return _jobs(sagemaker_backends[account][region])


def s3_endpoint() -> str:
    """An endpoint of this process's moto on this machine, for a container's own calls: the server's when the twin
    runs as one (MOTO_PORT), else a server started once for the purpose (it shares this process's backends)."""
    global _server_url
    if os.environ.get("MOTO_PORT"):
        return f"http://127.0.0.1:{os.environ['MOTO_PORT']}"
    with _server_lock:
        if _server_url is None:
            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
            server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            server.start()
            host, port = server.get_host_and_port()
            _server_url = f"http://{host}:{port}"
        return _server_url


def _create_processing_job(original: Any, self: SageMakerResponse) -> ActionResult:
    request = copy.deepcopy(dict(self.params))
    request.pop("Action", None)
    request.pop("Version", None)
    name = str(request.get("ProcessingJobName", ""))
    backend = self.sagemaker_backend
    jobs = _jobs(backend)
    arn = FakeProcessingJob.arn_formatter(name, backend.account_id, backend.region_name)
    if name in jobs or name in backend.processing_jobs:
        raise sagemaker.ResourceInUse(
            "Processing job names must be unique within an AWS account and region, and a processing job with "
            f"this name already exists ({arn})"
        )
    checked = {
        "RoleArn": request.get("RoleArn", ""),
        "VpcConfig": (request.get("NetworkConfig") or {}).get("VpcConfig"),
    }
    credentials = job_roles.check_role(backend, checked, arn, enforce.principal_of(self.get_access_key()))
    result = original(self)
    job = ProcessingJob(request=request, arn=arn, account=backend.account_id, region=backend.region_name)
    job.credentials = credentials
    if faults.current_step() is not None:
        job.created_by = threading.current_thread()  # its first event waits for the invocation to return
    jobs[name] = job
    _sync(backend, job)
    settings = simulator.settings()
    ProcessingRun(
        job,
        # authorize_job reads the job's arn, request and region, which a processing job has as a training job does
        authorize=lambda service, operation, params: job_roles.authorize_job(
            job,  # type: ignore[arg-type]
            service,
            operation,
            params,
            [],
        ),
        emit=sagemaker.collaborators().emit,
        environment=sagemaker.collaborators().environment,
        s3_endpoint=s3_endpoint,
        work_root=settings.work_root,
        start_delay_s=settings.start_delay_s,
        stop_grace_s=settings.stop_grace_s,
        niceness=settings.trainer_nice,
    ).start()
    return result  # type: ignore[no-any-return]


def _describe_processing_job(original: Any, self: SageMakerResponse) -> ActionResult:
    name = str(self._get_param("ProcessingJobName"))
    job = _jobs(self.sagemaker_backend).get(name)
    if job is None:
        if name not in self.sagemaker_backend.processing_jobs:
            raise ValidationError(sagemaker.NOT_FOUND)
        return original(self)  # type: ignore[no-any-return]
    return ActionResult(job.describe())


def stop_processing_job(self: SageMakerResponse) -> EmptyResult:
    backend = self.sagemaker_backend
    job = _jobs(backend).get(str(self._get_param("ProcessingJobName")))
    if job is None:
        raise ValidationError(sagemaker.NOT_FOUND)
    if not job.request_stop():
        raise ValidationError(
            f"The request was rejected because the processing job is in status {job.status}."
        )
    _sync(backend, job)
    return EmptyResult()


def _list_processing_jobs(original: Any, self: SageMakerModelBackend, *args: Any, **kwargs: Any) -> Any:
    for job in list(_jobs(self).values()):
        _sync(self, job)
    return original(self, *args, **kwargs)


def _sync(backend: SageMakerModelBackend, job: ProcessingJob) -> None:
    fake = backend.processing_jobs.get(job.name)
    if fake is not None:
        fake.processing_job_status = job.status


def install() -> None:
    """Patch moto's SageMaker processing jobs (once per process)."""
    if getattr(SageMakerResponse, _PATCHED, False):
        return
    for cls, method in (
        (SageMakerResponse, "create_processing_job"),
        (SageMakerResponse, "describe_processing_job"),
        (SageMakerModelBackend, "list_processing_jobs"),
    ):
        if not hasattr(cls, method):
            raise RuntimeError(f"moto: {cls.__name__}.{method} is gone; the twin cannot patch it")
    sagemaker.wrap(SageMakerResponse, "create_processing_job", _create_processing_job)
    sagemaker.wrap(SageMakerResponse, "describe_processing_job", _describe_processing_job)
    sagemaker.wrap(SageMakerModelBackend, "list_processing_jobs", _list_processing_jobs)
    SageMakerResponse.stop_processing_job = stop_processing_job  # type: ignore[method-assign]
    setattr(SageMakerResponse, _PATCHED, True)
