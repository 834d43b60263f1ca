"""The job spec v1: the public interface of lustrain. Field names are fixed; extend, never rename."""

from __future__ import annotations

import ipaddress
import json
import re
import unicodedata
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from lustrain_core import recovery
from lustrain_core.errors import MISSING, FieldError, SpecInvalid

MAX_SPEC_BYTES = 1024 * 1024
MAX_YAML_ALIASES = 64
MAX_RUNTIME_HOURS = 28 * 24  # SageMaker's MaxRuntimeInSeconds ceiling: 28 days
#: How long a spot job may wait for capacity when the spec does not say (compute.max_wait_hours).
SPOT_WAIT_HOURS = 24.0
#: compute.max_queue_hours when the spec does not say, and at most (a week: a run queued longer waits for a quota
#: increase, which is asked for, not waited for)
DEFAULT_MAX_QUEUE_HOURS = 24.0
MAX_QUEUE_HOURS = 7 * 24
#: compute.keep_alive_minutes at most: the SageMaker guide's limit for KeepAlivePeriodInSeconds ("SageMaker managed
#: warm pools": 3600 s), though botocore's model lets a request ask for 21600 s
MAX_KEEP_ALIVE_MINUTES = 60
#: CreateFileSystem's largest StorageCapacity (botocore's model): no one file system holds more, so no size may be
#: larger (and the planner's sums stay finite)
MAX_STORAGE_GIB = 2_147_483_647

NAME_PATTERN = r"^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$"
S3_URI_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](?:/.*)?$"
ECR_URI_PATTERN = (
    r"^\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(?:\.cn)?/[a-z0-9._/-]+(?::[\w.-]+|@sha256:[0-9a-f]{64})$"
)

#: Tag keys a spec may not set, in any case: AWS's own, and the ones the stack's IAM policies trust (steps.TAG_*).
RESERVED_TAG_PREFIXES = ("aws:", "lustrain:")

S3Uri = Annotated[str, Field(pattern=S3_URI_PATTERN, description="s3://bucket/prefix/")]
#: An s3:// URI a processing job's container is given as an argument: each item of CreateProcessingJob's
#: ContainerArguments is at most 256 characters (botocore's model)
ArgumentS3Uri = Annotated[str, Field(pattern=S3_URI_PATTERN, max_length=256, description="s3://bucket/prefix/")]
PERSISTENT_THROUGHPUTS = (125, 250, 500, 1000)


class _Section(BaseModel):
    # NaN and Infinity pass no limit usefully, and are not JSON: Step Functions would refuse the run's document
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


#: DescribeTrainingPlan's TrainingPlanName: a plan's name, or its ARN (botocore's TrainingPlanNameOrArn)
TRAINING_PLAN_PATTERN = (
    r"^(?:arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]+:[0-9]{12}:training-plan/)?[a-zA-Z0-9](?:-*[a-zA-Z0-9]){0,63}$"
)


