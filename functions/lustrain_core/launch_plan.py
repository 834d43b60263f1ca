"""The launch plan: every decision a run's requests carry, made once from the spec, and its model.

register_job compiles it (lustrain_core.launch, which also checks each request built from it against what AWS
accepts) and records it in the run document as $.job.launch; the steps read the image, the hyperparameters, the
environment, the instances, the resources' names and tags, the file-system links, the quota, the checkpoint
locations and the output from it, and decide none of them again. The request builders (lustrain_core.aws_requests)
turn it, with the ids the steps before made and the stack's settings, into AWS requests, and read no spec.

Adding a spec field that reaches CreateTrainingJob touches four files: spec.py (the field and its check), this
module (a LaunchPlan field and the line of `decide` that sets it), aws_requests.py (where the request carries it,
and the request path's spec field in SPEC_FIELDS when AWS limits it) and docs/how-a-run-goes.md (the field's row of
its launch-plan-fields table, which tests/unit/test_contract.py holds to LaunchPlan's fields; docs/spec.md tells users
of the field, unheld). tests/unit/test_module_layout.py holds the builders to that. A field whose value register_job must first
read in AWS (as compute.training_plan's) adds that read and its place in `Found` (steps/job.py fills it).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lustrain_core import images, instance_types, planner, secrets_launcher, teams
from lustrain_core.config import Settings
from lustrain_core.errors import FieldError, SpecInvalid
from lustrain_core.spec import JobSpec
from lustrain_core.trainer import presets as trainer_presets

#: Tag keys on everything a run creates: teardown deletes only what carries this job's id.
TAG_JOB_ID = "lustrain:job-id"
TAG_CREATED_BY = "lustrain:created-by"


def tag_dict(tags: list[dict[str, str]] | None) -> dict[str, str]:
    """AWS's [{Key, Value}] as a dict."""
    return {t["Key"]: t["Value"] for t in tags or []}


#: where under the run's archive SageMaker uploads each training job's output (model_output_path; steps/archive.py)
JOBS_DIR = "jobs/"
#: SageMaker's own default volume; EBS-only instance types need one sized for model, output and checkpoints
DEFAULT_VOLUME_GIB = 30
#: the trainer's own variables (the run's id, the run it continues)
RESERVED_ENVIRONMENT_PREFIX = "LUSTRAIN_"
#: data.preload's warm-up job: <spec name>-<8 hex of the job id>-warmup (at most 40 + 1 + 8 + 7 characters)
PRELOAD_SUFFIX = "warmup"
#: the PyTorch image's version the warm-up runs when the spec brings its own image (image.uri): any image with a
#: POSIX shell, find, xargs and cat would do, and this one is SageMaker's own
PRELOAD_IMAGE_VERSION = "2.8"

#: What a run's checkpoints are called under its location: <checkpoints.s3_uri or output.s3_uri>/<job id>/...
CHECKPOINTS_DIR = "checkpoints/"
#: the folder of a run's results output.to_filesystem exports to (output_location)
OUTPUT_DIR = "output/"
#: The trainer learns its run, and the run it may continue, from these (the training job's Environment).
RUN_ID_VARIABLE = "LUSTRAIN_RUN_ID"
RESUME_FROM_VARIABLE = "LUSTRAIN_RESUME_FROM"
#: The input channel that brings the resumed checkpoint to the instances (SM_CHANNEL_RESUME in the container).
RESUME_CHANNEL = "resume"

#: a checkpoint's manifest, which commits it (written by lustrain's trainer beside its shards, or a version 1 step-N.pt)
MANIFEST_NAME = re.compile(r"step-(\d+)\.json")
MAX_MANIFEST_BYTES = 1024 * 1024


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Tag(_Model):
    Key: str
    Value: str


class Names(_Model):
    """The names AWS shows for a run's resources: their Name tags, and the security group's GroupName. (Training jobs
    are named per attempt: training_job_name.)"""

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


