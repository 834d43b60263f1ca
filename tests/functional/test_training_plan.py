"""compute.training_plan on the twin: the run checked against its plan before anything exists (each refusal naming its
field: a plan for other resources, capacities that do not overlap counted as one), admitted against the plan's
instances instead of the on-demand quota once its capacity starts within two days (while the plan is still
Scheduled), its network in the plan's zone, and its training job carrying TrainingPlanArn with MaxRuntimeInSeconds
capped to the capacity's usable end, counting the wait for it."""

from __future__ import annotations

import time
from typing import Any

import boto3
import pytest
from infra_support import REGION, invoke, job_record, register, spec
from lustrain_core.aws_requests import training_job as request_from
from lustrain_core.document import Run, dumped
from lustrain_core.errors import QuotaExceeded, SpecInvalid
from lustrain_core.steps import queue, training
from lustrain_core.steps import training_plans as plans
from training_support import training_input

from lustrain.twin import training_plans
from lustrain.twin.iam import actions
from lustrain.twin.patches import service_quotas

PLAN = "reserved-p4d"
HOUR = 3600
DAY = 24 * HOUR


def plan(name: str = PLAN, **given: Any) -> str:
    """A paid plan of 4 x ml.p4d.24xlarge in us-east-1c (use1-az2, which offers p4d on the twin), Active now."""
    return training_plans.create_training_plan(
        name,
        **{
            "instance_type": "ml.p4d.24xlarge",
            "instance_count": 4,
            "availability_zone": "us-east-1c",
            **given,
        },
    )


def on_plan(ref: str = PLAN, **compute: Any) -> dict[str, Any]:
    return spec(compute={"training_plan": ref, **compute})


def refused(spec_doc: dict[str, Any]) -> SpecInvalid:
    with pytest.raises(SpecInvalid) as exc:
        register(spec_doc)
    ec2 = boto3.client("ec2", region_name=REGION)
    assert ec2.describe_vpcs(Filters=[{"Name": "tag-key", "Values": ["lustrain:job-id"]}])["Vpcs"] == []
    return exc.value


def paths(error: SpecInvalid) -> list[str]:
    return [e.path for e in error.errors]


def look(document: dict[str, Any], aws: Any) -> dict[str, Any]:
    answer = dumped(
        queue.take_place(
            document,
            quotas=boto3.client("service-quotas", region_name=REGION),
            sagemaker=boto3.client("sagemaker", region_name=REGION),
            ddb=boto3.client("dynamodb", region_name=REGION),
            settings=aws,
        )
    )
    document["quota"] = answer
    return answer


# --- checked before anything exists ----------------------------------------------------------------------------


def test_the_plan_is_found_by_name_or_arn_and_recorded_in_the_launch_plan(aws):
    arn = plan()
    for ref in (PLAN, arn):
        document = register(on_plan(ref), execution=f"run-{len(ref)}")
        found = document["job"]["launch"]["training_plan"]
        assert (found["arn"], found["status"], found["availability_zone"], found["instance_count"]) == (
            arn,
            "Active",
            "us-east-1c",
            4,
        )
        assert job_record(aws.jobs_table, document["job"]["job_id"])["launch"]["training_plan"]["arn"] == arn


def test_a_plan_that_does_not_exist_is_refused(aws):
    error = refused(on_plan("nobody-bought-this"))
    assert paths(error) == ["compute.training_plan"] and "ResourceNotFound" in error.message


@pytest.mark.parametrize("status", ["Expired", "Failed"])
def test_an_expired_or_failed_plan_is_refused(aws, status):
    plan(status=status)
    error = refused(on_plan())
    assert paths(error) == ["compute.training_plan"] and f"is {status}" in error.message


def test_a_plan_of_another_instance_type_is_refused(aws):
    plan(instance_type="ml.p5.48xlarge")
    error = refused(on_plan())
    assert paths(error) == ["compute.instance_type"] and "reserves ml.p5.48xlarge" in error.message


def test_more_instances_than_the_plan_reserves_are_refused(aws):
    plan(instance_count=2)
    error = refused(on_plan(instance_count=3))
    assert paths(error) == ["compute.instance_count"] and "at most 2" in error.message


def test_a_plan_that_ends_before_the_runtime_is_refused(aws):
    plan(hours=2)
    error = refused(on_plan(max_runtime_hours=3))
    assert paths(error) == ["compute.max_runtime_hours"]


def test_a_plan_that_starts_after_the_allowed_wait_is_refused(aws):
    plan(start=time.time() + 30 * 3600)
    error = refused(on_plan(max_queue_hours=24))
    assert paths(error) == ["compute.max_queue_hours"] and "raise it to at least 30" in error.message


def test_a_zone_other_than_the_plans_is_refused(aws):
    plan()
    error = refused({**on_plan(), "network": {"availability_zone": ["us-east-1b", "us-east-1d"]}})
    assert paths(error) == ["network.availability_zone"] and "us-east-1c (use1-az2)" in error.message


