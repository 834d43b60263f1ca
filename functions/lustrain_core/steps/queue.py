"""The capacity queue: a run whose instances do not fit the quota left waits for them, before anything is billed.

check_quota (the state machine's "Check the SageMaker quota") calls `take_place` on every visit: the run joins
its pool's line, and is admitted when it is at the head and its instances fit what the quota leaves. Otherwise the
state machine waits `wait_seconds` (the stack's QueuePollSeconds) and asks again; the network and the file system
are created only after the admission, so a queued run has nothing that bills.

- **One line per pool**: an instance type and a purchase option (`ml.p4d.24xlarge#on-demand`,
  `...#spot`), since spot and on-demand jobs count against different quotas. First come, first served: a run is
  admitted only when no run that queued before it still waits, so a large run is never starved by small ones.
- **An admission holds its instances** until the run's training job exists (start_training releases the hold
  once CreateTrainingJob answered; the job then counts in SageMaker's own InProgress list). What is free is the
  quota, less the instances InProgress and Stopping jobs hold (anyone's: another workload's too), less the holds.
- **Two runs admitted together never oversubscribe**: the pool is one DynamoDB item (its line, its holds and an
  `epoch`). Every change bumps the epoch, and an admission is written only if the epoch is still the one its
  arithmetic read (a conditional update); a run that loses the race reads again.
- **Waits are bounded**: `compute.max_queue_hours` counts every wait of the run (the first, and each return to
  the line before a later attempt, including the time from an admission to SageMaker's refusal). Past it the run
  leaves the line and ends QuotaExceeded with the numbers and the command that asks for more. A run that can never
  fit (more instances than the whole quota) is refused at once; so is any run with `max_queue_hours: 0` that does
  not fit now.
- **A refused run keeps its place**: SageMaker's ResourceLimitExceeded (another workload took the quota between
  the admission and CreateTrainingJob) sends the run back to the line at its first place (its `order`), and the
  next attempt of a run whose job failed returns there too.

Every end of a run leaves the line and drops its hold (teardown, `leave`), so a stopped or failed run never blocks
the runs behind it; the sweeper's teardown of an abandoned run does the same.

The pool item (queue table, pk `pool_name`):

    pool_name, epoch, waiting: {job_id: {order, instances, since, before_s}}, holds: {job_id: {instances, since}}

The same table holds the warm pools' offers (`warm-pool#<shape>`: steps/warm_pool.py), which have no line.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core.aws_errors import CONDITION_FAILED, error_code
from lustrain_core.config import Settings
from lustrain_core.document import Admission, Run
from lustrain_core.spec import Compute
from lustrain_core.steps import quota, records, training_plans, warm_pool

#: the stack's seconds between two looks at the queue by a waiting run (template: QueuePollSeconds)
POLL_SETTING = "LUSTRAIN_QUEUE_POLL_SECONDS"
DEFAULT_POLL_SECONDS = 30
#: conditional writes lost to another run's change before this visit gives up (the next visit tries again)
RACE_TRIES = 4
#: Step Functions keeps at most 25,000 events in an execution's history, and the execution fails (no Catch sees
#: it) past them; each look at the queue is 9 (Task 5, Choice 2, Wait 2). The looks of a whole allowed wait stay
#: within this many (the stack's QueueMaxLooks), so a run that may wait long looks less often than
#: QueuePollSeconds: max_queue_hours x 3600 / MAX_LOOKS (24 h: every 44 s; 168 h: every 303 s)
MAX_LOOKS_SETTING = "LUSTRAIN_QUEUE_MAX_LOOKS"
MAX_LOOKS = 2000


def pool_of(compute: Compute) -> str:
    """The line a run waits in: its instance type and purchase option, or its training plan (by the plan's name,
    unique in the account and region), whose reserved instances it waits for instead of the quota."""
    if compute.training_plan is not None:
        return f"{compute.instance_type}#training-plan/{compute.training_plan.rsplit('/', 1)[-1]}"
    return f"{compute.instance_type}#{'spot' if compute.spot else 'on-demand'}"


def _measure(
    job: Any, *, quotas: Any, sagemaker: Any, settings: Settings, held: int, reusable: int = 0
) -> dict[str, Any]:
    """What the run's line admits against: its training plan's instances, else the account's quota (less the
    instances of a warm pool the run takes over, `reusable`)."""
    if job.launch.training_plan is not None:
        return training_plans.measure(job, sagemaker=sagemaker, held=held)
    return quota.measure(
        job, quotas=quotas, sagemaker=sagemaker, settings=settings, held=held, reusable=reusable
    )


def _refusal(job: Any, measured: dict[str, Any], settings: Settings, *, quotas: Any, why: str) -> Exception:
    if job.launch.training_plan is not None:
        if not quota.fits_ever(measured):
            why = f"the plan is {measured.get('plan_status')}: no job can use it"
        return training_plans.refusal(job, measured, why)
    return quota.refusal(job, measured, settings, quotas=quotas, why=why)


#: The queue's moments the run's chat notices tell of (steps/notify.py), put on EventBridge's default bus.
CHANGE_SOURCE = "lustrain"
CHANGE_DETAIL_TYPE = "lustrain Run Queue Change"


def change_of(previous: Any, admission: Admission) -> str | None:
    """The moment a visit marks: "queued" at the first look of a wait, "admitted" at its end; None for a run
    admitted at once or still waiting (`previous` is the visit's $.quota before it: the last look's answer)."""
    was_waiting = isinstance(previous, dict) and previous.get("admitted") is False
    if admission.admitted:
        return "admitted" if was_waiting else None
    return None if was_waiting else "queued"


def announce_change(events: Any, job_id: str, state: str, admission: Admission) -> str | None:
    """Put the queue's change on the default bus for the notices; never raises (a notice is no reason to fail a
    look at the queue): the error's code where PutEvents failed, else None."""
    detail = {
        "job_id": job_id,
        "state": state,
        "pool": admission.pool,
        "position": admission.position,
        "queued_s": admission.queued_s,
    }
    entry = {"Source": CHANGE_SOURCE, "DetailType": CHANGE_DETAIL_TYPE, "Detail": json.dumps(detail)}
    try:
        answer = events.put_events(Entries=[entry])
    except ClientError as exc:
        return error_code(exc) or "ClientError"
    failed = [e for e in answer.get("Entries", []) if e.get("ErrorCode")]
    return str(failed[0]["ErrorCode"]) if failed or answer.get("FailedEntryCount") else None


