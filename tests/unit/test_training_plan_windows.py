"""steps/training_plans' arithmetic of reserved capacities, on DescribeTrainingPlan answers as AWS gives them: the
instances of a moment are those of the capacities active then, a capacity ends for its jobs 30 minutes before its
end, and a job's MaxRuntimeInSeconds counts its wait Pending for the capacity."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from lustrain_core.steps import training_plans as plans

HOUR = 3600
T0 = 1_800_000_000.0
P4D = "ml.p4d.24xlarge"


def capacity(start_h: float, hours: float, count: int = 4, status: str = "Scheduled") -> dict[str, Any]:
    return {
        "ReservedCapacityArn": f"arn:aws:sagemaker:us-east-1:123456789012:reserved-capacity/rc-{start_h}",
        "InstanceType": P4D,
        "TotalInstanceCount": count,
        "Status": status,
        "AvailabilityZone": "us-east-1c",
        "StartTime": datetime.fromtimestamp(T0 + start_h * HOUR, UTC),
        "EndTime": datetime.fromtimestamp(T0 + (start_h + hours) * HOUR, UTC),
    }


def described(*capacities: dict[str, Any]) -> dict[str, Any]:
    return {
        "TrainingPlanArn": "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p",
        "TrainingPlanName": "p",
        "Status": "Scheduled",
        "TargetResources": ["training-job"],
        "ReservedCapacitySummaries": list(capacities),
    }


def test_capacities_that_do_not_overlap_are_never_summed():
    plan = described(capacity(0, 10), capacity(20, 10))
    assert plans.most_at_once(plan, P4D) == 4
    assert plans.instances_at(plan, P4D, T0 + 5 * HOUR) == 4
    assert plans.instances_at(plan, P4D, T0 + 15 * HOUR) == 0
    assert plans.windows(plan, P4D, 8, T0) == []


def test_capacities_that_overlap_are_summed_while_both_are_active():
    plan = described(capacity(0, 10), capacity(5, 10))
    assert plans.most_at_once(plan, P4D) == 8
    (first,) = plans.windows(plan, P4D, 8, T0)
    assert (first.start, first.usable_end) == (T0 + 5 * HOUR, T0 + 9.5 * HOUR)


def test_a_capacity_is_usable_until_30_minutes_before_its_end():
    plan = described(capacity(0, 10))
    assert plans.usable_runtime_seconds(plan, T0 + HOUR, instance_type=P4D, instance_count=4) == 8.5 * HOUR
    assert plans.instances_at(plan, P4D, T0 + 9.75 * HOUR) == 0
    assert plans.usable_runtime_seconds(plan, T0 + 9.75 * HOUR, instance_type=P4D, instance_count=4) is None


def test_an_expired_or_failed_capacity_carries_nothing():
    plan = described(capacity(0, 10, status="Failed"))
    assert plans.usable_runtime_seconds(plan, T0, instance_type=P4D, instance_count=1) is None


def test_the_job_runtime_is_its_training_time_and_stops_at_the_usable_end():
    plan = described(capacity(5, 10))
    now = T0
    # 5 h Pending (not run time: MaxPendingTimeInSeconds' to count, and a Scheduled plan's wait counts for neither),
    # then 8 h: within the 9.5 h from the capacity's start to its usable end
    assert plans.job_runtime_seconds(plan, now, instance_type=P4D, instance_count=4, runtime_s=8 * HOUR) == 8 * HOUR
    # 12 h of training would run past the usable end: capped to it, from the capacity's start
    assert plans.job_runtime_seconds(plan, now, instance_type=P4D, instance_count=4, runtime_s=12 * HOUR) == (
        9.5 * HOUR
    )


def test_a_run_takes_the_first_window_long_enough_for_its_runtime():
    plan = described(capacity(0, 3), capacity(10, 20))
    chosen = plans.window(plan, P4D, 4, T0, runtime_s=10 * HOUR)
    assert chosen is not None and chosen.start == T0 + 10 * HOUR


def test_stopping_condition_of_a_run_on_a_plan_takes_the_runtime_start_training_computed():
    from lustrain_core import aws_requests

    class Launch:  # the three fields of launch_plan.LaunchPlan it reads
        max_runtime_seconds = 8 * HOUR
        max_wait_seconds = None
        training_plan = object()

    launch: Any = Launch()
    assert aws_requests.stopping_condition(launch, 13 * HOUR) == {"MaxRuntimeInSeconds": 13 * HOUR}
    launch.training_plan = None
    assert aws_requests.stopping_condition(launch, 13 * HOUR) == {"MaxRuntimeInSeconds": 8 * HOUR}
