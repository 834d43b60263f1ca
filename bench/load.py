"""Load: many specs dropped at once on `lustrain local up`, against a SageMaker quota smaller than the crowd.

`lustrain local up` serves the twin on 127.0.0.1 (a free port, nothing else); the bench drives it as a user would,
through boto3 against that endpoint: it uploads the stand-in trainer (tests/e2e/stub_trainer) and a little data,
sets the account's ml.p4d.24xlarge training quota, drops RUNS specs (one instance each) into the jobs bucket at
once, and waits for every execution to end, for as long as the runs make progress (fault_matrix.watch); the
server is up for TIMEOUT_S plus a margin. The server runs in this process (its main
thread, as the command does), so the bench can set the quota, which Service Quotas only lets AWS change.

Every training job is told to keep busy for BUSY_S, so that the crowd overlaps: at most QUOTA instances can train
at once. The runs wait in the capacity queue (steps/queue.py) until their instances fit, first come first served,
and build their network and file system only once admitted; the twin's SageMaker refuses a job beyond the quota
(ResourceLimitExceeded), as AWS does, so an admission that oversubscribed would show.

A run ends correctly when it SUCCEEDED with its own model archived, or FAILED with QuotaExceeded (its queue time
ran out), and in either case left nothing behind. Nothing may cross between runs: each archive's model must name
its own training job, and no resource may be deleted by two runs' teardowns.

Figures: `queued_s_max`, the longest a run waited in the queue (its $.quota.queued_s when admitted), and
`fs_hours_while_queued`, the file-system hours that overlapped a wait in the queue (each run's file system exists
from the end of "Create the file system" to the end of its teardown; each wait runs from a check that did not
admit to the next check), which is 0 when file systems are created on admission. Both in the twin's seconds.

    .venv/bin/python bench/load.py [RUNS QUOTA]     prints runs=, succeeded=, refused=, leaked=, peak_instances=,
                                                    queued_s_max=, fs_hours_while_queued=, wall_s=, ...
"""

from __future__ import annotations

import contextlib
import io
import json
import socket
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
from lustrain_core.spec import JobSpec, validate_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Everything the driver thread uses is imported here, before it starts: two threads importing the same modules
# at once (werkzeug, under moto) can see one half-initialised.
from bench import fault_matrix  # run as a script, the bench directory is not a package
from lustrain.cli import main as lustrain
from lustrain.submit import upload_code_dir
from lustrain.twin import simulator
from lustrain.twin.commands import stop_local_up
from lustrain.twin.patches import service_quotas
from lustrain.twin.rehearse import bucket_of, state_outputs

RUNS = 20
QUOTA = 8
INSTANCE_TYPE = "ml.p4d.24xlarge"
#: how long each training job keeps busy: long enough for every run to reach start_training meanwhile
BUSY_S = 20
TIMEOUT_S = 420
DATA_URI = "s3://lustrain-load-data/tokens/"
RESULTS_BUCKET = "lustrain-load-results"

Printer = Callable[[str], None]


@dataclass
class LoadReport:
    runs: int
    quota: int
    succeeded: int = 0
    refused: int = 0
    wrong: list[str] = field(default_factory=list)
    leaked: int = 0
    crossed: list[str] = field(default_factory=list)
    peak_instances: int = 0
    queued_s_max: int = 0
    fs_seconds_while_queued: float = 0.0
    wall_s: float = 0.0
    ended: list[fault_matrix.Ended] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "quota": self.quota,
            "succeeded": self.succeeded,
            "refused": self.refused,
            "wrong": len(self.wrong),
            "leaked": self.leaked,
            "crossed": len(self.crossed),
            "peak_instances": self.peak_instances,
            "queued_s_max": self.queued_s_max,
            "fs_hours_while_queued": round(self.fs_seconds_while_queued / 3600, 6),
            "wall_s": round(self.wall_s, 1),
        }


#: how long an onlooker may take to be ready to watch, and to finish once the runs have ended
ONLOOKER_READY_S = 300.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _Tee(io.TextIOBase):
    """What `local up` prints, passed on and kept: the stack's outputs are read from it, as a user reads them."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.lines: list[str] = []
        self._partial = ""
        self.changed = threading.Condition()

    def write(self, text: str) -> int:
        self.out.write(text)
        with self.changed:
            self._partial += text
            *done, self._partial = self._partial.split("\n")
            self.lines += done
            self.changed.notify_all()
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def wait_for(self, marker: str, timeout: float) -> list[str]:
        with self.changed:
            if not self.changed.wait_for(lambda: any(marker in line for line in self.lines), timeout):
                raise TimeoutError(f"`lustrain local up` did not print {marker!r} within {timeout:.0f} s")
            return list(self.lines)


def _outputs(lines: list[str]) -> dict[str, str]:
    """The stack outputs `local up` lists, one `  Name  value` line each."""
    found = {}
    for line in lines:
        parts = line.split()
        if line.startswith("  ") and len(parts) == 2:
            found[parts[0]] = parts[1]
    return found


def _specs(runs: int, code_uri: str) -> dict[str, JobSpec]:
    specs = {}
    for i in range(1, runs + 1):
        doc = fault_matrix.spec_for(f"load-{i:02d}", (("sleep_s", BUSY_S),)).model_dump(mode="json")
        doc["code"]["source"] = code_uri
        doc["data"]["s3_uri"] = DATA_URI
        doc["output"]["s3_uri"] = f"s3://{RESULTS_BUCKET}/default/"
        specs[doc["name"]] = validate_spec(doc)
    return specs


def _prepare(outputs: dict[str, str]) -> str:
    """The data, the results bucket and the stand-in trainer's code in the twin's S3; returns the code's URI."""
    s3 = boto3.client("s3")
    for bucket in (bucket_of(DATA_URI), RESULTS_BUCKET):
        s3.create_bucket(Bucket=bucket)
    bucket, prefix = DATA_URI.removeprefix("s3://").split("/", 1)
    for i in range(3):
        s3.put_object(Bucket=bucket, Key=f"{prefix}part-{i}.bin", Body=bytes([i]) * 65536)
    return upload_code_dir(
        fault_matrix.E2E / "stub_trainer", outputs["ArtifactsBucketName"], "load", boto3.Session()
    )


