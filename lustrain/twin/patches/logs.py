"""CloudWatch Logs' FilterLogEvents with logStreamNamePrefix, which moto 5.2.5 ignores (it searches every stream of
the group): the MLflow logging of a run reads its job's first host by `<job>/algo-1-`, and on moto it would read
every job's lines.

From the API reference (FilterLogEvents, botocore's logs model): logStreamNamePrefix "filters the results to
include only events from log streams that have names starting with this prefix"; giving it together with
logStreamNames is an InvalidParameterException. A prefix no stream has finds no event.
"""

from __future__ import annotations

import json

from moto.logs.exceptions import InvalidParameterException
from moto.logs.responses import LogsResponse

_PATCHED = "_lustrain_twin_stream_prefix"


def filter_log_events(self: LogsResponse) -> str:
    prefix = self._get_param("logStreamNamePrefix")
    if prefix is None:
        return str(_original(self))
    if self._get_param("logStreamNames"):
        raise InvalidParameterException(
            msg="Cannot specify both logStreamNames and logStreamNamePrefix in the same request"
        )
    group_name = self._get_param("logGroupName")
    group = self.logs_backend.groups.get(group_name)
    names = sorted(name for name in group.streams if name.startswith(prefix)) if group is not None else []
    if group is not None and not names:
        return json.dumps({"events": [], "searchedLogStreams": []})
    events, next_token, searched = self.logs_backend.filter_log_events(
        group_name,
        names,
        self._get_param("startTime"),
        self._get_param("endTime"),
        self._get_param("limit"),
        self._get_param("nextToken"),
        self._get_param("filterPattern"),
        self._get_param("interleaved", False),
    )
    return json.dumps({"events": events, "nextToken": next_token, "searchedLogStreams": searched})


_original = LogsResponse.filter_log_events


def install() -> None:
    if getattr(LogsResponse.filter_log_events, _PATCHED, False):
        return
    setattr(filter_log_events, _PATCHED, True)
    LogsResponse.filter_log_events = filter_log_events  # type: ignore[method-assign]
