"""A job's input channels: Lustre "mounted" from the file system's S3 links, S3 channels downloaded.

A FileSystemDataSource channel is mounted by filling its directory with what the file system shows at
DirectoryPath: the objects of the S3 prefixes linked to it (an ImportPath, or data repository associations),
copied by FSx (its service-linked role reads the linked buckets, not the job's role). As on SageMaker,
DirectoryPath must start with "/<MountName>", the file system must be AVAILABLE, and the directory must exist:
a linked path exists as soon as its link does, empty or not. What the job writes in a read-write channel under a
link whose AutoExport is on is exported to the linked prefix when the job ends (`export_changes`), as FSx
exports new and changed files. Whatever a job writes in a read-write channel stays on the file system
(`LustreFiles.store`) and a later job's mount shows it (a later attempt resumes from the checkpoints the last one
left there); under a link without AutoExport it reaches S3 only by an export task (patches/fsx.py).

An S3 channel is downloaded as the job's execution role (storage.JobStorage).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from lustrain.twin.simulator.job import JobFailure, SimulatedJob
from lustrain.twin.simulator.storage import (
    JobStorage,
    MissingBucket,
    as_dir_prefix,
    split_s3_uri,
    write_below,
)

#: describe(account, region, file system id) -> FSx's description of it, or None when it does not exist.
DescribeFileSystem = Callable[[str, str, str], "dict[str, Any] | None"]
#: linked_paths(file system id) -> {path in the file system: s3 URI} of its live links.
LinkedPaths = Callable[[str], dict[str, str]]


@dataclass(frozen=True)
class LustreFiles:
    """What the file systems hold beyond their S3 links: the files jobs wrote (patches/fsx.py keeps them)."""

    #: read(file system id, path in it) -> {path relative to it: bytes}
    read: Callable[[str, str], dict[str, bytes]]
    #: store(file system id, {absolute path in it: bytes}, [absolute paths deleted])
    store: Callable[[str, dict[str, bytes], list[str]], None]
    #: auto_exported(file system id) -> {path: s3 URI} of the links whose AutoExportPolicy has events
    auto_exported: Callable[[str], dict[str, str]]


def mount_error(file_system_id: str, directory_path: str, cause: str, remedy: str) -> JobFailure:
    # The shape of SageMaker's own mount failures ("ClientError: Unable to mount file system: <id>, directory
    # path: <path>. <cause>. Please ensure <remedy>"), as AWS reports them for FSx and EFS channels.
    return JobFailure(
        f"ClientError: Unable to mount file system: {file_system_id}, directory path: {directory_path}. "
        f"{cause}. Please ensure {remedy}."
    )


def mount_lustre(
    source: dict[str, Any],
    target: Path,
    *,
    account: str,
    region: str,
    describe: DescribeFileSystem,
    linked_paths: LinkedPaths,
    fsx_storage: JobStorage,
    files: LustreFiles | None = None,
) -> Mount:
    """Fill `target` as the channel's mount shows it; JobFailure with SageMaker's mount error when it cannot."""
    fs_id = str(source.get("FileSystemId", ""))
    path = str(source.get("DirectoryPath", ""))
    if source.get("FileSystemType") != "FSxLustre":
        raise mount_error(
            fs_id,
            path,
            f"File system type {source.get('FileSystemType')} is not simulated by the twin",
            "that the channel uses FileSystemType FSxLustre",
        )
    description = describe(account, region, fs_id)
    if description is None:
        raise mount_error(
            fs_id,
            path,
            "File system does not exist",
            "that the file system exists in this account and region and has not been deleted",
        )
    lifecycle = description.get("Lifecycle", "AVAILABLE")
    if lifecycle != "AVAILABLE":
        raise mount_error(
            fs_id,
            path,
            f"File system is {lifecycle}, not AVAILABLE",
            "that the file system is AVAILABLE before the training job starts",
        )
    mount_name = str((description.get("LustreConfiguration") or {}).get("MountName", ""))
    parts = PurePosixPath(path).parts
    if not mount_name or len(parts) < 2 or parts[0] != "/" or parts[1] != mount_name:
        raise mount_error(
            fs_id,
            path,
            "No such file or directory",
            f"that the directory path starts with the file system's mount name (/{mount_name}), as in "
            f"/{mount_name}/<path in the file system>, and that the directory exists",
        )
    inside = PurePosixPath("/", *parts[2:])
    links = linked_paths(fs_id)
    found = fill_from_links(links, inside, target, fsx_storage)
    if files is not None:
        # what earlier jobs wrote there (newer than anything in S3: Lustre is where they wrote it)
        for relative, data in files.read(fs_id, str(inside)).items():
            write_below(target, relative, data)
    if not found:
        raise mount_error(
            fs_id,
            path,
            "No such file or directory",
            f"that {inside} exists in the file system: it must be, or lie under, a path linked to an S3 "
            "data repository that holds objects",
        )
    exporting = files.auto_exported(fs_id) if files is not None else links
    return Mount(
        target, inside, exporting, source.get("FileSystemAccessMode") == "rw", _snapshot(target), fs_id
    )


@dataclass(frozen=True)
class Mount:
    """A mounted Lustre channel: where it is here, where in the file system, its links that export by themselves,
    what it held at first, and its file system."""

    target: Path
    inside: PurePosixPath
    links: dict[str, str]
    writable: bool
    before: dict[str, tuple[int, int]]
    file_system_id: str = ""

    def changes(self) -> list[Path]:
        """The files the job wrote or changed in the channel (what FSx's AutoExport NEW and CHANGED export)."""
        now = _snapshot(self.target)
        return [self.target / rel for rel, stat in sorted(now.items()) if self.before.get(rel) != stat]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    found = {}
    for path in root.rglob("*"):
        if path.is_file():
            stat = path.stat()
            found[path.relative_to(root).as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return found


def keep_changes(mount: Mount, files: LustreFiles) -> int:
    """What the job wrote in a read-write channel stays on the file system, and what it deleted goes (the trainer
    prunes old checkpoints); how many files changed."""
    if not mount.writable:
        return 0
    changed = {
        str(mount.inside / path.relative_to(mount.target).as_posix()): path.read_bytes()
        for path in mount.changes()
    }
    now = _snapshot(mount.target)
    deleted = [str(mount.inside / rel) for rel in mount.before if rel not in now]
    files.store(mount.file_system_id, changed, deleted)
    return len(changed) + len(deleted)


def export_changes(mount: Mount, storage: JobStorage) -> int:
    """Export what the job wrote in a read-write channel to the S3 prefix linked above it; how many files."""
    if not mount.writable:
        return 0
    links = sorted(
        ((PurePosixPath("/", p), uri) for p, uri in mount.links.items()), key=lambda item: -len(item[0].parts)
    )
    exported = 0
    for path in mount.changes():
        in_fs = mount.inside / path.relative_to(mount.target).as_posix()
        for link, uri in links:
            if link == in_fs or link in in_fs.parents:
                bucket, prefix = split_s3_uri(uri)
                with contextlib.suppress(MissingBucket):
                    storage.put(
                        bucket, as_dir_prefix(prefix) + in_fs.relative_to(link).as_posix(), path.read_bytes()
                    )
                    exported += 1
                break
    return exported


def fill_from_links(links: dict[str, str], inside: PurePosixPath, target: Path, storage: JobStorage) -> bool:
    """Copy what the file system shows at `inside` from its linked S3 prefixes; False if nothing is there."""
    found = inside == PurePosixPath("/")
    for fs_path, s3_uri in links.items():
        link = PurePosixPath("/", fs_path)
        bucket, prefix = split_s3_uri(s3_uri)
        prefix = as_dir_prefix(prefix)
        if inside == link:
            found = True  # a link's directory exists once the link does
        if inside == link or link in inside.parents:
            below = inside.relative_to(link).as_posix()
            source_prefix = prefix if below == "." else as_dir_prefix(prefix + below)
            destination = target
        elif inside in link.parents:
            source_prefix = prefix
            destination = target / link.relative_to(inside)
            destination.mkdir(parents=True, exist_ok=True)
            found = True
        else:
            continue
        try:
            objects = storage.list(bucket, source_prefix)
        except MissingBucket:
            objects = []
        for key, data in objects:
            write_below(destination, key[len(source_prefix) :], data)
            found = True
    return found


def download_s3_channel(job: SimulatedJob, source: dict[str, Any], target: Path, storage: JobStorage) -> None:
    uri = str(source.get("S3Uri", ""))
    data_type = source.get("S3DataType", "S3Prefix")
    if data_type != "S3Prefix":
        raise JobFailure(f"ClientError: S3DataType {data_type} is not simulated by the twin (use S3Prefix)")
    bucket, prefix = split_s3_uri(uri)
    objects = []
    with contextlib.suppress(MissingBucket):
        objects = storage.list(bucket, prefix)
    if not objects:
        role = job.request.get("RoleArn", "")
        raise JobFailure(
            f'ClientError: No S3 objects found under S3 URL "{uri}" given in input data source. Please ensure '
            f"that the bucket exists in the selected region ({job.region}), that objects exist under that S3 "
            f'prefix, and that the role "{role}" has "s3:ListBucket" permissions on bucket "{bucket}".'
        )
    base = prefix if prefix.endswith("/") or not prefix else prefix.rsplit("/", 1)[0] + "/"
    for key, data in objects:
        write_below(target, key[len(base) :] if key.startswith(base) else PurePosixPath(key).name, data)
