"""code.secrets on moto: the run's interface endpoints are made with its network (once, even when an answer is lost),
torn down with it, and a reused VPC without them is refused; registration refuses secrets the stack does not allow."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
import test_sweep
from botocore.exceptions import ReadTimeoutError
from infra_support import REGION, MinuteLeft, count_of_job, invoke, job_record, register, spec
from lustrain_core.config import Settings
from lustrain_core.errors import NetworkInvalid, SpecForbidden, SpecInvalid
from lustrain_core.steps import network
from test_create_network import existing
from test_sweep import run, sweep

ACCOUNT = "123456789012"
SECRET = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:lustrain-test/hf-token-AbCdEf"
PARAMETER = f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/lustrain-test/wandb"
# the sweeper tests' state machine, whose executions stay RUNNING until stopped
machine = test_sweep.machine
SERVICES = {f"com.amazonaws.{REGION}.secretsmanager", f"com.amazonaws.{REGION}.ssm"}


def ec2() -> Any:
    return boto3.client("ec2", region_name=REGION)


def with_secrets(**sections: Any) -> dict[str, Any]:
    return spec(code={"secrets": {"HF_TOKEN": SECRET, "WANDB_API_KEY": PARAMETER}}, **sections)


def interface_endpoints(job_id: str) -> list[dict[str, Any]]:
    found = ec2().describe_vpc_endpoints(
        Filters=[
            {"Name": "tag:lustrain:job-id", "Values": [job_id]},
            {"Name": "vpc-endpoint-type", "Values": ["Interface"]},
        ]
    )["VpcEndpoints"]
    return [e for e in found if e["State"] not in ("deleted", "deleting")]


@pytest.fixture
def allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    # what the stack sets by default: its own secrets and parameters only
    monkeypatch.setenv(
        "LUSTRAIN_ALLOWED_SECRETS",
        f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:lustrain-test/*,"
        f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/lustrain-test/*",
    )


def test_a_run_with_secrets_gets_an_interface_endpoint_per_service_in_its_subnet_with_private_dns(
    aws, allowed
):
    document = register(with_secrets())
    job_id = document["job"]["job_id"]
    net = invoke("create_network", document)

    endpoints = interface_endpoints(job_id)
    assert {e["ServiceName"] for e in endpoints} == SERVICES and len(endpoints) == 2
    for endpoint in endpoints:
        assert (endpoint["VpcId"], endpoint["SubnetIds"]) == (net["vpc_id"], [net["subnet_id"]])
        assert [g["GroupId"] for g in endpoint["Groups"]] == net["security_group_ids"]
        assert endpoint["PrivateDnsEnabled"] is True
        tags = {t["Key"]: t["Value"] for t in endpoint["Tags"]}
        assert (tags["lustrain:job-id"], tags["lustrain:created-by"]) == (job_id, aws.stack_name)
    # private DNS needs the VPC's DNS hostnames, which a new VPC has off
    hostnames = ec2().describe_vpc_attribute(VpcId=net["vpc_id"], Attribute="enableDnsHostnames")
    assert hostnames["EnableDnsHostnames"]["Value"] is True
    recorded = {
        r["id"] for r in job_record(aws.jobs_table, job_id)["resources"] if r["type"] == "vpc_endpoint"
    }
    assert recorded == {net["endpoint_id"], *(e["VpcEndpointId"] for e in endpoints)}

    again = invoke("create_network", document)
    assert again == net and len(interface_endpoints(job_id)) == 2


def test_a_run_without_secrets_gets_no_interface_endpoint(aws):
    document = register()
    invoke("create_network", document)
    assert interface_endpoints(document["job"]["job_id"]) == []


class LostAnswer:
    """EC2 makes the first interface endpoint, but its answer never arrives (a read timeout)."""

    def __init__(self) -> None:
        self.client = ec2()
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def create_vpc_endpoint(self, **request: Any) -> dict[str, Any]:
        answer: dict[str, Any] = self.client.create_vpc_endpoint(**request)
        if request.get("VpcEndpointType") == "Interface" and not self.lost:
            self.lost += 1
            raise ReadTimeoutError(endpoint_url="https://ec2.us-east-1.amazonaws.com")
        return answer


def test_an_endpoint_whose_answer_was_lost_is_found_again_not_made_twice_and_torn_down(aws, allowed):
    document = register(with_secrets())
    job_id = document["job"]["job_id"]
    ddb = boto3.client("dynamodb", region_name=REGION)
    settings = Settings.from_env()
    lossy = LostAnswer()
    with pytest.raises(ReadTimeoutError):
        network.create_network(document, ec2=lossy, ddb=ddb, settings=settings)
    assert lossy.lost == 1 and len(interface_endpoints(job_id)) == 1
    # Step Functions retries the step: the endpoint made is found by its tags, the other made once
    document["network"] = network.create_network(document, ec2=lossy, ddb=ddb, settings=settings).model_dump()
    assert sorted(e["ServiceName"] for e in interface_endpoints(job_id)) == sorted(SERVICES)

    result = invoke("teardown", document, MinuteLeft())
    assert interface_endpoints(job_id) == []
    assert set(count_of_job(job_id).values()) == {0}
    assert (result["remaining"], result["status"]) == ([], "SUCCEEDED")


def test_the_endpoint_request_names_a_client_token_per_run_and_service(aws, allowed):
    document = register(with_secrets())
    job = network.Run.parse(document).job
    subnet = {"VpcId": "vpc-1", "SubnetId": "subnet-1"}
    requests = [
        network.secrets_endpoint_request(job, Settings.from_env(), service, subnet, "sg-1")
        for service in ("secretsmanager", "ssm")
    ]
    assert [r["ClientToken"] for r in requests] == [f"{job.job_id}-secretsmanager", f"{job.job_id}-ssm"]
    assert all(len(r["ClientToken"]) <= 64 for r in requests)


def reused(given: dict[str, Any]) -> dict[str, Any]:
    return with_secrets(
        network={"subnet_id": given["subnet_id"], "security_group_ids": given["security_group_ids"]}
    )


def test_a_reused_vpc_without_an_endpoint_for_the_secrets_is_refused_naming_the_subnet(aws, allowed):
    given = existing()
    ec2().modify_vpc_attribute(VpcId=given["vpc_id"], EnableDnsHostnames={"Value": True})
    ec2().create_vpc_endpoint(
        VpcId=given["vpc_id"],
        ServiceName=f"com.amazonaws.{REGION}.secretsmanager",
        VpcEndpointType="Interface",
        SubnetIds=[given["subnet_id"]],
        SecurityGroupIds=given["security_group_ids"],
        PrivateDnsEnabled=True,
    )
    document = register(reused(given))
    with pytest.raises(NetworkInvalid) as refused:
        invoke("create_network", document)
    problems = refused.value.details["problems"]
    assert len(problems) == 1
    assert problems[0].startswith(f"network.subnet_id: the VPC of {given['subnet_id']}")
    assert f"com.amazonaws.{REGION}.ssm" in problems[0]
    assert interface_endpoints(document["job"]["job_id"]) == []


def test_a_reused_vpc_with_endpoints_for_the_secrets_is_used_and_nothing_is_created(aws, allowed):
    given = existing()
    ec2().modify_vpc_attribute(VpcId=given["vpc_id"], EnableDnsHostnames={"Value": True})
    for service in ("secretsmanager", "ssm"):
        ec2().create_vpc_endpoint(
            VpcId=given["vpc_id"],
            ServiceName=f"com.amazonaws.{REGION}.{service}",
            VpcEndpointType="Interface",
            SubnetIds=[given["subnet_id"]],
            SecurityGroupIds=given["security_group_ids"],
            PrivateDnsEnabled=True,
        )
    before = len(ec2().describe_vpc_endpoints()["VpcEndpoints"])
    net = invoke("create_network", register(reused(given)))
    assert net["created"] is False and len(ec2().describe_vpc_endpoints()["VpcEndpoints"]) == before


def test_a_secret_outside_what_the_stack_allows_is_refused_at_registration(aws, allowed):
    other = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:someone-else/key-AbCdEf"
    with pytest.raises(SpecForbidden) as refused:
        register(spec(code={"secrets": {"HF_TOKEN": SECRET, "OTHER": other}}))
    assert refused.value.details["field"] == "code.secrets.OTHER"
    assert "LUSTRAIN_ALLOWED_SECRETS" in refused.value.message


def test_a_secret_of_another_region_is_refused_at_registration(aws):
    elsewhere = f"arn:aws:ssm:eu-west-1:{ACCOUNT}:parameter/lustrain-test/wandb"
    with pytest.raises(SpecInvalid) as refused:
        register(spec(code={"secrets": {"WANDB_API_KEY": elsewhere}}))
    assert [e.path for e in refused.value.errors] == ["code.secrets.WANDB_API_KEY"]
    assert "eu-west-1" in refused.value.errors[0].message


def test_the_sweeper_finds_the_endpoints_of_an_orphan_run_and_deletes_them_with_its_network(
    machine, aws, allowed
):
    document = run(machine, with_secrets())
    job_id = document["job"]["job_id"]
    boto3.client("dynamodb", region_name=REGION).delete_item(
        TableName=aws.jobs_table, Key={"job_id": {"S": job_id}}
    )
    assert len(interface_endpoints(job_id)) == 2

    result = sweep()

    assert interface_endpoints(job_id) == [] and set(count_of_job(job_id).values()) == {0}
    swept = [s for s in result["swept"] if s.get("type") == "vpc_endpoint"]
    assert len(swept) == 3, result["swept"]
