"""create_filesystem / check_filesystem: the Lustre file system of a run, linked to the data in S3.

What mount_path means, for both deployment types
------------------------------------------------
The spec says `filesystem.mount_path` is where the S3 prefix appears inside the file system, and the training job
reads it at DirectoryPath = "/<MountName><mount_path>" (`directory_path`). Two ways exist to link S3:

- a data repository association (DRA): FileSystemPath = mount_path <-> DataRepositoryPath = data.s3_uri. The
  prefix appears exactly at mount_path. DRAs need Lustre 2.12 or later and work on PERSISTENT_2 and SCRATCH_2
  alike (every deployment type but SCRATCH_1).
- ImportPath (the file system's own, older link, SCRATCH_2 and PERSISTENT_1 only): the prefix appears at the
  file system's root, "/". Importing a parent prefix to push the data down to mount_path would also import
  every sibling prefix in that bucket, and ExportPath must share ImportPath's bucket.

Every file system is created as Lustre 2.15 (LUSTRE_VERSION), stated in the request: CreateFileSystem's
FileSystemTypeVersion defaults to 2.10 on SCRATCH_2 (2.12 on PERSISTENT_2), so a request that leaves it out gets
the oldest version, with no DRAs. 2.15 is the newest version FSx offers, supported on every deployment type and
recommended by FSx for new file systems (the FileSystemTypeVersion field of the API reference). The training image
needs no Lustre client of its own: SageMaker mounts the file system on its training hosts and hands the job the
directory (FileSystemDataSource).

So: a SCRATCH_2 file system whose mount_path is "/" and which exports nothing is linked with ImportPath =
data.s3_uri (AutoImportPolicy NEW_CHANGED_DELETED, ImportedFileChunkSize left at its default): the prefix is at
the root, which is mount_path. Every other file system (PERSISTENT_2, or SCRATCH_2 with the data below the root,
or any file system that exports output) gets a DRA at mount_path. Either way DirectoryPath =
"/<MountName><mount_path>" holds and the data is there. A DRA at "/" must be a file system's only one, so
mount_path "/" cannot be combined with output.to_filesystem (SpecInvalid at filesystem.mount_path).

Output on the file system (output.to_filesystem)
------------------------------------------------
The job writes under OUTPUT_ROOT/<job id> (`output_path`), linked by a second DRA to the run's own
<output.s3_uri><job id>/output/ (launch_plan.output_location: never the team's folder itself, where FSx's export,
which no job's role limits, would reach other runs' files) with AutoExport (NEW, CHANGED, DELETED). The job record notes `export_on_teardown`, and teardown runs an
EXPORT_TO_REPOSITORY task over that path and waits for it before anything is deleted.

Checkpoints on the file system (checkpoints.to_filesystem)
-----------------------------------------------------------
The trainer writes its sharded checkpoints under CHECKPOINT_ROOT/<job id> (`checkpoint_path`), a read-write
channel (SM_CHANNEL_CHECKPOINTS), instead of /opt/ml/checkpoints and SageMaker's checkpoint sync: a checkpoint's
burst lands at Lustre's throughput, not S3's upload pace. A third DRA links that path to the run's checkpoint
prefix (launch_plan.checkpoint_location) with neither AutoImport nor AutoExport: nothing travels to S3 while the job
trains. The checkpoints reach S3 by EXPORT_TO_REPOSITORY tasks over that path: next_attempt starts one when an
attempt ends (steps/attempts.py), and teardown runs one and waits for it to succeed before the file system is
deleted (`export_on_teardown` lists both paths). A later attempt of the run mounts the same directory and resumes
from it; a later run (checkpoints.resume_from) resumes from S3, where the exports put them.

The links are created by check_filesystem once the file system is AVAILABLE (FSx refuses a DRA before). The run's
`lifecycle` is AVAILABLE only when the file system and each link are; meanwhile it reads CREATING, and
`file_system_lifecycle` and `links` say which part is pending.

Where each path goes and to which prefix it links is the launch plan's decision (launch_plan.link_for, recorded as
$.job.launch's links, output_path and checkpoint_path); CreateFileSystem and CreateDataRepositoryAssociation are
built from it by aws_requests (LUSTRE_VERSION lives there, OUTPUT_ROOT and CHECKPOINT_ROOT in launch_plan).

Reusing a file system (filesystem.file_system_id) creates none and never records it, so teardown never deletes it:
it must exist, be a Lustre file system that is AVAILABLE, sit in the job's VPC, and have a DRA or ImportPath that
covers data.s3_uri at mount_path.
"""

