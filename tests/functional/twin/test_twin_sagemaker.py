"""The twin's SageMaker: CreateTrainingJob refuses what AWS refuses, and a job is lived for real on this machine.

Each job runs a tiny stand-in entry point (shipped in a sourcedir.tar.gz as the CLI ships the trainer) that reads
its channel, prints a metric line and writes SM_MODEL_DIR/model.pt. Events are read where a user would see them:
an EventBridge rule on "SageMaker Training Job State Change" delivering to an SQS queue.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tarfile
import threading
import time
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from infra_support import any_role

from lustrain.twin import faults, simulator
from lustrain.twin.patches import service_quotas

REGION = "us-east-1"
ACCOUNT = "123456789012"
BUCKET = "lustrain-test-data"
CODE_URI = f"s3://{BUCKET}/code/sourcedir.tar.gz"

STAND_IN = """
import json, os, signal, sys, time

def on_sigterm(signum, frame):
    print("got SIGTERM", flush=True)
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "model.pt"), "w") as f:
        f.write("saved on SIGTERM")
    sys.exit(0)

signal.signal(signal.SIGTERM, on_sigterm)
mode = os.environ.get("STAND_IN_MODE", "train")
data = os.environ["SM_CHANNEL_TRAINING"]
if mode == "read":
    import boto3
    s3 = boto3.client("s3")
    bucket, _, key = os.environ["READ_URI"][5:].partition("/")
    print("read " + s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode(), flush=True)
    bucket, _, key = os.environ["MISSING_URI"][5:].partition("/")
    try:
        s3.get_object(Bucket=bucket, Key=key)
    except Exception as error:
        print("missing " + error.response["Error"]["Code"], flush=True)
    sys.exit(0)
if mode == "fail":
    raise ValueError("bad shard in " + data)
rank = os.environ.get("RANK", "0")
seen = {
    "files": sorted(os.path.relpath(os.path.join(d, n), data) for d, _, names in os.walk(data) for n in names),
    "argv": sys.argv[1:],
    "hps": json.loads(os.environ["SM_HPS"]),
    "hosts": json.loads(os.environ["SM_HOSTS"]),
    "current_host": os.environ["SM_CURRENT_HOST"],
    "num_gpus": os.environ["SM_NUM_GPUS"],
    "job_name": json.loads(os.environ["SM_TRAINING_ENV"])["job_name"],
    "world_size": os.environ.get("WORLD_SIZE"),
    "nice": os.getpriority(os.PRIO_PROCESS, 0),
}
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "seen-" + rank + ".json"), "w") as f:
    json.dump(seen, f)
with open(os.path.join(os.environ["SM_CHECKPOINT_DIR"], "step-1.pt"), "w") as f:
    f.write("checkpoint")
board = os.environ.get("LUSTRAIN_TENSORBOARD_DIR")
if board:
    os.makedirs(os.path.join(board, "run"), exist_ok=True)
    with open(os.path.join(board, "run", "events.out.tfevents.1.algo-1"), "w") as f:
        f.write("scalars of " + board)
if mode == "wait":
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
print("step=1 train_loss=2.0 tokens_per_s=10", flush=True)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "model.pt"), "w") as f:
    f.write("trained")
