"""A run's TensorBoard files (`lustrain tensorboard RUN`): where its training jobs upload them, copied to this
machine, and TensorBoard served over the copy.

Each training job's TensorBoardOutputConfig names the run's own `s3://<artifacts>/archive/<job id>/jobs/`, under
which SageMaker puts each attempt's files at `<training job>/tensorboard-output/` (lustrain.report's
`tensorboard_logdir`). TensorBoard reads a local directory without any plugin, and the twin's S3 is reached only
through boto3, so the files are copied: one directory per attempt, named by its training job, which TensorBoard
shows as one run each.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lustrain_core.errors import UsageInvalid

from lustrain import operate, report

#: the part of an object's key under the logdir that SageMaker adds before the LocalPath's own files
OUTPUT_DIR = "tensorboard-output/"


@dataclass(frozen=True)
class BoardFiles:
    job_id: str
    #: where the run's training jobs upload their files (tensorboard --logdir takes it where S3 is reachable)
    logdir: str
    #: where they were copied, and how many event files
    local_dir: str
    files: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fetch(stack: operate.Stack, run: str, into: str | Path) -> BoardFiles:
    """Copy every attempt's TensorBoard files of the run to <into>/<job id>/<training job>/."""
    record = operate.find_run(stack, run)
    logdir = report.tensorboard_logdir(operate.training_jobs(stack, record))
    if logdir is None:
        raise UsageInvalid.one("RUN", run, "has no training job with TensorBoard output yet")
    bucket, _, prefix = logdir.removeprefix("s3://").partition("/")
    target = Path(into) / record.job_id
    s3 = stack.client("s3")
    copied = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for listed in page.get("Contents", []):
            key = str(listed["Key"])
            job, _, rest = key[len(prefix) :].partition("/")
            if not rest.startswith(OUTPUT_DIR) or "tfevents" not in rest:
                continue
            local = target / job / rest[len(OUTPUT_DIR) :]
            local.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, key, str(local))
            copied += 1
    return BoardFiles(record.job_id, logdir, str(target), copied)


def serve(directory: str | Path, port: int) -> str:
    """TensorBoard over `directory` on 127.0.0.1:`port` (0: a free one), in TensorBoard's own daemon thread (it ends
    with this process); its URL."""
    from tensorboard import program

    board = program.TensorBoard()
    board.configure(argv=[None, "--logdir", str(directory), "--host", "127.0.0.1", "--port", str(port)])
    return str(board.launch())


def show(found: BoardFiles, run: str, port: int | None = None, for_seconds: float | None = None) -> None:
    """Say where the files are and how to view them; with a `port`, serve TensorBoard over them until Ctrl-C (or
    `for_seconds`)."""
    print(f"TensorBoard files of run {found.job_id}: {found.logdir}")
    print(f"  {found.files} event files copied to {found.local_dir}")
    if port is None:
        print(f"view them: tensorboard --logdir {found.local_dir}   (or: lustrain tensorboard {run} --serve)")
        return
    print(f"TensorBoard: {serve(found.local_dir, port)}  (Ctrl-C stops it)", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait(for_seconds)
