"""teardown: delete exactly what this run created, whatever state it stopped in; safe to run again.

What is deleted: the resources in the job record's ledger plus any found by the run's tags (a step that created
something and failed before recording it). Each one is checked before it is touched: it must carry this job's
`lustrain:job-id` tag and this stack's `lustrain:created-by` tag, so a foreign or untagged resource is never
deleted, even if its id somehow reached the ledger. A file system the spec keeps (filesystem.keep, or its
`lustrain:keep` tag when the job record is gone) and one the run reused (filesystem.file_system_id, never
recorded) stay, and so does the network a kept file system lives in; the report lists what was kept and why.

Order, as AWS's dependencies dictate:
0. training jobs (start_training records {type: training_job, id: <name>} before it creates one): one still
   InProgress is stopped (StopTrainingJob) and waited for until Stopped, because its instances mount the file
   system and hold network interfaces in the subnet; one that already ended (Completed, Failed, Stopped) holds
   nothing and counts as already gone, and so does one that was never created.
1. file systems: when output.to_filesystem, export the output to S3 first (EXPORT_TO_REPOSITORY over the output
   path) and wait for it; wait for any running data repository task (DeleteFileSystem fails while one runs);
   delete the file system's associations, then the file system without a final backup, and wait until it is
   gone (its network interfaces hold the subnet and the security group). An export that failed keeps the file
   system: deleting it would lose results that never reached S3.
2. the network: the security group (its self-referencing rules revoked first, as they reference the group),
   the S3 endpoint, the route table (disassociated first), the subnet, the VPC. DependencyViolation means
   network interfaces are still draining (SageMaker's take minutes): each is retried until the step's time
   budget runs out, then TeardownIncomplete lists what remains so that the state machine retries the step.
The job record ends with status SUCCEEDED or FAILED (from $.error) and the resources still left.

`teardown` is the state machine's step; `teardown_job` is the same work for one job id, which the sweeper
(steps/sweep.py) calls for runs that ended without a complete teardown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core import clients
from lustrain_core import resources as registry
from lustrain_core.aws_errors import error_code, not_found, training_job_missing
from lustrain_core.config import Settings
from lustrain_core.errors import SpecInvalid, TeardownIncomplete
from lustrain_core.spec import validate_spec
from lustrain_core.steps import TAG_CREATED_BY, TAG_JOB_ID, records, tag_dict
from lustrain_core.steps import filesystem as fsx_step

TRAINING_JOB = registry.TRAINING_JOB.name
NETWORK_ORDER = registry.NETWORK_ORDER
#: A training job in these statuses still holds instances (and mounts the file system).
TRAINING_RUNNING = frozenset({"InProgress", "Stopping"})
#: Errors that mean "not yet": something still uses the resource, or FSx is busy with it.
BUSY = frozenset(
    {"DependencyViolation", "BadRequest", "DataRepositoryTaskExecuting", "IncompatibleParameterError"}
)
#: The longest teardown waits in one invocation; the state machine's Retry on TeardownIncomplete waits longer.
MAX_BUDGET_SECONDS = 600.0
#: Kept back from the function's remaining time to write the job record and answer before Lambda stops it.
RESERVE_SECONDS = 30.0
POLL_SETTING = "LUSTRAIN_TEARDOWN_POLL_SECONDS"
DEFAULT_INTERVAL_SECONDS = 2.0
MAX_INTERVAL_SECONDS = 15.0
RUNNING_TASK = frozenset({"PENDING", "EXECUTING", "CANCELING"})
SETTLING_FS = frozenset({"CREATING", "UPDATING"})


@dataclass
class Clock:
    """The step's time budget; `sleep` waits between attempts, doubling up to `max_interval`."""

    budget_seconds: float
    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    max_interval: float = 15.0
    interval: float = 1.0
    started: float = field(default=-1.0)

    def __post_init__(self) -> None:
        self.started = self.now()

    @property
    def left(self) -> float:
        return self.budget_seconds - (self.now() - self.started)

    def wait(self) -> bool:
        """Sleep before the next attempt; False when the budget does not allow another."""
        if self.left <= 0:
            return False
        self.sleep(min(self.interval, max(self.left, 0.0)))
        self.interval = min(self.interval * 2, self.max_interval)
        return True


