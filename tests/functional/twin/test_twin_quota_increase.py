"""RequestServiceQuotaIncrease on the twin: applied at once, refused as AWS refuses; the account-wide training quotas
listed by their AWS names, following the type quotas a user raised unless applied themselves, and enforced by
CreateTrainingJob as SageMaker enforces them (ResourceLimitExceeded, in its words)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError
from twinhelpers import ACCOUNT, REGION, client, role_arn

from lustrain.twin import faults, simulator
from lustrain.twin.patches import service_quotas
from lustrain.twin.simulator.job import SimulatedJob

pytestmark = pytest.mark.usefixtures("moto_twin")

ACROSS_ALL = "Number of instances across all training jobs"
PER_JOB = "Maximum number of instances per training job"


def listed() -> dict[str, dict[str, object]]:
    pages = client("service-quotas").get_paginator("list_service_quotas").paginate(ServiceCode="sagemaker")
    return {str(q["QuotaName"]): q for page in pages for q in page["Quotas"]}


def test_the_account_wide_training_quotas_are_listed_with_aws_defaults() -> None:
    quotas = listed()
    assert {name: quotas[name]["Value"] for name in service_quotas.ACCOUNT_WIDE} == {
        ACROSS_ALL: 4.0,
        "Number of instances across all spot training jobs": 4.0,
        PER_JOB: 20.0,
        "Maximum number of instances per spot training job": 20.0,
        "Longest run time for a training job": 432_000.0,
    }


def test_a_raised_type_quota_raises_the_account_wide_instance_quotas_unless_they_were_applied() -> None:
    service_quotas.set_quota("ml.p4d.24xlarge", 30, REGION)
    service_quotas.set_quota("ml.g5.2xlarge", 6, REGION)
    quotas = listed()
    assert (quotas[ACROSS_ALL]["Value"], quotas[PER_JOB]["Value"]) == (36.0, 30.0)
    service_quotas.set_account_quota(ACROSS_ALL, 10, REGION)
    assert listed()[ACROSS_ALL]["Value"] == 10.0


def test_an_increase_not_above_the_current_value_is_refused_as_aws_refuses_it() -> None:
    code = service_quotas.set_quota("ml.p4d.24xlarge", 4, REGION)
    with pytest.raises(ClientError) as raised:
        client("service-quotas").request_service_quota_increase(
            ServiceCode="sagemaker", QuotaCode=code, DesiredValue=4
        )
    error = raised.value.response["Error"]
    assert error["Code"] == "IllegalArgumentException"
    assert error["Message"] == "You must provide a quota value greater than the current quota value"


def test_an_increase_of_an_unknown_quota_or_request_is_no_such_resource() -> None:
    quotas = client("service-quotas")
    with pytest.raises(ClientError) as raised:
        quotas.request_service_quota_increase(ServiceCode="sagemaker", QuotaCode="L-NOPE0000", DesiredValue=4)
    assert raised.value.response["Error"]["Code"] == "NoSuchResourceException"
    with pytest.raises(ClientError) as raised:
        quotas.get_requested_service_quota_change(RequestId="0" * 32)
    assert raised.value.response["Error"]["Code"] == "NoSuchResourceException"


def test_an_approved_increase_is_what_the_quota_then_reads_and_sagemaker_enforces() -> None:
    quotas = client("service-quotas")
    code = service_quotas.set_quota("ml.p4d.24xlarge", 1, REGION)
    answer = quotas.request_service_quota_increase(ServiceCode="sagemaker", QuotaCode=code, DesiredValue=3)
    change = answer["RequestedQuota"]
    assert (change["QuotaName"], change["Status"], change["QuotaRequestedAtLevel"]) == (
        "ml.p4d.24xlarge for training job usage",
        "APPROVED",
        "ACCOUNT",
    )
    assert quotas.get_service_quota(ServiceCode="sagemaker", QuotaCode=code)["Quota"]["Value"] == 3.0
    # the twin's SageMaker reads the applied quota too (patches/sagemaker.py)
    from lustrain.twin.patches import sagemaker

    assert sagemaker._quota_value("123456789012", REGION, "ml.p4d.24xlarge", False) == (
        "ml.p4d.24xlarge for training job usage",
        3.0,
    )


# --- the account-wide quotas at CreateTrainingJob -------------------------------------------------------------------

LONGEST_RUN = "Longest run time for a training job"


@pytest.fixture
def sagemaker() -> Iterator[Any]:
    """The twin's SageMaker, its jobs starting at once and forgotten after the test."""
    previous = simulator.settings()
    simulator.configure(start_delay_s=0.05)
    yield client("sagemaker")
    simulator.reset()
    faults.clear()
    simulator.configure(**dataclasses.asdict(previous))


def training_job(
    name: str, instance_type: str = "ml.m5.xlarge", count: int = 1, **changes: Any
) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": role_arn("quota-test-sagemaker", service="sagemaker.amazonaws.com"),
        "AlgorithmSpecification": {
            "TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8-cpu-py312",
            "TrainingInputMode": "File",
        },
        "OutputDataConfig": {"S3OutputPath": "s3://quota-test/results/"},
        "ResourceConfig": {"InstanceType": instance_type, "InstanceCount": count, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        **changes,
    }


def holding(sagemaker: Any, name: str, instance_type: str = "ml.m5.xlarge", count: int = 1) -> None:
    """A job that holds its instances InProgress until the test ends (the `silent` fault: it never gets further)."""
    faults.inject("start_training", "silent")
    sagemaker.create_training_job(**training_job(name, instance_type, count))
    assert sagemaker.describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "InProgress"