class Compute(_Section):
    instance_type: str = Field("ml.p4d.24xlarge", pattern=r"^ml\.[a-z0-9][a-z0-9-]*\.[a-z0-9]+$")
    instance_count: int = Field(2, ge=1, le=1000)
    spot: bool = False
    max_runtime_hours: float = Field(24, gt=0, le=MAX_RUNTIME_HOURS)
    max_wait_hours: float | None = Field(None, gt=0, le=MAX_RUNTIME_HOURS)
    #: training jobs per run, the first included: a retryable failure (lustrain_core.recovery) starts another
    max_attempts: int = Field(recovery.DEFAULT_MAX_ATTEMPTS, ge=1, le=recovery.MAX_ATTEMPTS)
    #: how long the run may wait in the capacity queue (steps/queue.py) for its instances to fit the quota, in
    #: all: 0 refuses at once when they do not fit (QuotaExceeded)
    max_queue_hours: float = Field(DEFAULT_MAX_QUEUE_HOURS, ge=0, le=MAX_QUEUE_HOURS)
    #: a SageMaker managed warm pool: the instances stay this long after the job for the next run of the same shape
    #: (ResourceConfig.KeepAlivePeriodInSeconds; steps/warm_pool.py); 0 releases them with the job
    keep_alive_minutes: int = Field(0, ge=0, le=MAX_KEEP_ALIVE_MINUTES)
    #: a SageMaker training plan (reserved capacity) the run's instances come from: its name or ARN
    #: (steps/training_plans.py); the run then waits for the plan's instances, not the on-demand quota
    training_plan: str | None = Field(None, pattern=TRAINING_PLAN_PATTERN)

    @model_validator(mode="after")
    def _plan_is_not_spot(self) -> Compute:
        if self.training_plan is not None and self.spot:
            raise ValueError(
                "training_plan runs on the plan's reserved instances, paid up front: spot does not apply (remove one)"
            )
        return self

    @model_validator(mode="after")
    def _wait_needs_spot(self) -> Compute:
        if self.max_wait_hours is not None:
            if not self.spot:
                raise ValueError("max_wait_hours is for spot training only: set spot: true or remove it")
            if self.max_wait_hours < self.max_runtime_hours:
                raise ValueError(
                    f"max_wait_hours ({self.max_wait_hours}) must be >= max_runtime_hours "
                    f"({self.max_runtime_hours})"
                )
        return self

    @model_validator(mode="after")
    def _warm_pool_not_spot(self) -> Compute:
        if self.keep_alive_minutes and self.spot:
            # "SageMaker managed warm pools cannot be used with spot instances" (the guide's Considerations)
            raise ValueError(
                "keep_alive_minutes (a warm pool) cannot be used with spot: SageMaker keeps no warm pool of spot "
                "instances; set spot: false or keep_alive_minutes: 0"
            )
        return self

    @property
    def wait_hours(self) -> float | None:
        """A spot job's MaxWait: max_wait_hours, else the runtime plus SPOT_WAIT_HOURS to wait for capacity (at most
        MAX_RUNTIME_HOURS); None on demand. MaxWait counts the waiting and the running, so a MaxWait equal to the
        runtime leaves no time to wait for a spot instance."""
        if not self.spot:
            return None
        if self.max_wait_hours is not None:
            return self.max_wait_hours
        return max(self.max_runtime_hours, min(self.max_runtime_hours + SPOT_WAIT_HOURS, MAX_RUNTIME_HOURS))


