"""Benchmark: what the control plane costs and how fast it reacts, from one rehearsal on the twin.

The file system takes 10 simulated minutes to become AVAILABLE. The twin runs AWS's minutes at SCALE times
speed: the state machine's waits (production: the first look at the file system after 480 s, the creation time
to expect, then every 30 s; the capacity queue every 30 s) are passed as 1/SCALE of that through the template's
parameters, and FSx becomes AVAILABLE after 600/SCALE real seconds. In simulated seconds, a Wait state's time is
its real time x SCALE and everything else (the Lambda calls, Step Functions' own steps) counts as it ran: the
handlers do on the twin what they do on AWS, so their time is not shrunk.

Prints, then ends with `transitions=`, `lambda_invocations=`, `cost_usd=` and `available_to_start_s=`:
- state transitions and Lambda invocations of the successful run (targets <= 40 and <= 15);
- the control plane's cost per run at list prices: Step Functions transitions, Lambda requests and
  Lambda GB-seconds (from the REPORT lines the functions log, as AWS bills them);
- the time from FSx AVAILABLE to CreateTrainingJob (target: at most 60 s).

Then `second_run_first_step_s_cold=` and `second_run_first_step_s_warm=`: two runs of one shape in sequence, twice,
without and with compute.keep_alive_minutes; the real seconds from dropping the second run's spec to its trainer's
first step. The twin launches a cold job's instances in LAUNCH_S (its own figure, not AWS's: SageMaker's launch
of a large fleet takes minutes); the warm second run takes the first's pool and network and skips the launch.
"""

from __future__ import annotations

import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import yaml
from lustrain_core.steps.filesystem import LINK_FIRST_LOOK_SHARE

from lustrain.twin.rehearse import REGION, drop, rehearse, twin, until

SCALE = 10
FS_CREATION_S = 600
#: the template's defaults (FilesystemPollInitialSeconds, FilesystemPollMaxSeconds, QueuePollSeconds)
PRODUCTION_POLL = {"initial": 480, "max": 30, "queue": 30}
TARGETS = {"transitions": 40, "lambda_invocations": 15, "available_to_start_s": 60}
SFN_PER_TRANSITION = 0.025 / 1000
LAMBDA_PER_REQUEST = 0.20 / 1_000_000
LAMBDA_ARM_PER_GB_S = 0.0000133334
SPEC = Path(__file__).resolve().parents[1] / "tests" / "e2e" / "quick.yaml"
#: the twin's time to launch a cold job's instances, for the warm pool comparison (real seconds)
LAUNCH_S = 8.0
KEEP_ALIVE_MINUTES = 5


