"""FSx for Lustre as the run meets it: lifecycles, MountName, validation, DRAs and data repository tasks.

moto 5.2.5's FSx stores what CreateFileSystem was given and nothing more. For LUSTRE file systems the twin:
- reports Lifecycle CREATING on create, then AVAILABLE after `configure(polls=..., seconds=...)`
  DescribeFileSystems calls or seconds (FAILED, with FailureDetails.Message, when the `fsx-failed` fault is armed
  at create_filesystem); DeleteFileSystem answers DELETING, after which the file system disappears the same way;
- gives a FileSystemId, DNSName and LustreConfiguration.MountName (8 lowercase characters) shaped as AWS's,
  and keeps DeploymentType, PerUnitStorageThroughput, DataCompressionType, ImportPath/ExportPath as given;
- refuses, with AWS's error code, what AWS refuses where users get hurt: a StorageCapacity other than 1200, 2400
  or a multiple of 2400 on SCRATCH_2/PERSISTENT_2 ("Invalid Lustre FS storage capacity: N. Must be 1200 or a
  multiple of 2400.", the text AWS returns), a PerUnitStorageThroughput that the deployment type does not take
  (InvalidPerUnitStorageThroughput, with the text of AWS's error), security groups that do not let Lustre LNET
  traffic in on TCP 988 and 1018-1023 (InvalidNetworkSettings, the text the FSx Lustre guide quotes), a reused
  ClientRequestToken with other parameters (IncompatibleParameterError); where AWS's exact words are not
  published the message is the twin's and names the field and what is allowed;
- implements Create/Describe/DeleteDataRepositoryAssociation (CREATING -> AVAILABLE, DELETING -> gone) and
  Create/DescribeDataRepositoryTasks (PENDING -> EXECUTING -> SUCCEEDED, advanced by DescribeDataRepositoryTasks),
  and refuses DeleteFileSystem with BadRequest while a task is PENDING or EXECUTING, as AWS documents;
- keeps what training jobs wrote on a file system (`store_files`, `stored_files`: the files a read-write channel
  left, which a later job's mount shows) until the file system is deleted; an EXPORT_TO_REPOSITORY task copies
  those under its Paths (relative to the root, as the API takes them; none: the whole file system), as they were
  when it was created, to the S3
  prefix of the association linking them (an ImportPath file system's: its ExportPath) when it reaches SUCCEEDED,
  and ends FAILED, with FailureDetails, when a path lies under no link ("If a path that you provide isn't valid,
  the task fails": CreateDataRepositoryTask's API reference); Status counts the files;
- makes CreateFileSystem idempotent on ClientRequestToken (same token, same parameters -> the same file system);
- keeps the Lustre version (FileSystemTypeVersion) as AWS sets it: the one asked for (2.10, 2.12 or 2.15; 2.10 not
  on PERSISTENT_2), else the API reference's default, 2.10, or 2.12 on PERSISTENT_2 (2.15 with a
  MetadataConfiguration); DescribeFileSystems shows it, and a DRA on a 2.10 file system is refused (DRAs need
  Lustre 2.12 or later: "Linking your file system to an S3 bucket", FSx for Lustre User Guide).
Other file system types keep moto's behaviour. `linked_paths(file_system_id)` tells the training simulator which
S3 prefix is linked at which path of a file system, so it can fill the local stand-in for the mount.
"""

from __future__ import annotations

import json
import secrets
import string
import time
from dataclasses import dataclass, field
from ipaddress import ip_network
from pathlib import PurePosixPath
from typing import Any

from moto.core.exceptions import JsonRESTError
from moto.ec2.exceptions import InvalidSubnetIdError
from moto.ec2.models import ec2_backends
from moto.fsx.exceptions import FileSystemNotFound
from moto.fsx.models import FSxBackend, fsx_backends
from moto.fsx.responses import FSxResponse
from moto.utilities.paginator import paginate

from lustrain.twin import faults

_PATCHED = "_lustrain_twin_fsx"
_STATE = "lustrain_fsx_state"

LUSTRE_PORTS = (988, *range(1018, 1024))
PERSISTENT_2_THROUGHPUTS = (125, 250, 500, 1000)
LUSTRE_VERSIONS = ("2.10", "2.12", "2.15")
TASK_TYPES = ("EXPORT_TO_REPOSITORY", "IMPORT_METADATA_FROM_REPOSITORY")
_GONE = "GONE"

_PAGINATION = {
    "describe_file_systems": {
        "input_token": "next_token",
        "limit_key": "max_results",
        "limit_default": 2147483647,
        "unique_attribute": "resource_arn",
    },
    "describe_data_repository_associations": {
        "input_token": "next_token",
        "limit_key": "max_results",
        "limit_default": 2147483647,
        "unique_attribute": "association_id",
    },
    "describe_data_repository_tasks": {
        "input_token": "next_token",
        "limit_key": "max_results",
        "limit_default": 2147483647,
        "unique_attribute": "task_id",
    },
}


class FsxError(JsonRESTError):
    def __init__(self, code: str, message: str, **fields: str) -> None:
        super().__init__(code, message)
        self.description = json.dumps({"__type": code, "message": message, "Message": message, **fields})


