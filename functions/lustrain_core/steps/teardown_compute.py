"""Teardown's compute family: the run's training jobs and data preparation's processing jobs, stopped
(StopTrainingJob, StopProcessingJob) and waited for until Stopped, since their instances mount the file system and
hold network interfaces in the subnet; one that already ended holds nothing and counts as already gone.

A running training job is asked first: its run's stop request (stop_request.py), then at most the wait its
Environment names (the plan's goodput.stop_wait_s) for its trainer to save and exit; StopTrainingJob only after
that. SageMaker's PyTorch images pass no SIGTERM on to the trainer: a StopTrainingJob alone loses every step since
its last checkpoint."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from lustrain_core import resources as registry
from lustrain_core import stop_request
from lustrain_core.aws_errors import error_code, training_job_missing
from lustrain_core.resources import Kind
from lustrain_core.steps.teardown_base import TRAINING_RUNNING, Scope


class TrainingJobs(Scope):
    def _job(self, kind: Kind, name: str) -> dict[str, Any] | None:
        return registry.describe(self.sagemaker, kind, name)

    def stop_training_job(self, name: str) -> str | None:
        """Stop one of the run's training jobs and wait until it has; None when it no longer runs, else why."""
        return self.stop_job(registry.TRAINING_JOB, name)

    def stop_processing_job(self, name: str) -> str | None:
        """Stop one of the run's processing jobs and wait until it has; None when it no longer runs, else why."""
        return self.stop_job(registry.PROCESSING_JOB, name)

    def stop_job(self, kind: Kind, name: str) -> str | None:
        """Stop one of the run's jobs of `kind` (its registry entry's stop call) and wait until it has; a training
        job is asked through the run's stop request first. None when it no longer runs, else why."""
        entry = {"type": kind.name, "id": name}
        status = str(kind.state_key)
        gone = {status: "Stopped"}
        job = self._job(kind, name)
        if job is None:
            self.report.already_gone.append(entry)
            return None
        if not self.ours(registry.job_tags(self.sagemaker, job[kind.arn_key])):
            self.report.kept.append({**entry, "reason": "not tagged as this job's: never stopped"})
            return None
        asked = False
        if kind is registry.TRAINING_JOB and job[status] == "InProgress":
            asked = stop_request.STOP_REQUEST_VARIABLE in (job.get("Environment") or {}) and (
                job.get("SecondaryStatus") == "Training"
            )
            job, waiting = self._ask_to_stop(name, job)
            if waiting:
                return f"training job {name} was asked to stop and is saving (up to {waiting:.0f} s more)"
        if job[status] == "InProgress":
            try:
                getattr(self.sagemaker, kind.stop)(**{kind.ids_param: name})
                asked = True
            except ClientError as exc:
                # it ended (or began stopping) between the two calls: what it is now is read below
                if error_code(exc) != "ValidationException" and not training_job_missing(exc):
                    raise
            job = self._job(kind, name) or gone
        while job[status] in TRAINING_RUNNING:
            if not self.clock.wait():
                return f"{kind.name.replace('_', ' ')} {name} is still {job[status]}"
            job = self._job(kind, name) or gone
        (self.report.stopped if asked else self.report.already_gone).append(entry)
        return None

    def _ask_to_stop(self, name: str, job: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """The run's stop request, then the job's own end for at most the wait it names. The job as it is after,
        and the seconds of that wait still to come when this invocation's clock ran out first (0: go on; a retry
        waits out the rest, from the first request's time)."""
        environment = job.get("Environment") or {}
        if stop_request.STOP_REQUEST_VARIABLE not in environment:
            return job, 0.0  # started before stop requests: only StopTrainingJob reaches it
        if job.get("SecondaryStatus") != "Training":
            # no trainer runs yet (Pending, Starting, Downloading): nothing to save, nobody to hear it
            return job, 0.0
        try:
            wait = float(environment.get(stop_request.STOP_WAIT_VARIABLE) or stop_request.DEFAULT_STOP_WAIT_SECONDS)
        except ValueError:
            wait = float(stop_request.DEFAULT_STOP_WAIT_SECONDS)
        asked_at = stop_request.ask(self.s3, self.settings, self.job_id, f"the run ends: teardown of {name}")
        until = asked_at.timestamp() + wait
        while job["TrainingJobStatus"] == "InProgress" and self.wall_clock() < until:
            if not self.clock.wait():
                return job, until - self.wall_clock()
            job = self._job(registry.TRAINING_JOB, name) or {"TrainingJobStatus": "Stopped"}
        return job, 0.0
