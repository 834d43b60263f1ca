"""Service Quotas for SageMaker: ListServiceQuotas, GetServiceQuota, GetAWSDefaultServiceQuota,
RequestServiceQuotaIncrease and GetRequestedServiceQuotaChange on the twin.

moto 5.2.5 knows ServiceCode vpc only, and neither ListServiceQuotas nor GetAWSDefaultServiceQuota. The twin
adds ServiceCode "sagemaker" with quotas named as AWS names them ("ml.p4d.24xlarge for training job usage",
"... for spot training job usage") for every type of lustrain's instance catalogue (the names its rows give) and
the few others below, "<type> for training warm pool usage" for each, and the account-wide training quotas
(steps/quota.py: "Number of instances across all training jobs", "Maximum number of instances per training job", their
spot twins, "Longest run time for a training job"), which the twin's CreateTrainingJob enforces as SageMaker does
(patches/sagemaker.py, `_check_quota`). Their QuotaCodes are the twin's own
(stable, derived from the name): public sources disagree on the real L- codes, which is why callers look a
quota up by QuotaName.

Values: the account's applied value is what `set_quota`, `set_account_quota` or an increase request set, else the
default below (the twin's defaults, in the spirit of a new account: no large GPU instances until an increase is
granted). `set_quota` stands for an account whose limits were raised for a type (`lustrain local up --quota`, the
rehearsal): an account-wide instance quota never applied itself reads at least what the applied type quotas of its
kind allow together ("across all"), or the largest of them ("per training job"), so that raising a type's quota is
enough to run on it, as the twin did before it knew the account-wide quotas. The `quota` fault
(faults.py, at check_quota) makes every SageMaker quota read 0 while it is armed.

Increases: RequestServiceQuotaIncrease (`aws service-quotas request-service-quota-increase`) is approved at once and
applied, as `set_quota` applies one (on AWS some requests are approved automatically, others go to AWS Support):
its answer's Status is APPROVED, and GetRequestedServiceQuotaChange finds it by its Id. As on AWS, a value not
above the quota's current one is refused (IllegalArgumentException: "You must provide a quota value greater than
the current quota value"), as are a quota that is not adjustable and a value outside QuotaValue's 0..10^10.

Pages: ListServiceQuotas and ListAWSDefaultServiceQuotas page with NextToken/MaxResults (1..100) as AWS does;
without MaxResults a page holds DEFAULT_PAGE_SIZE quotas. AWS lists hundreds of SageMaker quotas, so a caller
that ignores NextToken misses most of them there; the small default page makes it miss them here too.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from lustrain_core.instance_types import INSTANCE_TYPES as CATALOGUE_TYPES
from lustrain_core.instance_types import quota_name as catalogue_quota_name
from lustrain_core.instance_types import warm_pool_quota_name as catalogue_warm_pool_quota_name
from moto.core.exceptions import JsonRESTError
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.servicequotas.exceptions import NoSuchResource
from moto.servicequotas.models import ServiceQuotasBackend, servicequotas_backends
from moto.servicequotas.resources.default_quotas.vpc import VPC_DEFAULT_QUOTAS
from moto.servicequotas.responses import ServiceQuotasResponse

from lustrain.twin import faults

DEFAULT_PAGE_SIZE = 10
_PATCHED = "_lustrain_twin_quotas"
_APPLIED = "lustrain_applied_quotas"
_REQUESTS = "lustrain_quota_requests"
#: botocore's QuotaValue shape (service-quotas 2019-06-24): a double from 0 to 10^10
MAX_QUOTA_VALUE = 10_000_000_000.0

#: Instance type -> the twin's default quota for training jobs (on-demand and spot alike); a type of the instance
#: catalogue that is not here defaults to 0.
TRAINING_INSTANCE_DEFAULTS: dict[str, float] = {
    "ml.m5.large": 20.0,
    "ml.m5.xlarge": 20.0,
    "ml.m5.2xlarge": 20.0,
    "ml.m5.4xlarge": 10.0,
    "ml.c5.xlarge": 20.0,
    "ml.c5.2xlarge": 20.0,
    "ml.c5.4xlarge": 10.0,
    "ml.g4dn.xlarge": 2.0,
    "ml.g5.xlarge": 2.0,
    "ml.g5.2xlarge": 2.0,
    "ml.p3.2xlarge": 1.0,
    "ml.p3.8xlarge": 0.0,
    "ml.p3.16xlarge": 0.0,
    "ml.p3dn.24xlarge": 0.0,
    "ml.trn1.32xlarge": 0.0,
}

#: The account-wide training quotas (steps/quota.py names them): name -> (kind, the twin's default). AWS General
#: Reference, "Amazon SageMaker AI endpoints and quotas": 20 instances per training job, 432,000 s (5 days) of run
#: time; 4 instances across all training jobs is the value public listings of new accounts show.
ACCOUNT_WIDE: dict[str, tuple[str, float]] = {
    "Number of instances across all training jobs": ("across-all", 4.0),
    "Number of instances across all spot training jobs": ("spot-across-all", 4.0),
    "Maximum number of instances per training job": ("per-job", 20.0),
    "Maximum number of instances per spot training job": ("spot-per-job", 20.0),
    "Longest run time for a training job": ("run-time", 432_000.0),
}

_INSTANCE_TYPE = re.compile(r"^ml\.[a-z0-9][a-z0-9-]*\.[a-z0-9]+$")


class InvalidPaginationToken(JsonRESTError):
    def __init__(self) -> None:
        super().__init__(
            "InvalidPaginationTokenException", "Invalid input was provided: the NextToken is not valid."
        )


class IllegalArgument(JsonRESTError):
    def __init__(self, message: str) -> None:
        super().__init__("IllegalArgumentException", message)


class NoSuchQuota(JsonRESTError):
    def __init__(self, service_code: str, quota_code: str) -> None:
        super().__init__(
            "NoSuchResourceException",
            f"The request failed because the specified quota '{quota_code}' does not exist for service "
            f"'{service_code}'.",
        )


@dataclass(frozen=True)
class Quota:
    service_code: str
    service_name: str
    code: str
    name: str
    default: float
    adjustable: bool = True
    #: what the quota counts, for the account-wide quotas' values: "training", "spot-training", "warm-pool", or an
    #: ACCOUNT_WIDE kind; "" for the other services'
    kind: str = ""

    def to_dict(self, region: str, account_id: str, value: float) -> dict[str, Any]:
        return {
            "ServiceCode": self.service_code,
            "ServiceName": self.service_name,
            "QuotaArn": f"arn:aws:servicequotas:{region}:{account_id}:{self.service_code}/{self.code}",
            "QuotaCode": self.code,
            "QuotaName": self.name,
            "Value": value,
            "Unit": "None",
            "Adjustable": self.adjustable,
            "GlobalQuota": False,
            "QuotaAppliedAtLevel": "ACCOUNT",
        }


def quota_name(instance_type: str, spot: bool = False) -> str:
    """The name of the type's training quota, as the control plane reads it (the instance catalogue)."""
    return catalogue_quota_name(instance_type, spot=spot)


