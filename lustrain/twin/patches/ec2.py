"""EC2 refuses a security group's name and description outside the rules AWS documents; moto 5.2.5 takes any.

https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateSecurityGroup.html: GroupName and Description,
up to 255 characters of a-z, A-Z, 0-9, spaces and ._-:/()#,@[]+=&;{}!$* in a VPC, and a name may not start with
sg-. The rule is lustrain_core.limits.DOCUMENTED's (one statement of AWS's page); the answers are AWS's
InvalidParameterValue.
"""

from __future__ import annotations

import functools
from typing import Any

import regex
from lustrain_core.limits import DOCUMENTED
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.models.security_groups import SecurityGroupBackend

_PATCHED = "_lustrain_twin_group_rules"
_NAME, _ = DOCUMENTED[("ec2", "CreateSecurityGroup", "GroupName")]
_DESCRIPTION, _ = DOCUMENTED[("ec2", "CreateSecurityGroup", "Description")]
ALLOWED = "a-zA-Z0-9. _-:/()#,@[]+=&;{}!$*"


def install() -> None:
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