from __future__ import annotations

import posixpath
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core import aws_requests, teams
from lustrain_core.aws_requests import directory_path
from lustrain_core.config import Settings
from lustrain_core.document import Filesystem, Job, LinkState, Network, Poll, Run, Sections
from lustrain_core.errors import FileSystemFailed
from lustrain_core.launch_plan import TAG_CREATED_BY, TAG_JOB_ID, norm_path, s3_prefix, tag_dict
from lustrain_core.spec import JobSpec
from lustrain_core.steps import preload, records

FAILED_LIFECYCLES = frozenset({"FAILED", "MISCONFIGURED", "MISCONFIGURED_UNAVAILABLE"})
#: the first look after CreateFileSystem waits the creation time to expect (initial_seconds), every later look
#: max_seconds after the one before: a file system ready after the first look is noticed within max_seconds
DEFAULT_POLL = {"initial_seconds": 480, "max_seconds": 30, "max_polls": 240}
#: the look after the one that created the file system's S3 associations waits this share of the steady interval
#: (10 s of 30): a new association is AVAILABLE once its metadata import ends, seconds for a small prefix; a long
#: import is then looked at every max_seconds
LINK_FIRST_LOOK_SHARE = 3


def poll_settings(document: dict[str, Any]) -> dict[str, int]:
    """The poll loop's settings: $.poll's, checked by its model, and DEFAULT_POLL's for those it leaves out."""
    given = Sections.of(document).poll or Poll()
    return {key: getattr(given, key) or default for key, default in DEFAULT_POLL.items()}


def next_wait(polls: int, poll: dict[str, int]) -> int:
    """Seconds to wait before check number `polls + 1`: the creation time to expect before the first, then the
    steady interval (never longer than the first wait)."""
    if polls == 0:
        return poll["initial_seconds"]
    return min(poll["max_seconds"], poll["initial_seconds"])


# --------------------------------------------------------------------------- AWS reads


def describe(fsx: Any, file_system_id: str) -> dict[str, Any] | None:
    try:
        found = fsx.describe_file_systems(FileSystemIds=[file_system_id])["FileSystems"]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "FileSystemNotFound":
            return None
        raise
    return found[0] if found else None


def associations(fsx: Any, file_system_id: str | None = None) -> list[dict[str, Any]]:
    """The data repository associations of a file system, or of every one (botocore has no paginator for them)."""
    found: list[dict[str, Any]] = []
    params: dict[str, Any] = (
        {"Filters": [{"Name": "file-system-id", "Values": [file_system_id]}]} if file_system_id else {}
    )
    while True:
        page = fsx.describe_data_repository_associations(**params)
        found.extend(page.get("Associations", []))
        if not page.get("NextToken"):
            return found
        params["NextToken"] = page["NextToken"]


def find_by_tag(fsx: Any, job_id: str, stack_name: str) -> list[dict[str, Any]]:
    """The file systems tagged as this job's by this stack (a retried create finds its own)."""
    found = []
    for page in fsx.get_paginator("describe_file_systems").paginate():
        for fs in page.get("FileSystems", []):
            tags = tag_dict(fs.get("Tags"))
            if tags.get(TAG_JOB_ID) == job_id and tags.get(TAG_CREATED_BY) == stack_name:
                found.append(fs)
    return found


