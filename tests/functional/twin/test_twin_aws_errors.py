"""The twin answers the not-found and conflict cases the core relies on with AWS's own error codes (each is
recognised by code in lustrain_core/aws_errors.py, never by its wording)."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError
from lustrain_core import aws_errors
from twinhelpers import client, key_table

pytestmark = pytest.mark.usefixtures("moto_twin")


def code_of(call: Any, **params: Any) -> str:
    with pytest.raises(ClientError) as raised:
        call(**params)
    return aws_errors.error_code(raised.value)


def test_missing_resources_are_answered_with_each_services_not_found_code() -> None:
    fsx, ec2, s3, sm = client("fsx"), client("ec2"), client("s3"), client("sagemaker")
    s3.create_bucket(Bucket="lustrain-errors")
    answers = {
        "FileSystemNotFound": code_of(fsx.describe_file_systems, FileSystemIds=["fs-0123456789abcdef0"]),
        "DataRepositoryAssociationNotFound": code_of(
            fsx.delete_data_repository_association, AssociationId="dra-0123456789abcdef0"
        ),
        "InvalidVpcID.NotFound": code_of(ec2.describe_vpcs, VpcIds=["vpc-0123456789abcdef0"]),
        "InvalidSubnetID.NotFound": code_of(ec2.describe_subnets, SubnetIds=["subnet-0123456789abcdef0"]),
        "InvalidGroup.NotFound": code_of(ec2.describe_security_groups, GroupIds=["sg-0123456789abcdef0"]),
        "NoSuchBucket": code_of(s3.get_object, Bucket="lustrain-no-such-bucket", Key="k"),
        "NoSuchKey": code_of(s3.get_object, Bucket="lustrain-errors", Key="missing"),
    }
    assert answers == {code: code for code in answers}
    assert all(aws_errors.not_found(ClientError({"Error": {"Code": c}}, "Any")) for c in answers)
    with pytest.raises(ClientError) as missing_job:
        sm.describe_training_job(TrainingJobName="never-created")
    assert aws_errors.training_job_missing(missing_job.value)


def test_conflicts_are_answered_with_awss_codes() -> None:
    ec2 = client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.70.0.0/16")["Vpc"]["VpcId"]
    ec2.create_subnet(VpcId=vpc, CidrBlock="10.70.1.0/24")
    assert code_of(ec2.delete_vpc, VpcId=vpc) == "DependencyViolation"
    ddb = key_table("lustrain-errors", "k")
    ddb.put_item(TableName="lustrain-errors", Item={"k": {"S": "1"}})
    refused = code_of(
        ddb.put_item, TableName="lustrain-errors", Item={"k": {"S": "1"}}, ConditionExpression="attribute_not_exists(k)"
    )
    assert refused == aws_errors.CONDITION_FAILED


@pytest.mark.parametrize(
    ("name", "description", "says"),
    [
        ("sg-team-training", "lustrain run", "Group names may not be in the format sg-*."),
        ("run-training", "EFA between the job's instances", "parameter GroupDescription is invalid"),
    ],
)
def test_a_security_group_name_or_description_ec2_refuses_is_refused(name: str, description: str, says: str) -> None:
    ec2 = client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    with pytest.raises(ClientError) as refused:
        ec2.create_security_group(GroupName=name, Description=description, VpcId=vpc)
    assert aws_errors.error_code(refused.value) == "InvalidParameterValue"
    assert says in refused.value.response["Error"]["Message"]
    ec2.create_security_group(GroupName="run-training", Description="lustrain run: EFA and Lustre", VpcId=vpc)


def test_a_request_outside_sagemakers_and_fsxs_model_limits_is_refused_as_each_refuses_it() -> None:
    """botocore checks only minimums; AWS refuses the rest (a tag value FSx's pattern refuses, a name too long)."""
    fsx, sm = client("fsx"), client("sagemaker")
    with pytest.raises(ClientError) as tagged:
        fsx.create_file_system(
            FileSystemType="LUSTRE",
            StorageCapacity=1200,
            SubnetIds=["subnet-0123456789abcdef0"],
            Tags=[{"Key": "team", "Value": "a#b"}],
        )
    assert aws_errors.error_code(tagged.value) == "BadRequest"
    assert (
        "1 validation error detected: Value 'a#b' at 'tags.1.member.value' failed to satisfy constraint: Member must "
        "satisfy regular expression pattern: ^([\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*)$"
    ) in tagged.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as named:
        sm.describe_training_job(TrainingJobName="x" * 64)
    assert aws_errors.error_code(named.value) == "ValidationException"
    assert "Member must have length less than or equal to 63" in named.value.response["Error"]["Message"]
