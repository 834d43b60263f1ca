"""A training job as AWS's network and IAM let it run: it reaches S3 only through its subnet and security group, its
own calls are its execution role's, CreateTrainingJob checks that role as SageMaker does, and its log is in
CloudWatch Logs where SageMaker writes it."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
import test_twin_sagemaker
from test_twin_sagemaker import ACCOUNT, REGION, Twin, error_of

from lustrain.twin import simulator
from lustrain.twin.patches import service_quotas

# the SageMaker tests' world (a bucket with the code and data, a VPC, the events queue) and its per-test twin
world = test_twin_sagemaker.world
twin = test_twin_sagemaker.twin

UNREACHABLE = (
    "ClientError: Data download failed:Please ensure that the subnet's route table has a route to an S3 VPC "
    "endpoint or a NAT device, and both the security groups and the subnet's network ACL allow outbound traffic "
    "to S3."
)
#: What SageMaker's VPC mode needs of the role (EC2), and what a job reads and writes (S3), as statements.
VPC_MODE = {"Effect": "Allow", "Action": ["ec2:*NetworkInterface*", "ec2:Describe*"], "Resource": "*"}
PULL = {"Effect": "Allow", "Action": "ecr:*", "Resource": "*"}


def network(
    *, https_out: bool = True, s3_route: bool = True, peers_by_group: bool = True, endpoint_policy: Any = None
) -> dict[str, list[str]]:
    """A VPC of its own for one job: (VpcConfig) with the given holes in it."""
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.90.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.90.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="job", Description="job", VpcId=vpc)["GroupId"]
    ec2.revoke_security_group_egress(
        GroupId=group, IpPermissions=[{"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]
    )
    peer = {"UserIdGroupPairs": [{"GroupId": group}]} if peers_by_group else {"IpRanges": [{"CidrIp": "10.90.0.0/16"}]}
    ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=[{"IpProtocol": "-1", **peer}])
    out: list[dict[str, Any]] = [{"IpProtocol": "-1", **peer}]
    table = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["RouteTables"][0]
    if s3_route:
        endpoint: dict[str, Any] = {}
        if endpoint_policy is not None:
            endpoint["PolicyDocument"] = json.dumps(endpoint_policy)
        ec2.create_vpc_endpoint(
            VpcId=vpc,
            ServiceName=f"com.amazonaws.{REGION}.s3",
            VpcEndpointType="Gateway",
            RouteTableIds=[table["RouteTableId"]],
            **endpoint,
        )
    if https_out:
        s3_list = ec2.describe_managed_prefix_lists(
            Filters=[{"Name": "prefix-list-name", "Values": [f"com.amazonaws.{REGION}.s3"]}]
        )["PrefixLists"][0]["PrefixListId"]
        out.append({"IpProtocol": "tcp", "FromPort": 443, "ToPort": 443, "PrefixListIds": [{"PrefixListId": s3_list}]})
    ec2.authorize_security_group_egress(GroupId=group, IpPermissions=out)
    return {"Subnets": [subnet], "SecurityGroupIds": [group]}


def ended(twin: Twin, name: str) -> dict[str, Any]:
    simulator.wait_all(timeout=60)
    return twin.describe(name)


def test_a_job_in_a_network_that_reaches_s3_through_the_endpoint_and_https_completes(twin: Twin) -> None:
    twin.sm.create_training_job(**twin.request("reaches-s3", VpcConfig=network()))
    assert ended(twin, "reaches-s3")["TrainingJobStatus"] == "Completed"


@pytest.mark.parametrize("hole", ["https_out", "s3_route"])
def test_a_job_that_cannot_reach_s3_fails_as_sagemaker_fails_it(twin: Twin, hole: str) -> None:
    name = f"no-{hole.replace('_', '-')}"
    twin.sm.create_training_job(**twin.request(name, VpcConfig=network(**{hole: False})))
    failed = ended(twin, name)
    assert (failed["TrainingJobStatus"], failed["FailureReason"]) == ("Failed", UNREACHABLE)


def test_an_endpoint_policy_that_does_not_allow_the_code_bucket_denies_the_download(twin: Twin) -> None:
    only_elsewhere = {
        "Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:*", "Resource": "arn:aws:s3:::other/*"}]
    }
    twin.sm.create_training_job(**twin.request("endpoint-says-no", VpcConfig=network(endpoint_policy=only_elsewhere)))
    failed = ended(twin, "endpoint-says-no")
    assert failed["FailureReason"].startswith("ClientError: Data download failed:Failed to download data. AccessDenied")
    assert "because no VPC endpoint policy allows the s3:GetObject action" in failed["FailureReason"]


def test_an_efa_job_whose_group_admits_its_peers_by_cidr_only_fails_as_a_distributed_job(twin: Twin) -> None:
    service_quotas.set_quota("ml.p4d.24xlarge", 2, REGION)
    request = twin.request(
        "efa-by-cidr",
        VpcConfig=network(peers_by_group=False),
        ResourceConfig={"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2, "VolumeSizeInGB": 100},
    )
    twin.sm.create_training_job(**request)
    failed = ended(twin, "efa-by-cidr")
    assert failed["TrainingJobStatus"] == "Failed"
    assert "DistNetworkError" in failed["FailureReason"] and "2 instances cannot reach each other" in failed["FailureReason"]


def role(name: str, statements: list[dict[str, Any]], service: str = "sagemaker.amazonaws.com") -> str:
    iam = boto3.client("iam", region_name=REGION)
    trust = {"Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]}
    arn = str(iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"])
    iam.put_role_policy(RoleName=name, PolicyName="p", PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": statements}))
    return arn


def test_a_role_sagemaker_cannot_assume_is_refused_at_create(twin: Twin) -> None:
    arn = role("for-lambda-only", [VPC_MODE], service="lambda.amazonaws.com")
    assert error_of(twin.sm.create_training_job, **twin.request("wrong-trust", RoleArn=arn)) == (
        "ValidationException",
        f"Could not assume role {arn}. Please ensure that the role exists and allows principal "
        "'sagemaker.amazonaws.com' to assume the role.",
    )


def test_a_role_without_vpc_mode_permissions_is_refused_at_create(twin: Twin) -> None:
    arn = role("no-vpc-mode", [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}])
    assert error_of(twin.sm.create_training_job, **twin.request("no-enis", RoleArn=arn)) == (
        "ValidationException",
        "The provided execution role does not have permissions to call CreateNetworkInterface on EC2",
    )


def test_the_jobs_uploads_are_its_roles_a_role_that_may_only_read_fails_the_upload(twin: Twin) -> None:
    reads = {"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"], "Resource": "*"}
    arn = role("reads-only", [VPC_MODE, PULL, reads])
    twin.sm.create_training_job(**twin.request("cannot-upload", RoleArn=arn))
    failed = ended(twin, "cannot-upload")
    assert failed["FailureReason"].startswith("ClientError: Artifact upload failed:Failed to upload data. AccessDenied")
    assert (
        f"User: arn:aws:sts::{ACCOUNT}:assumed-role/reads-only/SageMaker is not authorized to perform: s3:PutObject"
        in failed["FailureReason"]
    )


def test_a_role_that_may_not_pull_the_image_fails_the_job_before_anything_is_downloaded(twin: Twin) -> None:
    arn = role("no-ecr", [VPC_MODE, {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}])
    twin.sm.create_training_job(**twin.request("cannot-pull", RoleArn=arn))
    failed = ended(twin, "cannot-pull")
    assert failed["FailureReason"].startswith("ClientError: Cannot pull the training image 763104351884.dkr.ecr.")
    assert "not authorized to perform: ecr:GetAuthorizationToken" in failed["FailureReason"]
    assert "TrainingStartTime" not in failed


def test_the_job_writes_its_log_to_cloudwatch_where_sagemaker_does(twin: Twin) -> None:
    twin.sm.create_training_job(**twin.request("logs-to-cloudwatch"))
    assert ended(twin, "logs-to-cloudwatch")["TrainingJobStatus"] == "Completed"
    logs = boto3.client("logs", region_name=REGION)
    (stream,) = logs.describe_log_streams(
        logGroupName="/aws/sagemaker/TrainingJobs", logStreamNamePrefix="logs-to-cloudwatch/"
    )["logStreams"]
    assert stream["logStreamName"].startswith("logs-to-cloudwatch/algo-1-")
    lines = [
        e["message"]
        for e in logs.get_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream["logStreamName"])[
            "events"
        ]
    ]
    assert "step=1 train_loss=2.0 tokens_per_s=10" in lines


def test_a_role_that_may_not_write_logs_loses_the_logs_not_the_job(twin: Twin) -> None:
    everything_but_logs = {"Effect": "Allow", "NotAction": "logs:*", "Resource": "*"}
    arn = role("no-logs", [everything_but_logs])
    twin.sm.create_training_job(**twin.request("silent-logs", RoleArn=arn))
    assert ended(twin, "silent-logs")["TrainingJobStatus"] == "Completed"
    logs = boto3.client("logs", region_name=REGION)
    groups = logs.describe_log_groups(logGroupNamePrefix="/aws/sagemaker/TrainingJobs")["logGroups"]
    streams = (
        logs.describe_log_streams(logGroupName="/aws/sagemaker/TrainingJobs", logStreamNamePrefix="silent-logs/")[
            "logStreams"
        ]
        if groups
        else []
    )
    assert streams == []
