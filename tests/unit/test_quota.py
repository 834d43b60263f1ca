"""The quota the capacity queue measures, against in-memory Service Quotas and SageMaker: found by name, counted,
refused with the fix."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError
from lustrain_core.config import Settings
from lustrain_core.document import Job
from lustrain_core.errors import QuotaExceeded, SpecInvalid
from lustrain_core.launch import registered
from lustrain_core.spec import validate_spec
from lustrain_core.steps import quota

P4D = "ml.p4d.24xlarge for training job usage"
P4D_SPOT = "ml.p4d.24xlarge for spot training job usage"
ACROSS_ALL = "Number of instances across all training jobs"
PER_JOB = "Maximum number of instances per training job"
LONGEST_RUN = "Longest run time for a training job"
#: the account-wide quotas of an account that raised them well beyond the type's
ROOMY = {
    ACROSS_ALL: 100.0,
    "Number of instances across all spot training jobs": 100.0,
    PER_JOB: 100.0,
    "Maximum number of instances per spot training job": 100.0,
    LONGEST_RUN: 2_419_200.0,
}


def error(code: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"{code} from the fake"}}, operation)


class FakeQuotas:
    """Service Quotas for ServiceCode sagemaker: listed in small pages, some never applied to the account."""

    def __init__(self, applied: dict[str, float], defaults: dict[str, float], page: int = 2) -> None:
        self.applied, self.defaults, self.page = applied, defaults, page
        self.codes = {name: f"L-{i + 1:04d}ABCD" for i, name in enumerate(sorted({*applied, *defaults}))}
        self.increase_requests: list[dict[str, Any]] = []
        self.increase_error: str | None = None

    def _quotas(self, values: dict[str, float]) -> list[dict[str, Any]]:
        fillers = [{"QuotaName": f"filler {i}", "QuotaCode": f"L-F{i}", "Value": 1.0} for i in range(5)]
        named = [{"QuotaName": n, "QuotaCode": self.codes[n], "Value": v} for n, v in values.items()]
        return fillers + named

    def get_paginator(self, operation: str) -> Any:
        values = self.applied if operation == "list_service_quotas" else self.defaults
        fake = self

        class Paginator:
            def paginate(self, ServiceCode: str) -> Any:
                assert ServiceCode == "sagemaker"
                items = fake._quotas(values)
                for i in range(0, len(items), fake.page):
                    yield {"Quotas": items[i : i + fake.page]}

        return Paginator()

    def _by_code(self, code: str) -> str:
        return next(n for n, c in self.codes.items() if c == code)

    def get_service_quota(self, ServiceCode: str, QuotaCode: str) -> dict[str, Any]:
        name = self._by_code(QuotaCode)
        if name not in self.applied:
            raise error("NoSuchResourceException", "GetServiceQuota")
        return {"Quota": {"QuotaCode": QuotaCode, "Value": self.applied[name]}}

    def get_aws_default_service_quota(self, ServiceCode: str, QuotaCode: str) -> dict[str, Any]:
        return {"Quota": {"QuotaCode": QuotaCode, "Value": self.defaults[self._by_code(QuotaCode)]}}

    def request_service_quota_increase(self, **params: Any) -> dict[str, Any]:
        if self.increase_error:
            raise error(self.increase_error, "RequestServiceQuotaIncrease")
        self.increase_requests.append(params)
        return {"RequestedQuota": {"Id": "req-1", "Status": "PENDING"}}


class FakeSageMaker:
    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.jobs = {j["TrainingJobName"]: j for j in jobs}

    def get_paginator(self, operation: str) -> Any:
        fake = self

        class Paginator:
            def paginate(
                self, StatusEquals: str | None = None, WarmPoolStatusEquals: str | None = None
            ) -> Any:
                def listed(job: dict[str, Any]) -> bool:
                    if WarmPoolStatusEquals is not None:
                        return (job.get("WarmPoolStatus") or {}).get("Status") == WarmPoolStatusEquals
                    return job["TrainingJobStatus"] == StatusEquals

                matching = [{"TrainingJobName": n} for n, j in fake.jobs.items() if listed(j)]
                for item in matching:
                    yield {"TrainingJobSummaries": [item]}

        return Paginator()

    def describe_training_job(self, TrainingJobName: str) -> dict[str, Any]:
        return self.jobs[TrainingJobName]


def training(
    name: str, instance_type: str, count: int, status: str = "InProgress", spot: bool = False
) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "TrainingJobStatus": status,
        "EnableManagedSpotTraining": spot,
        "ResourceConfig": {"InstanceType": instance_type, "InstanceCount": count, "VolumeSizeInGB": 30},
    }


def document(count: int = 2, spot: bool = False, hours: float = 24) -> dict[str, Any]:
    compute: dict[str, Any] = {"instance_count": count, "spot": spot, "max_runtime_hours": hours}
    if spot:
        compute["max_wait_hours"] = 48
    spec = validate_spec(
        {
            "name": "gpt",
            "compute": compute,
            "code": {"source": "s3://code/gpt/"},
            "data": {"s3_uri": "s3://datasets/x/", "size_gib": 10},
            "output": {"s3_uri": "s3://results/x/"},
        }
    )
    return {"job": registered(spec, "gpt-0badc0de", Settings(region="eu-west-1"))}


def run(
    doc: dict[str, Any], quotas: FakeQuotas, jobs: list[dict[str, Any]] = (), **env: str
) -> dict[str, Any]:
    """What the capacity queue measures for the run, and the refusal it raises when the instances do not fit."""
    settings = Settings(region="eu-west-1", extra=dict(env))
    job = Job.from_document(doc)
    measured = quota.measure(job, quotas=quotas, sagemaker=FakeSageMaker(list(jobs)), settings=settings)
    if not quota.fits_now(measured):
        raise quota.refusal(job, measured, settings, quotas=quotas)
    return measured


def test_the_quota_is_found_by_name_on_a_later_page_whatever_its_code():
    quotas = FakeQuotas(applied={P4D: 8}, defaults={P4D: 0, **ROOMY})
    result = run(document(), quotas)
    assert result == {
        "quota_code": quotas.codes[P4D],
        "quota_name": P4D,
        "limit": 8.0,
        "in_use": 0,
        "held": 0,
        "requested": 2,
        "available": 8,
    }


def test_a_quota_never_applied_falls_back_to_the_aws_default():
    quotas = FakeQuotas(applied={}, defaults={P4D: 4})
    result = run(document(), quotas)
    assert (result["limit"], result["available"]) == (4.0, 4)


def test_in_use_counts_running_jobs_of_the_same_type_and_kind_only():
    quotas = FakeQuotas(applied={P4D: 8}, defaults={})
    jobs = [
        training("a", "ml.p4d.24xlarge", 3),
        training("b", "ml.p4d.24xlarge", 2, status="Completed"),
        # a Stopping job still has its fleet, and SageMaker counts it against the quota
        training("s", "ml.p4d.24xlarge", 1, status="Stopping"),
        training("c", "ml.g5.48xlarge", 4),
        training("d", "ml.p4d.24xlarge", 1, spot=True),
        {
            **training("e", "ml.c5.xlarge", 1),
            "ResourceConfig": {"InstanceGroups": [{"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2}]},
        },
    ]
    result = run(document(count=2), quotas, jobs)
    assert (result["in_use"], result["available"]) == (6, 2)


def test_spot_runs_count_against_the_spot_quota():
    quotas = FakeQuotas(applied={P4D: 0, P4D_SPOT: 4}, defaults={})
    result = run(document(spot=True), quotas, [training("d", "ml.p4d.24xlarge", 1, spot=True)])
    assert (result["quota_name"], result["in_use"], result["available"]) == (P4D_SPOT, 1, 3)


def test_too_many_requested_raises_quota_exceeded_with_the_numbers_and_the_command():
    quotas = FakeQuotas(applied={P4D: 4}, defaults={})
    with pytest.raises(QuotaExceeded) as exc:
        run(document(count=3), quotas, [training("a", "ml.p4d.24xlarge", 2)])
    code = quotas.codes[P4D]
    message = exc.value.message
    assert "3 x ml.p4d.24xlarge requested, 2 in use by running training jobs, quota 4" in message
    assert f"{code}) in eu-west-1: 2 free" in message
    assert (
        "aws service-quotas request-service-quota-increase --service-code sagemaker "
        f"--quota-code {code} --desired-value 5 --region eu-west-1"
    ) in message
    assert exc.value.details["requested"] == 3 and exc.value.details["limit"] == 4.0
    assert quotas.increase_requests == []


def test_with_the_stack_setting_the_increase_is_requested_and_the_error_says_so():
    quotas = FakeQuotas(applied={P4D: 0}, defaults={})
    with pytest.raises(QuotaExceeded) as exc:
        run(document(count=2), quotas, LUSTRAIN_REQUEST_QUOTA_INCREASE="true")
    assert quotas.increase_requests == [
        {"ServiceCode": "sagemaker", "QuotaCode": quotas.codes[P4D], "DesiredValue": 2.0}
    ]
    assert "an increase to 2 was requested (request req-1, PENDING)" in exc.value.message


def test_an_already_open_increase_request_is_reported_not_filed_again():
    quotas = FakeQuotas(applied={P4D: 0}, defaults={})
    quotas.increase_error = "ResourceAlreadyExistsException"
    with pytest.raises(QuotaExceeded, match="already open"):
        run(document(), quotas, LUSTRAIN_REQUEST_QUOTA_INCREASE="true")


def test_a_failed_increase_request_still_ends_in_quota_exceeded_saying_why():
    quotas = FakeQuotas(applied={P4D: 0}, defaults={})
    quotas.increase_error = "AccessDeniedException"
    with pytest.raises(QuotaExceeded, match=r"filing the increase request failed \(AccessDeniedException"):
        run(document(), quotas, LUSTRAIN_REQUEST_QUOTA_INCREASE="true")


def test_an_instance_type_without_a_quota_is_refused_at_compute_instance_type():
    quotas = FakeQuotas(applied={"ml.g5.48xlarge for training job usage": 1}, defaults={})
    with pytest.raises(SpecInvalid) as exc:
        run(document(), quotas)
    assert [e.path for e in exc.value.errors] == ["compute.instance_type"]
    assert P4D in exc.value.message and "eu-west-1" in exc.value.message


def refused(quotas: FakeQuotas, doc: dict[str, Any], jobs: list[dict[str, Any]] = ()) -> QuotaExceeded:
    with pytest.raises(QuotaExceeded) as exc:
        run(doc, quotas, jobs)
    return exc.value


def test_the_account_wide_instance_quota_binds_counting_every_types_jobs_and_warm_pools():
    quotas = FakeQuotas(applied={P4D: 8, ACROSS_ALL: 6}, defaults=ROOMY)
    jobs = [
        training("g5", "ml.g5.48xlarge", 2),
        {
            **training("pool", "ml.g5.2xlarge", 1, status="Completed"),
            "WarmPoolStatus": {"Status": "Available"},
        },
        training("spot", "ml.g5.48xlarge", 5, spot=True),  # spot jobs count against the spot quota
        training("old", "ml.g5.48xlarge", 5, status="Completed"),
    ]
    error = refused(quotas, document(count=4), jobs)
    code = quotas.codes[ACROSS_ALL]
    assert (
        f"4 x ml.p4d.24xlarge requested, 3 of every type in use by running training jobs and warm pools, "
        f"quota 6 ({ACROSS_ALL}, {code}) in eu-west-1: 3 free"
    ) in error.message
    assert f"--quota-code {code} --desired-value 7 --region eu-west-1" in error.message
    assert (error.details["quota_name"], error.details["in_use"], error.details["available"]) == (
        ACROSS_ALL,
        3,
        3,
    )


def test_with_room_in_both_the_types_quota_is_the_one_named():
    quotas = FakeQuotas(applied={P4D: 8, ACROSS_ALL: 50}, defaults=ROOMY)
    result = run(document(count=4), quotas, [training("g5", "ml.g5.48xlarge", 2)])
    assert (result["quota_name"], result["available"]) == (P4D, 8)


def test_more_instances_than_the_whole_account_wide_quota_can_never_fit():
    quotas = FakeQuotas(applied={P4D: 8, ACROSS_ALL: 4}, defaults=ROOMY)
    measured = quota.measure(
        Job.from_document(document(count=6)),
        quotas=quotas,
        sagemaker=FakeSageMaker([]),
        settings=Settings(region="eu-west-1"),
    )
    assert measured["quota_name"] == ACROSS_ALL and not quota.fits_ever(measured)


def test_more_instances_than_one_job_may_have_are_refused_at_once_naming_the_quota():
    quotas = FakeQuotas(applied={P4D: 64, PER_JOB: 20}, defaults=ROOMY)
    doc = document(count=50)
    measured = quota.measure(
        Job.from_document(doc),
        quotas=quotas,
        sagemaker=FakeSageMaker([]),
        settings=Settings(region="eu-west-1"),
    )
    assert not quota.fits_ever(measured)
    error = refused(quotas, doc)
    code = quotas.codes[PER_JOB]
    assert (
        f"50 x ml.p4d.24xlarge requested in one training job, above the quota 20 ({PER_JOB}, {code}) in eu-west-1"
    ) in error.message
    assert f"--quota-code {code} --desired-value 50 --region eu-west-1" in error.message


def test_a_run_longer_than_the_longest_run_time_is_refused_with_the_field_and_the_command():
    quotas = FakeQuotas(applied={P4D: 8}, defaults={**ROOMY, LONGEST_RUN: 432_000.0})
    doc = document(hours=168)
    measured = quota.measure(
        Job.from_document(doc),
        quotas=quotas,
        sagemaker=FakeSageMaker([]),
        settings=Settings(region="eu-west-1"),
    )
    assert not quota.fits_ever(measured)
    error = refused(quotas, doc)
    code = quotas.codes[LONGEST_RUN]
    assert (
        "compute.max_runtime_hours=168 asks for a MaxRuntimeInSeconds of 604800, above the quota 432000 "
        f"({LONGEST_RUN}, {code}) in eu-west-1 (seconds: 120 h)"
    ) in error.message
    assert "Set compute.max_runtime_hours to at most 120" in error.message
    assert f"--quota-code {code} --desired-value 604800 --region eu-west-1" in error.message


def test_a_spot_run_is_measured_against_the_spot_account_wide_quotas():
    spot_all = "Number of instances across all spot training jobs"
    quotas = FakeQuotas(applied={P4D_SPOT: 8, spot_all: 3}, defaults=ROOMY)
    # on-demand jobs and warm pools count against the on-demand quotas only
    jobs = [training("od", "ml.g5.48xlarge", 40), training("s", "ml.g5.48xlarge", 1, spot=True)]
    error = refused(quotas, document(count=4, spot=True), jobs)
    assert (error.details["quota_name"], error.details["in_use"]) == (spot_all, 1)


def test_account_wide_quotas_the_account_does_not_list_are_named_unchecked():
    quotas = FakeQuotas(applied={P4D: 8}, defaults={PER_JOB: 20})
    result = run(document(), quotas)
    assert result["unchecked"] == [ACROSS_ALL, LONGEST_RUN]
