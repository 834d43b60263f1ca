"""The file system step's pure parts: DirectoryPath, how S3 is linked for each deployment type, the requests
(checked against botocore's own FSx model), the poll schedule, and where a reused file system shows the data."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.validate import ParamValidator
from lustrain_core import aws_requests, launch_plan
from lustrain_core.config import Settings
from lustrain_core.document import Job, Network
from lustrain_core.errors import SpecInvalid
from lustrain_core.launch import job_of
from lustrain_core.spec import validate_spec
from lustrain_core.steps import filesystem as fs

FSX = botocore.session.get_session().get_service_model("fsx")
SETTINGS = Settings(stack_name="lustrain-test")
NETWORK = Network(subnet_id="subnet-0f1e2d3c4b5a69788", security_group_ids=["sg-0123456789abcdef0"])
SPEC: dict[str, Any] = {
    "name": "gpt",
    "code": {"source": "s3://code/gpt/"},
    "data": {"s3_uri": "s3://datasets/pile-tokens/", "size_gib": 800},
    "output": {"s3_uri": "s3://results/gpt/"},
    "tags": {"team": "llm"},
}


def job_with(**sections: Any) -> Job:
    doc = copy.deepcopy(SPEC)
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    spec = validate_spec(doc)
    return job_of(spec, "gpt-0badc0de", SETTINGS)


def valid(operation: str, request: dict[str, Any]) -> None:
    report = ParamValidator().validate(request, FSX.operation_model(operation).input_shape)
    assert not report.has_errors(), report.generate_report()


def only_error(exc: pytest.ExceptionInfo[SpecInvalid]) -> tuple[str, str]:
    assert len(exc.value.errors) == 1
    return exc.value.errors[0].path, exc.value.errors[0].message


# --- DirectoryPath ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mount_path", "expected"),
    [
        ("/data", "/abcdef12/data"),
        ("/data/", "/abcdef12/data"),
        ("/a/b", "/abcdef12/a/b"),
        ("/", "/abcdef12"),
    ],
)
def test_directory_path_is_the_mount_name_then_the_mount_path(mount_path, expected):
    assert aws_requests.directory_path("abcdef12", mount_path) == expected


# --- linking S3: what mount_path means for each deployment type ----------------------------------------


def test_scratch_at_the_root_is_linked_with_import_path():
    links = launch_plan.link_for(job_with(filesystem={"mount_path": "/"}).spec, "gpt-0badc0de")
    assert links.method == "import_path"
    assert links.links == (launch_plan.Link(path="/", s3_uri="s3://datasets/pile-tokens/", purpose="data"),)
    assert links.dra_links == ()


def test_scratch_below_the_root_is_linked_by_an_association_at_mount_path():
    links = launch_plan.link_for(job_with().spec, "gpt-0badc0de")
    assert links.method == "dra"
    assert links.dra_links == (launch_plan.Link(path="/data", s3_uri="s3://datasets/pile-tokens/", purpose="data"),)


def test_persistent_is_always_linked_by_an_association_even_at_the_root():
    links = launch_plan.link_for(job_with(filesystem={"deployment_type": "persistent", "mount_path": "/"}).spec, "j")
    assert links.method == "dra"
    assert links.dra_links[0].path == "/"


def test_output_on_the_file_system_gets_its_own_export_link_per_job():
    """The run's own folder, never output.s3_uri itself (a team's folder, where FSx's export, which no job's role
    limits, would write beside, over or delete other runs' files); and beside its checkpoints' link."""
    spec = job_with(output={"to_filesystem": True, "expected_size_gib": 10}).spec
    links = launch_plan.link_for(spec, "gpt-0badc0de")
    assert links.output_path == "/lustrain-output/gpt-0badc0de"
    output = launch_plan.Link(
        path="/lustrain-output/gpt-0badc0de", s3_uri="s3://results/gpt/gpt-0badc0de/output/", purpose="output"
    )
    assert output in links.dra_links
    both = launch_plan.link_for(
        job_with(output={"to_filesystem": True}, checkpoints={"to_filesystem": True},
                 filesystem={"deployment_type": "persistent"}).spec,
        "j-1",
    )
    assert {link.s3_uri for link in both.dra_links if link.purpose != "data"} == {
        "s3://results/gpt/j-1/output/",
        "s3://results/gpt/j-1/checkpoints/",
    }


def test_output_on_the_file_system_with_data_at_the_root_is_refused_at_mount_path():
    with pytest.raises(SpecInvalid) as exc:
        launch_plan.link_for(job_with(filesystem={"mount_path": "/"}, output={"to_filesystem": True}).spec, "j")
    path, message = only_error(exc)
    assert path == "filesystem.mount_path"
    assert "only one" in message and "/data" in message


def test_a_mount_path_inside_the_output_area_is_refused():
    spec = validate_spec(
        {
            **SPEC,
            "filesystem": {"mount_path": "/lustrain-output/x"},
            "output": {**SPEC["output"], "to_filesystem": True},
        }
    )
    with pytest.raises(SpecInvalid) as exc:
        launch_plan.link_for(spec, "j")
    path, message = only_error(exc)
    assert path == "filesystem.mount_path" and "/lustrain-output" in message


def test_a_mount_path_climbing_out_with_dotdot_is_refused():
    with pytest.raises(SpecInvalid) as exc:
        launch_plan.link_for(job_with(filesystem={"mount_path": "/data/../etc"}).spec, "j")
    assert only_error(exc)[0] == "filesystem.mount_path"


# --- the requests, as botocore's FSx model takes them ----------------------------------------------------


def test_the_scratch_create_request_is_what_was_planned():
    job = job_with()
    request = aws_requests.file_system(job, NETWORK, SETTINGS)
    valid("CreateFileSystem", request)
    assert request["ClientRequestToken"] == "gpt-0badc0de"
    assert request["StorageCapacity"] == job.plan["filesystem"]["storage_gib"]
    assert request["SubnetIds"] == ["subnet-0f1e2d3c4b5a69788"]
    assert request["SecurityGroupIds"] == ["sg-0123456789abcdef0"]
    assert request["FileSystemTypeVersion"] == "2.15"
    assert request["LustreConfiguration"] == {"DeploymentType": "SCRATCH_2", "DataCompressionType": "LZ4"}
    tags = {t["Key"]: t["Value"] for t in request["Tags"]}
    assert tags == {
        "team": "llm",
        "lustrain:team": "default",
        "Name": "gpt-0badc0de-lustre",
        "lustrain:job-id": "gpt-0badc0de",
        "lustrain:created-by": "lustrain-test",
    }


def test_the_scratch_import_path_request_imports_the_prefix_and_keeps_it_current():
    request = aws_requests.file_system(
        job_with(filesystem={"mount_path": "/", "compression": "none"}), NETWORK, SETTINGS
    )
    valid("CreateFileSystem", request)
    assert request["LustreConfiguration"] == {
        "DeploymentType": "SCRATCH_2",
        "DataCompressionType": "NONE",
        "ImportPath": "s3://datasets/pile-tokens/",
        "AutoImportPolicy": "NEW_CHANGED_DELETED",
    }
    # left out, FSx would make this SCRATCH_2 a Lustre 2.10 (the API reference's default)
    assert request["FileSystemTypeVersion"] == "2.15"


def test_the_persistent_request_carries_the_planned_throughput():
    job = job_with(filesystem={"deployment_type": "persistent", "throughput_per_tib": 250})
    request = aws_requests.file_system(job, NETWORK, SETTINGS)
    valid("CreateFileSystem", request)
    assert request["LustreConfiguration"]["DeploymentType"] == "PERSISTENT_2"
    assert request["LustreConfiguration"]["PerUnitStorageThroughput"] == 250
    assert "ImportPath" not in request["LustreConfiguration"]


def test_the_data_link_imports_and_the_output_link_exports():
    job = job_with(output={"to_filesystem": True})
    data, output = job.launch.dra_links
    data_request = aws_requests.data_repository_association(job, "fs-0123456789abcdef0", data, SETTINGS)
    output_request = aws_requests.data_repository_association(job, "fs-0123456789abcdef0", output, SETTINGS)
    valid("CreateDataRepositoryAssociation", data_request)
    valid("CreateDataRepositoryAssociation", output_request)
    assert (data_request["FileSystemPath"], data_request["DataRepositoryPath"]) == (
        "/data",
        "s3://datasets/pile-tokens/",
    )
    assert data_request["BatchImportMetaDataOnCreate"] is True
    assert data_request["S3"] == {"AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}}
    assert output_request["FileSystemPath"] == "/lustrain-output/gpt-0badc0de"
    assert output_request["S3"] == {"AutoExportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}}
    assert data_request["ClientRequestToken"] != output_request["ClientRequestToken"]


# --- the poll loop's schedule ----------------------------------------------------------------------------


def test_the_first_look_waits_the_creation_time_then_every_look_the_steady_interval():
    poll = {"initial_seconds": 480, "max_seconds": 30, "max_polls": 240}
    assert [fs.next_wait(n, poll) for n in range(5)] == [480, 30, 30, 30, 30]
    # a file system ready 10 minutes after its creation is seen at most one interval late, in few looks
    looks, waited = 0, 0
    while waited < 600:
        waited += fs.next_wait(looks, poll)
        looks += 1
    assert waited - 600 <= poll["max_seconds"] and looks == 5


def test_the_steady_interval_is_never_longer_than_the_first_wait():
    assert fs.next_wait(3, {"initial_seconds": 1, "max_seconds": 2, "max_polls": 10}) == 1


def test_poll_settings_default_to_the_templates_and_come_from_the_payload():
    from lustrain.twin.stack import copy_template

    parameters = copy_template(Path(__file__).resolve().parents[2] / "template.yaml")["Parameters"]
    assert fs.poll_settings({}) == {
        "initial_seconds": parameters["FilesystemPollInitialSeconds"]["Default"],
        "max_seconds": parameters["FilesystemPollMaxSeconds"]["Default"],
        "max_polls": parameters["FilesystemPollMaxCount"]["Default"],
    }
    assert fs.poll_settings({"poll": {"initial_seconds": 1, "max_seconds": 4}})["max_seconds"] == 4


def test_a_bad_poll_setting_names_its_field():
    with pytest.raises(SpecInvalid) as exc:
        fs.poll_settings({"poll": {"initial_seconds": 0}})
    assert only_error(exc)[0] == "poll.initial_seconds"


# --- where a reused file system shows the data -------------------------------------------------------------


def dra(fs_path: str, repo: str, lifecycle: str = "AVAILABLE") -> dict[str, Any]:
    return {"FileSystemPath": fs_path, "DataRepositoryPath": repo, "Lifecycle": lifecycle}


@pytest.mark.parametrize(
    ("dras", "import_path", "expected"),
    [
        ([dra("/data", "s3://datasets/pile-tokens/")], None, "/data"),
        ([dra("/data", "s3://datasets/pile-tokens")], None, "/data"),
        ([dra("/ds", "s3://datasets/")], None, "/ds/pile-tokens"),
        ([], "s3://datasets", "/pile-tokens"),
        ([], "s3://datasets/pile-tokens/", "/"),
        ([dra("/data", "s3://datasets/pile")], None, None),
        ([dra("/data", "s3://datasets/pile-tokens/", "DELETING")], None, None),
    ],
)
def test_the_data_location_follows_the_links(dras, import_path, expected):
    described: dict[str, Any] = {"LustreConfiguration": {}}
    if import_path:
        described["LustreConfiguration"]["DataRepositoryConfiguration"] = {"ImportPath": import_path}
    assert fs.data_location(described, dras, "s3://datasets/pile-tokens/") == expected
