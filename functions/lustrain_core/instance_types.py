"""The catalogue of SageMaker instance types: data/instance_types.json, one row a type, read and checked here.

Every instance fact lustrain uses comes from a row: GPUs, their memory and bf16 peak, host memory, EFA interfaces,
the private IPs the run plans per instance, the local NVMe (an instance type with it refuses a VolumeKmsKeyId) and
what of it the output may fill, SageMaker's infrastructure health check, the Service Quotas names the run counts
against, and the dated on-demand price with its source. The planner, the launch plan, the network and training
steps and the twin read `INSTANCE_TYPES`; the trainer carries a byte-for-byte copy of the file
(scripts/refresh_trainer_plan.py) because it runs in SageMaker's image without this package. Adding a type is one
row; `--prices FILE` can add or replace rows for one plan ({"instance_types": {name: row}}).

A row that breaks a rule is refused when read, naming the type and the field: the IPs below SageMaker's floor
(at least 5 private IPs for an instance with EFA, 2 without: "Give SageMaker Training Jobs Access to Resources in
Your Amazon VPC"), output beyond the local NVMe, a price without its date, a quota name of another type.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

#: SageMaker's floor of private IPs per training instance, with and without EFA (the train-vpc page)
MIN_IPS_EFA = 5
MIN_IPS = 2
#: 1 TB (AWS's unit for instance storage) in GiB
GIB_PER_GB = 1e9 / 2**30
#: the share of the raw local NVMe the output may fill: the field guide's "about 6 TB usable" of p4d's 8 x 1000 GB
USABLE_NVME_SHARE = 0.75
_FIELDS = {
    "gpus",
    "gpu",
    "gpu_memory_gib",
    "bf16_dense_tflops_per_gpu",
    "host_memory_gib",
    "efa_interfaces",
    "ips_per_instance",
    "local_nvme_gb",
    "usable_output_gib",
    "infra_check",
    "efa_device_rdma",
    "checkpoint_write_gbps",
    "stage_gbps",
    "quota_names",
    "hourly_usd",
    "price_as_of",
    "price_source",
    "sources",
    "unconfirmed",
    "note",
}
_REQUIRED = {"gpus", "efa_interfaces", "ips_per_instance", "local_nvme_gb", "quota_names"}


class CatalogueError(ValueError):
    """A row of the instance-type catalogue that breaks a rule: names the type, the field and what is allowed."""


@dataclass(frozen=True)
class QuotaNames:
    """The Service Quotas names (ServiceCode sagemaker) a training job's instances of the type count against."""

    training: str
    spot: str
    #: "<type> for training warm pool usage": instances kept in a warm pool (KeepAlivePeriodInSeconds)
    warm_pool: str | None = None


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpus: int
    #: private IPs the run plans per instance (SageMaker's floor: 5 with EFA, 2 without)
    ips: int
    #: usable local storage for outputs (p4d: 8 x 1000 GB NVMe, about 6 TB usable per the field guide)
    usable_output_gib: float
    #: us-east-1 on-demand $ an hour; None where the catalogue has no confirmed price (the planner then refuses
    #: the type until --prices gives one)
    hourly_usd: float | None
    quota_names: QuotaNames
    #: EFA interfaces SageMaker's instance has (network cards with EFA); 0: no EFA
    efa_interfaces: int = 0
    #: GPUDirect RDMA over EFA is turned on (FI_EFA_USE_DEVICE_RDMA=1) on this type: SageMaker's training toolkit
    #: does it for exactly its SM_EFA_RDMA_INSTANCES (p4d, p4de); elsewhere libfabric decides what the device can do
    efa_device_rdma: bool = False
    #: raw local NVMe in GB (AWS's figure); 0: EBS only
    local_nvme_gb: float = 0.0
    #: SageMaker's infrastructure health check (InfraCheckConfig) is turned on for multi-instance jobs of this type:
    #: the accelerated training families, whose jobs span many hosts joined by EFA
    infra_check: bool = False
    #: the GPU's name as torch.cuda.get_device_name() contains it ("A100", "H100")
    gpu: str | None = None
    gpu_memory_gib: float = 0.0
    bf16_dense_tflops_per_gpu: float | None = None
    host_memory_gib: float = 0.0
    #: GB/s one host writes a checkpoint and one GPU copies its state to host memory (the trainer's memory plan)
    checkpoint_write_gbps: float | None = None
    stage_gbps: float | None = None
    price_as_of: str | None = None
    price_source: str | None = None
    sources: dict[str, str] = field(default_factory=dict)
    #: the figures of this row not checked against its sources
    unconfirmed: tuple[str, ...] = ()
    note: str = ""

    @property
    def efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def local_nvme(self) -> bool:
        """Instance types with local NVMe cannot take a VolumeKmsKeyId (SageMaker encrypts it on the instance)."""
        return self.local_nvme_gb > 0

    def quota_name(self, *, spot: bool) -> str:
        return self.quota_names.spot if spot else self.quota_names.training


def _number(
    name: str, row: dict[str, Any], key: str, *, integer: bool = False, optional: bool = False
) -> Any:
    value = row.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or value < 0:
        kind = "a whole number" if integer else "a number"
        raise CatalogueError(
            f"{name}: {key} is {value!r}; allowed: {kind}, 0 or more" + (" or null" if optional else "")
        )
    return int(value) if integer else float(value)


