"""notify: tell people how the run goes: its end on the stack's SNS topic (NOTIFY_TOPIC_ARN; none set, nothing sent),
and each moment of it in the team's chat (steps/notices.py: the stack's NoticeWebhookSecretArn; none set, nothing
posted).

The notify function runs from the state machine's end (`notify`: the run's document) and, where the stack names
a webhook, from EventBridge (`on_event`): the execution's start, stop (cancelled), time-out and death of an
error no Catch sees ("Step Functions Execution Status Change"), each training job's end ("SageMaker Training Job
State Change"), and the capacity queue's moments ("lustrain Run Queue Change", put by check_quota). A notice's
failure to arrive is answered, never raised: the run goes on.

The function can be invoked with any event (by anyone allowed lambda:InvokeFunction, or a rule someone else put on
the bus), so no event's word is posted as it stands: a queue change is told as the run's record has it, an
attempt's end as DescribeTrainingJob has it, and an execution's end (cancelled, timed out, died) only once Step
Functions bears it out (`verified_end`, with on_execution_end's check, steps/executions.py): the execution is one of
this stack's state machine (LUSTRAIN_STATE_MACHINE_ARN), DescribeExecution says it ended with the status the event
gives, at the stop time the event gives, and what the notice says of the end (error, cause) is DescribeExecution's
where it gives them. An end it does not bear out posts nothing; the answer (logged) says why.

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
import time
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core.config import Settings
from lustrain_core.errors import RunCancelled, SpecForbidden, SpecInvalid
from lustrain_core.launch_plan import archive_target
from lustrain_core.prices import PriceTable
from lustrain_core.steps import budget, executions, notices, queue, records
from lustrain_core.steps.events import ENDED, TrainingJobStateChange, classify_failure
from lustrain_core.steps.records import JobRecord
from lustrain_core.steps.training import describe_training_job, ended_attempt

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
    plan = _object(job.get("plan"))
    cost = _object(plan.get("cost"))
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
        # a training run's plan prices it under cost; a data preparation's (prepare_plan.plan_of) as cost_usd
        "estimated_cost_usd": _number(cost.get("total_usd")) if cost else _number(plan.get("cost_usd")),
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


def registered_job_id(document: Any) -> str | None:
    job = _object(_object(document).get("job"))
    job_id = job.get("job_id")
    return job_id if isinstance(job_id, str) and _JOB_ID.fullmatch(job_id) else None


def notify(
    document: dict[str, Any],
    *,
    sns: Any,
    settings: Settings,
    ddb: Any = None,
    secrets: Any = None,
    sagemaker: Any = None,
) -> dict[str, Any]:
    """Publish the run's outcome; returns $.notify ({message_id, outcome}); message_id None when no topic is set.

    With `ddb`, a run already announced (its record notes the message) is not announced again. With `secrets`
    (the notify function's), the end is also posted to the stack's webhook (`chat`: how that went)."""
    facts = summary(document)
    job_id = registered_job_id(document) if ddb is not None else None
    record = records.get(ddb, settings.jobs_table, job_id) if job_id is not None else None
    sent = record.notice_sent if record is not None else None
    if sent:
        return {"message_id": sent, "outcome": facts["outcome"], "already_sent": True}
    chat = None
    if secrets is not None and notices.configured(settings):
        cost = run_cost(record, sagemaker=sagemaker) if record is not None else None
        chat = notices.post(
            notices.ended(facts, cost, settings), secrets=secrets, settings=settings
        ).to_dict()
    if not settings.notify_topic_arn:
        skipped = {"message_id": None, "outcome": facts["outcome"], "skipped": "no NOTIFY_TOPIC_ARN"}
        return {**skipped, "chat": chat} if chat is not None else skipped
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
    published = {"message_id": answer["MessageId"], "outcome": facts["outcome"]}
    return {**published, "chat": chat} if chat is not None else published


def run_cost(record: JobRecord, *, sagemaker: Any, now: float | None = None) -> float | None:
    """The run's cost so far, as `lustrain status` counts it (each attempt's DescribeTrainingJob); None where it
    cannot be told (a notice says "unknown" rather than fail)."""
    if sagemaker is None or not record.job_id:
        return None
    try:
        jobs = [describe_training_job(sagemaker, name) for name in record.training_job_names()]
        return budget.cost_so_far_usd(record, [j for j in jobs if j], time.time() if now is None else now)
    except (ClientError, ValueError, TypeError):
        return None


def _model(record: JobRecord, settings: Settings) -> str:
    """Where the run's model is archived (its training jobs upload it there: launch_plan.model_output_path)."""
    return archive_target(settings, record.job_id)


#: EventBridge's detail types the notify function takes
EXECUTION_CHANGE = "Step Functions Execution Status Change"
TRAINING_CHANGE = "SageMaker Training Job State Change"
QUEUE_CHANGE = queue.CHANGE_DETAIL_TYPE
#: the source of the events lustrain's own functions put (check_quota's queue changes)
SOURCE = queue.CHANGE_SOURCE


def on_event(
    event: dict[str, Any], *, ddb: Any, sagemaker: Any, sfn: Any, secrets: Any, settings: Settings
) -> dict[str, Any]:
    """Post the notice an EventBridge event tells of; what was posted (or why nothing was)."""
    notice = notice_of(event, ddb=ddb, sagemaker=sagemaker, sfn=sfn, settings=settings)
    if isinstance(notice, str):
        return {"posted": False, "reason": notice}
    delivery = notices.post(notice, secrets=secrets, settings=settings)
    return {
        "posted": delivery.delivered,
        "kind": notice.kind,
        "job_id": notice.job_id,
        "chat": delivery.to_dict(),
    }