def _code_for(name: str) -> str:
    return "L-" + hashlib.sha256(name.encode()).hexdigest()[:8].upper()


def _training_quotas(instance_type: str, default: float) -> list[Quota]:
    return [
        Quota(
            "sagemaker",
            "Amazon SageMaker",
            _code_for(quota_name(instance_type, spot)),
            quota_name(instance_type, spot),
            default,
            kind="spot-training" if spot else "training",
        )
        for spot in (False, True)
    ]


def warm_pool_quota_name(instance_type: str) -> str:
    return catalogue_warm_pool_quota_name(instance_type)


def _warm_pool_quota(instance_type: str) -> Quota:
    # "The default resource limit for warm pools is 0" (SageMaker guide, "Request a warm pool quota increase")
    name = warm_pool_quota_name(instance_type)
    return Quota("sagemaker", "Amazon SageMaker", _code_for(name), name, 0.0, kind="warm-pool")


def _account_wide_quotas() -> list[Quota]:
    return [
        Quota("sagemaker", "Amazon SageMaker", _code_for(name), name, default, kind=kind)
        for name, (kind, default) in ACCOUNT_WIDE.items()
    ]


def _sagemaker_quotas() -> list[Quota]:
    defaults = {**dict.fromkeys(CATALOGUE_TYPES, 0.0), **TRAINING_INSTANCE_DEFAULTS}
    quotas = [q for kind, value in defaults.items() for q in _training_quotas(kind, value)]
    quotas += [_warm_pool_quota(kind) for kind in defaults]
    quotas += _account_wide_quotas()
    return sorted(quotas, key=lambda q: q.name)