def bad_request(message: str) -> FsxError:
    return FsxError("BadRequest", message)


# Lifecycle clock ---------------------------------------------------------------------------------------------


@dataclass
class Timing:
    """How long each transitional lifecycle lasts: `polls` describe calls, or `seconds`, whichever comes first."""

    polls: int | None = 2
    seconds: float | None = None


_timing = Timing()
#: associations and data repository tasks: by default as fast as file systems (see `configure`)
_link_timing = Timing()


def configure(
    polls: int | None = 2,
    seconds: float | None = None,
    *,
    link_polls: int | None = None,
    link_seconds: float | None = None,
) -> None:
    """Set how fast lifecycles move: after `polls` describe calls of a resource, or `seconds`, per state.

    Associations and tasks follow `link_polls` / `link_seconds` when either is given, else the same timing:
    on AWS a file system takes minutes to create while its associations often take less.
    """
    for timing, p, s in ((_timing, polls, seconds), (_link_timing, link_polls, link_seconds)):
        if timing is _link_timing and p is None and s is None:
            p, s = polls, seconds
        if p is None and s is None:
            raise ValueError(
                "configure needs polls or seconds: with neither, nothing would ever become AVAILABLE"
            )
        if p is not None and p < 0:
            raise ValueError(f"polls must be >= 0 (got {p})")
        if s is not None and s < 0:
            raise ValueError(f"seconds must be >= 0 (got {s})")
        timing.polls, timing.seconds = p, s


@dataclass
class Clock:
    """A resource's lifecycle: a path of states, advanced one state per observation threshold."""

    path: tuple[str, ...]
    index: int = 0
    polls: int = 0
    entered: float = field(default_factory=time.monotonic)
    timing: Timing = field(default_factory=lambda: _timing)

    @property
    def state(self) -> str:
        return self.path[self.index]

    def restart(self, *path: str) -> None:
        self.path, self.index, self.polls, self.entered = path, 0, 0, time.monotonic()

    def observe(self) -> str:
        self.polls += 1
        if self.index < len(self.path) - 1:
            t = self.timing
            polled = t.polls is not None and self.polls >= t.polls
            waited = t.seconds is not None and time.monotonic() - self.entered >= t.seconds
            if polled or waited:
                self.index += 1
                self.polls, self.entered = 0, time.monotonic()
        return self.state


# Resources ----------------------------------------------------------------------------------------------------


def _aws_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(9)[:17]}"


def _mount_name() -> str:
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


@dataclass
class LustreFileSystem:
    backend: FSxBackend
    storage_capacity: int
    subnet_ids: list[str]
    security_group_ids: list[str]
    vpc_id: str
    deployment_type: str
    lustre: dict[str, Any]
    kms_key_id: str | None
    type_version: str
    failure: str | None
    file_system_id: str = field(default_factory=lambda: _aws_id("fs"))
    mount_name: str = field(default_factory=_mount_name)
    creation_time: float = field(default_factory=time.time)
    clock: Clock = field(default_factory=lambda: Clock(("CREATING", "AVAILABLE")))

    def __post_init__(self) -> None:
        if self.failure is not None:
            self.clock.restart("CREATING", "FAILED")
        self.network_interface_ids = [_aws_id("eni") for _ in range(2)]

    @property
    def region(self) -> str:
        return self.backend.region_name

    @property
    def resource_arn(self) -> str:
        return f"arn:aws:fsx:{self.region}:{self.backend.account_id}:file-system/{self.file_system_id}"

    @property
    def file_system_type(self) -> str:
        return "LUSTRE"

    @property
    def import_path(self) -> str | None:
        return self.lustre.get("ImportPath")

    def to_dict(self) -> dict[str, Any]:
        lustre: dict[str, Any] = {
            key: value
            for key, value in self.lustre.items()
            if key not in ("ImportPath", "ExportPath", "ImportedFileChunkSize", "AutoImportPolicy")
        }
        lustre.update(
            DeploymentType=self.deployment_type,
            MountName=self.mount_name,
            DataCompressionType=self.lustre.get("DataCompressionType", "NONE"),
        )
        if self.import_path:
            lustre["DataRepositoryConfiguration"] = {
                "Lifecycle": "AVAILABLE" if self.clock.state == "AVAILABLE" else "CREATING",
                "ImportPath": self.import_path,
                "ExportPath": self.lustre["ExportPath"],
                "ImportedFileChunkSize": self.lustre.get("ImportedFileChunkSize", 1024),
                "AutoImportPolicy": self.lustre.get("AutoImportPolicy", "NONE"),
            }
        described: dict[str, Any] = {
            "OwnerId": self.backend.account_id,
            "CreationTime": self.creation_time,
            "FileSystemId": self.file_system_id,
            "FileSystemType": "LUSTRE",
            "FileSystemTypeVersion": self.type_version,
            "Lifecycle": self.clock.state,
            "StorageCapacity": self.storage_capacity,
            "StorageType": "SSD",
            "VpcId": self.vpc_id,
            "SubnetIds": self.subnet_ids,
            "NetworkInterfaceIds": self.network_interface_ids,
            "DNSName": f"{self.file_system_id}.fsx.{self.region}.amazonaws.com",
            "ResourceARN": self.resource_arn,
            "Tags": self.backend.list_tags_for_resource(self.resource_arn),
            "LustreConfiguration": lustre,
        }
        if self.kms_key_id:
            described["KmsKeyId"] = self.kms_key_id
        if self.clock.state == "FAILED":
            described["FailureDetails"] = {"Message": self.failure}
        return described