def _mount_name(fs: dict[str, Any]) -> str | None:
    name = fs.get("LustreConfiguration", {}).get("MountName")
    return str(name) if name else None


def _failure(fs: dict[str, Any]) -> str:
    return str(fs.get("FailureDetails", {}).get("Message") or "FSx gave no details")


# --------------------------------------------------------------------------- reuse


def data_location(fs: dict[str, Any], dras: list[dict[str, Any]], data_s3_uri: str) -> str | None:
    """Where data.s3_uri appears inside a file system through its DRAs or ImportPath, or None."""
    want = s3_prefix(data_s3_uri)
    linked = [
        (d["DataRepositoryPath"], d.get("FileSystemPath", "/"))
        for d in dras
        if d.get("Lifecycle") != "DELETING"
    ]
    import_path = fs.get("LustreConfiguration", {}).get("DataRepositoryConfiguration", {}).get("ImportPath")
    if import_path:
        linked.append((import_path, "/"))
    for repo, fs_path in linked:
        if want.startswith(s3_prefix(repo)):
            rest = want[len(s3_prefix(repo)) :].rstrip("/")
            return norm_path(posixpath.join(fs_path, rest)) if rest else norm_path(fs_path)
    return None


def reuse_refusal(
    fs: dict[str, Any] | None, spec: JobSpec, team: str, stack_teams: tuple[str, ...] = (teams.DEFAULT_TEAM,)
) -> tuple[str, str] | None:
    """Why the run may not reuse the file system filesystem.file_system_id names, whatever its network and state:
    (the field, the reason), or None. `fs` is DescribeFileSystems' answer for it (None: it does not exist). On a
    stack of several teams it must be the run's team's (tagged lustrain:team): the training containers run as root
    and nothing in Lustre is guarded by IAM, so a file system two teams mount is one both read and write. register_job
    asks before anything exists; create_filesystem again, since a tag can change while a run waits in the queue."""
    fs_id = str(spec.filesystem.file_system_id)
    field = "filesystem.file_system_id"
    if fs is None:
        return field, f"{fs_id} does not exist in this account and region"
    owner = tag_dict(fs.get("Tags")).get(teams.TAG_TEAM)
    if owner != team and (owner is not None or len(stack_teams) > 1):
        return field, (
            f"{fs_id} is not a file system of team {team} (tag {teams.TAG_TEAM}={team}): whatever a run mounts, its "
            "code reads and writes as root, so a file system serves one team; leave file_system_id out and the run "
            "creates its own"
        )
    if fs.get("FileSystemType") != "LUSTRE":
        return field, f"{fs_id} is an FSx for {fs.get('FileSystemType')} file system, not Lustre"
    if spec.checkpoints.to_filesystem:
        return _checkpoints_refusal(fs, team)
    return None


