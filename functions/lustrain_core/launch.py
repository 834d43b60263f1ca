"""The launch plan: a spec compiled once, by register_job (and by `lustrain validate`, `plan` and `submit`), into
every decision a later step needs, each checked against the limits AWS enforces before anything exists.

A spec can be valid as a spec and still make a request AWS refuses: a framework_version with no SageMaker image,
a hyperparameter longer than CreateTrainingJob takes, a tag with a character FSx refuses, a name that makes a
security group called sg-... So the compiler builds every request of the run the way the steps will build them,
with placeholder ids for what only later steps know (the subnet, the security group, the file system, the code
bundle), and checks each against botocore's model and AWS's documented rules (`limits`). A refusal names the
spec's field, the value and what is allowed; nothing has been created.

The plan travels in the run document as $.job.launch (a versioned pydantic model): the steps read the image, the
hyperparameters, the environment, the resources' names and tags, the file-system links, the quota the run counts
against and the checkpoint locations from it, and decide none of them again.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lustrain_core import limits, planner
from lustrain_core.config import Settings
from lustrain_core.errors import MISSING, FieldError, SpecInvalid
from lustrain_core.spec import JobSpec

#: What a run's checkpoints are called under its location: <checkpoints.s3_uri or output.s3_uri>/<job id>/...
CHECKPOINTS_DIR = "checkpoints/"
#: The trainer learns its run, and the run it may continue, from these (the training job's Environment).
RUN_ID_VARIABLE = "LUSTRAIN_RUN_ID"
RESUME_FROM_VARIABLE = "LUSTRAIN_RESUME_FROM"
#: The input channel that brings the resumed checkpoint to the instances (SM_CHANNEL_RESUME in the container).
RESUME_CHANNEL = "resume"

#: a checkpoint's manifest, which commits it (written by lustrain's trainer beside its shards, or a version 1 step-N.pt)
MANIFEST_NAME = re.compile(r"step-(\d+)\.json")
MAX_MANIFEST_BYTES = 1024 * 1024

# placeholders for the ids later steps make: valid by AWS's own patterns, so only the spec's values are judged
PLACEHOLDER_VPC = "vpc-0123456789abcdef0"
PLACEHOLDER_SUBNET = "subnet-0123456789abcdef0"
PLACEHOLDER_GROUP = "sg-0123456789abcdef0"
PLACEHOLDER_FILE_SYSTEM = "fs-0123456789abcdef0"
PLACEHOLDER_MOUNT = "abcdefgh"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Tag(_Model):
    Key: str
    Value: str


class Names(_Model):
    """The names AWS shows for a run's resources: their Name tags, and the security group's GroupName. (Training jobs
    are named per attempt: steps.training.training_job_name.)"""

    vpc: str
    subnet: str
    route_table: str
    endpoint: str
    security_group: str
    filesystem: str
    link_data: str
    link_output: str
    training_job: str
    #: the link of checkpoints.to_filesystem (absent from plans made before it existed)
    link_checkpoints: str | None = None


class Link(_Model):
    """One path of the file system linked to an S3 prefix (a data repository association or the import path)."""

    path: str
    s3_uri: str
    purpose: Literal["data", "output", "checkpoints"]


class Quota(_Model):
    """The Service Quotas quota the run's instances count against: the live check and the plan read this."""

    name: str
    instance_type: str
    instance_count: int
    spot: bool


class Resume(_Model):
    """The checkpoint a run continues from (checkpoints.resume_from): its step's objects and the run that wrote it."""

    s3_uri: str
    step: int
    run: str | None


class TrainingPlan(_Model):
    """The training plan (reserved capacity) a run's instances come from, as register_job found it
    (compute.training_plan; DescribeTrainingPlan): the job carries its ARN, the network goes to its zone."""

    arn: str
    name: str
    #: the plan's status when the run was registered (Pending | Scheduled | Active)
    status: str
    instance_type: str
    #: the instances the plan reserves of the run's type
    instance_count: int
    availability_zone: str
    start_time: str | None = None
    end_time: str | None = None


class Preload(_Model):
    """data.preload's warm-up job (steps/preload.py): one CPU instance that reads every file of the data path on the
    run's file system before the training job starts, so that FSx loads their contents from S3 once, up front."""

    name: str
    instance_type: str
    image_uri: str
    max_runtime_seconds: int = Field(gt=0)


