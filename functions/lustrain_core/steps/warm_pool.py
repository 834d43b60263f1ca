"""Warm pools (compute.keep_alive_minutes): the instances of a finished run wait for the next run of its shape.

SageMaker keeps a job's instances for ResourceConfig.KeepAlivePeriodInSeconds after it ends, and moves them to the
next job that matches it ("SageMaker managed warm pools", Matching training jobs): the same RoleArn, InstanceCount,
InstanceType, VolumeKmsKeyId, VolumeSizeInGB, VpcConfig (SecurityGroupIds and Subnets),
EnableInterContainerTrafficEncryption and EnableNetworkIsolation. Every run builds a network of its own, so the
next run can match only if it is given the kept run's subnet and security group. So:

- **The pool keeps its network.** The run's teardown keeps the network while the pool that descends from its
  training job lives (`pool_alive`: WarmPoolStatus Available or InUse, following ReusedByJob through the runs that
  took it over), and offers it (`offer`): one item per shape in the capacity queue table (pool_name
  `warm-pool#<shape>`), holding the network and the job whose pool waits.
- **The next run of the same shape takes it, once.** create_network claims the offer with one conditional update
  (`claim`): two runs never share a subnet sized for one. The claiming run uses the network and owns none of it:
  the run that created it stays its owner (the resources carry its tags and ledger).
- **A claim survives a lost answer.** The claim marks the offer with the claiming run (`offer.claimed_by`) under
  the condition that no other run marked it: the same run claiming again (create_network retried after its first
  answer was lost) succeeds and gets the same offer back.
- **Nothing bills after a run that did not succeed.** SageMaker keeps the pool of a Stopped job, and of one that
  Failed with an algorithm or client error, as it keeps a Completed one's ("SageMaker managed warm pools";
  StopTrainingJob on a cancel, a budget or a deadline leaves one). The teardown of a run that ends FAILED (a
  failure, a cancel, a budget, an execution that aborted or timed out: steps/execution_end.py) ends its pool with
  UpdateTrainingJob ResourceConfig.KeepAlivePeriodInSeconds=0 (the guide's "To manually terminate a warm pool, set
  KeepAlivePeriodInSeconds to 0"; allowed once the job is complete and the pool Available), unless a run of the
  same shape waits in the capacity queue and has not chosen its network yet: then the pool is offered to it, and
  the sweeper's later teardowns end it once no such run waits and the offer is still unclaimed (withdrawn under a
  condition first, so a claim made meanwhile wins). A failed run's claim on another run's pool that its own job
  never took is given back to the next run of the shape. A run that succeeded offers its pool as ever.
- **The network goes when the pool ends.** The owner's teardown (the sweeper retries it on every sweep) deletes the
  network once the pool is Terminated, and withdraws the offer that still names it. AWS documents no EventBridge
  event for a change of WarmPoolStatus (the training job's state change events come with TrainingJobStatus), so
  the sweeper's polling is what notices the end.

A run's file system is not part of a pool's shape: it is deleted with its run as ever (or kept by
filesystem.keep, where the network then stays for it too). Warm pools cannot be used with spot (the spec refuses
it), and a pool needs the "<type> for training warm pool usage" quota, 0 by default (check_quota refuses a run
whose pool would not fit: SageMaker would run the job and silently keep no pool).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core import aws_requests, instance_types
from lustrain_core.aws_errors import CONDITION_FAILED, NOT_FOUND_CODES, error_code, training_job_missing
from lustrain_core.config import Settings
from lustrain_core.document import Job, Network
from lustrain_core.errors import SpecInvalid
from lustrain_core.steps import records

#: the capacity queue table's items of warm pools are named so (its lines are named `<type>#<purchase option>`)
OFFER_PREFIX = "warm-pool#"
#: WarmPoolStatus.Status values of a pool that still holds its instances
ALIVE = frozenset({"Available", "InUse"})
#: how many runs a pool's chain of ReusedByJob is followed through (a pool lives at most 28 days of runs)
MAX_CHAIN = 1000
#: UpdateTrainingJob's ResourceConfig that ends a warm pool now (SageMaker Developer Guide, "Use SageMaker AI managed
#: warm pools": "To manually terminate a warm pool, set the KeepAlivePeriodInSeconds value to 0"; botocore's
#: ResourceConfigForUpdate allows 0..21600)
END_POOL = {"KeepAlivePeriodInSeconds": 0}
#: the teardown record's list (JobRecord.torn_down) of the training jobs whose pool a teardown of the run ended
ENDED = "warm_pools_ended"


def quota_name(instance_type: str) -> str:
    """The Service Quotas name of the warm pool quota of an instance type (0 until an increase is granted)."""
    return instance_types.warm_pool_quota_name(instance_type)


def shape(job: Job, settings: Settings) -> str:
    """What a pool is reused by: the matching criteria SageMaker lists, as aws_requests.training_job sends them, but
    for the VPC (which the offer carries), and what the kept network must serve beside them: the zone asked for, the
    subnet's size and the secrets' interface endpoints."""
    resources = aws_requests.resource_config(job.launch, settings)
    resources.pop("KeepAlivePeriodInSeconds", None)
    key = {
        "role": settings.sagemaker_role_arn,
        "resources": resources,
        "encryption": aws_requests.inter_container_encryption(settings),
        "zone": job.spec.network.availability_zone,
        "secrets": sorted(job.spec.code.secret_services),
        "subnet": str(job.planned.network.subnet_cidr),
        "region": settings.region,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _key(pool_shape: str) -> dict[str, Any]:
    return {"pool_name": {"S": OFFER_PREFIX + pool_shape}}


def offer(
    ddb: Any, settings: Settings, pool_shape: str, *, owner: str, training_job: str, network: dict[str, Any]
) -> None:
    """Offer a kept network to the next run of the shape (a later offer of the shape replaces an earlier one,
    whose network then goes when its own pool ends)."""
    value = {
        "owner": owner,
        "training_job": training_job,
        "network": network,
        "offered_at": records.now_iso(),
    }
    ddb.update_item(
        TableName=settings.queue_table,
        Key=_key(pool_shape),
        UpdateExpression="SET offer = :offer",
        ExpressionAttributeValues={":offer": records.to_attribute(value)},
    )


def claim(ddb: Any, settings: Settings, pool_shape: str, job_id: str) -> dict[str, Any] | None:
    """Take the shape's offer for this run, atomically: the offer, or None when there is none (or another run
    took it first). The offer stays, marked `claimed_by` the run, so that a claim repeated by the same run (its
    first answer lost) succeeds and returns the same offer, while any other run's fails."""
    try:
        answer = ddb.update_item(
            TableName=settings.queue_table,
            Key=_key(pool_shape),
            UpdateExpression="SET offer.claimed_by = :job",
            ConditionExpression="attribute_exists(offer) AND "
            "(attribute_not_exists(offer.claimed_by) OR offer.claimed_by = :job)",
            ExpressionAttributeValues={":job": {"S": job_id}},
            ReturnValues="ALL_NEW",
        )
    except ClientError as exc:
        if error_code(exc) == CONDITION_FAILED:
            return None
        raise
    found = records.from_item(answer.get("Attributes") or {})
    taken = found.get("offer")
    return dict(taken) if isinstance(taken, dict) else None