def validate_reuse(
    fsx: Any, job: Job, network: Network, stack_teams: tuple[str, ...] = (teams.DEFAULT_TEAM,)
) -> dict[str, Any]:
    """The file system named by filesystem.file_system_id, checked to carry this run; FileSystemFailed if not
    (reuse_refusal, then its state, its network and its links to the run's data)."""
    fs_id = str(job.spec.filesystem.file_system_id)
    fs = describe(fsx, fs_id)
    refusal = reuse_refusal(fs, job.spec, job.launch.team, stack_teams)
    if refusal is not None:
        field, reason = refusal
        raise FileSystemFailed(f"{field}: {reason}", file_system_id=fs_id)
    assert fs is not None  # reuse_refusal refuses a file system that does not exist
    if fs.get("Lifecycle") not in {"AVAILABLE", "UPDATING"}:
        raise FileSystemFailed(
            f"filesystem.file_system_id: {fs_id} is {fs.get('Lifecycle')}, not AVAILABLE",
            file_system_id=fs_id,
            lifecycle=fs.get("Lifecycle"),
        )
    if fs.get("VpcId") and network.vpc_id and fs["VpcId"] != network.vpc_id:
        raise FileSystemFailed(
            f"filesystem.file_system_id: {fs_id} is in {fs['VpcId']} but the job's network is in "
            f"{network.vpc_id}: set network.subnet_id (and security_group_ids) to a subnet of {fs['VpcId']}",
            file_system_id=fs_id,
        )
    where = data_location(fs, associations(fsx, fs_id), job.spec.data.s3_uri)
    if where is None:
        raise FileSystemFailed(
            f"filesystem.file_system_id: no data repository association or ImportPath of {fs_id} covers "
            f"data.s3_uri {job.spec.data.s3_uri}: link it (aws fsx create-data-repository-association "
            f"--file-system-id {fs_id} --file-system-path {job.spec.filesystem.mount_path} "
            f"--data-repository-path {job.spec.data.s3_uri}) or reuse another file system",
            file_system_id=fs_id,
        )
    if where != norm_path(job.spec.filesystem.mount_path):
        raise FileSystemFailed(
            f"filesystem.mount_path: data.s3_uri appears at {where} on {fs_id}, not at "
            f"{job.spec.filesystem.mount_path}: set filesystem.mount_path: {where}",
            file_system_id=fs_id,
        )
    return fs


def _checkpoints_refusal(fs: dict[str, Any], team: str) -> tuple[str, str] | None:
    """checkpoints.to_filesystem on a reused file system: it must keep them through a file server's failure (not
    SCRATCH: one copy) and be the run's team's by its tag even on a stack of one team (a file system lustrain did not
    create may be mounted by anything, and every container runs as root: no IAM boundary inside Lustre)."""
    fs_id = str(fs.get("FileSystemId"))
    field = "checkpoints.to_filesystem"
    kind = str((fs.get("LustreConfiguration") or {}).get("DeploymentType") or "")
    if kind.startswith("SCRATCH"):
        return field, (
            f"{fs_id} is {kind}, which keeps one copy of its data: a file server's failure loses every checkpoint its "
            "export had not reached; reuse a PERSISTENT file system or keep the checkpoints in S3 "
            "(checkpoints.to_filesystem: false)"
        )
    if tag_dict(fs.get("Tags")).get(teams.TAG_TEAM) != team:
        return field, (
            f"{fs_id} is not tagged {teams.TAG_TEAM}={team}: whatever else mounts it reads and writes the checkpoints "
            "as root; reuse a file system of the team's own, or keep the checkpoints in S3 "
            "(checkpoints.to_filesystem: false)"
        )
    return None


# --------------------------------------------------------------------------- the steps


def _result(
    job: Job,
    fs: dict[str, Any],
    *,
    created: bool,
    polls: int,
    wait_seconds: int,
    links: list[LinkState],
    ready: bool,
) -> Filesystem:
    mount = _mount_name(fs)
    out = job.launch.output_path
    ckpt = job.launch.checkpoint_path
    return Filesystem(
        file_system_id=fs["FileSystemId"],
        lifecycle="AVAILABLE"
        if ready
        else ("CREATING" if fs.get("Lifecycle") == "AVAILABLE" else fs.get("Lifecycle")),
        file_system_lifecycle=fs.get("Lifecycle"),
        ready=ready,
        dns_name=fs.get("DNSName"),
        mount_name=mount,
        directory_path=directory_path(mount, job.launch.data_path) if mount else None,
        output_path=out,
        output_directory_path=directory_path(mount, out) if mount and out else None,
        checkpoint_path=ckpt,
        checkpoint_directory_path=directory_path(mount, ckpt) if mount and ckpt else None,
        deployment_type=fs.get("LustreConfiguration", {}).get("DeploymentType"),
        created=created,
        links=links,
        polls=polls,
        wait_seconds=wait_seconds,
    )


