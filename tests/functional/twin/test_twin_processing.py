"""The twin's SageMaker Processing jobs: N instances as N local processes, each with its own resourceconfig.json,
events and logs as SageMaker sends them, and CreateProcessingJob refusing what AWS refuses.

The container is a tiny stand-in script shipped as a ProcessingInput (as the trainer package is for data
preparation): it reads its host from /opt/ml/config/resourceconfig.json, reads and writes S3 itself with boto3 (as
the preparation's workers do), and writes a file to its ProcessingOutput's LocalPath.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from infra_support import any_role

from lustrain.twin import simulator

REGION = "us-east-1"
ACCOUNT = "123456789012"
BUCKET = "lustrain-test-processing"
EVENT = "SageMaker Processing Job State Change"

STAND_IN = """
import json, os, sys, time
import boto3

config = json.load(open(sys.argv[1]))
host = config["current_host"]
mode = os.environ.get("STAND_IN_MODE", "work")
if mode == "fail" and host == "algo-2":
    print("worker " + host + " cannot read its part", flush=True)
    sys.exit(3)
if mode == "wait":
    print("waiting", flush=True)
    while True:
        time.sleep(0.05)
s3 = boto3.client("s3")
text = s3.get_object(Bucket=os.environ["BUCKET"], Key="data/a.txt")["Body"].read().decode()
s3.put_object(Bucket=os.environ["BUCKET"], Key="written/" + host + ".txt", Body=(host + ":" + text).encode())
out = os.path.join(sys.argv[2], host + ".json")
with open(out, "w") as f:
    json.dump(config, f)