@dataclass
class Association:
    backend: FSxBackend
    file_system_id: str
    file_system_path: str
    data_repository_path: str
    batch_import: bool
    chunk_size: int
    s3: dict[str, Any]
    association_id: str = field(default_factory=lambda: _aws_id("dra"))
    creation_time: float = field(default_factory=time.time)
    clock: Clock = field(default_factory=lambda: Clock(("CREATING", "AVAILABLE"), timing=_link_timing))

    @property
    def resource_arn(self) -> str:
        return (
            f"arn:aws:fsx:{self.backend.region_name}:{self.backend.account_id}:association/"
            f"{self.file_system_id}/{self.association_id}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "AssociationId": self.association_id,
            "ResourceARN": self.resource_arn,
            "FileSystemId": self.file_system_id,
            "Lifecycle": self.clock.state,
            "FileSystemPath": self.file_system_path,
            "DataRepositoryPath": self.data_repository_path,
            "BatchImportMetaDataOnCreate": self.batch_import,
            "ImportedFileChunkSize": self.chunk_size,
            "S3": self.s3,
            "Tags": self.backend.list_tags_for_resource(self.resource_arn),
            "CreationTime": self.creation_time,
        }


@dataclass
class Task:
    backend: FSxBackend
    task_type: str
    file_system_id: str
    paths: list[str]
    report: dict[str, Any]
    task_id: str = field(default_factory=lambda: _aws_id("task"))
    creation_time: float = field(default_factory=time.time)
    start_time: float | None = None
    end_time: float | None = None
    clock: Clock = field(
        default_factory=lambda: Clock(("PENDING", "EXECUTING", "SUCCEEDED"), timing=_link_timing)
    )

    @property
    def resource_arn(self) -> str:
        return f"arn:aws:fsx:{self.backend.region_name}:{self.backend.account_id}:task/{self.task_id}"

    @property
    def running(self) -> bool:
        return self.clock.state in ("PENDING", "EXECUTING")

    failure: str | None = None
    counts: tuple[int, int] = (0, 0)  # files exported, files that failed
    #: the files the task works on, as they were when it was created (FSx starts on them at once; a later
    #: change on the file system is the next export's)
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def lifecycle(self) -> str:
        return "FAILED" if self.failure is not None else self.clock.state

    def observe(self) -> None:
        if self.failure is not None:
            return
        state = self.clock.observe()
        if state != "PENDING" and self.start_time is None:
            self.start_time = time.time()
        if state == "SUCCEEDED" and self.end_time is None:
            if self.task_type == "EXPORT_TO_REPOSITORY":
                self.failure = _export(self)
            self.end_time = time.time()

    def to_dict(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "TaskId": self.task_id,
            "Lifecycle": self.lifecycle,
            "Type": self.task_type,
            "CreationTime": self.creation_time,
            "ResourceARN": self.resource_arn,
            "Tags": self.backend.list_tags_for_resource(self.resource_arn),
            "FileSystemId": self.file_system_id,
            "Paths": self.paths,
            "Report": self.report,
            "Status": {
                "TotalCount": sum(self.counts),
                "SucceededCount": self.counts[0],
                "FailedCount": self.counts[1],
                "LastUpdatedTime": self.end_time or self.start_time or self.creation_time,
            },
        }
        if self.start_time is not None:
            described["StartTime"] = self.start_time
        if self.end_time is not None:
            described["EndTime"] = self.end_time
        if self.failure is not None:
            described["FailureDetails"] = {"Message": self.failure}
        return described


def _export(task: Task) -> str | None:
    """An export's work, done as it ends: the stored files under its Paths to their links' S3 prefixes; None when
    every path is exported, else why the task failed."""
    from lustrain.twin.simulator.storage import JobStorage, MissingBucket, as_dir_prefix, split_s3_uri

    links = sorted(
        ((PurePosixPath("/", p), uri) for p, uri in _links_of(task.backend, task.file_system_id).items()),
        key=lambda item: -len(item[0].parts),
    )
    wanted = [PurePosixPath("/", p) for p in task.paths] or [PurePosixPath("/")]
    for path in wanted:
        if not any(link == path or link in path.parents or path in link.parents for link, _ in links):
            return f"Path {path.relative_to('/')} is not within a path linked to a data repository"
    files = task.files
    # FSx's service-linked role writes the linked buckets (not a job's role)
    storage = JobStorage(task.backend.account_id, lambda service, operation, params: None)
    done, failed = 0, 0
    for name, data in sorted(files.items()):
        in_fs = PurePosixPath(name)
        if not any(w == in_fs or w in in_fs.parents for w in wanted):
            continue
        link = next(((lk, uri) for lk, uri in links if lk == in_fs or lk in in_fs.parents), None)
        if link is None:
            continue  # outside every link: nothing to export it to
        bucket, prefix = split_s3_uri(link[1])
        try:
            storage.put(bucket, as_dir_prefix(prefix) + in_fs.relative_to(link[0]).as_posix(), data)
            done += 1
        except MissingBucket:
            failed += 1
    task.counts = (done, failed)
    return None if failed == 0 else f"{failed} of {done + failed} files failed to export"


