"""EC2 refuses a security group's name and description outside the rules AWS documents; moto 5.2.5 takes any.
And CreateVpcEndpoint keeps two promises moto does not: an interface endpoint with private DNS needs the VPC's
enableDnsSupport and enableDnsHostnames (CreateVpcEndpoint's PrivateDnsEnabled, EC2 API Reference: "To use a private
hosted zone, you must set the following VPC attributes to true"), and a ClientToken seen before returns the endpoint
it made, not a second one ("Ensuring idempotency", EC2 API Reference). DeleteVpcEndpoints of an endpoint already
deleted deletes nothing more (moto removed its gateway routes a second time and answered InvalidRoute.NotFound, an
error AWS's DeleteVpcEndpoints does not give; two teardowns of a run at once met it), one delete at a time.

https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateSecurityGroup.html: GroupName and Description,
up to 255 characters of a-z, A-Z, 0-9, spaces and ._-:/()#,@[]+=&;{}!$* in a VPC, and a name may not start with
sg-. The rule is lustrain_core.limits.DOCUMENTED's (one statement of AWS's page); the answers are AWS's
InvalidParameterValue.

The twin's account has no public machine images: a run launches no EC2 instance (SageMaker's instances are its own),
and moto built its catalogue of several thousand AMIs, each with a snapshot and a volume, for every account and
region a test touched, about 0.7 s of CPU each time.

A resource's own tags are read from the backend's table by its id: moto found them by matching a regular expression
of the id against every tag of every resource in the region, once per resource a tag filter looks at, so each
DescribeVpcs, DescribeSubnets or DescribeSecurityGroups with a tag filter (teardown, the sweeper, the rehearsal's
leftover count) took time in the square of the resources the twin held. The answer is the same.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import regex
from lustrain_core.limits import DOCUMENTED
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.models.amis import AmiBackend
from moto.ec2.models.core import TaggedEC2Resource
from moto.ec2.models.security_groups import SecurityGroupBackend
from moto.ec2.models.vpcs import VPCBackend
from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix

_PATCHED = "_lustrain_twin_group_rules"
_NAME, _ = DOCUMENTED[("ec2", "CreateSecurityGroup", "GroupName")]
_DESCRIPTION, _ = DOCUMENTED[("ec2", "CreateSecurityGroup", "Description")]
ALLOWED = "a-zA-Z0-9. _-:/()#,@[]+=&;{}!$*"


_deletes = threading.Lock()


def install() -> None:
    _install_own_tags()
    _install_no_public_images()
    _install_group_rules()
    _install_endpoint_rules()
    _install_endpoint_deletes()


def _install_no_public_images() -> None:
    if getattr(AmiBackend._load_amis, _PATCHED, False):
        return

    def no_public_images(self: Any) -> None:
        """The account starts with no images of its own and none of AWS's."""

    setattr(no_public_images, _PATCHED, True)
    AmiBackend._load_amis = no_public_images  # type: ignore[method-assign]


def _install_own_tags() -> None:
    if getattr(TaggedEC2Resource.get_tags, _PATCHED, False):
        return

    def get_tags(self: Any) -> list[dict[str, str]]:
        """moto's describe_tags(filters={"resource-id": [id]}) for this resource, by a lookup of its id."""
        resource_id = getattr(self, "id", None)
        if not resource_id:
            return []
        tags = self.ec2_backend.tags.get(resource_id) or {}
        kind = EC2_PREFIX_TO_RESOURCE.get(get_prefix(resource_id), "")
        return [
            {"resource_id": resource_id, "key": key, "value": value, "resource_type": kind}
            for key, value in list(tags.items())
        ]

    setattr(get_tags, _PATCHED, True)
    TaggedEC2Resource.get_tags = get_tags  # type: ignore[method-assign]


def _install_endpoint_deletes() -> None:
    original = VPCBackend.delete_vpc_endpoints
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def delete_vpc_endpoints(self: Any, vpce_ids: list[str] | None = None) -> None:
        with _deletes:
            live = [
                i for i in vpce_ids or [] if getattr(self.vpc_end_points.get(i), "state", None) != "deleted"
            ]
            original(self, live)

    setattr(delete_vpc_endpoints, _PATCHED, True)
    VPCBackend.delete_vpc_endpoints = delete_vpc_endpoints  # type: ignore[method-assign]


def _install_endpoint_rules() -> None:
    original = VPCBackend.create_vpc_endpoint
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def create_vpc_endpoint(self: Any, vpc_id: str, *args: Any, **kwargs: Any) -> Any:
        token = kwargs.get("client_token")
        if token:
            for endpoint in self.vpc_end_points.values():
                if endpoint.client_token == token and endpoint.vpc_id == vpc_id:
                    return endpoint
        endpoint_type = kwargs.get("endpoint_type") or (args[1] if len(args) > 1 else None)
        if kwargs.get("private_dns_enabled") and str(endpoint_type).lower() == "interface":
            vpc = self.get_vpc(vpc_id)
            if not (vpc.enable_dns_support and vpc.enable_dns_hostnames):
                raise EC2ClientError(
                    "InvalidParameter",
                    "Enabling private DNS requires both enableDnsSupport and enableDnsHostnames VPC attributes set "
                    f"to true for {vpc_id}",
                )
        return original(self, vpc_id, *args, **kwargs)

    setattr(create_vpc_endpoint, _PATCHED, True)
    VPCBackend.create_vpc_endpoint = create_vpc_endpoint  # type: ignore[method-assign]


def _install_group_rules() -> None:
    original = SecurityGroupBackend.create_security_group
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def create_security_group(self: Any, name: str, description: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("sg-"):
            raise EC2ClientError("InvalidParameterValue", "Group names may not be in the format sg-*.")
        if not regex.fullmatch(_NAME, name):
            raise EC2ClientError(
                "InvalidParameterValue",
                f"Value ({name}) for parameter GroupName is invalid. Valid names are strings less than 256 "
                f"characters from the following set: {ALLOWED}",
            )
        if description and not regex.fullmatch(_DESCRIPTION, description):
            raise EC2ClientError(
                "InvalidParameterValue",
                f"Value ({description}) for parameter GroupDescription is invalid. Valid descriptions are strings "
                f"less than 256 characters from the following set: {ALLOWED}",
            )
        return original(self, name, description, *args, **kwargs)

    setattr(create_security_group, _PATCHED, True)
    SecurityGroupBackend.create_security_group = create_security_group  # type: ignore[method-assign]
