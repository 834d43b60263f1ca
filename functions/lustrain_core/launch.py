"""The launch compiler: a spec compiled once, by register_job (and by `lustrain validate`, `plan` and `submit`),
into the launch plan (lustrain_core.launch_plan: every decision a later step needs), each request built from it
checked against the limits AWS enforces before anything exists.

A spec can be valid as a spec and still make a request AWS refuses: a framework_version with no SageMaker image,
a hyperparameter longer than CreateTrainingJob takes, a tag with a character FSx refuses, a name that makes a
security group called sg-... So the compiler builds every request of the run with the builders the steps use
(lustrain_core.aws_requests), with placeholder ids for what only later steps know (the subnet, the security group,
the file system, the code bundle), and checks each against botocore's model and AWS's documented rules (`limits`).
A refusal names the spec's field, the value and what is allowed; nothing has been created.
"""

from __future__ import annotations

import re
from typing import Any

from lustrain_core import aws_requests, limits, planner
from lustrain_core.config import Settings
from lustrain_core.document import Code, Filesystem, Job, Network, Plan, Run, Sections
from lustrain_core.errors import MISSING, FieldError, SpecInvalid
from lustrain_core.launch_plan import TAG_CREATED_BY, Found, LaunchPlan, decide, training_job_name
from lustrain_core.spec import JobSpec

# placeholders for the ids later steps make: valid by AWS's own patterns, so only the spec's values are judged
PLACEHOLDER_VPC = "vpc-0123456789abcdef0"
PLACEHOLDER_SUBNET = "subnet-0123456789abcdef0"
PLACEHOLDER_GROUP = "sg-0123456789abcdef0"
PLACEHOLDER_FILE_SYSTEM = "fs-0123456789abcdef0"
PLACEHOLDER_MOUNT = "abcdefgh"


def compile_launch(
    spec: JobSpec,
    job_id: str,
    settings: Settings,
    plan: dict[str, Any],
    found: Found | None = None,
) -> LaunchPlan:
    """Every decision of the run, checked against what AWS accepts; SpecInvalid names each field AWS would refuse."""
    launch = decide(spec, job_id, settings, plan, found)
    _check_requests(spec, launch, plan, settings)
    return launch


def provisional_job_id(spec: JobSpec) -> str:
    """The job id a compile before register_job uses: register_job's form, its hash not yet known."""
    return f"{spec.name}-00000000"


def compile_offline(
    spec: JobSpec, *, data_gib: float | None = None, prices: Any = None, settings: Settings | None = None
) -> tuple[planner.Plan, LaunchPlan]:
    """The plan and launch plan `lustrain validate`, `plan` and `submit` check before anything is written: the
    same compiler as register_job's, with a provisional job id and no AWS calls (the S3 locations and
    checkpoints.resume_from are checked by register_job, which can read them)."""
    settings = settings or Settings.from_env()
    plan = planner.plan(spec, data_gib=data_gib, prices=prices)
    return plan, compile_launch(spec, provisional_job_id(spec), settings, plan.to_dict())


def registered(
    spec: JobSpec,
    job_id: str,
    settings: Settings,
    *,
    data_gib: float | None = None,
    extension_bytes: dict[str, int] | None = None,
    plan: dict[str, Any] | None = None,
    found: Found | None = None,
) -> dict[str, Any]:
    """$.job's compiled part, as register_job makes it: the normalised spec, its plan and its launch plan (the test
    stubs and the events/ samples are built by this too)."""
    if plan is None:
        plan = planner.plan(spec, data_gib=data_gib, extension_bytes=extension_bytes).to_dict()
    launch = compile_launch(spec, job_id, settings, plan, found)
    return {
        "job_id": job_id,
        "spec": spec.model_dump(mode="json"),
        "plan": plan,
        "launch": launch.model_dump(mode="json"),
    }


def job_of(
    spec: JobSpec, job_id: str, settings: Settings | None = None, *, data_gib: float | None = None
) -> Job:
    """The job register_job would record for `spec` under `job_id` (its plan and launch plan compiled as
    register_job compiles them), without AWS: what tests and tools build documents with."""
    made = registered(spec, job_id, settings or Settings(), data_gib=data_gib)
    return Job(
        job_id,
        spec,
        made["plan"],
        LaunchPlan.model_validate(made["launch"]),
        Plan.model_validate(made["plan"]),
    )


# --------------------------------------------------------------------------- checking


