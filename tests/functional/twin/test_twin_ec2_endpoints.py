"""EC2 on the twin: DeleteVpcEndpoints answers as EC2 does when two teardowns of a run delete one endpoint, and the
account holds no machine images."""

from __future__ import annotations

import boto3
from moto import mock_aws

from lustrain.twin.patches import ec2 as twin_ec2


def test_an_endpoint_deleted_twice_deletes_nothing_more_and_fails_nothing() -> None:
    twin_ec2.install()
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        table = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
        endpoint = ec2.create_vpc_endpoint(
            VpcId=vpc,
            ServiceName="com.amazonaws.us-east-1.s3",
            RouteTableIds=[table],
            VpcEndpointType="Gateway",
        )["VpcEndpoint"]["VpcEndpointId"]

        assert ec2.delete_vpc_endpoints(VpcEndpointIds=[endpoint])["Unsuccessful"] == []
        # the other teardown's delete, a moment later (moto removed the gateway's routes again: InvalidRoute.NotFound)
        assert ec2.delete_vpc_endpoints(VpcEndpointIds=[endpoint])["Unsuccessful"] == []


def test_the_twins_account_holds_no_machine_images() -> None:
    """A run launches no EC2 instance; moto's catalogue of AWS's images cost 0.7 s of CPU per account and region."""
    twin_ec2.install()
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        assert ec2.describe_images(Owners=["amazon"])["Images"] == []
