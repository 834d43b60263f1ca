"""FSx for Lustre on the twin: lifecycles, MountName, AWS's validation, DRAs, tasks, idempotent creation."""

from __future__ import annotations

import re
from typing import Any

import pytest
from botocore.exceptions import ClientError
from twinhelpers import client

from lustrain.twin import faults
from lustrain.twin.patches import fsx

pytestmark = pytest.mark.usefixtures("moto_twin")

LUSTRE_PERMISSIONS = [
    {"IpProtocol": "tcp", "FromPort": 988, "ToPort": 988},
    {"IpProtocol": "tcp", "FromPort": 1018, "ToPort": 1023},
]


@pytest.fixture
def network() -> dict[str, str]:
    """A subnet and a security group that lets Lustre traffic in from itself, as create_network builds."""
    ec2 = client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.80.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.80.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="lustre", Description="lustre", VpcId=vpc)["GroupId"]
    ec2.authorize_security_group_ingress(
        GroupId=group,
        IpPermissions=[{**p, "UserIdGroupPairs": [{"GroupId": group}]} for p in LUSTRE_PERMISSIONS],
    )
    return {"vpc": vpc, "subnet": subnet, "group": group}


def create(network: dict[str, str], **overrides: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "FileSystemType": "LUSTRE",
        "StorageCapacity": 1200,
        "SubnetIds": [network["subnet"]],
        "SecurityGroupIds": [network["group"]],
        "LustreConfiguration": {
            "DeploymentType": "PERSISTENT_2",
            "PerUnitStorageThroughput": 250,
            "DataCompressionType": "LZ4",
        },
        "Tags": [{"Key": "lustrain:job", "Value": "gpt-small"}],
    }
    request.update(overrides)
    file_system: dict[str, Any] = client("fsx").create_file_system(**request)["FileSystem"]
    return file_system


def lifecycle(file_system_id: str) -> str:
    return str(
        client("fsx").describe_file_systems(FileSystemIds=[file_system_id])["FileSystems"][0]["Lifecycle"]
    )


def error_of(raised: pytest.ExceptionInfo[ClientError]) -> tuple[str, str]:
    return raised.value.response["Error"]["Code"], raised.value.response["Error"]["Message"]


def test_file_system_is_creating_then_available_with_aws_shaped_names(network: dict[str, str]) -> None:
    created = create(network)

    assert created["Lifecycle"] == "CREATING"
    assert re.fullmatch(r"fs-[0-9a-f]{17}", created["FileSystemId"])
    assert created["DNSName"] == f"{created['FileSystemId']}.fsx.us-east-1.amazonaws.com"
    assert created["VpcId"] == network["vpc"]
    lustre = created["LustreConfiguration"]
    assert re.fullmatch(r"[a-z0-9]{8}", lustre["MountName"])
    assert lustre["DeploymentType"] == "PERSISTENT_2"
    assert lustre["PerUnitStorageThroughput"] == 250
    assert lustre["DataCompressionType"] == "LZ4"
    assert [lifecycle(created["FileSystemId"]) for _ in range(2)] == ["CREATING", "AVAILABLE"]


def test_lifecycle_speed_is_configurable_in_polls_or_seconds(network: dict[str, str]) -> None:
    fsx.configure(polls=4)
    slow = create(network)["FileSystemId"]
    assert [lifecycle(slow) for _ in range(4)] == ["CREATING"] * 3 + ["AVAILABLE"]

    fsx.configure(polls=None, seconds=0)
    assert lifecycle(create(network)["FileSystemId"]) == "AVAILABLE"

    with pytest.raises(ValueError, match="polls or seconds"):
        fsx.configure(polls=None, seconds=None)


def test_scratch_file_system_keeps_import_and_export_paths_and_links_them(network: dict[str, str]) -> None:
    created = create(
        network,
        StorageCapacity=2400,
        LustreConfiguration={
            "DeploymentType": "SCRATCH_2",
            "ImportPath": "s3://datasets/imagenet/",
            "ExportPath": "s3://datasets/results/",
        },
    )

    repository = created["LustreConfiguration"]["DataRepositoryConfiguration"]
    assert repository["ImportPath"] == "s3://datasets/imagenet/"
    assert repository["ExportPath"] == "s3://datasets/results/"
    assert fsx.linked_paths(created["FileSystemId"]) == {"/": "s3://datasets/imagenet/"}


