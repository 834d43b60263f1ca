"""teardown: delete exactly what this run created, whatever state it stopped in; safe to run again.

What is deleted: the resources in the job record's ledger plus any found by the run's tags (a step that created
something and failed before recording it). Each one is checked before it is touched: it must carry this job's
`lustrain:job-id` tag and this stack's `lustrain:created-by` tag, so a foreign or untagged resource is never
deleted, even if its id somehow reached the ledger. A file system the spec keeps (filesystem.keep, or its
`lustrain:keep` tag when the job record is gone) and one the run reused (filesystem.file_system_id, never
recorded) stay, and so does the network a kept file system lives in, or a live warm pool runs in (steps/warm_pool.py:
the sweeper's later teardowns delete it once the pool has ended); the report lists what was kept and why. A run
that ends FAILED (a failure, a cancel, its budget, an aborted or timed-out execution) keeps no pool billing: its
teardown ends the pool (UpdateTrainingJob, KeepAlivePeriodInSeconds 0) unless a queued run of its shape takes it
over, and lists the ended pools in `warm_pools_ended`.

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
3. a data preparation's own IAM role (steps/prepare_role), once its network is gone: SageMaker deletes its
   processing instances' network interfaces with it.
The job record ends with status SUCCEEDED or FAILED (from $.error) and the resources still left.

`teardown` is the state machine's step; `teardown_job` is the same work for one job id, which the sweeper
(steps/sweep.py) calls for runs that ended without a complete teardown.
"""

from __future__ import annotations

from typing import Any

from lustrain_core import resources as registry
from lustrain_core.config import Settings
from lustrain_core.errors import SpecInvalid, TeardownIncomplete
from lustrain_core.launch_plan import TAG_CREATED_BY, TAG_JOB_ID
from lustrain_core.spec import is_prepare, validate_spec
from lustrain_core.steps import filesystem as fsx_step
from lustrain_core.steps import queue, records, warm_pool
from lustrain_core.steps.teardown_base import (
    BUSY,
    DEFAULT_INTERVAL_SECONDS,
    JOBS,
    MAX_BUDGET_SECONDS,
    NETWORK_ORDER,
    PROCESSING_JOB,
    TRAINING_JOB,
    Clock,
    Report,
    clock_for,
)
from lustrain_core.steps.teardown_compute import TrainingJobs
from lustrain_core.steps.teardown_identity import ROLE, Roles
from lustrain_core.steps.teardown_network import Network
from lustrain_core.steps.teardown_storage import FileSystems

__all__ = [
    "BUSY",
    "DEFAULT_INTERVAL_SECONDS",
    "MAX_BUDGET_SECONDS",
    "NETWORK_ORDER",
    "TRAINING_JOB",
    "Clock",
    "Report",
    "Teardown",
    "clock_for",
    "teardown",
    "teardown_job",
]