class LaunchPlan(_Model):
    version: Literal[1] = 1
    job_id: str
    region: str
    image_uri: str
    #: CreateTrainingJob's HyperParameters (JSON-encoded, as the SageMaker SDK sends them) but for
    #: sagemaker_submit_directory, which upload_code makes
    hyperparameters: dict[str, str]
    environment: dict[str, str]
    names: Names
    #: the tags of everything the run creates but for each resource's Name (from `names`)
    tags: list[Tag]
    link_method: Literal["dra", "import_path"]
    links: list[Link]
    output_path: str | None
    #: where the run's checkpoints live on its file system (checkpoints.to_filesystem), else None
    checkpoint_path: str | None = None
    quota: Quota
    checkpoint_s3_uri: str
    #: OutputDataConfig: SageMaker uploads the model straight under the run's archive (training.model_output_path;
    #: None in a run registered before: its results location), tarred and gzipped or as its files
    model_output_s3_uri: str | None = None
    output_compression: Literal["GZIP", "NONE"] = "GZIP"
    resume: Resume | None = None
    max_runtime_seconds: int = Field(gt=0)
    max_wait_seconds: int | None = None
    training_plan: TrainingPlan | None = None
    #: ResourceConfig.KeepAlivePeriodInSeconds (compute.keep_alive_minutes): 0 keeps no warm pool
    keep_alive_seconds: int = Field(0, ge=0)
    #: data.preload's warm-up job, else None
    preload: Preload | None = None

    def tags_named(self, name: str) -> list[dict[str, str]]:
        return [*(t.model_dump() for t in self.tags), {"Key": "Name", "Value": name}]


# --------------------------------------------------------------------------- deciding


def checkpoint_location(spec: JobSpec, job_id: str) -> str:
    """The run's own checkpoints: <checkpoints.s3_uri or output.s3_uri>/<job id>/checkpoints/. Two runs never share
    one, so a run never resumes another's final checkpoint unless checkpoints.resume_from says so."""
    return f"{spec.checkpoints_base.rstrip('/')}/{job_id}/{CHECKPOINTS_DIR}"


def names_of(job_id: str) -> Names:
    return Names(
        vpc=f"{job_id}-vpc",
        subnet=f"{job_id}-private",
        route_table=f"{job_id}-private",
        endpoint=f"{job_id}-s3",
        security_group=f"{job_id}-training",
        filesystem=f"{job_id}-lustre",
        link_data=f"{job_id}-link-data",
        link_output=f"{job_id}-link-output",
        training_job=f"{job_id}-training",
        link_checkpoints=f"{job_id}-link-checkpoints",
    )


