"""The steps against AWS's own error answers, fed through botocore's Stubber: the codes and texts AWS documents
(not moto's), for each path that judges "it is gone" or "SageMaker refused"."""

from __future__ import annotations

import boto3
import botocore.session
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from infra_support import REGION, invoke
from lustrain_core import aws_errors, clients
from lustrain_core.errors import QuotaExceeded
from lustrain_core.steps import teardown
from training_support import held_training_jobs, token_item, training_input

#: AWS's answer to DescribeTrainingJob on a job that does not exist (not the ResourceNotFound of its model).
NO_SUCH_JOB = ("ValidationException", "Requested resource not found.")


def stubbed(service: str) -> tuple[object, Stubber]:
    client = boto3.client(service, region_name=REGION)
    stubber = Stubber(client)
    stubber.activate()
    return client, stubber


def test_a_create_sagemaker_refused_for_quota_is_quota_exceeded_when_describe_says_not_found(aws, monkeypatch):
    sagemaker, stub = stubbed("sagemaker")
    stub.add_client_error(
        "create_training_job",
        service_error_code="ResourceLimitExceeded",
        service_message="The account-level service limit 'ml.p4d.24xlarge for training job usage' is 0 Instances",
        http_status_code=400,
    )
    stub.add_client_error(
        "describe_training_job", service_error_code=NO_SUCH_JOB[0], service_message=NO_SUCH_JOB[1], http_status_code=400
    )
    monkeypatch.setattr(clients, "client", lambda service, *a, **k: sagemaker if service == "sagemaker" else boto3.client(service, region_name=REGION))
    with held_training_jobs(), pytest.raises(QuotaExceeded) as refused:
        invoke("start_training", training_input())
    assert token_item(aws.tokens_table, refused.value.details["training_job_name"]) is None
    stub.assert_no_pending_responses()


def clock() -> teardown.Clock:
    return teardown.Clock(budget_seconds=0.0, sleep=lambda _s: None)


def test_teardown_counts_a_training_job_aws_does_not_know_as_gone_and_goes_on(settings):
    sagemaker, stub = stubbed("sagemaker")
    stub.add_client_error(
        "describe_training_job", service_error_code=NO_SUCH_JOB[0], service_message=NO_SUCH_JOB[1], http_status_code=400
    )
    work = teardown.Teardown(ec2=None, fsx=None, job_id="j", settings=settings, clock=clock(), sagemaker=sagemaker)
    assert work.stop_training_job("tiny-j-1") is None
    assert work.report.already_gone == [{"type": "training_job", "id": "tiny-j-1"}]


@pytest.mark.parametrize(
    ("kind", "operation", "code"),
    [
        ("vpc", "describe_vpcs", "InvalidVpcID.NotFound"),
        ("subnet", "describe_subnets", "InvalidSubnetID.NotFound"),
        ("security_group", "describe_security_groups", "InvalidGroup.NotFound"),
        ("route_table", "describe_route_tables", "InvalidRouteTableID.NotFound"),
        ("vpc_endpoint", "describe_vpc_endpoints", "InvalidVpcEndpointId.NotFound"),
    ],
)
def test_teardown_counts_an_ec2_resource_aws_does_not_know_as_gone(settings, kind, operation, code):
    ec2, stub = stubbed("ec2")
    stub.add_client_error(operation, service_error_code=code, service_message="does not exist", http_status_code=400)
    work = teardown.Teardown(ec2=ec2, fsx=None, job_id="j", settings=settings, clock=clock())
    assert work._describe_ec2(kind, "x-0123456789abcdef0") is None


@pytest.mark.parametrize(
    ("service", "codes"),
    [
        ("fsx", ["FileSystemNotFound", "DataRepositoryAssociationNotFound", "DataRepositoryTaskNotFound"]),
        ("sagemaker", ["ResourceNotFound"]),
        ("stepfunctions", ["ExecutionDoesNotExist", "StateMachineDoesNotExist"]),
        ("s3", ["NoSuchBucket", "NoSuchKey"]),
        ("service-quotas", ["NoSuchResourceException"]),
        ("dynamodb", ["ResourceNotFoundException", "ConditionalCheckFailedException"]),
    ],
)
def test_each_code_the_core_recognises_is_one_the_service_model_declares(service, codes):
    model = botocore.session.get_session().get_service_model(service)
    declared = {shape.error_code for shape in map(model.shape_for, model.shape_names) if shape.metadata.get("exception")}
    assert set(codes) <= declared
    for code in codes:
        error = ClientError({"Error": {"Code": code, "Message": ""}}, "Any")
        assert aws_errors.not_found(error) or code == aws_errors.CONDITION_FAILED
