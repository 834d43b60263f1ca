"""create_filesystem and check_filesystem on the twin's FSx: the planned Lustre file system, linked to the data,
polled until it is ready; a file system to reuse is checked instead."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from infra_support import REGION, invoke, job_record, register, spec
from lustrain_core.errors import FileSystemFailed, SpecInvalid
from lustrain_core.steps import filesystem as fs

from lustrain.twin import faults
from lustrain.twin.patches import fsx as twin_fsx

#: the first look waits the creation time to expect (20 s here), every later look the steady interval (5 s)
POLL = {"initial_seconds": 20, "max_seconds": 5, "max_polls": 12}


@pytest.fixture(autouse=True)
def _clean_twin():
    faults.clear()
    twin_fsx.configure(polls=2)
    yield
    faults.clear()


def fsx():
    return boto3.client("fsx", region_name=REGION)


def prepared(spec_doc: dict[str, Any] | None = None) -> dict[str, Any]:
    document = register(spec_doc)
    document["network"] = invoke("create_network", document)
    document["poll"] = POLL
    return document


def until_ready(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the poll loop as the state machine does; every check's result."""
    checks = []
    while document["filesystem"]["lifecycle"] != "AVAILABLE":
        assert len(checks) < POLL["max_polls"], checks
        document["filesystem"] = invoke("check_filesystem", document)
        checks.append(document["filesystem"])
    return checks


def test_the_first_look_waits_the_creation_time_then_every_look_the_steady_interval(aws):
    from lustrain.twin.patches import fsx as twin_fsx

    twin_fsx.configure(polls=3)
    document = prepared()
    document["filesystem"] = invoke("create_filesystem", document)
    assert document["filesystem"]["wait_seconds"] == POLL["initial_seconds"]
    checks = until_ready(document)
    # CREATING, CREATING, AVAILABLE with its links made (the next look sooner: a third of the interval), then the
    # links: each look at most the steady interval after the one before, so all is noticed within 5 s of being ready
    made = next(i for i, c in enumerate(checks) if c["links"])
    assert checks[made]["wait_seconds"] == POLL["max_seconds"] // fs.LINK_FIRST_LOOK_SHARE
    assert {c["wait_seconds"] for i, c in enumerate(checks) if i != made} == {POLL["max_seconds"]}, checks


def test_the_planned_scratch_file_system_is_created_linked_and_polled_until_ready(aws):
    document = prepared()
    created = invoke("create_filesystem", document)
    document["filesystem"] = created
    assert (created["lifecycle"], created["created"], created["polls"], created["wait_seconds"]) == (
        "CREATING",
        True,
        0,
        20,
    )
    checks = until_ready(document)
    # still CREATING, AVAILABLE with links made (looked at again sooner), links CREATING, all ready
    assert [c["wait_seconds"] for c in checks] == [5, 1, 5, 5]
    assert [c["polls"] for c in checks] == list(range(1, len(checks) + 1))

    described = fsx().describe_file_systems(FileSystemIds=[created["file_system_id"]])["FileSystems"][0]
    plan = document["job"]["plan"]["filesystem"]
    lustre = described["LustreConfiguration"]
    assert described["StorageCapacity"] == plan["storage_gib"]
    assert (lustre["DeploymentType"], lustre["DataCompressionType"]) == ("SCRATCH_2", "LZ4")
    assert described["SubnetIds"] == [document["network"]["subnet_id"]]
    assert described["FileSystemTypeVersion"] == "2.15"

    final = document["filesystem"]
    assert final["mount_name"] == lustre["MountName"]
    assert final["directory_path"] == f"/{lustre['MountName']}/data"
    assert final["dns_name"] == described["DNSName"]
    (link,) = fsx().describe_data_repository_associations(
        Filters=[{"Name": "file-system-id", "Values": [created["file_system_id"]]}]
    )["Associations"]
    assert (link["FileSystemPath"], link["DataRepositoryPath"], link["BatchImportMetaDataOnCreate"]) == (
        "/data",
        "s3://lustrain-test-data/tokens/",
        True,
    )
    assert twin_fsx.linked_paths(created["file_system_id"]) == {"/data": "s3://lustrain-test-data/tokens/"}
    recorded = {
        (r["type"], r["id"]) for r in job_record(aws.jobs_table, document["job"]["job_id"])["resources"]
    }
    assert ("file_system", created["file_system_id"]) in recorded
    assert ("data_repository_association", link["AssociationId"]) in recorded


