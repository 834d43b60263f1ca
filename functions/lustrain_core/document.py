"""The run document's models: the state document the steps pass along, as each step reads it.

$.job (register_job's: the job id, the spec, the planner's plan and the launch plan, lustrain_core.launch_plan) and
the parts the steps after it add ($.quota, $.network, $.filesystem, $.code, $.poll, $.failure, $.recovery), each a
model here; `Run.parse` reads a whole document once. Data only: the steps (lustrain_core.steps) act on these, the
request builders (lustrain_core.aws_requests) read them, and nothing here calls AWS or decides anything.

Input is checked: `Job.from_document` checks $.job (its id, spec and plan) and the shape of every other part a step
reads, so a document that did not come from the steps before (a hand-made event, a console start with the wrong
input) fails with SpecInvalid naming the field, before anything is created, and never with a KeyError or TypeError
halfway.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    field_validator,
)

from lustrain_core.errors import MISSING, SpecInvalid
from lustrain_core.launch_plan import LaunchPlan, completed
from lustrain_core.spec import S3_URI_PATTERN, JobSpec, field_errors, validate_spec


class _Shape(BaseModel):
    """A part of the state document as the steps read it: the fields they use are checked, the rest passed on."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


_ShapeT = TypeVar("_ShapeT", bound=_Shape)


class PlannedNetwork(_Shape):
    ips_needed: NonNegativeInt
    ips_per_instance: NonNegativeInt
    vpc_cidr: str | None = None
    subnet_cidr: str | None = None


class PlannedFilesystem(_Shape):
    deployment_type: Literal["SCRATCH_2", "PERSISTENT_2"]
    storage_gib: PositiveInt | None = None
    per_unit_storage_throughput: PositiveInt | None = None


class Plan(_Shape):
    """$.job.plan as the steps read it: the planner's sizing of the network and the file system."""

    network: PlannedNetwork
    filesystem: PlannedFilesystem


class Resource(_Shape):
    type: str
    id: str


class Network(_Shape):
    """$.network, made by create_network: the subnet and security groups the file system and the job use."""

    subnet_id: str = Field(pattern=r"^subnet-[0-9a-f]{8,17}$")
    security_group_ids: list[Annotated[str, Field(pattern=r"^sg-[0-9a-f]{8,17}$")]] = Field(
        min_length=1, max_length=5
    )
    vpc_id: str | None = None
    route_table_id: str | None = None
    endpoint_id: str | None = None
    availability_zone: str | None = None
    #: True when the run built this network (and tears it down); False for network.subnet_id's
    created: bool = False
    resources: list[Resource] = Field(default_factory=list)


class LinkState(_Shape):
    """One data repository association of the run's file system, as the last poll saw it."""

    path: str | None = None
    lifecycle: str | None = None
    association_id: str | None = None
    s3_uri: str | None = None
    purpose: Literal["data", "output", "checkpoints"] | None = None


class Filesystem(_Shape):
    """$.filesystem, made by create_filesystem and each turn of check_filesystem's poll loop."""

    file_system_id: str = Field(pattern=r"^fs-[0-9a-f]{8,21}$")
    lifecycle: str | None = None
    file_system_lifecycle: str | None = None
    ready: bool = False
    dns_name: str | None = None
    mount_name: str | None = None
    directory_path: str | None = None
    output_path: str | None = None
    output_directory_path: str | None = None
    checkpoint_path: str | None = None
    checkpoint_directory_path: str | None = None
    deployment_type: str | None = None
    created: bool = False
    links: list[LinkState] = Field(default_factory=list)
    polls: NonNegativeInt = 0
    wait_seconds: NonNegativeInt = 0


class MetricDefinition(_Shape):
    Name: str
    Regex: str


class Code(_Shape):
    """$.code, made by upload_code: the bundle SageMaker downloads, stored by its content."""

    submit_directory: str = Field(pattern=S3_URI_PATTERN)
    metric_definitions: list[MetricDefinition] = Field(default_factory=list)
    bucket: str | None = None
    key: str | None = None
    sha256: str | None = None
    uploaded: bool = False
    files: NonNegativeInt = 0
    bytes: NonNegativeInt = 0


