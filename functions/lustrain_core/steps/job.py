"""register_job: read the spec, check it against the stack's rules, plan the run, record the job once.

A run starts from one of:
- an S3 "Object Created" EventBridge event: the spec was dropped into the jobs bucket;
- {"spec": {...}} or {"spec_s3_uri": "s3://..."}: started from the console or the CLI.
The state machine passes either as {"execution": <its execution name>, "input": <the execution input>}; the
unwrapped input with "execution" beside it is taken too (a direct invoke).

The job id is `<spec name>-<8 hex of sha256(source identity)>`; the identity is "s3://bucket/key#etag" for a
dropped spec and the execution name for an inline start. The job record is written with a conditional put on
that id, so S3 delivering the same event twice (it may) starts one run: the second ends as a duplicate. So does
the same spec put twice (an uploader's retry, a sync tool copying it again): the jobs bucket is versioned, so
each put is a new version, but the ETag is the content's (MD5 under the bucket's SSE-S3), and the same content
is the same run. To run an unchanged spec again, change it (a comment will do) or start it inline. A retry of
register_job inside the same execution finds its own record and carries on.

Nothing is created before the spec passed every check (SpecInvalid, SpecForbidden).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath
from typing import Any

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import S3EventNotificationEventBridgeModel
from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, ValidationError

from lustrain_core import launch, launch_plan, planner, prepare_plan, teams
from lustrain_core.aws_errors import error_code, explained
from lustrain_core.config import Settings
from lustrain_core.errors import MISSING, SpecInvalid
from lustrain_core.spec import (
    MAX_SPEC_BYTES,
    S3_URI_PATTERN,
    JobSpec,
    is_prepare,
    parse_document,
    validate_prepare_spec,
    validate_spec,
)
from lustrain_core.steps import filesystem, records, training_plans, zones
from lustrain_core.steps.policy import Policy
from lustrain_core.trainer import layout

#: Measuring a prefix lists every object; beyond this many the user must give data.size_gib.
MAX_MEASURED_OBJECTS = 2_000_000
#: S3 keys are 1 to 1024 bytes of UTF-8.
MAX_S3_KEY_BYTES = 1024
#: The spec and plan travel in every state's input (Step Functions passes at most 256 KiB between states).
MAX_STATE_SPEC_BYTES = 64 * 1024


class JobDropEvent(S3EventNotificationEventBridgeModel):
    """The S3 "Object Created" event of a spec dropped into the jobs bucket, as the state machine passes it."""

    execution: str | None = None


class InlineStart(BaseModel):
    """A run started from the console or the CLI with the spec itself or where it lies in S3."""

    model_config = ConfigDict(extra="ignore")

    spec: dict[str, Any] | None = None
    spec_s3_uri: str | None = None
    execution: str | None = None
    #: the team the run is for (lustrain_core.teams): checked against the stack's teams by register_job
    team: Any = None


@dataclass(frozen=True)
class SpecSource:
    """Where a run's spec came from; `identity` is what makes two starts the same run."""

    kind: str  # "s3-event" | "inline" | "s3-uri"
    identity: str
    execution: str | None
    bucket: str | None = None
    key: str | None = None
    version_id: str | None = None
    etag: str | None = None
    inline_spec: dict[str, Any] | None = None
    #: the team a start through the API named (a dropped spec's team is its folder's: team_of)
    team: Any = None

    def to_dict(self) -> dict[str, Any]:
        shown = asdict(self)
        shown.pop("inline_spec")
        if self.bucket:
            shown["uri"] = f"s3://{self.bucket}/{self.key}"
        return {k: v for k, v in shown.items() if v is not None}


