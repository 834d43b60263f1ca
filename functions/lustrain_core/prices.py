"""Dated list prices and instance facts the planner uses. Every figure is overridable (`--prices FILE`).

Prices are us-east-1 on-demand list prices as of the date below; confirm before trusting a budget to the cent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

PRICES_AS_OF = "2026-11-01"


@dataclass(frozen=True)
class InstanceType:
    gpus: int
    #: private IPs the run plans per instance (SageMaker's floor for EFA instances is 5; the field guide plans 6)
    ips: int
    #: usable local storage for outputs (p4d: 8 x 1000 GB NVMe, about 6 TB usable per the field guide)
    usable_output_gib: float
    hourly_usd: float
    #: instance types with local NVMe cannot take a VolumeKmsKeyId
    local_nvme: bool
    efa: bool
    #: SageMaker's infrastructure health check (InfraCheckConfig) is turned on for multi-instance jobs of this type:
    #: the accelerated training families, whose jobs span many hosts joined by EFA
    infra_check: bool = False


_TB = 1e12 / 2**30  # GiB in one TB

INSTANCE_TYPES: dict[str, InstanceType] = {
    "ml.p4d.24xlarge": InstanceType(8, 6, 6 * _TB, 37.688, local_nvme=True, efa=True, infra_check=True),
    "ml.p4de.24xlarge": InstanceType(8, 6, 6 * _TB, 47.11, local_nvme=True, efa=True, infra_check=True),
    "ml.p5.48xlarge": InstanceType(8, 6, 24 * _TB, 113.07, local_nvme=True, efa=True, infra_check=True),
    "ml.g5.12xlarge": InstanceType(4, 1, 3 * _TB, 7.09, local_nvme=True, efa=False),
    "ml.g5.48xlarge": InstanceType(8, 6, 6 * _TB, 20.36, local_nvme=True, efa=True),
    # CPU types: the local rehearsal plans with these
    "ml.m5.xlarge": InstanceType(0, 1, 30, 0.23, local_nvme=False, efa=False),
    "ml.c5.xlarge": InstanceType(0, 1, 30, 0.204, local_nvme=False, efa=False),
}

#: FSx for Lustre $ per GB-month, by deployment type and MB/s per TiB
FSX_GB_MONTH_USD: dict[tuple[str, int], float] = {
    ("SCRATCH_2", 200): 0.140,
    ("PERSISTENT_2", 125): 0.145,
    ("PERSISTENT_2", 250): 0.210,
    ("PERSISTENT_2", 500): 0.340,
    ("PERSISTENT_2", 1000): 0.600,
}


@dataclass(frozen=True)
class PriceTable:
    as_of: str = PRICES_AS_OF
    instance_types: dict[str, InstanceType] = field(default_factory=lambda: dict(INSTANCE_TYPES))
    fsx_gb_month_usd: dict[tuple[str, int], float] = field(default_factory=lambda: dict(FSX_GB_MONTH_USD))
    #: managed spot: the fraction of the on-demand price a run is planned to pay
    spot_price_fraction: float = 0.35
    sfn_per_transition_usd: float = 0.025 / 1000
    lambda_per_request_usd: float = 0.20 / 1_000_000
    #: an interface VPC endpoint (AWS PrivateLink; code.secrets' Secrets Manager and SSM): each endpoint in each
    #: availability zone, each hour or part of one, and each GB it carries
    interface_endpoint_az_hour_usd: float = 0.01
    interface_endpoint_gb_usd: float = 0.01
    hours_per_month: float = 730.0

    def with_overrides(self, overrides: dict[str, Any]) -> PriceTable:
        """Apply a user's JSON overrides: {"instance_hourly_usd": {type: $}, "fsx_gb_month_usd": {"PERSISTENT_2/250": $},
        "spot_price_fraction": f, "interface_endpoint_az_hour_usd": $, "as_of": "date"}."""
        known = {
            "instance_hourly_usd",
            "fsx_gb_month_usd",
            "spot_price_fraction",
            "as_of",
            "interface_endpoint_az_hour_usd",
        }
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"unknown price keys {sorted(unknown)}; allowed: {sorted(known)}")
        types = dict(self.instance_types)
        for name, usd in overrides.get("instance_hourly_usd", {}).items():
            base = types.get(name) or InstanceType(8, 6, 6 * _TB, 0.0, local_nvme=True, efa=True)
            types[name] = replace(base, hourly_usd=float(usd))
        fsx = dict(self.fsx_gb_month_usd)
        for key, usd in overrides.get("fsx_gb_month_usd", {}).items():
            kind, _, rate = key.partition("/")
            fsx[(kind, int(rate))] = float(usd)
        return replace(
            self,
            as_of=str(overrides.get("as_of", self.as_of)),
            instance_types=types,
            fsx_gb_month_usd=fsx,
            spot_price_fraction=float(overrides.get("spot_price_fraction", self.spot_price_fraction)),
            interface_endpoint_az_hour_usd=float(
                overrides.get("interface_endpoint_az_hour_usd", self.interface_endpoint_az_hour_usd)
            ),
        )

    def billed_compute_usd(self, instance_type: str, instance_count: float, billable_seconds: float) -> float | None:
        """What SageMaker bills for a job's instances: BillableTimeInSeconds (spot savings already show in it) x the
        instance count x the list price per hour; None for an instance type with no price here."""
        itype = self.instance_types.get(instance_type)
        if itype is None:
            return None
        return round(instance_count * itype.hourly_usd * billable_seconds / 3600, 2)

    @classmethod
    def load(cls, path: str | Path | None) -> PriceTable:
        return cls() if path is None else cls().with_overrides(json.loads(Path(path).read_text()))
