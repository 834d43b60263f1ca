"""What a stack's runs still hold, and what it bills an hour: every resource tagged `lustrain:created-by` = the
stack, found kind by kind through the registry of resource kinds (lustrain_core.resources).

The sweeper (steps/sweep.py `find_tagged`) tears down what `stack_resources` finds; `lustrain leftovers` (and
`lustrain cancel --wait`, for one run) reports it with `report`: each resource, the run it belongs to (its
`lustrain:job-id` tag, and that run's record), whether it is kept on purpose, and what it bills an hour at the
price table's list prices.

How each kind is found (AWS gives no one call for "everything tagged so" that covers FSx's and SageMaker's
resources with their states; the Resource Groups Tagging API lists ARNs but neither a job's status nor a pool's):

- the VPC's pieces: EC2's describe calls, filtered by the tag;
- file systems and their links to S3: every one described, with its Tags;
- training jobs (InProgress) and processing jobs (InProgress): listed by status, each one's tags read (neither
  ListTrainingJobs nor ListProcessingJobs filters by tag);
- warm pools: ListTrainingJobs WarmPoolStatusEquals=Available, each job's tags read. A pool InUse bills as the
  InProgress job that took it over (listed as that job), so it is not counted twice;
- a data preparation's own roles: IAM's ListRoles under the stack's path, each one's tags read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core import resources as registry
from lustrain_core.aws_errors import error_code
from lustrain_core.aws_requests import TAG_KEEP
from lustrain_core.launch_plan import TAG_CREATED_BY, TAG_JOB_ID, tag_dict
from lustrain_core.prices import PriceTable
from lustrain_core.resources import Kind
from lustrain_core.steps import filesystem as fsx_step
from lustrain_core.steps import records

#: the kinds the sweeper tears down when it finds them (steps/sweep.py): a processing job and a warm pool end with
#: their run's record (teardown stops the one and ends the other), so only `lustrain leftovers` lists them
SWEPT = tuple(k for k in registry.KINDS if k not in (registry.PROCESSING_JOB, registry.WARM_POOL))


@dataclass(frozen=True)
class Found:
    """One resource of the stack: its kind, the run it belongs to, its id, its tags, and what describing it gave."""

    kind: Kind
    job_id: str
    id: str
    tags: dict[str, str]
    item: dict[str, Any] = field(default_factory=dict, compare=False)


def role_path(region: str, stack_name: str) -> str:
    """Where a stack's data preparations keep their own IAM roles (IAM is global: the region is in the path)."""
    return f"/lustrain/{region}/{stack_name}/"


def stack_resources(
    *,
    ec2: Any,
    fsx: Any,
    sagemaker: Any,
    stack_name: str,
    iam: Any = None,
    region: str | None = None,
    kinds: Iterable[Kind] = registry.KINDS,
) -> Iterator[Found]:
    """Every resource of `kinds` that a run of the stack created and that still exists. IAM roles only with `iam`
    and the stack's `region`."""
    wanted = set(kinds)

    def ours(kind: Kind, resource_id: str, tags: list[dict[str, str]] | None, item: Any) -> Iterator[Found]:
        tagged = tag_dict(tags)
        job_id = tagged.get(TAG_JOB_ID)
        if job_id and tagged.get(TAG_CREATED_BY) == stack_name:
            yield Found(kind, job_id, resource_id, tagged, dict(item))

    for kind in registry.KINDS:
        if kind not in wanted:
            continue
        if kind.tag_filter:
            for item in registry.tagged(ec2, kind, {TAG_CREATED_BY: stack_name}):
                yield from ours(kind, item[kind.id_key], item.get("Tags"), item)
        elif kind is registry.FILE_SYSTEM:
            for page in _pages(fsx, kind.describe):
                for fs in page.get(kind.result_key, []):
                    if registry.present(kind, fs):
                        yield from ours(kind, fs[kind.id_key], fs.get("Tags"), fs)
        elif kind is registry.DATA_REPOSITORY_ASSOCIATION:
            for dra in fsx_step.associations(fsx):
                if registry.present(kind, dra):
                    yield from ours(kind, dra[kind.id_key], dra.get("Tags"), dra)
        elif kind is registry.TRAINING_JOB:
            # only a job still InProgress holds instances
            for summary in _listed(sagemaker, "list_training_jobs", "TrainingJobSummaries", StatusEquals="InProgress"):
                tags = registry.job_tags(sagemaker, summary["TrainingJobArn"])
                yield from ours(kind, summary["TrainingJobName"], tags, summary)
        elif kind is registry.PROCESSING_JOB:
            listed = _listed(sagemaker, "list_processing_jobs", "ProcessingJobSummaries", StatusEquals="InProgress")
            for summary in listed:
                tags = registry.job_tags(sagemaker, summary["ProcessingJobArn"])
                yield from ours(kind, summary["ProcessingJobName"], tags, summary)
        elif kind is registry.WARM_POOL:
            for summary in _listed(
                sagemaker, "list_training_jobs", "TrainingJobSummaries", WarmPoolStatusEquals="Available"
            ):
                tags = registry.job_tags(sagemaker, summary["TrainingJobArn"])
                yield from ours(kind, summary["TrainingJobName"], tags, summary)
        elif kind is registry.IAM_ROLE:
            if iam is None or region is None:
                continue
            for name, tags in roles_under(iam, role_path(region, stack_name)):
                yield from ours(kind, name, tags, {"RoleName": name})
        else:  # a kind added to the registry without a way to find it here
            raise NotImplementedError(f"lustrain_core.leftovers does not know how to find a {kind.name}")