def warm_pool_quota(account_id: str, region: str, instance_type: str) -> float:
    """The applied (else default) warm pool quota of an instance type; 0 for a type the twin does not list."""
    name = warm_pool_quota_name(instance_type)
    for quota in CATALOG["sagemaker"]:
        if quota.name == name:
            return float(
                servicequotas_backends[account_id][region].get_service_quota("sagemaker", quota.code)["Value"]
            )
    return 0.0


def _vpc_quotas() -> list[Quota]:
    moto_quotas: list[dict[str, Any]] = VPC_DEFAULT_QUOTAS
    return [
        Quota(
            "vpc", q["ServiceName"], q["QuotaCode"], q["QuotaName"], float(q["Value"]), bool(q["Adjustable"])
        )
        for q in moto_quotas
    ]


CATALOG: dict[str, list[Quota]] = {"sagemaker": _sagemaker_quotas(), "vpc": _vpc_quotas()}


def _service(service_code: str) -> list[Quota]:
    if service_code not in CATALOG:
        raise NoSuchResource()
    return CATALOG[service_code]


def _quota(service_code: str, quota_code: str) -> Quota:
    for quota in _service(service_code):
        if quota.code == quota_code:
            return quota
    raise NoSuchQuota(service_code, quota_code)


def _applied(backend: ServiceQuotasBackend) -> dict[str, float]:
    applied: dict[str, float] = backend.__dict__.setdefault(_APPLIED, {})
    return applied


#: an account-wide instance quota's kind -> the kind of type quota it follows, and whether it follows their sum (across
#: all training jobs) or the largest (per training job): module docstring
_FOLLOWS = {
    "across-all": ("training", True),
    "spot-across-all": ("spot-training", True),
    "per-job": ("training", False),
    "spot-per-job": ("spot-training", False),
}


def _value(backend: ServiceQuotasBackend, quota: Quota, applied: bool) -> float:
    if quota.service_code == "sagemaker" and faults.active("check_quota", "quota"):
        return 0.0
    if not applied:
        return quota.default
    values = _applied(backend)
    if quota.code in values or quota.kind not in _FOLLOWS:
        return values.get(quota.code, quota.default)
    kind, summed = _FOLLOWS[quota.kind]
    raised = [values[q.code] for q in CATALOG["sagemaker"] if q.kind == kind and q.code in values]
    if not raised:
        return quota.default
    return max(quota.default, sum(raised) if summed else max(raised))


def _page(items: list[dict[str, Any]], next_token: str | None, max_results: int | None) -> dict[str, Any]:
    if max_results is not None and not 1 <= int(max_results) <= 100:
        raise IllegalArgument(f"MaxResults must be between 1 and 100, got {max_results}.")
    size = int(max_results or DEFAULT_PAGE_SIZE)
    start = 0
    if next_token:
        try:
            start = int(base64.urlsafe_b64decode(next_token.encode()).decode())
        except (ValueError, binascii.Error) as exc:
            raise InvalidPaginationToken() from exc
        if not 0 <= start < len(items):
            raise InvalidPaginationToken()
    page: dict[str, Any] = {"Quotas": items[start : start + size]}
    if start + size < len(items):
        page["NextToken"] = base64.urlsafe_b64encode(str(start + size).encode()).decode()
    return page