"""

def trainer_nice() -> int:
    """The priority the twin's trainers run at: the twin's own, lowered by Settings.trainer_nice (19 at most)."""
    return min(19, os.getpriority(os.PRIO_PROCESS, 0) + simulator.settings().trainer_nice)


METRICS = [
    {"Name": "train_loss", "Regex": r"\btrain_loss=([0-9.eE+-]+)"},
    {"Name": "tokens_per_s", "Regex": r"\btokens_per_s=([0-9.eE+-]+)"},
]
ORDER_OF_SUCCESS = [
    ("InProgress", "Starting"),
    ("InProgress", "Downloading"),
    ("InProgress", "Training"),
    ("InProgress", "Uploading"),
    ("Completed", "Completed"),
]


def tar_gz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def untar(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}  # type: ignore[union-attr]


@dataclasses.dataclass
class Twin:
    sm: Any
    s3: Any
    fsx: Any
    sqs: Any
    queue_url: str
    subnet_id: str
    security_group_id: str

    def events(self) -> list[dict[str, Any]]:
        """Every training job event delivered so far, in order."""
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

    def lustre(self, *, available: bool = True) -> tuple[str, str]:
        """A PERSISTENT_2 file system with s3://BUCKET/data/ linked at /data; (FileSystemId, MountName)."""
        fs = self.fsx.create_file_system(
            FileSystemType="LUSTRE",
            StorageCapacity=1200,
            SubnetIds=[self.subnet_id],
            SecurityGroupIds=[self.security_group_id],
            LustreConfiguration={"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 125},
        )["FileSystem"]
        fs_id = fs["FileSystemId"]
        self.fsx.create_data_repository_association(
            FileSystemId=fs_id, FileSystemPath="/data", DataRepositoryPath=f"s3://{BUCKET}/data/"
        )
        while available and fs["Lifecycle"] != "AVAILABLE":
            fs = self.fsx.describe_file_systems(FileSystemIds=[fs_id])["FileSystems"][0]
        return fs_id, fs["LustreConfiguration"]["MountName"]

    def request(
        self, name: str, *, directory_path: str = "", fs_id: str = "", **overrides: Any
    ) -> dict[str, Any]:
        """A CreateTrainingJob request as start_training sends it: script mode, in the VPC, reading a Lustre
        channel when `fs_id` is given (else the same data straight from S3)."""
        channel: dict[str, Any] = {
            "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": f"s3://{BUCKET}/data/"}
        }
        if fs_id:
            channel = {
                "FileSystemDataSource": {
                    "FileSystemId": fs_id,
                    "FileSystemType": "FSxLustre",
                    "FileSystemAccessMode": "ro",
                    "DirectoryPath": directory_path,
                }
            }
        request: dict[str, Any] = {
            "TrainingJobName": name,
            "HyperParameters": {
                "sagemaker_program": json.dumps("train.py"),
                "sagemaker_submit_directory": json.dumps(CODE_URI),
                "sagemaker_region": json.dumps(REGION),
                "sagemaker_torch_distributed_enabled": json.dumps("false"),
                "epochs": json.dumps(2),
                "lr": json.dumps(0.001),
            },
            "AlgorithmSpecification": {
                "TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8-cpu-py312",
                "TrainingInputMode": "File",
                "MetricDefinitions": METRICS,
            },
            "RoleArn": f"arn:aws:iam::{ACCOUNT}:role/lustrain-test-sagemaker",
            "InputDataConfig": [{"ChannelName": "training", "DataSource": channel}],
            "OutputDataConfig": {"S3OutputPath": f"s3://{BUCKET}/results"},
            "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
            "VpcConfig": {"SecurityGroupIds": [self.security_group_id], "Subnets": [self.subnet_id]},
            "StoppingCondition": {"MaxRuntimeInSeconds": 600},
            "CheckpointConfig": {"S3Uri": f"s3://{BUCKET}/checkpoints/{name}/"},
            "EnableManagedSpotTraining": False,
            "RetryStrategy": {"MaximumRetryAttempts": 1},
            "Environment": {"STAND_IN_MODE": "train"},
            "Tags": [{"Key": "project", "Value": "lustrain"}],
        }
        request.update(overrides)
        return request

    def describe(self, name: str) -> dict[str, Any]:
        return dict(self.sm.describe_training_job(TrainingJobName=name))

    def object(self, key: str) -> bytes:
        return bytes(self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())

    def keys(self, prefix: str) -> list[str]:
        return [o["Key"] for o in self.s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]


@pytest.fixture(scope="module")
def world() -> Any:
    """One moto world for the module (moto's EC2 and SageMaker take a second each to start): the data and code
    bucket, a VPC whose security group lets Lustre traffic in, and an EventBridge rule feeding an SQS queue.
    Every test names its jobs uniquely, as training job names are unique forever."""
    from moto import mock_aws

    from lustrain.twin import patches

    patches.install()
    with mock_aws():
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(
            Bucket=BUCKET, Key="code/sourcedir.tar.gz", Body=tar_gz({"train.py": STAND_IN.encode()})
        )
        s3.put_object(Bucket=BUCKET, Key="data/a.txt", Body=b"alpha")
        s3.put_object(Bucket=BUCKET, Key="data/sub/b.txt", Body=b"beta")

        ec2 = boto3.client("ec2", region_name=REGION)
        vpc = ec2.create_vpc(CidrBlock="10.80.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.80.1.0/24")["Subnet"]["SubnetId"]
        group = ec2.create_security_group(GroupName="lustrain-test", Description="training", VpcId=vpc)[
            "GroupId"
        ]
        ec2.authorize_security_group_ingress(
            GroupId=group, IpPermissions=[{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group}]}]
        )
        # the instances reach S3 through a gateway endpoint on the subnet's (the VPC's main) route table
        main_table = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["RouteTables"][
            0
        ]
        ec2.create_vpc_endpoint(
            VpcId=vpc,
            ServiceName=f"com.amazonaws.{REGION}.s3",
            VpcEndpointType="Gateway",
            RouteTableIds=[main_table["RouteTableId"]],
        )
        any_role(
            boto3.client("iam", region_name=REGION), "lustrain-test-sagemaker", "sagemaker.amazonaws.com"
        )

        sqs = boto3.client("sqs", region_name=REGION)
        queue_url = sqs.create_queue(QueueName="training-events")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        events = boto3.client("events", region_name=REGION)
        events.put_rule(
            Name="training-events",
            EventPattern=json.dumps(
                {"source": ["aws.sagemaker"], "detail-type": ["SageMaker Training Job State Change"]}
            ),
        )
        events.put_targets(Rule="training-events", Targets=[{"Id": "queue", "Arn": queue_arn}])
        yield Twin(
            sm=boto3.client("sagemaker", region_name=REGION),
            s3=s3,
            fsx=boto3.client("fsx", region_name=REGION),
            sqs=sqs,
            queue_url=queue_url,
            subnet_id=subnet,
            security_group_id=group,
        )


