"""A training job reads code.secrets as AWS would let it: through an interface endpoint of the service in its VPC
(private DNS on), as its execution role. lustrain's launcher runs in the job as on SageMaker; the twin's stand-in for
the endpoints (lustrain/twin/simulator/secrets.py) refuses what the network or IAM would."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import boto3
import pytest
import test_twin_sagemaker
import test_twin_training_access
from botocore.exceptions import ClientError
from lustrain_core import secrets_launcher
from test_twin_sagemaker import ACCOUNT, BUCKET, REGION, Twin, tar_gz, untar
from test_twin_training_access import PULL, VPC_MODE, ended, role

world = test_twin_sagemaker.world
twin = test_twin_sagemaker.twin

VALUE = "hf_twin-value-9b1e"
SECRET_NAME = "team/hf-token"
SECRET_ARN = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{SECRET_NAME}"
CODE_KEY = "code-with-secrets/sourcedir.tar.gz"
ENTRY_POINT = b"""
import hashlib, os
os.makedirs(os.environ["SM_MODEL_DIR"], exist_ok=True)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "seen.txt"), "w") as f:
    f.write(hashlib.sha256(os.environ["HF_TOKEN"].encode()).hexdigest())
"""
#: what a job needs of its role but the secret (the code, the data, the model, the logs)
JOB_BASICS = [VPC_MODE, PULL, {"Effect": "Allow", "Action": ["s3:*", "logs:*"], "Resource": "*"}]


def bundle_with_launcher(twin: Twin) -> None:
    config = {"entry_point": "train.py", "secrets": {"HF_TOKEN": SECRET_ARN}}
    files = {
        "train.py": ENTRY_POINT,
        secrets_launcher.LAUNCHER_FILE: Path(secrets_launcher.__file__).read_bytes(),
        secrets_launcher.SECRETS_FILE: json.dumps(config).encode(),
    }
    twin.s3.put_object(Bucket=BUCKET, Key=CODE_KEY, Body=tar_gz(files))
    secrets = boto3.client("secretsmanager", region_name=REGION)
    if not secrets.list_secrets(Filters=[{"Key": "name", "Values": [SECRET_NAME]}])["SecretList"]:
        secrets.create_secret(Name=SECRET_NAME, SecretString=VALUE)


def vpc_with(*, endpoint: bool) -> dict[str, list[str]]:
    """A job's network that reaches S3, with (or without) an interface endpoint for Secrets Manager."""
    config = test_twin_training_access.network()
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.describe_subnets(SubnetIds=config["Subnets"])["Subnets"][0]["VpcId"]
    if endpoint:
        ec2.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})
        ec2.create_vpc_endpoint(
            VpcId=vpc,
            ServiceName=f"com.amazonaws.{REGION}.secretsmanager",
            VpcEndpointType="Interface",
            SubnetIds=config["Subnets"],
            SecurityGroupIds=config["SecurityGroupIds"],
            PrivateDnsEnabled=True,
        )
    return config


def request(twin: Twin, name: str, vpc: dict[str, list[str]], role_arn: str) -> dict[str, Any]:
    hps = {
        "sagemaker_program": json.dumps(secrets_launcher.LAUNCHER_FILE),
        "sagemaker_submit_directory": json.dumps(f"s3://{BUCKET}/{CODE_KEY}"),
        "sagemaker_region": json.dumps(REGION),
    }
    return twin.request(name, VpcConfig=vpc, RoleArn=role_arn, HyperParameters=hps, Environment={})


def test_a_job_whose_network_and_role_reach_the_secret_runs_its_entry_point_with_the_value(
    twin: Twin,
) -> None:
    bundle_with_launcher(twin)
    arn = role(
        "reads-its-secret",
        [
            *JOB_BASICS,
            {
                "Effect": "Allow",
                "Action": "secretsmanager:GetSecretValue",
                "Resource": f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:team/*",
            },
        ],
    )
    twin.sm.create_training_job(**request(twin, "reads-secret", vpc_with(endpoint=True), arn))
    done = ended(twin, "reads-secret")
    assert done["TrainingJobStatus"] == "Completed", done.get("FailureReason")
    model = untar(twin.object("results/reads-secret/output/model.tar.gz"))
    assert model["seen.txt"].decode() == hashlib.sha256(VALUE.encode()).hexdigest()


def test_a_job_with_no_endpoint_for_the_service_cannot_read_the_secret_and_fails_before_its_entry_point(
    twin: Twin,
) -> None:
    bundle_with_launcher(twin)
    arn = role(
        "could-read",
        [*JOB_BASICS, {"Effect": "Allow", "Action": "secretsmanager:GetSecretValue", "Resource": "*"}],
    )
    twin.sm.create_training_job(**request(twin, "no-endpoint", vpc_with(endpoint=False), arn))
    failed = ended(twin, "no-endpoint")
    assert failed["TrainingJobStatus"] == "Failed"
    assert failed["FailureReason"].startswith(
        f"AlgorithmError: lustrain could not start the entry point: code.secrets.HF_TOKEN ({SECRET_ARN}) could not "
        "be read: EndpointConnectionError"
    ), failed["FailureReason"]
    assert VALUE not in failed["FailureReason"]


def test_a_job_whose_role_may_not_read_the_secret_fails_with_iams_refusal(twin: Twin) -> None:
    bundle_with_launcher(twin)
    elsewhere = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:other-team/*"
    arn = role(
        "reads-others",
        [*JOB_BASICS, {"Effect": "Allow", "Action": "secretsmanager:GetSecretValue", "Resource": elsewhere}],
    )
    twin.sm.create_training_job(**request(twin, "not-allowed", vpc_with(endpoint=True), arn))
    failed = ended(twin, "not-allowed")
    assert failed["TrainingJobStatus"] == "Failed"
    reason = failed["FailureReason"]
    assert f"code.secrets.HF_TOKEN ({SECRET_ARN}) could not be read: ClientError" in reason, reason
    assert "AccessDeniedException" in reason and "secretsmanager:GetSecretValue" in reason
    assert VALUE not in reason


def interface_endpoint(vpc: str, subnet: str, **extra: Any) -> dict[str, Any]:
    found: dict[str, Any] = boto3.client("ec2", region_name=REGION).create_vpc_endpoint(
        VpcId=vpc,
        ServiceName=f"com.amazonaws.{REGION}.ssm",
        VpcEndpointType="Interface",
        SubnetIds=[subnet],
        PrivateDnsEnabled=True,
        **extra,
    )["VpcEndpoint"]
    return found


def test_private_dns_without_the_vpcs_dns_hostnames_is_refused_as_ec2_refuses_it(world: Twin) -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.91.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.91.1.0/24")["Subnet"]["SubnetId"]
    with pytest.raises(ClientError) as refused:
        interface_endpoint(vpc, subnet)
    assert refused.value.response["Error"]["Code"] == "InvalidParameter"
    assert "enableDnsHostnames" in refused.value.response["Error"]["Message"]
    ec2.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})
    assert interface_endpoint(vpc, subnet)["PrivateDnsEnabled"] is True


def test_a_create_retried_with_its_client_token_returns_the_endpoint_it_made(world: Twin) -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.92.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.92.1.0/24")["Subnet"]["SubnetId"]
    ec2.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})
    first = interface_endpoint(vpc, subnet, ClientToken="run-1-ssm")
    again = interface_endpoint(vpc, subnet, ClientToken="run-1-ssm")
    assert again["VpcEndpointId"] == first["VpcEndpointId"]
    in_vpc = ec2.describe_vpc_endpoints(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["VpcEndpoints"]
    assert len(in_vpc) == 1