def parse_start(event: dict[str, Any]) -> SpecSource:
    """The execution input, whichever way the run was started."""
    if not isinstance(event, dict):
        raise SpecInvalid.one(
            "", event, "a run starts from a JSON object: an S3 event, {spec} or {spec_s3_uri}"
        )
    if isinstance(event.get("input"), dict):
        event = {**event["input"], "execution": event.get("execution")}
    if "detail-type" in event:
        try:
            drop: JobDropEvent = parse(event=event, model=JobDropEvent)
        except Exception as exc:  # powertools wraps pydantic's ValidationError in its own
            raise SpecInvalid.one("", MISSING, f"not an S3 Object Created event: {exc}") from None
        if drop.detail_type != "Object Created":
            raise SpecInvalid.one(
                "detail-type", drop.detail_type, "register_job starts a run from an S3 'Object Created' event"
            )
        obj = drop.detail.object
        bucket = drop.detail.bucket.name
        split_s3_uri(f"s3://{bucket}/", "detail.bucket.name")
        if not obj.key or len(obj.key.encode()) > MAX_S3_KEY_BYTES:
            raise SpecInvalid.one(
                "detail.object.key", obj.key, f"the key of the dropped spec, 1 to {MAX_S3_KEY_BYTES} bytes"
            )
        # S3's events always carry the ETag; a relayed or hand-made one without it falls back to the version, and
        # with neither every later drop of the key would pass for a duplicate of the first.
        fingerprint = obj.etag or obj.version_id
        if not fingerprint:
            raise SpecInvalid.one(
                "detail.object.etag",
                MISSING,
                "the dropped object's ETag (or its version-id), as S3 sends them",
            )
        return SpecSource(
            kind="s3-event",
            identity=f"s3://{bucket}/{obj.key}#{fingerprint}",
            execution=drop.execution,
            bucket=bucket,
            key=obj.key,
            version_id=obj.version_id,
            etag=obj.etag,
        )
    try:
        start = InlineStart.model_validate(event)
    except ValidationError as exc:
        raise SpecInvalid.one("", MISSING, f"not a run start: {exc.errors()[0]['msg']}") from None
    if (start.spec is None) == (start.spec_s3_uri is None):
        raise SpecInvalid.one(
            "spec",
            MISSING,
            'start a run with exactly one of {"spec": {...}} or {"spec_s3_uri": "s3://bucket/key"}',
        )
    if not start.execution:
        raise SpecInvalid.one(
            "execution", MISSING, "an inline start needs the execution name (the state machine adds it)"
        )
    if start.spec is not None:
        return SpecSource("inline", start.execution, start.execution, inline_spec=start.spec, team=start.team)
    bucket, key = split_s3_uri(start.spec_s3_uri or "", "spec_s3_uri")
    if not key or key.endswith("/"):
        raise SpecInvalid.one("spec_s3_uri", start.spec_s3_uri, "the S3 URI of a spec file, not a prefix")
    return SpecSource("s3-uri", start.execution, start.execution, bucket=bucket, key=key, team=start.team)


def team_of(source: SpecSource, settings: Settings) -> str:
    """The team a run is for: a dropped spec's folder jobs/<team>/, or the team a start through the API names."""
    if source.kind == "s3-event":
        return teams.team_of_drop(settings, source.key or "")
    return teams.team_of_input(settings, source.team)


def split_s3_uri(uri: str, field: str) -> tuple[str, str]:
    if not re.fullmatch(S3_URI_PATTERN, uri):
        raise SpecInvalid.one(field, uri, "an S3 URI like s3://bucket/prefix/")
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def job_id_for(spec_name: str, identity: str) -> str:
    return f"{spec_name}-{hashlib.sha256(identity.encode()).hexdigest()[:8]}"


def read_spec_document(s3: Any, source: SpecSource) -> dict[str, Any]:
    """The spec document of a start: inline, or the S3 object (that very version, at most 1 MiB)."""
    if source.inline_spec is not None:
        return source.inline_spec
    where = f"s3://{source.bucket}/{source.key}"
    params: dict[str, Any] = {"Bucket": source.bucket, "Key": source.key}
    if source.version_id:
        params["VersionId"] = source.version_id
    try:
        obj = s3.get_object(**params)
    except ClientError as exc:
        code = error_code(exc)
        if code in {"NoSuchKey", "NoSuchBucket", "NoSuchVersion", "AccessDenied", "403", "404"}:
            field = "spec_s3_uri" if source.kind == "s3-uri" else ""
            raise SpecInvalid.one(field, where, f"the spec cannot be read ({explained(exc)})") from None
        raise
    body = obj["Body"].read(MAX_SPEC_BYTES + 1)
    return parse_document(body, source=where)


def check_code_source(spec: JobSpec) -> None:
    source = spec.code.source
    if not source.startswith("s3://"):
        raise SpecInvalid.one(
            "code.source",
            source,
            "a local directory cannot be read by the stack's Lambda functions: start the run with "
            "`lustrain submit SPEC --stack STACK` (it uploads the directory and sets code.source to its s3:// URI), or "
            "give an s3:// prefix holding the code",
        )
    split_s3_uri(source, "code.source")