def main() -> int:
    figures: dict[str, Any] = {}
    run = rehearse(
        SPEC,
        parameters={
            "FilesystemPollInitialSeconds": str(PRODUCTION_POLL["initial"] // SCALE),
            "FilesystemPollMaxSeconds": str(PRODUCTION_POLL["max"] // SCALE),
            "QueuePollSeconds": str(PRODUCTION_POLL["queue"] // SCALE),
        },
        # the associations are made once the file system is AVAILABLE and are ready by the next poll
        fsx_timing={"polls": None, "seconds": FS_CREATION_S / SCALE, "link_polls": 1},
        inspect=lambda stack, result: figures.update(_inspect(stack)),
    )
    if run.status != "SUCCEEDED":
        print(f"the rehearsal failed: {run.error}: {run.cause}", file=sys.stderr)
        return 1
    gb_s = figures["gb_s"]
    cost = run.transitions * SFN_PER_TRANSITION + run.lambda_invocations * LAMBDA_PER_REQUEST + gb_s * LAMBDA_ARM_PER_GB_S
    # FSx starts its clock when CreateFileSystem returns, inside "Create the file system"
    fs_available = _state_time(run, "Create the file system", end=True) + FS_CREATION_S / SCALE
    started = _state_time(run, "Start the training job")
    waited = _overlap(run, FS_WAIT, fs_available, started)
    available_to_start = (started - fs_available) + (SCALE - 1) * waited
    polls = sum(1 for s in run.states if s.name == "Check the file system")
    print(f"rehearsal: {run.status} in {run.wall_s:.1f} s real, file system AVAILABLE after {FS_CREATION_S} s simulated")
    print(f"file-system polls: {polls} (the first after {PRODUCTION_POLL['initial']} s, then every {PRODUCTION_POLL['max']} s, {PRODUCTION_POLL['max'] // LINK_FIRST_LOOK_SHARE} s after the S3 links are made)")
    print(f"state transitions: {run.transitions} (target <= {TARGETS['transitions']})")
    print(f"Lambda invocations: {run.lambda_invocations} (target <= {TARGETS['lambda_invocations']})")
    print(f"Lambda compute: {gb_s:.3f} GB-s (arm64)")
    print(f"control-plane cost per run: ${cost:.6f} at list prices")
    print(f"FSx AVAILABLE -> CreateTrainingJob: {available_to_start:.0f} s simulated (target <= {TARGETS['available_to_start_s']})")
    print(f"transitions={run.transitions}")
    print(f"lambda_invocations={run.lambda_invocations}")
    print(f"cost_usd={cost:.6f}")
    print(f"available_to_start_s={available_to_start:.0f}")
    for mode, seconds in warm_pool_starts().items():
        print(f"second_run_first_step_s_{mode}={seconds:.1f}")
    return 0


def warm_pool_starts() -> dict[str, float]:
    """Drop-to-first-step of the second of two runs of one shape, without (cold) and with (warm) a warm pool."""
    from lustrain.twin import simulator
    from lustrain.twin.patches import fsx, service_quotas

    first_step: dict[str, float] = {}
    lock = threading.Lock()

    def on_line(job_name: str, line: str) -> None:
        if re.search(r"\bstep=\d+", line):
            with lock:
                first_step.setdefault(job_name, time.monotonic())

    before = simulator.settings()
    simulator.configure(provision_s=LAUNCH_S)
    unsubscribe = simulator.subscribe(on_line)
    figures: dict[str, float] = {}
    try:
        with twin() as stack, tempfile.TemporaryDirectory() as scratch:
            service_quotas.set_quota("ml.p4d.24xlarge", 8, REGION)
            service_quotas.set_quota("ml.p4d.24xlarge", 2, REGION, warm_pool=True)
            fsx.configure(polls=1)
            sfn = boto3.client("stepfunctions", region_name=REGION)
            for mode, minutes in (("cold", 0), ("warm", KEEP_ALIVE_MINUTES)):
                for run in ("first", "second"):
                    doc = yaml.safe_load(SPEC.read_text())
                    doc["name"] = f"{mode}-{run}"
                    doc["compute"]["keep_alive_minutes"] = minutes
                    path = Path(scratch) / f"{mode}-{run}.yaml"
                    path.write_text(yaml.safe_dump(doc))
                    dropped = time.monotonic()
                    _, arn = drop(stack, path)
                    status = until(
                        lambda arn=arn: _ended(sfn, arn), f"the end of run {mode}-{run}", timeout=600
                    )
                    if status != "SUCCEEDED":
                        raise RuntimeError(f"run {mode}-{run} ended {status}")
                    if run == "second":
                        with lock:
                            second = [t for name, t in first_step.items() if name.startswith(f"{mode}-second-")]
                        figures[mode] = second[0] - dropped
    finally:
        unsubscribe()
        simulator.configure(**before.__dict__)
    return figures


def _ended(sfn: Any, arn: str) -> str | None:
    status = str(sfn.describe_execution(executionArn=arn)["status"])
    return None if status == "RUNNING" else status


def _inspect(stack: Any) -> dict[str, float]:
    """Lambda GB-seconds, from the REPORT lines each invocation logs (what AWS bills)."""
    logs = boto3.client("logs", region_name=REGION)
    gb_s = 0.0
    for group in logs.describe_log_groups(logGroupNamePrefix="/aws/lambda/")["logGroups"]:
        for event in logs.filter_log_events(logGroupName=group["logGroupName"], filterPattern="REPORT")["events"]:
            m = re.search(r"Duration: ([\d.]+) ms\tMemory Size: (\d+) MB", event["message"])
            if m:
                gb_s += float(m.group(1)) / 1000 * int(m.group(2)) / 1024
    return {"gb_s": gb_s}


FS_WAIT = "Wait for the file system"


def _overlap(run: Any, name: str, start: float, end: float) -> float:
    """Real seconds the states named `name` spent within [start, end]."""
    return sum(
        max(0.0, min(end, s.started_s + (s.seconds or 0.0)) - max(start, s.started_s))
        for s in run.states
        if s.name == name
    )


def _state_time(run: Any, name: str, end: bool = False) -> float:
    state = next(s for s in run.states if s.name == name)
    return float(state.started_s + (state.seconds or 0.0 if end else 0.0))


if __name__ == "__main__":
    sys.exit(main())