class Poll(_Shape):
    """Absent keys take the poll loop's defaults (filesystem.DEFAULT_POLL); a given one must be a whole number."""

    initial_seconds: PositiveInt | None = None
    max_seconds: PositiveInt | None = None
    max_polls: PositiveInt | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _given(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("a whole number of at least 1, or leave it out")
        return value


class Admission(_Shape):
    """$.quota: the run's place in the capacity queue (steps/queue.py) and the quota it was measured against."""

    #: the queue admitted the run: its instances are held for it until its training job exists
    admitted: bool = False
    #: the queue: instance type and purchase option (spot and on-demand count against different quotas)
    pool: str | None = None
    #: the run's place in line (first come, first served): when it first queued, then its job id
    order: str | None = None
    #: 1 for the head of the line; 0 once admitted
    position: NonNegativeInt = 0
    #: instances the runs ahead of it ask for
    ahead_instances: NonNegativeInt = 0
    #: seconds the run has waited in the queue, in all (every wait of every attempt)
    queued_s: NonNegativeInt = 0
    #: seconds to wait before the queue is asked again (0 once admitted)
    wait_seconds: NonNegativeInt = 0
    admitted_at: str | None = None


class Failure(_Shape):
    """$.failure: how the latest training attempt ended, as the state machine's Catch gives it."""

    Error: str
    Cause: str | None = None


class Attempt(_Shape):
    """One training attempt that ended without a trained model, as next_attempt found it."""

    attempt: PositiveInt
    #: None when CreateTrainingJob itself was refused (no job exists)
    training_job_name: str | None = None
    #: the job's last status (Failed, Stopped), or NotStarted
    outcome: str
    error: str
    #: its class in the run policy (lustrain_core.recovery); None for an error that is no attempt's end
    failure_class: str | None = None
    #: the last step the trainer logged (its `step` metric), and the step it resumed from (`resumed_from`)
    step_reached: NonNegativeInt | None = None
    resumed_from: NonNegativeInt | None = None
    billable_seconds: NonNegativeInt = 0
    cost_usd: float = Field(0.0, ge=0)


class Recovery(_Shape):
    """$.recovery: the attempts so far that ended without a model, and next_attempt's decision after the latest."""

    attempts: list[Attempt] = Field(default_factory=list)
    retry: bool = False
    wait_seconds: NonNegativeInt = 0
    reason: str | None = None
    #: what the training attempts so far cost (billable seconds at the plan's prices)
    spent_usd: float = Field(0.0, ge=0)
    #: SageMaker's refusals of the run's jobs (ResourceLimitExceeded): no attempt, the run went back to the queue
    refusals: NonNegativeInt = 0
    #: the latest end was such a refusal (the queue then counts the time since the admission as queued)
    refused: bool = False
    #: the export task of the checkpoints the latest attempt left on Lustre (checkpoints.to_filesystem)
    checkpoint_export: str | None = None


#: The parts of the state document besides $.job that steps read, and the step that makes each.
SECTIONS: dict[str, tuple[type[_Shape], str]] = {
    "quota": (Admission, "check_quota (the capacity queue)"),
    "network": (Network, "create_network"),
    "filesystem": (Filesystem, "create_filesystem / check_filesystem"),
    "code": (Code, "upload_code"),
    "poll": (Poll, "the state machine's Parameters"),
    "failure": (Failure, "the Catch of the training task"),
    "recovery": (Recovery, "register_job (empty), then next_attempt"),
}


@dataclass(frozen=True)
class Sections:
    """The parts of the run document beside $.job, typed: what a step reads of the steps before it."""

    quota: Admission | None = None
    network: Network | None = None
    filesystem: Filesystem | None = None
    code: Code | None = None
    poll: Poll | None = None
    failure: Failure | None = None
    recovery: Recovery | None = None

    @classmethod
    def of(cls, document: dict[str, Any], *needs: str) -> Sections:
        """Each part the document holds, checked by its model; SpecInvalid for a part in `needs` it lacks."""
        found: dict[str, Any] = {}
        for name, (model, made_by) in SECTIONS.items():
            if name in document:
                found[name] = _checked(model, document[name], name)
            elif name in needs:
                raise SpecInvalid.one(name, MISSING, f"the state document lacks $.{name} (made by {made_by})")
        return cls(**found)


def _checked(model: type[_ShapeT], value: Any, where: str) -> _ShapeT:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise SpecInvalid(field_errors(exc, where)) from None


def _check_plan(job_id: str, spec: JobSpec, plan: Any) -> Plan:
    if not re.fullmatch(rf"{re.escape(spec.name)}-[0-9a-f]{{8}}", job_id):
        raise SpecInvalid.one(
            "job.job_id",
            job_id,
            f"a job id of the form {spec.name}-<8 hex digits> (spec name, then its hash)",
        )
    checked = _checked(Plan, plan, "job.plan")
    if spec.network.subnet_id is None:
        for key in ("vpc_cidr", "subnet_cidr"):
            cidr = getattr(checked.network, key)
            try:
                ipaddress.IPv4Network(cidr or "", strict=True)
            except ValueError:
                raise SpecInvalid.one(
                    f"job.plan.network.{key}", cidr, "an IPv4 CIDR block: a new network is planned"
                ) from None
    planned = checked.filesystem
    if spec.filesystem.file_system_id is None and planned.storage_gib is None:
        raise SpecInvalid.one(
            "job.plan.filesystem.storage_gib", MISSING, "a new file system needs its capacity"
        )
    new_persistent = planned.deployment_type == "PERSISTENT_2" and spec.filesystem.file_system_id is None
    if new_persistent and planned.per_unit_storage_throughput is None:
        raise SpecInvalid.one(
            "job.plan.filesystem.per_unit_storage_throughput", MISSING, "PERSISTENT_2 needs its throughput"
        )
    return checked


@dataclass(frozen=True)
class Job:
    """The job a state document carries ($.job from register_job): its id, its spec, its plan and its launch plan
    (every decision the steps act on, compiled once by register_job: lustrain_core.launch_plan)."""

    job_id: str
    spec: JobSpec
    plan: dict[str, Any]
    launch: LaunchPlan
    #: the plan's sizing of the network and file system, typed (the rest of `plan` is the planner's report)
    planned: Plan

    @classmethod
    def from_document(cls, document: Any, *needs: str) -> Job:
        """$.job of a state document, checked with every part of the document steps read (those in `needs`
        must be there); SpecInvalid names the first field that is missing or wrong."""
        if not isinstance(document, dict):
            raise SpecInvalid.one("", document, "the state document must be a JSON object")
        job = document.get("job")
        if not isinstance(job, dict) or not job.get("job_id"):
            raise SpecInvalid.one("job", MISSING, "the state document has no registered job ($.job.job_id)")
        spec = validate_spec(job.get("spec") or {})
        if not isinstance(job["job_id"], str):
            raise SpecInvalid.one("job.job_id", job["job_id"], "the job id register_job gave, a string")
        planned = _check_plan(job["job_id"], spec, job.get("plan"))
        launch = _checked_launch(job["job_id"], spec, job.get("launch"))
        Sections.of(document, *needs)
        return cls(job["job_id"], spec, dict(job["plan"]), launch, planned)

    def tags(self, resource: str) -> list[dict[str, str]]:
        """The tags of one resource of the run: the launch plan's, and its Name (launch.names.<resource>)."""
        return self.launch.tags_named(self.name_of(resource))

    def name_of(self, resource: str) -> str:
        """The name of one resource of the run (launch.names.<resource>)."""
        return str(getattr(self.launch.names, resource))


def _checked_launch(job_id: str, spec: JobSpec, launch: Any) -> LaunchPlan:
    if launch is None:
        raise SpecInvalid.one(
            "job.launch", MISSING, "the state document lacks the launch plan register_job compiles"
        )
    try:
        checked = LaunchPlan.model_validate(completed(launch, spec) if isinstance(launch, dict) else launch)
    except ValidationError as exc:
        raise SpecInvalid(field_errors(exc, "job.launch")) from None
    if checked.job_id != job_id:
        raise SpecInvalid.one("job.launch.job_id", checked.job_id, f"the launch plan of {job_id}")
    return checked


@dataclass(frozen=True)
class Run:
    """A state document parsed once: its job, and the parts the steps before it made, each typed.

    A step parses its input with `Run.parse(document, *needs)` and reads only models from then on; what it
    returns is a model too (Network, Filesystem, Code), which its handler dumps into the next state's input.
    """

    job: Job
    sections: Sections

    @classmethod
    def parse(cls, document: Any, *needs: str) -> Run:
        job = Job.from_document(document, *needs)
        return cls(job, Sections.of(document, *needs))

    @property
    def network(self) -> Network:
        return _needed(self.sections.network, "network")

    @property
    def filesystem(self) -> Filesystem:
        return _needed(self.sections.filesystem, "filesystem")

    @property
    def code(self) -> Code:
        return _needed(self.sections.code, "code")

    @property
    def poll(self) -> Poll:
        return self.sections.poll or Poll()

    @property
    def failure(self) -> Failure:
        return _needed(self.sections.failure, "failure")

    @property
    def recovery(self) -> Recovery:
        return self.sections.recovery or Recovery()


_SectionT = TypeVar("_SectionT")


def _needed(section: _SectionT | None, name: str) -> _SectionT:
    if section is None:
        raise SpecInvalid.one(
            name, MISSING, f"the state document lacks $.{name} (made by {SECTIONS[name][1]})"
        )
    return section


def dumped(section: BaseModel) -> dict[str, Any]:
    """A step's result as the JSON its state's output carries."""
    return section.model_dump(mode="json")