@pytest.fixture
def twin(world: Twin, tmp_path: Any) -> Any:
    previous = simulator.settings()
    # a stop reaches no entry point in SageMaker's PyTorch image: it is killed when the grace ends, kept short here
    simulator.configure(start_delay_s=0.05, stop_grace_s=5.0, work_root=tmp_path / "jobs")
    world.events()  # what earlier tests' jobs emitted
    yield world
    simulator.reset()
    faults.clear()
    simulator.configure(**dataclasses.asdict(previous))


def statuses(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["detail"]["TrainingJobStatus"], e["detail"]["SecondaryStatus"]) for e in events]


def job_view(name: str) -> simulator.JobView:
    return next(j for j in simulator.jobs() if j.name == name)


@pytest.fixture
def printed() -> Any:
    """printed(job, text) -> an Event set when the job's trainer prints a line containing `text`."""
    unsubscribes = []

    def watch(name: str, text: str) -> threading.Event:
        seen = threading.Event()
        unsubscribes.append(
            simulator.subscribe(lambda job, line: seen.set() if job == name and text in line else None)
        )
        return seen

    yield watch
    for unsubscribe in unsubscribes:
        unsubscribe()


# --- a job's life -------------------------------------------------------------------------------------------


def test_job_goes_in_progress_then_completed_with_its_model_in_s3_and_events_in_order(twin: Twin) -> None:
    fs_id, mount = twin.lustre()
    # Created outside any Lambda, the job waits start_delay_s only: long enough to see that nothing has been
    # emitted by the time CreateTrainingJob returns.
    simulator.configure(start_delay_s=0.5)
    request = twin.request("gpt-small-1", fs_id=fs_id, directory_path=f"/{mount}/data")
    arn = twin.sm.create_training_job(**request)["TrainingJobArn"]
    assert twin.events() == [], "the first event must come after CreateTrainingJob has returned"

    started = twin.describe("gpt-small-1")
    assert (started["TrainingJobStatus"], started["SecondaryStatus"]) == ("InProgress", "Starting")
    for key in (
        "HyperParameters",
        "AlgorithmSpecification",
        "InputDataConfig",
        "OutputDataConfig",
        "ResourceConfig",
        "VpcConfig",
        "StoppingCondition",
        "CheckpointConfig",
        "Environment",
        "RetryStrategy",
        "EnableManagedSpotTraining",
    ):
        assert started[key] == request[key], key
    listed = twin.sm.list_training_jobs(StatusEquals="InProgress")["TrainingJobSummaries"]
    assert "gpt-small-1" in [j["TrainingJobName"] for j in listed]

    simulator.wait_all(timeout=60)
    done = twin.describe("gpt-small-1")
    assert (done["TrainingJobStatus"], done["SecondaryStatus"]) == ("Completed", "Completed")
    assert "FailureReason" not in done
    assert {m["MetricName"]: m["Value"] for m in done["FinalMetricDataList"]} == {
        "train_loss": 2.0,
        "tokens_per_s": 10.0,
    }
    model_uri = f"s3://{BUCKET}/results/gpt-small-1/output/model.tar.gz"
    assert done["ModelArtifacts"] == {"S3ModelArtifacts": model_uri}
    assert untar(twin.object("results/gpt-small-1/output/model.tar.gz")) == {"model.pt": b"trained"}
    seen = json.loads(untar(twin.object("results/gpt-small-1/output/output.tar.gz"))["seen-0.json"])
    assert seen == {
        "files": ["a.txt", "sub/b.txt"],  # the Lustre mount showed the linked prefix s3://BUCKET/data/
        "argv": ["--epochs", "2", "--lr", "0.001"],
        "hps": {"epochs": 2, "lr": 0.001},
        "hosts": ["algo-1"],
        "current_host": "algo-1",
        "num_gpus": "0",
        "job_name": "gpt-small-1",
        "world_size": None,
        # below the control plane's priority: a trainer here never takes a Lambda's or a poll's CPU
        "nice": trainer_nice(),
    }
    assert simulator.settings().trainer_nice > 0
    assert twin.object("checkpoints/gpt-small-1/step-1.pt") == b"checkpoint"
    assert done["CreationTime"] <= done["TrainingStartTime"] <= done["TrainingEndTime"]
    assert done["BillableTimeInSeconds"] >= 1
    completed = twin.sm.list_training_jobs(StatusEquals="Completed")["TrainingJobSummaries"]
    assert "gpt-small-1" in [j["TrainingJobName"] for j in completed]
    assert "gpt-small-1" not in [
        j["TrainingJobName"]
        for j in twin.sm.list_training_jobs(StatusEquals="InProgress")["TrainingJobSummaries"]
    ]

    events = twin.events()
    assert statuses(events) == ORDER_OF_SUCCESS
    for event in events:
        assert event["source"] == "aws.sagemaker"
        assert event["detail-type"] == "SageMaker Training Job State Change"
        assert event["resources"] == [arn]
        assert event["detail"]["TrainingJobArn"] == arn
        assert "FailureReason" not in event["detail"]
    last = events[-1]["detail"]
    assert last["ModelArtifacts"] == {"S3ModelArtifacts": model_uri}
    assert last["Tags"] == {"project": "lustrain"}
    for key in ("CreationTime", "TrainingStartTime", "TrainingEndTime", "LastModifiedTime"):
        assert last[key].isdigit() and len(last[key]) == 13, f"{key} is not epoch milliseconds: {last[key]}"
    assert "step=1 train_loss=2.0" in job_view("gpt-small-1").log_path.read_text()  # type: ignore[union-attr]