@pytest.mark.parametrize(
    ("overrides", "code", "message"),
    [
        (
            {"StorageCapacity": 3600},
            "BadRequest",
            "Invalid Lustre FS storage capacity: 3600. Must be 1200 or a multiple of 2400.",
        ),
        (
            {"LustreConfiguration": {"DeploymentType": "SCRATCH_2", "PerUnitStorageThroughput": 200}},
            "InvalidPerUnitStorageThroughput",
            "An invalid value for PerUnitStorageThroughput was provided.",
        ),
        (
            {"LustreConfiguration": {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 300}},
            "InvalidPerUnitStorageThroughput",
            "An invalid value for PerUnitStorageThroughput was provided.",
        ),
        (
            {"LustreConfiguration": {"DeploymentType": "PERSISTENT_2"}},
            "BadRequest",
            "PerUnitStorageThroughput is required for PERSISTENT_2",
        ),
        (
            {"LustreConfiguration": {"DeploymentType": "SCRATCH_2", "DataCompressionType": "GZIP"}},
            "BadRequest",
            "at 'lustreConfiguration.dataCompressionType' failed to satisfy constraint: Member must satisfy enum value set",
        ),
        (
            {"KmsKeyId": "alias/aws/fsx", "LustreConfiguration": {"DeploymentType": "SCRATCH_2"}},
            "BadRequest",
            "KmsKeyId can only be set on PERSISTENT",
        ),
        (
            {"SubnetIds": ["subnet-0123456789abcdef0"]},
            "InvalidNetworkSettings",
            "The subnet ID 'subnet-0123456789abcdef0' does not exist",
        ),
    ],
)
def test_invalid_file_system_is_refused_with_aws_error(
    network: dict[str, str], overrides: dict[str, Any], code: str, message: str
) -> None:
    with pytest.raises(ClientError) as raised:
        create(network, **overrides)

    assert error_of(raised)[0] == code
    assert message in error_of(raised)[1]
    assert client("fsx").describe_file_systems()["FileSystems"] == []


@pytest.mark.parametrize("open_ports", [[], LUSTRE_PERMISSIONS[:1]], ids=["no-rules", "988-only"])
def test_security_group_closed_to_lustre_traffic_fails_creation(
    network: dict[str, str], open_ports: list[dict[str, Any]]
) -> None:
    ec2 = client("ec2")
    closed = ec2.create_security_group(GroupName="closed", Description="closed", VpcId=network["vpc"])[
        "GroupId"
    ]
    if open_ports:
        ec2.authorize_security_group_ingress(
            GroupId=closed,
            IpPermissions=[{**p, "UserIdGroupPairs": [{"GroupId": closed}]} for p in open_ports],
        )

    with pytest.raises(ClientError) as raised:
        create(network, SecurityGroupIds=[closed])

    assert error_of(raised) == (
        "InvalidNetworkSettings",
        "The file system cannot be created because the default security group in the subnet provided or the "
        "provided security groups do not permit Lustre LNET network traffic on port 988",
    )
    assert raised.value.response["InvalidSecurityGroupId"] == closed


def test_lustre_ports_open_to_the_subnet_cidr_are_enough(network: dict[str, str]) -> None:
    ec2 = client("ec2")
    by_cidr = ec2.create_security_group(GroupName="cidr", Description="cidr", VpcId=network["vpc"])["GroupId"]
    ec2.authorize_security_group_ingress(
        GroupId=by_cidr,
        IpPermissions=[{**p, "IpRanges": [{"CidrIp": "10.80.0.0/16"}]} for p in LUSTRE_PERMISSIONS],
    )

    assert create(network, SecurityGroupIds=[by_cidr])["Lifecycle"] == "CREATING"


