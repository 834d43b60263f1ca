"""A handler whose module is named after the teardown step, so the teardown's faults reach it: it deletes the
buckets named in its event, one by one, and says when it has deleted them all."""

from __future__ import annotations

import threading
from typing import Any

import boto3

#: set once a call has deleted every bucket it was given
finished = threading.Event()
#: both of two invocations must reach it before either goes on (`twice-at-once` runs them at once)
together: threading.Barrier | None = None
deleted: list[str] = []


def reset(parties: int = 1) -> None:
    global together
    finished.clear()
    deleted.clear()
    together = threading.Barrier(parties)


def handler(event: Any, context: Any) -> dict[str, Any]:
    if together is not None:
        together.wait(timeout=60)  # BrokenBarrierError, not a hang, when the other never comes
    s3 = boto3.client("s3")
    for name in event["buckets"]:
        s3.delete_bucket(Bucket=name)
        deleted.append(name)
    finished.set()
    return {"deleted": list(event["buckets"])}
