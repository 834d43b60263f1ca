"""Handlers for the in-process Lambda tests: each shows one behaviour a real handler can have."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

#: Events the `record` handler received, in order (EventBridge delivers from other threads).
received: list[Any] = []
_attempts: dict[str, int] = {}
_lock = threading.Lock()


class QuotaExceeded(Exception):
    """Named like lustrain's own error, to show the class name is what the ASL matches."""


class FlakyError(Exception):
    pass


def reset() -> None:
    with _lock:
        received.clear()
        _attempts.clear()
    holding.clear()
    release.clear()


def echo(event: Any, context: Any) -> dict[str, Any]:
    return {
        "event": event,
        "env": {
            name: os.environ.get(name) for name in ("GREETING", "AWS_LAMBDA_FUNCTION_NAME", "AWS_REGION")
        },
        "context": {
            "function_name": context.function_name,
            "memory_limit_in_mb": context.memory_limit_in_mb,
            "aws_request_id": context.aws_request_id,
            "remaining_ms": context.get_remaining_time_in_millis(),
        },
    }


def fail(event: Any, context: Any) -> None:
    raise QuotaExceeded(f"asked for {event.get('count', 1)} ml.p4d.24xlarge, 0 free")


def flaky(event: Any, context: Any) -> dict[str, int]:
    """Fails with FlakyError on the first attempt for event["key"], succeeds after."""
    with _lock:
        _attempts[event["key"]] = attempt = _attempts.get(event["key"], 0) + 1
    if attempt == 1:
        raise FlakyError("the first attempt always fails")
    return {"attempts": attempt}


def slow(event: Any, context: Any) -> str:
    time.sleep(float(event.get("seconds", 3)))
    return "finished late"


def record(event: Any, context: Any) -> str:
    with _lock:
        received.append(event)
    return "recorded"


def unmarshallable(event: Any, context: Any) -> dict[str, Any]:
    return {"not json": object()}


#: `holds` says it runs, then waits for the test to let it end.
holding = threading.Event()
release = threading.Event()


def holds(event: Any, context: Any) -> str:
    holding.set()
    release.wait(30)
    return os.environ["AWS_LAMBDA_FUNCTION_NAME"]