def poll_seconds(settings: Settings, compute: Compute | None = None) -> int:
    """Seconds between two looks: the stack's QueuePollSeconds, or longer for a run whose allowed wait would
    otherwise take more than MAX_LOOKS looks (Step Functions' history limit)."""
    found = settings.whole_seconds(POLL_SETTING, least=1)
    every = DEFAULT_POLL_SECONDS if found is None else found
    if compute is not None:
        looks = settings.whole_seconds(MAX_LOOKS_SETTING, least=1) or MAX_LOOKS
        every = max(every, math.ceil(compute.max_queue_hours * 3600 / looks))
    return every


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime(records.ISO_FORMAT)


def _key(pool: str) -> dict[str, Any]:
    return {"pool_name": {"S": pool}}


def read_pool(ddb: Any, table: str, pool: str) -> dict[str, Any]:
    """The pool item: {epoch, waiting, holds}; an empty pool is written first (so updates have maps to change)."""
    item = ddb.get_item(TableName=table, Key=_key(pool), ConsistentRead=True).get("Item")
    if item is None:
        try:
            ddb.put_item(
                TableName=table,
                Item={
                    "pool_name": {"S": pool},
                    "epoch": {"N": "0"},
                    "waiting": {"M": {}},
                    "holds": {"M": {}},
                },
                ConditionExpression="attribute_not_exists(pool_name)",
            )
        except ClientError as exc:
            if error_code(exc) != CONDITION_FAILED:
                raise
        item = ddb.get_item(TableName=table, Key=_key(pool), ConsistentRead=True)["Item"]
    found = records.from_item(item)
    return {
        "epoch": int(found.get("epoch") or 0),
        "waiting": dict(found.get("waiting") or {}),
        "holds": dict(found.get("holds") or {}),
    }


def _update(
    ddb: Any, table: str, pool: str, expression: str, condition: str, job_id: str, **values: Any
) -> bool:
    """One conditional change of the pool item, bumping its epoch; False when the condition no longer held."""
    attribute_values = {f":{name}": records.to_attribute(value) for name, value in values.items()}
    attribute_values[":one"] = {"N": "1"}
    try:
        ddb.update_item(
            TableName=table,
            Key=_key(pool),
            UpdateExpression=expression,
            ConditionExpression=condition,
            ExpressionAttributeNames={"#job": job_id},
            ExpressionAttributeValues=attribute_values,
        )
    except ClientError as exc:
        if error_code(exc) == CONDITION_FAILED:
            return False
        raise
    return True


def _join(ddb: Any, table: str, pool: str, job_id: str, ticket: dict[str, Any]) -> None:
    """Join the line (once: a run already waiting or holding keeps its ticket)."""
    _update(
        ddb,
        table,
        pool,
        "SET waiting.#job = :ticket, epoch = epoch + :one",
        "attribute_exists(pool_name) AND attribute_not_exists(waiting.#job) AND attribute_not_exists(holds.#job)",
        job_id,
        ticket=ticket,
    )