def test_same_client_request_token_returns_the_same_file_system(network: dict[str, str]) -> None:
    first = create(network, ClientRequestToken="run-gpt-small-1")
    lifecycle(first["FileSystemId"])

    again = create(network, ClientRequestToken="run-gpt-small-1")

    assert again["FileSystemId"] == first["FileSystemId"]
    assert len(client("fsx").describe_file_systems()["FileSystems"]) == 1
    with pytest.raises(ClientError) as raised:
        create(network, ClientRequestToken="run-gpt-small-1", StorageCapacity=2400)
    assert error_of(raised)[0] == "IncompatibleParameterError"


def test_fsx_failed_fault_fails_the_next_file_system_once(network: dict[str, str]) -> None:
    faults.inject("create_filesystem", "fsx-failed")

    failed = create(network)["FileSystemId"]
    healthy = create(network)["FileSystemId"]

    described = {
        fs["FileSystemId"]: fs
        for _ in range(2)
        for fs in client("fsx").describe_file_systems()["FileSystems"]
    }
    assert described[failed]["Lifecycle"] == "FAILED"
    assert "create_filesystem:fsx-failed" in described[failed]["FailureDetails"]["Message"]
    assert described[healthy]["Lifecycle"] == "AVAILABLE"


def available(network: dict[str, str]) -> str:
    file_system_id = str(create(network)["FileSystemId"])
    assert [lifecycle(file_system_id) for _ in range(2)][-1] == "AVAILABLE"
    return file_system_id


def test_data_repository_association_links_an_s3_prefix_at_a_path(network: dict[str, str]) -> None:
    file_system_id = available(network)
    api = client("fsx")

    association = api.create_data_repository_association(
        FileSystemId=file_system_id,
        FileSystemPath="/data",
        DataRepositoryPath="s3://datasets/imagenet/",
        BatchImportMetaDataOnCreate=True,
    )["Association"]

    assert association["Lifecycle"] == "CREATING"
    assert association["BatchImportMetaDataOnCreate"] is True
    assert fsx.linked_paths(file_system_id) == {"/data": "s3://datasets/imagenet/"}

    def described() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = api.describe_data_repository_associations(
            Filters=[{"Name": "file-system-id", "Values": [file_system_id]}]
        )["Associations"]
        return found

    assert [a["Lifecycle"] for _ in range(2) for a in described()] == ["CREATING", "AVAILABLE"]

    deleted = api.delete_data_repository_association(AssociationId=association["AssociationId"])
    assert deleted["Lifecycle"] == "DELETING"
    assert fsx.linked_paths(file_system_id) == {}
    assert [[a["Lifecycle"] for a in described()] for _ in range(2)] == [["DELETING"], []]


@pytest.mark.parametrize(
    ("path", "repository", "message"),
    [
        ("data", "s3://datasets/imagenet/", "FileSystemPath must start with '/'"),
        ("/data/train", "s3://datasets/other/", "overlaps /data"),
        ("/models", "datasets/imagenet/", "DataRepositoryPath must be an S3 path"),
    ],
)
def test_data_repository_association_refuses_bad_paths(
    network: dict[str, str], path: str, repository: str, message: str
) -> None:
    file_system_id = available(network)
    api = client("fsx")
    api.create_data_repository_association(
        FileSystemId=file_system_id, FileSystemPath="/data", DataRepositoryPath="s3://datasets/imagenet/"
    )

    with pytest.raises(ClientError) as raised:
        api.create_data_repository_association(
            FileSystemId=file_system_id, FileSystemPath=path, DataRepositoryPath=repository
        )

    assert error_of(raised)[0] == "BadRequest"
    assert message in error_of(raised)[1]