class Instances(_Model):
    """What the training job asks SageMaker for: ResourceConfig's instances and volume, spot, the health check."""

    instance_type: str
    instance_count: int = Field(gt=0)
    #: EnableManagedSpotTraining (and SageMaker's own restarts in place: RetryStrategy)
    spot: bool
    #: ResourceConfig.VolumeSizeInGB; None on a type whose local NVMe holds everything (SageMaker refuses a volume)
    volume_size_gib: int | None
    #: InfraCheckConfig: SageMaker's check of the instances' hardware and network before the script starts
    infra_check: bool


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
    #: OutputDataConfig.S3OutputPath of the warm-up (it writes nothing there)
    output_s3_uri: str


class LaunchPlan(_Model):
    version: Literal[1] = 1
    job_id: str
    #: the team the run belongs to (lustrain_core.teams): its session tag lustrain-team and tag lustrain:team
    team: str = teams.DEFAULT_TEAM
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
    instances: Instances
    quota: Quota
    checkpoint_s3_uri: str
    #: OutputDataConfig: SageMaker uploads the model straight under the run's archive (model_output_path), tarred
    #: and gzipped or as its files
    model_output_s3_uri: str
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

    @property
    def data_path(self) -> str:
        """Where the data appears on the file system (filesystem.mount_path; "/" for the import path)."""
        return next(link.path for link in self.links if link.purpose == "data")

    @property
    def dra_links(self) -> list[Link]:
        """The links made as data repository associations (all but the import path's)."""
        return [link for link in self.links if self.link_method == "dra" or link.purpose != "data"]

    @property
    def export_paths(self) -> list[str]:
        """The paths whose files reach S3 only by an export (output and checkpoints written to Lustre)."""
        return [path for path in (self.output_path, self.checkpoint_path) if path]


# --------------------------------------------------------------------------- deciding


@dataclass(frozen=True)
class Found:
    """What register_job read in AWS for the launch plan (steps/job.py): none of it in a compile before a run is
    registered (`lustrain validate`, `plan`, `submit`)."""

    #: the checkpoint checkpoints.resume_from names, its manifest read
    resume: Resume | None = None
    #: compute.training_plan, as DescribeTrainingPlan answered
    training_plan: TrainingPlan | None = None
    #: the team the run belongs to (lustrain_core.teams), from where it was started
    team: str = teams.DEFAULT_TEAM


def decide(
    spec: JobSpec, job_id: str, settings: Settings, plan: dict[str, Any], found: Found | None = None
) -> LaunchPlan:
    """Every decision of the run; SpecInvalid names each field that cannot be decided (lustrain_core.launch then
    checks the requests built from it against what AWS accepts)."""
    found = found or Found()
    errors: list[FieldError] = []
    image = _collect(errors, lambda: training_image(spec, settings.region))
    encoded = _collect(errors, lambda: hyperparameters(spec, "", settings.region)) or {}
    encoded.pop("sagemaker_submit_directory", None)
    env = _collect(errors, lambda: environment(spec)) or {}
    links = _collect(errors, lambda: link_for(spec, job_id))
    instances = _collect(errors, lambda: instances_of(spec))
    errors += secrets_elsewhere(spec, settings.region)
    if errors or image is None or links is None or instances is None:
        raise SpecInvalid(errors)
    compute = spec.compute
    wait = compute.wait_hours
    tags = {**spec.tags, TAG_JOB_ID: job_id, TAG_CREATED_BY: settings.stack_name, teams.TAG_TEAM: found.team}
    compression, _ = planner.output_compression(spec, *planner.model_bytes(spec, plan.get("memory")))
    return LaunchPlan(
        job_id=job_id,
        team=found.team,
        region=settings.region,
        image_uri=image,
        hyperparameters=encoded,
        environment=env,
        names=names_of(job_id),
        tags=[Tag(Key=key, Value=value) for key, value in tags.items()],
        link_method=links.method,
        links=list(links.links),
        output_path=links.output_path,
        checkpoint_path=links.checkpoint_path,
        instances=instances,
        quota=Quota(
            name=planner.quota_name(instances.instance_type, spot=instances.spot),
            instance_type=instances.instance_type,
            instance_count=instances.instance_count,
            spot=instances.spot,
        ),
        checkpoint_s3_uri=checkpoint_location(spec, job_id),
        model_output_s3_uri=model_output_path(settings, job_id),
        output_compression=compression,
        resume=found.resume,
        max_runtime_seconds=math.ceil(compute.max_runtime_hours * 3600),
        max_wait_seconds=None if wait is None else math.ceil(wait * 3600),
        training_plan=found.training_plan,
        keep_alive_seconds=compute.keep_alive_minutes * 60,
        preload=preload_of(spec, job_id, settings.region, plan) if spec.data.preload else None,
    )