def test_a_plan_with_spot_is_refused_by_the_spec(aws):
    error = refused(on_plan(spot=True))
    assert paths(error) == ["compute"] and "spot does not apply" in error.message


# --- the queue, the network and the job ------------------------------------------------------------------------


def test_the_queue_admits_against_the_plan_not_the_on_demand_quota(aws):
    service_quotas.set_quota("ml.p4d.24xlarge", 0)  # no on-demand p4d at all
    plan()
    answer = look(register(on_plan(instance_count=4)), aws)
    assert answer["admitted"] is True
    assert (answer["quota_name"], answer["limit"], answer["available"]) == (f"training plan {PLAN}", 4, 4)
    assert answer["pool"] == f"ml.p4d.24xlarge#training-plan/{PLAN}"


def test_a_run_is_admitted_while_its_plan_is_scheduled_within_two_days_of_its_capacity_and_not_earlier(aws):
    plan(start=time.time() + 3 * DAY)
    first, second = (
        register(on_plan(instance_count=3, max_queue_hours=80)),
        register(on_plan(instance_count=2, max_queue_hours=80), execution="run-2"),
    )
    waiting = look(first, aws)  # 72 h ahead: a job created now would end InsufficientCapacityError after 48 h
    assert (waiting["admitted"], waiting["plan_status"], waiting["available"]) == (False, "Scheduled", 0)

    training_plans.shift(PLAN, -26 * HOUR)  # its capacity now starts in 46 h
    admitted = look(first, aws)
    assert (admitted["admitted"], admitted["plan_status"]) == (True, "Scheduled")
    assert admitted["capacity_start"] == plans._at(time.time() + 46 * HOUR) or admitted["capacity_start"] > (
        plans._at(time.time() + 45 * HOUR)
    )
    behind = look(second, aws)  # 3 of the 4 are held for the first run
    assert (behind["admitted"], behind["held"], behind["available"]) == (False, 3, 1)


def test_a_plan_that_expires_while_the_run_waits_ends_the_run(aws):
    plan(start=time.time() + 3 * DAY)
    document = register(on_plan(max_queue_hours=80))
    assert look(document, aws)["admitted"] is False
    training_plans.set_status(PLAN, "Expired")
    with pytest.raises(QuotaExceeded) as exc:
        look(document, aws)
    assert "the plan is Expired" in exc.value.message


def test_a_plan_for_hyperpod_clusters_only_is_refused_naming_what_it_targets(aws):
    plan(target_resources=["hyperpod-cluster"])
    error = refused(on_plan())
    assert paths(error) == ["compute.training_plan"]
    assert "targets hyperpod-cluster (TargetResources)" in error.message and "training-job" in error.message


def test_two_capacities_that_do_not_overlap_are_not_one_fleet(aws):
    now = time.time()
    plan(hours=10, capacities=[{"start": now + 20 * HOUR, "hours": 10}])  # 4 now, 4 more tomorrow
    error = refused(on_plan(instance_count=8, max_runtime_hours=5))
    assert paths(error) == ["compute.instance_count"] and "at most 4 x ml.p4d.24xlarge at once" in error.message


def test_two_capacities_that_overlap_carry_their_instances_together(aws):
    plan(hours=10, capacities=[{"start": time.time() - HOUR, "hours": 10}])
    found = register(on_plan(instance_count=8, max_runtime_hours=5))["job"]["launch"]["training_plan"]
    assert found["instance_count"] == 8


def test_a_runtime_longer_than_one_capacity_less_its_last_half_hour_is_refused(aws):
    now = time.time()
    plan(hours=10, capacities=[{"start": now + 10 * HOUR, "hours": 10}])  # back to back: still two capacities
    error = refused(on_plan(max_runtime_hours=9.75))
    assert paths(error) == ["compute.max_runtime_hours"]
    assert "at most 9.5 h in one go" in error.message and "30 minutes before its end" in error.message
    assert register(on_plan(max_runtime_hours=9.5))["job"]["launch"]["training_plan"]["instance_count"] == 4


def _request(document: dict[str, Any], aws: Any) -> dict[str, Any]:
    run = Run.parse(document)
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    runtime, _ = training.attempt_runtime(run, sagemaker, None, time.time())
    return request_from(run, "tiny-job-1", aws, runtime)


def test_max_runtime_is_capped_to_the_capacitys_usable_end(aws):
    plan(hours=10)
    document = training_input(on_plan(max_runtime_hours=9))
    training_plans.shift(PLAN, -2 * HOUR)  # the job starts 2 h into the capacity: 7.5 h usable left
    runtime = _request(document, aws)["StoppingCondition"]["MaxRuntimeInSeconds"]
    assert 7.5 * HOUR - 60 <= runtime <= 7.5 * HOUR