def _hyperparameter(value: Any) -> Any:
    """A spec's hyperparameter as the trainer reads it: SageMaker passes "3" for 3, the trainer parses it back."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def check_resumable(spec: JobSpec, manifest: Any, where: str) -> None:
    """SpecInvalid unless the spec's hyperparameters make the model the checkpoint holds: the same preset, and
    every shape value the earlier run changed from it (n_layer, n_embd, ...) set to the same here."""
    field = "checkpoints.resume_from"
    shape = manifest.get("shape") if isinstance(manifest, dict) else None
    config = manifest.get("model_config") if isinstance(manifest, dict) else None
    if not isinstance(shape, dict) or not isinstance(config, dict):
        raise SpecInvalid.one(field, where, "not a checkpoint manifest of lustrain's trainer (no shape, model_config)")
    given = {key.replace("-", "_"): _hyperparameter(v) for key, v in spec.code.hyperparameters.items()}
    problems = []
    preset_then = shape.get("preset")
    preset_now = given.get("preset", shape.get("default_preset"))
    if preset_now != preset_then:
        problems.append(f"preset {preset_then} (this spec's: {preset_now})")
    overrides = shape.get("overrides") or {}
    for key in sorted(set(overrides) | (set(given) & set(config))):
        if key not in config:
            continue
        now = given.get(key)
        if now is None and key in overrides:
            problems.append(f"{key} {config[key]} (this spec leaves it to the preset)")
        elif now is not None and now != config[key]:
            problems.append(f"{key} {config[key]} (this spec's: {now})")
    if problems:
        raise SpecInvalid.one(
            field,
            spec.checkpoints.resume_from,
            f"the checkpoint {where} holds another model: it was trained with {', '.join(problems)}; set "
            "code.hyperparameters to the earlier run's model",
        )


def compile_launch(
    spec: JobSpec,
    job_id: str,
    settings: Settings,
    plan: dict[str, Any],
    resume: Resume | None = None,
    training_plan: TrainingPlan | None = None,
) -> LaunchPlan:
    """Every decision of the run, checked against what AWS accepts; SpecInvalid names each field AWS would refuse."""
    from lustrain_core.steps import TAG_CREATED_BY, TAG_JOB_ID, filesystem, preload, training

    errors: list[FieldError] = []
    image = _collect(errors, lambda: training.training_image(spec, settings.region))
    encoded = _collect(errors, lambda: training.hyperparameters(spec, "", settings.region)) or {}
    encoded.pop("sagemaker_submit_directory", None)
    env = _collect(errors, lambda: training.environment(spec)) or {}
    links = _collect(errors, lambda: filesystem.link_for(spec, job_id))
    errors += secrets_elsewhere(spec, settings.region)
    if errors or image is None or links is None:
        raise SpecInvalid(errors)
    compute = spec.compute
    wait = compute.wait_hours
    tags = {**spec.tags, TAG_JOB_ID: job_id, TAG_CREATED_BY: settings.stack_name}
    launch = LaunchPlan(
        job_id=job_id,
        region=settings.region,
        image_uri=image,
        hyperparameters=encoded,
        environment=env,
        names=names_of(job_id),
        tags=[Tag(Key=key, Value=value) for key, value in tags.items()],
        link_method=links.method,
        links=[Link(path=link.path, s3_uri=link.s3_uri, purpose=link.purpose) for link in links.links],
        output_path=links.output_path,
        checkpoint_path=links.checkpoint_path,
        quota=Quota(
            name=planner.quota_name(compute.instance_type, spot=compute.spot),
            instance_type=compute.instance_type,
            instance_count=compute.instance_count,
            spot=compute.spot,
        ),
        checkpoint_s3_uri=checkpoint_location(spec, job_id),
        model_output_s3_uri=training.model_output_path(settings, job_id),
        output_compression=planner.output_compression(spec, *planner.model_bytes(spec, plan.get("memory")))[
            0
        ],
        resume=resume,
        max_runtime_seconds=math.ceil(compute.max_runtime_hours * 3600),
        max_wait_seconds=None if wait is None else math.ceil(wait * 3600),
        training_plan=training_plan,
        keep_alive_seconds=compute.keep_alive_minutes * 60,
        preload=preload.decide(spec, job_id, settings.region, plan) if spec.data.preload else None,
    )
    _check_requests(spec, launch, plan, settings)
    return launch


def secrets_elsewhere(spec: JobSpec, region: str) -> list[FieldError]:
    """code.secrets of another region than the run's: the job reads them through an interface endpoint in its own
    region, which serves that region's secrets only."""
    return [
        FieldError(
            f"code.secrets.{name}",
            arn,
            f"a secret in {arn.split(':')[3]}, and the run's job, in {region}, reaches only {region}'s: replicate it "
            f"to {region} (Secrets Manager) or store it there",
        )
        for name, arn in spec.code.secrets.items()
        if arn.split(":")[3] != region
    ]


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
    resume: Resume | None = None,
    plan: dict[str, Any] | None = None,
    training_plan: TrainingPlan | None = None,
) -> dict[str, Any]:
    """$.job's compiled part, as register_job makes it: the normalised spec, its plan and its launch plan (the test
    stubs and the events/ samples are built by this too)."""
    if plan is None:
        plan = planner.plan(spec, data_gib=data_gib, extension_bytes=extension_bytes).to_dict()
    launch = compile_launch(spec, job_id, settings, plan, resume, training_plan)
    return {
        "job_id": job_id,
        "spec": spec.model_dump(mode="json"),
        "plan": plan,
        "launch": launch.model_dump(mode="json"),
    }


def _collect(errors: list[FieldError], decide: Any) -> Any:
    try:
        return decide()
    except SpecInvalid as exc:
        errors.extend(exc.errors)
        return None


# --------------------------------------------------------------------------- checking


