"""compute.training_plan on the twin: the run checked against its plan before anything exists (each refusal naming its
field), admitted against the plan's instances instead of the on-demand quota and only once the plan is Active, its
network in the plan's zone, and its training job carrying TrainingPlanArn."""

from __future__ import annotations

import time
from typing import Any

import boto3
import pytest
from infra_support import REGION, invoke, job_record, register, spec
from lustrain_core.aws_requests import training_job as request_from
from lustrain_core.document import Run, dumped
from lustrain_core.errors import QuotaExceeded, SpecInvalid
from lustrain_core.steps import queue
from training_support import training_input

from lustrain.twin import training_plans
from lustrain.twin.patches import service_quotas

PLAN = "reserved-p4d"


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


def test_a_run_waits_until_its_plan_is_active_and_its_instances_are_free(aws):
    plan(start=time.time() + 3600)
    first, second = (
        register(on_plan(instance_count=3)),
        register(on_plan(instance_count=2), execution="run-2"),
    )
    waiting = look(first, aws)
    assert (waiting["admitted"], waiting["plan_status"], waiting["available"]) == (False, "Scheduled", 0)

    training_plans.set_status(PLAN, "Active")  # its start time came
    assert look(first, aws)["admitted"] is True
    behind = look(second, aws)  # 3 of the 4 are held for the first run
    assert (behind["admitted"], behind["held"], behind["available"]) == (False, 3, 1)


def test_a_plan_that_expires_while_the_run_waits_ends_the_run(aws):
    plan(start=time.time() + 3600)
    document = register(on_plan())
    assert look(document, aws)["admitted"] is False
    training_plans.set_status(PLAN, "Expired")
    with pytest.raises(QuotaExceeded) as exc:
        look(document, aws)
    assert "the plan is Expired" in exc.value.message


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
