"""The job record in DynamoDB (jobs table, pk job_id): what a run is, and what it created, read and written here.

`JobRecord` is the record as a value: its fields are the stored attributes, each named once (the field's name is
the attribute's), and its properties the answers callers ask of a run (is it finished, its attempts and their
training jobs, when it started, was admitted and ended, whether it created its file system: what its cost so far
counts, steps/budget.py). get, require, find_by_execution and scan build it; put_new, set_fields,
add_resources and count_attempt write it. A record lacking a newer attribute reads with the field's default, and
an attribute the model does not know is kept (`other`), so what is stored never changes shape by being read.

`execution` (the state machine's execution name; absent for a direct invoke: DynamoDB refuses an empty string as
an index key) is indexed (`by-execution`) to answer "which run is this execution?" when the execution ends.

`resources` is the ledger teardown works from: each create step appends what it created (list_append), so the
run deletes exactly what it made. Numbers go to DynamoDB as Decimal and come back as int or float.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from lustrain_core.aws_errors import CONDITION_FAILED, error_code
from lustrain_core.errors import SpecInvalid
from lustrain_core.launch_plan import training_job_name
from lustrain_core.spec import is_prepare
from lustrain_core.teams import DEFAULT_TEAM

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


#: How the record writes a moment (created_at, attempt_started_at, finished_at): UTC, to the second.
ISO_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
#: A record with one of these statuses has ended, its teardown included (RUNNING until then).
FINISHED = frozenset({"SUCCEEDED", "FAILED"})
RUNNING = "RUNNING"
#: The record's kind: a training run (what a record without one is) or a data preparation run (kind: prepare in
#: its spec); the state machine chooses the run's path by it ($.job.kind).
TRAIN = "train"
PREPARE = "prepare"
#: The ledger's type of a training job and of a file system (the create steps' RESOURCE_TYPE).
TRAINING_JOB = "training_job"
FILE_SYSTEM = "file_system"


def now_iso() -> str:
    return datetime.now(UTC).strftime(ISO_FORMAT)


def moment(raw: Any) -> float | None:
    """A moment the record wrote, in epoch seconds; None when absent or not one."""
    if not raw:
        return None
    try:
        return datetime.strptime(str(raw), ISO_FORMAT).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def execution_arn(state_machine_arn: str, execution: str) -> str | None:
    """The ARN of a run's execution from the name its record keeps (the state machine's $$.Execution.Name)."""
    if execution.startswith("arn:"):
        return execution
    if not execution or ":stateMachine:" not in state_machine_arn:
        return None
    return state_machine_arn.replace(":stateMachine:", ":execution:", 1) + ":" + execution


def to_attribute(value: Any) -> dict[str, Any]:
    """A JSON-like value as a DynamoDB attribute value (floats through Decimal, as DynamoDB requires)."""
    as_decimals = json.loads(json.dumps(value), parse_float=Decimal)
    return _serializer.serialize(as_decimals)  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | set | tuple):
        return [_plain(v) for v in value]
    return value


def from_item(item: dict[str, Any]) -> dict[str, Any]:
    """A DynamoDB item as plain values (any table's: the queue's and the tokens' items read through it too)."""
    return {key: _plain(_deserializer.deserialize(attr)) for key, attr in item.items()}


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class JobRecord:
    """One run's record in the jobs table. Each field is a stored attribute of the same name; a record written
    before a field existed reads with its default."""

    job_id: str
    #: train | prepare (a record without one is a training run's)
    kind: str = TRAIN
    #: where the spec came from (SpecSource.to_dict: bucket, key, uri, execution, ...)
    source: dict[str, Any] = field(default_factory=dict)
    #: the state machine's execution name; None for a direct invoke
    execution: str | None = None
    #: the team the run belongs to (lustrain_core.teams); a record written before teams is the default team's
    team: str = DEFAULT_TEAM
    #: the spec as register_job normalised it (JobSpec, as JSON), its plan and its launch plan
    spec: dict[str, Any] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    launch: dict[str, Any] = field(default_factory=dict)
    #: RUNNING until the run's teardown writes SUCCEEDED or FAILED (FINISHED)
    status: str = RUNNING
    created_at: str = ""
    #: the ledger: [{type, id}] the run created and its teardown has not deleted
    resources: tuple[dict[str, Any], ...] = ()
    #: attempts start_training counted, and when the last one started
    training_attempts: int = 0
    attempt_started_at: str | None = None
    #: the last attempt next_attempt judged: a later event of that attempt's job is a replay
    judged_attempt: int = 0
    #: the run's place in the capacity queue as check_quota last wrote it (state, pool, queued_s, admitted_at...)
    queue: dict[str, Any] = field(default_factory=dict)
    #: the paths teardown exports from the file system before deleting it (create_filesystem)
    export_on_teardown: dict[str, Any] = field(default_factory=dict)
    #: what every teardown of the run deleted and stopped: {deleted: [...], stopped: [...]}
    torn_down: dict[str, Any] = field(default_factory=dict)
    finished_at: str | None = None
    #: {Error, Cause} of a failed run
    error: dict[str, Any] | None = None
    #: the notice notify sent for the run's end: {message_id, outcome, at}
    notified: dict[str, Any] | None = None
    #: the run's MLflow run id (steps/tracking.py), claimed once: the first invocation to make one keeps it
    mlflow_run: str | None = None
    #: steps/warm_pool.py's: the run's pool shape (create_network), the kept network it claimed (a retried
    #: create_network finds it there, and its teardown offers it on), whether its teardown offered its pool, and
    #: the training job whose pool keeps the network (teardown drops an ended job from the ledger; the sweeper's
    #: later looks follow the pool from here)
    warm_pool_shape: str | None = None
    warm_pool_network: dict[str, Any] | None = None
    warm_pool_offered: bool = False
    warm_pool_job: str | None = None
    #: not stored: the run of an execution register_job never recorded (lustrain.operate builds it)
    unrecorded: bool = field(default=False, metadata={"stored": False})
    #: stored attributes the model does not know (a newer writer's), kept as they are
    other: dict[str, Any] = field(default_factory=dict, compare=False, repr=False, metadata={"stored": False})
    #: the stored attributes this record was read with (what stored() writes back besides the changed fields)
    present: frozenset[str] = field(
        default=frozenset(), compare=False, repr=False, metadata={"stored": False}
    )

    # ------------------------------------------------------------------ reading and writing

    @classmethod
    def stored_names(cls) -> tuple[str, ...]:
        """The stored attributes' names, the one place they are spelled."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("stored", True))

    @classmethod
    def new(cls, **fields: Any) -> JobRecord:
        """A run's first record: its kind, RUNNING, its ledger empty (all three written: the ledger for each create
        step to append to)."""
        return cls(**fields, present=frozenset({"kind", "status", "resources"}))

    @classmethod
    def from_stored(cls, stored: Mapping[str, Any]) -> JobRecord:
        """The record from its attributes as plain values (from_item); a missing or null attribute reads as its
        field's default."""
        names = set(cls.stored_names())
        values = {
            name: _typed(name, stored[name]) for name in names & set(stored) if stored[name] is not None
        }
        return cls(
            **values,
            other={k: v for k, v in stored.items() if k not in names},
            present=frozenset(values),
        )

    def stored(self) -> dict[str, Any]:
        """The attributes as DynamoDB holds them: those the record was read with, those that differ from their
        defaults, and the unknown ones it kept (never a None: an absent attribute stays absent)."""
        shown: dict[str, Any] = dict(self.other)
        for f in dataclasses.fields(self):
            if not f.metadata.get("stored", True):
                continue
            value = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if value is None or (value == default and f.name not in self.present and f.name != "job_id"):
                continue
            shown[f.name] = list(value) if isinstance(value, tuple) else value
        return shown

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-like values (what `lustrain.find_run` shows a notebook): its stored attributes,
        and `unrecorded` for the run of an execution register_job never recorded."""
        return {**self.stored(), **({"unrecorded": True} if self.unrecorded else {})}

    # ------------------------------------------------------------------ what the run is

    @property
    def finished(self) -> bool:
        """The run has ended, its teardown included."""
        return self.status in FINISHED

    @property
    def preparation(self) -> bool:
        """A data preparation run (kind: prepare): by its kind, or its spec's for a record written without one."""
        return self.kind == PREPARE or is_prepare(self.spec)

    @property
    def name(self) -> str:
        """The spec's name ('' for a record without a spec)."""
        return str(self.spec.get("name") or "")

    @property
    def compute(self) -> dict[str, Any]:
        return _mapping(self.spec.get("compute"))

    @property
    def instance_type(self) -> str:
        return str(self.compute.get("instance_type") or "")

    @property
    def instance_count(self) -> int:
        return int(self.compute.get("instance_count") or 0)

    @property
    def budget_usd(self) -> float | None:
        """budget.max_usd, or None when the spec sets none."""
        budget = _mapping(self.spec.get("budget")).get("max_usd")
        return float(budget) if budget is not None else None

    @property
    def max_steps(self) -> int | None:
        """The code's max_steps hyperparameter, when it is a whole number."""
        wanted = _mapping(_mapping(self.spec.get("code")).get("hyperparameters")).get("max_steps")
        return int(wanted) if isinstance(wanted, int | float | str) and str(wanted).isdigit() else None

    @property
    def quota(self) -> dict[str, Any]:
        """The plan's quota check (plan.quota)."""
        return _mapping(self.plan.get("quota"))

    @property
    def estimated_usd(self) -> float:
        """What the plan estimated the run to cost before launch (plan.cost.total_usd; 0 without a plan)."""
        return float(_mapping(self.plan.get("cost")).get("total_usd") or 0.0)

    @property
    def planned_throughput_mb_s(self) -> tuple[float, float]:
        """(what the plan provisions of the file system's throughput, what the GPUs demand of it), in MB/s."""
        fs = _mapping(self.plan.get("filesystem"))
        return float(fs.get("throughput_mb_s") or 0.0), float(fs.get("demand_mb_s") or 0.0)

    @property
    def training_plan(self) -> dict[str, Any] | None:
        """compute.training_plan as register_job found it (the launch plan's training_plan), or None."""
        return _mapping(self.launch.get("training_plan")) or None

    @property
    def checkpoint_s3_uri(self) -> str | None:
        """Where the run's checkpoints go (the launch plan's), None for a record without a launch plan."""
        uri = self.launch.get("checkpoint_s3_uri")
        return str(uri) if uri else None

    @property
    def spec_uri(self) -> str | None:
        """The s3:// URI of the dropped spec, None for a spec given inline."""
        uri = self.source.get("uri")
        return str(uri) if uri else None

    @property
    def error_name(self) -> str | None:
        """The error's name (error.Error) of a run that failed with one."""
        return str(self.error["Error"]) if self.error and self.error.get("Error") else None

    @property
    def cause(self) -> str | None:
        """The error's cause as recorded (error.Cause), None without one."""
        return str(self.error["Cause"]) if self.error and self.error.get("Cause") is not None else None

    @property
    def notice_sent(self) -> str | None:
        """The message id of the notice notify sent for the run's end (notified.message_id), None before."""
        sent = self.notified.get("message_id") if isinstance(self.notified, Mapping) else None
        return str(sent) if sent else None

    def execution_arn(self, state_machine_arn: str) -> str | None:
        """The ARN of the run's execution, None for a direct invoke (or a machine ARN that is not one)."""
        return execution_arn(state_machine_arn, self.execution) if self.execution else None

    def resources_of(self, kind: str) -> list[str]:
        """The ids the ledger holds of one type, oldest first."""
        return [str(r["id"]) for r in self.resources if isinstance(r, Mapping) and r.get("type") == kind]

    # ------------------------------------------------------------------ its attempts

    @property
    def attempt(self) -> int:
        """The current attempt's number (0 before the first training job)."""
        return self.training_attempts

    @property
    def attempt_judged(self) -> bool:
        """next_attempt has judged the current attempt (or there is none yet)."""
        return self.attempt < 1 or self.judged_attempt >= self.attempt

    def training_job_names(self) -> list[str]:
        """Each attempt's training job, oldest first (attempt n's job is named by start_training's rule)."""
        return [training_job_name(self.name, self.job_id, n) for n in range(1, self.attempt + 1)]

    @property
    def current_training_job(self) -> str | None:
        """The current attempt's training job (None before the first, or for a name SageMaker would refuse)."""
        try:
            return training_job_name(self.name, self.job_id, self.attempt) if self.attempt >= 1 else None
        except ValueError:
            return None

    @property
    def latest_training_job(self) -> str | None:
        """The newest training job the ledger holds."""
        jobs = self.resources_of(TRAINING_JOB)
        return jobs[-1] if jobs else None

    # ------------------------------------------------------------------ its time and cost

    @property
    def started_at(self) -> float | None:
        """When the run was registered, in epoch seconds."""
        return moment(self.created_at)

    @property
    def ended_at(self) -> float | None:
        """When its teardown wrote its end, in epoch seconds (None while it runs)."""
        return moment(self.finished_at)

    @property
    def admitted_at(self) -> float | None:
        """When the capacity queue admitted it, in epoch seconds (None before, or without a queue)."""
        return moment(self.queue.get("admitted_at"))

    @property
    def queue_wait_ends_at(self) -> float | None:
        """While the run waits in the capacity queue: when the time it may still wait runs out (queue.since +
        queue.left_s), in epoch seconds; None once admitted, or without a queue."""
        if self.queue.get("state") != "queued":
            return None
        since = moment(self.queue.get("since"))
        try:
            left = float(self.queue.get("left_s") or 0)
        except (TypeError, ValueError):
            left = 0.0
        return since + left if since is not None else None

    @property
    def preload_max_runtime_s(self) -> float:
        """How long data.preload's warm-up may run before the first attempt (the launch plan's; 0 without one)."""
        warm = self.launch.get("preload")
        try:
            return float(warm["max_runtime_seconds"]) if isinstance(warm, Mapping) else 0.0
        except (KeyError, TypeError, ValueError):
            return 0.0

    @property
    def created_file_system(self) -> bool:
        """The run created a file system (its ledger holds one, or its teardown deleted one), rather than mount
        one the spec names."""
        deleted = self.torn_down.get("deleted") or []
        ledger = [*self.resources, *(deleted if isinstance(deleted, list) else [])]
        given = _mapping(self.spec.get("filesystem")).get("file_system_id")
        return not given and any(isinstance(r, Mapping) and r.get("type") == FILE_SYSTEM for r in ledger)


