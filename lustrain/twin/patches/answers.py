"""moto writes its answers with less CPU where the same answer comes cheaper: their timestamps, their request ids.

- Every timestamp of an answer goes through botocore's parse_to_aware_datetime, which reads a string with dateutil's
  general parser: about 2% of the twin's CPU in the end-to-end tests (a training job's, an execution's events', a
  file system's times, answered at every poll). moto's backends keep ISO 8601 strings, which Python's own
  datetime.fromisoformat reads to the same moment (UTC where the string names no zone, as botocore assumes) in a
  fraction of the time; any other value still goes to botocore's function.
- Every answer's body is searched for a `<RequestId>` to replace, with a regular expression that looks behind at
  every character of it, JSON answers included: about 1%. A body without that tag is left as it is, as the
  expression would leave it.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import moto.core.responses
import moto.core.serialize
from botocore.utils import parse_to_aware_datetime
from dateutil.tz import tzutc

_PATCHED = "_lustrain_twin_answers"
#: the ISO 8601 forms fromisoformat reads as dateutil does: a date, a time to the second, at most microseconds, and
#: Z, an offset or no zone
ISO_8601 = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})?")
#: the expression moto.core.responses replaces a request id with, and the tag it needs
REQUEST_ID_PATTERN = r"(?<=<RequestId>).*(?=<\/RequestId>)"
REQUEST_ID_TAG = "<RequestId>"


def aware_datetime(value: Any) -> datetime:
    """botocore's parse_to_aware_datetime, with an ISO 8601 string read by datetime.fromisoformat."""
    if isinstance(value, str) and ISO_8601.fullmatch(value):
        parsed = datetime.fromisoformat(value)
        return parsed.replace(tzinfo=tzutc()) if parsed.tzinfo is None else parsed.astimezone(tzutc())
    found: datetime = parse_to_aware_datetime(value)
    return found


class TagFirst:
    """moto.core.responses' `re`: its sub of a request id first looks for the tag the expression needs."""

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)

    @staticmethod
    def sub(pattern: Any, repl: Any, string: Any, count: int = 0, flags: int = 0) -> Any:
        # a bytes body raises TypeError here, as re.sub does with a str pattern (moto ignores either)
        if pattern == REQUEST_ID_PATTERN and REQUEST_ID_TAG not in string:
            return string
        return re.sub(pattern, repl, string, count=count, flags=flags)


def install() -> None:
    serialize: Any = moto.core.serialize
    if getattr(serialize.parse_to_aware_datetime, _PATCHED, False):
        return
    setattr(aware_datetime, _PATCHED, True)
    serialize.parse_to_aware_datetime = aware_datetime
    responses: Any = moto.core.responses
    responses.re = TagFirst()