@dataclass
class _State:
    """What the twin adds to one FSx backend (one account and region); reset with moto's backends."""

    associations: dict[str, Association] = field(default_factory=dict)
    tasks: dict[str, Task] = field(default_factory=dict)
    tokens: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: what jobs wrote on each file system: {file system id: {absolute path in it: bytes}}
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)


def _state(backend: FSxBackend) -> _State:
    state: _State = backend.__dict__.setdefault(_STATE, _State())
    return state


def _lustre(backend: FSxBackend, file_system_id: str) -> LustreFileSystem:
    found = backend.file_systems.get(file_system_id)
    if not isinstance(found, LustreFileSystem):
        raise FileSystemNotFound(file_system_id)
    return found


# Validation ---------------------------------------------------------------------------------------------------


def _validate_capacity(deployment_type: str, capacity: Any) -> None:
    if deployment_type in ("SCRATCH_2", "PERSISTENT_2", "PERSISTENT_1") and (
        not isinstance(capacity, int) or not (capacity == 1200 or (capacity > 0 and capacity % 2400 == 0))
    ):
        raise bad_request(
            f"Invalid Lustre FS storage capacity: {capacity}. Must be 1200 or a multiple of 2400."
        )


def _validate_throughput(deployment_type: str, throughput: Any) -> None:
    invalid = FsxError(
        "InvalidPerUnitStorageThroughput",
        "An invalid value for PerUnitStorageThroughput was provided. Please create your file system again, "
        f"using a valid value. (got {throughput} for {deployment_type}; "
        f"PERSISTENT_2 takes {', '.join(map(str, PERSISTENT_2_THROUGHPUTS))} MB/s/TiB, SCRATCH types take none)",
    )
    if deployment_type.startswith("SCRATCH") and throughput is not None:
        raise invalid
    if deployment_type == "PERSISTENT_2":
        if throughput is None:
            raise bad_request(
                "PerUnitStorageThroughput is required for PERSISTENT_2: "
                f"one of {', '.join(map(str, PERSISTENT_2_THROUGHPUTS))} MB/s/TiB"
            )
        if throughput not in PERSISTENT_2_THROUGHPUTS:
            raise invalid


def _validate_lustre_options(deployment_type: str, lustre: dict[str, Any], kms_key_id: str | None) -> None:
    # DataCompressionType's values are the model's enum: patches/validation.py refuses the others
    if kms_key_id and not deployment_type.startswith("PERSISTENT"):
        raise bad_request(f"KmsKeyId can only be set on PERSISTENT deployment types (got {deployment_type})")
    import_path = lustre.get("ImportPath")
    export_path = lustre.get("ExportPath")
    if deployment_type == "PERSISTENT_2" and (import_path or export_path):
        raise bad_request(
            "ImportPath and ExportPath are not supported on PERSISTENT_2: link S3 with "
            "CreateDataRepositoryAssociation instead"
        )
    if export_path and not import_path:
        raise FsxError("InvalidExportPath", "ExportPath requires an ImportPath in the same Amazon S3 bucket")
    if import_path:
        if not import_path.startswith("s3://") or len(import_path) <= len("s3://"):
            raise FsxError(
                "InvalidImportPath", f"ImportPath must be s3://bucket[/prefix] (got {import_path!r})"
            )
        bucket = import_path[len("s3://") :].split("/", 1)[0]
        if export_path and not export_path.startswith(f"s3://{bucket}"):
            raise FsxError(
                "InvalidExportPath",
                f"ExportPath must use the same Amazon S3 bucket as ImportPath, s3://{bucket} (got {export_path!r})",
            )


def _lustre_version(deployment_type: str, lustre: dict[str, Any], asked: str | None) -> str:
    """The Lustre version FSx gives a new file system (CreateFileSystem's FileSystemTypeVersion, API reference)."""
    if asked is None:
        if deployment_type == "PERSISTENT_2":
            return "2.15" if lustre.get("MetadataConfiguration") else "2.12"
        return "2.10"
    if asked not in LUSTRE_VERSIONS:
        raise bad_request(
            f"FileSystemTypeVersion {asked} is not supported: one of {', '.join(LUSTRE_VERSIONS)}"
        )
    if asked == "2.10" and deployment_type == "PERSISTENT_2":
        raise bad_request(
            "FileSystemTypeVersion 2.10 is supported only on SCRATCH_1, SCRATCH_2 and PERSISTENT_1"
        )
    return asked