def _teardown_report(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the run's teardown deleted, from the last state output that carries its report."""
    deleted: list[dict[str, Any]] = []
    for output in state_outputs(history):
        report = output.get("teardown")
        if isinstance(report, dict) and isinstance(report.get("deleted"), list):
            deleted = report["deleted"]
    return deleted


def _model_of(s3: Any, archive_bucket: str, job_id: str) -> dict[str, Any]:
    # SageMaker uploaded it under the archive's jobs/<training job>/output/
    listed = s3.list_objects_v2(Bucket=archive_bucket, Prefix=f"archive/{job_id}/jobs/").get("Contents", [])
    key = next(o["Key"] for o in listed if o["Key"].endswith("/output/model.tar.gz"))
    body = s3.get_object(Bucket=archive_bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as archive:
        member = archive.extractfile("model.pt")
        return dict(json.loads(member.read())) if member is not None else {}


def _peak_instances(sagemaker: Any) -> int:
    """The most instances that were training at once, from every job's creation and end times."""
    changes: list[tuple[datetime, int]] = []
    for page in sagemaker.get_paginator("list_training_jobs").paginate():
        for summary in page["TrainingJobSummaries"]:
            job = sagemaker.describe_training_job(TrainingJobName=summary["TrainingJobName"])
            count = int(job["ResourceConfig"]["InstanceCount"])
            changes.append((job["CreationTime"], count))
            changes.append((job.get("TrainingEndTime") or datetime.now(tz=UTC), -count))
    peak = level = 0
    for _, delta in sorted(changes, key=lambda change: (change[0], change[1])):
        level += delta
        peak = max(peak, level)
    return peak


QUEUE_STATE = "Check the SageMaker quota"
FS_CREATED = "Create the file system"
TEARDOWNS = ("Tear down the run", "Tear down after failure")


def queue_figures(history: list[dict[str, Any]]) -> tuple[int, float]:
    """(seconds the run waited in the queue when last admitted, seconds its file system existed while it waited),
    from its execution history's state exits."""
    exits: list[tuple[datetime, str, dict[str, Any]]] = []
    for event in history:
        details = event.get("stateExitedEventDetails") or {}
        if details.get("name"):
            try:
                output = json.loads(details.get("output") or "null")
            except ValueError:
                output = None
            exits.append((event["timestamp"], details["name"], output if isinstance(output, dict) else {}))
    queued_s = 0
    fs_from: datetime | None = None
    fs_to: datetime | None = None
    waits: list[tuple[datetime, datetime | None]] = []
    for when, name, output in exits:
        if name == QUEUE_STATE:
            if waits and waits[-1][1] is None:
                waits[-1] = (waits[-1][0], when)
            quota = output.get("quota") or {}
            if quota.get("admitted"):
                queued_s = int(quota.get("queued_s") or 0)
            else:
                waits.append((when, None))
        elif name == FS_CREATED and fs_from is None:
            fs_from = when
        elif name in TEARDOWNS:
            fs_to = when
    overlap = 0.0
    if fs_from is not None:
        end = fs_to or datetime.now(tz=UTC)
        for start, stop in waits:
            stop = stop or end
            overlap += max(0.0, (min(stop, end) - max(start, fs_from)).total_seconds())
    return queued_s, overlap


def _judge(report: LoadReport, outputs: dict[str, str], sfn: Any) -> None:
    s3 = boto3.client("s3")
    deleted_by: dict[str, str] = {}
    for run in report.ended:
        if run.leftovers:
            report.leaked += len(run.leftovers)
        if run.status == "SUCCEEDED":
            report.succeeded += 1
            model = _model_of(s3, outputs["ArtifactsBucketName"], str(run.job_id))
            if not str(model.get("training_job_name", "")).startswith(f"{run.job_id}-"):
                report.crossed.append(
                    f"{run.name}: its archive holds the model of {model.get('training_job_name')}"
                )
        elif (run.status, run.error) == ("FAILED", "QuotaExceeded"):
            report.refused += 1
        else:
            report.wrong.append(f"{run.name}: {run.status} {run.error}")
        history = fault_matrix.execution_history(sfn, run.execution_arn)
        queued_s, fs_while_queued = queue_figures(history)
        report.queued_s_max = max(report.queued_s_max, queued_s)
        report.fs_seconds_while_queued += fs_while_queued
        for resource in _teardown_report(history):
            owner = deleted_by.setdefault(str(resource["id"]), run.name)
            if owner != run.name:
                report.crossed.append(f"{resource['id']} was deleted by both {owner} and {run.name}")
    names = [run.name for run in report.ended]
    report.wrong += [
        f"{name}: {names.count(name)} executions" for name in sorted(set(names)) if names.count(name) > 1
    ]


def _drive(
    runs: int, quota: int, tee: _Tee, say: Printer, report: LoadReport, endpoint: str,
    while_running: Callable[[str, threading.Event], None] | None,
) -> None:
    outputs = _outputs(tee.wait_for("Ctrl-C stops the twin.", timeout=120))
    service_quotas.set_quota(INSTANCE_TYPE, quota)
    specs = _specs(runs, _prepare(outputs))
    sfn = boto3.client("stepfunctions")
    beside: list[BaseException] = []
    onlooker = None
    if while_running is not None:
        # the onlooker looks before the specs are dropped, so that it sees the runs from their start
        ready = threading.Event()
        onlooker = threading.Thread(
            target=_beside, args=(while_running, endpoint, ready, beside), name="load-onlooker", daemon=True
        )
        onlooker.start()
        ready.wait(ONLOOKER_READY_S)
    started = time.monotonic()
    fault_matrix.drop_specs(
        outputs["JobsBucketName"],
        {name: spec.model_dump(mode="json") for name, spec in specs.items()},
        boto3.client("s3"),
    )
    say(f"load: {runs} specs dropped at once, quota {quota} x {INSTANCE_TYPE}")
    report.ended = fault_matrix.watch(
        outputs["StateMachineArn"],
        specs,
        sfn=sfn,
        on_end=lambda e: say(f"{time.monotonic() - started:6.1f}s  {e.name}: {e.status} {e.error or ''}"),
    )
    report.wall_s = time.monotonic() - started
    if onlooker is not None:
        onlooker.join(ONLOOKER_READY_S)
    _judge(report, outputs, sfn)
    report.peak_instances = _peak_instances(boto3.client("sagemaker"))
    if beside:
        raise beside[0]


def _beside(
    while_running: Callable[[str, threading.Event], None],
    endpoint: str,
    ready: threading.Event,
    failure: list[BaseException],
) -> None:
    try:
        while_running(endpoint, ready)
    except BaseException as exc:
        failure.append(exc)
    finally:
        ready.set()  # an onlooker that failed before it was ready holds nothing up


def run_load(
    runs: int = RUNS, quota: int = QUOTA, printer: Printer | None = None,
    while_running: Callable[[str, threading.Event], None] | None = None,
) -> LoadReport:
    """Serve the twin with `lustrain local up` on a free loopback port and drop `runs` specs on it at once.
    `while_running`, given, is called with the twin's endpoint URL and an event, in a thread of its own, before
    the specs are dropped (a client of the twin watching the runs: tests/e2e/test_load.py opens the dashboard);
    the specs are dropped once it sets the event (it is ready to see them from their start; at most
    ONLOOKER_READY_S), and the load waits for it before it judges the runs, and raises what it raised."""
    say = printer or (lambda line: None)
    port = free_port()
    report = LoadReport(runs, quota)
    failure: list[BaseException] = []
    tee = _Tee(sys.stdout)

    def drive() -> None:
        try:
            _drive(runs, quota, tee, say, report, f"http://127.0.0.1:{port}", while_running)
        except BaseException as exc:
            failure.append(exc)
        finally:
            # what SIGTERM does to `local up` under a process manager, without a signal to this process
            stop_local_up()

    driver = threading.Thread(target=drive, name="load-driver", daemon=True)
    driver.start()
    with contextlib.redirect_stdout(tee):
        code = lustrain(["local", "up", "--port", str(port), "--for-seconds", str(TIMEOUT_S + 180)])
    driver.join(30)
    simulator.reset()
    if failure:
        raise failure[0]
    if code != 0:
        raise RuntimeError(f"`lustrain local up` exited {code}")
    return report


def main(argv: list[str]) -> int:
    import logging

    # moto's interpreter logs every failed state, werkzeug every request: the figures say what matters
    logging.getLogger("moto.stepfunctions").setLevel(logging.CRITICAL)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    runs, quota = (int(argv[0]), int(argv[1])) if len(argv) == 2 else (RUNS, QUOTA)
    report = run_load(runs, quota, printer=lambda line: print(line, file=sys.stderr, flush=True))
    for problem in report.wrong + report.crossed:
        print(f"problem: {problem}")
    for key, value in report.figures().items():
        print(f"{key}={value}")
    correct = not report.wrong and not report.crossed and report.leaked == 0
    return 0 if correct and report.peak_instances <= quota else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
