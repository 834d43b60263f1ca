"""Dated list prices and instance facts the planner uses. Every figure is overridable (`--prices FILE`).

Instance types and their prices are rows of the catalogue (data/instance_types.json, lustrain_core.instance_types),
each with its own price date and source; the other prices are us-east-1 list prices as of the date below. Confirm
before trusting a budget to the cent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lustrain_core.instance_types import INSTANCE_TYPES as CATALOGUE
from lustrain_core.instance_types import CatalogueError, InstanceType, parse_row

__all__ = ["INSTANCE_TYPES", "CatalogueError", "InstanceType", "PriceTable"]

PRICES_AS_OF = "2026-11-01"


#: the catalogue's rows (data/instance_types.json, read by lustrain_core.instance_types), re-exported: the planner
#: and the steps read instance facts from here
INSTANCE_TYPES: dict[str, InstanceType] = CATALOGUE

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
        """Apply a user's JSON overrides: {"instance_types": {type: catalogue row}, "instance_hourly_usd": {type: $},
        "fsx_gb_month_usd": {"PERSISTENT_2/250": $}, "spot_price_fraction": f, "interface_endpoint_az_hour_usd": $,
        "as_of": "date"}. A row adds a type (or replaces one) for this plan, as a row of data/instance_types.json
        does for every plan; a price alone is for a type the catalogue has."""
        known = {
            "instance_types",
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
        rows = overrides.get("instance_types", {})
        if not isinstance(rows, dict):
            raise ValueError('instance_types is an object {"ml.<type>": {row as in data/instance_types.json}}')
        for name, row in rows.items():
            types[name] = parse_row(name, row)
        as_of = str(overrides.get("as_of", self.as_of))
        for name, usd in overrides.get("instance_hourly_usd", {}).items():
            base = types.get(name)
            if base is None:
                raise ValueError(
                    f"instance_hourly_usd: {name} is not in the catalogue; add its whole row under instance_types "
                    f"(known: {', '.join(sorted(types))})"
                )
            types[name] = replace(base, hourly_usd=float(usd), price_as_of=as_of, price_source="--prices")
        fsx = dict(self.fsx_gb_month_usd)
        for key, usd in overrides.get("fsx_gb_month_usd", {}).items():
            kind, _, rate = key.partition("/")
            fsx[(kind, int(rate))] = float(usd)
        return replace(
            self,
            as_of=as_of,
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
        if itype is None or itype.hourly_usd is None:
            return None
        return round(instance_count * itype.hourly_usd * billable_seconds / 3600, 2)

    @classmethod
    def load(cls, path: str | Path | None) -> PriceTable:
        return cls() if path is None else cls().with_overrides(json.loads(Path(path).read_text()))