def leave(ddb: Any, settings: Settings, compute: Compute, job_id: str) -> None:
    """Leave the line and drop any hold (every end of a run: teardown). Nothing to do for a run never queued."""
    _leave_pool(ddb, settings.queue_table, pool_of(compute), job_id)


def _leave_pool(ddb: Any, table: str, pool: str, job_id: str) -> bool:
    return _update(
        ddb,
        table,
        pool,
        "REMOVE waiting.#job, holds.#job SET epoch = epoch + :one",
        "attribute_exists(pool_name) AND (attribute_exists(waiting.#job) OR attribute_exists(holds.#job))",
        job_id,
    )


def prune(
    ddb: Any, settings: Settings, running: Callable[[records.JobRecord], bool] = lambda record: True
) -> list[dict[str, str]]:
    """The sweeper's part: take out of every line the runs that ended (their record FINISHED, or `running` says
    their execution is no longer RUNNING) or have no record, so a run whose end no teardown saw never blocks the
    runs behind it. Returns what was taken out."""
    pruned: list[dict[str, str]] = []
    for page in ddb.get_paginator("scan").paginate(TableName=settings.queue_table, ConsistentRead=True):
        for item in page.get("Items", []):
            found = records.from_item(item)
            pool = str(found.get("pool_name"))
            for part in ("waiting", "holds"):
                for job_id in dict(found.get(part) or {}):
                    record = records.get(ddb, settings.jobs_table, job_id)
                    if record is None:
                        why = "no job record"
                    elif record.finished:
                        why = f"its run ended {record.status}"
                    elif not running(record):
                        why = f"its execution {record.execution} is no longer running"
                    else:
                        continue
                    if _leave_pool(ddb, settings.queue_table, pool, job_id):
                        pruned.append({"pool": pool, "job_id": job_id, "was": part, "reason": why})
    return pruned


def release_hold(ddb: Any, settings: Settings, compute: Compute, job_id: str) -> None:
    """The training job exists (or SageMaker refused it): its instances count in SageMaker's list, not here."""
    _update(
        ddb,
        settings.queue_table,
        pool_of(compute),
        "REMOVE holds.#job SET epoch = epoch + :one",
        "attribute_exists(pool_name) AND attribute_exists(holds.#job)",
        job_id,
    )


def _queued_before(run: Run, now: float) -> int:
    """Seconds the run waited before this wait: its earlier waits, and for a run SageMaker refused after an
    admission, the time since that admission (it was waiting for the quota all along)."""
    previous = run.sections.quota
    if previous is None or not previous.admitted:
        return previous.queued_s if previous is not None else 0
    before = previous.queued_s
    admitted_at = records.moment(previous.admitted_at)
    if run.recovery.refused and admitted_at is not None:
        before += max(0, int(now - admitted_at))
    return before


