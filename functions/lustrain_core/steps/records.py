"""The job record in DynamoDB (jobs table, pk job_id): what a run is, and what it created.

    job_id, source, execution, spec, plan, status, created_at, resources: [{type, id}], export_on_teardown,
    finished_at, error

`execution` (the state machine's execution name; absent for a direct invoke: DynamoDB refuses an empty string as
an index key) is indexed (`by-execution`) to answer "which run is this execution?" when the execution ends.

`resources` is the ledger teardown works from: each create step appends what it created (list_append), so the
run deletes exactly what it made. Numbers go to DynamoDB as Decimal and come back as int or float.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from lustrain_core.errors import SpecInvalid

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


#: How the record writes a moment (created_at, attempt_started_at, finished_at): UTC, to the second.
ISO_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
#: A record with one of these statuses has ended, its teardown included (RUNNING until then).
FINISHED = frozenset({"SUCCEEDED", "FAILED"})


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
    return {key: _plain(_deserializer.deserialize(attr)) for key, attr in item.items()}


def put_new(ddb: Any, table: str, record: dict[str, Any]) -> bool:
    """Write a job record unless one with its job_id exists; False when it does (a duplicate)."""
    try:
        ddb.put_item(
            TableName=table,
            Item={key: to_attribute(value) for key, value in record.items()},
            ConditionExpression="attribute_not_exists(job_id)",
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            return False
        raise
    return True


def get(ddb: Any, table: str, job_id: str) -> dict[str, Any] | None:
    answer = ddb.get_item(TableName=table, Key={"job_id": {"S": job_id}}, ConsistentRead=True)
    item = answer.get("Item")
    return from_item(item) if item else None


def require(ddb: Any, table: str, job_id: str) -> dict[str, Any]:
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


def find_by_execution(ddb: Any, table: str, execution: str) -> dict[str, Any] | None:
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
    return from_item(items[0]) if items else None


def add_resources(ddb: Any, table: str, job_id: str, resources: list[dict[str, str]]) -> None:
    """Append created resources to the ledger; ones already there are not added twice (a retried step)."""
    record = get(ddb, table, job_id) or {}
    known = {(r.get("type"), r.get("id")) for r in record.get("resources", [])}
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


def set_fields(ddb: Any, table: str, job_id: str, fields: dict[str, Any]) -> None:
    """SET top-level attributes of an existing job record."""
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