def measure_data(
    s3: Any, s3_uri: str, field: str = "data.s3_uri", size_field: str = "data.size_gib"
) -> tuple[float, dict[str, int]]:
    """GiB under an S3 prefix, and bytes per file extension (the planner judges compression by them)."""
    bucket, prefix = split_s3_uri(s3_uri, field)
    total = 0
    objects = 0
    by_extension: dict[str, int] = {}
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                if obj["Key"].endswith("/"):
                    continue
                objects += 1
                size = int(obj.get("Size", 0))
                total += size
                ext = PurePosixPath(obj["Key"]).suffix.lower()
                by_extension[ext] = by_extension.get(ext, 0) + size
            if objects > MAX_MEASURED_OBJECTS:
                raise SpecInvalid.one(
                    size_field,
                    MISSING,
                    f"more than {MAX_MEASURED_OBJECTS:,} objects under {s3_uri}: measuring them would outlast "
                    f"the step; set {size_field}",
                )
    except ClientError as exc:
        code = error_code(exc)
        if code in {"NoSuchBucket", "AccessDenied"}:
            raise SpecInvalid.one(
                field,
                s3_uri,
                f"cannot be listed by the stack ({explained(exc)}); check the bucket and its policy",
            ) from None
        raise
    if objects == 0:
        raise SpecInvalid.one(field, s3_uri, "no objects under this prefix: upload the data or fix the URI")
    return total / 2**30, by_extension


def _listing(s3: Any, uri: str, field: str, what: str, max_keys: int = 1) -> list[dict[str, Any]]:
    """Up to `max_keys` objects under an S3 prefix; SpecInvalid naming `field` when the stack cannot list it."""
    bucket, prefix = split_s3_uri(uri, field)
    try:
        return list(s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=max_keys).get("Contents", []))
    except ClientError as exc:
        if error_code(exc) in {"NoSuchBucket", "AccessDenied", "AllAccessDisabled", "PermanentRedirect"}:
            raise SpecInvalid.one(
                field,
                uri,
                f"{what} cannot be listed by the stack ({explained(exc)}); check the bucket and its policy",
            ) from None
        raise


def check_locations(s3: Any, spec: JobSpec) -> None:
    """Every S3 location of the spec, before anything is created: the data and the code exist and can be read
    (listed: s3:ListBucket, as FSx and the SageMaker SDK list them), the entry point is in the code, and the
    buckets the run writes to (output, checkpoints) exist and can be reached. Which prefixes the stack may write is
    its AllowedOutputPrefixes (Policy.check_spec), from which the training role's grants are made."""
    if spec.data.size_gib is not None and not _listing(s3, spec.data.s3_uri, "data.s3_uri", "the data"):
        raise SpecInvalid.one(
            "data.s3_uri", spec.data.s3_uri, "no objects under this prefix: upload the data or fix the URI"
        )
    source = spec.code.source
    if not _listing(s3, source, "code.source", "the code"):
        raise SpecInvalid.one(
            "code.source", source, "no objects under this prefix: upload the code or fix the URI"
        )
    entry = source.rstrip("/") + "/" + spec.code.entry_point
    key = split_s3_uri(entry, "code.source")[1]
    if not any(o["Key"] == key for o in _listing(s3, entry, "code.source", "the code")):
        raise SpecInvalid.one(
            "code.entry_point",
            spec.code.entry_point,
            f"not found under code.source {source}: the script SageMaker runs",
        )
    _listing(s3, spec.output.s3_uri, "output.s3_uri", "the output location", max_keys=0)
    if spec.checkpoints.s3_uri:
        _listing(s3, spec.checkpoints.s3_uri, "checkpoints.s3_uri", "the checkpoint location", max_keys=0)