def test_tensorboard_files_are_uploaded_from_the_local_path_under_the_jobs_own_prefix(twin: Twin) -> None:
    # the container's LocalPath, as the job's Environment names it to the trainer; SageMaker uploads it to
    # <S3OutputPath><job name>/tensorboard-output/
    request = twin.request(
        "boards-1",
        Environment={"STAND_IN_MODE": "train", "LUSTRAIN_TENSORBOARD_DIR": "/opt/ml/output/tensorboard"},
        TensorBoardOutputConfig={"S3OutputPath": f"s3://{BUCKET}/boards/", "LocalPath": "/opt/ml/output/tensorboard"},
    )
    twin.sm.create_training_job(**request)
    simulator.wait_all(timeout=60)
    assert twin.describe("boards-1")["TensorBoardOutputConfig"] == request["TensorBoardOutputConfig"]
    assert twin.keys("boards/") == ["boards/boards-1/tensorboard-output/run/events.out.tfevents.1.algo-1"]
    written = twin.object("boards/boards-1/tensorboard-output/run/events.out.tfevents.1.algo-1").decode()
    # the trainer wrote under the job's own /opt/ml (its work directory), not the machine's
    assert written.startswith("scalars of ") and written.endswith("/output/tensorboard")
    assert written != "scalars of /opt/ml/output/tensorboard"


def test_a_jobs_temp_directory_is_removed_when_it_ends_its_log_stays_in_cloudwatch(
    twin: Twin, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given no work_root, a job works under the system temp directory and leaves nothing there once it ended:
    its model is in S3 and its log in CloudWatch, as SageMaker's instance is gone with its disk."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    temp_root = tmp_path / "tmp" / "lustrain-twin-sagemaker"
    simulator.configure(work_root=None)
    twin.sm.create_training_job(**twin.request("temp-dir"))
    simulator.wait_all(timeout=60)
    assert twin.describe("temp-dir")["TrainingJobStatus"] == "Completed"
    assert job_view("temp-dir").workdir is not None and job_view("temp-dir").workdir.parent == temp_root
    assert list(temp_root.iterdir()) == []
    logs = boto3.client("logs", region_name=REGION)
    (stream,) = logs.describe_log_streams(
        logGroupName="/aws/sagemaker/TrainingJobs", logStreamNamePrefix="temp-dir/"
    )["logStreams"]
    lines = logs.get_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream["logStreamName"])
    assert any("step=1 train_loss=2.0" in e["message"] for e in lines["events"])


def test_first_event_waits_for_the_lambda_invocation_that_created_the_job(twin: Twin) -> None:
    """Guards DESIGN's moto 5.2.5 finding: a SendTaskSuccess sent while start_training still runs is lost."""
    simulator.configure(start_delay_s=0.0)
    faults.inject("start_training", "capacity-error")  # the fastest Failed, whose event would send one
    seen_inside: list[dict[str, Any]] = []

    def start_training_handler() -> None:
        with faults.running_step("start_training"):  # as the in-process Lambda runner marks its handlers
            twin.sm.create_training_job(**twin.request("waits-for-handler"))
            time.sleep(0.3)  # the handler goes on after CreateTrainingJob (it stores the task token)
            seen_inside.extend(twin.events())

    handler = threading.Thread(target=start_training_handler)
    handler.start()
    handler.join()
    simulator.wait_all(timeout=60)
    assert seen_inside == []
    assert statuses(twin.events()) == [("InProgress", "Starting"), ("Failed", "Failed")]


