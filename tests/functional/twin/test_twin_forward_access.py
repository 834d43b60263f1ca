"""Forward access on the twin: FSx's CreateFileSystem reads the network with its caller's permissions.

On AWS, FSx checks the subnet, its VPC, the security groups and the route tables with the credentials of whoever
called CreateFileSystem, `aws:CalledVia` fsx.amazonaws.com in the request context (AmazonFSxFullAccess grants
exactly these reads under that condition). The twin authorizes those forward calls against the caller's policies:
without the grant the create is refused naming the action, and the grant, scoped to calls through FSx, does not
let the caller read the network itself. The grant is template.yaml's own statement.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from twinhelpers import REGION, client

from lustrain.twin.cfn import load_template
from lustrain.twin.iam import enforce

pytestmark = pytest.mark.usefixtures("moto_twin")

TEMPLATE = load_template(Path(__file__).resolve().parents[3] / "template.yaml")
SID = "FsxReadsTheNetwork"
FORWARDED = (
    "ec2:DescribeSubnets",
    "ec2:DescribeVpcs",
    "ec2:DescribeSecurityGroups",
    "ec2:GetSecurityGroupsForVpc",
    "ec2:DescribeRouteTables",
)
#: what CreateFilesystemFunction's role holds besides the network reads (tagging and the service-linked roles)
CREATE = {
    "Effect": "Allow",
    "Action": ["fsx:CreateFileSystem", "fsx:TagResource", "iam:CreateServiceLinkedRole"],
    "Resource": "*",
}


def template_statement() -> dict[str, Any]:
    for policy in TEMPLATE["Resources"]["CreateFilesystemFunction"]["Properties"]["Policies"]:
        for statement in policy.get("Statement", []) if isinstance(policy, dict) else []:
            if statement.get("Sid") == SID:
                return dict(statement)
    raise AssertionError(f"CreateFilesystemFunction has no statement {SID}")


def test_the_template_grants_the_network_reads_only_through_fsx():
    statement = template_statement()
    assert sorted(statement["Action"]) == sorted(FORWARDED)
    assert statement["Condition"] == {"ForAnyValue:StringEquals": {"aws:CalledVia": "fsx.amazonaws.com"}}


def caller(statements: list[dict[str, Any]]) -> boto3.Session:
    """A session of a role holding `statements`, as a Lambda function's would be."""
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
        ],
    }
    iam = client("iam")
    arn = iam.create_role(RoleName="create-filesystem", AssumeRolePolicyDocument=json.dumps(trust))["Role"][
        "Arn"
    ]
    iam.put_role_policy(
        RoleName="create-filesystem",
        PolicyName="create",
        PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": statements}),
    )
    _, credentials = enforce.assume(arn, "create-filesystem", service="lambda.amazonaws.com")
    return boto3.Session(
        aws_access_key_id=credentials["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=credentials["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=credentials["AWS_SESSION_TOKEN"],
        region_name=REGION,
    )


@pytest.fixture
def network() -> dict[str, str]:
    ec2 = client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.80.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.80.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="lustre", Description="lustre", VpcId=vpc)["GroupId"]
    ec2.authorize_security_group_ingress(
        GroupId=group,
        IpPermissions=[
            {"IpProtocol": "tcp", "FromPort": 988, "ToPort": 988, "UserIdGroupPairs": [{"GroupId": group}]},
            {"IpProtocol": "tcp", "FromPort": 1018, "ToPort": 1023, "UserIdGroupPairs": [{"GroupId": group}]},
        ],
    )
    return {"subnet": subnet, "group": group}


def create(session: boto3.Session, network: dict[str, str]) -> dict[str, Any]:
    file_system: dict[str, Any] = session.client("fsx").create_file_system(
        FileSystemType="LUSTRE",
        StorageCapacity=1200,
        SubnetIds=[network["subnet"]],
        SecurityGroupIds=[network["group"]],
        LustreConfiguration={"DeploymentType": "SCRATCH_2"},
    )["FileSystem"]
    return file_system


def test_with_the_templates_grant_fsx_reads_the_network_and_the_caller_cannot(network):
    session = caller([CREATE, template_statement()])
    enforce.clear_log()

    assert create(session, network)["Lifecycle"] == "CREATING"

    forwarded = [
        r for r in enforce.log() if r.operation == "CreateFileSystem" and r.action.startswith("ec2:")
    ]
    assert sorted(r.action for r in forwarded) == sorted(FORWARDED)
    assert all(
        r.allowed and r.request and r.request.value("aws:CalledVia") == ["fsx.amazonaws.com"]
        for r in forwarded
    )
    with pytest.raises(ClientError) as raised:
        session.client("ec2").describe_subnets(SubnetIds=[network["subnet"]])
    assert raised.value.response["Error"]["Code"] == "UnauthorizedOperation"
    assert "not authorized to perform: ec2:DescribeSubnets" in raised.value.response["Error"]["Message"]


@pytest.mark.parametrize("missing", FORWARDED)
def test_without_one_network_read_the_create_is_refused_naming_it(network, missing):
    statement = template_statement()
    statement["Action"] = [a for a in statement["Action"] if a != missing]
    session = caller([CREATE, statement])

    with pytest.raises(ClientError) as raised:
        create(session, network)

    error = raised.value.response["Error"]
    assert error["Code"] == "AccessDeniedException"
    assert f"is not authorized to perform: {missing}" in error["Message"]
    assert client("fsx").describe_file_systems()["FileSystems"] == []


def test_the_same_reads_granted_without_fsx_in_between_are_not_what_fsx_needs_scoped(network):
    # a grant that names another service in aws:CalledVia does not cover FSx's reads
    statement = template_statement()
    statement["Condition"] = {"ForAnyValue:StringEquals": {"aws:CalledVia": "cloudformation.amazonaws.com"}}
    session = caller([CREATE, statement])

    with pytest.raises(ClientError) as raised:
        create(session, network)

    assert "is not authorized to perform: ec2:DescribeSubnets" in raised.value.response["Error"]["Message"]