def find_resume(
    s3: Any, ddb: Any, settings: Settings, spec: JobSpec, team: str = teams.DEFAULT_TEAM
) -> launch_plan.Resume | None:
    """The checkpoint checkpoints.resume_from names, checked against the spec's model before anything exists. It
    names a recorded run of the same team, by its job id or its checkpoint location (or a prefix inside it): the
    session tag the job reads it by is the record's run id, never what a file says, and a refusal tells nothing of a
    run of another team, not even that it exists."""
    ref = spec.checkpoints.resume_from
    if ref is None:
        return None
    field = "checkpoints.resume_from"
    earlier = _resumed_run(ddb, settings, ref, field)
    if earlier is None or earlier.team != team or earlier.checkpoint_s3_uri is None:
        raise SpecInvalid.one(
            field,
            ref,
            f"no run of team {team} in this stack with this job id or checkpoint location: name one of your team's "
            "runs (its job id, or an s3:// prefix in its checkpoints folder)",
        )
    base = earlier.checkpoint_s3_uri
    folders = Policy.for_stack(settings).team_folders(team)
    if folders and base not in {f"{folder}{earlier.job_id}/{launch_plan.CHECKPOINTS_DIR}" for folder in folders}:
        # a run recorded before the stack had teams: its checkpoints lie where no job's role of a team may read
        raise SpecInvalid.one(
            field,
            ref,
            f"its checkpoints ({base}) lie outside team {team}'s folders ({', '.join(folders)}), where a run's job "
            f"may read them: copy them to <folder>{earlier.job_id}/checkpoints/ of a run of your team and name that",
        )
    prefix = ref if ref.startswith("s3://") else base
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    steps = []
    bucket, key_prefix = split_s3_uri(prefix, field)
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key_prefix):
            for obj in page.get("Contents", []):
                match = launch_plan.MANIFEST_NAME.fullmatch(obj["Key"][len(key_prefix) :])
                if match:
                    steps.append((int(match[1]), str(obj["Key"])))
        if not steps:
            raise SpecInvalid.one(
                field,
                ref,
                f"no checkpoint under {prefix} (lustrain's trainer commits each checkpoint with its manifest step-N.json)",
            )
        step, key = max(steps)
        manifest = json.loads(
            s3.get_object(Bucket=bucket, Key=key)["Body"].read(launch_plan.MAX_MANIFEST_BYTES)
        )
    except ClientError as exc:
        if error_code(exc) in {"NoSuchBucket", "NoSuchKey", "AccessDenied"}:
            raise SpecInvalid.one(
                field, ref, f"the checkpoint cannot be read by the stack ({explained(exc)})"
            ) from None
        raise
    except ValueError:
        raise SpecInvalid.one(
            field, ref, f"s3://{bucket}/{key} is not a checkpoint manifest (JSON)"
        ) from None
    launch_plan.check_resumable(spec, manifest, f"s3://{bucket}/{key}")
    return launch_plan.Resume(
        s3_uri=f"s3://{bucket}/{key.removesuffix('.json')}", step=step, run=earlier.job_id
    )


def _resumed_run(ddb: Any, settings: Settings, ref: str, field: str) -> records.JobRecord | None:
    """The recorded run checkpoints.resume_from names: by its job id, or by an s3:// prefix inside its checkpoint
    location <folder><job id>/checkpoints/ (the job id read from the prefix, the location from the record)."""
    if not ref.startswith("s3://"):
        return records.get(ddb, settings.jobs_table, ref) if JOB_ID.fullmatch(ref) else None
    wanted = ref if ref.endswith("/") else ref + "/"
    for segment in split_s3_uri(ref, field)[1].split("/"):
        if JOB_ID.fullmatch(segment):
            earlier = records.get(ddb, settings.jobs_table, segment)
            if earlier is not None and earlier.checkpoint_s3_uri and wanted.startswith(earlier.checkpoint_s3_uri):
                return earlier
    return None


def check_zones(ec2: Any, spec: JobSpec, training_plan: launch_plan.TrainingPlan | None = None) -> None:
    """A new network's zone, before anything exists: network.availability_zone names available zones that offer
    compute.instance_type, and the training plan's zone if the run has one (steps/zones.py; a given subnet's zone
    is checked by create_network)."""
    if spec.network.subnet_id is None:
        required = training_plan.availability_zone if training_plan is not None else None
        zones.zone_choices(ec2, spec.compute.instance_type, spec.network.preferred_zones, required=required)


def check_reused_filesystem(fsx: Any, spec: JobSpec, team: str, settings: Settings) -> None:
    """filesystem.file_system_id, before anything exists: a Lustre file system of this account and region, of the
    run's team, fit for checkpoints.to_filesystem (steps/filesystem.py reuse_refusal). Its state, network and links
    to the data are create_filesystem's to check, once the run's network is known."""
    fs_id = spec.filesystem.file_system_id
    if fs_id is None:
        return
    refusal = filesystem.reuse_refusal(filesystem.describe(fsx, fs_id), spec, team, teams.teams_of(settings))
    if refusal is not None:
        field, reason = refusal
        raise SpecInvalid.one(field, fs_id if field == "filesystem.file_system_id" else True, reason)


