"""CloudWatch Logs' FilterLogEvents on the twin takes logStreamNamePrefix as AWS does (moto searches every stream):
only the streams whose names start with it, refused beside logStreamNames, nothing where no stream has it."""

from __future__ import annotations

import time

import pytest
from botocore.exceptions import ClientError
from twinhelpers import client

pytestmark = pytest.mark.usefixtures("moto_twin")

GROUP = "/aws/sagemaker/TrainingJobs"


def test_filter_log_events_reads_only_the_streams_its_prefix_names() -> None:
    logs = client("logs")
    logs.create_log_group(logGroupName=GROUP)
    now = int(time.time() * 1000)
    for stream in ("run-1/algo-1-1780000000", "run-1/algo-2-1780000000", "run-10/algo-1-1780000000"):
        logs.create_log_stream(logGroupName=GROUP, logStreamName=stream)
        logs.put_log_events(logGroupName=GROUP, logStreamName=stream, logEvents=[{"timestamp": now, "message": stream}])

    def found(**params: object) -> list[str]:
        pages = logs.get_paginator("filter_log_events").paginate(logGroupName=GROUP, **params)
        return sorted(event["message"] for page in pages for event in page["events"])

    assert found(logStreamNamePrefix="run-1/algo-1-") == ["run-1/algo-1-1780000000"]
    assert found(logStreamNamePrefix="run-1/") == ["run-1/algo-1-1780000000", "run-1/algo-2-1780000000"]
    assert found(logStreamNamePrefix="run-2/") == []
    assert len(found()) == 3
    with pytest.raises(ClientError) as refused:
        logs.filter_log_events(
            logGroupName=GROUP, logStreamNamePrefix="run-1/", logStreamNames=["run-1/algo-1-1780000000"]
        )
    assert refused.value.response["Error"]["Code"] == "InvalidParameterException"
    with pytest.raises(ClientError) as missing:
        logs.filter_log_events(logGroupName="/no/such/group", logStreamNamePrefix="run-1/")
    assert missing.value.response["Error"]["Code"] == "ResourceNotFoundException"
