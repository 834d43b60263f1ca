"""notify: tell people how the run ended, on the stack's SNS topic (NOTIFY_TOPIC_ARN; none set, nothing sent).

The message reads as a short report (email subscribers see it as is) followed by the same facts as JSON for
programs; the message attributes `outcome` and `job_id` let subscriptions filter without parsing the body.

A run is announced once: the message id is noted on the job record after the publish, so a retry of a notify
whose answer was lost (a Lambda timeout after SNS took the message) finds it and sends nothing more. (A retry
after a failure between the publish and the note can still send a second copy: SNS standard topics take no
deduplication id.)
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core.config import Settings
from lustrain_core.errors import RunCancelled, SpecForbidden, SpecInvalid
from lustrain_core.prices import PriceTable
from lustrain_core.steps import records

#: SNS subjects: printable ASCII, no line breaks, fewer than 100 characters
MAX_SUBJECT = 99
#: register_job's job ids (`<spec name>-<8 hex>`): only such a run has a record to note the notification on
_JOB_ID = re.compile(r"^[a-z0-9-]{1,40}-[0-9a-f]{8}$")


def cause_text(cause: Any) -> str:
    """A Cause in words. A Catch's Cause is often a Lambda error as JSON ({"errorType", "errorMessage",
    "stackTrace", ...}): its message (the stack trace stays in the function's log); a Fail state's Cause may be a
    caught error as JSON ({"Error", "Cause"}): its name and its cause, in words."""
    if isinstance(cause, str):
        try:
            parsed = json.loads(cause)
        except json.JSONDecodeError:
            return cause
        if isinstance(parsed, dict) and parsed.get("errorMessage"):
            return str(parsed["errorMessage"])
        if isinstance(parsed, dict) and parsed.get("Error"):
            inner = cause_text(parsed.get("Cause"))
            return f"{parsed['Error']}: {inner}" if inner else str(parsed["Error"])
    return str(cause) if cause is not None else ""


def _subject(outcome: str, job_id: str) -> str:
    text = f"lustrain: {job_id} {outcome}"
    printable = "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in text)
    return printable[:MAX_SUBJECT]


def _object(value: Any) -> dict[str, Any]:
    """A part of the document that should be a JSON object; anything else counts as absent (notify reports
    whatever state the run ended in, a broken document included, and must not fail on it)."""
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return None


def _billed_compute_usd(spec: dict[str, Any], billable_seconds: Any) -> float | None:
    """BillableTimeInSeconds x instance count x the on-demand hourly price (spot savings already show in the time)."""
    compute = _object(spec.get("compute"))
    seconds, count = _number(billable_seconds), _number(compute.get("instance_count", 1))
    if seconds is None or count is None:
        return None
    return PriceTable().billed_compute_usd(str(compute.get("instance_type")), count, seconds)


def summary(document: dict[str, Any]) -> dict[str, Any]:
    """The facts of a finished run, from its state document."""
    document = _object(document)
    job = _object(document.get("job"))
    spec = _object(job.get("spec"))
    error = _object(document.get("error")) or None
    training = _object(document.get("training"))
    teardown = _object(document.get("teardown"))
    cost = _object(_object(job.get("plan")).get("cost"))
    source = _object(job.get("source"))
    dropped = source.get("uri") or _started_from(document)
    refused = not job.get("job_id") and error is not None and error.get("Error") in REFUSALS
    return {
        "job_id": str(job.get("job_id") or (f"the spec {dropped}" if dropped else None) or "unknown job"),
        "outcome": "refused" if refused else _outcome(error),
        "spec_name": spec.get("name"),
        "spec_source": dropped
        or (f"inline start of execution {source['execution']}" if source.get("execution") else None),
        "execution": document.get("execution") or source.get("execution"),
        "error": error.get("Error") if error else None,
        "cause": cause_text(error.get("Cause")) if error else None,
        "training_job_name": training.get("training_job_name"),
        "archive_s3_uri": training.get("archive_s3_uri"),
        "manifest_s3_uri": training.get("manifest_s3_uri"),
        "metrics": _object(training.get("metrics")),
        # all the run's teardowns deleted: a retried teardown (its first answer lost) itself deleted nothing
        "stopped": _listed(_object(teardown.get("torn_down")).get("stopped"))
        or _listed(teardown.get("stopped")),
        "deleted": _listed(_object(teardown.get("torn_down")).get("deleted"))
        or _listed(teardown.get("deleted")),
        "kept": _listed(teardown.get("kept")),
        "remaining": _listed(teardown.get("remaining")),
        # a teardown that failed leaves its own {Error, Cause} where its report would be
        "teardown_error": (
            f"{teardown['Error']}: {cause_text(teardown.get('Cause'))}" if teardown.get("Error") else None
        ),
        "estimated_cost_usd": _number(cost.get("total_usd")),
        "billed_compute_usd": _billed_compute_usd(spec, training.get("billable_seconds")),
        # what the failed attempts before the last one cost (next_attempt's count), and the budget they count against
        "earlier_attempts_usd": _number(_object(document.get("recovery")).get("spent_usd")),
        "budget_usd": _number(_object(spec.get("budget")).get("max_usd")),
        "prices_as_of": cost.get("prices_as_of"),
    }


#: The errors register_job refuses a spec with, before anything exists.
REFUSALS = frozenset({SpecInvalid.__name__, SpecForbidden.__name__})


def _started_from(document: dict[str, Any]) -> str | None:
    """Where a run's spec came from when register_job recorded nothing: the execution's input is still the
    document (an S3 "Object Created" event, {"spec_s3_uri": ...} or an inline {"spec": {...}})."""
    detail = _object(document.get("detail"))
    bucket, key = _object(detail.get("bucket")).get("name"), _object(detail.get("object")).get("key")
    if isinstance(bucket, str) and isinstance(key, str):
        return f"s3://{bucket}/{key}"
    if isinstance(document.get("spec_s3_uri"), str):
        return str(document["spec_s3_uri"])
    name = _object(document.get("spec")).get("name")
    return f"inline spec {name!r}" if isinstance(name, str) else None


#: The errors that end a run someone stopped (steps/execution_end.py records them).
CANCELLED = frozenset({RunCancelled.__name__})


def _outcome(error: dict[str, Any] | None) -> str:
    if not error:
        return "succeeded"
    return "cancelled" if error.get("Error") in CANCELLED else "failed"


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _resources(entries: list[Any]) -> str:
    shown = [f"{e.get('type')} {e.get('id')}" if isinstance(e, dict) else str(e) for e in entries]
    return ", ".join(shown) or "none"


def message(facts: dict[str, Any]) -> str:
    lines = [f"lustrain run {facts['job_id']} {facts['outcome']}."]
    if facts["spec_source"]:
        lines.append(f"Spec: {facts['spec_source']}")
    if facts["error"]:
        lines.append(f"Error: {facts['error']}: {facts['cause']}")
    if facts["training_job_name"]:
        lines.append(f"Training job: {facts['training_job_name']}")
    if facts["archive_s3_uri"]:
        lines.append(f"Archive: {facts['archive_s3_uri']} (manifest: {facts['manifest_s3_uri']})")
    if facts["metrics"]:
        lines.append("Final metrics: " + ", ".join(f"{k}={v}" for k, v in sorted(facts["metrics"].items())))
    if facts["stopped"]:
        lines.append(f"Teardown stopped: {_resources(facts['stopped'])}")
    lines.append(f"Teardown deleted: {_resources(facts['deleted'])}")
    lines.append(f"Teardown kept: {_resources(facts['kept'])}")
    if facts["remaining"]:
        lines.append(f"Still there (delete by hand): {_resources(facts['remaining'])}")
    if facts["teardown_error"]:
        lines.append(f"Teardown did not finish: {facts['teardown_error']}")
    if facts["estimated_cost_usd"] is not None:
        lines.append(
            f"Estimated cost before launch: ${facts['estimated_cost_usd']:,.2f} (prices as of {facts['prices_as_of']})"
        )
    if facts["billed_compute_usd"] is not None:
        lines.append(f"Compute billed (list price x billable time): ${facts['billed_compute_usd']:,.2f}")
    if facts["earlier_attempts_usd"]:
        lines.append(f"Earlier attempts billed: ${facts['earlier_attempts_usd']:,.2f}")
    if facts["budget_usd"] is not None:
        lines.append(f"Budget: ${facts['budget_usd']:,.2f} (budget.max_usd)")
    return "\n".join(lines) + "\n\n" + json.dumps(facts, indent=2, sort_keys=True, default=str)


def _registered_job_id(document: Any) -> str | None:
    job = _object(_object(document).get("job"))
    job_id = job.get("job_id")
    return job_id if isinstance(job_id, str) and _JOB_ID.fullmatch(job_id) else None


def notify(document: dict[str, Any], *, sns: Any, settings: Settings, ddb: Any = None) -> dict[str, Any]:
    """Publish the run's outcome; returns $.notify ({message_id, outcome}); message_id None when no topic is set.

    With `ddb`, a run already announced (its record notes the message) is not announced again."""
    facts = summary(document)
    if not settings.notify_topic_arn:
        return {"message_id": None, "outcome": facts["outcome"], "skipped": "no NOTIFY_TOPIC_ARN"}
    job_id = _registered_job_id(document) if ddb is not None else None
    if job_id is not None:
        found = records.get(ddb, settings.jobs_table, job_id)
        sent = _object(found.notified if found is not None else None)
        if sent.get("message_id"):
            return {"message_id": sent["message_id"], "outcome": facts["outcome"], "already_sent": True}
    answer = sns.publish(
        TopicArn=settings.notify_topic_arn,
        Subject=_subject(facts["outcome"], facts["job_id"]),
        Message=message(facts),
        MessageAttributes={
            "outcome": {"DataType": "String", "StringValue": facts["outcome"]},
            "job_id": {"DataType": "String", "StringValue": facts["job_id"]},
        },
    )
    if job_id is not None:
        note = {"message_id": answer["MessageId"], "outcome": facts["outcome"], "at": records.now_iso()}
        try:
            records.set_fields(ddb, settings.jobs_table, job_id, notified=note)
        except ClientError as exc:
            # no record to note it on (a document not from register_job): the message is out all the same
            if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise
    return {"message_id": answer["MessageId"], "outcome": facts["outcome"]}