def _check_requests(spec: JobSpec, launch: LaunchPlan, plan: dict[str, Any], settings: Settings) -> None:
    """Build each request of the run as its step will, with placeholder ids, and check it against AWS's limits."""
    from lustrain_core.steps import (
        Code,
        Filesystem,
        Job,
        Network,
        Plan,
        Run,
        Sections,
        filesystem,
        network,
        preload,
        training,
    )

    job = Job(launch.job_id, spec, plan, launch, Plan.model_validate(plan))
    network_section = Network(subnet_id=PLACEHOLDER_SUBNET, security_group_ids=[PLACEHOLDER_GROUP])
    run = Run(
        job,
        Sections(
            network=network_section,
            filesystem=Filesystem(file_system_id=PLACEHOLDER_FILE_SYSTEM, mount_name=PLACEHOLDER_MOUNT),
            code=Code(submit_directory=f"s3://{settings.artifacts_bucket}/{settings.code_prefix}{launch.job_id}/"),
        ),
    )
    found: list[tuple[str, limits.Problem, dict[str, Any]]] = []

    def check(service: str, operation: str, request: dict[str, Any]) -> None:
        found.extend((service, p, request) for p in limits.problems(service, operation, request))

    try:
        name = training.training_job_name(spec.name, launch.job_id, 1)
    except ValueError as exc:
        raise SpecInvalid.one("name", spec.name, str(exc)) from None
    check("sagemaker", "CreateTrainingJob", training.request_from(run, name, settings))
    if launch.preload is not None:
        check("sagemaker", "CreateTrainingJob", preload.request_from(run, settings))
    if spec.network.subnet_id is None:
        check("ec2", "CreateSecurityGroup", network.security_group_request(job, PLACEHOLDER_VPC))
        vpc = {"CidrBlock": spec.network.vpc_cidr, "TagSpecifications": network.tag_spec(job, "vpc", "vpc")}
        check("ec2", "CreateVpc", vpc)
    if spec.filesystem.file_system_id is None:
        check("fsx", "CreateFileSystem", filesystem.create_request(job, network_section, settings))
    for link in filesystem.link_for(spec, launch.job_id).dra_links:
        request = filesystem.dra_request(job, PLACEHOLDER_FILE_SYSTEM, link, settings)
        check("fsx", "CreateDataRepositoryAssociation", request)
    errors: dict[str, FieldError] = {}
    for service, problem, request in found:
        error = _as_field_error(spec, service, problem, request)
        errors.setdefault(error.path, error)
    if errors:
        raise SpecInvalid(list(errors.values()))


_BY_PATH: tuple[tuple[str, str], ...] = (
    ("TrainingJobName", "name"),
    ("GroupName", "name"),
    ("Description", "name"),
    ("ClientRequestToken", "name"),
    ("AlgorithmSpecification.TrainingImage", "image"),
    ("OutputDataConfig.S3OutputPath", "output.s3_uri"),
    ("CheckpointConfig.S3Uri", "checkpoints.s3_uri"),
    ("ResourceConfig.InstanceCount", "compute.instance_count"),
    ("ResourceConfig.InstanceType", "compute.instance_type"),
    ("ResourceConfig.VolumeSizeInGB", "output.expected_size_gib"),
    ("StoppingCondition.MaxRuntimeInSeconds", "compute.max_runtime_hours"),
    ("StoppingCondition.MaxWaitTimeInSeconds", "compute.max_wait_hours"),
    ("ResourceConfig.KeepAlivePeriodInSeconds", "compute.keep_alive_minutes"),
    ("StorageCapacity", "filesystem.storage_gib"),
    ("FileSystemPath", "filesystem.mount_path"),
    ("CidrBlock", "network.vpc_cidr"),
)


def _as_field_error(spec: JobSpec, service: str, problem: limits.Problem, request: dict[str, Any]) -> FieldError:
    """The spec field behind a refused value of a request, and what AWS allows there."""
    from lustrain_core.steps import TAG_CREATED_BY

    path = problem.path
    what = f"{service} refuses it: {problem.allowed}"
    tag = re.fullmatch(r"(?:TagSpecifications\[(\d+)\]\.)?Tags\[(\d+)\]\.(Key|Value)", path)
    if tag:
        tags = request["TagSpecifications"][int(tag[1])]["Tags"] if tag[1] else request["Tags"]
        key = tags[int(tag[2])]["Key"]
        if key in spec.tags:
            return FieldError(f"tags.{key}", key if tag[3] == "Key" else spec.tags[key], f"as a tag {tag[3].lower()}, {what}")
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
            return FieldError(f"code.environment.{key}", problem.value, f"as a training job's environment, {what}")
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
    for prefix, field in _BY_PATH:
        if path.startswith(prefix):
            if field == "image":
                field = "image.uri" if spec.image.uri else "image.framework_version"
            return FieldError(field, problem.value, what)
    return FieldError("", problem.value, f"lustrain would send {path}, and {what}")