def current_offer(ddb: Any, settings: Settings, pool_shape: str) -> dict[str, Any] | None:
    """The shape's offer as the table holds it now (claimed or not), or None."""
    item = ddb.get_item(TableName=settings.queue_table, Key=_key(pool_shape), ConsistentRead=True)
    found = records.from_item(item.get("Item") or {}).get("offer")
    return dict(found) if isinstance(found, dict) else None


def _change_offer(
    ddb: Any, settings: Settings, pool_shape: str, expression: str, condition: str, **values: str
) -> bool:
    """One conditional change of the shape's offer; False when its condition no longer held."""
    try:
        ddb.update_item(
            TableName=settings.queue_table,
            Key=_key(pool_shape),
            UpdateExpression=expression,
            ConditionExpression=condition,
            ExpressionAttributeValues={f":{k}": {"S": v} for k, v in values.items()},
        )
    except ClientError as exc:
        if error_code(exc) == CONDITION_FAILED:
            return False
        raise
    return True


def withdraw_unclaimed(ddb: Any, settings: Settings, pool_shape: str, training_job: str) -> bool:
    """Withdraw the offer of a training job's pool unless a run claimed it: True when withdrawn (no run can take
    the pool any more), False when it was claimed, or no longer names that job."""
    return _change_offer(
        ddb,
        settings,
        pool_shape,
        "REMOVE offer",
        "offer.training_job = :job AND attribute_not_exists(offer.claimed_by)",
        job=training_job,
    )