def test_a_retried_create_returns_the_same_file_system(aws):
    document = prepared()
    first = invoke("create_filesystem", document)
    again = invoke("create_filesystem", document)
    assert again["file_system_id"] == first["file_system_id"]
    assert len(fsx().describe_file_systems()["FileSystems"]) == 1
    assert again["wait_seconds"] == POLL["initial_seconds"]  # still CREATING: the creation time to expect


def test_a_retried_create_that_finds_its_file_system_available_looks_again_at_the_steady_interval(aws):
    document = prepared()
    invoke("create_filesystem", document)
    twin_fsx.configure(polls=0)  # the answer was lost and the file system has become AVAILABLE meanwhile
    fsx().describe_file_systems()
    again = invoke("create_filesystem", document)
    assert again["file_system_lifecycle"] == "AVAILABLE"
    assert again["wait_seconds"] == POLL["max_seconds"]


def test_a_persistent_file_system_gets_its_throughput_and_the_association(aws):
    document = prepared(spec(filesystem={"deployment_type": "persistent", "throughput_per_tib": 500}))
    document["filesystem"] = invoke("create_filesystem", document)
    until_ready(document)
    described = fsx().describe_file_systems(FileSystemIds=[document["filesystem"]["file_system_id"]])[
        "FileSystems"
    ][0]
    assert described["LustreConfiguration"]["DeploymentType"] == "PERSISTENT_2"
    assert described["LustreConfiguration"]["PerUnitStorageThroughput"] == 500
    assert twin_fsx.linked_paths(described["FileSystemId"]) == {"/data": "s3://lustrain-test-data/tokens/"}


def test_scratch_with_the_data_at_the_root_uses_import_path_and_the_mount_name_alone(aws):
    document = prepared(spec(filesystem={"mount_path": "/"}))
    document["filesystem"] = invoke("create_filesystem", document)
    until_ready(document)
    fs_id = document["filesystem"]["file_system_id"]
    described = fsx().describe_file_systems(FileSystemIds=[fs_id])["FileSystems"][0]
    repository = described["LustreConfiguration"]["DataRepositoryConfiguration"]
    assert (repository["ImportPath"], repository["AutoImportPolicy"]) == (
        "s3://lustrain-test-data/tokens/",
        "NEW_CHANGED_DELETED",
    )
    assert document["filesystem"]["directory_path"] == "/" + described["LustreConfiguration"]["MountName"]
    assert twin_fsx.linked_paths(fs_id) == {"/": "s3://lustrain-test-data/tokens/"}
    # asked for: left out, FSx makes a SCRATCH_2 a Lustre 2.10
    assert described["FileSystemTypeVersion"] == "2.15"