def _lustre_traffic_allowed(groups: list[Any], subnet_cidr: str) -> bool:
    group_ids = {group.id for group in groups}
    subnet = ip_network(subnet_cidr)

    def from_clients(rule: Any) -> bool:
        if rule.source_group.get("GroupId") in group_ids:
            return True
        cidr = rule.ip_range.get("CidrIp")
        return bool(cidr) and subnet.subnet_of(ip_network(cidr))  # type: ignore[arg-type]

    def allowed(port: int) -> bool:
        return any(
            from_clients(rule)
            and (
                rule.ip_protocol == "-1"
                or (rule.ip_protocol == "tcp" and rule.from_port <= port <= rule.to_port)
            )
            for group in groups
            for rule in group.ingress_rules
        )

    return all(allowed(port) for port in LUSTRE_PORTS)


def _network(backend: FSxBackend, subnet_ids: list[str], security_group_ids: list[str]) -> str:
    """Check the subnet and security groups as FSx does; returns the VPC id."""
    if len(subnet_ids) != 1:
        raise FsxError(
            "InvalidNetworkSettings",
            f"Lustre file systems take exactly one subnet in SubnetIds (got {len(subnet_ids)})",
        )
    ec2 = ec2_backends[backend.account_id][backend.region_name]
    try:
        subnet = ec2.get_subnet(subnet_ids[0])
    except InvalidSubnetIdError as exc:
        raise FsxError(
            "InvalidNetworkSettings",
            f"The subnet ID '{subnet_ids[0]}' does not exist",
            InvalidSubnetId=subnet_ids[0],
        ) from exc
    groups = []
    for group_id in security_group_ids:
        group = ec2.get_security_group_from_id(group_id)
        if group is None:
            raise FsxError(
                "InvalidNetworkSettings",
                f"The security group '{group_id}' does not exist",
                InvalidSecurityGroupId=group_id,
            )
        groups.append(group)
    if not groups:
        default = ec2.get_default_security_group(subnet.vpc_id)
        groups = [default] if default is not None else []
    if not _lustre_traffic_allowed(groups, subnet.cidr_block):
        raise FsxError(
            "InvalidNetworkSettings",
            "The file system cannot be created because the default security group in the subnet provided or the "
            "provided security groups do not permit Lustre LNET network traffic on port 988",
            InvalidSecurityGroupId=groups[0].id if groups else "",
        )
    return str(subnet.vpc_id)


# Backend methods (bound to moto's FSxBackend) ------------------------------------------------------------------

_original: dict[str, Any] = {}


def create_file_system(
    self: FSxBackend,
    client_request_token: str | None,
    file_system_type: str,
    storage_capacity: int,
    storage_type: str | None,
    subnet_ids: list[str],
    security_group_ids: list[str] | None,
    tags: list[dict[str, str]] | None,
    kms_key_id: str | None,
    windows_configuration: dict[str, Any] | None,
    lustre_configuration: dict[str, Any] | None,
    ontap_configuration: dict[str, Any] | None,
    file_system_type_version: str | None,
    open_zfs_configuration: dict[str, Any] | None,
) -> Any:
    if file_system_type != "LUSTRE":
        return _original["create_file_system"](
            self,
            client_request_token=client_request_token,
            file_system_type=file_system_type,
            storage_capacity=storage_capacity,
            storage_type=storage_type,
            subnet_ids=subnet_ids,
            security_group_ids=security_group_ids,
            tags=tags,
            kms_key_id=kms_key_id,
            windows_configuration=windows_configuration,
            lustre_configuration=lustre_configuration,
            ontap_configuration=ontap_configuration,
            file_system_type_version=file_system_type_version,
            open_zfs_configuration=open_zfs_configuration,
        )
    state = _state(self)
    lustre = dict(lustre_configuration or {})
    fingerprint = json.dumps(
        [storage_capacity, storage_type, subnet_ids, security_group_ids, tags, kms_key_id, lustre],
        sort_keys=True,
        default=str,
    )
    if client_request_token and client_request_token in state.tokens:
        known_fingerprint, file_system_id = state.tokens[client_request_token]
        if known_fingerprint != fingerprint:
            raise FsxError(
                "IncompatibleParameterError",
                "A request with this ClientRequestToken was already made with different parameters",
                Parameter="ClientRequestToken",
            )
        return _lustre(self, file_system_id)

    deployment_type = lustre.pop("DeploymentType", "SCRATCH_1")
    _validate_capacity(deployment_type, storage_capacity)
    _validate_throughput(deployment_type, lustre.get("PerUnitStorageThroughput"))
    _validate_lustre_options(deployment_type, lustre, kms_key_id)
    type_version = _lustre_version(deployment_type, lustre, file_system_type_version)
    vpc_id = _network(self, subnet_ids or [], security_group_ids or [])
    if lustre.get("ImportPath") and not lustre.get("ExportPath"):
        bucket = lustre["ImportPath"][len("s3://") :].split("/", 1)[0]
        lustre["ExportPath"] = f"s3://{bucket}/FSxLustre{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"

    failure = None
    if faults.consume("create_filesystem", "fsx-failed"):
        failure = (
            "Amazon FSx could not create the file system because of an internal error. Delete it and create "
            "another. (Injected by the lustrain twin: create_filesystem:fsx-failed.)"
        )
    file_system = LustreFileSystem(
        backend=self,
        storage_capacity=storage_capacity,
        subnet_ids=list(subnet_ids),
        security_group_ids=list(security_group_ids or []),
        vpc_id=vpc_id,
        deployment_type=deployment_type,
        lustre=lustre,
        kms_key_id=kms_key_id,
        type_version=type_version,
        failure=failure,
    )
    if deployment_type == "SCRATCH_1":
        file_system.mount_name = "fsx"
    # A duck-typed stand-in for moto's FileSystem: moto's tagging and responses only use what both have.
    self.file_systems[file_system.file_system_id] = file_system  # type: ignore[assignment]
    if tags:
        self.tagger.tag_resource(file_system.resource_arn, tags)
    if client_request_token:
        state.tokens[client_request_token] = (fingerprint, file_system.file_system_id)
    return file_system


