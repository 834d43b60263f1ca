"""EC2's instance type offerings per zone, as an account sees them: the large GPU types in only some zones.

moto 5.2.5 answers DescribeInstanceTypeOfferings from two tables recorded separately, one by zone name and one by
zone id, that disagree with its own name-to-id mapping (p4de.24xlarge is in us-east-1b and -1c by name, in use1-az4
and use1-az6, which it calls us-east-1d and -1a, by id), and it lists every GPU type in us-east-1a. An account of
AWS sees one mapping and, for p4d and its kind, a subset of the zones that need not include the alphabetically
first. The twin answers from one table by zone id for the types in OFFERED_ZONE_IDS, the zone-name view derived from
it through the region's own mapping (DescribeAvailabilityZones), and leaves moto's answer for every other type.
Each zone set is a subset of moto's recorded one.

An answer filtered by instance type is looked up in an index of moto's table by type, in the table's order: moto
tested each of the region's several thousand offerings against the filters at every call, which every run's zone
choice made. The offerings it answers are the same.
"""

from __future__ import annotations

import functools
from typing import Any

from moto.ec2.models.instance_types import INSTANCE_TYPE_OFFERINGS, InstanceTypeOfferingBackend

_PATCHED = "_lustrain_twin_offerings"

#: region -> EC2 instance type -> the zone ids that offer it
OFFERED_ZONE_IDS: dict[str, dict[str, tuple[str, ...]]] = {
    "us-east-1": {
        "p4d.24xlarge": ("use1-az1", "use1-az2", "use1-az4"),
        "p4de.24xlarge": ("use1-az4",),
        "p5.48xlarge": ("use1-az2", "use1-az4", "use1-az5"),
        "p5en.48xlarge": ("use1-az2",),
        "p6-b200.48xlarge": ("use1-az6",),
    },
}


@functools.cache
def _by_type(location_type: str, region: str) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    """moto's offerings of a region for a location type, by instance type, each with its place in moto's table."""
    index: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for place, offering in enumerate(INSTANCE_TYPE_OFFERINGS[location_type].get(region, [])):
        index.setdefault(str(offering.get("InstanceType")), []).append((place, offering))
    return index


def _moto_answer(backend: Any, location_type: str, filters: dict[str, Any] | None) -> list[Any]:
    """moto's own answer: its table's offerings that match the filters, in the table's order."""
    filters = filters or {}
    types = filters.get("instance-type")
    if types is None:
        candidates = list(INSTANCE_TYPE_OFFERINGS[location_type].get(backend.region_name, []))
    else:
        index = _by_type(location_type, backend.region_name)
        candidates = [o for _, o in sorted((row for t in set(types) for row in index.get(t, ())), key=lambda r: r[0])]
    return [o for o in candidates if backend.matches_filters(o, filters, location_type)]


def install() -> None:
    original = InstanceTypeOfferingBackend.describe_instance_type_offerings
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def describe_instance_type_offerings(
        self: Any, location_type: str | None = None, filters: dict[str, Any] | None = None
    ) -> list[Any]:
        location_type = location_type or "region"
        table = OFFERED_ZONE_IDS.get(self.region_name, {})
        if location_type == "region":
            return _moto_answer(self, location_type, filters)
        answer = [o for o in _moto_answer(self, location_type, filters) if o.get("InstanceType") not in table]
        names = {z.zone_id: z.name for z in self.describe_availability_zones()}
        for instance_type, zone_ids in table.items():
            for zone_id in zone_ids:
                where = zone_id if location_type == "availability-zone-id" else names.get(zone_id)
                offering = {"InstanceType": instance_type, "LocationType": location_type, "Location": where}
                if where and self.matches_filters(offering, filters or {}, location_type):
                    answer.append(offering)
        return answer

    setattr(describe_instance_type_offerings, _PATCHED, True)
    InstanceTypeOfferingBackend.describe_instance_type_offerings = describe_instance_type_offerings  # type: ignore[method-assign]