def test_s3_channel_is_downloaded_into_the_channel_directory(twin: Twin) -> None:
    request = twin.request("s3-channel")
    del request["VpcConfig"]
    twin.sm.create_training_job(**request)
    simulator.wait_all(timeout=60)
    assert twin.describe("s3-channel")["TrainingJobStatus"] == "Completed"
    seen = json.loads(untar(twin.object("results/s3-channel/output/output.tar.gz"))["seen-0.json"])
    assert seen["files"] == ["a.txt", "sub/b.txt"]


def test_a_trainer_nice_of_0_runs_the_trainer_at_the_twins_own_priority(twin: Twin) -> None:
    simulator.configure(trainer_nice=0)
    request = twin.request("own-priority")
    del request["VpcConfig"]
    twin.sm.create_training_job(**request)
    simulator.wait_all(timeout=60)
    seen = json.loads(untar(twin.object("results/own-priority/output/output.tar.gz"))["seen-0.json"])
    assert seen["nice"] == os.getpriority(os.PRIO_PROCESS, 0)


def test_directory_path_without_the_mount_name_fails_the_mount_with_awss_text(twin: Twin) -> None:
    fs_id, mount = twin.lustre()
    # The classic mistake: the path inside the file system without the /<MountName> in front.
    twin.sm.create_training_job(**twin.request("no-mount-name", fs_id=fs_id, directory_path="/data"))
    simulator.wait_all(timeout=60)

    failed = twin.describe("no-mount-name")
    assert (failed["TrainingJobStatus"], failed["SecondaryStatus"]) == ("Failed", "Failed")
    reason = failed["FailureReason"]
    assert reason.startswith(
        f"ClientError: Unable to mount file system: {fs_id}, directory path: /data. No such file or directory. "
        "Please ensure"
    )
    assert f"/{mount}" in reason
    assert "ModelArtifacts" not in failed
    assert twin.keys("results/no-mount-name/") == []
    events = twin.events()
    assert statuses(events) == [
        ("InProgress", "Starting"),
        ("InProgress", "Downloading"),
        ("Failed", "Failed"),
    ]
    assert events[-1]["detail"]["FailureReason"] == reason


def test_file_system_not_yet_available_fails_the_mount(twin: Twin) -> None:
    fs_id, mount = twin.lustre(available=False)
    twin.sm.create_training_job(**twin.request("too-early", fs_id=fs_id, directory_path=f"/{mount}/data"))
    simulator.wait_all(timeout=60)
    reason = twin.describe("too-early")["FailureReason"]
    assert reason.startswith(
        f"ClientError: Unable to mount file system: {fs_id}, directory path: /{mount}/data."
    )
    assert "CREATING, not AVAILABLE" in reason


def test_stop_training_job_sends_sigterm_to_an_image_of_its_own_then_stops_and_still_uploads_the_model(
    twin: Twin, printed: Any
) -> None:
    # an image whose first process is the entry point (not SageMaker's PyTorch image) hears the stop's SIGTERM

    fs_id, mount = twin.lustre()
    ready = printed("stop-me", "ready")
    request = twin.request(
        "stop-me", fs_id=fs_id, directory_path=f"/{mount}/data", Environment={"STAND_IN_MODE": "wait"}
    )
    request["AlgorithmSpecification"]["TrainingImage"] = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/our-trainer:1"
    twin.sm.create_training_job(**request)
    assert ready.wait(30), "the trainer never started"
    # the line it printed is in CloudWatch while the job still runs (SageMaker streams a job's log)
    logs = boto3.client("logs", region_name=REGION)

    def streamed() -> list[str]:
        try:
            found = logs.describe_log_streams(
                logGroupName="/aws/sagemaker/TrainingJobs", logStreamNamePrefix="stop-me/"
            )["logStreams"]
        except logs.exceptions.ResourceNotFoundException:
            return []  # no line shipped yet: the log group comes with the first
        return [
            e["message"]
            for stream in found
            for e in logs.get_log_events(
                logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream["logStreamName"]
            )["events"]
        ]

    deadline = time.monotonic() + 300  # a guard against a stall: the wait ends when the line comes
    while "ready" not in streamed() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "ready" in streamed() and twin.describe("stop-me")["TrainingJobStatus"] == "InProgress"

    twin.sm.stop_training_job(TrainingJobName="stop-me")
    stopping = twin.describe("stop-me")
    assert (stopping["TrainingJobStatus"], stopping["SecondaryStatus"]) == ("Stopping", "Stopping")
    simulator.wait_all(timeout=60)

    stopped = twin.describe("stop-me")
    assert (stopped["TrainingJobStatus"], stopped["SecondaryStatus"]) == ("Stopped", "Stopped")
    assert "FailureReason" not in stopped
    assert "got SIGTERM" in job_view("stop-me").log_path.read_text()  # type: ignore[union-attr]
    assert untar(twin.object("results/stop-me/output/model.tar.gz")) == {"model.pt": b"saved on SIGTERM"}
    assert statuses(twin.events())[-3:] == [
        ("InProgress", "Training"),
        ("Stopping", "Stopping"),
        ("Stopped", "Stopped"),
    ]
    with pytest.raises(ClientError) as again:
        twin.sm.stop_training_job(TrainingJobName="stop-me")
    assert again.value.response["Error"]["Code"] == "ValidationException"
    assert "training job is in status Stopped" in again.value.response["Error"]["Message"]