class Image(_Section):
    framework_version: str | None = Field("2.8", pattern=r"^\d+\.\d+(?:\.\d+)?$")
    uri: str | None = Field(None, pattern=ECR_URI_PATTERN)

    @model_validator(mode="before")
    @classmethod
    def _uri_replaces_default_version(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("uri") and "framework_version" not in data:
            return {**data, "framework_version": None}
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> Image:
        if (self.framework_version is None) == (self.uri is None):
            raise ValueError("give exactly one of framework_version (a SageMaker PyTorch image) or uri (ECR)")
        return self


#: SageMaker's rule for Environment keys (CreateTrainingJob), which the secrets' names become in the job
ENVIRONMENT_NAME_PATTERN = r"[a-zA-Z_][a-zA-Z0-9_]*"
#: a Secrets Manager secret's ARN (arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-6RANDOM, or without the
#: random suffix) or an SSM parameter's (arn:aws:ssm:REGION:ACCOUNT:parameter/NAME)
ARN_OF_SECRET = (
    r"^arn:aws(?:-cn|-us-gov)?:(?:secretsmanager:[a-z0-9-]+:\d{12}:secret:[A-Za-z0-9/_+=.@-]+"  # noqa: S105
    r"|ssm:[a-z0-9-]+:\d{12}:parameter/[A-Za-z0-9/_.-]+)$"
)
#: at most this many: the job's role reads only the secrets its spec names, each named by a session tag of the job's
#: session (lustrain_core.steps.training.secret_session_tags), which the role's policy has a slot for
MAX_SECRETS = 8
#: STS's limit on a session tag's value (botocore's sts model, tagValueType), which holds a secret's name
MAX_SECRET_NAME = 256


def secret_name(arn: str) -> str:
    """What a code.secrets ARN names: a Secrets Manager secret's name (after "secret:", with its random suffix when
    the ARN has one) or an SSM parameter's (after "parameter/")."""
    return arn.split(":secret:", 1)[1] if ":secret:" in arn else arn.split(":parameter/", 1)[1]
#: environment names whose values are credentials, by their words (HF_TOKEN, WANDB_API_KEY, DB_PASSWORD)
_CREDENTIAL_WORDS = re.compile(
    r"(?:^|_)(?:TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIALS?|APIKEY|(?:API|ACCESS|PRIVATE|AUTH)_KEY)(?:_|$)",
    re.IGNORECASE,
)
#: values that are credentials whatever their name: the well-known formats of keys and tokens
_CREDENTIAL_VALUES = re.compile(
    r"(?:A3T[A-Z0-9]|AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}"  # AWS access key ids
    r"|gh[pousr]_[A-Za-z0-9]{36,}|github_pat_\w{22,}"  # GitHub
    r"|hf_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"  # Slack
    r"|sk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}"  # OpenAI, Anthropic
    r"|glpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+"  # a signed JWT
    r"|://[^/\s:@]+:[^/\s@]+@"  # a URL with a password
)


def looks_like_credential(name: str, value: str) -> bool:
    """Whether an environment variable carries a credential: a name that says so (with a value), or a value in a
    known key or token format."""
    return bool(value and _CREDENTIAL_WORDS.search(name)) or bool(_CREDENTIAL_VALUES.search(value))


class Code(_Section):
    source: str = "trainer/"
    entry_point: str = Field("train.py", pattern=r"^[\w./-]+\.py$")
    hyperparameters: dict[str, str | int | float | bool] = Field(default_factory=dict)
    distribution: Literal["torchrun", "none"] = "torchrun"
    environment: dict[str, str] = Field(default_factory=dict)
    #: NAME: the ARN of a Secrets Manager secret or an SSM SecureString parameter, read by the job at run time
    #: (lustrain_core.secrets_launcher) and never written into the job's request, the run's records or its events
    secrets: dict[str, Annotated[str, Field(pattern=ARN_OF_SECRET, max_length=2048)]] = Field(
        default_factory=dict, max_length=MAX_SECRETS
    )

    @field_validator("environment")
    @classmethod
    def _no_credentials(cls, v: dict[str, str]) -> dict[str, str]:
        # the environment is stored in the jobs table, the execution history and the archived DescribeTrainingJob
        names = [name for name, value in v.items() if looks_like_credential(name, value)]
        if names:
            raise ValueError(
                f"{', '.join(names)}: {'looks' if len(names) == 1 else 'look'} like a credential, and the environment "
                "is stored in the clear (the run's records, its history, SageMaker's description of the job): put "
                "the value in Secrets Manager or an SSM SecureString and give its ARN in code.secrets"
            )
        return v

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        for name in v:
            if not re.fullmatch(ENVIRONMENT_NAME_PATTERN, name) or name.upper().startswith("LUSTRAIN_"):
                raise ValueError(
                    f"{name!r}: an environment variable's name ([A-Za-z_][A-Za-z0-9_]*), not LUSTRAIN_* (lustrain's own)"
                )
        both = sorted(set(v) & set(info.data.get("environment") or {}))
        if both:
            raise ValueError(
                f"{', '.join(both)}: in both code.environment and code.secrets; give each name once"
            )
        long = sorted(name for name, arn in v.items() if len(secret_name(arn)) > MAX_SECRET_NAME)
        if long:
            raise ValueError(
                f"{', '.join(long)}: a secret's name of at most {MAX_SECRET_NAME} characters (each named secret is a "
                "session tag of the job's session, and STS takes tag values of at most that)"
            )
        return v

    @property
    def secret_services(self) -> list[str]:
        """The services code.secrets reads from (secretsmanager, ssm): the job's network needs an endpoint of each."""
        return sorted({arn.split(":")[2] for arn in self.secrets.values()})

    @field_validator("entry_point")
    @classmethod
    def _relative(cls, v: str) -> str:
        if v.startswith("/") or ".." in v.split("/"):
            raise ValueError("entry_point must be a path inside code.source, like train.py")
        return v

    @field_validator("hyperparameters")
    @classmethod
    def _hp_names(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            # SageMaker's own (sagemaker_program, ...) in any case: the toolkit reads SM_HPS without regard to it
            if not re.fullmatch(r"[A-Za-z_][\w-]{0,255}", key) or folded(key).startswith("sagemaker_"):
                raise ValueError(f"hyperparameter name {key!r}: letters, digits, _ and -, not sagemaker_* (in any case)")
        return v


class Data(_Section):
    s3_uri: S3Uri
    size_gib: float | None = Field(None, gt=0, le=MAX_STORAGE_GIB)
    ingest_mb_s_per_gpu: float = Field(100, gt=0, le=100_000)
    #: read the data's contents into Lustre before the GPUs start (steps/preload.py): FSx for Lustre linked to S3
    #: imports metadata only and loads each file's contents on its first read
    preload: bool = False


class Filesystem(_Section):
    deployment_type: Literal["scratch", "persistent"] = "scratch"
    storage_gib: Literal["auto"] | Annotated[int, Field(le=MAX_STORAGE_GIB)] = "auto"
    throughput_per_tib: Literal["auto"] | int = "auto"
    compression: Literal["lz4", "none"] = "lz4"
    mount_path: str = Field("/data", pattern=r"^/[\w./-]*$")
    keep: bool = False
    file_system_id: str | None = Field(None, pattern=r"^fs-[0-9a-f]{8,21}$")

    @model_validator(mode="after")
    def _throughput_is_persistent(self) -> Filesystem:
        if self.throughput_per_tib != "auto" and self.deployment_type != "persistent":
            raise ValueError(
                "throughput_per_tib applies to persistent file systems only "
                "(scratch has a fixed 200 MB/s per TiB): remove it or set deployment_type: persistent"
            )
        return self


#: an availability zone's name (us-east-1a) or id (use1-az4; DescribeAvailabilityZones' ZoneId)
ZONE_NAME_PATTERN = r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$"
ZONE_ID_PATTERN = r"^[a-z]{2,}\d-az\d{1,2}$"
ZONE_PATTERN = f"{ZONE_NAME_PATTERN}|{ZONE_ID_PATTERN}"
#: no region has more availability zones than this
MAX_PREFERRED_ZONES = 10


class Network(_Section):
    vpc_cidr: str = "10.80.0.0/16"
    subnet_prefix_length: Literal["auto"] | int = "auto"
    #: auto (a zone that offers compute.instance_type: steps/zones.py), one zone, or several in order of preference;
    #: each a zone name (us-east-1a: its letter differs between accounts) or a zone id (use1-az4: the same zone in
    #: every account)
    availability_zone: str | list[str] = "auto"
    subnet_id: str | None = Field(None, pattern=r"^subnet-[0-9a-f]{8,17}$")
    security_group_ids: list[Annotated[str, Field(pattern=r"^sg-[0-9a-f]{8,17}$")]] = Field(
        default_factory=list, max_length=5
    )

    @field_validator("vpc_cidr")
    @classmethod
    def _cidr(cls, v: str) -> str:
        try:
            net = ipaddress.IPv4Network(v, strict=True)
        except ValueError as exc:
            raise ValueError(f"an IPv4 CIDR block like 10.80.0.0/16 ({exc})") from None
        if not 16 <= net.prefixlen <= 28:
            raise ValueError("a VPC block must be /16 to /28")
        if not net.is_private:
            raise ValueError("use a private range (10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16)")
        return v

    @field_validator("subnet_prefix_length")
    @classmethod
    def _prefix(cls, v: Any) -> Any:
        if v != "auto" and not 16 <= v <= 28:
            raise ValueError("auto, or a prefix length from 16 to 28")
        return v

    @field_validator("availability_zone", mode="before")
    @classmethod
    def _zones(cls, v: Any) -> Any:
        allowed = (
            f"auto, an availability zone's name (us-east-1a) or id (use1-az4), or a list of 1 to {MAX_PREFERRED_ZONES} "
            "of them in order of preference"
        )
        if v == "auto":
            return v
        zones = v if isinstance(v, list) else [v]
        if not 1 <= len(zones) <= MAX_PREFERRED_ZONES or not all(
            isinstance(z, str) and re.fullmatch(ZONE_PATTERN, z) for z in zones
        ):
            raise ValueError(allowed)
        if len(set(zones)) != len(zones):
            raise ValueError(f"a zone is listed more than once; {allowed}")
        return v

    @property
    def preferred_zones(self) -> list[str]:
        """The zones named by availability_zone in order of preference; [] for auto."""
        zones = self.availability_zone
        return [] if zones == "auto" else [zones] if isinstance(zones, str) else list(zones)

    @model_validator(mode="after")
    def _reuse_needs_groups(self) -> Network:
        if self.subnet_id and not self.security_group_ids:
            raise ValueError("subnet_id needs security_group_ids: the groups the job and Lustre use there")
        if self.security_group_ids and not self.subnet_id:
            raise ValueError("security_group_ids are used only with subnet_id (an existing network)")
        return self


class Output(_Section):
    s3_uri: S3Uri
    expected_size_gib: float = Field(10, ge=0, le=MAX_STORAGE_GIB)
    to_filesystem: bool = False
    #: how SageMaker uploads the model (OutputDataConfig.CompressionType): one model.tar.gz (gzip) or the model's
    #: files as they are (none); unset: chosen by the model's size (planner.output_compression)
    compression: Literal["gzip", "none"] | None = None


#: An earlier run's job id (register_job's `<spec name>-<8 hex>`).
JOB_ID_PATTERN = r"^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?-[0-9a-f]{8}$"


class Checkpoints(_Section):
    #: where the runs' checkpoints go, each run under its own <job id>/checkpoints/ (default: output.s3_uri)
    s3_uri: S3Uri | None = None
    #: continue the training of an earlier run: its job id, or the s3:// prefix holding its checkpoints
    resume_from: str | None = Field(None, min_length=1, max_length=1024)
    #: write the sharded checkpoints to the run's Lustre file system (a read-write channel) instead of the
    #: instance's disk and SageMaker's checkpoint sync; exported to s3_uri at the end of each attempt and before the
    #: file system is deleted (steps/filesystem.py, "Checkpoints on the file system")
    to_filesystem: bool = False
    #: minutes between checkpoints by the clock (the trainer's checkpoint_every_minutes); unset: the plan's
    #: Young-Daly optimum, sqrt(2 x the save's blocking time x the fleet's mean time between interruptions), never
    #: shorter than a checkpoint's write (planner.plan_goodput). The planner refuses one under the save's blocking
    #: time or longer than compute.max_runtime_hours; at most SageMaker's longest run here.
    every_minutes: float | None = Field(None, gt=0, le=MAX_RUNTIME_HOURS * 60)

    @field_validator("resume_from")
    @classmethod
    def _run_or_prefix(cls, v: str | None) -> str | None:
        if v is not None and not (re.fullmatch(JOB_ID_PATTERN, v) or re.fullmatch(S3_URI_PATTERN, v)):
            raise ValueError(
                "an earlier run's job id (like gpt-small-1a2b3c4d, as `lustrain rehearse` and the notices show it) "
                "or the s3:// prefix of its checkpoints"
            )
        return v


class Budget(_Section):
    max_usd: float | None = Field(None, gt=0)


class JobSpec(_Section):
    """A training run: what to train, on what, reading which data, writing where."""

    name: str = Field(pattern=NAME_PATTERN, description="[a-z0-9-], 1..40 chars; prefixes every AWS name")
    compute: Compute = Field(default_factory=Compute)
    image: Image = Field(default_factory=Image)
    code: Code = Field(default_factory=Code)
    data: Data
    filesystem: Filesystem = Field(default_factory=Filesystem)
    network: Network = Field(default_factory=Network)
    output: Output
    checkpoints: Checkpoints = Field(default_factory=Checkpoints)
    budget: Budget = Field(default_factory=Budget)
    tags: dict[Annotated[str, Field(min_length=1, max_length=128)], Annotated[str, Field(max_length=256)]] = (
        Field(default_factory=dict, max_length=40)
    )

    @property
    def checkpoints_base(self) -> str:
        """Where this spec's runs keep checkpoints, each under its own job id: checkpoints.s3_uri, else the output."""
        return self.checkpoints.s3_uri or self.output.s3_uri

    @field_validator("tags")
    @classmethod
    def _no_reserved_tags(cls, v: dict[str, str]) -> dict[str, str]:
        return reserved_tags_refused(v)


def folded(text: str) -> str:
    """`text` as a comparison in any case reads it: compatibility-normalised (NFKC), case-folded (the long s, U+017F,
    folds to "s", as the sharp s to "ss") and without invisible format characters (zero-width spaces, joiners)."""
    return "".join(c for c in unicodedata.normalize("NFKC", text) if unicodedata.category(c) != "Cf").casefold()


def reserved_tags_refused(v: dict[str, str]) -> dict[str, str]:
    """A spec's tags, unless one uses a reserved prefix."""
    # AWS stores tag keys case-sensitively, but IAM matches condition key names (aws:ResourceTag/<key>,
    # aws:RequestTag/<key>) in any case: a Lustrain:created-by tag would be the stack's own to its policies
    for key in v:
        if folded(key).startswith(RESERVED_TAG_PREFIXES):
            raise ValueError(
                f"tag key {key!r}: the prefixes {' and '.join(RESERVED_TAG_PREFIXES)} are reserved, in any case"
            )
    return v


class PrepareSpec(_Section):
    """A data preparation run (kind: prepare): tokenize the text under `source` into shards and index.json under
    `output`, on `instances` SageMaker Processing instances (lustrain_core.prepare_plan)."""

    kind: Literal["prepare"]
    name: str = Field(pattern=NAME_PATTERN, description="[a-z0-9-], 1..40 chars; prefixes every AWS name")
    source: ArgumentS3Uri
    output: ArgumentS3Uri
    #: bytes | bpe:VOCAB | an s3:// tokenizer.json (lustrain_trainer.tokenizer)
    tokenizer: str = Field("bytes", min_length=1, max_length=256)
    #: CreateProcessingJob's InstanceCount: 1..100 (botocore's model)
    instances: int = Field(1, ge=1, le=100)
    instance_type: str = Field("ml.c5.xlarge", pattern=r"^ml\.[a-z0-9]+\.[a-z0-9]+$")
    #: the source's size, for `lustrain plan` (which reads nothing in S3)
    size_gib: float | None = Field(None, gt=0, le=MAX_STORAGE_GIB)
    #: the trainer package the processing jobs run (an s3:// prefix with lustrain_trainer/ at its root): a stack's
    #: Lambda functions cannot read the user's disk, so `lustrain data prepare --stack` and `lustrain submit`
    #: upload trainer/ and set it; a stack refuses a run without it (upload_code bundles it)
    code: S3Uri | None = None
    tags: dict[Annotated[str, Field(min_length=1, max_length=128)], Annotated[str, Field(max_length=256)]] = (
        Field(default_factory=dict, max_length=40)
    )

    @field_validator("tags")
    @classmethod
    def _no_reserved_tags(cls, v: dict[str, str]) -> dict[str, str]:
        return reserved_tags_refused(v)

    @model_validator(mode="after")
    def _output_apart_from_source(self) -> PrepareSpec:
        src, out = self.source.rstrip("/") + "/", self.output.rstrip("/") + "/"
        if src.startswith(out) or out.startswith(src):
            raise ValueError(
                f"output {self.output} and source {self.source} overlap: the shards would be read as text"
            )
        return self


def is_prepare(doc: Any) -> bool:
    """Whether a spec document is a data preparation run (kind: prepare) rather than a training run."""
    return isinstance(doc, dict) and doc.get("kind") == "prepare"


def validate_prepare_spec(doc: dict[str, Any]) -> PrepareSpec:
    try:
        return PrepareSpec.model_validate(doc)
    except ValidationError as exc:
        raise SpecInvalid(field_errors(exc)) from None


# --------------------------------------------------------------------------- loading


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses alias bombs (billion laughs) before they expand."""

    aliases_seen = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases_seen += 1
            if self.aliases_seen > MAX_YAML_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_YAML_ALIASES} YAML aliases: refused (alias bomb?)")
        return super().compose_node(parent, index)


class _DuplicateJsonKey(ValueError):
    pass


def _refuse_duplicate_json_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _DuplicateJsonKey
    return dict(pairs)


def _duplicate(path: str, line: int) -> FieldError:
    where = f"line {line}: " if line else ""
    return FieldError(
        path,
        MISSING,
        f"{where}this key is given more than once (a later one would silently replace the first)",
    )


def _yaml_duplicates(text: str) -> list[FieldError]:
    """Every key given twice in one mapping, at any depth, by its path and the line of its second appearance."""
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
    except (yaml.YAMLError, RecursionError):
        return []
    finally:
        loader.dispose()
    found: list[FieldError] = []
    seen: set[int] = set()

    def walk(node: Any, path: list[str]) -> None:
        if id(node) in seen:  # an alias: its node was walked where it was anchored
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: set[str] = set()
            for key_node, value_node in node.value:
                key = str(key_node.value)
                if isinstance(key_node, yaml.ScalarNode) and key != "<<":
                    if key in keys:
                        found.append(_duplicate(".".join([*path, key]), key_node.start_mark.line + 1))
                    keys.add(key)
                walk(value_node, [*path, key])
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, [*path, str(i)])

    if root is not None:
        walk(root, [])
    return found


def _load_yaml(text: str) -> Any:
    """SafeLoader's document, refused with every duplicate key named: YAML's loaders keep the last one silently,
    so a second `output:` would send the results elsewhere unseen."""
    duplicates = _yaml_duplicates(text)
    if duplicates:
        raise SpecInvalid(duplicates)
    return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass


def parse_document(text: str | bytes, source: str = "spec") -> dict[str, Any]:
    """YAML or JSON text -> a mapping, refusing what is too big or not a mapping."""
    size = len(text.encode() if isinstance(text, str) else text)
    if size > MAX_SPEC_BYTES:
        raise SpecInvalid.one("", MISSING, f"{source} is {size} bytes; a job spec may be at most 1 MiB")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise SpecInvalid.one("", MISSING, f"{source} is not UTF-8 text") from None
    try:
        if text.lstrip().startswith("{"):
            doc = json.loads(text, object_pairs_hook=_refuse_duplicate_json_keys)
        else:
            doc = _load_yaml(text)
    except _DuplicateJsonKey:
        # json names no line: YAML reads the document again to find where (JSON is YAML's flow style)
        raise SpecInvalid(_yaml_duplicates(text) or [_duplicate("(a JSON object)", 0)]) from None
    except (yaml.YAMLError, json.JSONDecodeError, RecursionError) as exc:
        raise SpecInvalid.one("", MISSING, f"{source} is not valid YAML or JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise SpecInvalid.one("", MISSING, f"{source} must be a mapping of fields, got {type(doc).__name__}")
    return doc


def load_spec(text: str | bytes, source: str = "spec") -> JobSpec:
    """Parse and validate a spec document; every problem is reported in one SpecInvalid."""
    return validate_spec(parse_document(text, source))


def load_spec_file(path: str | Path) -> JobSpec:
    path = Path(path)
    if path.stat().st_size > MAX_SPEC_BYTES:
        raise SpecInvalid.one(
            "", MISSING, f"{path} is {path.stat().st_size} bytes; a job spec may be at most 1 MiB"
        )
    return load_spec(path.read_bytes(), source=str(path))


def validate_spec(doc: dict[str, Any]) -> JobSpec:
    try:
        return JobSpec.model_validate(doc)
    except ValidationError as exc:
        raise SpecInvalid(field_errors(exc)) from None


def field_errors(exc: ValidationError, where: str = "", note: str = "") -> list[FieldError]:
    """pydantic's errors as FieldErrors, each path under `where` and each message followed by `note`: how the spec
    and every other input the steps check (state documents, events) name what is wrong."""
    return [
        FieldError(".".join(part for part in (where, e.path) if part), e.value, e.message + note)
        for e in _merge_alternatives([_field_error(err) for err in exc.errors()])
    ]


def _merge_alternatives(errors: list[FieldError]) -> list[FieldError]:
    """A field typed `"auto" | int` fails once per branch: say it once, with both alternatives."""
    merged: dict[str, FieldError] = {}
    for e in errors:
        seen = merged.get(e.path)
        if seen is None:
            merged[e.path] = e
        else:
            merged[e.path] = FieldError(
                e.path, e.value, f"{seen.message}; or {e.message[0].lower()}{e.message[1:]}"
            )
    return list(merged.values())


def _field_error(err: Any) -> FieldError:
    loc = [str(p) for p in err["loc"] if not str(p).startswith(("function-after", "function-before"))]
    # pydantic names union branches in the location ("int", "literal['auto']"): the user never wrote them
    loc = [p for p in loc if not (p.startswith("literal[") or p in {"int", "str", "float", "bool", "none"})]
    path = ".".join(loc)
    value = err.get("input", MISSING)
    kind = err["type"]
    if kind == "extra_forbidden":
        return FieldError(path, value, f"unknown field; allowed here: {', '.join(_allowed_at(loc[:-1]))}")
    if kind == "missing":
        return FieldError(path, MISSING, "required field is missing")
    message = err["msg"].removeprefix("Value error, ")
    if kind == "string_pattern_mismatch":
        message = _PATTERN_HELP.get(
            "secrets" if loc[:2] == ["code", "secrets"] else loc[-1] if loc else "", message
        )
    return FieldError(path, value, message)


_PATTERN_HELP = {
    "name": "1..40 characters of a-z, 0-9 and -, starting and ending with a letter or digit",
    "s3_uri": "an S3 URI like s3://bucket/prefix/",
    "instance_type": "a SageMaker instance type like ml.p4d.24xlarge",
    "framework_version": "a PyTorch version like 2.8",
    "uri": "an ECR image URI like 123456789012.dkr.ecr.us-east-1.amazonaws.com/repo:tag",
    "file_system_id": "an FSx file system id like fs-0123456789abcdef0",
    "subnet_id": "a subnet id like subnet-0123456789abcdef0",
    "training_plan": "a SageMaker training plan's name (1 to 64 of a-z, A-Z, 0-9 and -) or its ARN "
    "(arn:aws:sagemaker:REGION:ACCOUNT:training-plan/NAME)",
    "mount_path": "an absolute path inside the file system, like /data",
    "entry_point": "a .py file inside code.source, like train.py",
    "secrets": "the ARN of a Secrets Manager secret (arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME) or of an SSM "
    "SecureString parameter (arn:aws:ssm:REGION:ACCOUNT:parameter/NAME)",
}


def _allowed_at(loc: list[str]) -> list[str]:
    model: Any = JobSpec
    for part in loc:
        field = model.model_fields.get(part)
        if field is None:
            return []
        model = field.annotation
        if not hasattr(model, "model_fields"):
            return []
    return list(getattr(model, "model_fields", {}))


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the spec, for editors (yaml-language-server)."""
    schema = JobSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "lustrain job spec v1"
    return schema