def test_output_on_the_file_system_is_linked_for_export_and_noted_for_teardown(aws):
    document = prepared(spec(output={"to_filesystem": True}))
    document["filesystem"] = invoke("create_filesystem", document)
    until_ready(document)
    fs_id = document["filesystem"]["file_system_id"]
    job_id = document["job"]["job_id"]
    out = f"/lustrain-output/{job_id}"
    assert twin_fsx.linked_paths(fs_id) == {
        "/data": "s3://lustrain-test-data/tokens/",
        out: f"s3://lustrain-test-results/tiny/{job_id}/output/",
    }
    assert document["filesystem"]["output_directory_path"] == f"/{document['filesystem']['mount_name']}{out}"
    links = fsx().describe_data_repository_associations(
        Filters=[{"Name": "file-system-id", "Values": [fs_id]}]
    )
    output_link = next(a for a in links["Associations"] if a["FileSystemPath"] == out)
    assert output_link["S3"] == {"AutoExportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}}
    assert job_record(aws.jobs_table, job_id)["export_on_teardown"] == {
        "file_system_id": fs_id,
        "paths": [out],
    }


def test_a_failed_file_system_ends_the_run_with_fsxs_own_words(aws):
    document = prepared()
    faults.inject("create_filesystem", "fsx-failed")
    document["filesystem"] = invoke("create_filesystem", document)
    with pytest.raises(FileSystemFailed) as exc:
        until_ready(document)
    assert exc.value.details["lifecycle"] == "FAILED"
    assert document["filesystem"]["file_system_id"] in exc.value.message
    assert "internal error" in exc.value.message


def test_a_file_system_still_creating_after_max_polls_is_given_up(aws):
    twin_fsx.configure(polls=1000)
    document = prepared()
    document["poll"] = {"initial_seconds": 1, "max_seconds": 1, "max_polls": 3}
    document["filesystem"] = invoke("create_filesystem", document)
    invoke_count = 0
    with pytest.raises(FileSystemFailed, match="still not ready after 3 checks"):
        while True:
            invoke_count += 1
            document["filesystem"] = invoke("check_filesystem", document)
    assert invoke_count == 3


# --- reusing a file system ---------------------------------------------------------------------------------


def team_file_system(
    document: dict[str, Any], link_path: str | None = "/data", team: str | None = None, kind: str = "PERSISTENT_2"
) -> str:
    """A file system someone made earlier in the job's subnet, linked to the data at `link_path` (given to `team`)."""
    created = fsx().create_file_system(
        FileSystemType="LUSTRE",
        StorageCapacity=1200,
        SubnetIds=[document["network"]["subnet_id"]],
        SecurityGroupIds=document["network"]["security_group_ids"],
        LustreConfiguration={"DeploymentType": kind, **({"PerUnitStorageThroughput": 125} if kind == "PERSISTENT_2" else {})},
        FileSystemTypeVersion="2.15",
        Tags=[{"Key": "Name", "Value": "team-shared"}, *([{"Key": "lustrain:team", "Value": team}] if team else [])],
    )["FileSystem"]
    fs_id = created["FileSystemId"]
    while fsx().describe_file_systems(FileSystemIds=[fs_id])["FileSystems"][0]["Lifecycle"] != "AVAILABLE":
        pass
    if link_path:
        fsx().create_data_repository_association(
            FileSystemId=fs_id, FileSystemPath=link_path, DataRepositoryPath="s3://lustrain-test-data/tokens/"
        )
    return fs_id


def reusing(document: dict[str, Any], fs_id: str, **filesystem: Any) -> dict[str, Any]:
    """The same job, now asking to reuse `fs_id` (register again under another execution)."""
    again = register(spec(filesystem={"file_system_id": fs_id, **filesystem}), execution="reuse")
    return {**again, "network": document["network"], "poll": POLL}


def test_a_reused_file_system_is_checked_used_and_never_recorded(aws):
    document = prepared()
    fs_id = team_file_system(document)
    reuse = reusing(document, fs_id)
    result = invoke("create_filesystem", reuse)
    mount = fsx().describe_file_systems(FileSystemIds=[fs_id])["FileSystems"][0]["LustreConfiguration"][
        "MountName"
    ]
    assert (result["file_system_id"], result["created"], result["lifecycle"]) == (fs_id, False, "AVAILABLE")
    assert result["directory_path"] == f"/{mount}/data"
    assert job_record(aws.jobs_table, reuse["job"]["job_id"])["resources"] == []


def test_a_reused_file_system_without_a_link_to_the_data_is_refused(aws):
    document = prepared()
    fs_id = team_file_system(document, link_path=None)
    with pytest.raises(FileSystemFailed) as exc:
        invoke("create_filesystem", reusing(document, fs_id))
    assert exc.value.message.startswith(
        f"filesystem.file_system_id: no data repository association or ImportPath of {fs_id}"
    )
    assert "create-data-repository-association" in exc.value.message


def test_a_reused_file_system_showing_the_data_elsewhere_names_the_mount_path_to_use(aws):
    document = prepared()
    fs_id = team_file_system(document, link_path="/datasets/tokens")
    with pytest.raises(FileSystemFailed) as exc:
        invoke("create_filesystem", reusing(document, fs_id))
    assert exc.value.message.startswith("filesystem.mount_path:")
    assert "set filesystem.mount_path: /datasets/tokens" in exc.value.message


def refused_at_registration(aws: Any, spec_doc: dict[str, Any], execution: str, team: str | None = None) -> str:
    """register_job's refusal of the spec (started for `team`), with no record of the run: nothing exists of it."""
    def records() -> int:
        return int(boto3.client("dynamodb", region_name=REGION).scan(TableName=aws.jobs_table, Select="COUNT")["Count"])

    before = records()
    with pytest.raises(SpecInvalid) as exc:
        invoke("register_job", {"execution": execution, "input": {"spec": spec_doc, **({"team": team} if team else {})}})
    assert records() == before
    return exc.value.message


def test_a_reused_file_system_serves_one_team(aws, monkeypatch):
    """Containers run as root and nothing in Lustre is guarded by IAM: a run mounts only its team's file system
    (tagged lustrain:team); an untagged one only on a stack of one team. register_job refuses another's before
    anything exists; create_filesystem asks again, since a tag can change while the run waits in the queue."""
    document = prepared()
    theirs = team_file_system(document, team="vision")
    untagged = team_file_system(document)
    ours = team_file_system(document, team="default")

    message = refused_at_registration(aws, spec(filesystem={"file_system_id": theirs}), "theirs")
    assert message.startswith("invalid job spec, 1 problem:\n  - filesystem.file_system_id: ")
    assert f"{theirs} is not a file system of team default (tag lustrain:team=default)" in message
    assert invoke("create_filesystem", reusing(document, untagged))["file_system_id"] == untagged  # one team
    reuse_ours = reusing(document, ours)
    monkeypatch.setenv("LUSTRAIN_TEAMS", "default,vision")
    assert "is not a file system of team default" in refused_at_registration(
        aws, spec(filesystem={"file_system_id": untagged}), "untagged", team="default"
    )

    fs_arn = fsx().describe_file_systems(FileSystemIds=[ours])["FileSystems"][0]["ResourceARN"]
    fsx().tag_resource(ResourceARN=fs_arn, Tags=[{"Key": "lustrain:team", "Value": "vision"}])
    with pytest.raises(FileSystemFailed) as exc:
        invoke("create_filesystem", reuse_ours)
    assert exc.value.message.startswith(f"filesystem.file_system_id: {ours} is not a file system of team default")
    fsx().tag_resource(ResourceARN=fs_arn, Tags=[{"Key": "lustrain:team", "Value": "default"}])
    assert invoke("create_filesystem", reuse_ours)["file_system_id"] == ours


def test_checkpoints_go_only_to_a_reused_file_system_of_the_teams_own_that_survives_a_file_server(aws):
    """Checkpoints on Lustre are the run's resume: not on a scratch file system (one copy of its data), not on one
    that anything else may mount (containers run as root: no IAM boundary inside Lustre), even on a stack of one
    team. Both are refused when the run registers, with nothing created."""
    document = prepared()

    def with_checkpoints(fs_id: str) -> dict[str, Any]:
        return spec(
            filesystem={"file_system_id": fs_id, "deployment_type": "persistent"}, checkpoints={"to_filesystem": True}
        )

    untagged = team_file_system(document)
    scratch = team_file_system(document, team="default", kind="SCRATCH_2")
    ours = team_file_system(document, team="default")
    assert f"checkpoints.to_filesystem: {untagged} is not tagged lustrain:team=default" in refused_at_registration(
        aws, with_checkpoints(untagged), "untagged"
    )
    assert f"checkpoints.to_filesystem: {scratch} is SCRATCH_2" in refused_at_registration(
        aws, with_checkpoints(scratch), "scratch"
    )
    again = {**register(with_checkpoints(ours), execution="ours"), "network": document["network"], "poll": POLL}
    assert invoke("create_filesystem", again)["file_system_id"] == ours


def test_a_reused_file_system_that_does_not_exist_is_named_before_anything_exists(aws):
    prepared()
    assert "filesystem.file_system_id: fs-0123456789abcdef0 does not exist in this account and region" in (
        refused_at_registration(aws, spec(filesystem={"file_system_id": "fs-0123456789abcdef0"}), "missing")
    )


def test_a_reused_persistent_file_system_runs_and_its_output_link_is_recorded_even_if_found_on_a_retry(aws):
    from lustrain_core.steps import records

    document = prepared()
    fs_id = team_file_system(document)
    again = register(
        spec(
            filesystem={"file_system_id": fs_id, "deployment_type": "persistent"},
            output={"to_filesystem": True},
        ),
        execution="reuse-persistent",
    )
    reuse = {**again, "network": document["network"], "poll": POLL}
    job_id = reuse["job"]["job_id"]
    reuse["filesystem"] = invoke("create_filesystem", reuse)
    until_ready(reuse)
    link = {"type": "data_repository_association"}
    recorded = [r for r in job_record(aws.jobs_table, job_id)["resources"] if r["type"] == link["type"]]
    assert len(recorded) == 1  # the run's output link on the team's file system, and nothing of the team's

    # the ledger write of that link was lost (a throttled write, an answer lost at a timeout): the retry finds
    # the link it made and records it after all
    ddb = boto3.client("dynamodb", region_name=REGION)
    records.set_fields(ddb, aws.jobs_table, job_id, {"resources": []})
    reuse["filesystem"] = invoke("check_filesystem", reuse)
    assert job_record(aws.jobs_table, job_id)["resources"] == recorded
