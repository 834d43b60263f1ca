"""RequestServiceQuotaIncrease on the twin: applied at once, refused as AWS refuses; the account-wide training quotas
listed by their AWS names, following the type quotas a user raised unless applied themselves."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError
from twinhelpers import REGION, client

from lustrain.twin.patches import service_quotas

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
