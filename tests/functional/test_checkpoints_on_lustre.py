"""checkpoints.to_filesystem on moto and the twin's FSx and SageMaker: the job writes its checkpoints to a read-write
Lustre directory linked to the run's checkpoint prefix, each attempt's end starts an export of them, teardown
exports them and waits before the file system goes, and what cannot work is refused before anything exists."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from infra_support import REGION, MinuteLeft, count_of_job, invoke, job_record, register
from infra_support import spec as any_spec
from lustrain_core.errors import SpecInvalid, TeardownIncomplete
from lustrain_core.launch_plan import checkpoint_location, link_for
from lustrain_core.spec import validate_spec
from lustrain_core.steps import exports
from training_support import code_section, held_training_jobs

from lustrain.twin import faults
from lustrain.twin.patches import fsx as twin_fsx
from lustrain.twin.patches import service_quotas

POLL = {"initial_seconds": 1, "max_seconds": 1, "max_polls": 20}
ON_LUSTRE = {"to_filesystem": True}


def spec(**sections: Any) -> dict[str, Any]:
    """A spec whose checkpoints on Lustre live on a persistent file system (the planner refuses scratch for them)."""
    if (sections.get("checkpoints") or {}).get("to_filesystem"):
        sections["filesystem"] = {"deployment_type": "persistent", **(sections.get("filesystem") or {})}
    return any_spec(**sections)


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    monkeypatch.setenv("LUSTRAIN_TEARDOWN_POLL_SECONDS", "0.01")
    faults.clear()
    twin_fsx.configure(polls=2)


def fsx() -> Any:
    return boto3.client("fsx", region_name=REGION)


def s3() -> Any:
    return boto3.client("s3", region_name=REGION)


def built(spec_doc: dict[str, Any]) -> dict[str, Any]:
    """A run as far as its file system (AVAILABLE and linked), as the state machine would have it."""
    document = register(spec_doc)
    document["network"] = invoke("create_network", document)
    document["poll"] = POLL
    document["filesystem"] = invoke("create_filesystem", document)
    while document["filesystem"]["lifecycle"] != "AVAILABLE":
        document["filesystem"] = invoke("check_filesystem", document)
    del document["poll"]
    return document


def checkpoint_written(document: dict[str, Any], files: dict[str, bytes]) -> None:
    """What a training job leaves in its checkpoint channel (the twin keeps a job's writes on the file system)."""
    where = document["filesystem"]["checkpoint_path"]
    twin_fsx.store_files(
        document["filesystem"]["file_system_id"], {f"{where}/{k}": v for k, v in files.items()}, []
    )


def tasks_of(fs_id: str) -> list[dict[str, Any]]:
    return [
        t for t in fsx().describe_data_repository_tasks()["DataRepositoryTasks"] if t["FileSystemId"] == fs_id
    ]


def settled(fs_id: str) -> list[dict[str, Any]]:
    """The file system's tasks once none runs (each look advances the twin's tasks, as FSx's time does)."""
    for _ in range(50):
        tasks = tasks_of(fs_id)
        if not any(t["Lifecycle"] in ("PENDING", "EXECUTING") for t in tasks):
            return tasks
    raise AssertionError(f"tasks of {fs_id} still running: {tasks}")


def label(task: dict[str, Any]) -> str:
    return next(t["Value"] for t in task["Tags"] if t["Key"] == "lustrain:export")


def keys_under(uri: str) -> list[str]:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    listed = s3().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"][len(prefix) :] for o in listed)


# --- the file system's link and the job's channel ---------------------------------------------------------------


def test_the_checkpoint_directory_is_linked_to_the_runs_checkpoint_prefix_with_nothing_automatic(aws):
    document = built(spec(checkpoints=ON_LUSTRE))
    job_id = document["job"]["job_id"]
    fs = document["filesystem"]
    assert fs["checkpoint_path"] == f"/lustrain-checkpoints/{job_id}"
    assert fs["checkpoint_directory_path"] == f"/{fs['mount_name']}/lustrain-checkpoints/{job_id}"
    (link,) = [
        a
        for a in fsx().describe_data_repository_associations()["Associations"]
        if a["FileSystemPath"] == fs["checkpoint_path"]
    ]
    spec_model = validate_spec(document["job"]["spec"])
    assert link["DataRepositoryPath"] == checkpoint_location(spec_model, job_id)
    # no S3 traffic while the job trains: the exports move the checkpoints
    assert link["S3"] == {"AutoImportPolicy": {"Events": []}, "AutoExportPolicy": {"Events": []}}
    assert link["BatchImportMetaDataOnCreate"] is False
    # teardown is told to export the checkpoint directory before it deletes the file system
    assert job_record(aws.jobs_table, job_id)["export_on_teardown"]["paths"] == [fs["checkpoint_path"]]


def test_the_training_job_mounts_the_checkpoint_directory_read_write_and_has_no_checkpoint_sync(aws):
    service_quotas.set_quota("ml.p4d.24xlarge", 4, REGION)
    document = built(spec(checkpoints=ON_LUSTRE))
    document["code"] = code_section(document["job"])
    with held_training_jobs():
        name = invoke("start_training", {**document, "task_token": "t" * 40})["training_job_name"]
        job = boto3.client("sagemaker", region_name=REGION).describe_training_job(TrainingJobName=name)
    assert "CheckpointConfig" not in job
    channels = {c["ChannelName"]: c["DataSource"]["FileSystemDataSource"] for c in job["InputDataConfig"]}
    assert channels["checkpoints"] == {
        "FileSystemId": document["filesystem"]["file_system_id"],
        "FileSystemType": "FSxLustre",
        "FileSystemAccessMode": "rw",
        "DirectoryPath": document["filesystem"]["checkpoint_directory_path"],
    }
    assert channels["training"]["FileSystemAccessMode"] == "ro"


# --- the export at the end of an attempt --------------------------------------------------------------------


def attempt_ended(aws: Any, document: dict[str, Any], *, ended: bool = True) -> dict[str, Any]:
    """next_attempt's input after the run's first attempt, whose job Failed (or still runs: ended=False)."""
    from test_next_attempt import ended_in_failure

    service_quotas.set_quota("ml.p4d.24xlarge", 4, REGION)
    document["code"] = code_section(document["job"])
    event = {**document, "task_token": "t" * 40}
    name = invoke("start_training", event)["training_job_name"]
    if ended:
        ended_in_failure(aws.tokens_table, name, "InternalServerError: We encountered an internal error.")
    return {**document, "failure": {"Error": "InfrastructureError", "Cause": "InternalServerError"}}


def test_an_attempts_end_starts_the_export_of_its_checkpoints_and_the_next_attempt_does_not_wait(aws):
    document = built(spec(checkpoints=ON_LUSTRE))
    fs_id = document["filesystem"]["file_system_id"]
    with held_training_jobs():
        failed = attempt_ended(aws, document)
        checkpoint_written(
            document, {"step-000000002.json": b"{}", "step-000000002-ab/__0_0.distcp": b"shard"}
        )
        decided = invoke("next_attempt", failed)
    (task,) = tasks_of(fs_id)
    assert decided["retry"] is True and decided["checkpoint_export"] == task["TaskId"]
    assert (task["Type"], task["Paths"], label(task)) == (
        "EXPORT_TO_REPOSITORY",
        [document["filesystem"]["checkpoint_path"].lstrip("/")],
        "attempt-1",
    )
    # the export runs on; once it is done the attempt's checkpoints are in the run's prefix
    assert [t["Lifecycle"] for t in settled(fs_id)] == ["SUCCEEDED"]
    where = checkpoint_location(validate_spec(document["job"]["spec"]), document["job"]["job_id"])
    assert keys_under(where) == ["step-000000002-ab/__0_0.distcp", "step-000000002.json"]


def test_no_export_while_the_attempts_job_still_writes_and_none_without_checkpoints_on_lustre(aws):
    document = built(spec(checkpoints=ON_LUSTRE))
    with held_training_jobs():
        decided = invoke("next_attempt", attempt_ended(aws, document, ended=False))
    assert decided.get("checkpoint_export") is None
    assert tasks_of(document["filesystem"]["file_system_id"]) == []

    plain = built(spec(name="plain"))
    with held_training_jobs():
        decided = invoke("next_attempt", attempt_ended(aws, plain))
    assert decided.get("checkpoint_export") is None
    assert tasks_of(plain["filesystem"]["file_system_id"]) == []


def test_an_export_refused_because_another_task_runs_leaves_the_decision_as_it_was(aws):
    document = built(spec(checkpoints=ON_LUSTRE))
    fs_id = document["filesystem"]["file_system_id"]
    with held_training_jobs():
        failed = attempt_ended(aws, document)
        busy = fsx().create_data_repository_task(
            Type="EXPORT_TO_REPOSITORY", FileSystemId=fs_id, Paths=["data"], Report={"Enabled": False}
        )["DataRepositoryTask"]
        decided = invoke("next_attempt", failed)
    assert decided["retry"] is True and decided.get("checkpoint_export") is None
    assert [t["TaskId"] for t in tasks_of(fs_id)] == [busy["TaskId"]]


# --- teardown -------------------------------------------------------------------------------------------------


def test_teardown_exports_the_checkpoints_and_waits_for_it_before_the_file_system_goes(aws):
    document = built(spec(checkpoints=ON_LUSTRE))
    fs_id = document["filesystem"]["file_system_id"]
    job_id = document["job"]["job_id"]
    checkpoint_written(document, {"step-000000004.json": b"{}", "step-000000004-cd/__0_0.distcp": b"shard"})
    # an attempt's export still running: teardown waits for it, then runs its own (the attempt's success would
    # not cover what a later attempt wrote)
    fsx().create_data_repository_task(
        **exports.export_request(
            fs_id, [document["filesystem"]["checkpoint_path"]], job_id, aws.stack_name, "attempt-1"
        )
    )
    invoke("teardown", document, MinuteLeft())

    assert count_of_job(job_id)["file_systems"] == 0
    assert sorted(label(t) for t in tasks_of(fs_id)) == ["attempt-1", "teardown"]
    assert all(t["Lifecycle"] == "SUCCEEDED" for t in tasks_of(fs_id))
    where = checkpoint_location(validate_spec(document["job"]["spec"]), job_id)
    assert keys_under(where) == ["step-000000004-cd/__0_0.distcp", "step-000000004.json"]


def test_a_failed_export_keeps_the_file_system_so_the_checkpoints_are_not_lost(aws, monkeypatch):
    document = built(spec(checkpoints=ON_LUSTRE))
    fs_id = document["filesystem"]["file_system_id"]
    checkpoint_written(document, {"step-000000004.json": b"{}"})
    # the checkpoint prefix's bucket is gone: FSx cannot write the files and the export fails
    bucket = (
        checkpoint_location(validate_spec(document["job"]["spec"]), "x").removeprefix("s3://").split("/")[0]
    )
    for o in s3().list_objects_v2(Bucket=bucket).get("Contents", []):
        s3().delete_object(Bucket=bucket, Key=o["Key"])
    s3().delete_bucket(Bucket=bucket)

    result = invoke("teardown", document, MinuteLeft())

    (task,) = tasks_of(fs_id)
    assert task["Lifecycle"] == "FAILED" and "failed to export" in task["FailureDetails"]["Message"]
    assert fsx().describe_file_systems(FileSystemIds=[fs_id])["FileSystems"][0]["Lifecycle"] == "AVAILABLE"
    (kept,) = [k for k in result["kept"] if k["type"] == "file_system"]
    assert "kept so the results are not lost" in kept["reason"]


# --- refused before anything exists ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sections", "field", "words"),
    [
        ({"filesystem": {"mount_path": "/"}}, "filesystem.mount_path", 'a link at "/"'),
        (
            {"filesystem": {"mount_path": "/lustrain-checkpoints"}},
            "filesystem.mount_path",
            "writes checkpoints",
        ),
        (
            {
                "output": {"to_filesystem": True, "s3_uri": "s3://lustrain-test-results/x/"},
                "checkpoints": {**ON_LUSTRE, "s3_uri": "s3://lustrain-test-results/x/run-0123abcd/output/"},
            },
            "checkpoints.to_filesystem",
            "outside the run's output s3://lustrain-test-results/x/run-0123abcd/output/",
        ),
    ],
)
def test_a_spec_whose_checkpoints_cannot_have_their_own_link_is_refused_naming_the_field(
    sections, field, words
):
    doc = spec(**{"checkpoints": ON_LUSTRE, **sections})
    with pytest.raises(SpecInvalid) as refused:
        link_for(validate_spec(doc), "run-0123abcd")
    (error,) = refused.value.errors
    assert error.path == field and words in error.message


