"""`lustrain submit SPEC`: start a run on a deployed stack by dropping the spec into its jobs bucket.

A local code.source (a path relative to the spec file's directory, or an absolute one) is uploaded first, under a
content-hash prefix of the artifacts bucket, and the dropped spec points at it (Lambda cannot read the user's disk). The stack's buckets come from its CloudFormation
outputs (`--stack`), or are named directly (`--jobs-bucket`, `--artifacts-bucket`: the twin of `lustrain local up`).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import yaml
from lustrain_core.errors import SpecInvalid
from lustrain_core.launch import compile_offline
from lustrain_core.spec import load_spec_file


@dataclass(frozen=True)
class Submission:
    spec_s3_uri: str
    code_s3_uri: str | None
    estimated_cost_usd: float


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
    spec_path: str | Path, *, jobs_bucket: str, artifacts_bucket: str, session: boto3.Session | None = None
) -> Submission:
    """Validate and plan the spec (SpecInvalid before anything is written), upload local code, drop the spec."""
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
    key = f"jobs/{spec.name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.yaml"
    session.client("s3").put_object(
        Bucket=jobs_bucket, Key=key, Body=yaml.safe_dump(doc, sort_keys=False).encode()
    )
    return Submission(f"s3://{jobs_bucket}/{key}", code_uri, estimate)


def local_code_dir(spec_path: str | Path, source: str) -> Path:
    """A local code.source: relative to the spec file's directory (wherever the command runs), absolute as given."""
    local = Path(source).expanduser()
    return local if local.is_absolute() else Path(spec_path).parent / local


def upload_code_dir(local: Path, bucket: str, name: str, session: Any) -> str:
    """Upload a local code directory under a content-hash prefix (unchanged code is not re-uploaded)."""
    files = sorted(
        p for p in local.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )
    digest = hashlib.sha256()
    for p in files:
        digest.update(str(p.relative_to(local)).encode() + b"\0" + p.read_bytes())
    prefix = f"uploads/{name}/{digest.hexdigest()[:16]}/"
    s3 = session.client("s3")
    if s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount", 0) == 0:
        for p in files:
            s3.upload_file(str(p), bucket, prefix + p.relative_to(local).as_posix())
    return f"s3://{bucket}/{prefix}"
