"""notify: tell people how the run goes (steps/notify.py).

From the state machine (the run's document): publish the outcome (error, archive, teardown, cost) to
NOTIFY_TOPIC_ARN and post it to the stack's webhook. Output: $.notify.
From EventBridge (the execution's start and stop, a training job's end, a queue change): post that notice to the
stack's webhook; an execution's stop, time-out or death only once DescribeExecution bears it out (steps/notify.py
`verified_end`; one it does not is logged as "execution end not verified" and posts nothing). A notice that could
not be delivered is logged ("notice not delivered", without the URL) and the invocation succeeds all the same: a
notice never fails nor holds up a run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools import Logger
from lustrain_core import clients
from lustrain_core.aws_errors import translate_aws_errors
from lustrain_core.config import Settings
from lustrain_core.steps import notices, notify, records, tracking

logger = Logger(service="lustrain")

#: the sources of the EventBridge events the function takes; anything else is a state machine's document (whose
#: run may have started from S3's "Object Created" event: source aws.s3)
EVENT_SOURCES = frozenset({"aws.states", "aws.sagemaker", notify.SOURCE})
#: what a state machine's document always holds (the run's `job`, or the `error` its Catch put in $.error) and an
#: EventBridge event never does at its top level (version, id, detail-type, source, account, time, region,
#: resources, detail): a refused start's document is its caller's input plus $.error, so its shape alone (a
#: source, a detail-type) must never make it an event
DOCUMENT_KEYS = frozenset({"job", "error"})


def is_event(event: Any) -> bool:
    """An EventBridge event of the notices' rules, not a state machine's document however it is shaped."""
    return (
        isinstance(event, dict)
        and not DOCUMENT_KEYS & event.keys()
        and event.get("source") in EVENT_SOURCES
        and "detail-type" in event
    )


#: the seconds of the function's time MLflow's calls leave for the rest of the invocation
MLFLOW_MARGIN_S = 5.0


def _tracking_clients(settings: Settings, context: Any) -> dict[str, Any]:
    """What the MLflow logging calls with: the function's logs and S3 clients, its credentials (which sign the
    calls to a SageMaker tracking server), and the moment its calls must have ended by (the invocation's time,
    less a margin: an attempt's metrics cut short are read again at the run's end)."""
    import boto3

    remaining_ms = getattr(context, "get_remaining_time_in_millis", None)
    return {
        "logs": clients.client("logs"),
        "s3": clients.client("s3"),
        "settings": settings,
        "credentials": boto3.Session().get_credentials(),
        "deadline": time.monotonic() + remaining_ms() / 1000 - MLFLOW_MARGIN_S if remaining_ms else None,
    }


def _tracked(work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """MLflow never holds up a run nor fails a notice: whatever went wrong is told in the answer and logged."""
    try:
        return work()
    except Exception as exc:  # steps/tracking.py answers the failures it knows; this is for the rest
        return {"tracked": False, "error": f"{type(exc).__name__}: {exc}"[:300]}


@translate_aws_errors()
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    settings = Settings.from_env()
    ddb, sagemaker, secrets = (clients.client(s) for s in ("dynamodb", "sagemaker", "secretsmanager"))
    if is_event(event):
        sfn = clients.client("stepfunctions")
        result = (
            notify.on_event(
                event,
                ddb=ddb,
                sagemaker=sagemaker,
                sfn=sfn,
                secrets=secrets,
                settings=settings,
            )
            if notices.configured(settings)
            # a stack that logs to MLflow without a webhook: no notice is made to be dropped
            else {"posted": False, "chat": {"delivered": False, "skipped": f"no {notices.SECRET_SETTING}"}}
        )
        if str(result.get("reason", "")).startswith(notify.NOT_VERIFIED):
            # an execution's end Step Functions does not bear out: a forged event, or a stack setting gone wrong
            logger.warning("execution end not verified", extra={"notice": result, "execution_end_not_verified": 1})
        else:
            logger.info("notice", extra={"notice": result})
        if tracking.configured(settings):
            result["mlflow"] = _tracked(
                lambda: tracking.on_event(
                    event, ddb=ddb, sagemaker=sagemaker, sfn=sfn, **_tracking_clients(settings, context)
                )
            )
    else:
        result = notify.notify(
            event, sns=clients.client("sns"), settings=settings, ddb=ddb, secrets=secrets, sagemaker=sagemaker
        )
        logger.info("outcome published", extra=result)
        if tracking.configured(settings):
            job_id = notify.registered_job_id(event)
            record = records.get(ddb, settings.jobs_table, job_id) if job_id else None
            status = tracking.STATUS_OF_OUTCOME.get(str(result.get("outcome")), "FAILED")
            result["mlflow"] = _tracked(
                lambda: tracking.on_run_end(
                    record, status, ddb=ddb, sagemaker=sagemaker, **_tracking_clients(settings, context)
                )
            )
    mlflow = result.get("mlflow") or {}
    if mlflow.get("error"):
        # MLflow is a view of the run: what was not logged is told here, the run goes on
        logger.warning("mlflow not logged", extra={"mlflow_not_logged": 1, **mlflow})
    chat = result.get("chat") or {}
    if chat and not chat.get("delivered") and not chat.get("skipped"):
        # a metric filter on this line counts the notices lost ({ $.notice_not_delivered = 1 })
        logger.warning("notice not delivered", extra={"notice_not_delivered": 1, **chat})
    return result