def give_back(ddb: Any, settings: Settings, pool_shape: str, job_id: str, training_job: str) -> bool:
    """A run that claimed an offer ends without taking the pool over: the offer is open again to the next run of
    the shape (True), unless it changed meanwhile."""
    return _change_offer(
        ddb,
        settings,
        pool_shape,
        "REMOVE offer.claimed_by",
        "offer.training_job = :pool AND offer.claimed_by = :run",
        pool=training_job,
        run=job_id,
    )


def withdraw(ddb: Any, settings: Settings, pool_shape: str, subnet_id: str) -> None:
    """The pool ended: its network is no longer offered (unless the shape's offer is already another network)."""
    try:
        ddb.update_item(
            TableName=settings.queue_table,
            Key=_key(pool_shape),
            UpdateExpression="REMOVE offer",
            ConditionExpression="offer.#network.subnet_id = :subnet",
            ExpressionAttributeNames={"#network": "network"},
            ExpressionAttributeValues={":subnet": {"S": subnet_id}},
        )
    except ClientError as exc:
        if error_code(exc) != CONDITION_FAILED:
            raise


def offered_instances(ddb: Any, settings: Settings, job: Job) -> int:
    """The instances of a pool offered to the run's shape, which the run will take over (0 when none is)."""
    if not job.launch.keep_alive_seconds:
        return 0
    offered = current_offer(ddb, settings, shape(job, settings))
    return job.spec.compute.instance_count if offered is not None and not offered.get("claimed_by") else 0


def pool_status(sagemaker: Any, training_job: str) -> tuple[str | None, str]:
    """The status of the pool that descends from a training job (following ReusedByJob to the job that holds it
    now) and that job's name; None when no pool was ever kept (or the job is gone)."""
    name = training_job
    for _ in range(MAX_CHAIN):
        try:
            described = sagemaker.describe_training_job(TrainingJobName=name)
        except ClientError as exc:
            if training_job_missing(exc):
                return None, name
            raise
        status = (described.get("WarmPoolStatus") or {}).get("Status")
        reused_by = (described.get("WarmPoolStatus") or {}).get("ReusedByJob")
        if status == "Reused" and reused_by:
            name = str(reused_by)
            continue
        if status is None and described.get("TrainingJobStatus") in ("InProgress", "Stopping"):
            # a job that took the pool over shows InUse; one still starting may show nothing yet: it holds it
            return "InUse", name
        return status, name
    return "InUse", name


def pool_alive(sagemaker: Any, training_job: str) -> bool:
    return pool_status(sagemaker, training_job)[0] in ALIVE


