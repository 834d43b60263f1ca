"""Benchmark: a run cancelled while its model trains, to nothing left, on the twin.

examples/tiny.yaml with more steps than it gets to run, and a warm pool (compute.keep_alive_minutes 5), is dropped
into the twin's jobs bucket; once its training job trains, `lustrain cancel` (lustrain.operate.cancel) stops its
execution. The execution ends ABORTED and runs no Catch, as on AWS; the stack's rule on "Step Functions Execution
Status Change" starts on_execution_end, which asks the trainer to stop through the run's stop request (the twin runs
the entry point as SageMaker's PyTorch image does: no SIGTERM reaches it), waits for the job to end, ends its warm
pool, deletes the file system, then the network.

Prints what it saw, then `key=value` lines:
- cancel_to_stopped_s=  StopExecution to the training job ended (Completed: the trainer saved and exited);
- steps_lost_at_cancel= the last step the job logged less the step its stop's checkpoint holds (goal: 0);
- warm_pool_billed_after_cancel_s= what the job's warm pool billed after the job ended, until the teardown ended
                        it (ResourceRetainedBillableTimeInSeconds; without the teardown: its keep-alive, 300 s);
- warm_pool_status=     the pool's WarmPoolStatus after the teardown (goal: Terminated);
- cancel_to_clean_s=    StopExecution to 0 resources of the run left (goal: under 60 s);
- leaked=               resources of the run left after it (goal: 0).

    .venv/bin/python bench/cancel.py
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path

import yaml

from lustrain import operate
from lustrain.twin import rehearse, simulator
from lustrain.twin.rehearse import REGION, STACK_NAME, drop, operator_session, twin, until

SPEC = Path(__file__).resolve().parents[1] / "examples" / "tiny.yaml"
STOP_GRACE_S = 20.0


def main() -> int:
    os.environ["LUSTRAIN_TEARDOWN_POLL_SECONDS"] = "0.5"
    from lustrain.twin.patches import service_quotas

    with tempfile.TemporaryDirectory() as tmp:
        doc = yaml.safe_load(SPEC.read_text())
        doc["name"] = "cancelled"
        doc["code"]["hyperparameters"].update(max_steps=1_000_000)
        doc["compute"]["keep_alive_minutes"] = 5
        doc["code"]["source"] = str(SPEC.parent.parent / "trainer")
        spec_path = Path(tmp) / "cancelled.yaml"
        spec_path.write_text(yaml.safe_dump(doc))
        simulator.configure(stop_grace_s=STOP_GRACE_S)
        with twin() as stack:
            session = operator_session()
            sagemaker = session.client("sagemaker")
            service_quotas.set_quota("ml.p4d.24xlarge", 8, REGION)
            service_quotas.set_quota("ml.p4d.24xlarge", doc["compute"]["instance_count"], REGION, warm_pool=True)
            spec, arn = drop(stack, spec_path)

            def training() -> str | None:
                for job in sagemaker.list_training_jobs(StatusEquals="InProgress")["TrainingJobSummaries"]:
                    described = sagemaker.describe_training_job(TrainingJobName=job["TrainingJobName"])
                    if described["SecondaryStatus"] == "Training":
                        return str(job["TrainingJobName"])
                return None

            name = until(training, "a training job in Training", timeout=300)
            time.sleep(3)  # a few steps trained
            ours = operate.Stack.locate(STACK_NAME, session)
            stopped_at = time.monotonic()
            done = operate.cancel(ours, spec.name)
            print(f"cancelled {done.job_id}: {done.cause}")
            ended = until(
                lambda: ((status := sagemaker.describe_training_job(TrainingJobName=name)["TrainingJobStatus"])
                not in ("InProgress", "Stopping") and status) or None,
                "the training job ended",
                timeout=300,
            )
            to_stopped = time.monotonic() - stopped_at
            job_id = rehearse.job_id_of(rehearse.execution_history(session.client("stepfunctions"), arn))
            until(lambda: rehearse.resources_left(job_id, spec)[0] == [] or None, "0 resources left", timeout=300)
            to_clean = time.monotonic() - stopped_at
            left, _ = rehearse.resources_left(job_id, spec)
            pool = sagemaker.describe_training_job(TrainingJobName=name).get("WarmPoolStatus") or {}
            lines = [line.message for line in operate.logs(ours, done.job_id)]
            logged = [int(m[1]) for line in lines if (m := re.search(r"\bstep=(\d+) ", line))]
            saved = [int(m[1]) for line in lines if (m := re.search(r"checkpoint saved step-\d+-\w+ at step (\d+)", line))]
            lost = max(logged) - max(saved) if logged and saved else -1
            shown = operate.status(ours, done.job_id)
            print(f"run {done.job_id}: {shown.run.state} {shown.run.error}; {shown.cause}")
            print(f"training job {name}: {shown.training_job['status'] if shown.training_job else '?'}")
    print(f"training job ended {ended}")
    print(f"cancel_to_stopped_s={to_stopped:.1f}")
    print(f"steps_lost_at_cancel={lost}")
    print(f"warm_pool_billed_after_cancel_s={pool.get('ResourceRetainedBillableTimeInSeconds', -1)}")
    print(f"warm_pool_status={pool.get('Status', 'none')}")
    print(f"cancel_to_clean_s={to_clean:.1f}")
    print(f"leaked={len(left)}")
    return 0 if not left and to_clean < 60 and lost == 0 and pool.get("Status") == "Terminated" else 1


if __name__ == "__main__":
    sys.exit(main())