def test_output_and_checkpoints_both_on_lustre_work_each_in_the_runs_own_folder():
    for checkpoints in ({}, {"s3_uri": "s3://lustrain-test-ckpt/runs/"}):
        doc = spec(checkpoints={**ON_LUSTRE, **checkpoints}, output={"to_filesystem": True})
        links = link_for(validate_spec(doc), "run-0123abcd")
        assert [link.purpose for link in links.links] == ["data", "output", "checkpoints"]
        assert links.export_paths == ["/lustrain-output/run-0123abcd", "/lustrain-checkpoints/run-0123abcd"]
        assert links.links[1].s3_uri == "s3://lustrain-test-results/tiny/run-0123abcd/output/"


def test_the_twins_export_of_a_path_under_no_link_fails_as_fsx_does(aws):
    document = built(spec(checkpoints=ON_LUSTRE))
    fs_id = document["filesystem"]["file_system_id"]
    fsx().create_data_repository_task(
        Type="EXPORT_TO_REPOSITORY", FileSystemId=fs_id, Paths=["elsewhere"], Report={"Enabled": False}
    )
    (task,) = settled(fs_id)
    assert task["Lifecycle"] == "FAILED"
    assert "not within a path linked" in task["FailureDetails"]["Message"]


class ReserveLeft:
    """A Lambda context with only its reserve left: teardown may not wait at all."""

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def test_an_export_still_running_ends_the_teardown_incomplete_with_the_file_system_there(aws):
    """Each further look at a long export is one more try of the state machine's Teardown task (its Retry on
    TeardownIncomplete, counted by tests/unit/test_history_budget.py): never a delete before the export ends."""
    from handlers import teardown as handler

    document = built(spec(checkpoints=ON_LUSTRE))
    fs_id = document["filesystem"]["file_system_id"]
    checkpoint_written(document, {"step-000000004.json": b"{}"})
    twin_fsx.configure(polls=1000)  # the export takes longer than this invocation may wait

    with pytest.raises(TeardownIncomplete) as incomplete:
        handler.handler(document, ReserveLeft())

    assert "export" in str(incomplete.value) and "still running" in str(incomplete.value)
    (task,) = tasks_of(fs_id)
    assert (label(task), task["Lifecycle"]) == ("teardown", "PENDING")
    assert fsx().describe_file_systems(FileSystemIds=[fs_id])["FileSystems"][0]["Lifecycle"] == "AVAILABLE"