# Backend methods (bound to moto's ServiceQuotasBackend).


def list_service_quotas(
    self: ServiceQuotasBackend,
    service_code: str,
    next_token: str | None = None,
    max_results: int | None = None,
) -> dict[str, Any]:
    quotas = [
        q.to_dict(self.region_name, self.account_id, _value(self, q, True)) for q in _service(service_code)
    ]
    return _page(quotas, next_token, max_results)


def list_aws_default_service_quotas(
    self: ServiceQuotasBackend,
    service_code: str,
    next_token: str | None = None,
    max_results: int | None = None,
) -> dict[str, Any]:
    quotas = [q.to_dict(self.region_name, "", _value(self, q, False)) for q in _service(service_code)]
    return _page(quotas, next_token, max_results)


def get_service_quota(self: ServiceQuotasBackend, service_code: str, quota_code: str) -> dict[str, Any]:
    quota = _quota(service_code, quota_code)
    return quota.to_dict(self.region_name, self.account_id, _value(self, quota, True))


def get_aws_default_service_quota(
    self: ServiceQuotasBackend, service_code: str, quota_code: str
) -> dict[str, Any]:
    quota = _quota(service_code, quota_code)
    return quota.to_dict(self.region_name, "", _value(self, quota, False))


def _requests(backend: ServiceQuotasBackend) -> dict[str, dict[str, Any]]:
    requests: dict[str, dict[str, Any]] = backend.__dict__.setdefault(_REQUESTS, {})
    return requests


def request_service_quota_increase(
    self: ServiceQuotasBackend, service_code: str, quota_code: str, desired_value: Any
) -> dict[str, Any]:
    """Approve and apply an increase at once (module docstring); AWS's refusals of a value it cannot grant."""
    quota = _quota(service_code, quota_code)
    if isinstance(desired_value, bool) or not isinstance(desired_value, int | float):
        raise IllegalArgument(
            f"DesiredValue must be a number from 0 to {MAX_QUOTA_VALUE:.0f} (got {desired_value!r})."
        )
    desired = float(desired_value)
    if not 0 <= desired <= MAX_QUOTA_VALUE:
        raise IllegalArgument(f"DesiredValue must be from 0 to {MAX_QUOTA_VALUE:.0f} (got {desired_value}).")
    if not quota.adjustable:
        raise IllegalArgument(f"The quota '{quota.name}' ({quota.code}) is not adjustable.")
    if desired <= _value(self, quota, True):
        raise IllegalArgument("You must provide a quota value greater than the current quota value")
    now = time.time()
    described = quota.to_dict(self.region_name, self.account_id, desired)
    change = {
        "Id": uuid.uuid4().hex,
        "ServiceCode": quota.service_code,
        "ServiceName": quota.service_name,
        "QuotaCode": quota.code,
        "QuotaName": quota.name,
        "DesiredValue": desired,
        "Status": "APPROVED",
        "Created": now,
        "LastUpdated": now,
        "Requester": json.dumps({"accountId": self.account_id}),
        "QuotaArn": described["QuotaArn"],
        "GlobalQuota": False,
        "Unit": described["Unit"],
        "QuotaRequestedAtLevel": "ACCOUNT",
    }
    _applied(self)[quota.code] = desired
    _requests(self)[change["Id"]] = change
    return dict(change)


def get_requested_service_quota_change(self: ServiceQuotasBackend, request_id: str) -> dict[str, Any]:
    change = _requests(self).get(request_id)
    if change is None:
        raise JsonRESTError(
            "NoSuchResourceException",
            f"The request failed because the specified request '{request_id}' does not exist.",
        )
    return dict(change)


# Response methods (bound to moto's ServiceQuotasResponse): JSON in, JSON out.


def _params(response: ServiceQuotasResponse) -> dict[str, Any]:
    params: dict[str, Any] = json.loads(response.body or "{}")
    return params


