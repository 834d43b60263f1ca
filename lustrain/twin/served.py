"""Where a running `lustrain local up` serves the twin, so that other commands (`local invoke`) use it.

`local up` records the URL it prints in a small state file under the user's cache
($XDG_CACHE_HOME/lustrain/, else ~/.cache/lustrain/), one file per port, and removes it when it stops. A reader
looks first at AWS_ENDPOINT_URL (what `local up` tells the user to export), then at the recorded servers, newest
first, and takes the first that answers as the twin: its stack's outputs answer DescribeStacks. A server that
was killed leaves its file behind; it does not answer, and its file is removed when found so.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: how long a look at a server may take: a local server answers in milliseconds, a dead port refuses at once
PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Served:
    url: str
    #: where it was found: "AWS_ENDPOINT_URL" or the state file's path
    found_in: str


def state_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "lustrain"


def state_file(port: int) -> Path:
    return state_dir() / f"local-up-{port}.json"


def record(url: str, port: int, stack_name: str) -> Path:
    """Note that this process serves the twin at `url` (removed by `forget`)."""
    path = state_file(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid(), "stack": stack_name, "started": time.time()}))
    tmp.replace(path)
    return path


def forget(port: int) -> None:
    state_file(port).unlink(missing_ok=True)


def answers(url: str, stack_name: str) -> bool:
    """Whether `url` is a twin serving `stack_name`: its DescribeStacks knows the stack."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    client = boto3.client(
        "cloudformation",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="twin",
        aws_secret_access_key="twin",  # noqa: S106 - the twin's fake credentials
        config=Config(
            connect_timeout=PROBE_TIMEOUT_S, read_timeout=PROBE_TIMEOUT_S, retries={"max_attempts": 1}
        ),
    )
    try:
        return bool(client.describe_stacks(StackName=stack_name)["Stacks"])
    except (BotoCoreError, ClientError, ValueError):
        return False


def find(stack_name: str) -> tuple[Served | None, list[str]]:
    """The running twin to use, and what was looked at and passed over (for the message when there is none)."""
    passed: list[str] = []
    env_url = os.environ.get("AWS_ENDPOINT_URL")
    if env_url:
        if answers(env_url, stack_name):
            return Served(env_url, "AWS_ENDPOINT_URL"), passed
        passed.append(f"AWS_ENDPOINT_URL={env_url} does not answer as the twin's stack {stack_name}")
    recorded: list[tuple[float, str, Path]] = []
    for path in state_dir().glob("local-up-*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            doc: dict[str, Any] = json.loads(path.read_text())
            recorded.append((float(doc.get("started", 0)), str(doc["url"]), path))
    for _, url, path in sorted(recorded, reverse=True):
        if url == env_url:
            continue
        if answers(url, stack_name):
            return Served(url, str(path)), passed
        passed.append(f"{url} (recorded in {path}) does not answer")
        path.unlink(missing_ok=True)
    return None, passed