def test_in_sagemakers_pytorch_image_a_stop_never_reaches_the_entry_point_which_is_killed_at_the_grace(
    twin: Twin, printed: Any
) -> None:
    # the probe of SageMaker's PyTorch image: an entry point that traps SIGTERM, then StopTrainingJob. Its first
    # process (bash) passes nothing on: the trap never runs, the entry point is killed when the grace ends
    simulator.configure(stop_grace_s=2.0)
    fs_id, mount = twin.lustre()
    ready = printed("probe", "ready")
    request = twin.request(
        "probe", fs_id=fs_id, directory_path=f"/{mount}/data", Environment={"STAND_IN_MODE": "wait"}
    )
    assert "/pytorch-training:" in request["AlgorithmSpecification"]["TrainingImage"]
    twin.sm.create_training_job(**request)
    assert ready.wait(30), "the trainer never started"
    twin.sm.stop_training_job(TrainingJobName="probe")
    simulator.wait_all(timeout=60)

    stopped = twin.describe("probe")
    assert (stopped["TrainingJobStatus"], stopped["SecondaryStatus"]) == ("Stopped", "Stopped")
    assert "got SIGTERM" not in job_view("probe").log_path.read_text()  # type: ignore[union-attr]
    assert untar(twin.object("results/probe/output/model.tar.gz")) == {}  # nothing saved


def test_the_job_reads_its_own_objects_through_its_network_as_its_role(twin: Twin, printed: Any) -> None:
    # what lustrain's trainer does to read the run's stop request: GetObject with the job's role, from its process
    twin.s3.put_object(Bucket=BUCKET, Key="control/run-1/stop-request.json", Body=b'{"stop": true}')
    fs_id, mount = twin.lustre()
    request = twin.request(
        "reader", fs_id=fs_id, directory_path=f"/{mount}/data", Environment={"STAND_IN_MODE": "read"}
    )
    request["Environment"]["READ_URI"] = f"s3://{BUCKET}/control/run-1/stop-request.json"
    request["Environment"]["MISSING_URI"] = f"s3://{BUCKET}/control/run-1/nothing-here.json"
    twin.sm.create_training_job(**request)
    simulator.wait_all(timeout=60)
    log = job_view("reader").log_path.read_text()  # type: ignore[union-attr]
    assert 'read {"stop": true}' in log, log
    assert "missing NoSuchKey" in log, log


@pytest.mark.parametrize(
    ("runtime", "fault"), [(1, None), (600, "stopped")], ids=["max-runtime-reached", "stopped-fault"]
)
def test_max_runtime_stops_the_job_as_max_runtime_exceeded(
    twin: Twin, runtime: int, fault: str | None
) -> None:
    if fault:
        faults.inject("start_training", fault)
    name = f"too-long-{fault or 'runtime'}"
    request = twin.request(
        name, StoppingCondition={"MaxRuntimeInSeconds": runtime}, Environment={"STAND_IN_MODE": "wait"}
    )
    twin.sm.create_training_job(**request)
    simulator.wait_all(timeout=60)
    stopped = twin.describe(name)
    assert (stopped["TrainingJobStatus"], stopped["SecondaryStatus"]) == ("Stopped", "MaxRuntimeExceeded")
    assert statuses(twin.events())[-2:] == [("Stopping", "Stopping"), ("Stopped", "MaxRuntimeExceeded")]


def test_a_failing_entry_point_fails_the_job_with_its_error(twin: Twin) -> None:
    fs_id, mount = twin.lustre()
    request = twin.request(
        "crashes", fs_id=fs_id, directory_path=f"/{mount}/data", Environment={"STAND_IN_MODE": "fail"}
    )
    twin.sm.create_training_job(**request)
    simulator.wait_all(timeout=60)
    failed = twin.describe("crashes")
    assert failed["TrainingJobStatus"] == "Failed"
    assert failed["FailureReason"].startswith(
        "AlgorithmError: ExecuteUserScriptError:\nExitCode 1\nErrorMessage"
    )
    assert "ValueError: bad shard in" in failed["FailureReason"]
    assert len(failed["FailureReason"]) <= 1024