def _collect(errors: list[FieldError], decide: Any) -> Any:
    try:
        return decide()
    except SpecInvalid as exc:
        errors.extend(exc.errors)
        return None


def completed(launch: dict[str, Any], spec: JobSpec) -> dict[str, Any]:
    """A launch plan recorded before some of its decisions were (a run registered by an earlier release and still
    running), with those decisions made now by the same functions as `decide`'s: its instances, its model's
    location (then its results location's <job id>/) and its warm-up's output."""
    done = dict(launch)
    job_id = str(done.get("job_id"))
    if "instances" not in done:
        with contextlib.suppress(SpecInvalid):  # LaunchPlan's own check then says the field is missing
            done["instances"] = instances_of(spec).model_dump(mode="json")
    if done.get("model_output_s3_uri") is None:
        done["model_output_s3_uri"] = f"{spec.output.s3_uri.rstrip('/')}/{job_id}/"
    preload = done.get("preload")
    if isinstance(preload, dict) and "output_s3_uri" not in preload:
        done["preload"] = {**preload, "output_s3_uri": preload_output(spec, job_id)}
    return done


def instances_of(spec: JobSpec) -> Instances:
    """The training job's instances, from compute and the instance catalogue: a volume only where the type has no
    local NVMe (sized for the model, its output and the local checkpoint copies), the health check for a fleet."""
    compute = spec.compute
    itype = instance_types.INSTANCE_TYPES.get(compute.instance_type)
    if itype is None:
        raise SpecInvalid.one(
            "compute.instance_type",
            compute.instance_type,
            f"unknown to lustrain; known: {', '.join(sorted(instance_types.INSTANCE_TYPES))}",
        )
    volume: int | None = None
    if not itype.local_nvme:
        on_volume = 0.0 if spec.output.to_filesystem else spec.output.expected_size_gib
        volume = max(DEFAULT_VOLUME_GIB, math.ceil(2 * on_volume))
    return Instances(
        instance_type=compute.instance_type,
        instance_count=compute.instance_count,
        spot=compute.spot,
        volume_size_gib=volume,
        # where one bad host stalls them all: several instances of a type that has the check
        infra_check=compute.instance_count > 1 and itype.infra_check,
    )


def output_location(spec: JobSpec, job_id: str) -> str:
    """Where output.to_filesystem's files reach S3: <output.s3_uri>/<job id>/output/, the run's own folder (never the
    team's folder itself, where FSx's export, which no job's role limits, would write beside other runs' folders),
    beside its checkpoints."""
    return f"{spec.output.s3_uri.rstrip('/')}/{job_id}/{OUTPUT_DIR}"


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
        raise SpecInvalid.one(
            field, where, "not a checkpoint manifest of lustrain's trainer (no shape, model_config)"
        )
    given = {key.replace("-", "_"): _hyperparameter(v) for key, v in spec.code.hyperparameters.items()}
    problems = []
    # a preset renamed since (70b, now gpt-64b) is the same model under its name now
    preset_then = trainer_presets.RENAMED.get(str(shape.get("preset")), shape.get("preset"))
    preset_now = given.get("preset", shape.get("default_preset"))
    if preset_now != preset_then:
        problems.append(f"preset {preset_then} (this spec's: {preset_now})")
    # Llama 3's rope scaling is one entry of the model's config (rope_scaling), set by rope_scaling_factor: a model
    # saved without it (before the llama3.1 and llama3.2 presets had it) continues only with the factor set to 0
    scaling_then = float((config.get("rope_scaling") or {}).get("factor") or 0)
    preset_values = trainer_presets.PRESETS.get(str(preset_now), {})
    scaling_now = float(given.get("rope_scaling_factor", preset_values.get("rope_scaling_factor", 0)) or 0)
    if config.get("arch") == "llama" and scaling_now != scaling_then:
        problems.append(f"rope_scaling_factor {scaling_then:g} (this spec's: {scaling_now:g}: set "
                        f"code.hyperparameters.rope_scaling_factor to {scaling_then:g} to continue it)")
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