def create_filesystem(document: dict[str, Any], *, fsx: Any, ddb: Any, settings: Settings) -> Filesystem:
    """Create the run's file system (or validate the one to reuse); returns $.filesystem for the poll loop."""
    run = Run.parse(document, "network")
    job = run.job
    records.require(ddb, settings.jobs_table, job.job_id)
    network = run.network
    poll = poll_settings(document)
    links = job.launch
    if job.spec.filesystem.file_system_id:
        fs = validate_reuse(fsx, job, network, teams.teams_of(settings))
        if links.export_paths:
            _note_export(ddb, settings, job, fs["FileSystemId"], links.export_paths)
        # data.preload: the poll loop starts the warm-up once it has looked at the file system
        ready = not links.export_paths and job.launch.preload is None
        return _result(
            job,
            fs,
            created=False,
            polls=0,
            wait_seconds=0 if ready else next_wait(1, poll),
            links=[],
            ready=ready,
        )

    existing = find_by_tag(fsx, job.job_id, settings.stack_name)
    live = [fs for fs in existing if fs.get("Lifecycle") not in {"DELETING"}]
    if live:
        fs = live[0]
    else:
        fs = fsx.create_file_system(**aws_requests.file_system(job, network, settings))["FileSystem"]
    records.add_resources(
        ddb, settings.jobs_table, job.job_id, [{"type": "file_system", "id": fs["FileSystemId"]}]
    )
    if links.export_paths:
        _note_export(ddb, settings, job, fs["FileSystemId"], links.export_paths)
    if fs.get("Lifecycle") in FAILED_LIFECYCLES:
        raise FileSystemFailed(
            f"file system {fs['FileSystemId']} is {fs['Lifecycle']}: {_failure(fs)}",
            file_system_id=fs["FileSystemId"],
            lifecycle=fs["Lifecycle"],
        )
    # a file system found AVAILABLE (a retry after a lost answer) is looked at again at the steady interval
    first = next_wait(1 if fs.get("Lifecycle") == "AVAILABLE" else 0, poll)
    return _result(job, fs, created=True, polls=0, wait_seconds=first, links=[], ready=False)


def _note_export(ddb: Any, settings: Settings, job: Job, file_system_id: str, paths: list[str]) -> None:
    records.set_fields(
        ddb,
        settings.jobs_table,
        job.job_id,
        export_on_teardown={"file_system_id": file_system_id, "paths": paths},
    )


def ensure_links(fsx: Any, ddb: Any, settings: Settings, job: Job, fs: dict[str, Any]) -> list[LinkState]:
    """Create the DRAs the run needs on an AVAILABLE file system (once) and report each one's lifecycle."""
    plan = job.launch
    wanted = (
        plan.dra_links
        if job.spec.filesystem.file_system_id is None
        else tuple(link for link in plan.links if link.purpose != "data")
    )
    if not wanted:
        return []
    fs_id = fs["FileSystemId"]
    current = {
        norm_path(d.get("FileSystemPath", "/")): d
        for d in associations(fsx, fs_id)
        if d.get("Lifecycle") != "DELETING"
    }
    states = []
    for link in wanted:
        dra = current.get(norm_path(link.path))
        if dra is None:
            dra = fsx.create_data_repository_association(
                **aws_requests.data_repository_association(job, fs_id, link, settings)
            )["Association"]
        elif s3_prefix(dra["DataRepositoryPath"]) != s3_prefix(link.s3_uri):
            raise FileSystemFailed(
                f"{fs_id} already links {link.path} to {dra['DataRepositoryPath']}, not {link.s3_uri}",
                file_system_id=fs_id,
            )
        # Recorded whether created now or found: a link this run made, whose ledger entry was lost with an
        # answer (a throttled write, a timed-out invocation), is found on the retry and must still be torn down.
        # (Found links are the run's: its own file system's, or its own output path on a reused one.)
        records.add_resources(
            ddb,
            settings.jobs_table,
            job.job_id,
            [{"type": "data_repository_association", "id": dra["AssociationId"]}],
        )
        if dra.get("Lifecycle") in FAILED_LIFECYCLES:
            raise FileSystemFailed(
                f"the link of {link.path} on {fs_id} to {link.s3_uri} is {dra['Lifecycle']}: "
                f"{dra.get('FailureDetails', {}).get('Message') or 'FSx gave no details'}",
                file_system_id=fs_id,
                association_id=dra["AssociationId"],
                lifecycle=dra["Lifecycle"],
            )
        states.append(
            LinkState(
                association_id=dra["AssociationId"],
                path=link.path,
                s3_uri=link.s3_uri,
                purpose=link.purpose,
                lifecycle=dra.get("Lifecycle"),
            )
        )
    return states