# --- faults -----------------------------------------------------------------------------------------------------


def test_capacity_fault_fails_the_job_before_training(twin: Twin) -> None:
    fs_id, mount = twin.lustre()
    faults.inject("start_training", "capacity-error")
    twin.sm.create_training_job(**twin.request("no-capacity", fs_id=fs_id, directory_path=f"/{mount}/data"))
    simulator.wait_all(timeout=60)

    failed = twin.describe("no-capacity")
    assert failed["TrainingJobStatus"] == "Failed"
    assert failed["FailureReason"] == (
        "CapacityError: Unable to provision requested ML compute capacity. "
        "Please retry using a different ML instance type."
    )
    assert "TrainingStartTime" not in failed
    assert statuses(twin.events()) == [("InProgress", "Starting"), ("Failed", "Failed")]
    assert [str(f) for f in faults.fired()] == ["start_training:capacity-error"]


def test_training_error_fault_fails_the_algorithm(twin: Twin) -> None:
    fs_id, mount = twin.lustre()
    faults.inject("start_training", "user-error")
    twin.sm.create_training_job(**twin.request("algo-fails", fs_id=fs_id, directory_path=f"/{mount}/data"))
    simulator.wait_all(timeout=60)
    failed = twin.describe("algo-fails")
    assert failed["TrainingJobStatus"] == "Failed"
    assert failed["FailureReason"].startswith("AlgorithmError: ExecuteUserScriptError:")
    assert "injected fault user-error" in failed["FailureReason"]


# --- what CreateTrainingJob refuses -----------------------------------------------------------------------------


def error_of(call: Any, **kwargs: Any) -> tuple[str, str]:
    with pytest.raises(ClientError) as refused:
        call(**kwargs)
    return refused.value.response["Error"]["Code"], refused.value.response["Error"]["Message"]