def test_max_runtime_is_the_training_time_whatever_the_wait_pending_for_the_capacity(aws):
    plan(start=time.time() + 5 * HOUR, hours=20)
    document = training_input(on_plan(max_runtime_hours=8))
    runtime = _request(document, aws)["StoppingCondition"]["MaxRuntimeInSeconds"]
    assert runtime == 8 * HOUR  # 5 h Pending first, which is not run time


def test_the_network_goes_to_the_plans_zone(aws):
    plan()
    net = invoke("create_network", register(on_plan()))
    assert net["availability_zone"] == "us-east-1c"


def test_the_training_job_carries_the_plans_arn(aws):
    arn = plan()
    document = training_input(on_plan())
    request = request_from(Run.parse(document), "tiny-job-1", aws)
    assert request["ResourceConfig"]["TrainingPlanArn"] == arn


# --- the twin's SageMaker -------------------------------------------------------------------------------------


def test_the_twin_answers_a_missing_plan_resource_not_found(aws):
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    with pytest.raises(sagemaker.exceptions.ResourceNotFound):
        sagemaker.describe_training_plan(TrainingPlanName="nobody-bought-this")


def test_the_twin_refuses_a_job_outside_the_plans_zone(aws):
    arn = plan()
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.0.0/20", AvailabilityZone="us-east-1b")["Subnet"][
        "SubnetId"
    ]
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    with pytest.raises(sagemaker.exceptions.ClientError) as exc:
        sagemaker.create_training_job(
            TrainingJobName="on-plan",
            RoleArn=aws.sagemaker_role_arn,
            AlgorithmSpecification={
                "TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/x:1",
                "TrainingInputMode": "File",
            },
            OutputDataConfig={"S3OutputPath": "s3://lustrain-test-results/x/"},
            ResourceConfig={"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2, "TrainingPlanArn": arn},
            VpcConfig={"Subnets": [subnet], "SecurityGroupIds": ["sg-0123456789abcdef0"]},
            StoppingCondition={"MaxRuntimeInSeconds": 3600},
        )
    assert exc.value.response["Error"]["Code"] == "ValidationException"
    assert "reserves its capacity in us-east-1c" in exc.value.response["Error"]["Message"]


def test_the_twin_refuses_a_job_on_a_plan_for_hyperpod_clusters(aws):
    arn = plan(target_resources=["hyperpod-cluster"])
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    with pytest.raises(sagemaker.exceptions.ClientError) as exc:
        sagemaker.create_training_job(
            TrainingJobName="on-hyperpod-plan",
            RoleArn=aws.sagemaker_role_arn,
            AlgorithmSpecification={
                "TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/x:1",
                "TrainingInputMode": "File",
            },
            OutputDataConfig={"S3OutputPath": "s3://lustrain-test-results/x/"},
            ResourceConfig={"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2, "TrainingPlanArn": arn},
            StoppingCondition={"MaxRuntimeInSeconds": 3600},
        )
    assert exc.value.response["Error"]["Code"] == "ValidationException"
    assert "targets hyperpod-cluster" in exc.value.response["Error"]["Message"]


def test_the_twin_counts_the_instances_of_the_capacities_active_now(aws):
    plan(hours=10, capacities=[{"start": time.time() + 20 * HOUR, "hours": 10, "instance_count": 6}])
    described = boto3.client("sagemaker", region_name=REGION).describe_training_plan(TrainingPlanName=PLAN)
    assert (described["TotalInstanceCount"], described["AvailableInstanceCount"]) == (10, 4)
    assert [c["Status"] for c in described["ReservedCapacitySummaries"]] == ["Active", "Scheduled"]
    training_plans.shift(PLAN, -15 * HOUR)  # between the two: the plan is Scheduled again
    described = boto3.client("sagemaker", region_name=REGION).describe_training_plan(TrainingPlanName=PLAN)
    assert (described["Status"], described["AvailableInstanceCount"]) == ("Scheduled", 0)


def test_the_twin_authorizes_a_job_on_a_plan_against_its_reserved_capacity(aws):
    arn = plan()
    params = {"TrainingJobName": "j", "ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "TrainingPlanArn": arn}}
    call = actions.Call("sagemaker", "CreateTrainingJob", params, REGION, "123456789012")
    found = actions.resources_of(actions.sar_action("sagemaker:CreateTrainingJob"), call)
    assert f"arn:aws:sagemaker:{REGION}:123456789012:reserved-capacity/{PLAN}-1" in found
    assert arn in found


def test_the_twin_gives_a_job_on_a_plan_its_capacitys_end_in_seconds(aws):
    start = time.time()
    arn = plan(start=start, hours=10)
    request = {"ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "TrainingPlanArn": arn}}
    assert training_plans.capacity_environment(request) == {
        "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP": str(int(start + 10 * HOUR))
    }
    assert training_plans.capacity_environment({"ResourceConfig": {"InstanceType": "ml.p4d.24xlarge"}}) == {}