def check_filesystem(
    document: dict[str, Any],
    *,
    fsx: Any,
    ddb: Any,
    settings: Settings,
    sagemaker: Any = None,
    sts: Any = None,
) -> Filesystem:
    """One turn of the poll loop: the file system's lifecycle, its links, and how long to wait for the next; once
    they are ready, data.preload's warm-up job (steps/preload.py), started with `sagemaker` (and `sts`)."""
    run = Run.parse(document, "filesystem")
    job = run.job
    records.require(ddb, settings.jobs_table, job.job_id)
    previous = run.filesystem
    fs_id = previous.file_system_id
    poll = poll_settings(document)
    polls = previous.polls + 1
    fs = describe(fsx, fs_id)
    if fs is None:
        raise FileSystemFailed(f"file system {fs_id} no longer exists", file_system_id=fs_id)
    if fs.get("Lifecycle") in FAILED_LIFECYCLES:
        raise FileSystemFailed(
            f"file system {fs_id} is {fs['Lifecycle']}: {_failure(fs)}",
            file_system_id=fs_id,
            lifecycle=fs["Lifecycle"],
        )
    repository = fs.get("LustreConfiguration", {}).get("DataRepositoryConfiguration", {})
    if repository.get("Lifecycle") in FAILED_LIFECYCLES:
        raise FileSystemFailed(
            f"the S3 link (ImportPath {repository.get('ImportPath')}) of {fs_id} is {repository['Lifecycle']}: "
            f"{repository.get('FailureDetails', {}).get('Message') or 'FSx gave no details'}",
            file_system_id=fs_id,
            lifecycle=repository["Lifecycle"],
        )
    links: list[LinkState] = []
    if fs.get("Lifecycle") == "AVAILABLE":
        links = ensure_links(fsx, ddb, settings, job, fs)
    ready = fs.get("Lifecycle") == "AVAILABLE" and all(link.lifecycle == "AVAILABLE" for link in links)
    if not ready and polls >= poll["max_polls"]:
        pending = [f"{link.path} {link.lifecycle}" for link in links if link.lifecycle != "AVAILABLE"]
        raise FileSystemFailed(
            f"file system {fs_id} is still not ready after {polls} checks (file system {fs.get('Lifecycle')}"
            + (f"; links: {', '.join(pending)}" if pending else "")
            + ")",
            file_system_id=fs_id,
            lifecycle=fs.get("Lifecycle"),
        )
    wait = next_wait(polls, poll)
    if links and not previous.links:
        # the associations were just created: their import of a small prefix ends within seconds, so look soon
        wait = max(1, wait // LINK_FIRST_LOOK_SHARE)
    preloading = False
    if ready and job.launch.preload is not None:
        warm = Run.parse(document, "filesystem", "network")
        state, wait = preload.advance(
            warm, sagemaker=sagemaker, ddb=ddb, settings=settings, sts=sts, polls=polls, poll=poll
        )
        preloading = state != "AVAILABLE"
    result = _result(
        job,
        fs,
        created=previous.created,
        polls=polls,
        wait_seconds=wait,
        links=links,
        ready=ready and not preloading,
    )
    if preloading:
        result.lifecycle = "PRELOADING"
    return result