def test_over_quota_is_refused_with_resource_limit_exceeded_and_awss_message(twin: Twin) -> None:
    request = twin.request(
        "big-job",
        ResourceConfig={"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2, "VolumeSizeInGB": 100},
    )
    assert error_of(twin.sm.create_training_job, **request) == (
        "ResourceLimitExceeded",
        "The account-level service limit 'ml.p4d.24xlarge for training job usage' is 0 Instances, with current "
        "utilization of 0 Instances and a request delta of 2 Instances. Please use AWS Service Quotas to request "
        "an increase for this quota. If AWS Service Quotas is not available, contact AWS support to request an "
        "increase for this quota.",
    )


@pytest.fixture
def m5_quota_of_three() -> Any:
    service_quotas.set_quota("ml.m5.xlarge", 3, region=REGION, account_id=ACCOUNT)
    yield
    default = service_quotas.TRAINING_INSTANCE_DEFAULTS["ml.m5.xlarge"]
    service_quotas.set_quota("ml.m5.xlarge", default, region=REGION, account_id=ACCOUNT)


def test_quota_counts_the_instances_of_jobs_in_progress(twin: Twin, m5_quota_of_three: None) -> None:
    fs_id, mount = twin.lustre()
    resources = {"InstanceType": "ml.m5.xlarge", "InstanceCount": 2, "VolumeSizeInGB": 30}
    running = twin.request(
        "holds-two",
        fs_id=fs_id,
        directory_path=f"/{mount}/data",
        ResourceConfig=resources,
        Environment={"STAND_IN_MODE": "wait"},
    )
    twin.sm.create_training_job(**running)

    code, message = error_of(
        twin.sm.create_training_job, **twin.request("wants-two", ResourceConfig=resources)
    )
    assert code == "ResourceLimitExceeded"
    assert (
        "is 3 Instances, with current utilization of 2 Instances and a request delta of 2 Instances"
        in message
    )
    twin.sm.stop_training_job(TrainingJobName="holds-two")


def test_a_name_is_never_reused_even_after_its_job_ended(twin: Twin) -> None:
    faults.inject("start_training", "capacity-error")  # the quickest way to a finished job
    twin.sm.create_training_job(**twin.request("once-only"))
    simulator.wait_all(timeout=60)
    assert twin.describe("once-only")["TrainingJobStatus"] == "Failed"

    code, message = error_of(twin.sm.create_training_job, **twin.request("once-only"))
    assert code == "ResourceInUse"  # CreateTrainingJob's modelled error, as AWS answers it
    assert message == (
        "Training job names must be unique within an AWS account and region, and a training job with this name "
        f"already exists (arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/once-only)"
    )


@pytest.mark.parametrize("name", ["gpt_small", "-gpt", "gpt-", "x" * 64])
def test_a_name_outside_awss_pattern_is_refused(twin: Twin, name: str) -> None:
    code, message = error_of(twin.sm.create_training_job, **twin.request(name))
    assert code == "ValidationException"
    assert f"Value '{name}' at 'trainingJobName' failed to satisfy constraint" in message
    assert simulator.jobs() == []


def test_volume_kms_key_on_an_instance_with_local_nvme_is_refused(twin: Twin) -> None:
    resources = {
        "InstanceType": "ml.p4d.24xlarge",
        "InstanceCount": 1,
        "VolumeSizeInGB": 100,
        "VolumeKmsKeyId": "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
    }
    code, message = error_of(
        twin.sm.create_training_job, **twin.request("encrypted", ResourceConfig=resources)
    )
    assert code == "ValidationException"
    assert "ml.p4d.24xlarge" in message
    assert "You can't request a VolumeKmsKeyId when using an instance type with local storage" in message


@pytest.mark.parametrize(
    ("instance_type", "local_nvme"),
    [
        ("ml.p4d.24xlarge", True),
        ("ml.p4de.24xlarge", True),
        ("ml.p5.48xlarge", True),
        ("ml.g5.2xlarge", True),
        ("ml.g4dn.xlarge", True),
        ("ml.p3.16xlarge", False),
        ("ml.m5.xlarge", False),
        ("ml.c5.4xlarge", False),
    ],
)
def test_which_instance_types_have_local_nvme(instance_type: str, local_nvme: bool) -> None:
    from lustrain.twin.patches.sagemaker import has_local_nvme

    assert has_local_nvme(instance_type) is local_nvme


@pytest.mark.parametrize(
    ("stopping", "checkpoints", "expected"),
    [
        (
            {"MaxRuntimeInSeconds": 3600},
            True,
            "Invalid MaxWaitTimeInSeconds. It must be present and be greater than or equal to MaxRuntimeInSeconds",
        ),
        (
            {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 1800},
            True,
            "Invalid MaxWaitTimeInSeconds. It must be present and be greater than or equal to MaxRuntimeInSeconds",
        ),
        (
            {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200},
            False,
            "CheckpointConfig.S3Uri is required when EnableManagedSpotTraining is set to true",
        ),
    ],
    ids=["no-max-wait", "max-wait-below-max-runtime", "no-checkpoints"],
)
def test_spot_without_max_wait_or_checkpoints_is_refused(
    twin: Twin, stopping: dict[str, int], checkpoints: bool, expected: str
) -> None:
    request = twin.request("spot", EnableManagedSpotTraining=True, StoppingCondition=stopping)
    if not checkpoints:
        del request["CheckpointConfig"]
    code, message = error_of(twin.sm.create_training_job, **request)
    assert code == "ValidationException"
    assert message.startswith(expected), message


def test_max_wait_without_spot_is_refused(twin: Twin) -> None:
    request = twin.request(
        "on-demand", StoppingCondition={"MaxRuntimeInSeconds": 60, "MaxWaitTimeInSeconds": 120}
    )
    assert error_of(twin.sm.create_training_job, **request) == (
        "ValidationException",
        "Invalid MaxWaitTimeInSeconds. It is only supported when EnableManagedSpotTraining is set to true",
    )


@pytest.mark.parametrize("operation", ["stop_training_job", "describe_training_job"])
def test_a_job_that_does_not_exist_is_awss_validation_error_not_found(twin: Twin, operation: str) -> None:
    assert error_of(getattr(twin.sm, operation), TrainingJobName="never-created") == (
        "ValidationException",
        "Requested resource not found.",
    )


# --- torchrun ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_distributed_job_runs_one_worker_per_instance_under_torchrun(twin: Twin) -> None:
    fs_id, mount = twin.lustre()
    request = twin.request(
        "two-workers",
        fs_id=fs_id,
        directory_path=f"/{mount}/data",
        ResourceConfig={"InstanceType": "ml.m5.xlarge", "InstanceCount": 2, "VolumeSizeInGB": 30},
    )
    request["HyperParameters"]["sagemaker_torch_distributed_enabled"] = json.dumps("true")
    twin.sm.create_training_job(**request)
    simulator.wait_all(timeout=120)

    assert twin.describe("two-workers")["TrainingJobStatus"] == "Completed"
    outputs = untar(twin.object("results/two-workers/output/output.tar.gz"))
    assert sorted(outputs) == ["seen-0.json", "seen-1.json"]
    for seen in map(json.loads, outputs.values()):
        assert seen["world_size"] == "2"
        assert seen["nice"] == trainer_nice()  # torchrun's workers inherit the launcher's priority
        assert seen["hosts"] == ["algo-1", "algo-2"]
        assert seen["files"] == ["a.txt", "sub/b.txt"]