def network_of(offered: dict[str, Any]) -> Network:
    """The network of a claimed offer, as the claiming run's $.network: used, not created, by it."""
    net = dict(offered.get("network") or {})
    return Network(
        vpc_id=net.get("vpc_id"),
        subnet_id=str(net["subnet_id"]),
        security_group_ids=[str(g) for g in net.get("security_group_ids", [])],
        route_table_id=net.get("route_table_id"),
        endpoint_id=net.get("endpoint_id"),
        availability_zone=net.get("availability_zone"),
        created=False,
    )


def _network_entry(resources: list[dict[str, str]]) -> dict[str, Any] | None:
    """A run's own network (from its ledger) as an offer carries it."""
    ids: dict[str, list[str]] = {}
    for r in resources:
        ids.setdefault(r["type"], []).append(r["id"])
    if not ids.get("subnet") or not ids.get("security_group"):
        return None
    return {
        "vpc_id": next(iter(ids.get("vpc", [])), None),
        "subnet_id": ids["subnet"][0],
        "security_group_ids": ids["security_group"],
        "route_table_id": next(iter(ids.get("route_table", [])), None),
    }


def end_pool(sagemaker: Any, training_job: str) -> bool:
    """End a training job's Available warm pool now (UpdateTrainingJob, KeepAlivePeriodInSeconds 0): its instances
    stop billing. False when it has none to end: SageMaker refuses the update of a pool that is no longer
    Available (it ended, or a matching job took it over, meanwhile) and of a job that is gone."""
    try:
        sagemaker.update_training_job(TrainingJobName=training_job, ResourceConfig=dict(END_POOL))
    except ClientError as exc:
        if error_code(exc) == "ValidationException" or error_code(exc) in NOT_FOUND_CODES:
            return False
        raise
    return True


def queued_claimant(ddb: Any, settings: Settings, line: str, pool_shape: str, job_id: str) -> str | None:
    """A run of the shape that waits in the capacity queue's `line` (or was admitted) and has not chosen its network
    yet, so its create_network would claim an offer of the shape: its job id, or None."""
    item = ddb.get_item(TableName=settings.queue_table, Key={"pool_name": {"S": line}}, ConsistentRead=True)
    found = records.from_item(item.get("Item") or {})
    waiting = dict(found.get("waiting") or {})
    # first come, first served: the run that queued first is the one the offer is kept for
    candidates = sorted(waiting, key=lambda j: str((waiting[j] or {}).get("order")))
    candidates += [j for j in dict(found.get("holds") or {}) if j not in waiting]
    for candidate in candidates:
        if candidate == job_id:
            continue
        record = records.get(ddb, settings.jobs_table, candidate)
        if record is None or record.finished or record.warm_pool_shape or record.warm_pool_network:
            continue  # gone, ended, or past create_network (it built or claimed a network already)
        document = {
            "job": {"job_id": candidate, "spec": record.spec, "plan": record.plan, "launch": record.launch}
        }
        try:
            job = Job.from_document(document)
        except SpecInvalid:
            continue  # a record register_job did not finish: no run that could claim
        if job.launch.keep_alive_seconds and shape(job, settings) == pool_shape:
            return str(candidate)
    return None


@dataclass(frozen=True)
class PoolVerdict:
    """Teardown's answer for a run with a warm pool: why its network stays (None: it goes), and the training jobs
    whose pool this teardown ended."""

    reason: str | None = None
    ended: tuple[str, ...] = ()


