"""Service Quotas knows SageMaker's training quotas, pages like AWS, and takes values from the twin."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError
from twinhelpers import REGION, client

from lustrain.twin import faults
from lustrain.twin.patches import service_quotas

pytestmark = pytest.mark.usefixtures("moto_twin")

P4D = "ml.p4d.24xlarge for training job usage"


def all_pages(**kwargs: object) -> list[dict[str, object]]:
    return list(client("service-quotas").get_paginator("list_service_quotas").paginate(**kwargs))


def find_by_name(name: str) -> dict[str, object]:
    """What check_quota does: walk every page of ListServiceQuotas for the quota's name."""
    quotas = [q for page in all_pages(ServiceCode="sagemaker") for q in page["Quotas"]]
    return next(q for q in quotas if q["QuotaName"] == name)


def test_sagemaker_training_quotas_are_listed_by_aws_names_across_pages() -> None:
    pages = all_pages(ServiceCode="sagemaker")

    names = [q["QuotaName"] for page in pages for q in page["Quotas"]]
    assert len(pages) > 1, "a caller that ignores NextToken must miss quotas, as on AWS"
    assert P4D not in [q["QuotaName"] for q in pages[0]["Quotas"]]
    for instance_type in ("ml.p4d.24xlarge", "ml.m5.xlarge", "ml.c5.xlarge"):
        assert f"{instance_type} for training job usage" in names
        assert f"{instance_type} for spot training job usage" in names
    p4d = find_by_name(P4D)
    assert p4d["ServiceCode"] == "sagemaker"
    assert str(p4d["QuotaCode"]).startswith("L-")
    assert p4d["QuotaArn"] == f"arn:aws:servicequotas:{REGION}:123456789012:sagemaker/{p4d['QuotaCode']}"


def test_max_results_sizes_the_pages() -> None:
    pages = all_pages(ServiceCode="sagemaker", PaginationConfig={"PageSize": 7})

    assert [len(p["Quotas"]) for p in pages[:-1]] == [7] * (len(pages) - 1)
    assert 1 <= len(pages[-1]["Quotas"]) <= 7


def test_set_quota_changes_the_applied_value_not_the_aws_default() -> None:
    code = find_by_name(P4D)["QuotaCode"]
    quotas = client("service-quotas")
    assert quotas.get_service_quota(ServiceCode="sagemaker", QuotaCode=code)["Quota"]["Value"] == 0.0

    assert service_quotas.set_quota("ml.p4d.24xlarge", 8, REGION) == code

    assert quotas.get_service_quota(ServiceCode="sagemaker", QuotaCode=code)["Quota"]["Value"] == 8.0
    assert find_by_name(P4D)["Value"] == 8.0
    default = quotas.get_aws_default_service_quota(ServiceCode="sagemaker", QuotaCode=code)["Quota"]
    assert default["Value"] == 0.0
    assert default["QuotaName"] == P4D


def test_set_quota_for_an_unlisted_instance_type_adds_its_quotas() -> None:
    service_quotas.set_quota("ml.g6.xlarge", 3, REGION)

    assert find_by_name("ml.g6.xlarge for training job usage")["Value"] == 3.0


@pytest.mark.parametrize(("instance_type", "value"), [("p4d.24xlarge", 1), ("ml.p4d.24xlarge", -1)])
def test_set_quota_rejects_bad_input_naming_it(instance_type: str, value: int) -> None:
    with pytest.raises(ValueError, match=r"instance_type must look like|cannot be negative"):
        service_quotas.set_quota(instance_type, value, REGION)


def test_unknown_service_code_raises_no_such_resource() -> None:
    with pytest.raises(ClientError) as raised:
        client("service-quotas").list_service_quotas(ServiceCode="sagemakr")

    assert raised.value.response["Error"]["Code"] == "NoSuchResourceException"


def test_unknown_quota_code_raises_no_such_resource() -> None:
    with pytest.raises(ClientError) as raised:
        client("service-quotas").get_service_quota(ServiceCode="sagemaker", QuotaCode="L-00000000")

    assert raised.value.response["Error"]["Code"] == "NoSuchResourceException"
    assert "L-00000000" in raised.value.response["Error"]["Message"]


def test_a_forged_next_token_is_refused() -> None:
    with pytest.raises(ClientError) as raised:
        client("service-quotas").list_service_quotas(ServiceCode="sagemaker", NextToken="not-a-token")

    assert raised.value.response["Error"]["Code"] == "InvalidPaginationTokenException"


def test_quota_fault_makes_every_sagemaker_quota_read_zero_until_cleared() -> None:
    code = service_quotas.set_quota("ml.m5.xlarge", 20, REGION)
    faults.inject("check_quota", "quota")
    quotas = client("service-quotas")

    assert quotas.get_service_quota(ServiceCode="sagemaker", QuotaCode=code)["Quota"]["Value"] == 0.0
    assert find_by_name("ml.m5.xlarge for training job usage")["Value"] == 0.0

    faults.clear()
    assert quotas.get_service_quota(ServiceCode="sagemaker", QuotaCode=code)["Quota"]["Value"] == 20.0


def test_vpc_quotas_still_answer_as_moto_did() -> None:
    quotas = client("service-quotas").list_aws_default_service_quotas(ServiceCode="vpc", MaxResults=100)[
        "Quotas"
    ]

    assert "Active VPC peering connections per VPC" in [q["QuotaName"] for q in quotas]