def take_place(
    document: dict[str, Any],
    *,
    quotas: Any,
    sagemaker: Any,
    ddb: Any,
    settings: Settings,
    clock: Callable[[], float] = time.time,
) -> Admission:
    """Join the run's line (or keep its place) and be admitted if its instances fit; $.quota either way.
    QuotaExceeded when they can never fit, or the run's time in the queue (compute.max_queue_hours) ran out."""
    run = Run.parse(document)
    job = run.job
    # a job register_job never recorded (a hand-made document) has no record to hold its place in the line
    records.require(ddb, settings.jobs_table, job.job_id)
    compute = job.spec.compute
    table = settings.queue_table
    pool = pool_of(compute)
    now = clock()
    previous = run.sections.quota
    order = previous.order if previous is not None and previous.order else f"{_iso(now)}#{job.job_id}"
    allowed_s = int(compute.max_queue_hours * 3600)
    # back after SageMaker refused its job: it waits at least one look before it is admitted again, so a quota
    # that SageMaker and the queue count differently cannot spin the run through refusals
    hold_off = previous is not None and previous.admitted and run.recovery.refused
    # a warm pool that could never be kept is refused before the run waits for anything
    quota.check_warm_pool(job, quotas=quotas, settings=settings)

    measured: dict[str, Any] = {}
    for _ in range(RACE_TRIES):
        state = read_pool(ddb, table, pool)
        if job.job_id in state["holds"]:  # a retried visit that was admitted already
            hold = state["holds"][job.job_id]
            return _admitted(ddb, settings, run, pool, str(hold.get("order") or order), measured, hold)
        ticket = state["waiting"].get(job.job_id)
        if ticket is None:
            ticket = {
                "order": order,
                "instances": compute.instance_count,
                "since": _iso(now),
                "before_s": _queued_before(run, now),
            }
            _join(ddb, table, pool, job.job_id, ticket)
            continue  # read the line again, with this run in it
        held = sum(int(h.get("instances") or 0) for h in state["holds"].values())
        measured = _measure(
            job,
            quotas=quotas,
            sagemaker=sagemaker,
            settings=settings,
            held=held,
            reusable=warm_pool.offered_instances(ddb, settings, job),
        )
        since = records.moment(ticket.get("since")) or now
        queued_s = int(ticket.get("before_s") or 0) + max(0, int(now - since))
        ahead = [
            t
            for j, t in state["waiting"].items()
            if j != job.job_id and str(t.get("order")) < str(ticket["order"])
        ]
        if not quota.fits_ever(measured):
            leave(ddb, settings, compute, job.job_id)
            raise _refusal(
                job,
                measured,
                settings,
                quotas=quotas,
                why="more than the whole quota: no wait can make it fit",
            )
        if not ahead and quota.fits_now(measured) and not hold_off:
            hold = {
                "instances": compute.instance_count,
                "since": _iso(now),
                "queued_s": queued_s,
                "order": ticket["order"],
            }
            admitted = _update(
                ddb,
                table,
                pool,
                "SET holds.#job = :hold, epoch = epoch + :one REMOVE waiting.#job",
                "epoch = :epoch AND attribute_exists(waiting.#job)",
                job.job_id,
                hold=hold,
                epoch=state["epoch"],
            )
            if admitted:
                return _admitted(ddb, settings, run, pool, str(ticket["order"]), measured, hold)
            continue  # another run changed the pool meanwhile: read it again
        if queued_s >= allowed_s:
            leave(ddb, settings, compute, job.job_id)
            waited = (
                "compute.max_queue_hours is 0: the run does not wait"
                if allowed_s == 0
                else f"waited {queued_s} s in the queue, compute.max_queue_hours={compute.max_queue_hours:g} "
                f"({len(ahead)} run(s) still ahead)"
            )
            raise _refusal(job, measured, settings, quotas=quotas, why=waited)
        return _waiting(ddb, settings, run, pool, ticket, measured, ahead, queued_s, allowed_s)
    # every try lost a race: others are being admitted or released right now; look again shortly
    return Admission(
        admitted=False,
        pool=pool,
        order=order,
        position=1,
        queued_s=previous.queued_s if previous is not None else 0,
        wait_seconds=poll_seconds(settings, compute),
        **_numbers(measured),
    )


def _numbers(measured: dict[str, Any]) -> dict[str, Any]:
    """The quota's numbers the answer carries beside the queue's own fields."""
    return {k: v for k, v in measured.items() if k not in Admission.model_fields}


def _answer(
    ddb: Any, settings: Settings, run: Run, measured: dict[str, Any], record: dict[str, Any], **fields: Any
) -> Admission:
    """$.quota, with the run's place also written to its job record (`queue`: `lustrain status`, the sweeper)."""
    answer = Admission(**fields, **_numbers(measured))
    place = {
        "state": "admitted" if answer.admitted else "queued",
        "pool": answer.pool,
        "queued_s": answer.queued_s,
    }
    records.set_fields(ddb, settings.jobs_table, run.job.job_id, queue={**place, **record})
    return answer


def _admitted(
    ddb: Any,
    settings: Settings,
    run: Run,
    pool: str,
    order: str,
    measured: dict[str, Any],
    hold: dict[str, Any],
) -> Admission:
    admitted_at = str(hold["since"])
    return _answer(
        ddb,
        settings,
        run,
        measured,
        {"admitted_at": admitted_at},
        admitted=True,
        pool=pool,
        order=order,
        queued_s=int(hold.get("queued_s") or 0),
        admitted_at=admitted_at,
    )


def _waiting(
    ddb: Any,
    settings: Settings,
    run: Run,
    pool: str,
    ticket: dict[str, Any],
    measured: dict[str, Any],
    ahead: list[dict[str, Any]],
    queued_s: int,
    allowed_s: int,
) -> Admission:
    position, ahead_instances = len(ahead) + 1, sum(int(t.get("instances") or 0) for t in ahead)
    # the time left to wait from `since`: the sweeper's deadline counts it
    left_s = max(0, allowed_s - int(ticket.get("before_s") or 0))
    return _answer(
        ddb,
        settings,
        run,
        measured,
        {
            "position": position,
            "ahead_instances": ahead_instances,
            "since": ticket.get("since"),
            "left_s": left_s,
        },
        admitted=False,
        pool=pool,
        order=str(ticket["order"]),
        position=position,
        ahead_instances=ahead_instances,
        queued_s=queued_s,
        wait_seconds=min(poll_seconds(settings, run.job.spec.compute), max(1, allowed_s - queued_s)),
    )