NAME_PATTERN = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
MAX_NAME = 63


def job_hex(job_id: str, spec_name: str) -> str:
    """The 8 hex digits of a job id (`<spec name>-<8 hex>`, register_job's form)."""
    match = re.fullmatch(rf"{re.escape(spec_name)}-([0-9a-f]{{8}})", job_id)
    if match is None:
        raise SpecInvalid.one("job.job_id", job_id, f"a job id of the form {spec_name}-<8 hex digits>")
    return match[1]


def training_job_name(spec_name: str, job_id: str, attempt: int) -> str:
    """`<spec name>-<8 hex of job id>-<attempt>`: at most 40 + 1 + 8 + 1 + digits, well within SageMaker's 63."""
    name = f"{spec_name}-{job_hex(job_id, spec_name)}-{attempt}"
    if attempt < 1 or len(name) > MAX_NAME or not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"training job name {name!r} breaks SageMaker's rule: at most {MAX_NAME} characters matching "
            f"{NAME_PATTERN.pattern}"
        )
    return name


def archive_target(settings: Settings, job_id: str) -> str:
    return f"s3://{settings.artifacts_bucket}/{settings.archive_prefix}{job_id}/"


def model_output_path(settings: Settings, job_id: str) -> str:
    """OutputDataConfig.S3OutputPath: under the run's archive, so that the model is archived where SageMaker
    uploads it and never copied (steps/archive.py); the execution role writes there only for its own run."""
    return archive_target(settings, job_id) + JOBS_DIR


def hyperparameters(
    spec: JobSpec, submit_directory: str, region: str, plan: dict[str, Any] | None = None
) -> dict[str, str]:
    """Script mode's hyperparameters: every value JSON-encoded, as the SageMaker SDK sends them. Their limits
    (count, key and value lengths) are CreateTrainingJob's, checked by the launch compiler against its model.

    The trainer's checkpoint_every_minutes is the plan's (goodput.checkpoint_every_minutes: checkpoints.every_minutes,
    else Young-Daly's optimum), from `plan` (the run's $.job.plan) or, without one, from the spec planned here; it
    is left out where the plan has none (no preset named: the entry point may not be lustrain's trainer), and a
    checkpoint_every_minutes in code.hyperparameters is the user's own (the planner checks it)."""
    values: dict[str, Any] = {
        # with code.secrets SageMaker starts the launcher upload_code adds, which reads them and runs the entry point
        "sagemaker_program": secrets_launcher.LAUNCHER_FILE if spec.code.secrets else spec.code.entry_point,
        "sagemaker_submit_directory": submit_directory,
        "sagemaker_region": region,
    }
    if spec.code.distribution == "torchrun":
        values["sagemaker_torch_distributed_enabled"] = True
    every = spec.checkpoints.every_minutes
    if every is None:
        try:
            goodput = plan.get("goodput") if plan is not None else planner.plan(spec).goodput
        except SpecInvalid:
            # the spec alone does not plan here (the run's plan had measured data or other prices): the run's own
            # plan, which register_job and the CLI check before this, says why; the trainer then saves by steps
            goodput = None
        every = planner.trainer_checkpoint_every_minutes(goodput)
    if every is not None:
        values["checkpoint_every_minutes"] = every
    values.update(spec.code.hyperparameters)
    return {key: json.dumps(value) for key, value in values.items()}


