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
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core import aws_requests, instance_types
from lustrain_core.aws_errors import CONDITION_FAILED, error_code, training_job_missing
from lustrain_core.config import Settings
from lustrain_core.document import Job, Network
from lustrain_core.steps import records

#: the capacity queue table's items of warm pools are named so (its lines are named `<type>#<purchase option>`)
OFFER_PREFIX = "warm-pool#"
#: WarmPoolStatus.Status values of a pool that still holds its instances
ALIVE = frozenset({"Available", "InUse"})
#: how many runs a pool's chain of ReusedByJob is followed through (a pool lives at most 28 days of runs)
MAX_CHAIN = 1000


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
    took it first)."""
    try:
        answer = ddb.update_item(
            TableName=settings.queue_table,
            Key=_key(pool_shape),
            UpdateExpression="REMOVE offer SET claimed_by = :job",
            ConditionExpression="attribute_exists(offer)",
            ExpressionAttributeValues={":job": {"S": job_id}},
            ReturnValues="ALL_OLD",
        )
    except ClientError as exc:
        if error_code(exc) == CONDITION_FAILED:
            return None
        raise
    found = records.from_item(answer.get("Attributes") or {})
    taken = found.get("offer")
    return dict(taken) if isinstance(taken, dict) else None


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
    item = ddb.get_item(TableName=settings.queue_table, Key=_key(shape(job, settings)), ConsistentRead=True)
    found = records.from_item(item.get("Item") or {})
    return job.spec.compute.instance_count if isinstance(found.get("offer"), dict) else 0


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


def keep_for_pool(
    sagemaker: Any,
    ddb: Any,
    settings: Settings,
    job_id: str,
    record: records.JobRecord,
    resources: list[dict[str, str]],
) -> str | None:
    """Teardown's question for a run with a warm pool: why its network stays (its pool lives), or None (it goes).

    While the pool that descends from the run's last training job is held by that job, the network it runs in is
    offered to the next run of the shape, once (a claimed offer is never offered again by a later sweep). When the
    pool has ended, an offer that still names the run's network is withdrawn."""
    pool_shape = record.warm_pool_shape
    jobs = [r["id"] for r in resources if r["type"] == "training_job"] or [record.warm_pool_job or ""]
    if not pool_shape or not jobs[-1] or sagemaker is None:
        return None
    status, holder = pool_status(sagemaker, jobs[-1])
    claimed = record.warm_pool_network
    network = dict(claimed["network"]) if isinstance(claimed, dict) else _network_entry(resources)
    if network is None:
        return None
    if status not in ALIVE:
        if not isinstance(claimed, dict):
            withdraw(ddb, settings, str(pool_shape), str(network["subnet_id"]))
        return None
    if holder == jobs[-1] and not record.warm_pool_offered:
        owner = str(claimed.get("owner")) if isinstance(claimed, dict) else job_id
        offer(ddb, settings, str(pool_shape), owner=owner, training_job=holder, network=network)
        records.set_fields(ddb, settings.jobs_table, job_id, warm_pool_offered=True, warm_pool_job=jobs[-1])
    return f"the warm pool of training job {holder} ({status}) runs in it"
