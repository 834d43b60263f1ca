"""When the trainer stops: a stop the stack asks for, the run's own deadline, a signal where one arrives.

SageMaker's PyTorch training image never passes SIGTERM on to the entry point: the container's first process is
bash (start_with_right_hostname.sh), which drops it, and the training toolkit under it installs no handler
(aws/sagemaker-training-toolkit issues #125 and #173; aws/deep-learning-containers #632). A StopTrainingJob, a
budget's or the run's MaxRuntimeInSeconds, a training plan's end: the trainer hears none of them and is killed
(SIGKILL) at the end of SageMaker's 120 s, losing every step since its last checkpoint. So nothing here depends on
the signal:

- **A stop request.** Every stop the stack causes (a cancel, a failed or aborted run's teardown) first writes the
  run's stop request, an S3 object the job's role reads (LUSTRAIN_STOP_REQUEST; upload_code writes it with
  `"stop": false` before the job exists, so a read never meets a missing key, which S3 answers with 403 to a role
  without s3:ListBucket). Rank 0 reads it every LUSTRAIN_STOP_POLL_SECONDS on a thread of its own (a read never
  delays a step); the training loop's one all-reduce a step tells every rank. Every rank leaves the loop at the same
  step, the checkpoint of that step is written and committed, and the process exits 0: the job ends Completed, and
  the stack calls StopTrainingJob only if that has not happened within the bounded wait the plan names
  (goodput.stop_wait_s).
- **The deadline.** LUSTRAIN_MAX_RUNTIME_SECONDS is the job's MaxRuntimeInSeconds (the budget's, the run's, a
  training plan's usable end); the trainer stops LUSTRAIN_STOP_RESERVE_SECONDS before it (the time SageMaker's clock
  ran before the entry point started, and the stop's own save), measured from its own start. A training plan's
  capacity (SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP, its end; a job's use of it ends 30 minutes
  earlier) is a deadline too.
  After that save the trainer waits for SageMaker's stop rather than exiting: the job then ends Stopped
  (MaxRuntimeExceeded), which is how the stack tells a deadline (a budget spent, a run out of time) from a run that
  trained to its end.
- **A signal** (SIGTERM where an image does pass it, Ctrl-C) is still a stop request; nothing depends on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

#: The run's stop request: an s3:// URI (a path of this machine where a test gives one).
STOP_REQUEST_ENV = "LUSTRAIN_STOP_REQUEST"
#: Seconds between rank 0's reads of the stop request.
STOP_POLL_ENV = "LUSTRAIN_STOP_POLL_SECONDS"
#: The job's MaxRuntimeInSeconds, and how long before it the trainer stops itself.
MAX_RUNTIME_ENV = "LUSTRAIN_MAX_RUNTIME_SECONDS"
STOP_RESERVE_ENV = "LUSTRAIN_STOP_RESERVE_SECONDS"
#: Set by SageMaker in a job on a training plan's reserved capacity: when that capacity ends, since the epoch (AWS's
#: own example, "Training plans utilization for SageMaker training jobs", reads it as whole seconds; a value too large
#: for seconds is read as milliseconds).
CAPACITY_END_ENV = "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
#: above this a timestamp is in milliseconds (1e11 s is the year 5138)
_MILLISECONDS_ABOVE = 1e11
#: A training plan's capacity ends for its jobs 30 minutes before the capacity's own end ("Training plans
#: utilization for SageMaker training jobs"): the trainer's deadline counts back from that.
CAPACITY_EARLY_END_S = 30 * 60
DEFAULT_POLL_S = 10.0
#: A deadline's save made, the longest the trainer waits for SageMaker's stop before exiting on its own (a stop
#: that never comes must not hold a fleet): the reserve it kept, SageMaker's 120 s, and a margin.
DEADLINE_WAIT_MARGIN_S = 120.0 + 60.0

#: The codes every rank all-reduces (max) to agree on why the loop ends; a higher code wins.
NONE, REQUESTED, DEADLINE = 0, 1, 2


def _env_float(env: dict[str, str], name: str) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


def read_request(uri: str, client: Callable[[], Any] | None = None) -> dict[str, Any]:
    """The stop request's document ({"stop": bool, "reason": ...}). An s3:// URI is read with GetObject (the job's
    role); anything else is a local path (a test's), where a missing file means no request."""
    if uri.startswith("s3://"):
        bucket, _, key = uri[len("s3://"):].partition("/")
        s3 = client() if client is not None else _s3_client()
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    else:
        path = Path(uri)
        if not path.is_file():
            return {"stop": False}
        body = path.read_bytes()
    document = json.loads(body or b"{}")
    return document if isinstance(document, dict) else {"stop": False}


def _s3_client() -> Any:
    import boto3
    from botocore.config import Config

    # a read that cannot reach S3 fails in seconds and is tried again at the next poll
    config = Config(connect_timeout=5, read_timeout=10, retries={"mode": "adaptive", "max_attempts": 3})
    return boto3.client("s3", config=config)


class StopRequest:
    """Why the loop should end, if it should: a stop request, a signal, the deadline. The loop asks `code()` once a
    step and all-reduces it, so every rank agrees on the step it stops after."""

    def __init__(self, env: dict[str, str] | None = None, *, clock: Callable[[], float] = time.time,
                 say: Callable[[str], None] | None = None, started: float | None = None) -> None:
        env = dict(os.environ if env is None else env)
        self.clock = clock
        self.say = say or (lambda message: None)
        #: the entry point's start (the trainer passes its main()'s first moment): MaxRuntimeInSeconds counts from
        #: earlier still (the reserve covers that)
        self.started = clock() if started is None else started
        #: why a stop was asked for (a signal's name, the stop request's reason), or None
        self.reason: str | None = None
        self.signal: str | None = None
        self.uri = env.get(STOP_REQUEST_ENV, "").strip() or None
        self.poll_s = _env_float(env, STOP_POLL_ENV) or DEFAULT_POLL_S
        self.deadline, self.deadline_reason = self._deadline(env)
        self.reserve_s = _env_float(env, STOP_RESERVE_ENV) or 0.0
        self._previous: dict[signal.Signals, Any] = {}
        self._done = threading.Event()
        self._poller: threading.Thread | None = None
        self._warned = False

    def _deadline(self, env: dict[str, str]) -> tuple[float | None, str | None]:
        """When the trainer stops itself (seconds since the epoch), and why; (None, None) without a deadline."""
        deadlines: list[tuple[float, str]] = []
        reserve = _env_float(env, STOP_RESERVE_ENV) or 0.0
        runtime = _env_float(env, MAX_RUNTIME_ENV)
        if runtime is not None:
            deadlines.append((self.started + runtime - reserve,
                              f"MaxRuntimeInSeconds {runtime:.0f} s less {reserve:.0f} s to save"))
        capacity_end = _env_float(env, CAPACITY_END_ENV)
        if capacity_end is not None:
            if capacity_end > _MILLISECONDS_ABOVE:
                capacity_end /= 1000
            deadlines.append((capacity_end - CAPACITY_EARLY_END_S - reserve,
                              "the training plan's capacity ends (30 min before its end for training jobs) less "
                              f"{reserve:.0f} s to save"))
        if not deadlines:
            return None, None
        return min(deadlines)

    def spent_before(self, seconds: float) -> None:
        """This job ran `seconds` before this process started (an earlier try of the same job: SageMaker restarts a
        spot job in place, and its MaxRuntimeInSeconds counts every try): the runtime deadline comes that much
        sooner. A capacity's end is a moment, not a runtime, and stays."""
        if seconds <= 0 or self.deadline is None or self.deadline_reason is None:
            return
        if self.deadline_reason.startswith("MaxRuntimeInSeconds"):
            self.deadline -= seconds
            self.deadline_reason += f", {seconds:.0f} s of it spent by an earlier try of this job"

    def describe_deadline(self) -> str | None:
        """The deadline as the log shows it at start, or None without one."""
        if self.deadline is None:
            return None
        return f"stops itself in {self.deadline - self.clock():,.0f} s ({self.deadline_reason})"

    # -- signals -----------------------------------------------------------------------------------------

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: someone wants out now, checkpoint or not
        self.signal = signal.Signals(signum).name
        self.reason = self.reason or self.signal

    @contextlib.contextmanager
    def installed(self, poll: bool = True) -> Iterator[StopRequest]:
        """Signal handlers, and (on the rank that polls: rank 0) the stop request's reader, while the run goes."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        if poll and self.uri:
            self._poller = threading.Thread(target=self._poll, name="lustrain-stop-request", daemon=True)
            self._poller.start()
        try:
            yield self
        finally:
            self._done.set()
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)

    # -- the stop request --------------------------------------------------------------------------------

    def check_request(self, client: Callable[[], Any] | None = None) -> bool:
        """Read the stop request once; True when it asks to stop. A read that fails is said once and tried again
        at the next poll (a stop request unread is a stop lost: the job's log must show why)."""
        assert self.uri is not None
        try:
            document = read_request(self.uri, client)
        except Exception as exc:
            if not self._warned:
                self.say(f"warning: cannot read the stop request {self.uri}: {type(exc).__name__}: {exc}")
                self._warned = True
            return False
        if document.get("stop") is True:
            self.reason = self.reason or f"the stop request ({document.get('reason') or 'no reason given'})"
            return True
        return False

    def _poll(self) -> None:
        client = _s3_client() if self.uri and self.uri.startswith("s3://") else None
        while not self._done.is_set():
            if self.check_request(lambda: client):
                return
            self._done.wait(self.poll_s)

    # -- the loop's question -----------------------------------------------------------------------------

    def code(self) -> int:
        """This rank's view: DEADLINE, REQUESTED or NONE."""
        if self.deadline is not None and self.clock() >= self.deadline:
            return DEADLINE
        return REQUESTED if self.reason else NONE

    def describe(self, code: int) -> str:
        """Why the loop ended, for the checkpoint's reason and the log."""
        if code == DEADLINE:
            return f"deadline: {self.deadline_reason}"
        return f"stop requested by {self.reason or 'another rank'}"

    def wait_for_sagemaker(self, sleep: Callable[[float], None] = time.sleep) -> None:
        """After a deadline's save: wait for SageMaker to stop the job (at MaxRuntimeInSeconds, or the capacity's
        end), so that it ends Stopped, not Completed; give up (the process then exits) after the reserve kept and
        SageMaker's 120 s of grace, with a margin."""
        assert self.deadline is not None
        give_up = self.deadline + self.reserve_s + DEADLINE_WAIT_MARGIN_S
        while self.clock() < give_up and not self.reason:
            sleep(min(5.0, max(0.0, give_up - self.clock())))