class Teardown(TrainingJobs, FileSystems, Network, Roles):
    """One job's teardown, family by family (teardown_compute, teardown_storage, teardown_network,
    teardown_identity)."""

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
    record = records.get(ddb, settings.jobs_table, job_id)
    spec_doc = (record.spec if record is not None else None) or fallback_spec
    # a data preparation run (kind: prepare) queues for no capacity and has no file system to keep
    preparation = (record is not None and record.preparation) or is_prepare(spec_doc)
    spec = validate_spec(spec_doc) if spec_doc and not preparation else None
    keep = bool(spec.filesystem.keep) if spec is not None else False
    if spec is not None:
        # out of the capacity queue first: a stopped or failed run must not block the runs behind it
        queue.leave(ddb, settings, spec.compute, job_id)
    export = record.export_on_teardown if record is not None else {}

    work = Teardown(ec2=ec2, fsx=fsx, job_id=job_id, settings=settings, clock=clock, sagemaker=sagemaker)
    ledger = [dict(r) for r in record.resources] if record is not None else []
    resources = _unique(ledger + list(found or []) + work.discover() + (work.discover_role() if preparation else []))
    problems: list[str] = []
    ended: list[str] = []
    for entry in resources:
        if entry["type"] == TRAINING_JOB:
            problem = work.stop_training_job(entry["id"])
        elif entry["type"] == PROCESSING_JOB:
            problem = work.stop_processing_job(entry["id"])
        else:
            continue
        if problem:
            problems.append(problem)
    if problems:
        # a running job mounts the file system and holds interfaces in the subnet: everything else waits for it
        problems += [
            f"{r['type']} {r['id']} (waits for the run's jobs)" for r in resources if r["type"] not in JOBS
        ]
    else:
        verdict = (
            warm_pool.keep_for_pool(
                sagemaker,
                ddb,
                settings,
                job_id,
                record,
                resources,
                failed=status == "FAILED",
                line=queue.pool_of(spec.compute) if spec is not None else None,
            )
            if record is not None
            else warm_pool.PoolVerdict()
        )
        ended = list(verdict.ended)
        problems += _delete_storage_and_network(work, resources, keep, export, verdict.reason)
        roles = [r for r in resources if r["type"] == ROLE]
        if problems:
            # SageMaker deletes the processing instances' network interfaces with the run's role
            problems += [f"{r['type']} {r['id']} (waits for the network)" for r in roles]
        else:
            for entry in roles:
                work.delete_role(entry["id"])

    gone = {
        (r["type"], r["id"]) for r in work.report.deleted + work.report.already_gone + work.report.stopped
    }
    left = [r for r in resources if (r["type"], r["id"]) not in gone]
    kept = {(r["type"], r["id"]) for r in work.report.kept}
    work.report.remaining = [r for r in left if (r["type"], r["id"]) not in kept]
    changed = (
        bool(work.report.deleted or work.report.stopped or ended)
        or record is None
        or ledger != left
        or record.status != status
        or bool(error and record.error != error)
    )
    # What earlier teardowns of this job deleted and stopped: a retry after a lost answer finds nothing left, and
    # its report must still say what the run's teardown did.
    earlier = record.torn_down if record is not None else {}
    torn_down: dict[str, Any] = {
        "deleted": _merged(earlier.get("deleted"), work.report.deleted),
        "stopped": _merged(earlier.get("stopped"), work.report.stopped),
    }
    pools_ended = list(dict.fromkeys([*_names(earlier.get(warm_pool.ENDED)), *ended]))
    if pools_ended:
        # the training jobs whose warm pool a teardown of the run ended: a later sweep never offers them
        torn_down[warm_pool.ENDED] = pools_ended
    if record is not None and changed:
        # a teardown that changed nothing (a repeat, or a sweep that found only kept resources) leaves the
        # record, and its finished_at, as they were
        records.set_fields(
            ddb,
            settings.jobs_table,
            job_id,
            resources=left,
            status=status,
            finished_at=records.now_iso(),
            torn_down=torn_down,
            error=error or None,
        )
    # deleted/stopped: what this invocation did; torn_down: all the job's teardowns did, for the run's report;
    # warm_pools_ended: the training jobs whose warm pool this invocation ended (UpdateTrainingJob)
    result = {
        **work.report.to_dict(),
        "warm_pools_ended": ended,
        "torn_down": torn_down,
        "job_id": job_id,
        "status": status,
    }
    if problems:
        raise TeardownIncomplete(
            f"teardown of {job_id} is not finished; still there: {'; '.join(problems)}",
            remaining=work.report.remaining,
            deleted=work.report.deleted,
            stopped=work.report.stopped,
        )
    return result


def _names(earlier: Any) -> list[str]:
    return [str(name) for name in earlier] if isinstance(earlier, list) else []


def _merged(earlier: Any, now: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Report entries of an earlier teardown, then this one's, each (type, id) once."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in [*(earlier if isinstance(earlier, list) else []), *now]:
        if isinstance(entry, dict) and "type" in entry and "id" in entry:
            seen.setdefault((str(entry["type"]), str(entry["id"])), entry)
    return list(seen.values())


def _delete_storage_and_network(
    work: Teardown,
    resources: list[dict[str, str]],
    keep: bool,
    export: dict[str, Any],
    warm_pool_reason: str | None = None,
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
    elif warm_pool_reason:
        # the next run of the pool's shape must find the same subnet and security group to reuse it
        work.report.kept += [{**r, "reason": warm_pool_reason} for r in network]
    else:
        problems += work.delete_network(network)
    return problems