def _check_requests(spec: JobSpec, launch: LaunchPlan, plan: dict[str, Any], settings: Settings) -> None:
    """Build each request of the run as its step will, with placeholder ids, and check it against AWS's limits."""
    job = Job(launch.job_id, spec, plan, launch, Plan.model_validate(plan))
    network_section = Network(subnet_id=PLACEHOLDER_SUBNET, security_group_ids=[PLACEHOLDER_GROUP])
    run = Run(
        job,
        Sections(
            network=network_section,
            filesystem=Filesystem(file_system_id=PLACEHOLDER_FILE_SYSTEM, mount_name=PLACEHOLDER_MOUNT),
            code=Code(
                submit_directory=f"s3://{settings.artifacts_bucket}/{settings.code_prefix}{launch.job_id}/"
            ),
        ),
    )
    found: list[tuple[str, limits.Problem, dict[str, Any]]] = []

    def check(service: str, operation: str, request: dict[str, Any]) -> None:
        found.extend((service, p, request) for p in limits.problems(service, operation, request))

    try:
        name = training_job_name(spec.name, launch.job_id, 1)
    except ValueError as exc:
        raise SpecInvalid.one("name", spec.name, str(exc)) from None
    check("sagemaker", "CreateTrainingJob", aws_requests.training_job(run, name, settings))
    if launch.preload is not None:
        check("sagemaker", "CreateTrainingJob", aws_requests.preload_job(run, settings))
    if spec.network.subnet_id is None:
        check("ec2", "CreateSecurityGroup", aws_requests.security_group(job, PLACEHOLDER_VPC))
        check("ec2", "CreateVpc", aws_requests.vpc(job, spec.network.vpc_cidr))
    if spec.filesystem.file_system_id is None:
        check("fsx", "CreateFileSystem", aws_requests.file_system(job, network_section, settings))
    for link in launch.dra_links:
        request = aws_requests.data_repository_association(job, PLACEHOLDER_FILE_SYSTEM, link, settings)
        check("fsx", "CreateDataRepositoryAssociation", request)
    errors: dict[str, FieldError] = {}
    for service, problem, request in found:
        error = _as_field_error(spec, service, problem, request)
        errors.setdefault(error.path, error)
    if errors:
        raise SpecInvalid(list(errors.values()))


def _as_field_error(
    spec: JobSpec, service: str, problem: limits.Problem, request: dict[str, Any]
) -> FieldError:
    """The spec field behind a refused value of a request, and what AWS allows there."""
    path = problem.path
    what = f"{service} refuses it: {problem.allowed}"
    tag = re.fullmatch(r"(?:TagSpecifications\[(\d+)\]\.)?Tags\[(\d+)\]\.(Key|Value)", path)
    if tag:
        tags = request["TagSpecifications"][int(tag[1])]["Tags"] if tag[1] else request["Tags"]
        key = tags[int(tag[2])]["Key"]
        if key in spec.tags:
            return FieldError(
                f"tags.{key}",
                key if tag[3] == "Key" else spec.tags[key],
                f"as a tag {tag[3].lower()}, {what}",
            )
        if key == "Name":
            return FieldError("name", spec.name, f"it names the run's resources, and as a Name tag {what}")
        if key == TAG_CREATED_BY:
            return FieldError("", MISSING, f"the stack's name as a tag: {what}")
    if path in {"HyperParameters", "Environment"}:
        field = "code.hyperparameters" if path == "HyperParameters" else "code.environment"
        given = spec.code.hyperparameters if path == "HyperParameters" else spec.code.environment
        reserved = len(request[path]) - len(given)
        limit = problem.limit or 0
        return FieldError(
            field,
            len(given),
            f"at most {limit - reserved} ({service} takes {limit}; lustrain sets {reserved})",
        )
    mapping = re.fullmatch(r"(HyperParameters|Environment)\{(.*)\}(\.value)?", path, flags=re.DOTALL)
    if mapping:
        key = mapping[2]
        if mapping[1] == "Environment":
            return FieldError(
                f"code.environment.{key}", problem.value, f"as a training job's environment, {what}"
            )
        if key in spec.code.hyperparameters:
            return FieldError(f"code.hyperparameters.{key}", problem.value, f"as a hyperparameter, {what}")
        if key == "sagemaker_program":
            return FieldError("code.entry_point", spec.code.entry_point, what)
    if path.startswith("DataRepositoryPath"):
        field = "output.s3_uri" if request.get("S3", {}).get("AutoExportPolicy") else "data.s3_uri"
        return FieldError(field, problem.value, what)
    if "DirectoryPath" in path:
        return FieldError("filesystem.mount_path", spec.filesystem.mount_path, what)
    if "S3DataSource" in path:
        return FieldError("checkpoints.resume_from", spec.checkpoints.resume_from, what)
    for prefix, field in aws_requests.SPEC_FIELDS:
        if path.startswith(prefix):
            if field == "image":
                field = "image.uri" if spec.image.uri else "image.framework_version"
            return FieldError(field, problem.value, what)
    return FieldError("", problem.value, f"lustrain would send {path}, and {what}")
