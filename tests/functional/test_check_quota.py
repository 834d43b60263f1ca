"""check_quota on the twin's Service Quotas and DynamoDB: SageMaker's quotas found by name, the capacity queue's
line (first come first served per pool, holds until the job exists, its time bound), AWS's answer to too many."""

from __future__ import annotations

from typing import Any

import pytest
from infra_support import invoke, register, spec
from lustrain_core.errors import QuotaExceeded

from lustrain.twin.patches import service_quotas


def test_the_quota_is_found_by_its_name_and_its_code_is_the_accounts(aws):
    code = service_quotas.set_quota("ml.p4d.24xlarge", 4)
    result = invoke("check_quota", register())
    assert {k: result[k] for k in ("quota_code", "quota_name", "limit", "in_use", "held", "requested")} == {
        "quota_code": code,
        "quota_name": "ml.p4d.24xlarge for training job usage",
        "limit": 4.0,
        "in_use": 0,
        "held": 0,
        "requested": 2,
    }
    assert (result["admitted"], result["position"], result["wait_seconds"]) == (True, 0, 0)


def test_a_new_accounts_zero_p4d_quota_stops_the_run_with_the_command_to_ask_for_more(aws):
    with pytest.raises(QuotaExceeded) as exc:
        invoke("check_quota", register())
    code = service_quotas.set_quota("ml.p4d.24xlarge", 0)
    assert "2 x ml.p4d.24xlarge requested, 0 in use by running training jobs, quota 0" in exc.value.message
    assert f"--quota-code {code} --desired-value 2 --region us-east-1" in exc.value.message
    assert exc.value.details["increase_requested"] is None


def test_a_spot_run_is_checked_against_the_spot_quota(aws):
    service_quotas.set_quota("ml.p4d.24xlarge", 0)
    code = service_quotas.set_quota("ml.p4d.24xlarge", 8, spot=True)
    document = register(spec(compute={"spot": True, "max_wait_hours": 2}))
    result = invoke("check_quota", document)
    assert (result["quota_code"], result["quota_name"], result["available"]) == (
        code,
        "ml.p4d.24xlarge for spot training job usage",
        8,
    )


def test_a_job_never_registered_is_refused_naming_its_id_and_joins_no_line(aws):
    import boto3
    from lustrain_core.config import Settings
    from lustrain_core.errors import SpecInvalid

    service_quotas.set_quota("ml.p4d.24xlarge", 4)
    document, settings = register(), Settings.from_env()
    ddb = boto3.client("dynamodb", region_name="us-east-1")
    # a hand-made document (`lustrain local invoke` of a sample): its job has no record in the jobs table
    ddb.delete_item(TableName=settings.jobs_table, Key={"job_id": {"S": document["job"]["job_id"]}})
    with pytest.raises(SpecInvalid) as exc:
        invoke("check_quota", document)
    assert "job.job_id" in exc.value.message and "must come from register_job" in exc.value.message
    assert ddb.scan(TableName=settings.queue_table)["Items"] == []


ACROSS_ALL = "Number of instances across all training jobs"


def service_quotas_client() -> Any:
    import boto3

    return boto3.client("service-quotas", region_name="us-east-1")


def code_of(name: str) -> str:
    """The quota's code as a user finds it: by its name, in the pages of ListServiceQuotas."""
    pages = service_quotas_client().get_paginator("list_service_quotas").paginate(ServiceCode="sagemaker")
    return next(q["QuotaCode"] for page in pages for q in page["Quotas"] if q["QuotaName"] == name)


def test_a_warm_pool_quota_increase_requested_on_the_twin_is_applied_and_the_run_is_admitted(aws):
    service_quotas.set_quota("ml.p4d.24xlarge", 8)
    document = register(spec(compute={"keep_alive_minutes": 10}))
    with pytest.raises(QuotaExceeded, match="for training warm pool usage' is 0"):
        invoke("check_quota", document)
    # what the refusal tells the user to run, as `aws service-quotas request-service-quota-increase` does it
    quotas = service_quotas_client()
    code = code_of("ml.p4d.24xlarge for training warm pool usage")
    change = quotas.request_service_quota_increase(ServiceCode="sagemaker", QuotaCode=code, DesiredValue=2)
    assert {k: change["RequestedQuota"][k] for k in ("QuotaCode", "DesiredValue", "Status")} == {
        "QuotaCode": code,
        "DesiredValue": 2.0,
        "Status": "APPROVED",
    }
    assert quotas.get_service_quota(ServiceCode="sagemaker", QuotaCode=code)["Quota"]["Value"] == 2.0
    found = quotas.get_requested_service_quota_change(RequestId=change["RequestedQuota"]["Id"])
    assert found["RequestedQuota"]["Status"] == "APPROVED"
    assert invoke("check_quota", document)["admitted"] is True


def test_the_account_wide_instance_quota_refuses_the_run_by_name_until_an_increase_lifts_it(aws):
    service_quotas.set_quota("ml.p4d.24xlarge", 8)
    code = service_quotas.set_account_quota(ACROSS_ALL, 1)
    document = register()
    with pytest.raises(QuotaExceeded) as exc:
        invoke("check_quota", document)
    assert f"quota 1 ({ACROSS_ALL}, {code}) in us-east-1" in exc.value.message
    assert f"--quota-code {code} --desired-value 2 --region us-east-1" in exc.value.message
    service_quotas_client().request_service_quota_increase(
        ServiceCode="sagemaker", QuotaCode=code, DesiredValue=2
    )
    result = invoke("check_quota", document)
    # admitted; the account-wide quota still leaves fewer instances than the type's 8, so it is the one named
    assert (result["admitted"], result["quota_name"], result["limit"], result["available"]) == (
        True,
        ACROSS_ALL,
        2.0,
        2,
    )


def test_a_run_longer_than_the_twins_default_longest_run_time_is_refused_naming_it(aws):
    service_quotas.set_quota("ml.p4d.24xlarge", 8)
    # AWS's default "Longest run time for a training job" is 432,000 s (5 days)
    with pytest.raises(QuotaExceeded) as exc:
        invoke("check_quota", register(spec(compute={"max_runtime_hours": 168})))
    assert "Longest run time for a training job" in exc.value.message
    assert "Set compute.max_runtime_hours to at most 120" in exc.value.message
