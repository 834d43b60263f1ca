"""The availability zone of a run's subnet: one that offers the run's instance type, in the spec's order.

Not every zone of a region offers every instance type: p4d.24xlarge, for one, is offered in some zones of us-east-1
and not in others. A subnet in a zone without the type makes a training job that cannot get its instances, after
the network and the file system (which pins every attempt of the run to that zone) were made and billed.

Where a type is offered comes from EC2's DescribeInstanceTypeOfferings with LocationType availability-zone-id, for
the ml type's EC2 counterpart (ml.p4d.24xlarge -> p4d.24xlarge). SageMaker publishes no API of its own for the
zones it trains a type in; its VpcConfig reference sends the reader to a page of supported instance types and
zones. That SageMaker's training capacity follows EC2's offerings is an assumption: a zone EC2 lists may still lack
SageMaker capacity on the day (CapacityError, which the capacity queue and recovery handle), and a type EC2 lists
in no zone of the region (a SageMaker-only type, or one sold only as reserved capacity) is not refused: every
available zone is then a candidate, in the same order.

network.availability_zone names zones by their name (us-east-1a) or their id (use1-az4). Zone names are mapped to
physical zones independently for each account (us-east-1a of one account may be use1-az6, of another use1-az1);
zone ids are the same in every account, which is why offerings are read by id and a spec may give ids. A named
zone that is not an available zone of the region, or does not offer the type, is refused (SpecInvalid naming
network.availability_zone) by register_job, before anything exists. `auto` takes the offering zones by name.
A training plan's reserved capacity lies in one zone (compute.training_plan): the run's subnet must be there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lustrain_core.errors import SpecInvalid

FIELD = "network.availability_zone"


@dataclass(frozen=True)
class Zone:
    name: str
    zone_id: str

    def __str__(self) -> str:
        return f"{self.name} ({self.zone_id})"

    def named(self, ref: str) -> bool:
        return ref in (self.name, self.zone_id)


def ec2_instance_type(instance_type: str) -> str:
    """The EC2 instance type a SageMaker ml type runs on: ml.p4d.24xlarge -> p4d.24xlarge."""
    return instance_type.removeprefix("ml.")


def available_zones(ec2: Any) -> list[Zone]:
    """The region's available availability zones (not Local Zones nor Wavelength Zones), by name."""
    answer = ec2.describe_availability_zones(Filters=[{"Name": "state", "Values": ["available"]}])
    return sorted(
        (
            Zone(str(z["ZoneName"]), str(z["ZoneId"]))
            for z in answer["AvailabilityZones"]
            if z.get("ZoneType", "availability-zone") == "availability-zone"
        ),
        key=lambda z: z.name,
    )


def offering_zone_ids(ec2: Any, instance_type: str) -> set[str]:
    """The ids of the zones where EC2 offers the ml type's EC2 counterpart."""
    found: set[str] = set()
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone-id",
        Filters=[{"Name": "instance-type", "Values": [ec2_instance_type(instance_type)]}],
    )
    for page in pages:
        found.update(str(o["Location"]) for o in page.get("InstanceTypeOfferings", []))
    return found


def zone_choices(
    ec2: Any,
    instance_type: str,
    preferred: list[str],
    *,
    required: str | None = None,
    required_by: str = "compute.training_plan",
) -> list[Zone]:
    """The zones a run's subnet may go to, best first: the preferred ones (names or ids) in their order, else every
    zone that offers the type. `required` (a zone name or id: a training plan's) narrows them to that one zone.
    SpecInvalid names network.availability_zone for a zone that does not exist here, does not offer the type, or
    is not the required one."""
    zones = available_zones(ec2)

    def zone_named(ref: str) -> Zone:
        zone = next((z for z in zones if z.named(ref)), None)
        if zone is None:
            raise SpecInvalid.one(
                FIELD,
                ref,
                f"not an available zone of this region; available: {', '.join(str(z) for z in zones)}",
            )
        return zone

    if required is not None:
        # reserved capacity is where it was reserved, whatever EC2 lists
        need = next((z for z in zones if z.named(required)), None)
        if need is None:
            raise SpecInvalid.one(
                required_by, required, "its reserved capacity's zone is not an available zone of this region"
            )
        if preferred and need not in [zone_named(ref) for ref in preferred]:
            raise SpecInvalid.one(
                FIELD,
                preferred,
                f"the training plan of {required_by} reserves its instances in {need}, which this does not name",
            )
        return [need]
    offered = offering_zone_ids(ec2, instance_type)
    ec2_type = ec2_instance_type(instance_type)
    offering = [z for z in zones if z.zone_id in offered] if offered else list(zones)
    if not preferred:
        if not offering:
            raise SpecInvalid.one("compute.instance_type", instance_type, "this region has no available zone")
        return offering
    chosen = []
    for ref in preferred:
        zone = zone_named(ref)
        if zone not in offering:
            raise SpecInvalid.one(
                FIELD,
                ref,
                f"{zone} does not offer {ec2_type} (EC2 DescribeInstanceTypeOfferings), which "
                f"compute.instance_type {instance_type} runs on; zones that do: "
                f"{', '.join(str(z) for z in offering) or 'none'}",
            )
        chosen.append(zone)
    return chosen