def clock_for(context: Any, settings: Settings) -> Clock:
    """The clock of one Lambda invocation: its remaining time less a reserve (at most MAX_BUDGET_SECONDS), and
    the first pause between attempts from LUSTRAIN_TEARDOWN_POLL_SECONDS (the local twin sets it small)."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    budget = MAX_BUDGET_SECONDS
    if remaining is not None:
        budget = max(0.0, min(MAX_BUDGET_SECONDS, float(remaining()) / 1000 - RESERVE_SECONDS))
    raw = settings.extra.get(POLL_SETTING, "").strip()
    try:
        interval = float(raw) if raw else DEFAULT_INTERVAL_SECONDS
    except ValueError:
        raise ValueError(f"stack setting {POLL_SETTING}={raw!r} is not a number of seconds") from None
    return Clock(budget, interval=interval, max_interval=max(interval, MAX_INTERVAL_SECONDS))


@dataclass
class Report:
    deleted: list[dict[str, str]] = field(default_factory=list)
    kept: list[dict[str, str]] = field(default_factory=list)
    already_gone: list[dict[str, str]] = field(default_factory=list)
    remaining: list[dict[str, str]] = field(default_factory=list)
    #: training jobs this teardown stopped (a stopped job is not deleted: SageMaker keeps its record)
    stopped: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stopped": self.stopped,
            "deleted": self.deleted,
            "kept": self.kept,
            "already_gone": self.already_gone,
            "remaining": self.remaining,
        }


class Teardown:
    def __init__(
        self,
        *,
        ec2: Any,
        fsx: Any,
        job_id: str,
        settings: Settings,
        clock: Clock,
        sagemaker: Any = None,
    ) -> None:
        self.ec2, self.fsx, self.job_id, self.settings, self.clock = ec2, fsx, job_id, settings, clock
        self._sagemaker = sagemaker
        self.report = Report()

    @property
    def sagemaker(self) -> Any:
        # built only for a run that has a training job: most failures happen before one exists
        if self._sagemaker is None:
            self._sagemaker = clients.client("sagemaker")
        return self._sagemaker

    # ----------------------------------------------------------------- ownership

    def ours(self, tags: list[dict[str, str]] | None) -> bool:
        found = tag_dict(tags)
        return found.get(TAG_JOB_ID) == self.job_id and found.get(TAG_CREATED_BY) == self.settings.stack_name

    def discover(self) -> list[dict[str, str]]:
        """Resources carrying this run's tags (whether or not the ledger has them)."""
        tags = {TAG_JOB_ID: self.job_id, TAG_CREATED_BY: self.settings.stack_name}
        found = [
            {"type": kind.name, "id": str(item[kind.id_key])}
            for kind in registry.KINDS
            if kind.tag_filter
            for item in registry.tagged(self.ec2, kind, tags)
        ]
        found += [
            {"type": registry.FILE_SYSTEM.name, "id": fs["FileSystemId"]}
            for fs in fsx_step.find_by_tag(self.fsx, self.job_id, self.settings.stack_name)
        ]
        return found

    def _describe_ec2(self, kind: str, resource_id: str) -> dict[str, Any] | None:
        return registry.describe(self.ec2, registry.BY_NAME[kind], resource_id)

    # ----------------------------------------------------------------- training jobs

    def _training_job(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.sagemaker.describe_training_job(TrainingJobName=name))
        except ClientError as exc:
            if training_job_missing(exc):
                return None
            raise

    def _training_job_tags(self, arn: str) -> list[dict[str, str]]:
        tags: list[dict[str, str]] = []
        params: dict[str, Any] = {"ResourceArn": arn}
        while True:
            page = self.sagemaker.list_tags(**params)
            tags.extend(page.get("Tags", []))
            if not page.get("NextToken"):
                return tags
            params["NextToken"] = page["NextToken"]

    def stop_training_job(self, name: str) -> str | None:
        """Stop one of the run's training jobs and wait until it has; None when it no longer runs, else why."""
        entry = {"type": TRAINING_JOB, "id": name}
        job = self._training_job(name)
        if job is None:
            self.report.already_gone.append(entry)
            return None
        if not self.ours(self._training_job_tags(job["TrainingJobArn"])):
            self.report.kept.append({**entry, "reason": "not tagged as this job's: never stopped"})
            return None
        asked = False
        if job["TrainingJobStatus"] == "InProgress":
            try:
                self.sagemaker.stop_training_job(TrainingJobName=name)
                asked = True
            except ClientError as exc:
                # it ended (or began stopping) between the two calls: what it is now is read below
                if error_code(exc) != "ValidationException" and not training_job_missing(exc):
                    raise
            job = self._training_job(name) or {"TrainingJobStatus": "Stopped"}
        while job["TrainingJobStatus"] in TRAINING_RUNNING:
            if not self.clock.wait():
                return f"training job {name} is still {job['TrainingJobStatus']}"
            job = self._training_job(name) or {"TrainingJobStatus": "Stopped"}
        (self.report.stopped if asked else self.report.already_gone).append(entry)
        return None

    # ----------------------------------------------------------------- file systems

    def _tasks(self, fs_id: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        params: dict[str, Any] = {"Filters": [{"Name": "file-system-id", "Values": [fs_id]}]}
        while True:
            page = self.fsx.describe_data_repository_tasks(**params)
            found.extend(page.get("DataRepositoryTasks", []))
            if not page.get("NextToken"):
                return found
            params["NextToken"] = page["NextToken"]

    def export(self, fs_id: str, paths: list[str]) -> str | None:
        """Run this job's export of `paths` to S3 and wait for it; None when done, else why not."""
        while True:
            tasks = self._tasks(fs_id)
            mine = [t for t in tasks if t.get("Type") == "EXPORT_TO_REPOSITORY" and self.ours(t.get("Tags"))]
            if any(t["Lifecycle"] == "SUCCEEDED" for t in mine):
                return None
            failed = [t for t in mine if t["Lifecycle"] in {"FAILED", "CANCELED"}]
            running = [t for t in tasks if t["Lifecycle"] in RUNNING_TASK]
            if failed and not running:
                message = failed[-1].get("FailureDetails", {}).get("Message") or failed[-1]["Lifecycle"]
                return f"the export of {', '.join(paths)} to S3 did not succeed ({message})"
            if not running:
                try:
                    self.fsx.create_data_repository_task(
                        Type="EXPORT_TO_REPOSITORY",
                        FileSystemId=fs_id,
                        Paths=[p.lstrip("/") for p in paths],
                        Report={"Enabled": False},
                        ClientRequestToken=f"{self.job_id}-export"[:63],
                        Tags=[
                            {"Key": TAG_JOB_ID, "Value": self.job_id},
                            {"Key": TAG_CREATED_BY, "Value": self.settings.stack_name},
                        ],
                    )
                except ClientError as exc:
                    if error_code(exc) not in BUSY:
                        raise
                continue
            if not self.clock.wait():
                return f"the export of {', '.join(paths)} to S3 is still running"

    def delete_file_system(self, fs_id: str, keep: bool, export_paths: list[str]) -> str | None:
        """Delete one of the run's file systems; None when gone or kept, else what still blocks it."""
        entry = {"type": "file_system", "id": fs_id}
        fs = fsx_step.describe(self.fsx, fs_id)
        if fs is None:
            self.report.already_gone.append(entry)
            return None
        if not self.ours(fs.get("Tags")):
            self.report.kept.append({**entry, "reason": "not tagged as this job's: never deleted"})
            return None
        keep = keep or tag_dict(fs.get("Tags")).get(fsx_step.TAG_KEEP) == "true"
        while fs["Lifecycle"] in SETTLING_FS:
            if not self.clock.wait():
                return f"file system {fs_id} is still {fs['Lifecycle']}"
            fs = fsx_step.describe(self.fsx, fs_id)
            if fs is None:
                self.report.already_gone.append(entry)
                return None
        if export_paths and fs["Lifecycle"] == "AVAILABLE":
            problem = self.export(fs_id, export_paths)
            if problem is not None and "still running" in problem:
                return problem
            if problem is not None:
                self.report.kept.append({**entry, "reason": f"{problem}: kept so the results are not lost"})
                return None
        if keep:
            self.report.kept.append({**entry, "reason": "filesystem.keep is true"})
            return None
        while any(t["Lifecycle"] in RUNNING_TASK for t in self._tasks(fs_id)):
            if not self.clock.wait():
                return f"file system {fs_id} is still running a data repository task"
        for dra in fsx_step.associations(self.fsx, fs_id):
            if dra.get("Lifecycle") != "DELETING":
                self._delete_association(dra["AssociationId"])
        deployment = fs.get("LustreConfiguration", {}).get("DeploymentType", "")
        params: dict[str, Any] = {"FileSystemId": fs_id, "ClientRequestToken": f"{self.job_id}-delete"[:63]}
        if str(deployment).startswith("PERSISTENT"):
            params["LustreConfiguration"] = {"SkipFinalBackup": True}
        while fs is not None and fs["Lifecycle"] != "DELETING":
            try:
                self.fsx.delete_file_system(**params)
                break
            except ClientError as exc:
                if not_found(exc):
                    self.report.already_gone.append(entry)
                    return None
                if error_code(exc) not in BUSY:
                    raise
            if not self.clock.wait():
                return f"file system {fs_id} cannot be deleted yet"
            fs = fsx_step.describe(self.fsx, fs_id)
        self.report.deleted.append(entry)
        while fsx_step.describe(self.fsx, fs_id) is not None:
            if not self.clock.wait():
                return f"file system {fs_id} is still DELETING"
        return None

    def _delete_association(self, association_id: str) -> None:
        entry = {"type": "data_repository_association", "id": association_id}
        try:
            # the S3 side stays; the files in Lustre go with the file system or stay with a reused one
            self.fsx.delete_data_repository_association(
                AssociationId=association_id, DeleteDataInFileSystem=False
            )
        except ClientError as exc:
            if not_found(exc):
                self.report.already_gone.append(entry)
                return
            raise
        self.report.deleted.append(entry)

    def handled(self, entry: dict[str, str]) -> bool:
        return any(
            (r["type"], r["id"]) == (entry["type"], entry["id"])
            for r in self.report.deleted + self.report.already_gone + self.report.kept
        )

    def delete_association(self, association_id: str, owned_fs: set[str]) -> None:
        """A link the run made on a file system it did not create (a reused one gets its output link removed).

        Links on the run's own file systems went with them, or stay with a kept one."""
        entry = {"type": "data_repository_association", "id": association_id}
        try:
            found = self.fsx.describe_data_repository_associations(AssociationIds=[association_id])[
                "Associations"
            ]
        except ClientError as exc:
            if not not_found(exc):
                raise
            found = []
        if not found or found[0].get("Lifecycle") == "DELETING":
            self.report.already_gone.append(entry)
            return
        if found[0].get("FileSystemId") in owned_fs:
            self.report.kept.append(
                {**entry, "reason": f"stays with its file system {found[0]['FileSystemId']}"}
            )
            return
        if not self.ours(found[0].get("Tags")):
            self.report.kept.append({**entry, "reason": "not tagged as this job's: never deleted"})
            return
        self._delete_association(association_id)

    # ----------------------------------------------------------------- network

    def _delete_ec2(self, kind: str, item: dict[str, Any]) -> None:
        if kind == "security_group":
            group_id = item["GroupId"]
            for key, revoke in (
                ("IpPermissions", self.ec2.revoke_security_group_ingress),
                ("IpPermissionsEgress", self.ec2.revoke_security_group_egress),
            ):
                own = [
                    {
                        **{k: v for k, v in p.items() if k in {"IpProtocol", "FromPort", "ToPort"}},
                        "UserIdGroupPairs": [{"GroupId": group_id}],
                    }
                    for p in item.get(key, [])
                    if any(pair.get("GroupId") == group_id for pair in p.get("UserIdGroupPairs", []))
                ]
                if own:
                    revoke(GroupId=group_id, IpPermissions=own)
            self.ec2.delete_security_group(GroupId=group_id)
        elif kind == "vpc_endpoint":
            answer = self.ec2.delete_vpc_endpoints(VpcEndpointIds=[item["VpcEndpointId"]])
            failed = answer.get("Unsuccessful", [])
            if failed:
                error = failed[0].get("Error", {})
                raise ClientError(
                    {"Error": {"Code": error.get("Code", ""), "Message": error.get("Message", "")}},
                    "DeleteVpcEndpoints",
                )
        elif kind == "route_table":
            for association in item.get("Associations", []):
                if not association.get("Main") and association.get("RouteTableAssociationId"):
                    self.ec2.disassociate_route_table(AssociationId=association["RouteTableAssociationId"])
            self.ec2.delete_route_table(RouteTableId=item["RouteTableId"])
        elif kind == "subnet":
            self.ec2.delete_subnet(SubnetId=item["SubnetId"])
        elif kind == "vpc":
            self.ec2.delete_vpc(VpcId=item["VpcId"])

    def delete_network(self, resources: list[dict[str, str]]) -> list[str]:
        """Delete the run's network pieces in dependency order, retrying while interfaces drain; what remains."""
        pending = sorted(resources, key=lambda r: NETWORK_ORDER.index(r["type"]))
        while True:
            blocked: list[tuple[dict[str, str], str]] = []
            for entry in pending:
                item = self._describe_ec2(entry["type"], entry["id"])
                if item is None:
                    self.report.already_gone.append(entry)
                    continue
                if not self.ours(item.get("Tags")):
                    self.report.kept.append({**entry, "reason": "not tagged as this job's: never deleted"})
                    continue
                try:
                    self._delete_ec2(entry["type"], item)
                except ClientError as exc:
                    if not_found(exc):
                        self.report.already_gone.append(entry)
                        continue
                    if error_code(exc) not in BUSY:
                        raise
                    blocked.append((entry, error_code(exc)))
                    continue
                self.report.deleted.append(entry)
            if not blocked:
                return []
            pending = [entry for entry, _ in blocked]
            if not self.clock.wait():
                return [f"{e['type']} {e['id']} ({code}: still in use)" for e, code in blocked]


def _unique(resources: list[dict[str, Any]]) -> list[dict[str, str]]:
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for r in resources:
        seen.setdefault((str(r["type"]), str(r["id"])), {"type": str(r["type"]), "id": str(r["id"])})
    return list(seen.values())


def teardown(
    document: dict[str, Any],
    *,
    ec2: Any,
    fsx: Any,
    ddb: Any,
    settings: Settings,
    clock: Clock,
    sagemaker: Any = None,
) -> dict[str, Any]:
    """$.teardown: what was stopped, deleted, kept and already gone; TeardownIncomplete while something remains."""
    if not isinstance(document, dict):
        raise SpecInvalid.one("", document, "the state document must be a JSON object")
    job = document.get("job") or {}
    if not isinstance(job, dict):
        # register_job's result is an object; anything else was written by hand and names no run to clean up.
        # SpecInvalid, not TeardownIncomplete: waiting an hour of retries would not make it valid.
        raise SpecInvalid.one("job", job, "the object register_job returned, with job_id")
    status = "FAILED" if document.get("error") else "SUCCEEDED"
    job_id = job.get("job_id")
    if not job_id or job.get("duplicate"):
        # nothing was registered (an invalid spec) or the run is a duplicate: the original run owns the resources
        return {**Report().to_dict(), "job_id": job_id, "status": status}
    return teardown_job(
        str(job_id),
        status=status,
        error=document.get("error"),
        fallback_spec=job.get("spec"),
        ec2=ec2,
        fsx=fsx,
        ddb=ddb,
        sagemaker=sagemaker,
        settings=settings,
        clock=clock,
    )


def teardown_job(
    job_id: str,
    *,
    status: str,
    error: dict[str, Any] | None,
    ec2: Any,
    fsx: Any,
    ddb: Any,
    settings: Settings,
    clock: Clock,
    sagemaker: Any = None,
    fallback_spec: dict[str, Any] | None = None,
    found: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """Tear down one job's resources: its ledger, what carries its tags, and `found` (resources a caller found
    by their tags, such as the sweeper's training jobs). The job record, when there is one, gets `status`,
    `error` and the resources still left. TeardownIncomplete while something remains."""
    record = records.get(ddb, settings.jobs_table, job_id) or {}
    spec_doc = record.get("spec") or fallback_spec
    keep = bool(validate_spec(spec_doc).filesystem.keep) if spec_doc else False
    export = record.get("export_on_teardown") or {}

    work = Teardown(ec2=ec2, fsx=fsx, job_id=job_id, settings=settings, clock=clock, sagemaker=sagemaker)
    resources = _unique(list(record.get("resources", [])) + list(found or []) + work.discover())
    problems: list[str] = []
    for entry in resources:
        if entry["type"] == TRAINING_JOB:
            problem = work.stop_training_job(entry["id"])
            if problem:
                problems.append(problem)
    if problems:
        # a running job mounts the file system and holds interfaces in the subnet: everything else waits for it
        problems += [
            f"{r['type']} {r['id']} (waits for the training job)"
            for r in resources
            if r["type"] != TRAINING_JOB
        ]
    else:
        problems += _delete_storage_and_network(work, resources, keep, export)

    gone = {
        (r["type"], r["id"]) for r in work.report.deleted + work.report.already_gone + work.report.stopped
    }
    left = [r for r in resources if (r["type"], r["id"]) not in gone]
    kept = {(r["type"], r["id"]) for r in work.report.kept}
    work.report.remaining = [r for r in left if (r["type"], r["id"]) not in kept]
    changed = (
        bool(work.report.deleted or work.report.stopped)
        or record.get("resources") != left
        or record.get("status") != status
        or bool(error and record.get("error") != error)
    )
    # What earlier teardowns of this job deleted and stopped: a retry after a lost answer finds nothing left, and
    # its report must still say what the run's teardown did.
    previous = record.get("torn_down")
    earlier: dict[str, Any] = previous if isinstance(previous, dict) else {}
    torn_down = {
        "deleted": _merged(earlier.get("deleted"), work.report.deleted),
        "stopped": _merged(earlier.get("stopped"), work.report.stopped),
    }
    if record and changed:
        # a teardown that changed nothing (a repeat, or a sweep that found only kept resources) leaves the
        # record, and its finished_at, as they were
        fields: dict[str, Any] = {
            "resources": left,
            "status": status,
            "finished_at": records.now_iso(),
            "torn_down": torn_down,
        }
        if error:
            fields["error"] = error
        records.set_fields(ddb, settings.jobs_table, job_id, fields)
    # deleted/stopped: what this invocation did; torn_down: all the job's teardowns did, for the run's report
    result = {**work.report.to_dict(), "torn_down": torn_down, "job_id": job_id, "status": status}
    if problems:
        raise TeardownIncomplete(
            f"teardown of {job_id} is not finished; still there: {'; '.join(problems)}",
            remaining=work.report.remaining,
            deleted=work.report.deleted,
            stopped=work.report.stopped,
        )
    return result


def _merged(earlier: Any, now: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Report entries of an earlier teardown, then this one's, each (type, id) once."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in [*(earlier if isinstance(earlier, list) else []), *now]:
        if isinstance(entry, dict) and "type" in entry and "id" in entry:
            seen.setdefault((str(entry["type"]), str(entry["id"])), entry)
    return list(seen.values())


def _delete_storage_and_network(
    work: Teardown, resources: list[dict[str, str]], keep: bool, export: dict[str, Any]
) -> list[str]:
    """File systems (after their export), links on reused ones, then the network; what still blocks."""
    problems: list[str] = []
    for entry in resources:
        if entry["type"] == "file_system":
            paths = list(export.get("paths", [])) if export.get("file_system_id") == entry["id"] else []
            problem = work.delete_file_system(entry["id"], keep, paths)
            if problem:
                problems.append(problem)
    owned_fs = {r["id"] for r in resources if r["type"] == "file_system"}
    reused_fs = export.get("file_system_id")
    if reused_fs and reused_fs not in owned_fs and not problems:
        problem = work.export(reused_fs, list(export.get("paths", [])))
        if problem:
            problems.append(problem)
    if not problems:
        for entry in resources:
            if entry["type"] == "data_repository_association" and not work.handled(entry):
                work.delete_association(entry["id"], owned_fs)
    network = [r for r in resources if r["type"] in NETWORK_ORDER]
    kept_fs = [r["id"] for r in work.report.kept if r["type"] == "file_system" and r["id"] in owned_fs]
    if problems:
        # the file system still holds interfaces in the subnet and the group: the network must wait for it
        problems += [f"{r['type']} {r['id']} (waits for the file system)" for r in network]
    elif kept_fs:
        # a kept file system lives in this network: deleting its subnet or group would strand it
        reason = f"the kept file system {', '.join(kept_fs)} lives in it"
        work.report.kept += [{**r, "reason": reason} for r in network]
    else:
        problems += work.delete_network(network)
    return problems
