"""What a stack's runs still hold: `lustrain leftovers` ("what still bills?") and `lustrain cancel --wait` (the wait
for a run's teardown), for the CLI and a notebook:

    lustrain.leftovers(stack).billing                      # every resource that bills, with its run and $ an hour
    lustrain.wait_for_teardown(stack, job_id).to_dict()    # what the teardown stopped, deleted and kept

Both read the stack's resources by its tags through the registry the teardown and the sweeper use
(lustrain_core.leftovers).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import boto3
from lustrain_core import leftovers as stack_leftovers
from lustrain_core.leftovers import Report as LeftoverReport
from lustrain_core.prices import PriceTable
from lustrain_core.steps import records
from lustrain_core.steps.records import JobRecord

from lustrain.operate import RunNotFound, Stack, find_run


def leftovers(stack: Stack, run: str | None = None, prices: PriceTable | None = None) -> LeftoverReport:
    """Everything the stack's runs still hold, with the run each belongs to and what it bills an hour (`lustrain
    leftovers`); only RUN's with `run`. Found by the stack's tags through the registry the sweeper uses."""
    job_id = find_run(stack, run).job_id if run else None
    return _leftovers(stack, job_id, prices)


def _leftovers(stack: Stack, job_id: str | None, prices: PriceTable | None = None) -> LeftoverReport:
    session = stack.session or boto3.Session()
    return stack_leftovers.report(
        **{service: stack.client(service) for service in ("ec2", "fsx", "sagemaker", "iam")},
        ddb=stack.client("dynamodb"),
        jobs_table=stack.jobs_table,
        stack_name=stack.name,
        region=session.region_name,
        prices=prices,
        job_id=job_id,
    )


@dataclass(frozen=True)
class TeardownWait:
    """What a run's teardown did, once it ended (`lustrain cancel --wait`), or what is left when the wait ran out."""

    record: JobRecord
    #: what of the run still exists: only what it keeps on purpose once the teardown ended
    left: LeftoverReport
    ended: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "ended": self.ended,
            "status": self.record.status,
            "error": self.record.error_name,
            "stopped": self.record.torn_down.get("stopped") or [],
            "deleted": self.record.torn_down.get("deleted") or [],
            "left": [left.to_dict() for left in self.left.leftovers],
        }


#: the longest wait between two looks at a teardown: each look after the record's end reads the whole stack's
#: resources (lustrain_core.leftovers), and an FSx deletion on AWS takes minutes
MAX_POLL_S = 15.0


def wait_for_teardown(stack: Stack, job_id: str, timeout_s: float = 3600.0, poll_s: float = 1.0) -> TeardownWait:
    """Wait until the run's teardown has ended: its record finished and nothing of it left that it does not keep on
    purpose (a teardown still deleting, or retrying TeardownIncomplete, leaves its pieces for a while). The looks
    start `poll_s` apart and grow by half each time, to at most MAX_POLL_S."""
    deadline = time.monotonic() + timeout_s
    while True:
        record = records.get(stack.client("dynamodb"), stack.jobs_table, job_id)
        if record is None:
            raise RunNotFound(f"run {job_id} has no record in {stack.jobs_table}")
        left = _leftovers(stack, job_id) if record.finished else None
        if left is not None and all(item.kept for item in left.leftovers):
            return TeardownWait(record, left, ended=True)
        if time.monotonic() >= deadline:
            return TeardownWait(record, left or _leftovers(stack, job_id), ended=False)
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        poll_s = min(poll_s * 1.5, MAX_POLL_S)


def teardown_text(waited: dict[str, Any], job_id: str, stack: str) -> str:
    """What `cancel --wait` prints of a run's teardown: what it stopped, deleted and kept, or what is still there."""
    def ids(entries: list[dict[str, Any]]) -> str:
        return ", ".join(f"{e['type']} {e['id']}" for e in entries) or "nothing"

    if not waited["ended"]:
        return (
            f"its teardown has not ended; still there: {ids([{'type': x['kind'], 'id': x['id']} for x in waited['left']])}"
            f"\nsee: lustrain leftovers {job_id} --stack {stack}"
        )
    lines = [
        f"teardown ended: run {job_id} {waited['status']}" + (f", {waited['error']}" if waited["error"] else ""),
        f"  stopped: {ids(waited['stopped'])}",
        f"  deleted: {ids(waited['deleted'])}",
    ]
    kept = [f"{x['kind']} {x['id']} ({x['note']}; {_hourly(x['hourly_usd'])})" for x in waited["left"]]
    lines.append(f"  kept: {', '.join(kept) if kept else 'nothing'}")
    return "\n".join(lines)


def _hourly(usd: float | None) -> str:
    return "price unknown" if usd is None else f"${usd:,.2f}/h"


def leftovers_text(found: dict[str, Any]) -> str:
    """`lustrain leftovers`' table: each resource by run, with its state and what it bills an hour."""
    left = found["leftovers"]
    if not left:
        return f"stack {found['stack']}: its runs hold nothing; nothing bills"
    rows = [("RUN", "STATUS", "KIND", "ID", "STATE", "$/HOUR", "NOTE")]
    for x in left:
        run = f"{x['run']} ({x['job_id']})" if x["run"] else f"{x['job_id']} (no record)"
        billed = f"; billed {x['billed_s']:,} s so far" if x["billed_s"] else ""
        rows.append((run, x["run_status"] or "-", x["kind"], x["id"], x["state"] or "-",
                     "unknown" if x["hourly_usd"] is None else f"{x['hourly_usd']:,.4f}", x["note"] + billed))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1] for row in rows]
    total = "unknown (a resource has no price here)" if found["hourly_usd"] is None else f"${found['hourly_usd']:,.2f}"
    lines.append(
        f"{len(left)} resources of stack {found['stack']}; {found['billing']} bill, {total} an hour together "
        f"(list prices of {found['prices_as_of']})"
    )
    return "\n".join(line.rstrip() for line in lines)
