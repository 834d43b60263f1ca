"""`lustrain submit SPEC`: start a run on a deployed stack by dropping the spec into its jobs bucket.

A local code.source (a path relative to the spec file's directory, or an absolute one) is uploaded first, under a
content-hash prefix of the artifacts bucket, and the dropped spec points at it (Lambda cannot read the user's disk).
A data preparation (kind: prepare, or `lustrain data prepare s3://SRC s3://OUT --stack S`) runs the trainer package
(lustrain_trainer) on SageMaker Processing: the installed package is uploaded the same way, and the spec's `code`
points at it. The stack's buckets come from its CloudFormation
outputs (`--stack`), or are named directly (`--jobs-bucket`, `--artifacts-bucket`: the twin of `lustrain local up`).
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import lustrain_trainer
import yaml
from lustrain_core import prepare_plan
from lustrain_core.errors import SpecInvalid
from lustrain_core.launch import compile_offline
from lustrain_core.spec import NAME_PATTERN, load_spec_file, validate_prepare_spec
from lustrain_core.teams import JOBS_FOLDER, TEAM_PATTERN


@dataclass(frozen=True)
class Submission:
    spec_s3_uri: str
    code_s3_uri: str | None
    #: None for a data preparation whose source's size the stack measures (register_job prices it then)
    estimated_cost_usd: float | None


def stack_buckets(stack: str, session: boto3.Session) -> tuple[str, str]:
    """The jobs and artifacts bucket names from a deployed stack's outputs."""
    outputs = {
        o["OutputKey"]: o["OutputValue"]
        for o in session.client("cloudformation")
        .describe_stacks(StackName=stack)["Stacks"][0]
        .get("Outputs", [])
    }
    missing = {"JobsBucketName", "ArtifactsBucketName"} - set(outputs)
    if missing:
        raise SpecInvalid.one(
            "--stack", stack, f"is not a lustrain stack: no output {', '.join(sorted(missing))}"
        )
    return outputs["JobsBucketName"], outputs["ArtifactsBucketName"]


def submit(
    spec_path: str | Path,
    *,
    jobs_bucket: str,
    artifacts_bucket: str,
    session: boto3.Session | None = None,
    team: str | None = None,
) -> Submission:
    """Validate and plan the spec (SpecInvalid before anything is written), upload local code, drop the spec (into
    jobs/<team>/ for a team: lustrain_core.teams)."""
    folder = jobs_folder(team)
    session = session or boto3.Session()
    spec_path = Path(spec_path)
    spec = load_spec_file(spec_path)
    estimate = compile_offline(spec)[0].cost.total_usd
    doc = spec.model_dump(mode="json")
    code_uri = None
    if not spec.code.source.startswith("s3://"):
        local = local_code_dir(spec_path, spec.code.source)
        if not local.is_dir():
            raise SpecInvalid.one(
                "code.source",
                spec.code.source,
                f"no such local directory: {local} (a relative path is read from the spec file's directory, "
                "an absolute one as given; or give an s3:// URI)",
            )
        code_uri = upload_code_dir(local, artifacts_bucket, spec.name, session)
        doc["code"]["source"] = code_uri
    return Submission(_drop(session, jobs_bucket, spec.name, doc, folder), code_uri, estimate)


def jobs_folder(team: str | None) -> str:
    """Where a spec is dropped: its team's folder jobs/<team>/ when given (a run's team is its folder's; a stack of
    one team takes a spec anywhere under jobs/); SpecInvalid for a name no team has, before anything is written."""
    if team is None:
        return JOBS_FOLDER
    if not TEAM_PATTERN.fullmatch(team):
        raise SpecInvalid.one("--team", team, "a team's name: lower-case letters, digits and hyphens, 1 to 32")
    return f"{JOBS_FOLDER}{team}/"


