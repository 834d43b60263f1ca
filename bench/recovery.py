"""Benchmark: a run that meets a hardware failure and is carried to a trained model, on the twin.

The rehearsal of examples/tiny.yaml (150 steps, a checkpoint every 50) with `start_training:hardware-failure`:
the first training job fails with SageMaker's InternalServerError the moment its trainer has written a checkpoint;
the run policy (lustrain_core.recovery) classes it infrastructure, waits its wait (15 s: the twin is given AWS's
value here, not its usual 1 s), and a second training job on the same network and file system resumes from that
checkpoint and trains to the end.

Prints what it saw, then `key=value` lines:
- attempts=       training jobs the run started (goal: 2);
- steps_lost=     steps computed and then computed again (goal: at most checkpoint_interval, 50);
- goodput=        useful steps / steps computed;
- resume_s=       the failed job's end (its TrainingEndTime, which its Failed event carries) to the next
                  CreateTrainingJob (its CreationTime), in the twin's time: the wait plus the control plane's
                  own, SageMaker's start of the new job aside (goal: under 60 s);
- leaked=         resources left when the run ended (goal: 0).

    .venv/bin/python bench/recovery.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lustrain_core import recovery

from lustrain.twin.rehearse import operator_session, rehearse

SPEC = Path(__file__).resolve().parents[1] / "examples" / "tiny.yaml"
CHECKPOINT_INTERVAL = 50
#: the policy's own wait after an infrastructure fault, not the twin's shortened one
WAIT_S = recovery.POLICY[recovery.FailureClass.INFRASTRUCTURE].wait_seconds


def _jobs(names: list[str]) -> list[dict[str, Any]]:
    sagemaker = operator_session().client("sagemaker")
    return [sagemaker.describe_training_job(TrainingJobName=name) for name in names]


def main() -> int:
    described: list[dict[str, Any]] = []

    def inspect(stack: Any, result: Any) -> None:
        described.extend(_jobs([a["training_job_name"] for a in result.attempts if a.get("training_job_name")]))

    run = rehearse(
        SPEC,
        inject=["start_training:hardware-failure"],
        parameters={"AttemptWaitMaxSeconds": str(WAIT_S)},
        inspect=inspect,
    )
    for a in run.attempts:
        print(
            f"attempt {a['attempt']}: {a['training_job_name']} {a['outcome']} {a.get('failure_class') or ''} "
            f"steps {a.get('resumed_from') or 0} -> {a.get('step_reached')}"
        )
    print(f"run: {run.status} in {run.wall_s} s, {run.transitions} state transitions")
    computed = sum(max(0, (a["step_reached"] or 0) - (a.get("resumed_from") or 0)) for a in run.attempts)
    useful = next((a["step_reached"] for a in run.attempts if a["outcome"] == "Completed"), 0) or 0
    resume_s = None
    if len(described) >= 2 and "TrainingEndTime" in described[0]:
        resume_s = (described[1]["CreationTime"] - described[0]["TrainingEndTime"]).total_seconds()
    print(f"attempts={len(run.attempts)}")
    print(f"steps_lost={computed - useful}")
    print(f"goodput={run.goodput}")
    print(f"resume_s={resume_s:.1f}" if resume_s is not None else "resume_s=None")
    print(f"leaked={run.resources_left}")
    ok = (
        run.status == "SUCCEEDED"
        and len(run.attempts) == 2
        and computed - useful <= CHECKPOINT_INTERVAL
        and resume_s is not None
        and resume_s < 60
        and run.resources_left == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
