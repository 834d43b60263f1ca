"""What a training job tells the world: its EventBridge state-change events and its CloudWatch log stream.

- Events: "SageMaker Training Job State Change" from aws.sagemaker at each status change, through the `emit`
  collaborator (the twin's EventBridge). SageMaker may send one more than once: `job.event_copies`.
- Logs: as SageMaker does, each host writes its container's output to the log group /aws/sagemaker/TrainingJobs,
  stream "<job name>/algo-<n>-<epoch seconds>", as the job's execution role (logs:CreateLogStream,
  logs:PutLogEvents; logs:CreateLogGroup the first time), while the job runs: a line is in CloudWatch within
  FLUSH_S of being printed. A role that may not write them loses the logs, not the job, as on SageMaker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from lustrain.twin.simulator.job import EVENT_DETAIL_TYPE, EVENT_SOURCE, SimulatedJob

log = logging.getLogger("lustrain.twin.sagemaker")

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
#: Lines are shipped in batches of at most this many (PutLogEvents takes up to 10,000 events).
BATCH_LINES = 200
#: ... and at most this many seconds after they were printed: SageMaker streams a job's output to CloudWatch
#: while it runs (`lustrain watch` and `lustrain logs --follow` move with it), not only when it ends.
FLUSH_S = 1.0

#: emit(source, detail_type, detail, region, account, resources)
Emit = Callable[[str, str, dict[str, Any], str, str, list[str]], Any]
#: authorize(service, operation, params) as the job's role; raises ClientError when refused.
Authorize = Callable[[str, str, dict[str, Any]], None]


def publish(job: SimulatedJob, emit: Emit) -> None:
    """Emit the job's current state (event_copies times); an event that cannot be delivered changes nothing."""
    with job._lock:
        detail = job.event_detail()
        job.events.append((job.status, job.secondary_status))
    try:
        for _ in range(job.event_copies):
            emit(EVENT_SOURCE, EVENT_DETAIL_TYPE, detail, job.region, job.account, [job.arn])
    except Exception:
        log.exception("could not emit %s/%s of %s", job.status, job.secondary_status, job.name)


class LogStream:
    """One host's CloudWatch log stream, written in batches as the job's role."""

    #: the log group SageMaker writes this kind of job's streams to
    log_group = LOG_GROUP
    #: the job's kind, as a warning names it
    kind = "training job"

    def __init__(self, job: SimulatedJob, authorize: Authorize, host: str = "algo-1") -> None:
        self.job = job
        self.authorize = authorize
        self.name = f"{job.name}/{host}-{int(time.time())}"
        self._lines: list[tuple[int, str]] = []
        self._lock = threading.Lock()
        self._open = False
        self._refused: str | None = None
        #: the flush due FLUSH_S after the oldest line not yet shipped
        self._due: threading.Timer | None = None

    @property
    def _backend(self) -> Any:
        from moto.logs.models import logs_backends

        return logs_backends[self.job.account][self.job.region]

    def _create(self) -> None:
        backend, group = self._backend, self.log_group
        if group not in backend.groups:
            self.authorize("logs", "CreateLogGroup", {"logGroupName": group})
            backend.create_log_group(group, {})
        self.authorize("logs", "CreateLogStream", {"logGroupName": group, "logStreamName": self.name})
        backend.create_log_stream(group, self.name)
        self._opened()
        self._open = True

    def _opened(self) -> None:
        """The stream exists: a training job names it (DescribeTrainingJob's log stream)."""
        with self.job._lock:
            self.job.log_stream = self.name

    def write(self, line: str) -> None:
        with self._lock:
            self._lines.append((int(time.time() * 1000), line))
            full = len(self._lines) >= BATCH_LINES
            if not full and self._due is None:
                self._due = threading.Timer(FLUSH_S, self._flush_due)
                self._due.daemon = True
                self._due.start()
        if full:
            self.flush()

    def _flush_due(self) -> None:
        try:
            self.flush()
        except Exception:
            # a twin reset under a job still printing: its lines go nowhere, the job goes on
            log.exception("could not ship the log lines of %s", self.job.name)

    def flush(self) -> None:
        with self._lock:
            if self._due is not None and self._due is not threading.current_thread():
                self._due.cancel()
            self._due = None
            lines, self._lines = self._lines, []
            if not lines or self._refused:
                return
            try:
                if not self._open:
                    self._create()
                params = {"logGroupName": self.log_group, "logStreamName": self.name}
                self.authorize("logs", "PutLogEvents", {**params, "logEvents": []})
                events = [{"timestamp": at, "message": text or " "} for at, text in lines]
                self._backend.put_log_events(self.log_group, self.name, events)
            except ClientError as error:
                self._refused = str(error)
                log.warning("%s %s cannot write its CloudWatch logs: %s", self.kind, self.job.name, error)
