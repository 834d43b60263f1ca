"""What each kind of resource bills an hour while it exists (lustrain_core.resources, `lustrain leftovers`): read
from the fields its describe call returns as botocore's models define them, at the price table's list prices."""

from __future__ import annotations

import botocore.session
import pytest
from lustrain_core import resources as registry
from lustrain_core.leftovers import Leftover, Report, exit_code
from lustrain_core.prices import PriceTable

PRICES = PriceTable()
P4D = PRICES.instance_types["ml.p4d.24xlarge"].hourly_usd
MODELS = botocore.session.get_session()


def shape_has(service: str, shape: str, path: str) -> bool:
    """Whether a dotted path of fields exists under a botocore shape."""
    found = MODELS.get_service_model(service).shape_for(shape)
    for key in path.split("."):
        if key not in found.members:
            return False
        found = found.members[key]
    return True


@pytest.mark.parametrize(
    ("service", "shape", "path"),
    [
        ("sagemaker", "DescribeTrainingJobResponse", "ResourceConfig.InstanceType"),
        ("sagemaker", "DescribeTrainingJobResponse", "ResourceConfig.InstanceCount"),
        ("sagemaker", "DescribeTrainingJobResponse", "EnableManagedSpotTraining"),
        ("sagemaker", "DescribeTrainingJobResponse", "WarmPoolStatus.ResourceRetainedBillableTimeInSeconds"),
        ("sagemaker", "DescribeProcessingJobResponse", "ProcessingResources.ClusterConfig.InstanceType"),
        ("sagemaker", "DescribeProcessingJobResponse", "ProcessingResources.ClusterConfig.InstanceCount"),
        ("fsx", "FileSystem", "StorageCapacity"),
        ("fsx", "FileSystem", "LustreConfiguration.DeploymentType"),
        ("fsx", "FileSystem", "LustreConfiguration.PerUnitStorageThroughput"),
        ("ec2", "VpcEndpoint", "VpcEndpointType"),
        ("ec2", "VpcEndpoint", "SubnetIds"),
    ],
)
def test_each_price_reads_a_field_its_service_returns(service, shape, path):
    assert shape_has(service, shape, path)


def test_a_training_job_bills_its_instances_and_spot_its_planned_fraction():
    job = {"ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2}}
    assert registry.TRAINING_JOB.hourly_usd(job, PRICES) == pytest.approx(2 * P4D)
    spot = {**job, "EnableManagedSpotTraining": True}
    assert registry.TRAINING_JOB.hourly_usd(spot, PRICES) == pytest.approx(2 * P4D * PRICES.spot_price_fraction)
    # a warm pool bills the instances it keeps, at the training price
    assert registry.WARM_POOL.hourly_usd({**job, "WarmPoolStatus": {"Status": "Available"}}, PRICES) == pytest.approx(
        2 * P4D
    )


def test_a_processing_job_bills_its_cluster():
    job = {"ProcessingResources": {"ClusterConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 3}}}
    assert registry.PROCESSING_JOB.hourly_usd(job, PRICES) == pytest.approx(3 * P4D)


def test_a_file_system_bills_its_capacity_at_its_tier_and_an_unpriced_one_is_unknown():
    fs = {"StorageCapacity": 2400, "LustreConfiguration": {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 250}}
    expected = 2400 * 2**30 / 1e9 * PRICES.fsx_gb_month_usd[("PERSISTENT_2", 250)] / PRICES.hours_per_month
    assert registry.FILE_SYSTEM.hourly_usd(fs, PRICES) == pytest.approx(expected)
    scratch = {"StorageCapacity": 1200, "LustreConfiguration": {"DeploymentType": "SCRATCH_2"}}
    assert registry.FILE_SYSTEM.hourly_usd(scratch, PRICES) == pytest.approx(
        1200 * 2**30 / 1e9 * PRICES.fsx_gb_month_usd[("SCRATCH_2", 200)] / PRICES.hours_per_month
    )
    odd = {"StorageCapacity": 1200, "LustreConfiguration": {"DeploymentType": "PERSISTENT_1", "PerUnitStorageThroughput": 50}}
    assert registry.FILE_SYSTEM.hourly_usd(odd, PRICES) is None


def test_an_interface_endpoint_bills_per_zone_and_a_gateway_endpoint_nothing():
    interface = {"VpcEndpointType": "Interface", "SubnetIds": ["subnet-a", "subnet-b"]}
    assert registry.VPC_ENDPOINT.hourly_usd(interface, PRICES) == pytest.approx(2 * PRICES.interface_endpoint_az_hour_usd)
    assert registry.VPC_ENDPOINT.hourly_usd({"VpcEndpointType": "Gateway", "SubnetIds": []}, PRICES) == 0.0


@pytest.mark.parametrize("kind", [registry.VPC, registry.SUBNET, registry.SECURITY_GROUP, registry.ROUTE_TABLE,
                                  registry.DATA_REPOSITORY_ASSOCIATION, registry.IAM_ROLE], ids=lambda k: k.name)
def test_the_free_kinds_bill_nothing(kind):
    assert kind.hourly_usd({}, PRICES) == 0.0


def test_an_instance_type_with_no_price_is_unknown_and_counts_as_billing():
    job = {"ResourceConfig": {"InstanceType": "ml.unpriced.48xlarge", "InstanceCount": 1}}
    assert registry.TRAINING_JOB.hourly_usd(job, PRICES) is None

    def left(hourly: float | None, kind: str = "training_job") -> Leftover:
        return Leftover("j", "run", "RUNNING", kind, "x", "InProgress", hourly, kept=False, note="")

    assert left(None).bills and left(1.0).bills and not left(0.0, "vpc").bills
    assert exit_code(Report("s", "2026-11-01", [left(0.0, "vpc")])) == 0
    assert exit_code(Report("s", "2026-11-01", [left(0.0, "vpc"), left(None)])) == 1
    assert Report("s", "2026-11-01", [left(0.0, "vpc"), left(None)]).hourly_usd is None
    assert Report("s", "2026-11-01", [left(0.5), left(0.25)]).hourly_usd == 0.75
