"""EventBridge delivery to Lambda and Step Functions targets, and S3 -> EventBridge events shaped as AWS's.

moto 5.2.5 matches events against rules (its EventPattern) but raises NotImplementedError for Lambda and
Step Functions targets (Rule.send_to_targets). The patch routes every event that reaches a rule, whether from
PutEvents, from S3, or from `emit()` (the SageMaker simulator's "SageMaker Training Job State Change"), to:
- a Lambda function: invoked asynchronously (a thread), as EventBridge does, through the in-process runner;
- a Step Functions state machine: StartExecution with the event as input and a fresh execution name.
Other targets (SQS, CloudWatch Logs, buses, ...) keep moto's behaviour. Disabled rules and rules without an
event pattern (schedules) receive no events, as on AWS (moto's PutEvents ignores both).

The target gets the event as AWS delivers it ("time" an ISO 8601 string), or what the target's Input (constant
JSON), InputPath (a JSONPath) or InputTransformer (moto's template engine) make of it. Not reproduced:
EventBridge's and Lambda's retries of failed deliveries, dead-letter queues. A Step Functions target is started as
its RoleArn (trusted by events.amazonaws.com, allowed states:StartExecution), as EventBridge does.

`drain(timeout)` waits until no delivery is in flight, including deliveries caused by other deliveries (a
handler that emits an event), and returns the log of deliveries (`deliveries()`) for assertions. A delivery to
Step Functions is done when StartExecution returns; the execution it started runs on.

S3: for a bucket whose NotificationConfiguration has EventBridgeConfiguration, moto emits its own variant of
"Object Created" (detail.object.eTag, reason "ObjectCreated", version-id null, epoch "time"); the twin sends
AWS's instead: detail {version, bucket {name}, object {key, size, etag, version-id (versioned buckets only),
sequencer}, request-id, requester, source-ip-address, reason: PutObject | POST Object | CopyObject |
CompleteMultipartUpload}. moto's direct S3 -> Lambda notifications are made asynchronous too.

PutEvents refuses, entry by entry, a Source that begins with "aws." (NotAuthorizedForSourceException, as AWS's
PutEventsResultEntry documents): only AWS's services put those, so a caller of the API cannot forge "Step Functions
Execution Status Change" or "SageMaker Training Job State Change" onto the bus. moto accepts them. The twin's own
services put theirs with `emit()`, below the API. (A forged event can still reach a function by lambda:Invoke, which
is what the fault matrix's forged cases do.)
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import re
import secrets
import string
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.events.models import Rule, events_backends
from moto.events.responses import EventsHandler
from moto.events.utils import EventTemplateParser
from moto.s3 import notifications as s3_notifications

_PATCHED = "_lustrain_twin_eventbridge"


@dataclass(frozen=True)
class Delivery:
    """One event handed to one target: `status` is in-flight, delivered or failed."""

    event_id: str
    source: str
    detail_type: str
    rule: str
    target_arn: str
    status: str = "in-flight"
    result: str = ""
    error: str = ""


_lock = threading.Condition()
_log: list[Delivery] = []
_in_flight = 0


def deliveries() -> list[Delivery]:
    with _lock:
        return list(_log)


def reset() -> None:
    """Forget the delivery log (deliveries still in flight finish on their own)."""
    with _lock:
        _log.clear()


def drain(timeout: float = 30.0) -> list[Delivery]:
    """Wait until every delivery has finished; returns the log. Raises TimeoutError naming what is still running."""
    deadline = time.monotonic() + timeout
    with _lock:
        while _in_flight:
            left = deadline - time.monotonic()
            if left <= 0:
                running = [f"{d.detail_type} -> {d.target_arn}" for d in _log if d.status == "in-flight"]
                raise TimeoutError(f"EventBridge deliveries still in flight after {timeout} s: {running}")
            _lock.wait(left)
        return list(_log)


def _deliver_async(record: Delivery, send: Any) -> None:
    """Run `send()` in a thread; it returns a result string or raises. The record is updated in the log."""
    global _in_flight
    with _lock:
        _log.append(record)
        index = len(_log) - 1
        _in_flight += 1

    def run() -> None:
        global _in_flight
        try:
            done = replace(record, status="delivered", result=send())
        except Exception as exc:
            done = replace(record, status="failed", error=f"{type(exc).__name__}: {exc}")
        with _lock:
            if index < len(_log) and _log[index] is record:
                _log[index] = done
            _in_flight -= 1
            _lock.notify_all()

    # A fresh thread, not a copy of the caller's context: the delivery is not part of the caller's invocation.
    threading.Thread(target=run, name=f"eventbridge:{record.target_arn}", daemon=True).start()


def _arn_parts(arn: str) -> tuple[str, str, str]:
    """(service, region, account) of an ARN."""
    parts = arn.split(":")
    return parts[2], parts[3], parts[4]


def _invoke_lambda(function_arn: str, event: Any) -> str:
    from moto.awslambda.utils import get_backend

    _, region, account = _arn_parts(function_arn)
    headers: dict[str, str] = {}
    payload = get_backend(account, region).invoke(
        function_arn, None, json.dumps(event), {"x-amz-invocation-type": "Event"}, headers
    )
    text = payload.decode() if isinstance(payload, bytes) else str(payload or "")
    if headers.get("x-amz-function-error"):
        raise RuntimeError(f"the function failed: {text}")
    return text


def _as_target_role(role_arn: str | None, rule_arn: str, state_machine_arn: str) -> None:
    """EventBridge starts an execution as the target's role (RoleArn): it must trust events.amazonaws.com and allow
    states:StartExecution on the state machine; else the delivery fails, as on AWS."""
    from lustrain.twin.iam import enforce

    _, region, account = _arn_parts(state_machine_arn)
    if not role_arn:
        raise PermissionError(f"the target {state_machine_arn} has no RoleArn: EventBridge cannot start it")
    principal, _credentials = enforce.assume(
        role_arn, "events", service="events.amazonaws.com", source_account=account, source_arn=rule_arn
    )
    enforce.authorize_call(
        principal, "stepfunctions", "StartExecution", {"stateMachineArn": state_machine_arn}, region
    )


def _start_execution(
    state_machine_arn: str, event: Any, *, role_arn: str | None = None, rule_arn: str = ""
) -> str:
    from moto.stepfunctions.responses import get_backend

    _as_target_role(role_arn, rule_arn, state_machine_arn)
    _, region, account = _arn_parts(state_machine_arn)
    execution = get_backend(account, region).start_execution(
        state_machine_arn=state_machine_arn, name=str(uuid.uuid4()), execution_input=json.dumps(event)
    )
    return str(execution.execution_arn)


def _as_delivered(event: dict[str, Any]) -> dict[str, Any]:
    delivered = {key: value for key, value in event.items() if key != "ingestion-time"}
    if isinstance(delivered.get("time"), int | float):
        moment = datetime.fromtimestamp(float(delivered["time"]), tz=UTC)
        delivered["time"] = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    return delivered


def _target_input(target: dict[str, Any], event: dict[str, Any]) -> Any:
    delivered = _as_delivered(event)
    if "Input" in target:
        return json.loads(target["Input"])
    if "InputPath" in target:
        from jsonpath_ng.ext import parse  # type: ignore[attr-defined]

        matches = parse(target["InputPath"]).find(delivered)
        return matches[0].value if matches else None
    if "InputTransformer" in target:
        transformer = target["InputTransformer"]
        return EventTemplateParser.parse(
            input_template=transformer.get("InputTemplate"),
            input_paths_map=transformer.get("InputPathsMap", {}),
            event={**delivered, "ingestion-time": event.get("ingestion-time", time.time())},  # type: ignore[typeddict-item]
        )
    return delivered


_SENDERS: dict[str, Callable[..., str]] = {"lambda": _invoke_lambda, "states": _start_execution}


def _send_to_targets(original: Any, rule: Rule, event: Any, transform_input: bool = True) -> None:
    if rule.state != "ENABLED" or not rule.event_pattern.get_pattern():
        return
    if not rule.event_pattern.matches_event(event):
        return
    others = []
    for target in rule.targets:
        service = _arn_parts(target["Arn"])[0]
        if service not in _SENDERS:
            others.append(target)
            continue
        record = Delivery(
            event_id=str(event.get("id", "")),
            source=str(event.get("source", "")),
            detail_type=str(event.get("detail-type", "")),
            rule=rule.name,
            target_arn=target["Arn"],
        )
        send, payload = _SENDERS[service], _target_input(target, event)
        extra = {"role_arn": target.get("RoleArn"), "rule_arn": rule.arn} if service == "states" else {}
        _deliver_async(record, functools.partial(send, target["Arn"], payload, **extra))
    if others:
        # moto's own loop handles the rest; a copy keeps the rule's target list untouched for other threads.
        rest = copy.copy(rule)
        rest.targets = others
        original(rest, event, transform_input)


def emit(
    source: str,
    detail_type: str,
    detail: dict[str, Any],
    region: str = "us-east-1",
    account: str = DEFAULT_ACCOUNT_ID,
    resources: list[str] | None = None,
    event_bus: str = "default",
) -> str:
    """Put one event on a bus as an AWS service would; returns its id. Matching rules deliver it."""
    entry = {
        "Source": source,
        "DetailType": detail_type,
        "Detail": json.dumps(detail),
        "Resources": resources or [],
        "EventBusName": event_bus,
    }
    result = events_backends[account][region].put_events([entry])[0]
    if "ErrorCode" in result:
        raise ValueError(f"EventBridge refused the event: {result['ErrorCode']}: {result['ErrorMessage']}")
    return str(result["EventId"])


# S3 -> EventBridge ------------------------------------------------------------------------------------------

_REASONS = {
    "s3:ObjectCreated:Put": "PutObject",
    "s3:ObjectCreated:Post": "POST Object",
    "s3:ObjectCreated:Copy": "CopyObject",
    "s3:ObjectCreated:CompleteMultipartUpload": "CompleteMultipartUpload",
}
_sequencer = itertools.count(1)


def s3_object_created_detail(account_id: str, bucket: Any, event_name: str, key: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"key": key.name, "size": key.size, "etag": key.etag.replace('"', "")}
    if bucket.is_versioned:
        obj["version-id"] = str(key.version_id)
    obj["sequencer"] = f"{next(_sequencer):018X}"
    return {
        "version": "0",
        "bucket": {"name": bucket.name},
        "object": obj,
        "request-id": "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(16)),
        "requester": account_id,
        "source-ip-address": "127.0.0.1",
        "reason": _REASONS[event_name],
    }


def _send_s3_event(original: Any, account_id: str, bucket: Any, event_name: str, key: Any) -> None:
    if event_name not in _REASONS:
        original(account_id, bucket, event_name, key)
        return
    emit(
        "aws.s3",
        "Object Created",
        s3_object_created_detail(account_id, bucket, event_name, key),
        region=bucket.region_name,
        account=account_id,
        resources=[f"arn:aws:s3:::{bucket.name}"],
    )


def _invoke_s3_notification(account_id: str, event_body: Any, fn_arn: str, region_name: str) -> None:
    record = Delivery(
        event_id="",
        source="aws.s3",
        detail_type="S3 notification",
        rule="(bucket notification)",
        target_arn=fn_arn,
    )
    _deliver_async(record, functools.partial(_invoke_lambda, fn_arn, event_body))


#: the sources only AWS's services may put on a bus, and what PutEvents answers an entry that gives one
AWS_SOURCE_PREFIX = "aws."
NOT_AUTHORIZED_FOR_SOURCE = {
    "ErrorCode": "NotAuthorizedForSourceException",
    "ErrorMessage": "Not authorized for the source.",
}


def _of_aws(entry: Any) -> bool:
    return isinstance(entry, dict) and str(entry.get("Source", "")).startswith(AWS_SOURCE_PREFIX)


def _put_events(original: Any, handler: EventsHandler) -> str:
    """EventsHandler.put_events, with each entry of an AWS source refused in its place and not put."""
    given = handler._get_param("Entries") or []
    if len(given) > 10 or not any(_of_aws(e) for e in given):
        return str(original(handler))  # moto's own answer, its ValidationException over 10 entries included
    put = iter(handler.events_backend.put_events([e for e in given if not _of_aws(e)]))
    entries = [dict(NOT_AUTHORIZED_FOR_SOURCE) if _of_aws(e) else next(put) for e in given]
    return json.dumps({"FailedEntryCount": sum(1 for e in entries if "ErrorCode" in e), "Entries": entries})


def install() -> None:
    if getattr(Rule, _PATCHED, False):
        return
    moto_put_events = EventsHandler.put_events

    def put_events(self: EventsHandler) -> str:
        return _put_events(moto_put_events, self)

    EventsHandler.put_events = put_events  # type: ignore[method-assign]
    moto_send_to_targets = Rule.send_to_targets
    moto_send_s3_event = s3_notifications._send_event_bridge_message

    def send_to_targets(self: Rule, original_event: Any, transform_input: bool = True) -> None:
        _send_to_targets(moto_send_to_targets, self, original_event, transform_input)

    def send_s3_event(account_id: str, bucket: Any, event_name: str, key: Any) -> None:
        _send_s3_event(moto_send_s3_event, account_id, bucket, event_name, key)

    Rule.send_to_targets = send_to_targets  # type: ignore[method-assign]
    s3_notifications._send_event_bridge_message = send_s3_event
    s3_notifications._invoke_awslambda = _invoke_s3_notification
    setattr(Rule, _PATCHED, True)


# --- schedules ------------------------------------------------------------------------------------------------

_RATE = re.compile(r"^rate\((\d+) (minute|minutes|hour|hours|day|days)\)$")
_UNIT_S = {"minute": 60, "hour": 3600, "day": 86400}


def schedule_period_s(expression: str) -> float:
    """The period of an EventBridge rate() expression ("rate(15 minutes)"); ValueError for anything else (the
    twin fires cron() schedules by their rate only when given one)."""
    found = _RATE.match(expression.strip())
    if found is None:
        raise ValueError(f"the twin fires rate() schedules only, like rate(15 minutes) (got {expression!r})")
    count, unit = int(found.group(1)), found.group(2).rstrip("s")
    if count < 1 or (count == 1) != (not found.group(2).endswith("s")):
        raise ValueError(f"{expression!r}: EventBridge writes rate(1 minute) and rate(N minutes)")
    return float(count * _UNIT_S[unit])


def fire_schedule(rule: Rule) -> list[Delivery]:
    """Deliver one "Scheduled Event" of `rule` to its targets, as EventBridge does at each tick."""
    event_id = str(uuid.uuid4())
    event: dict[str, Any] = {
        "version": "0",
        "id": event_id,
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": rule.account_id,
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": rule.region_name,
        "resources": [rule.arn],
        "detail": {},
    }
    sent = []
    for target in rule.targets:
        service = _arn_parts(target["Arn"])[0]
        if service not in _SENDERS:
            continue
        record = Delivery(
            event_id=event_id,
            source="aws.events",
            detail_type="Scheduled Event",
            rule=rule.name,
            target_arn=target["Arn"],
        )
        extra = {"role_arn": target.get("RoleArn"), "rule_arn": rule.arn} if service == "states" else {}
        _deliver_async(
            record, functools.partial(_SENDERS[service], target["Arn"], _target_input(target, event), **extra)
        )
        sent.append(record)
    return sent


def run_schedules(stop: threading.Event, *, speedup: float = 1.0, poll_s: float = 1.0) -> threading.Thread:
    """Fire every ENABLED rule with a rate() ScheduleExpression at its rate (divided by `speedup`), first one
    period after this call, until `stop` is set: what EventBridge's scheduler does for `lustrain local up`."""
    started = time.monotonic()
    fired: dict[str, int] = {}

    def loop() -> None:
        while not stop.wait(poll_s):
            now = time.monotonic() - started
            for account in list(events_backends.values()):
                for backend in list(account.values()):
                    for bus in list(backend.event_buses.values()):
                        for rule in list(bus.rules.values()):
                            expression = getattr(rule, "scheduled_expression", None)
                            if not expression or rule.state != "ENABLED":
                                continue
                            try:
                                period = schedule_period_s(expression) / speedup
                            except ValueError:
                                continue
                            due = int(now // period)
                            if due > fired.get(rule.arn, 0):
                                fired[rule.arn] = due
                                fire_schedule(rule)

    thread = threading.Thread(target=loop, name="eventbridge-scheduler", daemon=True)
    thread.start()
    return thread
