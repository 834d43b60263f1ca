"""Teardown's storage family: a file system's export to S3 (output written to Lustre), its running data
repository tasks, its associations, then the file system itself, waited for until gone; links the run made on a
file system it reused. A kept file system stays; an export that failed keeps it too."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from lustrain_core.aws_errors import error_code, not_found
from lustrain_core.aws_requests import TAG_KEEP
from lustrain_core.launch_plan import tag_dict
from lustrain_core.steps import exports
from lustrain_core.steps import filesystem as fsx_step
from lustrain_core.steps.teardown_base import BUSY, RUNNING_TASK, SETTLING_FS, Scope


class FileSystems(Scope):
    def _tasks(self, fs_id: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        params: dict[str, Any] = {"Filters": [{"Name": "file-system-id", "Values": [fs_id]}]}
        while True:
            page = self.fsx.describe_data_repository_tasks(**params)
            found.extend(page.get("DataRepositoryTasks", []))
            if not page.get("NextToken"):
                return found
            params["NextToken"] = page["NextToken"]

    def export(self, fs_id: str, paths: list[str]) -> str | None:
        """Run this job's export of `paths` to S3 and wait for it; None when done, else why not."""
        while True:
            tasks = self._tasks(fs_id)
            # the teardown's own export: one an attempt's end started (exports.ATTEMPT_LABEL) may have run before
            # the last attempt wrote its checkpoints, so its success says nothing about what is in S3 now
            mine = [
                t
                for t in tasks
                if t.get("Type") == "EXPORT_TO_REPOSITORY"
                and self.ours(t.get("Tags"))
                and exports.label_of(t) == exports.TEARDOWN_LABEL
            ]
            if any(t["Lifecycle"] == "SUCCEEDED" for t in mine):
                return None
            failed = [t for t in mine if t["Lifecycle"] in {"FAILED", "CANCELED"}]
            running = [t for t in tasks if t["Lifecycle"] in RUNNING_TASK]
            if failed and not running:
                message = failed[-1].get("FailureDetails", {}).get("Message") or failed[-1]["Lifecycle"]
                return f"the export of {', '.join(paths)} to S3 did not succeed ({message})"
            if not running:
                try:
                    self.fsx.create_data_repository_task(
                        **exports.export_request(
                            fs_id, paths, self.job_id, self.settings.stack_name, exports.TEARDOWN_LABEL
                        )
                    )
                except ClientError as exc:
                    if error_code(exc) not in BUSY:
                        raise
                continue
            if not self.clock.wait():
                return f"the export of {', '.join(paths)} to S3 is still running"

    def delete_file_system(self, fs_id: str, keep: bool, export_paths: list[str]) -> str | None:
        """Delete one of the run's file systems; None when gone or kept, else what still blocks it."""
        entry = {"type": "file_system", "id": fs_id}
        fs = fsx_step.describe(self.fsx, fs_id)
        if fs is None:
            self.report.already_gone.append(entry)
            return None
        if not self.ours(fs.get("Tags")):
            self.report.kept.append({**entry, "reason": "not tagged as this job's: never deleted"})
            return None
        keep = keep or tag_dict(fs.get("Tags")).get(TAG_KEEP) == "true"
        while fs["Lifecycle"] in SETTLING_FS:
            if not self.clock.wait():
                return f"file system {fs_id} is still {fs['Lifecycle']}"
            fs = fsx_step.describe(self.fsx, fs_id)
            if fs is None:
                self.report.already_gone.append(entry)
                return None
        if export_paths and fs["Lifecycle"] == "AVAILABLE":
            problem = self.export(fs_id, export_paths)
            if problem is not None and "still running" in problem:
                return problem
            if problem is not None:
                self.report.kept.append({**entry, "reason": f"{problem}: kept so the results are not lost"})
                return None
        if keep:
            self.report.kept.append({**entry, "reason": "filesystem.keep is true"})
            return None
        while any(t["Lifecycle"] in RUNNING_TASK for t in self._tasks(fs_id)):
            if not self.clock.wait():
                return f"file system {fs_id} is still running a data repository task"
        for dra in fsx_step.associations(self.fsx, fs_id):
            if dra.get("Lifecycle") != "DELETING":
                self._delete_association(dra["AssociationId"])
        deployment = fs.get("LustreConfiguration", {}).get("DeploymentType", "")
        params: dict[str, Any] = {"FileSystemId": fs_id, "ClientRequestToken": f"{self.job_id}-delete"[:63]}
        if str(deployment).startswith("PERSISTENT"):
            params["LustreConfiguration"] = {"SkipFinalBackup": True}
        while fs is not None and fs["Lifecycle"] != "DELETING":
            try:
                self.fsx.delete_file_system(**params)
                break
            except ClientError as exc:
                if not_found(exc):
                    self.report.already_gone.append(entry)
                    return None
                if error_code(exc) not in BUSY:
                    raise
            if not self.clock.wait():
                return f"file system {fs_id} cannot be deleted yet"
            fs = fsx_step.describe(self.fsx, fs_id)
        self.report.deleted.append(entry)
        while fsx_step.describe(self.fsx, fs_id) is not None:
            if not self.clock.wait():
                return f"file system {fs_id} is still DELETING"
        return None

    def _delete_association(self, association_id: str) -> None:
        entry = {"type": "data_repository_association", "id": association_id}
        try:
            # the S3 side stays; the files in Lustre go with the file system or stay with a reused one
            self.fsx.delete_data_repository_association(
                AssociationId=association_id, DeleteDataInFileSystem=False
            )
        except ClientError as exc:
            if not_found(exc):
                self.report.already_gone.append(entry)
                return
            raise
        self.report.deleted.append(entry)

    def delete_association(self, association_id: str, owned_fs: set[str]) -> None:
        """A link the run made on a file system it did not create (a reused one gets its output link removed).

        Links on the run's own file systems went with them, or stay with a kept one."""
        entry = {"type": "data_repository_association", "id": association_id}
        try:
            found = self.fsx.describe_data_repository_associations(AssociationIds=[association_id])[
                "Associations"
            ]
        except ClientError as exc:
            if not not_found(exc):
                raise
            found = []
        if not found or found[0].get("Lifecycle") == "DELETING":
            self.report.already_gone.append(entry)
            return
        if found[0].get("FileSystemId") in owned_fs:
            self.report.kept.append(
                {**entry, "reason": f"stays with its file system {found[0]['FileSystemId']}"}
            )
            return
        if not self.ours(found[0].get("Tags")):
            self.report.kept.append({**entry, "reason": "not tagged as this job's: never deleted"})
            return
        self._delete_association(association_id)
