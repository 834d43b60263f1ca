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

from lustrain_core import stop_request
from lustrain_core.aws_errors import error_code, training_job_missing
from lustrain_core.steps.teardown_base import PROCESSING_JOB, TRAINING_JOB, TRAINING_RUNNING, Scope


class TrainingJobs(Scope):
    def _training_job(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.sagemaker.describe_training_job(TrainingJobName=name))
        except ClientError as exc:
            if training_job_missing(exc):
                return None
            raise

    def _training_job_tags(self, arn: str) -> list[dict[str, str]]:
        tags: list[dict[str, str]] = []
        params: dict[str, Any] = {"ResourceArn": arn}
        while True:
            page = self.sagemaker.list_tags(**params)
            tags.extend(page.get("Tags", []))
            if not page.get("NextToken"):
                return tags
            params["NextToken"] = page["NextToken"]

    def stop_training_job(self, name: str) -> str | None:
        """Stop one of the run's training jobs and wait until it has; None when it no longer runs, else why."""
        entry = {"type": TRAINING_JOB, "id": name}
        job = self._training_job(name)
        if job is None:
            self.report.already_gone.append(entry)
            return None
        if not self.ours(self._training_job_tags(job["TrainingJobArn"])):
            self.report.kept.append({**entry, "reason": "not tagged as this job's: never stopped"})
            return None
        asked = False
        if job["TrainingJobStatus"] == "InProgress":
            asked = stop_request.STOP_REQUEST_VARIABLE in (job.get("Environment") or {}) and (
                job.get("SecondaryStatus") == "Training"
            )
            job, waiting = self._ask_to_stop(name, job)
            if waiting:
                return f"training job {name} was asked to stop and is saving (up to {waiting:.0f} s more)"
        if job["TrainingJobStatus"] == "InProgress":
            try:
                self.sagemaker.stop_training_job(TrainingJobName=name)
                asked = True
            except ClientError as exc:
                # it ended (or began stopping) between the two calls: what it is now is read below
                if error_code(exc) != "ValidationException" and not training_job_missing(exc):
                    raise
            job = self._training_job(name) or {"TrainingJobStatus": "Stopped"}
        while job["TrainingJobStatus"] in TRAINING_RUNNING:
            if not self.clock.wait():
                return f"training job {name} is still {job['TrainingJobStatus']}"
            job = self._training_job(name) or {"TrainingJobStatus": "Stopped"}
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
            job = self._training_job(name) or {"TrainingJobStatus": "Stopped"}
        return job, 0.0

    def _processing_job(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.sagemaker.describe_processing_job(ProcessingJobName=name))
        except ClientError as exc:
            if training_job_missing(exc):
                return None
            raise

    def stop_processing_job(self, name: str) -> str | None:
        """Stop one of the run's processing jobs and wait until it has; None when it no longer runs, else why."""
        entry = {"type": PROCESSING_JOB, "id": name}
        job = self._processing_job(name)
        if job is None:
            self.report.already_gone.append(entry)
            return None
        if not self.ours(self._training_job_tags(job["ProcessingJobArn"])):
            self.report.kept.append({**entry, "reason": "not tagged as this job's: never stopped"})
            return None
        asked = False
        if job["ProcessingJobStatus"] == "InProgress":
            try:
                self.sagemaker.stop_processing_job(ProcessingJobName=name)
                asked = True
            except ClientError as exc:
                if error_code(exc) != "ValidationException" and not training_job_missing(exc):
                    raise
            job = self._processing_job(name) or {"ProcessingJobStatus": "Stopped"}
        while job["ProcessingJobStatus"] in TRAINING_RUNNING:
            if not self.clock.wait():
                return f"processing job {name} is still {job['ProcessingJobStatus']}"
            job = self._processing_job(name) or {"ProcessingJobStatus": "Stopped"}
        (self.report.stopped if asked else self.report.already_gone).append(entry)
        return None
