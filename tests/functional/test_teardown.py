"""teardown on moto and the twin's FSx: everything the run made goes, nothing else does, and twice is safe."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from infra_support import REGION, MinuteLeft, count_of_job, invoke, job_record, prepare_spec, register, spec
from lustrain_core.steps import records
from training_support import held_training_jobs, training_input

from lustrain.twin import faults
from lustrain.twin.patches import fsx as twin_fsx
from lustrain.twin.patches import service_quotas

NOTHING = {
    "vpcs": 0,
    "subnets": 0,
    "security_groups": 0,
    "route_tables": 0,
    "endpoints": 0,
    "file_systems": 0,
}
POLL = {"initial_seconds": 1, "max_seconds": 1, "max_polls": 20}


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    monkeypatch.setenv("LUSTRAIN_TEARDOWN_POLL_SECONDS", "0.01")
    faults.clear()
    twin_fsx.configure(polls=2)


def ec2():
    return boto3.client("ec2", region_name=REGION)


def fsx():
    return boto3.client("fsx", region_name=REGION)


def built(spec_doc: dict[str, Any] | None = None, with_filesystem: bool = True) -> dict[str, Any]:
    """A run as far as its file system (AVAILABLE and linked), as the state machine would have it."""
    document = register(spec_doc)
    document["network"] = invoke("create_network", document)
    if with_filesystem:
        document["poll"] = POLL
        document["filesystem"] = invoke("create_filesystem", document)
        while document["filesystem"]["lifecycle"] != "AVAILABLE":
            document["filesystem"] = invoke("check_filesystem", document)
        del document["poll"]
    return document


def tear_down(document: dict[str, Any]) -> dict[str, Any]:
    return invoke("teardown", document, MinuteLeft())


def test_after_a_whole_run_nothing_of_the_job_is_left_and_the_record_says_so(aws):
    document = built()
    job_id = document["job"]["job_id"]
    result = tear_down(document)
    assert count_of_job(job_id) == NOTHING
    deleted = {(r["type"], r["id"]) for r in result["deleted"]}
    network = document["network"]
    assert deleted == {
        ("vpc", network["vpc_id"]),
        ("subnet", network["subnet_id"]),
        ("route_table", network["route_table_id"]),
        ("vpc_endpoint", network["endpoint_id"]),
        ("security_group", network["security_group_ids"][0]),
        ("file_system", document["filesystem"]["file_system_id"]),
        ("data_repository_association", document["filesystem"]["links"][0]["association_id"]),
    }
    assert (result["kept"], result["remaining"], result["status"]) == ([], [], "SUCCEEDED")
    record = job_record(aws.jobs_table, job_id)
    assert (record["status"], record["resources"]) == ("SUCCEEDED", [])


def test_after_a_partial_create_nothing_is_left_and_the_run_is_failed(aws):
    document = built(with_filesystem=False)
    job_id = document["job"]["job_id"]
    document["error"] = {"Error": "FileSystemFailed", "Cause": "the file system went FAILED"}
    result = tear_down(document)
    assert count_of_job(job_id) == NOTHING
    assert len(result["deleted"]) == 5 and result["status"] == "FAILED"
    record = job_record(aws.jobs_table, job_id)
    assert record["status"] == "FAILED"
    assert record["error"] == {"Error": "FileSystemFailed", "Cause": "the file system went FAILED"}


def test_a_resource_made_but_never_recorded_is_found_by_its_tags(aws):
    document = register()
    job_id = document["job"]["job_id"]
    tags = [
        {"Key": "lustrain:job-id", "Value": job_id},
        {"Key": "lustrain:created-by", "Value": aws.stack_name},
    ]
    ec2().create_vpc(CidrBlock="10.80.0.0/16", TagSpecifications=[{"ResourceType": "vpc", "Tags": tags}])
    assert count_of_job(job_id)["vpcs"] == 1
    tear_down(document)
    assert count_of_job(job_id) == NOTHING


def test_an_untagged_or_foreign_vpc_is_never_deleted_even_when_its_id_reaches_the_ledger(aws):
    team_vpc = ec2().create_vpc(CidrBlock="10.50.0.0/16")["Vpc"]["VpcId"]
    other_stack = ec2().create_vpc(
        CidrBlock="10.51.0.0/16",
        TagSpecifications=[{"ResourceType": "vpc", "Tags": [{"Key": "lustrain:job-id", "Value": "x"}]}],
    )["Vpc"]["VpcId"]
    document = built(with_filesystem=False)
    job_id = document["job"]["job_id"]
    ddb = boto3.client("dynamodb", region_name=REGION)
    records.add_resources(
        ddb, aws.jobs_table, job_id, [{"type": "vpc", "id": team_vpc}, {"type": "vpc", "id": other_stack}]
    )
    result = tear_down(document)
    left = {v["VpcId"] for v in ec2().describe_vpcs()["Vpcs"]}
    assert {team_vpc, other_stack} <= left
    assert {k["id"] for k in result["kept"]} == {team_vpc, other_stack}
    assert count_of_job(job_id) == NOTHING


def test_a_kept_file_system_stays_with_the_network_it_lives_in(aws):
    document = built(spec(filesystem={"keep": True}))
    job_id = document["job"]["job_id"]
    fs_id = document["filesystem"]["file_system_id"]
    result = tear_down(document)
    assert fsx().describe_file_systems(FileSystemIds=[fs_id])["FileSystems"][0]["Lifecycle"] == "AVAILABLE"
    assert twin_fsx.linked_paths(fs_id) == {"/data": "s3://lustrain-test-data/tokens/"}
    kept = {(k["type"], k["id"]): k["reason"] for k in result["kept"]}
    assert kept[("file_system", fs_id)] == "filesystem.keep is true"
    assert kept[("subnet", document["network"]["subnet_id"])] == f"the kept file system {fs_id} lives in it"
    assert result["deleted"] == [] and result["remaining"] == []
    assert count_of_job(job_id)["subnets"] == 1
    again = tear_down(document)
    assert again["deleted"] == [] and ("file_system", fs_id) in {(k["type"], k["id"]) for k in again["kept"]}


def test_teardown_twice_is_safe_and_the_second_deletes_nothing(aws):
    document = built()
    first = tear_down(document)
    second = tear_down(document)
    assert len(first["deleted"]) == 7
    assert (second["deleted"], second["kept"], second["remaining"]) == ([], [], [])
    assert count_of_job(document["job"]["job_id"]) == NOTHING
    # a retry whose first answer was lost still reports what the run's teardown deleted, for the notification
    assert second["torn_down"]["deleted"] == first["deleted"] == first["torn_down"]["deleted"]


def test_a_rule_another_teardown_revoked_meanwhile_is_gone_as_wanted_and_the_group_still_goes(aws):
    # two teardowns of one run at once (a retry beside one cut off by its timeout): the other revokes the group's
    # rules between this one's look at the group and its own revoke, which EC2 then answers InvalidPermission.NotFound
    from lustrain_core import clients

    document = built()
    other = ec2()
    revoked: list[str] = []

    def the_other_teardown_first(params: dict[str, Any], **_: Any) -> None:
        if not revoked:
            revoked.append(params["GroupId"])
            group = other.describe_security_groups(GroupIds=[params["GroupId"]])["SecurityGroups"][0]
            other.revoke_security_group_ingress(GroupId=params["GroupId"], IpPermissions=group["IpPermissions"])

    clients.client("ec2").meta.events.register(
        "before-parameter-build.ec2.RevokeSecurityGroupIngress", the_other_teardown_first
    )
    try:
        result = tear_down(document)
    finally:
        clients.client("ec2").meta.events.unregister(
            "before-parameter-build.ec2.RevokeSecurityGroupIngress", the_other_teardown_first
        )

    assert revoked and result["remaining"] == []
    assert count_of_job(document["job"]["job_id"]) == NOTHING


def tasks_of(fs_id: str) -> list[dict[str, Any]]:
    return [
        t for t in fsx().describe_data_repository_tasks()["DataRepositoryTasks"] if t["FileSystemId"] == fs_id
    ]


def test_output_on_the_file_system_is_exported_to_s3_before_the_file_system_goes(aws):
    document = built(spec(output={"to_filesystem": True}))
    fs_id = document["filesystem"]["file_system_id"]
    job_id = document["job"]["job_id"]
    tear_down(document)
    assert count_of_job(job_id) == NOTHING
    (export,) = tasks_of(fs_id)
    assert (export["Type"], export["Paths"], export["Lifecycle"]) == (
        "EXPORT_TO_REPOSITORY",
        [f"lustrain-output/{job_id}"],
        "SUCCEEDED",
    )
    # the twin, like FSx, refuses DeleteFileSystem while a task runs: the export finished before the delete


def test_teardown_waits_for_an_export_already_running(aws):
    document = built()
    fs_id = document["filesystem"]["file_system_id"]
    task = fsx().create_data_repository_task(
        Type="EXPORT_TO_REPOSITORY", FileSystemId=fs_id, Paths=["data"], Report={"Enabled": False}
    )["DataRepositoryTask"]
    assert task["Lifecycle"] == "PENDING"
    tear_down(document)
    assert count_of_job(document["job"]["job_id"]) == NOTHING
    assert [(t["TaskId"], t["Lifecycle"]) for t in tasks_of(fs_id)] == [(task["TaskId"], "SUCCEEDED")]


def test_a_reused_file_system_stays_and_only_the_runs_own_link_on_it_goes(aws):
    owner = built(spec(name="team"))
    shared = owner["filesystem"]["file_system_id"]
    document = register(
        spec(filesystem={"file_system_id": shared, "mount_path": "/data"}, output={"to_filesystem": True}),
        execution="reuse",
    )
    document["network"] = owner["network"]
    document["poll"] = POLL
    document["filesystem"] = invoke("create_filesystem", document)
    while document["filesystem"]["lifecycle"] != "AVAILABLE":
        document["filesystem"] = invoke("check_filesystem", document)
    del document["poll"]
    job_id = document["job"]["job_id"]
    out = f"/lustrain-output/{job_id}"
    assert out in twin_fsx.linked_paths(shared)

    result = tear_down(document)
    assert fsx().describe_file_systems(FileSystemIds=[shared])["FileSystems"][0]["Lifecycle"] == "AVAILABLE"
    assert twin_fsx.linked_paths(shared) == {"/data": "s3://lustrain-test-data/tokens/"}
    assert [r["type"] for r in result["deleted"]] == ["data_repository_association"]
    assert count_of_job(owner["job"]["job_id"])["file_systems"] == 1


# --- the run's training job (start_training records it in the ledger before creating it) -------------------


@pytest.fixture
def training(aws):
    """A run whose training job start_training created on the twin, held InProgress (it never trains)."""
    service_quotas.set_quota("ml.p4d.24xlarge", 4, REGION)
    with held_training_jobs():
        document = training_input()
        name = invoke("start_training", document)["training_job_name"]
        del document["task_token"]
        yield document, name


def sagemaker():
    return boto3.client("sagemaker", region_name=REGION)


def test_a_training_job_still_running_is_stopped_and_waited_for_before_anything_is_deleted(training, aws):
    document, name = training
    assert sagemaker().describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "InProgress"
    document["error"] = {"Error": "States.Timeout", "Cause": "no event from SageMaker"}

    result = tear_down(document)

    assert sagemaker().describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "Stopped"
    assert result["stopped"] == [{"type": "training_job", "id": name}]
    assert result["remaining"] == [] and result["status"] == "FAILED"
    assert job_record(aws.jobs_table, document["job"]["job_id"])["resources"] == []


def test_a_training_job_that_already_stopped_is_handled_not_left_remaining(training):
    document, name = training
    sagemaker().stop_training_job(TrainingJobName=name)

    result = tear_down(document)

    assert sagemaker().describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "Stopped"
    assert {"type": "training_job", "id": name} in result["already_gone"]
    assert (result["stopped"], result["remaining"]) == ([], [])


@pytest.mark.parametrize("status", ["Completed", "Failed"])
def test_a_finished_training_job_is_handled_not_left_remaining(training, status):
    """The bug: a Completed job stayed in teardown's "remaining" list, and the run's notification said so."""
    from botocore.stub import Stubber
    from lustrain_core import clients

    document, name = training
    client = clients.client("sagemaker")
    ended = client.describe_training_job(TrainingJobName=name)
    tags = client.list_tags(ResourceArn=ended["TrainingJobArn"])["Tags"]
    ended = {k: v for k, v in ended.items() if k != "ResponseMetadata"}
    ended.update(
        TrainingJobStatus=status,
        SecondaryStatus=status,
        ModelArtifacts={"S3ModelArtifacts": f"s3://lustrain-test-results/tiny/{name}/output/model.tar.gz"},
    )
    with Stubber(client) as stub:
        stub.add_response("describe_training_job", ended, {"TrainingJobName": name})
        stub.add_response("list_tags", {"Tags": tags}, {"ResourceArn": ended["TrainingJobArn"]})
        result = tear_down(document)
        stub.assert_no_pending_responses()

    assert {"type": "training_job", "id": name} in result["already_gone"]
    assert (result["stopped"], result["remaining"]) == ([], [])


def test_a_training_job_in_the_ledger_that_was_never_created_counts_as_gone(aws):
    document = register()
    never = f"tiny-{document['job']['job_id'].rsplit('-', 1)[1]}-1"
    ddb = boto3.client("dynamodb", region_name=REGION)
    records.add_resources(
        ddb, aws.jobs_table, document["job"]["job_id"], [{"type": "training_job", "id": never}]
    )

    result = tear_down(document)

    assert result["already_gone"] == [{"type": "training_job", "id": never}]
    assert result["remaining"] == []


def test_a_training_job_of_another_run_is_never_stopped_even_from_the_ledger(training, aws):
    _, name = training
    other = register(spec(name="other"), execution="run-2")
    ddb = boto3.client("dynamodb", region_name=REGION)
    records.add_resources(ddb, aws.jobs_table, other["job"]["job_id"], [{"type": "training_job", "id": name}])

    result = tear_down(other)

    assert sagemaker().describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "InProgress"
    assert result["kept"] == [
        {"type": "training_job", "id": name, "reason": "not tagged as this job's: never stopped"}
    ]


# --- data preparation's processing jobs (steps/prepare.py records each in the ledger before creating it) ------


def endless_processing_job(aws, job_id: str, name: str, instances: int) -> dict:
    """The CreateProcessingJob request of a stage tagged as the run's, whose container waits until it is stopped."""
    from lustrain_core.launch_plan import TAG_CREATED_BY, TAG_JOB_ID

    return {
        "ProcessingJobName": name,
        "ProcessingResources": {
            "ClusterConfig": {"InstanceCount": instances, "InstanceType": "ml.c5.xlarge", "VolumeSizeInGB": 30}
        },
        "AppSpecification": {
            "ImageUri": "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-training:x",
            "ContainerEntrypoint": ["python3", "-c", "import signal; signal.pause()"],
        },
        "RoleArn": aws.sagemaker_role_arn,
        "Tags": [{"Key": TAG_JOB_ID, "Value": job_id}, {"Key": TAG_CREATED_BY, "Value": aws.stack_name}],
    }