def _list_response(method: str) -> Any:
    def respond(self: ServiceQuotasResponse) -> str:
        params = _params(self)
        page = getattr(self.backend, method)(
            str(params.get("ServiceCode")), params.get("NextToken"), params.get("MaxResults")
        )
        return json.dumps(page)

    respond.__name__ = method
    return respond


def _get_response(method: str) -> Any:
    def respond(self: ServiceQuotasResponse) -> str:
        params = _params(self)
        quota = getattr(self.backend, method)(str(params.get("ServiceCode")), str(params.get("QuotaCode")))
        return json.dumps({"Quota": quota})

    respond.__name__ = method
    return respond


def _request_response(self: ServiceQuotasResponse) -> str:
    params = _params(self)
    change = request_service_quota_increase(
        self.backend, str(params.get("ServiceCode")), str(params.get("QuotaCode")), params.get("DesiredValue")
    )
    return json.dumps({"RequestedQuota": change})


def _requested_change_response(self: ServiceQuotasResponse) -> str:
    change = get_requested_service_quota_change(self.backend, str(_params(self).get("RequestId")))
    return json.dumps({"RequestedQuota": change})


def set_quota(
    instance_type: str,
    value: float,
    region: str = "us-east-1",
    account_id: str = DEFAULT_ACCOUNT_ID,
    spot: bool = False,
    warm_pool: bool = False,
) -> str:
    """Apply a SageMaker training quota for `instance_type` in one account and region (its warm pool quota with
    `warm_pool`); returns its QuotaCode.

    An instance type the twin does not list yet (AWS has quotas for every one) joins the list, default 0.
    """
    if not _INSTANCE_TYPE.match(instance_type):
        raise ValueError(f"instance_type must look like ml.p4d.24xlarge (got {instance_type!r})")
    if value < 0:
        raise ValueError(f"a quota value cannot be negative (got {value})")
    sagemaker = CATALOG["sagemaker"]
    if not any(q.name == quota_name(instance_type) for q in sagemaker):
        sagemaker[:] = sorted(
            [*sagemaker, *_training_quotas(instance_type, 0.0), _warm_pool_quota(instance_type)],
            key=lambda q: q.name,
        )
    code = _code_for(warm_pool_quota_name(instance_type) if warm_pool else quota_name(instance_type, spot))
    _applied(servicequotas_backends[account_id][region])[code] = float(value)
    return code


def set_account_quota(
    name: str, value: float, region: str = "us-east-1", account_id: str = DEFAULT_ACCOUNT_ID
) -> str:
    """Apply one of the account-wide training quotas (ACCOUNT_WIDE, by name) in one account and region; returns its
    QuotaCode."""
    if name not in ACCOUNT_WIDE:
        raise ValueError(f"name must be one of {sorted(ACCOUNT_WIDE)} (got {name!r})")
    if value < 0:
        raise ValueError(f"a quota value cannot be negative (got {value})")
    code = _code_for(name)
    _applied(servicequotas_backends[account_id][region])[code] = float(value)
    return code


def install() -> None:
    if getattr(ServiceQuotasBackend, _PATCHED, False):
        return
    for lister in (list_service_quotas, list_aws_default_service_quotas):
        setattr(ServiceQuotasBackend, lister.__name__, lister)
        setattr(ServiceQuotasResponse, lister.__name__, _list_response(lister.__name__))
    for getter in (get_service_quota, get_aws_default_service_quota):
        setattr(ServiceQuotasBackend, getter.__name__, getter)
        setattr(ServiceQuotasResponse, getter.__name__, _get_response(getter.__name__))
    for method in (request_service_quota_increase, get_requested_service_quota_change):
        setattr(ServiceQuotasBackend, method.__name__, method)
    for name, respond in (
        ("request_service_quota_increase", _request_response),
        ("get_requested_service_quota_change", _requested_change_response),
    ):
        setattr(ServiceQuotasResponse, name, respond)
    setattr(ServiceQuotasBackend, _PATCHED, True)