def notice_of(
    event: dict[str, Any], *, ddb: Any, sagemaker: Any, sfn: Any, settings: Settings
) -> notices.Notice | str:
    """The notice an event tells of, or why it tells none (an event of another kind, run or stack, or an end Step
    Functions does not bear out)."""
    kind, detail = event.get("detail-type"), _object(event.get("detail"))
    if event.get("source") == "aws.states" and kind == EXECUTION_CHANGE:
        return _execution_notice(detail, ddb=ddb, sagemaker=sagemaker, sfn=sfn, settings=settings)
    if event.get("source") == "aws.sagemaker" and kind == TRAINING_CHANGE:
        return _training_notice(detail, ddb=ddb, sagemaker=sagemaker, settings=settings)
    if event.get("source") == SOURCE and kind == QUEUE_CHANGE:
        record = (
            records.get(ddb, settings.jobs_table, str(detail.get("job_id"))) if detail.get("job_id") else None
        )
        if record is None:
            return "the queue change names no run of this stack"
        # anyone allowed PutEvents on the default bus can put this source: the notice says what the run's own
        # record says of its place (check_quota writes it before it announces), never the event's words
        place = record.queue
        if record.finished or not place or place.get("state") != detail.get("state"):
            return (
                f"the queue change says {detail.get('state')!r}, the run's record "
                f"{'says it has ended' if record.finished else repr(place.get('state'))}: not announced"
            )
        cost = run_cost(record, sagemaker=sagemaker)
        return notices.queue_moment(
            record,
            admitted=place.get("state") == "admitted",
            detail=place,
            cost=cost,
            model=_model(record, settings),
            settings=settings,
        )
    return f"not an event the notices tell of: {event.get('source')!r} {kind!r}"


#: the ends of an execution the notices tell of (a SUCCEEDED one is told by the state machine's own notify)
TOLD_ENDS = frozenset({"ABORTED", "TIMED_OUT", "FAILED"})
#: how the answer for an execution end Step Functions does not bear out begins (the handler logs it as a warning)
NOT_VERIFIED = "not verified: "
#: the check of an execution's end, shared with the MLflow logging (steps/executions.py)
verified_end = executions.verified_end


def _execution_notice(
    detail: dict[str, Any], *, ddb: Any, sagemaker: Any, sfn: Any, settings: Settings
) -> notices.Notice | str:
    status, name = detail.get("status"), detail.get("name")
    if not isinstance(name, str) or not name:
        return "the execution change names no execution"
    if status == "RUNNING":
        described = executions.verified_start(detail, sfn=sfn, settings=settings)
        if isinstance(described, str):
            return NOT_VERIFIED + described
        # the input Step Functions holds, not the event's copy of it
        try:
            started_with = json.loads(described.get("input") or "null")
        except (TypeError, json.JSONDecodeError):
            started_with = None
        return notices.started(name, _started_from(_object(started_with)), settings)
    if status not in TOLD_ENDS:
        return f"a {status} execution is announced by the state machine's own notify"
    ended = verified_end(detail, sfn=sfn, settings=settings)
    if isinstance(ended, str):
        return NOT_VERIFIED + ended
    record = records.find_by_execution(ddb, settings.jobs_table, ended.name)
    if record is None:
        return "the execution recorded no run"
    cause = cause_text(ended.cause) or None
    if status == "FAILED":
        # a run that failed through its Catch was announced by the state machine's notify (its record notes the
        # message) before the execution ended; one that died of an error no Catch sees (States.Runtime) was not
        if record.notice_sent:
            return "the state machine's notify announced the failure"
        facts = {
            "job_id": record.job_id,
            "outcome": "failed",
            "error": ended.error or "States.Runtime",
            "cause": cause,
            "spec_name": record.name or None,
            "execution": ended.name,
        }
        return notices.ended(facts, run_cost(record, sagemaker=sagemaker), settings)
    if status == "ABORTED" and ended.error and cause:
        cause = f"{cause} ({ended.error})" if ended.error not in CANCELLED else cause
    kind = "cancelled" if status == "ABORTED" else "timed-out"
    cost = run_cost(record, sagemaker=sagemaker)
    return notices.stopped(kind, record, cause, cost, _model(record, settings), settings)


def _training_notice(
    detail: dict[str, Any], *, ddb: Any, sagemaker: Any, settings: Settings
) -> notices.Notice | str:
    try:
        change = TrainingJobStateChange.model_validate(detail)
    except ValueError:
        return "not a SageMaker training job's state change"
    if change.TrainingJobStatus not in ENDED:
        return f"the training job is {change.TrainingJobStatus}, not ended"
    found = ended_attempt(
        change.TrainingJobName, change.TrainingJobStatus, ddb=ddb, sagemaker=sagemaker, settings=settings
    )
    if isinstance(found, str):
        return found
    record, described = found
    status = str(described["TrainingJobStatus"])
    number = change.TrainingJobName.rpartition("-")[2]
    reason = described.get("FailureReason")
    if status == "Completed":
        why = "the training finished"
    elif status == "Failed":
        why = f"{classify_failure(reason)}: {reason or 'no reason given'}"
    else:
        why = f"stopped ({described.get('SecondaryStatus') or 'Stopped'}): a cancel, the budget's runtime or a stop by hand"
    artifacts = (described.get("ModelArtifacts") or {}).get("S3ModelArtifacts")
    return notices.attempt_ended(
        record,
        training_job=change.TrainingJobName,
        attempt=int(number),
        status=status,
        why=why,
        cost=run_cost(record, sagemaker=sagemaker),
        model=artifacts if status == "Completed" and artifacts else _model(record, settings),
        settings=settings,
    )
