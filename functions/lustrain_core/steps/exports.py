"""Exports of what a run writes to Lustre (output.to_filesystem, checkpoints.to_filesystem) to its S3 prefixes.

An export is an FSx data repository task of Type EXPORT_TO_REPOSITORY over the run's paths (CreateDataRepositoryTask;
"Data repository tasks", FSx for Lustre User Guide). Each path goes to the S3 prefix its data repository
association links (on a file system linked by ImportPath, to its ExportPath), and a path FSx cannot export fails
the task. Paths are given relative to the file system's root, without the leading "/" (the API reference's
example is "path1"; at most 100 of them). A file system runs one task at a time: another is refused with
DataRepositoryTaskExecuting until the first ends.

Two exports per run, told apart by their EXPORT_TAG:
- at the end of each attempt (ATTEMPT_LABEL, started by next_attempt and not waited for: the next attempt resumes
  from Lustre, the export only puts that attempt's checkpoints in S3 as well);
- before the file system is deleted (TEARDOWN_LABEL, run by teardown, which waits for it to SUCCEED and keeps a
  file system whose export failed: steps/teardown_storage.py). Its polling is the teardown step's, inside its
  Lambda invocations and the state machine's Retry on TeardownIncomplete, so it adds no state to the execution's
  history beyond that Retry's bound (tests/unit/test_history_budget.py).
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from lustrain_core.aws_errors import error_code
from lustrain_core.launch_plan import TAG_CREATED_BY, TAG_JOB_ID, tag_dict

#: which export a task is: "teardown", or "attempt-<n>" for the end of attempt n
EXPORT_TAG = "lustrain:export"
TEARDOWN_LABEL = "teardown"
ATTEMPT_LABEL = "attempt-{number}"
#: CreateDataRepositoryTask's Paths holds at most this many (botocore's DataRepositoryTaskPaths)
MAX_PATHS = 100
#: FSx's answer while another data repository task of the file system runs
EXECUTING = "DataRepositoryTaskExecuting"


def task_paths(paths: list[str]) -> list[str]:
    """Paths as CreateDataRepositoryTask takes them: relative to the file system's root."""
    relative = [p.strip("/") for p in paths if p.strip("/")]
    if not relative or len(relative) > MAX_PATHS:
        raise ValueError(
            f"an export names 1 to {MAX_PATHS} paths below the file system's root, not {paths!r}"
        )
    return relative


def export_request(fs_id: str, paths: list[str], job_id: str, stack_name: str, label: str) -> dict[str, Any]:
    """The CreateDataRepositoryTask of one of the run's exports, tagged as the run's and by its label."""
    return {
        "Type": "EXPORT_TO_REPOSITORY",
        "FileSystemId": fs_id,
        "Paths": task_paths(paths),
        "Report": {"Enabled": False},
        # idempotent per export: a retried invocation gets the same task, not a second one
        "ClientRequestToken": f"{job_id}-{label}"[:63],
        "Tags": [
            {"Key": TAG_JOB_ID, "Value": job_id},
            {"Key": TAG_CREATED_BY, "Value": stack_name},
            {"Key": EXPORT_TAG, "Value": label},
        ],
    }


def label_of(task: dict[str, Any]) -> str:
    """A task's export label; a task from before the labels is teardown's (the only export there was)."""
    return tag_dict(task.get("Tags")).get(EXPORT_TAG, TEARDOWN_LABEL)


def start_export(
    fsx: Any, fs_id: str, paths: list[str], job_id: str, stack_name: str, label: str
) -> str | None:
    """Start one export and return its task id; None when FSx runs another task of the file system now (that
    export, or an earlier one, is then the one the teardown's waits for before its own)."""
    try:
        task = fsx.create_data_repository_task(**export_request(fs_id, paths, job_id, stack_name, label))
    except ClientError as exc:
        if error_code(exc) == EXECUTING:
            return None
        raise
    return str(task["DataRepositoryTask"]["TaskId"])