print("worker " + host + " of " + str(len(config["hosts"])) + " done", flush=True)
"""


@dataclasses.dataclass
class World:
    sm: Any
    s3: Any
    logs: Any
    sqs: Any
    queue_url: str
    subnet_id: str
    security_group_id: str
    role_arn: str

    def events(self) -> list[dict[str, Any]]:
        received = []
        while True:
            batch = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10).get(
                "Messages", []
            )
            if not batch:
                return received
            for message in batch:
                received.append(json.loads(message["Body"]))
                self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])

    def request(
        self, name: str, *, instances: int = 2, mode: str = "work", **overrides: Any
    ) -> dict[str, Any]:
        request: dict[str, Any] = {
            "ProcessingJobName": name,
            "ProcessingResources": {
                "ClusterConfig": {
                    "InstanceCount": instances,
                    "InstanceType": "ml.m5.xlarge",
                    "VolumeSizeInGB": 30,
                }
            },
            "AppSpecification": {
                "ImageUri": "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-training:x",
                "ContainerEntrypoint": ["python3", "/opt/ml/processing/input/code/stand_in.py"],
                "ContainerArguments": ["/opt/ml/config/resourceconfig.json", "/opt/ml/processing/output"],
            },
            "ProcessingInputs": [
                {
                    "InputName": "code",
                    "S3Input": {
                        "S3Uri": f"s3://{BUCKET}/code/",
                        "LocalPath": "/opt/ml/processing/input/code",
                        "S3DataType": "S3Prefix",
                        "S3InputMode": "File",
                        "S3DataDistributionType": "FullyReplicated",
                    },
                }
            ],
            "ProcessingOutputConfig": {
                "Outputs": [
                    {
                        "OutputName": "hosts",
                        "S3Output": {
                            "S3Uri": f"s3://{BUCKET}/hosts/{name}",
                            "LocalPath": "/opt/ml/processing/output",
                            "S3UploadMode": "EndOfJob",
                        },
                    }
                ]
            },
            "Environment": {"BUCKET": BUCKET, "STAND_IN_MODE": mode},
            "NetworkConfig": {
                "VpcConfig": {"SecurityGroupIds": [self.security_group_id], "Subnets": [self.subnet_id]}
            },
            "StoppingCondition": {"MaxRuntimeInSeconds": 600},
            "RoleArn": self.role_arn,
        }
        request.update(overrides)
        return request

    def wait_for_end(self, name: str) -> list[str]:
        """The job's statuses as its events said them, up to its end (the events are delivered before
        CreateProcessingJob's thread ends its job; the job's own done flag is what we wait on)."""
        from lustrain.twin.patches import processing

        backend_jobs = processing.jobs(ACCOUNT, REGION)
        assert backend_jobs[name]._done.wait(120), f"{name} did not end"
        from lustrain.twin.patches import eventbridge

        eventbridge.drain(timeout=30)
        return [
            e["detail"]["ProcessingJobStatus"]
            for e in self.events()
            if e["detail"]["ProcessingJobName"] == name and e["detail-type"] == EVENT
        ]


@pytest.fixture(scope="module")
def world() -> Any:
    from moto import mock_aws

    from lustrain.twin import patches

    patches.install()
    with mock_aws():
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(Bucket=BUCKET, Key="code/stand_in.py", Body=STAND_IN.encode())
        s3.put_object(Bucket=BUCKET, Key="data/a.txt", Body=b"alpha")
        ec2 = boto3.client("ec2", region_name=REGION)
        vpc = ec2.create_vpc(CidrBlock="10.81.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.81.1.0/24")["Subnet"]["SubnetId"]
        group = ec2.create_security_group(GroupName="lustrain-proc", Description="processing", VpcId=vpc)[
            "GroupId"
        ]
        table = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["RouteTables"][0]
        ec2.create_vpc_endpoint(
            VpcId=vpc,
            ServiceName=f"com.amazonaws.{REGION}.s3",
            VpcEndpointType="Gateway",
            RouteTableIds=[table["RouteTableId"]],
        )
        role = any_role(
            boto3.client("iam", region_name=REGION), "lustrain-test-processing", "sagemaker.amazonaws.com"
        )
        sqs = boto3.client("sqs", region_name=REGION)
        queue_url = sqs.create_queue(QueueName="processing-events")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        events = boto3.client("events", region_name=REGION)
        events.put_rule(
            Name="processing-events",
            EventPattern=json.dumps({"source": ["aws.sagemaker"], "detail-type": [EVENT]}),
        )
        events.put_targets(Rule="processing-events", Targets=[{"Id": "queue", "Arn": queue_arn}])
        yield World(
            sm=boto3.client("sagemaker", region_name=REGION),
            s3=s3,
            logs=boto3.client("logs", region_name=REGION),
            sqs=sqs,
            queue_url=queue_url,
            subnet_id=subnet,
            security_group_id=group,
            role_arn=role,
        )


@pytest.fixture
def twin(world: World, tmp_path: Any) -> Any:
    previous = simulator.settings()
    simulator.configure(start_delay_s=0.05, stop_grace_s=5.0, work_root=tmp_path / "jobs")
    world.events()
    yield world
    simulator.reset()
    simulator.configure(**dataclasses.asdict(previous))


def test_two_instances_run_at_once_each_knowing_its_host_and_the_job_completes_with_events_and_logs(
    twin: World,
) -> None:
    twin.sm.create_processing_job(**twin.request("prep-two"))

    ended = twin.wait_for_end("prep-two")
    assert ended == ["InProgress", "Completed"], twin.sm.describe_processing_job(
        ProcessingJobName="prep-two"
    ).get("FailureReason")
    described = twin.sm.describe_processing_job(ProcessingJobName="prep-two")
    assert described["ProcessingJobStatus"] == "Completed"
    assert described["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 2
    # each instance read S3 and wrote to it itself, with the role's credentials
    for host in ("algo-1", "algo-2"):
        body = twin.s3.get_object(Bucket=BUCKET, Key=f"written/{host}.txt")["Body"].read()
        assert body == f"{host}:alpha".encode()
        # and its ProcessingOutput was uploaded at the job's end, with the resourceconfig.json it saw
        seen = json.loads(twin.s3.get_object(Bucket=BUCKET, Key=f"hosts/prep-two/{host}.json")["Body"].read())
        assert seen == {"current_host": host, "hosts": ["algo-1", "algo-2"]}
    streams = twin.logs.describe_log_streams(
        logGroupName="/aws/sagemaker/ProcessingJobs", logStreamNamePrefix="prep-two/"
    )["logStreams"]
    assert sorted(s["logStreamName"].split("/")[1].rsplit("-", 1)[0] for s in streams) == ["algo-1", "algo-2"]
    printed = [
        e["message"]
        for s in streams
        for e in twin.logs.get_log_events(
            logGroupName="/aws/sagemaker/ProcessingJobs", logStreamName=s["logStreamName"]
        )["events"]
    ]
    assert sorted(printed) == ["worker algo-1 of 2 done", "worker algo-2 of 2 done"]
    listed = twin.sm.list_processing_jobs(NameContains="prep-two")["ProcessingJobSummaries"]
    assert [j["ProcessingJobStatus"] for j in listed] == ["Completed"]


def test_an_instance_that_exits_non_zero_fails_the_job_with_its_last_lines(twin: World) -> None:
    twin.sm.create_processing_job(**twin.request("prep-fail", mode="fail"))

    assert twin.wait_for_end("prep-fail") == ["InProgress", "Failed"]
    reason = twin.sm.describe_processing_job(ProcessingJobName="prep-fail")["FailureReason"]
    assert reason.startswith("AlgorithmError")
    assert "algo-2 exited with code 3" in reason and "cannot read its part" in reason
    # no output of a failed job is uploaded
    assert "Contents" not in twin.s3.list_objects_v2(Bucket=BUCKET, Prefix="hosts/prep-fail/")


def test_stop_ends_every_instance_and_the_job_as_stopped(twin: World) -> None:
    twin.sm.create_processing_job(**twin.request("prep-stop", mode="wait"))
    from lustrain.twin.patches import processing

    job = processing.jobs(ACCOUNT, REGION)["prep-stop"]
    started = threading.Event()

    def running() -> bool:
        return len(job._processes) == 2 and all(p.poll() is None for p in job._processes)

    # the stand-in prints "waiting" once it runs; wait on the processes being there, then stop
    for _ in range(2400):
        if running() or job.done:
            started.set()
            break
        job._done.wait(0.05)
    assert started.is_set() and running()
    twin.sm.stop_processing_job(ProcessingJobName="prep-stop")

    assert twin.wait_for_end("prep-stop") == ["InProgress", "Stopped"]
    assert all(p.poll() is not None for p in job._processes)
    with pytest.raises(ClientError, match="in status Stopped"):
        twin.sm.stop_processing_job(ProcessingJobName="prep-stop")


def test_the_twins_reset_ends_a_running_jobs_processes(twin: World) -> None:
    from lustrain.twin.patches import processing

    twin.sm.create_processing_job(**twin.request("prep-reset", mode="wait", instances=1))
    job = processing.jobs(ACCOUNT, REGION)["prep-reset"]
    while not job._processes and not job.done:
        job._done.wait(0.05)
    simulator.reset()
    assert job.done and job.status == "Stopped"
    assert all(p.poll() is not None for p in job._processes)


def test_refused_as_aws_refuses(twin: World) -> None:
    twin.sm.create_processing_job(**twin.request("prep-once", instances=1))
    with pytest.raises(ClientError, match="must be unique") as reused:
        twin.sm.create_processing_job(**twin.request("prep-once", instances=1))
    assert reused.value.response["Error"]["Code"] == "ResourceInUse"
    with pytest.raises(ClientError, match=r"InstanceCount|instanceCount|100"):
        twin.sm.create_processing_job(**twin.request("prep-many", instances=101))
    with pytest.raises(ClientError, match="Could not assume role"):
        twin.sm.create_processing_job(
            **twin.request("prep-role", RoleArn=f"arn:aws:iam::{ACCOUNT}:role/nobody-may-assume")
        )
    with pytest.raises(ClientError, match="Requested resource not found"):
        twin.sm.describe_processing_job(ProcessingJobName="prep-never")
    assert twin.wait_for_end("prep-once") == ["InProgress", "Completed"]


def test_creating_a_processing_job_needs_its_action_addtags_for_its_tags_and_passrole_to_sagemaker() -> None:
    """What the twin's IAM asks of a caller of CreateProcessingJob, as of one of CreateTrainingJob (Service
    Authorization Reference: resource processing-job; tags on create need sagemaker:AddTags; the role is passed)."""
    from lustrain.twin.iam.actions import Call, needs_of

    role = f"arn:aws:iam::{ACCOUNT}:role/lustrain-prepare"
    params = {
        "ProcessingJobName": "prep-1",
        "RoleArn": role,
        "Tags": [{"Key": "lustrain:job-id", "Value": "j"}],
    }
    needs = needs_of(Call("sagemaker", "CreateProcessingJob", params, REGION, ACCOUNT), None)
    job_arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:processing-job/prep-1"
    by_action = {need.action: need for need in needs}
    assert by_action["sagemaker:CreateProcessingJob"].resource == job_arn
    assert by_action["sagemaker:AddTags"].resource == job_arn
    assert by_action["iam:PassRole"].resource == role
    assert by_action["iam:PassRole"].context == {"iam:PassedToService": "sagemaker.amazonaws.com"}