def _drop(session: Any, jobs_bucket: str, name: str, doc: dict[str, Any], folder: str) -> str:
    """Put the spec where the stack's rule starts a run of it, in `folder` (jobs_folder); its s3:// URI."""
    key = f"{folder}{name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.yaml"
    session.client("s3").put_object(
        Bucket=jobs_bucket, Key=key, Body=yaml.safe_dump(doc, sort_keys=False).encode()
    )
    return f"s3://{jobs_bucket}/{key}"


def prepare_spec_of(
    source: str,
    output: str,
    *,
    instances: int = 1,
    instance_type: str | None = None,
    tokenizer: str = "bytes",
    name: str | None = None,
    size_gib: float | None = None,
) -> dict[str, Any]:
    """The kind: prepare spec `lustrain data prepare SRC OUT --stack S` submits (checked by validate_prepare_spec;
    SpecInvalid names the option's field). Its name is --name, else OUT's last folder in [a-z0-9-]."""
    if name is None:
        folder = output.rstrip("/").rsplit("/", 1)[-1].lower()
        name = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", folder)).strip("-")[:40].strip("-") or "prepare"
        if not re.fullmatch(NAME_PATTERN, name):
            name = "prepare"
    doc: dict[str, Any] = {
        "kind": "prepare",
        "name": name,
        "source": source,
        "output": output,
        "tokenizer": tokenizer,
        "instances": instances,
    }
    if instance_type is not None:
        doc["instance_type"] = instance_type
    if size_gib is not None:
        doc["size_gib"] = size_gib
    return validate_prepare_spec(doc).model_dump(mode="json", exclude_none=True)


def submit_prepare(
    doc: dict[str, Any],
    *,
    jobs_bucket: str,
    artifacts_bucket: str,
    session: boto3.Session | None = None,
    team: str | None = None,
) -> Submission:
    """Drop a data preparation spec (kind: prepare), with the trainer package uploaded as its code unless it names
    one. Its estimate is prepare_plan.plan_of's when it gives size_gib (else the stack measures the source)."""
    folder = jobs_folder(team)
    session = session or boto3.Session()
    spec = validate_prepare_spec(doc)
    doc = spec.model_dump(mode="json", exclude_none=True)
    estimate = None
    if spec.size_gib is not None:
        plan = prepare_plan.planned(spec, spec.size_gib)
        prepare_plan.check_stage_runtimes(plan)
        cost = plan["cost_usd"]
        estimate = float(cost) if isinstance(cost, int | float) else None
    code_uri = None
    if spec.code is None:
        code_uri = upload_trainer(artifacts_bucket, session)
        doc["code"] = code_uri
    return Submission(_drop(session, jobs_bucket, spec.name, doc, folder), code_uri, estimate)


def upload_trainer(bucket: str, session: Any) -> str:
    """Upload the installed trainer package (lustrain_trainer/, at the prefix's root as the processing jobs'
    entry point imports it) under a content-hash prefix; its s3:// URI, the spec's `code`."""
    package = Path(lustrain_trainer.__file__).resolve().parent
    return upload_code_dir(package, bucket, "lustrain-trainer", session, into=f"{package.name}/")


def local_code_dir(spec_path: str | Path, source: str) -> Path:
    """A local code.source: relative to the spec file's directory (wherever the command runs), absolute as given."""
    local = Path(source).expanduser()
    return local if local.is_absolute() else Path(spec_path).parent / local


def upload_code_dir(local: Path, bucket: str, name: str, session: Any, into: str = "") -> str:
    """Upload a local code directory under a content-hash prefix (unchanged code is not re-uploaded), its files
    under `into` there."""
    files = sorted(
        p for p in local.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )
    digest = hashlib.sha256()
    for p in files:
        digest.update((into + str(p.relative_to(local))).encode() + b"\0" + p.read_bytes())
    prefix = f"uploads/{name}/{digest.hexdigest()[:16]}/"
    s3 = session.client("s3")
    if s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount", 0) == 0:
        for p in files:
            s3.upload_file(str(p), bucket, prefix + into + p.relative_to(local).as_posix())
    return f"s3://{bucket}/{prefix}"