def parse_row(name: str, row: dict[str, Any]) -> InstanceType:
    """One catalogue row as an InstanceType, or CatalogueError naming the type and the field."""
    if not isinstance(row, dict):
        raise CatalogueError(f"{name}: a row is an object of {sorted(_FIELDS)}")
    if not name.startswith("ml.") or name.count(".") != 2:
        raise CatalogueError(f"{name!r}: a row's name is a SageMaker instance type like ml.p4d.24xlarge")
    unknown = set(row) - _FIELDS
    missing = _REQUIRED - set(row)
    if unknown or missing:
        raise CatalogueError(
            f"{name}: "
            + (f"unknown keys {sorted(unknown)} " if unknown else "")
            + (f"missing keys {sorted(missing)} " if missing else "")
            + f"(allowed: {sorted(_FIELDS)})"
        )
    gpus = _number(name, row, "gpus", integer=True)
    efa = _number(name, row, "efa_interfaces", integer=True)
    ips = _number(name, row, "ips_per_instance", integer=True)
    floor = MIN_IPS_EFA if efa else MIN_IPS
    if ips < floor:
        raise CatalogueError(
            f"{name}: ips_per_instance {ips} is below SageMaker's floor of {floor} private IPs for a training "
            f"instance {'with' if efa else 'without'} EFA"
        )
    nvme = _number(name, row, "local_nvme_gb")
    usable = _number(name, row, "usable_output_gib", optional=True)
    if usable is None:
        if not nvme:
            raise CatalogueError(
                f"{name}: usable_output_gib is needed for a type without local NVMe (its EBS volume)"
            )
        usable = round(USABLE_NVME_SHARE * nvme * GIB_PER_GB, 1)
    elif nvme and usable > nvme * GIB_PER_GB:
        raise CatalogueError(f"{name}: usable_output_gib {usable} is more than its {nvme} GB of local NVMe")
    price = _number(name, row, "hourly_usd", optional=True)
    if price is not None and not row.get("price_as_of"):
        raise CatalogueError(f"{name}: hourly_usd {price} needs price_as_of (the date the price was read)")
    quotas = row["quota_names"]
    if not isinstance(quotas, dict) or not all(
        isinstance(quotas.get(k), str) and quotas[k].startswith(f"{name} for ") for k in ("training", "spot")
    ):
        raise CatalogueError(
            f"{name}: quota_names needs training and spot, each a quota name that starts with '{name} for '"
        )
    warm = quotas.get("warm_pool")
    if warm is not None and not (isinstance(warm, str) and warm.startswith(f"{name} for ")):
        raise CatalogueError(
            f"{name}: quota_names.warm_pool {warm!r} must start with '{name} for ' (or be null)"
        )
    if gpus and row.get("gpu") is None:
        raise CatalogueError(
            f"{name}: gpu names the GPU of a type with gpus > 0 (as torch reports it, e.g. H100)"
        )
    return InstanceType(
        name=name,
        gpus=gpus,
        ips=ips,
        usable_output_gib=usable,
        hourly_usd=price,
        quota_names=QuotaNames(quotas["training"], quotas["spot"], warm),
        efa_interfaces=efa,
        efa_device_rdma=_device_rdma(name, row, efa),
        local_nvme_gb=nvme,
        infra_check=bool(row.get("infra_check", False)),
        gpu=row.get("gpu"),
        gpu_memory_gib=_number(name, row, "gpu_memory_gib", optional=True) or 0.0,
        bf16_dense_tflops_per_gpu=_number(name, row, "bf16_dense_tflops_per_gpu", optional=True),
        host_memory_gib=_number(name, row, "host_memory_gib", optional=True) or 0.0,
        checkpoint_write_gbps=_number(name, row, "checkpoint_write_gbps", optional=True),
        stage_gbps=_number(name, row, "stage_gbps", optional=True),
        price_as_of=row.get("price_as_of"),
        price_source=row.get("price_source"),
        sources=dict(row.get("sources") or {}),
        unconfirmed=tuple(row.get("unconfirmed") or ()),
        note=str(row.get("note") or ""),
    )


def _device_rdma(name: str, row: dict[str, Any], efa: int) -> bool:
    value = row.get("efa_device_rdma", False)
    if not isinstance(value, bool):
        raise CatalogueError(f"{name}: efa_device_rdma is {value!r}; allowed: true or false")
    if value and not efa:
        raise CatalogueError(f"{name}: efa_device_rdma is true for a type without EFA (efa_interfaces 0)")
    return value


def parse(document: dict[str, Any]) -> dict[str, InstanceType]:
    """The catalogue's rows by name ({"instance_types": {name: row}})."""
    rows = document.get("instance_types") if isinstance(document, dict) else None
    if not isinstance(rows, dict):
        raise CatalogueError('the catalogue is an object {"instance_types": {"ml.<type>": {row}}}')
    return {name: parse_row(name, row) for name, row in rows.items()}


def load_text() -> str:
    return resources.files("lustrain_core").joinpath("data/instance_types.json").read_text()


def load() -> dict[str, InstanceType]:
    return parse(json.loads(load_text()))


INSTANCE_TYPES: dict[str, InstanceType] = load()


def warm_pool_quota_name(instance_type: str, types: dict[str, InstanceType] | None = None) -> str:
    """The Service Quotas name of the type's warm-pool quota (0 until an increase is granted), from its row; else the
    name AWS gives every type's ("<type> for training warm pool usage")."""
    row = (types if types is not None else INSTANCE_TYPES).get(instance_type)
    if row is not None and row.quota_names.warm_pool:
        return row.quota_names.warm_pool
    return f"{instance_type} for training warm pool usage"


def quota_name(instance_type: str, *, spot: bool, types: dict[str, InstanceType] | None = None) -> str:
    """The Service Quotas name a training job's instances count against, from the type's row; a type outside the
    catalogue gets the name AWS gives every type's quota ("<type> for training job usage", "... for spot ...")."""
    row = (types if types is not None else INSTANCE_TYPES).get(instance_type)
    if row is not None:
        return row.quota_name(spot=spot)
    return (
        f"{instance_type} for spot training job usage" if spot else f"{instance_type} for training job usage"
    )