def test_export_task_runs_and_blocks_deletion_until_it_ends(network: dict[str, str]) -> None:
    file_system_id = available(network)
    api = client("fsx")
    api.create_data_repository_association(
        FileSystemId=file_system_id, FileSystemPath="/results", DataRepositoryPath="s3://results/gpt-small/"
    )
    task = api.create_data_repository_task(
        Type="EXPORT_TO_REPOSITORY", FileSystemId=file_system_id, Paths=["results"], Report={"Enabled": False}
    )["DataRepositoryTask"]
    assert task["Lifecycle"] == "PENDING"

    with pytest.raises(ClientError) as raised:
        api.delete_file_system(FileSystemId=file_system_id)
    assert error_of(raised)[0] == "BadRequest"
    assert task["TaskId"] in error_of(raised)[1]
    with pytest.raises(ClientError) as raised:
        api.create_data_repository_task(
            Type="EXPORT_TO_REPOSITORY", FileSystemId=file_system_id, Report={"Enabled": False}
        )
    assert error_of(raised)[0] == "DataRepositoryTaskExecuting"

    seen = [
        api.describe_data_repository_tasks(TaskIds=[task["TaskId"]])["DataRepositoryTasks"][0]["Lifecycle"]
        for _ in range(4)
    ]
    assert seen == ["PENDING", "EXECUTING", "EXECUTING", "SUCCEEDED"]

    assert api.delete_file_system(FileSystemId=file_system_id)["Lifecycle"] == "DELETING"
    assert lifecycle(file_system_id) == "DELETING"
    with pytest.raises(ClientError) as raised:
        lifecycle(file_system_id)
    assert error_of(raised)[0] == "FileSystemNotFound"


def test_task_needs_a_linked_data_repository(network: dict[str, str]) -> None:
    file_system_id = available(network)

    with pytest.raises(ClientError) as raised:
        client("fsx").create_data_repository_task(
            Type="EXPORT_TO_REPOSITORY", FileSystemId=file_system_id, Report={"Enabled": False}
        )

    assert error_of(raised) == (
        "BadRequest",
        f"File system {file_system_id} is not linked to a data repository",
    )


def test_tags_are_kept_and_can_be_added(network: dict[str, str]) -> None:
    arn = create(network)["ResourceARN"]
    api = client("fsx")

    api.tag_resource(ResourceARN=arn, Tags=[{"Key": "owner", "Value": "ml-team"}])

    tags = {t["Key"]: t["Value"] for t in api.list_tags_for_resource(ResourceARN=arn)["Tags"]}
    assert tags == {"lustrain:job": "gpt-small", "owner": "ml-team"}


@pytest.mark.parametrize(
    ("deployment", "asked", "version"),
    [
        ({"DeploymentType": "SCRATCH_2"}, None, "2.10"),
        ({"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 125}, None, "2.12"),
        ({"DeploymentType": "SCRATCH_2"}, "2.15", "2.15"),
    ],
    ids=["scratch-default", "persistent-default", "asked"],
)
def test_the_lustre_version_is_the_one_asked_for_else_fsxs_default(
    network: dict[str, str], deployment: dict[str, Any], asked: str | None, version: str
) -> None:
    # CreateFileSystem's FileSystemTypeVersion (API reference): 2.10 unless PERSISTENT_2 (2.12)
    extra = {"FileSystemTypeVersion": asked} if asked else {}
    file_system_id = create(network, LustreConfiguration=deployment, **extra)["FileSystemId"]

    described = client("fsx").describe_file_systems(FileSystemIds=[file_system_id])["FileSystems"][0]
    assert described["FileSystemTypeVersion"] == version


def test_a_lustre_210_file_system_takes_no_data_repository_association(network: dict[str, str]) -> None:
    file_system_id = create(network, LustreConfiguration={"DeploymentType": "SCRATCH_2"})["FileSystemId"]
    assert [lifecycle(file_system_id) for _ in range(2)][-1] == "AVAILABLE"

    with pytest.raises(ClientError) as raised:
        client("fsx").create_data_repository_association(
            FileSystemId=file_system_id, FileSystemPath="/data", DataRepositoryPath="s3://datasets/imagenet/"
        )

    assert error_of(raised)[0] == "BadRequest"
    assert "Lustre 2.12 or later" in error_of(raised)[1]


def test_lustre_210_is_refused_on_persistent_2(network: dict[str, str]) -> None:
    with pytest.raises(ClientError) as raised:
        create(network, FileSystemTypeVersion="2.10")

    assert error_of(raised)[0] == "BadRequest"
    assert "FileSystemTypeVersion 2.10" in error_of(raised)[1]