def _pages(client: Any, operation: str, **params: Any) -> Iterator[dict[str, Any]]:
    yield from client.get_paginator(operation).paginate(**params)


def _listed(client: Any, operation: str, key: str, **params: Any) -> Iterator[dict[str, Any]]:
    for page in _pages(client, operation, **params):
        yield from page.get(key, [])


def roles_under(iam: Any, path: str) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """Every role under `path`, with its tags (ListRoles gives none; ListRoleTags reads each); a role deleted
    since it was listed is skipped."""
    for page in _pages(iam, "list_roles", PathPrefix=path):
        for role in page.get("Roles", []):
            tags: list[dict[str, str]] = []
            try:
                for tag_page in _pages(iam, "list_role_tags", RoleName=role["RoleName"]):
                    tags += tag_page.get("Tags", [])
            except ClientError as exc:
                if error_code(exc) == "NoSuchEntity":
                    continue
                raise
            yield str(role["RoleName"]), tags


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class Leftover:
    """One resource a run of the stack still holds."""

    job_id: str
    #: the run's spec name and its record's status ("" and None where the record is gone)
    run: str
    run_status: str | None
    kind: str
    id: str
    #: its state as its service describes it (a job's status, a file system's lifecycle, a pool's status)
    state: str | None
    #: what it bills an hour at list prices; None where the price table has no price for it
    hourly_usd: float | None
    #: kept on purpose (filesystem.keep's `lustrain:keep` tag, or the network a live warm pool needs)
    kept: bool
    note: str
    #: a warm pool's billed seconds so far (ResourceRetainedBillableTimeInSeconds)
    billed_s: int | None = None

    @property
    def bills(self) -> bool:
        """It bills (or may: no price for it here)."""
        return self.hourly_usd is None or self.hourly_usd > 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bills": self.bills}


@dataclass(frozen=True)
class Report:
    stack: str
    prices_as_of: str
    leftovers: list[Leftover]

    @property
    def billing(self) -> list[Leftover]:
        return [left for left in self.leftovers if left.bills]

    @property
    def hourly_usd(self) -> float | None:
        """What the stack's leftovers bill an hour together (None when one of them has no price here)."""
        figures = [left.hourly_usd for left in self.leftovers]
        return None if any(f is None for f in figures) else round(sum(f for f in figures if f is not None), 4)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "prices_as_of": self.prices_as_of,
            "hourly_usd": self.hourly_usd,
            "billing": len(self.billing),
            "leftovers": [left.to_dict() for left in self.leftovers],
        }