def register_job(
    source: SpecSource,
    *,
    s3: Any,
    ddb: Any,
    ec2: Any,
    fsx: Any,
    sagemaker: Any,
    settings: Settings,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """Validate, plan, compile and record a run; returns $.job ({duplicate: true, ...} for a repeated start), whose
    `kind` (train | prepare) the state machine chooses the run's path by. Nothing is created before every check
    passed (SpecInvalid, SpecForbidden)."""
    document = read_spec_document(s3, source)
    if is_prepare(document):
        return register_prepare(document, source, s3=s3, ddb=ddb, settings=settings)
    spec = validate_spec(document)
    check_code_source(spec)
    team = team_of(source, settings)
    job_id = job_id_for(spec.name, source.identity)
    policy = Policy.for_stack(settings)
    policy.check_spec(spec, team)
    check_locations(s3, spec)
    resume = find_resume(s3, ddb, settings, spec, team)
    training_plan = training_plans.find(sagemaker, spec, clock())
    check_zones(ec2, spec, training_plan)
    check_reused_filesystem(fsx, spec, team, settings)

    data_gib: float | None = None
    extension_bytes: dict[str, int] | None = None
    if spec.data.size_gib is None:
        data_gib, extension_bytes = measure_data(s3, spec.data.s3_uri)
    plan = planner.plan(spec, data_gib=data_gib, extension_bytes=extension_bytes).to_dict()
    policy.check_plan(plan)
    compiled = launch.compile_launch(
        spec, job_id, settings, plan, launch_plan.Found(resume=resume, training_plan=training_plan, team=team)
    ).model_dump(mode="json")

    normalised = spec.model_dump(mode="json")
    size = len(json.dumps(normalised)) + len(json.dumps(plan)) + len(json.dumps(compiled))
    if size > MAX_STATE_SPEC_BYTES:
        raise SpecInvalid.one(
            "",
            MISSING,
            f"the spec, its plan and its launch plan are {size:,} bytes as JSON; at most {MAX_STATE_SPEC_BYTES:,} "
            "travel between the run's states (shrink code.hyperparameters or code.environment)",
        )

    return record_once(
        ddb,
        settings,
        source,
        job_id,
        {"kind": records.TRAIN, "team": team, "spec": normalised, "plan": plan, "launch": compiled},
    )


def record_once(
    ddb: Any, settings: Settings, source: SpecSource, job_id: str, facts: dict[str, Any]
) -> dict[str, Any]:
    """Write the job record of a checked run once (its kind, spec, plan...: `facts`); $.job for the state machine,
    or {duplicate: true, ...} when another start recorded the same run."""
    started_at = records.now_iso()
    record = records.JobRecord.new(
        job_id=job_id,
        source=source.to_dict(),
        # absent for a direct invoke: DynamoDB refuses an empty string as an index key
        execution=source.execution or None,
        created_at=started_at,
        **facts,
    )
    if not records.put_new(ddb, settings.jobs_table, record):
        existing = records.get(ddb, settings.jobs_table, job_id)
        same_execution = (
            existing is not None and bool(source.execution) and existing.execution == source.execution
        )
        if existing is None or not same_execution:
            return {
                "job_id": job_id,
                "duplicate": True,
                "kind": facts["kind"],
                "source": existing.source if existing is not None else source.to_dict(),
                "started_at": existing.created_at if existing is not None else None,
                "duplicate_of": existing.execution if existing is not None else None,
            }
        started_at = existing.created_at or started_at
    return {
        "job_id": job_id,
        "duplicate": False,
        **facts,
        "source": source.to_dict(),
        "started_at": started_at,
    }


def check_output_is_a_preparations(s3: Any, uri: str) -> None:
    """A preparation's output holds nothing but what a preparation writes (the trainer's layout.is_output): its own
    role may read, write and delete there, so an output holding another run's data (its checkpoints, its model) is
    refused before anything is created. Listed a folder level at a time: the shards at the top, a page of 1,000 keys
    per call (80 calls for the 80,000 shards of 20 TB), never the keys inside a folder."""
    bucket, prefix = split_s3_uri(uri, "output")
    prefix = prefix if prefix.endswith("/") or not prefix else prefix + "/"
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
            found = [f["Prefix"][len(prefix) :] for f in page.get("CommonPrefixes", [])]
            found = [f for f in found if f not in layout.OUTPUT_FOLDERS]
            found += [
                o["Key"][len(prefix) :]
                for o in page.get("Contents", [])
                if o["Key"] != prefix and not layout.is_output(o["Key"][len(prefix) :])
            ]
            if found:
                raise SpecInvalid.one(
                    "output",
                    uri,
                    f"holds {found[0]!r}, which a data preparation does not write (another run's data?): the "
                    "preparation may write and delete anything under its output, so give it a location of its own "
                    "(empty, or an earlier preparation's)",
                )
    except ClientError as exc:
        if error_code(exc) in {"NoSuchBucket", "AccessDenied", "AllAccessDisabled", "PermanentRedirect"}:
            raise SpecInvalid.one(
                "output", uri, f"the output location cannot be listed by the stack ({explained(exc)})"
            ) from None
        raise


#: a run's id, as job_id_for makes it: the spec's name and 8 hex digits
JOB_ID = re.compile(r"[a-z0-9-]{1,40}-[0-9a-f]{8}")


def check_output_is_no_runs_folder(ddb: Any, settings: Settings, uri: str) -> None:
    """A preparation's output is not in a run's own folder (a run's results lie under <prefix>[<folders>/]<job id>/),
    one that has written nothing yet included (a queued run): the preparation's role would reach what it writes."""
    for segment in split_s3_uri(uri, "output")[1].split("/"):
        if JOB_ID.fullmatch(segment) and records.get(ddb, settings.jobs_table, segment) is not None:
            raise SpecInvalid.one(
                "output",
                uri,
                f"lies in the folder of run {segment}, whose results go there: give the preparation a location "
                "of its own",
            )


def register_prepare(
    document: dict[str, Any], source: SpecSource, *, s3: Any, ddb: Any, settings: Settings
) -> dict[str, Any]:
    """A data preparation run (kind: prepare): its spec checked against the stack's rules, its source measured and
    readable, its output's bucket reachable, its plan (prepare_plan.plan_of) within the stack's budget; recorded
    once as a training run is."""
    spec = validate_prepare_spec(document)
    team = team_of(source, settings)
    job_id = job_id_for(spec.name, source.identity)
    policy = Policy.for_stack(settings)
    policy.check_prepare(spec, team)
    if spec.code is None:
        raise SpecInvalid.one(
            "code",
            MISSING,
            "the trainer package's s3:// prefix the processing jobs run: start the run with `lustrain data prepare "
            "s3://SRC s3://OUT --stack STACK` or `lustrain submit SPEC --stack STACK`, which upload it and set code",
        )
    if spec.tokenizer.startswith("s3://"):
        key = split_s3_uri(spec.tokenizer, "tokenizer")[1]
        if not any(o["Key"] == key for o in _listing(s3, spec.tokenizer, "tokenizer", "the tokenizer")):
            raise SpecInvalid.one("tokenizer", spec.tokenizer, "no such object: the tokenizer.json to load")
    code = spec.code.rstrip("/") + "/" + prepare_plan.ENTRY_MODULE_FILE
    if not any(
        o["Key"] == split_s3_uri(code, "code")[1] for o in _listing(s3, code, "code", "the trainer package")
    ):
        raise prepare_plan.entry_module_missing(spec.code)
    source_gib = spec.size_gib
    if source_gib is None:
        source_gib, _ = measure_data(s3, spec.source, "source", "size_gib")
    elif not _listing(s3, spec.source, "source", "the source"):
        raise SpecInvalid.one(
            "source", spec.source, "no objects under this prefix: upload the text or fix the URI"
        )
    check_output_is_a_preparations(s3, spec.output)
    check_output_is_no_runs_folder(ddb, settings, spec.output)
    plan = prepare_plan.planned(spec, source_gib)
    prepare_plan.check_stage_runtimes(plan)
    policy.check_prepare_plan(plan)
    return record_once(
        ddb,
        settings,
        source,
        job_id,
        {"kind": records.PREPARE, "team": team, "spec": spec.model_dump(mode="json"), "plan": plan},
    )