def test_a_processing_job_still_running_is_stopped_before_anything_is_deleted_and_another_runs_never(aws):
    from lustrain_core.steps import prepare

    document = built(with_filesystem=False)
    job_id = document["job"]["job_id"]
    request = endless_processing_job(aws, job_id, f"{job_id}-prep-work", instances=2)
    ddb = boto3.client("dynamodb", region_name=REGION)
    records.add_resources(
        ddb, aws.jobs_table, job_id, [{"type": prepare.RESOURCE_TYPE, "id": request["ProcessingJobName"]}]
    )
    assert prepare.start(sagemaker(), request) == "InProgress"
    other = register(spec(name="other"), execution="run-2")
    records.add_resources(
        ddb,
        aws.jobs_table,
        other["job"]["job_id"],
        [{"type": "processing_job", "id": request["ProcessingJobName"]}],
    )

    assert tear_down(other)["kept"] == [
        {
            "type": "processing_job",
            "id": request["ProcessingJobName"],
            "reason": "not tagged as this job's: never stopped",
        }
    ]
    result = tear_down(document)

    described = sagemaker().describe_processing_job(ProcessingJobName=request["ProcessingJobName"])
    assert described["ProcessingJobStatus"] == "Stopped"
    assert result["stopped"] == [{"type": "processing_job", "id": request["ProcessingJobName"]}]
    assert result["remaining"] == [] and count_of_job(job_id) == NOTHING
    # the ledger is clear: a second teardown has nothing left to do
    again = tear_down(document)
    assert (again["remaining"], again["status"]) == ([], "SUCCEEDED")


def test_a_data_preparation_run_is_torn_down_from_its_record_its_processing_job_stopped(aws):
    """A kind: prepare record holds no training spec: no capacity queue to leave, no file system to keep."""
    from lustrain_core.steps import prepare

    job = invoke("register_job", {"execution": "p", "input": {"spec": prepare_spec()}})
    job_id = job["job_id"]
    name = f"{job_id}-prep-plan"
    ddb = boto3.client("dynamodb", region_name=REGION)
    records.add_resources(ddb, aws.jobs_table, job_id, [{"type": prepare.RESOURCE_TYPE, "id": name}])
    request = endless_processing_job(aws, job_id, name, instances=1)
    assert prepare.start(sagemaker(), request) == "InProgress"

    error = {"Error": "PrepareFailed", "Cause": "stopped by hand"}
    result = tear_down({"job": job, "error": error})

    assert sagemaker().describe_processing_job(ProcessingJobName=name)["ProcessingJobStatus"] == "Stopped"
    assert (result["stopped"], result["remaining"]) == ([{"type": "processing_job", "id": name}], [])
    record = job_record(aws.jobs_table, job_id)
    assert (record["status"], record["resources"]) == ("FAILED", [])