#: The job's environment unless the spec sets them. SageMaker's PyTorch images pass no stop's SIGTERM on to the entry
#: point (stop_request.py: the stack asks through the run's stop request instead); an image of the team's own may,
#: and torchrun then forwards it to its workers and kills them 30 s later unless TORCH_ELASTIC_SHUTDOWN_TIMEOUT (read
#: from torch 2.12 on) says otherwise: 110 s leaves such a stop's checkpoint the most of SageMaker's 120 s.
ENVIRONMENT_DEFAULTS = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "110"}


def environment(spec: JobSpec) -> dict[str, str]:
    """The job's environment as the spec gives it, over ENVIRONMENT_DEFAULTS; LUSTRAIN_* names are lustrain's own
    (the run's identity)."""
    reserved = [key for key in spec.code.environment if key.upper().startswith(RESERVED_ENVIRONMENT_PREFIX)]
    if reserved:
        raise SpecInvalid(
            [
                FieldError(
                    f"code.environment.{key}", key, f"{RESERVED_ENVIRONMENT_PREFIX}* names are lustrain's own"
                )
                for key in reserved
            ]
        )
    return {**ENVIRONMENT_DEFAULTS, **spec.code.environment}


def training_image(spec: JobSpec, region: str) -> str:
    if spec.image.uri:
        return spec.image.uri
    assert spec.image.framework_version is not None  # the spec holds exactly one of the two
    return images.pytorch_training_image(spec.image.framework_version, region, spec.compute.instance_type)


#: Where a job's output lives on a file system when output.to_filesystem is true (one directory per job).
OUTPUT_ROOT = "/lustrain-output"
#: Where a job's checkpoints live on a file system when checkpoints.to_filesystem is true (one directory per job).
CHECKPOINT_ROOT = "/lustrain-checkpoints"


def output_path(job_id: str) -> str:
    return f"{OUTPUT_ROOT}/{job_id}"


def checkpoint_path(job_id: str) -> str:
    return f"{CHECKPOINT_ROOT}/{job_id}"


def norm_path(path: str) -> str:
    """A path on the file system without its trailing slash ("/" stays)."""
    return path.rstrip("/") or "/"


def s3_prefix(uri: str) -> str:
    """An S3 URI as a prefix, ending in a slash."""
    return uri if uri.endswith("/") else uri + "/"


def _overlaps(a: str, b: str) -> bool:
    a, b = norm_path(a), norm_path(b)
    return a == b or a == "/" or b == "/" or a.startswith(b + "/") or b.startswith(a + "/")


@dataclass(frozen=True)
class LinkPlan:
    method: str  # "import_path" | "dra"
    links: tuple[Link, ...]
    output_path: str | None
    checkpoint_path: str | None = None

    @property
    def dra_links(self) -> tuple[Link, ...]:
        return tuple(link for link in self.links if self.method == "dra" or link.purpose != "data")

    @property
    def export_paths(self) -> list[str]:
        """The paths whose files reach S3 only by an export (output and checkpoints written to Lustre)."""
        return [path for path in (self.output_path, self.checkpoint_path) if path]


