"""When the twin last did any work, for waits that last as long as it works rather than a fixed time.

Every AWS call made in this process goes through botocore's `BaseClient._make_api_call`, which the twin's hook
(patches/throttling.py) wraps: it notes the moment and the calling thread. A handler, the state machine's engine,
a training job writing its logs, EventBridge's deliveries: each is some thread's AWS calls. A wait
(rehearse.until) polls from its own thread, so its own calls are left out: it gives up only when the twin has
done nothing else for as long as it allows, however slowly a busy machine runs the twin.
"""

from __future__ import annotations

import threading
import time

#: thread id -> when it last made an AWS call (monotonic seconds)
_last: dict[int, float] = {}


def note() -> None:
    """Note an AWS call by this thread, now."""
    _last[threading.get_ident()] = time.monotonic()


def last_by_others(thread_id: int | None = None) -> float:
    """When a thread other than `thread_id` (default: this one) last made an AWS call (0.0: never)."""
    me = threading.get_ident() if thread_id is None else thread_id
    return max((at for who, at in list(_last.items()) if who != me), default=0.0)
