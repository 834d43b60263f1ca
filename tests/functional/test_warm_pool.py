"""Warm pools (compute.keep_alive_minutes) on moto and the twin: what is refused before anything exists, the kept
network reused only by a run of the same shape and only once, and the network gone when the pool ends."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from infra_support import REGION, count_of_job, invoke, job_record, register, spec, torn_down
from lustrain_core.config import Settings
from lustrain_core.errors import QuotaExceeded, SpecInvalid
from lustrain_core.steps import records, warm_pool

from lustrain.twin import faults
from lustrain.twin.patches import fsx as twin_fsx
from lustrain.twin.patches import service_quotas

NETWORK_GONE = {"vpcs": 0, "subnets": 0, "security_groups": 0, "route_tables": 0, "endpoints": 0}
POOL = {"keep_alive_minutes": 10}


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    monkeypatch.setenv("LUSTRAIN_TEARDOWN_POLL_SECONDS", "0.01")
    faults.clear()
    twin_fsx.configure(polls=2)


class PoolStatuses:
    """SageMaker as teardown reads a pool: DescribeTrainingJob's WarmPoolStatus of each named job (set by the test)
    and the run's tags; every job has ended."""

    def __init__(self, stack_name: str) -> None:
        self.stack_name = stack_name
        self.pools: dict[str, dict[str, Any]] = {}
        self.tags: dict[str, str] = {}

    def describe_training_job(self, TrainingJobName: str) -> dict[str, Any]:
        described = {
            "TrainingJobName": TrainingJobName,
            "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:123456789012:training-job/{TrainingJobName}",
            "TrainingJobStatus": "Completed",
        }
        if TrainingJobName in self.pools:
            described["WarmPoolStatus"] = self.pools[TrainingJobName]
        return described

    def list_tags(self, ResourceArn: str) -> dict[str, Any]:
        job_id = self.tags[ResourceArn.rsplit("/", 1)[1]]
        return {
            "Tags": [
                {"Key": "lustrain:job-id", "Value": job_id},
                {"Key": "lustrain:created-by", "Value": self.stack_name},
            ]
        }


def networked(compute: dict[str, Any] | None = None, execution: str = "run-1") -> dict[str, Any]:
    document = register(spec(compute={**POOL, **(compute or {})}), execution=execution)
    document["network"] = invoke("create_network", document)
    return document


def trained(settings: Settings, document: dict[str, Any], sagemaker: PoolStatuses) -> str:
    """The run's training job, in its ledger as start_training records it."""
    job_id = document["job"]["job_id"]
    name = f"{document['job']['spec']['name']}-{job_id[:8]}-1"
    ddb = boto3.client("dynamodb", region_name=REGION)
    records.add_resources(ddb, settings.jobs_table, job_id, [{"type": "training_job", "id": name}])
    sagemaker.tags[name] = job_id
    return name


def tear_down(settings: Settings, job_id: str, sagemaker: PoolStatuses) -> dict[str, Any]:
    """The run's teardown (the sweeper calls the same for a finished run whose resources are left)."""
    return torn_down(settings, job_id, sagemaker)


# --------------------------------------------------------------------------- refusals


def test_a_warm_pool_with_spot_is_refused_before_anything_exists(aws):
    with pytest.raises(SpecInvalid) as exc:
        register(spec(compute={"spot": True, "max_wait_hours": 30, "keep_alive_minutes": 5}))
    assert [e.path for e in exc.value.errors] == ["compute"]
    assert "keep_alive_minutes (a warm pool) cannot be used with spot" in exc.value.errors[0].message
    assert boto3.client("dynamodb", region_name=REGION).scan(TableName=aws.jobs_table)["Items"] == []


@pytest.mark.parametrize("minutes", [61, -1, 360])
def test_a_keep_alive_outside_the_guides_0_to_60_minutes_is_refused(aws, minutes):
    # botocore's model takes up to 21600 s; the SageMaker guide allows 3600 s
    with pytest.raises(SpecInvalid) as exc:
        register(spec(compute={"keep_alive_minutes": minutes}))
    assert [(e.path, e.value) for e in exc.value.errors] == [("compute.keep_alive_minutes", minutes)]


