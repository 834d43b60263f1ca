"""A run on a training plan, on the twin: with no on-demand p4d quota at all, the run is admitted against the plan's
instances while the plan is still Scheduled (its capacity starts within two days), builds its network and file system
in the plan's zone before the capacity starts, starts its training job with TrainingPlanArn and a
MaxRuntimeInSeconds that ends before the capacity's usable end, and ends SUCCEEDED with 0 resources left."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lustrain.twin.rehearse import execution_history, operator_session, rehearse, state_outputs

pytestmark = pytest.mark.slow

QUICK = Path(__file__).with_name("quick.yaml")
PLAN = "reserved-quick"


def test_a_run_on_a_training_plan_is_built_while_it_is_scheduled_and_uses_its_reserved_instances(tmp_path):
    doc = yaml.safe_load(QUICK.read_text())
    doc["name"] = "planned"
    doc["compute"]["training_plan"] = PLAN
    path = tmp_path / "planned.yaml"
    path.write_text(yaml.safe_dump(doc))
    seen: dict[str, Any] = {}

    def inspect(stack, result):
        session = operator_session()
        history = execution_history(session.client("stepfunctions"), result.execution_arn)
        seen["history"] = history
        seen["outputs"] = list(state_outputs(history))
        seen["jobs"] = [
            session.client("sagemaker").describe_training_job(TrainingJobName=a["training_job_name"])
            for a in result.attempts
        ]
        seen["plan"] = session.client("sagemaker").describe_training_plan(TrainingPlanName=PLAN)

    run = rehearse(
        path,
        quota=0,  # no on-demand instances: only the plan's can carry the run
        # Scheduled when the run is registered, Active 45 s after the plan was bought: the run's network and file
        # system are made meanwhile, and its job waits Pending for the rest
        training_plan={"availability_zone": "us-east-1c", "instance_count": 4, "starts_in_s": 45},
        inspect=inspect,
    )

    assert run.status == "SUCCEEDED", run.cause
    assert run.resources_left == 0, run.leftovers
    outputs = seen["outputs"]
    registered = next(o["job"] for o in outputs if isinstance(o.get("job"), dict) and "launch" in o["job"])
    assert registered["launch"]["training_plan"]["status"] == "Scheduled"
    looks = [o["quota"] for o in outputs if isinstance(o.get("quota"), dict)]
    # admitted at once: its capacity starts within two days, so its job may wait for it Pending
    assert looks[0]["admitted"] is True and looks[0]["plan_status"] == "Scheduled"
    assert looks[-1]["pool"] == f"ml.p4d.24xlarge#training-plan/{PLAN}"
    # the network was made while the plan was still Scheduled, not in its paid reserved hours
    made = next(
        e["timestamp"]
        for e in seen["history"]
        if e.get("stateEnteredEventDetails", {}).get("name") == "Create the network"
    )
    assert made < seen["plan"]["StartTime"]
    network = next(o["network"] for o in outputs if isinstance(o.get("network"), dict))
    assert network["availability_zone"] == "us-east-1c"
    (job,) = seen["jobs"]
    assert job["ResourceConfig"]["TrainingPlanArn"] == seen["plan"]["TrainingPlanArn"]
    # the job waited Pending for the capacity and started with it
    transitions = job["SecondaryStatusTransitions"]
    starting = next(t for t in transitions if t["Status"] == "Starting")
    assert transitions[0]["Status"] == "Pending" and starting["StartTime"] >= seen["plan"]["StartTime"]
    # its MaxRuntimeInSeconds (run time: the wait Pending is not counted) ends 30 minutes before the capacity does
    usable_end = seen["plan"]["ReservedCapacitySummaries"][0]["EndTime"].timestamp() - 30 * 60
    begins = max(job["CreationTime"].timestamp(), seen["plan"]["StartTime"].timestamp())
    assert begins + job["StoppingCondition"]["MaxRuntimeInSeconds"] <= usable_end + 1
    assert seen["plan"]["InUseInstanceCount"] == 0  # the job is done: no job holds the plan's instances