def link_for(spec: JobSpec, job_id: str) -> LinkPlan:
    """How this spec's file system is linked to S3; SpecInvalid when mount_path cannot hold."""
    mount = norm_path(spec.filesystem.mount_path)
    if ".." in mount.split("/") or "//" in spec.filesystem.mount_path:
        raise SpecInvalid.one(
            "filesystem.mount_path",
            spec.filesystem.mount_path,
            "a plain absolute path like /data, without .. or //",
        )
    out = output_path(job_id) if spec.output.to_filesystem else None
    if out is not None:
        _check_room_beside(spec, mount, OUTPUT_ROOT, "output.to_filesystem", "output")
    ckpt = _checkpoint_link(spec, job_id, mount)
    links = [Link(path=mount, s3_uri=spec.data.s3_uri, purpose="data")]
    if out is not None:
        links.append(Link(path=out, s3_uri=output_location(spec, job_id), purpose="output"))
    if ckpt is not None:
        links.append(ckpt)
    scratch_at_root = (
        spec.filesystem.deployment_type == "scratch" and mount == "/" and out is None and ckpt is None
    )
    return LinkPlan(
        "import_path" if scratch_at_root else "dra",
        tuple(links),
        out,
        ckpt.path if ckpt is not None else None,
    )


def _check_room_beside(spec: JobSpec, mount: str, root: str, field: str, what: str) -> None:
    """A second link (`field`, writing `what` under `root`) needs the data's link off "/" and clear of `root`."""
    if mount == "/":
        raise SpecInvalid.one(
            "filesystem.mount_path",
            spec.filesystem.mount_path,
            f'a link at "/" must be the file system\'s only one, and {field} needs a second for the {what}: use '
            "a mount_path like /data",
        )
    if _overlaps(mount, root):
        raise SpecInvalid.one(
            "filesystem.mount_path",
            spec.filesystem.mount_path,
            f"{root} is where lustrain writes {what} on the file system: choose another path",
        )


def _checkpoint_link(spec: JobSpec, job_id: str, mount: str) -> Link | None:
    """The DRA of checkpoints.to_filesystem: the run's checkpoint directory <-> its checkpoint prefix in S3."""
    if not spec.checkpoints.to_filesystem:
        return None
    field = "checkpoints.to_filesystem"
    _check_room_beside(spec, mount, CHECKPOINT_ROOT, field, "checkpoints")
    s3_uri = checkpoint_location(spec, job_id)
    if spec.output.to_filesystem and _s3_overlaps(s3_uri, output_location(spec, job_id)):
        # each DRA of a file system links its own S3 prefix (CreateDataRepositoryAssociation's API reference:
        # "a unique S3 bucket or prefix"); the output's link would hold the checkpoints' prefix inside its own
        raise SpecInvalid.one(
            field,
            True,
            f"with output.to_filesystem the checkpoints need a prefix of their own, outside the run's output "
            f"{output_location(spec, job_id)}",
        )
    return Link(path=checkpoint_path(job_id), s3_uri=s3_uri, purpose="checkpoints")


def _s3_overlaps(a: str, b: str) -> bool:
    a, b = s3_prefix(a), s3_prefix(b)
    return a.startswith(b) or b.startswith(a)


def preload_of(spec: JobSpec, job_id: str, region: str, plan: dict[str, Any]) -> Preload:
    """The launch plan's warm-up: its name, instance type, image (the run's PyTorch version, in its CPU build) and
    MaxRuntimeInSeconds (PRELOAD_RUNTIME_FACTOR times the plan's expected time, at least PRELOAD_MIN_SECONDS)."""
    expected = (plan.get("preload") or {}).get("max_runtime_seconds") or planner.PRELOAD_UNKNOWN_SECONDS
    return Preload(
        name=preload_job_name(spec.name, job_id),
        instance_type=planner.PRELOAD_INSTANCE_TYPE,
        image_uri=images.pytorch_training_image(
            spec.image.framework_version or PRELOAD_IMAGE_VERSION, region, planner.PRELOAD_INSTANCE_TYPE
        ),
        max_runtime_seconds=int(expected),
        output_s3_uri=preload_output(spec, job_id),
    )


def preload_job_name(spec_name: str, job_id: str) -> str:
    return f"{spec_name}-{job_hex(job_id, spec_name)}-{PRELOAD_SUFFIX}"


def preload_output(spec: JobSpec, job_id: str) -> str:
    return f"{spec.output.s3_uri.rstrip('/')}/{job_id}/{PRELOAD_SUFFIX}/"