def report(
    *,
    ec2: Any,
    fsx: Any,
    sagemaker: Any,
    ddb: Any,
    jobs_table: str,
    stack_name: str,
    iam: Any = None,
    region: str | None = None,
    prices: PriceTable | None = None,
    job_id: str | None = None,
) -> Report:
    """Everything the stack's runs still hold (only run `job_id`'s when given), each with its run, its state and
    what it bills an hour; ordered by run, then kind as the registry lists them."""
    table = prices or PriceTable()
    found = [
        f
        for f in stack_resources(ec2=ec2, fsx=fsx, sagemaker=sagemaker, stack_name=stack_name, iam=iam, region=region)
        if job_id is None or f.job_id == job_id
    ]
    clients = {"ec2": ec2, "fsx": fsx, "sagemaker": sagemaker, "iam": iam}
    described = [(f, item) for f in found if (item := _described(clients[f.kind.service], f)) is not None]
    # the subnets live warm pools run in: the network holding one is kept while the pool lives (steps/warm_pool.py),
    # whichever run's pool it is now (a run that took a pool over uses the network of the run that made it)
    pool_subnets = {
        subnet for f, item in described if f.kind is registry.WARM_POOL
        for subnet in (item.get("VpcConfig") or {}).get("Subnets") or []
    }  # fmt: skip
    pooled = {f.job_id for f, _ in described if f.kind is registry.SUBNET and f.id in pool_subnets}
    # and the network a kept file system lives in stays with it (steps/teardown.py)
    holding = {f.job_id for f, _ in described if f.kind is registry.FILE_SYSTEM and f.tags.get(TAG_KEEP) == "true"}
    run_of = _runs(ddb, jobs_table, {f.job_id for f, _ in described})
    shown: list[Leftover] = []
    for f, item in described:
        name, status = run_of.get(f.job_id, ("", None))
        kept, note = _why_kept(f, pooled, holding)
        pool = item.get("WarmPoolStatus") or {}
        shown.append(
            Leftover(
                job_id=f.job_id,
                run=name,
                run_status=status,
                kind=f.kind.name,
                id=f.id,
                state=registry.state(f.kind, item),
                hourly_usd=_rounded(f.kind.hourly_usd(item, table)),
                kept=kept,
                note=note,
                billed_s=int(pool.get("ResourceRetainedBillableTimeInSeconds") or 0)
                if f.kind is registry.WARM_POOL
                else None,
            )
        )
    order = {kind.name: n for n, kind in enumerate(registry.KINDS)}
    shown.sort(key=lambda left: (left.job_id, order[left.kind], left.id))
    return Report(stack_name, table.as_of, shown)


def _rounded(figure: float | None) -> float | None:
    return None if figure is None else round(figure, 4)


def _described(client: Any, found: Found) -> dict[str, Any] | None:
    """What pricing a resource needs: a listed job's summary lacks its instances, so jobs and pools are described
    (None: gone meanwhile); the rest were listed with everything."""
    if found.kind.single and found.kind is not registry.IAM_ROLE:
        return registry.describe(client, found.kind, found.id)
    return found.item


def _why_kept(found: Found, pooled: set[str], holding: set[str]) -> tuple[bool, str]:
    """Whether a resource is kept on purpose, and why: `pooled` holds the runs whose network a live pool runs in,
    `holding` those whose file system is kept."""
    if found.kind is registry.FILE_SYSTEM and found.tags.get(TAG_KEEP) == "true":
        return True, "kept: filesystem.keep"
    if found.kind.family == "network" and found.job_id in holding:
        return True, "kept: the run's kept file system lives in it"
    if found.kind.family == "network" and found.job_id in pooled:
        return True, "kept while a warm pool runs in it (the next run of its shape reuses both)"
    if found.kind is registry.WARM_POOL:
        return True, "compute.keep_alive_minutes: bills until the pool ends or a run of its shape takes it"
    return False, ""


def _runs(ddb: Any, table: str, job_ids: set[str]) -> dict[str, tuple[str, str | None]]:
    found: dict[str, tuple[str, str | None]] = {}
    for job_id in sorted(job_ids):
        record = records.get(ddb, table, job_id)
        if record is not None:
            found[job_id] = (record.name, record.status)
    return found


def exit_code(shown: Report) -> int:
    """`lustrain leftovers`' exit status: 1 when anything bills, 0 when nothing does."""
    return 1 if shown.billing else 0