def refusal(sagemaker: Any, request: dict[str, Any]) -> str:
    with pytest.raises(ClientError) as raised:
        sagemaker.create_training_job(**request)
    error = raised.value.response["Error"]
    assert error["Code"] == "ResourceLimitExceeded"
    return str(error["Message"])


AWS_TAIL = (
    "Please use AWS Service Quotas to request an increase for this quota. If AWS Service Quotas is not available, "
    "contact AWS support to request an increase for this quota."
)


def test_instances_of_every_type_count_against_the_quota_across_all_training_jobs(sagemaker: Any) -> None:
    service_quotas.set_account_quota(ACROSS_ALL, 3, REGION)
    holding(sagemaker, "holds-two-m5", count=2)
    message = refusal(sagemaker, training_job("wants-two-c5", "ml.c5.xlarge", 2))
    assert message == (
        f"The account-level service limit '{ACROSS_ALL}' is 3 Instances, with current utilization of 2 Instances "
        f"and a request delta of 2 Instances. {AWS_TAIL}"
    )
    faults.inject("start_training", "silent")
    sagemaker.create_training_job(**training_job("fits-one-c5", "ml.c5.xlarge", 1))  # 2 + 1 fit in 3


def test_spot_jobs_count_against_the_spot_quota_across_all_only(sagemaker: Any) -> None:
    service_quotas.set_account_quota(ACROSS_ALL, 2, REGION)
    holding(sagemaker, "on-demand-two", count=2)
    spot = {
        "EnableManagedSpotTraining": True,
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200},
        "CheckpointConfig": {"S3Uri": "s3://quota-test/checkpoints/"},
    }
    faults.inject("start_training", "silent")
    sagemaker.create_training_job(**training_job("spot-four", count=4, **spot))  # the spot quota's 4 are free
    message = refusal(sagemaker, training_job("spot-one-more", count=1, **spot))
    assert (
        "'Number of instances across all spot training jobs' is 4 Instances, with current utilization of 4"
        in message
    )


def test_an_available_warm_pool_counts_unless_the_job_takes_it_over(sagemaker: Any) -> None:
    from moto.sagemaker.models import sagemaker_backends

    from lustrain.twin.patches import sagemaker as twin_sagemaker

    service_quotas.set_account_quota(ACROSS_ALL, 3, REGION)
    pooled = training_job("pooled", count=2)
    pooled["ResourceConfig"]["KeepAlivePeriodInSeconds"] = 600
    ended = SimulatedJob(
        request=pooled,
        arn=f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/pooled",
        account=ACCOUNT,
        region=REGION,
    )
    ended.pool_granted = True
    ended.training_start_time = ended.creation_time
    ended._move("Completed", "Completed")
    twin_sagemaker._state(sagemaker_backends[ACCOUNT][REGION]).jobs["pooled"] = ended
    assert (
        sagemaker.describe_training_job(TrainingJobName="pooled")["WarmPoolStatus"]["Status"] == "Available"
    )

    message = refusal(sagemaker, training_job("other-shape", "ml.c5.xlarge", 2))
    assert (
        "is 3 Instances, with current utilization of 2 Instances and a request delta of 2 Instances"
        in message
    )
    taker = training_job("same-shape", count=2)
    taker["ResourceConfig"]["KeepAlivePeriodInSeconds"] = 600
    faults.inject("start_training", "silent")
    sagemaker.create_training_job(**taker)  # the pool's 2 instances move to it
    assert sagemaker.describe_training_job(TrainingJobName="pooled")["WarmPoolStatus"]["Status"] == "Reused"


def test_more_instances_than_the_quota_per_training_job_are_refused(sagemaker: Any) -> None:
    service_quotas.set_quota("ml.m5.xlarge", 40, REGION)  # the type and across-all quotas leave room for 40
    service_quotas.set_account_quota(PER_JOB, 8, REGION)
    assert refusal(sagemaker, training_job("nine", count=9)) == (
        f"The account-level service limit '{PER_JOB}' is 8 Instances, with current utilization of 0 Instances and "
        f"a request delta of 9 Instances. {AWS_TAIL}"
    )


def test_a_max_runtime_above_the_longest_run_time_is_refused(sagemaker: Any) -> None:
    six_days = 6 * 24 * 3600
    message = refusal(
        sagemaker, training_job("six-days", StoppingCondition={"MaxRuntimeInSeconds": six_days})
    )
    assert message.startswith(
        f"The account-level service limit '{LONGEST_RUN}' is 432000 Seconds, with current utilization of 0 Seconds "
        f"and a request delta of {six_days} Seconds."
    )
    service_quotas.set_account_quota(LONGEST_RUN, 28 * 24 * 3600, REGION)
    faults.inject("start_training", "silent")
    sagemaker.create_training_job(
        **training_job("six-days", StoppingCondition={"MaxRuntimeInSeconds": six_days})
    )


def test_raising_a_types_quota_is_enough_to_run_that_many_of_it(sagemaker: Any) -> None:
    """`lustrain local up --quota`: the account-wide defaults (4 across all jobs) follow a raised type quota."""
    service_quotas.set_quota("ml.p4d.24xlarge", 8, REGION)
    holding(sagemaker, "eight-p4d", "ml.p4d.24xlarge", 8)