#: the fields that hold a mapping (a stored value of another type reads as the empty one)
_MAPPINGS = frozenset({"source", "spec", "plan", "launch", "queue", "export_on_teardown", "torn_down"})


def _typed(name: str, value: Any) -> Any:
    """A stored value as its field holds it."""
    if name == "resources":
        return tuple(r for r in value if isinstance(r, Mapping)) if isinstance(value, list | tuple) else ()
    if name in _MAPPINGS:
        return _mapping(value)
    if name in {"training_attempts", "judged_attempt"}:
        try:
            return int(value or 0)
        except (TypeError, ValueError):
            return 0
    if name == "warm_pool_offered":
        return bool(value)
    return value


def _checked(fields: Mapping[str, Any]) -> Mapping[str, Any]:
    """`fields` when each names a stored attribute of JobRecord; else ValueError naming the strangers (a new
    attribute is a new field of the model first)."""
    strangers = sorted(set(fields) - set(JobRecord.stored_names()))
    if strangers:
        raise ValueError(f"not attributes of a job record: {', '.join(strangers)} (add them to JobRecord)")
    return fields


def put_new(ddb: Any, table: str, record: JobRecord | Mapping[str, Any]) -> bool:
    """Write a job record unless one with its job_id exists; False when it does (a duplicate)."""
    if not isinstance(record, JobRecord):
        record = JobRecord.from_stored(_checked(record))
    try:
        ddb.put_item(
            TableName=table,
            Item={key: to_attribute(value) for key, value in record.stored().items()},
            ConditionExpression="attribute_not_exists(job_id)",
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            return False
        raise
    return True


def record_of(item: dict[str, Any]) -> JobRecord:
    """A jobs table item as its record."""
    return JobRecord.from_stored(from_item(item))


def get(ddb: Any, table: str, job_id: str) -> JobRecord | None:
    answer = ddb.get_item(TableName=table, Key={"job_id": {"S": job_id}}, ConsistentRead=True)
    item = answer.get("Item")
    return record_of(item) if item else None


def scan(ddb: Any, table: str) -> list[JobRecord]:
    """Every record of the table, in no order (the CLI's and the notebook's list of runs)."""
    return [
        record_of(item)
        for page in ddb.get_paginator("scan").paginate(TableName=table)
        for item in page.get("Items", [])
    ]


def scan_running(ddb: Any, table: str) -> list[JobRecord]:
    """Every record still RUNNING (the sweeper's look for runs no execution carries any more)."""
    return [
        record_of(item)
        for page in ddb.get_paginator("scan").paginate(
            TableName=table,
            FilterExpression="#s = :running",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues={":running": {"S": RUNNING}},
        )
        for item in page.get("Items", [])
    ]


def end_if_running(ddb: Any, table: str, job_id: str, error: dict[str, str]) -> bool:
    """End a record that no teardown will end (no execution carries its run): FAILED with `error`, now; only while
    it is still RUNNING, so a teardown that wrote its own end first keeps it. False when it had ended already."""
    try:
        ddb.update_item(
            TableName=table,
            Key={"job_id": {"S": job_id}},
            UpdateExpression="SET #s = :failed, #e = :error, finished_at = :now",
            ConditionExpression="#s = :running",
            ExpressionAttributeNames={"#s": "status", "#e": "error"},
            ExpressionAttributeValues={
                ":failed": {"S": "FAILED"},
                ":running": {"S": RUNNING},
                ":error": to_attribute(dict(error)),
                ":now": {"S": now_iso()},
            },
        )
    except ClientError as exc:
        if error_code(exc) == CONDITION_FAILED:
            return False
        raise
    return True


def require(ddb: Any, table: str, job_id: str) -> JobRecord:
    """The record of a registered job. Steps that create resources ask first: what they create goes into the
    record's ledger, and a job register_job never wrote (a hand-made document) has none to hold it."""
    record = get(ddb, table, job_id)
    if record is None:
        raise SpecInvalid.one(
            "job.job_id",
            job_id,
            f"no such job in {table}: the state document must come from register_job, which records the job",
        )
    return record


#: The jobs table's index on the execution name (template.yaml, JobsTable).
BY_EXECUTION = "by-execution"


def find_by_execution(ddb: Any, table: str, execution: str) -> JobRecord | None:
    """The record of the run an execution registered, or None (it ended before register_job recorded one, or it
    was a duplicate start, whose record is the original run's)."""
    answer = ddb.query(
        TableName=table,
        IndexName=BY_EXECUTION,
        KeyConditionExpression="#e = :e",
        ExpressionAttributeNames={"#e": "execution"},
        ExpressionAttributeValues={":e": {"S": execution}},
        Limit=2,
    )
    items = answer.get("Items", [])
    return record_of(items[0]) if items else None


def add_resources(ddb: Any, table: str, job_id: str, resources: list[dict[str, str]]) -> None:
    """Append created resources to the ledger; ones already there are not added twice (a retried step)."""
    record = get(ddb, table, job_id)
    known = {(r.get("type"), r.get("id")) for r in (record.resources if record else ())}
    new = [r for r in resources if (r["type"], r["id"]) not in known]
    if not new:
        return
    ddb.update_item(
        TableName=table,
        Key={"job_id": {"S": job_id}},
        UpdateExpression="SET resources = list_append(if_not_exists(resources, :none), :new)",
        ExpressionAttributeValues={":none": {"L": []}, ":new": to_attribute(new)},
        ConditionExpression="attribute_exists(job_id)",
    )


def set_fields(
    ddb: Any, table: str, job_id: str, fields: Mapping[str, Any] | None = None, **named: Any
) -> None:
    """SET top-level attributes of an existing job record, each a JobRecord field's name (`fields`, or as
    keywords: set_fields(ddb, table, job_id, judged_attempt=2)); a None leaves its attribute as it is."""
    fields = {k: v for k, v in _checked({**(fields or {}), **named}).items() if v is not None}
    if not fields:
        return
    names = {f"#f{i}": key for i, key in enumerate(fields)}
    values = {f":v{i}": to_attribute(value) for i, value in enumerate(fields.values())}
    ddb.update_item(
        TableName=table,
        Key={"job_id": {"S": job_id}},
        UpdateExpression="SET " + ", ".join(f"#f{i} = :v{i}" for i in range(len(fields))),
        ExpressionAttributeNames=names,
        ExpressionAttributeValues=values,
        ConditionExpression="attribute_exists(job_id)",
    )



def claim_mlflow_run(ddb: Any, table: str, job_id: str, run_id: str) -> str:
    """Note `run_id` as the run's MLflow run unless one is noted already; the run id noted (ours, or the one an
    invocation made first)."""
    try:
        ddb.update_item(
            TableName=table,
            Key={"job_id": {"S": job_id}},
            UpdateExpression="SET mlflow_run = :r",
            ConditionExpression="attribute_exists(job_id) AND attribute_not_exists(mlflow_run)",
            ExpressionAttributeValues={":r": {"S": run_id}},
        )
        return run_id
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
            raise
    found = get(ddb, table, job_id)
    if found is None or not found.mlflow_run:
        raise ValueError(f"the run {job_id} has no record to note its MLflow run on")
    return found.mlflow_run


def count_attempt(ddb: Any, table: str, job_id: str) -> int:
    """Count one more training attempt in the record, and when it started (the sweeper's deadline runs from
    there); returns the new attempt's number."""
    answer = ddb.update_item(
        TableName=table,
        Key={"job_id": {"S": job_id}},
        UpdateExpression="ADD training_attempts :one SET attempt_started_at = :now",
        ConditionExpression="attribute_exists(job_id)",
        ExpressionAttributeValues={":one": {"N": "1"}, ":now": {"S": now_iso()}},
        ReturnValues="UPDATED_NEW",
    )
    return int(answer["Attributes"]["training_attempts"]["N"])