@paginate(pagination_model=_PAGINATION)
def describe_file_systems(self: FSxBackend, file_system_ids: list[str] | None) -> list[Any]:
    wanted = list(file_system_ids or self.file_systems)
    for file_system_id in wanted:
        file_system = self.file_systems.get(file_system_id)
        if isinstance(file_system, LustreFileSystem) and file_system.clock.observe() == _GONE:
            _forget(self, file_system)
    missing = [fs_id for fs_id in wanted if fs_id not in self.file_systems]
    if file_system_ids and missing:
        raise FileSystemNotFound(missing[0])
    return [self.file_systems[fs_id] for fs_id in wanted if fs_id in self.file_systems]


def _forget(backend: FSxBackend, file_system: LustreFileSystem) -> None:
    state = _state(backend)
    backend.file_systems.pop(file_system.file_system_id, None)
    state.files.pop(file_system.file_system_id, None)
    for association in [
        a for a in state.associations.values() if a.file_system_id == file_system.file_system_id
    ]:
        state.associations.pop(association.association_id)


def delete_file_system(
    self: FSxBackend,
    file_system_id: str,
    client_request_token: str | None,
    windows_configuration: dict[str, Any] | None,
    lustre_configuration: dict[str, Any] | None,
    open_zfs_configuration: dict[str, Any] | None,
) -> Any:
    file_system = self.file_systems.get(file_system_id)
    if not isinstance(file_system, LustreFileSystem):
        return _original["delete_file_system"](
            self,
            file_system_id=file_system_id,
            client_request_token=client_request_token,
            windows_configuration=windows_configuration,
            lustre_configuration=lustre_configuration,
            open_zfs_configuration=open_zfs_configuration,
        )
    running = [t for t in _state(self).tasks.values() if t.file_system_id == file_system_id and t.running]
    if running:
        task = running[0]
        raise bad_request(
            f"Unable to delete file system {file_system_id}: data repository task {task.task_id} is "
            f"{task.clock.state}. Wait until the task completes, then delete the file system."
        )
    if file_system.clock.state != "DELETING":
        file_system.clock.restart("DELETING", _GONE)
    lustre_response = {"FinalBackupId": "", "FinalBackupTags": []}
    return file_system_id, "DELETING", None, lustre_response, None


def create_data_repository_association(
    self: FSxBackend,
    file_system_id: str,
    file_system_path: str | None,
    data_repository_path: str | None,
    batch_import: bool,
    chunk_size: int | None,
    s3: dict[str, Any] | None,
    tags: list[dict[str, str]] | None,
) -> Association:
    file_system = _lustre(self, file_system_id)
    if file_system.deployment_type == "SCRATCH_1":
        raise FsxError("UnsupportedOperation", "Data repository associations are not supported on SCRATCH_1")
    if file_system.type_version == "2.10":
        raise bad_request(
            f"File system {file_system_id} runs Lustre 2.10: data repository associations need Lustre 2.12 or later"
        )
    if file_system.import_path:
        raise bad_request(
            f"File system {file_system_id} was created with ImportPath {file_system.import_path}; data repository "
            "associations are not supported on a file system with a data repository configuration"
        )
    if not file_system_path or not file_system_path.startswith("/"):
        raise bad_request(f"FileSystemPath must start with '/', for example /data (got {file_system_path!r})")
    if not data_repository_path or not data_repository_path.startswith("s3://"):
        raise bad_request(
            f"DataRepositoryPath must be an S3 path, s3://bucket/prefix/ (got {data_repository_path!r})"
        )
    for other in _state(self).associations.values():
        if other.file_system_id != file_system_id:
            continue
        mine, theirs = file_system_path.rstrip("/") + "/", other.file_system_path.rstrip("/") + "/"
        if mine.startswith(theirs) or theirs.startswith(mine):
            raise bad_request(
                f"FileSystemPath {file_system_path} overlaps {other.file_system_path} of data repository "
                f"association {other.association_id}"
            )
        if other.data_repository_path.rstrip("/") == data_repository_path.rstrip("/"):
            raise bad_request(
                f"DataRepositoryPath {data_repository_path} is already linked by {other.association_id}"
            )
    association = Association(
        backend=self,
        file_system_id=file_system_id,
        file_system_path=file_system_path,
        data_repository_path=data_repository_path,
        batch_import=bool(batch_import),
        chunk_size=chunk_size or 1024,
        s3=s3 or {"AutoImportPolicy": {"Events": []}, "AutoExportPolicy": {"Events": []}},
    )
    _state(self).associations[association.association_id] = association
    if tags:
        self.tagger.tag_resource(association.resource_arn, tags)
    return association