def test_the_warm_pool_quotas_default_of_0_refuses_the_run_with_the_command_to_ask_for_more(aws):
    service_quotas.set_quota("ml.p4d.24xlarge", 8)
    with pytest.raises(QuotaExceeded) as exc:
        invoke("check_quota", register(spec(compute=POOL)))
    code = service_quotas.set_quota("ml.p4d.24xlarge", 0, warm_pool=True)
    assert "the quota 'ml.p4d.24xlarge for training warm pool usage' is 0" in exc.value.message
    assert "compute.keep_alive_minutes=10" in exc.value.message
    assert f"--quota-code {code} --desired-value 2 --region us-east-1" in exc.value.message


def test_a_warm_pool_quota_that_holds_the_instances_admits_the_run(aws):
    service_quotas.set_quota("ml.p4d.24xlarge", 8)
    service_quotas.set_quota("ml.p4d.24xlarge", 2, warm_pool=True)
    assert invoke("check_quota", register(spec(compute=POOL)))["admitted"] is True


def test_the_job_asks_sagemaker_to_keep_its_instances(aws):
    from lustrain_core.steps.training import build_training_request
    from training_support import training_input

    document = training_input(spec(compute=POOL))
    request = build_training_request(document, training_job_name="t-1", settings=aws)
    assert request["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 600
    plain = build_training_request(training_input(), training_job_name="t-2", settings=aws)
    assert "KeepAlivePeriodInSeconds" not in plain["ResourceConfig"]


# --------------------------------------------------------------------------- reuse and teardown


def test_the_kept_network_goes_only_to_the_next_run_of_the_same_shape_and_only_once(aws):
    sagemaker = PoolStatuses(aws.stack_name)
    first = networked()
    first_id = first["job"]["job_id"]
    job = trained(aws, first, sagemaker)
    sagemaker.pools[job] = {"Status": "Available", "ResourceRetainedBillableTimeInSeconds": 5}
    result = tear_down(aws, first_id, sagemaker)
    kept = {(r["type"], r["id"]) for r in result["kept"]}
    assert ("subnet", first["network"]["subnet_id"]) in kept and result["remaining"] == []
    assert count_of_job(first_id)["subnets"] == 1

    other_shape = networked({"instance_count": 3}, execution="run-2")
    assert other_shape["network"]["subnet_id"] != first["network"]["subnet_id"]
    assert other_shape["network"]["created"] is True

    same_shape = networked(execution="run-3")
    assert same_shape["network"]["subnet_id"] == first["network"]["subnet_id"]
    assert same_shape["network"]["security_group_ids"] == first["network"]["security_group_ids"]
    assert same_shape["network"]["created"] is False
    # a retried create_network of the claiming run finds its claim
    assert invoke("create_network", same_shape)["subnet_id"] == first["network"]["subnet_id"]

    late = networked(execution="run-4")
    assert late["network"]["subnet_id"] != first["network"]["subnet_id"]


def test_the_kept_network_is_deleted_when_the_pool_ends_and_nothing_is_left(aws):
    sagemaker = PoolStatuses(aws.stack_name)
    first = networked()
    first_id = first["job"]["job_id"]
    job = trained(aws, first, sagemaker)
    sagemaker.pools[job] = {"Status": "Available"}
    tear_down(aws, first_id, sagemaker)

    second = networked(execution="run-2")  # takes the pool's network
    second_job = trained(aws, second, sagemaker)
    sagemaker.pools[job] = {"Status": "Reused", "ReusedByJob": second_job}
    sagemaker.pools[second_job] = {"Status": "InUse"}
    assert (
        tear_down(aws, first_id, sagemaker)["deleted"] == []
    )  # the sweeper's look while the second run trains
    assert count_of_job(first_id)["subnets"] == 1

    sagemaker.pools[second_job] = {"Status": "Available"}
    second_result = tear_down(aws, second["job"]["job_id"], sagemaker)
    assert second_result["deleted"] == []  # the network is the first run's: the second never deletes it
    assert count_of_job(first_id)["subnets"] == 1

    sagemaker.pools[second_job] = {"Status": "Terminated", "ResourceRetainedBillableTimeInSeconds": 600}
    result = tear_down(aws, first_id, sagemaker)
    assert {k: v for k, v in count_of_job(first_id).items() if k in NETWORK_GONE} == NETWORK_GONE
    assert (result["kept"], result["remaining"]) == ([], [])
    assert job_record(aws.jobs_table, first_id)["resources"] == []
    # the pool's offer went with it: the next run of the shape builds its own network
    assert networked(execution="run-5")["network"]["created"] is True


def test_a_run_whose_pool_sagemaker_did_not_keep_deletes_its_network_at_once(aws):
    sagemaker = PoolStatuses(aws.stack_name)
    first = networked()
    job = trained(aws, first, sagemaker)
    sagemaker.pools[job] = {"Status": "Terminated", "ResourceRetainedBillableTimeInSeconds": 0}
    tear_down(aws, first["job"]["job_id"], sagemaker)
    assert {
        k: v for k, v in count_of_job(first["job"]["job_id"]).items() if k in NETWORK_GONE
    } == NETWORK_GONE
    offer = boto3.client("dynamodb", region_name=REGION).get_item(
        TableName=aws.queue_table,
        Key={
            "pool_name": {
                "S": warm_pool.OFFER_PREFIX
                + job_record(aws.jobs_table, first["job"]["job_id"])["warm_pool_shape"]
            }
        },
    )
    assert "offer" not in offer.get("Item", {})


# --------------------------------------------------------------------------- what a pool costs and holds


def test_the_pools_kept_time_is_in_the_estimate_and_set_aside_from_each_attempts_budget(aws):
    from lustrain_core.document import Run
    from lustrain_core.prices import INSTANCE_TYPES
    from lustrain_core.steps.budget import attempt_budget, billed_seconds

    hourly = INSTANCE_TYPES["ml.p4d.24xlarge"].hourly_usd
    pooled = register(spec(compute={"keep_alive_minutes": 30}, budget={"max_usd": 2000}))
    plain = register(spec(budget={"max_usd": 2000}), execution="run-2")
    pool_cost = pooled["job"]["plan"]["cost"]
    assert pool_cost["warm_pool_usd"] == round(2 * hourly * 0.5, 2)
    assert pool_cost["total_usd"] == pytest.approx(
        plain["job"]["plan"]["cost"]["total_usd"] + 2 * hourly * 0.5, abs=0.02
    )
    with_pool = attempt_budget(Run.parse(pooled), 0.0, aws)
    without = attempt_budget(Run.parse(plain), 0.0, aws)
    assert with_pool is not None and without is not None
    assert without.left_usd - with_pool.left_usd == pytest.approx(pool_cost["warm_pool_usd"], abs=0.02)
    # SageMaker bills the pool's retained time like training time (x InstanceCount, which the price applies)
    described = {
        "BillableTimeInSeconds": 100,
        "WarmPoolStatus": {"Status": "Reused", "ResourceRetainedBillableTimeInSeconds": 40},
    }
    assert billed_seconds(described) == 140


class Pools:
    """SageMaker's jobs for the quota's count: none running, some with an Available warm pool."""

    def __init__(self, pools: dict[str, int]) -> None:
        self.pools = pools

    def get_paginator(self, operation: str) -> Any:
        pools = self.pools

        class Pages:
            def paginate(
                self, StatusEquals: str | None = None, WarmPoolStatusEquals: str | None = None
            ) -> Any:
                listed = list(pools) if WarmPoolStatusEquals == "Available" else []
                yield {"TrainingJobSummaries": [{"TrainingJobName": n} for n in listed]}

        return Pages()

    def describe_training_job(self, TrainingJobName: str) -> dict[str, Any]:
        return {
            "TrainingJobName": TrainingJobName,
            "TrainingJobStatus": "Completed",
            "ResourceConfig": {
                "InstanceType": "ml.p4d.24xlarge",
                "InstanceCount": self.pools[TrainingJobName],
            },
            "WarmPoolStatus": {"Status": "Available"},
        }


def test_pool_instances_count_against_the_quota_but_a_pool_the_run_takes_over_does_not(aws):
    from lustrain_core.document import Run
    from lustrain_core.steps import quota

    service_quotas.set_quota("ml.p4d.24xlarge", 4)
    service_quotas.set_quota("ml.p4d.24xlarge", 4, warm_pool=True)
    job = Run.parse(register(spec(compute=POOL))).job
    quotas = boto3.client("service-quotas", region_name=REGION)
    kept = quota.measure(job, quotas=quotas, sagemaker=Pools({"other-1": 3}), settings=aws)
    assert (kept["in_use"], kept["available"]) == (3, 1)
    taken = quota.measure(job, quotas=quotas, sagemaker=Pools({"same-shape-1": 2}), settings=aws, reusable=2)
    assert (taken["in_use"], taken["available"]) == (0, 4)