def keep_for_pool(
    sagemaker: Any,
    ddb: Any,
    settings: Settings,
    job_id: str,
    record: records.JobRecord,
    resources: list[dict[str, str]],
    *,
    failed: bool = False,
    line: str | None = None,
) -> PoolVerdict:
    """Teardown's question for a run with a warm pool: why its network stays (its pool lives), or None (it goes).

    While the pool that descends from the run's last training job is held by that job, the network it runs in is
    offered to the next run of the shape, once (a claimed offer is never offered again by a later sweep). When the
    pool has ended, an offer that still names the run's network is withdrawn.

    A run that ended `failed` offers nothing unless a run of its shape waits in its capacity queue `line`: its pool
    is ended instead (end_pool), and a claim it made on another run's pool that its own job never took is given
    back."""
    pool_shape = record.warm_pool_shape
    if not pool_shape or sagemaker is None:
        return PoolVerdict()
    claimed = record.warm_pool_network if isinstance(record.warm_pool_network, dict) else None
    if failed and claimed is not None and claimed.get("training_job"):
        taken_from = str(claimed["training_job"])
        if pool_status(sagemaker, taken_from)[1] == taken_from:  # its pool never moved to this run's job
            give_back(ddb, settings, str(pool_shape), job_id, taken_from)
    jobs = [r["id"] for r in resources if r["type"] == "training_job"] or [record.warm_pool_job or ""]
    if not jobs[-1]:
        return PoolVerdict()
    status, holder = pool_status(sagemaker, jobs[-1])
    network = dict(claimed["network"]) if claimed is not None else _network_entry(resources)
    if network is None:
        return PoolVerdict()
    ended: tuple[str, ...] = ()
    if failed and status == "Available" and holder == jobs[-1]:
        owner = str(claimed.get("owner")) if claimed is not None else job_id
        if not _handed_on(ddb, settings, str(pool_shape), job_id, record, holder, network, owner, line):
            ended = (holder,) if end_pool(sagemaker, holder) else ()
            status, holder = pool_status(sagemaker, jobs[-1])  # Terminated at once on the twin
            if status in ALIVE:  # still ending: the sweeper's next teardown looks again
                records.set_fields(ddb, settings.jobs_table, job_id, warm_pool_job=jobs[-1])
    if status not in ALIVE:
        if claimed is None:
            withdraw(ddb, settings, str(pool_shape), str(network["subnet_id"]))
        return PoolVerdict(None, ended)
    if holder == jobs[-1] and not record.warm_pool_offered and not failed:
        owner = str(claimed.get("owner")) if claimed is not None else job_id
        offer(ddb, settings, str(pool_shape), owner=owner, training_job=holder, network=network)
        records.set_fields(ddb, settings.jobs_table, job_id, warm_pool_offered=True, warm_pool_job=jobs[-1])
    return PoolVerdict(f"the warm pool of training job {holder} ({status}) runs in it", ended)


def _handed_on(
    ddb: Any,
    settings: Settings,
    pool_shape: str,
    job_id: str,
    record: records.JobRecord,
    holder: str,
    network: dict[str, Any],
    owner: str,
    line: str | None,
) -> bool:
    """Whether a failed run's Available pool goes on to a run of its shape (offered to one still queued, or
    claimed by one already), rather than ending now."""
    ended_before = holder in _ended(record)
    current = current_offer(ddb, settings, pool_shape)
    if current is not None and current.get("training_job") == holder:
        if current.get("claimed_by"):
            return True  # a run of the shape claimed it: its training job takes the pool over
        if line and queued_claimant(ddb, settings, line, pool_shape, job_id):
            return True
        # no run waits for it any more: withdrawn first, so that a claim made meanwhile wins
        return not withdraw_unclaimed(ddb, settings, pool_shape, holder)
    if record.warm_pool_offered and not ended_before:
        # offered, claimed, and a later offer of the shape replaced it: the claimer takes the pool
        return True
    if not ended_before and line and queued_claimant(ddb, settings, line, pool_shape, job_id):
        offer(ddb, settings, pool_shape, owner=owner, training_job=holder, network=network)
        records.set_fields(ddb, settings.jobs_table, job_id, warm_pool_offered=True, warm_pool_job=holder)
        return True
    return False


def _ended(record: records.JobRecord) -> set[str]:
    """The training jobs whose pool an earlier teardown of the run ended (JobRecord.torn_down)."""
    found = (record.torn_down or {}).get(ENDED)
    return {str(name) for name in found} if isinstance(found, list) else set()