@paginate(pagination_model=_PAGINATION)
def describe_data_repository_associations(
    self: FSxBackend, association_ids: list[str] | None, filters: list[dict[str, Any]] | None
) -> list[Association]:
    associations = _state(self).associations
    missing = [a for a in association_ids or [] if a not in associations]
    if missing:
        raise FsxError(
            "DataRepositoryAssociationNotFound", f"Data repository association {missing[0]} not found"
        )
    wanted = [associations[a] for a in association_ids or list(associations)]
    wanted = [a for a in wanted if _filtered(filters, {"file-system-id": a.file_system_id})]
    for association in wanted:
        if association.clock.observe() == _GONE:
            associations.pop(association.association_id)
    return [a for a in wanted if a.association_id in associations]


def delete_data_repository_association(
    self: FSxBackend, association_id: str, delete_data: bool
) -> dict[str, Any]:
    association = _state(self).associations.get(association_id)
    if association is None:
        raise FsxError(
            "DataRepositoryAssociationNotFound", f"Data repository association {association_id} not found"
        )
    if association.clock.state != "DELETING":
        association.clock.restart("DELETING", _GONE)
    return {
        "AssociationId": association_id,
        "Lifecycle": "DELETING",
        "DeleteDataInFileSystem": bool(delete_data),
    }


def create_data_repository_task(
    self: FSxBackend,
    task_type: str,
    paths: list[str] | None,
    file_system_id: str,
    report: dict[str, Any] | None,
    tags: list[dict[str, str]] | None,
) -> Task:
    file_system = _lustre(self, file_system_id)
    if task_type not in TASK_TYPES:
        raise FsxError(
            "UnsupportedOperation",
            f"the twin runs data repository tasks of Type {' or '.join(TASK_TYPES)} only",
        )
    if file_system.clock.state != "AVAILABLE":
        raise bad_request(f"File system {file_system_id} is {file_system.clock.state}; it must be AVAILABLE")
    if not file_system.import_path and not linked_paths(file_system_id):
        raise bad_request(f"File system {file_system_id} is not linked to a data repository")
    if report is None or "Enabled" not in report:
        raise bad_request(
            "Report is required: {'Enabled': false} or {'Enabled': true, 'Path': 's3://...', ...}"
        )
    if report["Enabled"] and not report.get("Path"):
        raise bad_request("Report.Path is required when Report.Enabled is true")
    state = _state(self)
    if any(t.file_system_id == file_system_id and t.running for t in state.tasks.values()):
        raise FsxError(
            "DataRepositoryTaskExecuting",
            "An existing data repository task is currently executing on the file system. Wait until the existing "
            "task has completed, then create the new task.",
        )
    task = Task(
        backend=self,
        task_type=task_type,
        file_system_id=file_system_id,
        paths=paths or [],
        report=report,
        files=dict(state.files.get(file_system_id, {})),
    )
    state.tasks[task.task_id] = task
    if tags:
        self.tagger.tag_resource(task.resource_arn, tags)
    return task


@paginate(pagination_model=_PAGINATION)
def describe_data_repository_tasks(
    self: FSxBackend, task_ids: list[str] | None, filters: list[dict[str, Any]] | None
) -> list[Task]:
    tasks = _state(self).tasks
    missing = [t for t in task_ids or [] if t not in tasks]
    if missing:
        raise FsxError("DataRepositoryTaskNotFound", f"Data repository task {missing[0]} not found")
    wanted = [tasks[t] for t in task_ids or list(tasks)]
    for task in wanted:
        task.observe()
    return [
        t
        for t in wanted
        if _filtered(filters, {"file-system-id": t.file_system_id, "task-lifecycle": t.lifecycle})
    ]


def _filtered(filters: list[dict[str, Any]] | None, values: dict[str, str]) -> bool:
    for entry in filters or []:
        name = entry.get("Name", "")
        if name not in values:
            raise bad_request(f"Unsupported filter {name!r}; the twin filters on {', '.join(values)}")
        if values[name] not in entry.get("Values", []):
            return False
    return True


def _backend_of(file_system_id: str) -> FSxBackend:
    for account in fsx_backends.values():
        for backend in account.values():
            if file_system_id in backend.file_systems:
                return backend
    raise KeyError(f"no FSx for Lustre file system {file_system_id} in the twin")


def _links_of(backend: FSxBackend, file_system_id: str, *, exporting: bool = False) -> dict[str, str]:
    """{file_system_path: s3_uri} of a file system's live links (where an export goes: an ImportPath file system's
    ExportPath); `exporting`: only those whose AutoExportPolicy has events."""
    file_system = _lustre(backend, file_system_id)
    if file_system.import_path:
        return {"/": str(file_system.lustre.get("ExportPath") or file_system.import_path)}
    return {
        a.file_system_path: a.data_repository_path
        for a in _state(backend).associations.values()
        if a.file_system_id == file_system_id
        and a.clock.state != "DELETING"
        and (not exporting or (a.s3.get("AutoExportPolicy") or {}).get("Events"))
    }


