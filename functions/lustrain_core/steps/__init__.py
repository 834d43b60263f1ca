"""The AWS steps of a run, one module per area; each handler calls one function here.

Steps take boto3 clients (and the state document's pieces) as arguments and never build clients themselves, so a
test hands them moto's or an in-memory fake. What every step shares lives here: how the job of a state document
is read back, and how everything a run creates is tagged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lustrain_core.errors import MISSING, SpecInvalid
from lustrain_core.spec import JobSpec, validate_spec

#: Tag keys on everything a run creates: teardown deletes only what carries this job's id.
TAG_JOB_ID = "lustrain:job-id"
TAG_CREATED_BY = "lustrain:created-by"


def job_tags(job_id: str, stack_name: str, spec_tags: dict[str, str], what: str) -> list[dict[str, str]]:
    """The tags of one resource of a run: the spec's, then lustrain's (which the spec may not override)."""
    tags = {**spec_tags, "Name": f"{job_id}-{what}", TAG_JOB_ID: job_id, TAG_CREATED_BY: stack_name}
    return [{"Key": key, "Value": value} for key, value in tags.items()]


def tag_dict(tags: list[dict[str, str]] | None) -> dict[str, str]:
    """AWS's [{Key, Value}] as a dict."""
    return {t["Key"]: t["Value"] for t in tags or []}


@dataclass(frozen=True)
class Job:
    """The job a state document carries ($.job from register_job): its id, its spec and its plan."""

    job_id: str
    spec: JobSpec
    plan: dict[str, Any]

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> Job:
        job = document.get("job")
        if not isinstance(job, dict) or not job.get("job_id"):
            raise SpecInvalid.one("job", MISSING, "the state document has no registered job ($.job.job_id)")
        return cls(str(job["job_id"]), validate_spec(job.get("spec") or {}), dict(job.get("plan") or {}))

    def tags(self, stack_name: str, what: str) -> list[dict[str, str]]:
        return job_tags(self.job_id, stack_name, dict(self.spec.tags), what)