def linked_paths(file_system_id: str) -> dict[str, str]:
    """Which S3 prefix is linked at which path of a file system: {file_system_path: s3_uri}."""
    backend = _backend_of(file_system_id)
    if _lustre(backend, file_system_id).import_path:
        return {"/": str(_lustre(backend, file_system_id).import_path)}
    return _links_of(backend, file_system_id)


def auto_exported_paths(file_system_id: str) -> dict[str, str]:
    """The links of a file system that export what is written under them by themselves (AutoExportPolicy)."""
    backend = _backend_of(file_system_id)
    if _lustre(backend, file_system_id).import_path:
        return {}
    return _links_of(backend, file_system_id, exporting=True)


def store_files(file_system_id: str, files: dict[str, bytes], deleted: list[str]) -> None:
    """Keep what a job wrote on the file system ({absolute path in it: bytes}) until it is deleted, and forget
    what it deleted."""
    backend = _backend_of(file_system_id)
    kept = _state(backend).files.setdefault(file_system_id, {})
    for name in deleted:
        kept.pop(name, None)
    kept.update(files)


def stored_files(file_system_id: str, under: str) -> dict[str, bytes]:
    """What jobs wrote on the file system at or below `under`: {path relative to `under`: bytes}."""
    backend = _backend_of(file_system_id)
    root = PurePosixPath("/", under)
    found = {}
    for name, data in _state(backend).files.get(file_system_id, {}).items():
        path = PurePosixPath(name)
        if root in path.parents:
            found[path.relative_to(root).as_posix()] = data
    return found


def association_file_system(account: str, region: str, association_id: str) -> str | None:
    """The file system of an association (whose ARN holds both ids), or None."""
    found = _state(fsx_backends[account][region]).associations.get(association_id)
    return None if found is None else found.file_system_id


# Response methods (bound to moto's FSxResponse) ------------------------------------------------------------------


def _params(response: FSxResponse) -> dict[str, Any]:
    params: dict[str, Any] = json.loads(response.body or "{}")
    return params


def respond_create_data_repository_association(self: FSxResponse) -> str:
    p = _params(self)
    association = create_data_repository_association(
        self.fsx_backend,
        file_system_id=p.get("FileSystemId", ""),
        file_system_path=p.get("FileSystemPath"),
        data_repository_path=p.get("DataRepositoryPath"),
        batch_import=p.get("BatchImportMetaDataOnCreate", False),
        chunk_size=p.get("ImportedFileChunkSize"),
        s3=p.get("S3"),
        tags=p.get("Tags"),
    )
    return json.dumps({"Association": association.to_dict()})


def respond_describe_data_repository_associations(self: FSxResponse) -> str:
    p = _params(self)
    associations, next_token = describe_data_repository_associations(
        self.fsx_backend,
        association_ids=p.get("AssociationIds"),
        filters=p.get("Filters"),
        max_results=p.get("MaxResults"),
        next_token=p.get("NextToken"),
    )
    return json.dumps({"Associations": [a.to_dict() for a in associations], "NextToken": next_token})


def respond_delete_data_repository_association(self: FSxResponse) -> str:
    p = _params(self)
    return json.dumps(
        delete_data_repository_association(
            self.fsx_backend,
            association_id=p.get("AssociationId", ""),
            delete_data=p.get("DeleteDataInFileSystem", False),
        )
    )


def respond_create_data_repository_task(self: FSxResponse) -> str:
    p = _params(self)
    task = create_data_repository_task(
        self.fsx_backend,
        task_type=p.get("Type", ""),
        paths=p.get("Paths"),
        file_system_id=p.get("FileSystemId", ""),
        report=p.get("Report"),
        tags=p.get("Tags"),
    )
    return json.dumps({"DataRepositoryTask": task.to_dict()})


def respond_describe_data_repository_tasks(self: FSxResponse) -> str:
    p = _params(self)
    tasks, next_token = describe_data_repository_tasks(
        self.fsx_backend,
        task_ids=p.get("TaskIds"),
        filters=p.get("Filters"),
        max_results=p.get("MaxResults"),
        next_token=p.get("NextToken"),
    )
    return json.dumps({"DataRepositoryTasks": [t.to_dict() for t in tasks], "NextToken": next_token})


def install() -> None:
    if getattr(FSxBackend, _PATCHED, False):
        return
    _original["create_file_system"] = FSxBackend.create_file_system
    _original["delete_file_system"] = FSxBackend.delete_file_system
    for method in (
        create_file_system,
        describe_file_systems,
        delete_file_system,
        create_data_repository_association,
        describe_data_repository_associations,
        delete_data_repository_association,
        create_data_repository_task,
        describe_data_repository_tasks,
    ):
        setattr(FSxBackend, method.__name__, method)
    for responder in (
        respond_create_data_repository_association,
        respond_describe_data_repository_associations,
        respond_delete_data_repository_association,
        respond_create_data_repository_task,
        respond_describe_data_repository_tasks,
    ):
        setattr(FSxResponse, responder.__name__.removeprefix("respond_"), responder)
    setattr(FSxBackend, _PATCHED, True)
