"""upload_code: pack the training code into SageMaker's sourcedir.tar.gz, stored once per content.

code.source is an S3 prefix (the CLI uploads a local directory there first). Every object under it goes into
the bundle at its path relative to the prefix. The tar is deterministic (sorted names, fixed mtimes, owners and
modes, a gzip header without time or name), so the same files always give the same bytes and the same sha256.
The bundle is stored at s3://<artifacts bucket>/<CODE_PREFIX><job id>/<sha256>/sourcedir.tar.gz: under the run's
own id, since a training job may read only its own run's code (the execution role's grant names the session tag
lustrain-run). It is not uploaded again when that key holds these very bytes: a retry costs one HeadObject, which
compares the SHA-256 S3 computed of what is there (ChecksumMode ENABLED) with the bundle's. An object there with
other bytes, or with no SHA-256 (uploaded by anything but upload_code), is overwritten, never trusted by its name.

A metric_definitions.json at the bundle's root ([{"Name", "Regex"}], the trainer ships one) is validated against
SageMaker's limits and returned for start_training's AlgorithmSpecification.MetricDefinitions.

With code.secrets the bundle also holds lustrain's secrets launcher and the list of what it reads (names and ARNs,
never a value): lustrain_core/secrets_launcher.py says why and how.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import re
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core import prepare_plan, secrets_launcher, stop_request
from lustrain_core.aws_errors import error_code, explained
from lustrain_core.config import Settings
from lustrain_core.document import Code, MetricDefinition, Run
from lustrain_core.errors import MISSING, FieldError, SpecInvalid
from lustrain_core.spec import JobSpec
from lustrain_core.steps import prepare
from lustrain_core.steps.job import split_s3_uri

BUNDLE_NAME = "sourcedir.tar.gz"
METRIC_DEFINITIONS_FILE = "metric_definitions.json"
#: The bundle is built in the Lambda's memory: code, not data or weights, belongs in it.
MAX_BUNDLE_SOURCE_BYTES = 256 * 2**20
MAX_BUNDLE_FILES = 10_000
#: SageMaker's MetricDefinitionList: at most 40, Name 1..255 chars, Regex 1..500 chars.
MAX_METRICS = 40
MAX_METRIC_NAME = 255
MAX_METRIC_REGEX = 500
_SHOWN_PY_FILES = 20


def build_bundle(files: Iterable[tuple[str, bytes]]) -> bytes:
    """A tar.gz of (path, bytes) pairs whose bytes depend on nothing but the paths and contents."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, body in sorted(files):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            info.mtime = 0
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(body))
    packed = io.BytesIO()
    # GzipFile writes the current time and a file name into the header unless told not to
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0) as gz:
        gz.write(raw.getvalue())
    return packed.getvalue()


def read_source(s3: Any, source: str, field: str = "code.source") -> list[tuple[str, bytes]]:
    """Every object under the code.source prefix (a preparation's `code`: `field`), as (path relative to the prefix,
    bytes)."""
    bucket, prefix = split_s3_uri(source, field)
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    keys: list[tuple[str, int]] = []
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys += [(obj["Key"], int(obj.get("Size", 0))) for obj in page.get("Contents", [])]
    except ClientError as exc:
        code = error_code(exc)
        if code in {"NoSuchBucket", "AccessDenied"}:
            raise SpecInvalid.one(
                field, source, f"cannot be listed by the stack ({explained(exc)})"
            ) from None
        raise
    keys = [(key, size) for key, size in keys if not key.endswith("/")]
    if not keys:
        raise SpecInvalid.one(field, source, "no objects under this prefix: upload the code or fix the URI")
    total = sum(size for _, size in keys)
    if len(keys) > MAX_BUNDLE_FILES or total > MAX_BUNDLE_SOURCE_BYTES:
        raise SpecInvalid.one(
            field,
            source,
            f"{len(keys):,} files, {total / 2**20:,.1f} MiB: the code bundle may hold at most "
            f"{MAX_BUNDLE_FILES:,} files and {MAX_BUNDLE_SOURCE_BYTES // 2**20} MiB (keep data and weights "
            "out of it: data comes through Lustre, checkpoints through checkpoints.s3_uri)",
        )
    names = [key[len(prefix) :] for key, _ in keys]
    unsafe = [name for name in names if name.startswith("/") or ".." in name.split("/")]
    if unsafe:
        raise SpecInvalid.one(
            field, source, f"object names that would unpack outside the code directory: {unsafe[:5]}"
        )
    return [
        (name, s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        for name, (key, _) in zip(names, keys, strict=True)
    ]


def check_entry_point(names: list[str], entry_point: str, source: str) -> None:
    if entry_point in names:
        return
    py_files = sorted(name for name in names if name.endswith(".py"))
    shown = ", ".join(py_files[:_SHOWN_PY_FILES]) + (" ..." if len(py_files) > _SHOWN_PY_FILES else "")
    raise SpecInvalid.one(
        "code.entry_point",
        entry_point,
        f"not in the code under {source}; .py files there: {shown or 'none'}",
    )


def secrets_launcher_files(spec: JobSpec, names: list[str]) -> list[tuple[str, bytes]]:
    """With code.secrets, the launcher that reads them in the job and then runs the entry point, and what it reads:
    the names, the ARNs and the entry point (no value). start_training names the launcher as the program."""
    if not spec.code.secrets:
        return []
    ours = [name for name in (secrets_launcher.LAUNCHER_FILE, secrets_launcher.SECRETS_FILE) if name in names]
    if ours:
        raise SpecInvalid.one(
            "code.source",
            spec.code.source,
            f"holds {', '.join(ours)}, the name lustrain gives its secrets launcher (code.secrets): rename it",
        )
    config = {"entry_point": spec.code.entry_point, "secrets": dict(sorted(spec.code.secrets.items()))}
    return [
        (secrets_launcher.LAUNCHER_FILE, Path(secrets_launcher.__file__).read_bytes()),
        (secrets_launcher.SECRETS_FILE, json.dumps(config, indent=2).encode()),
    ]


def parse_metric_definitions(body: bytes) -> list[dict[str, str]]:
    """metric_definitions.json, checked against SageMaker's limits; every problem named in one SpecInvalid."""
    where = METRIC_DEFINITIONS_FILE
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecInvalid.one("code.source", MISSING, f"{where} is not valid JSON: {exc}") from None
    if not isinstance(doc, list):
        raise SpecInvalid.one(
            "code.source", MISSING, f'{where} must be a JSON list of {{"Name", "Regex"}} objects'
        )
    if len(doc) > MAX_METRICS:
        raise SpecInvalid.one(
            "code.source",
            MISSING,
            f"{where} has {len(doc)} definitions; SageMaker takes at most {MAX_METRICS}",
        )
    errors: list[FieldError] = []
    for i, item in enumerate(doc):
        if not isinstance(item, dict) or set(item) != {"Name", "Regex"}:
            errors.append(
                FieldError("code.source", item, f'{where}[{i}]: an object with exactly "Name" and "Regex"')
            )
            continue
        name, regex = item["Name"], item["Regex"]
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_METRIC_NAME:
            errors.append(
                FieldError(
                    "code.source", name, f"{where}[{i}].Name: a string of 1..{MAX_METRIC_NAME} characters"
                )
            )
        if not isinstance(regex, str) or not 1 <= len(regex) <= MAX_METRIC_REGEX:
            errors.append(
                FieldError(
                    "code.source", regex, f"{where}[{i}].Regex: a string of 1..{MAX_METRIC_REGEX} characters"
                )
            )
            continue
        try:
            re.compile(regex)
        except re.error as exc:
            errors.append(
                FieldError("code.source", regex, f"{where}[{i}].Regex: not a regular expression ({exc})")
            )
    if errors:
        raise SpecInvalid(errors)
    return [{"Name": item["Name"], "Regex": item["Regex"]} for item in doc]


def bundle_key(settings: Settings, job_id: str, sha256: str) -> str:
    return f"{settings.code_prefix}{job_id}/{sha256}/{BUNDLE_NAME}"


def s3_sha256(sha256_hex: str) -> str:
    """A SHA-256 as S3 reports it (ChecksumSHA256: base64 of the digest)."""
    return base64.b64encode(bytes.fromhex(sha256_hex)).decode()


def _holds(s3: Any, bucket: str, key: str, sha256_hex: str) -> bool:
    """Whether the key holds exactly the bundle: S3's own SHA-256 of the object, not its name or metadata (which
    anyone who can write the key can set)."""
    try:
        head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
            return False
        raise
    return bool(head.get("ChecksumSHA256") == s3_sha256(sha256_hex))


def upload_code(document: dict[str, Any], *, s3: Any, settings: Settings) -> Code:
    """Bundle code.source (a data preparation run's `code`: the trainer package) and store it by content; returns
    $.code."""
    if prepare.is_prepare_run(document):
        return upload_trainer(document, s3=s3, settings=settings)
    job = Run.parse(document).job
    spec = job.spec
    files = read_source(s3, spec.code.source)
    names = [name for name, _ in files]
    check_entry_point(names, spec.code.entry_point, spec.code.source)
    files += secrets_launcher_files(spec, names)
    metrics_body = dict(files).get(METRIC_DEFINITIONS_FILE)
    metric_definitions = parse_metric_definitions(metrics_body) if metrics_body is not None else []

    code = store_bundle(s3, settings, job.job_id, files, spec.code.source, metric_definitions)
    # before the training job exists: its trainer reads the request from its first step (stop_request.py)
    stop_request.not_asked(s3, settings, job.job_id)
    return code


def upload_trainer(document: dict[str, Any], *, s3: Any, settings: Settings) -> Code:
    """A data preparation run's code: the trainer package under its spec's `code` (lustrain_trainer/ at its root,
    which the processing jobs' entry point runs: prepare_plan.ENTRY_SCRIPT), bundled and stored as a training
    run's code is. SpecInvalid names `code` when the spec has none or the package is not there."""
    job_id, spec = prepare.job_of(document)
    if spec.code is None:
        raise SpecInvalid.one(
            "code",
            MISSING,
            "the trainer package's s3:// prefix: `lustrain data prepare --stack` and `lustrain submit` upload it",
        )
    files = read_source(s3, spec.code, "code")
    if prepare_plan.ENTRY_MODULE_FILE not in {name for name, _ in files}:
        raise prepare_plan.entry_module_missing(spec.code)
    return store_bundle(s3, settings, job_id, files, spec.code, [])


def store_bundle(
    s3: Any,
    settings: Settings,
    job_id: str,
    files: list[tuple[str, bytes]],
    source: str,
    metric_definitions: list[dict[str, str]],
) -> Code:
    """The bundle of `files`, stored under the run's id by its content (not uploaded again when there); $.code."""
    bundle = build_bundle(files)
    sha256 = hashlib.sha256(bundle).hexdigest()
    bucket, key = settings.artifacts_bucket, bundle_key(settings, job_id, sha256)
    uploaded = not _holds(s3, bucket, key, sha256)
    if uploaded:
        s3.put_object(
            Bucket=bucket,
            Key=key,
            Body=bundle,
            ContentType="application/gzip",
            ChecksumAlgorithm="SHA256",
            Metadata={"sha256": sha256, "source": source},
        )
    return Code(
        submit_directory=f"s3://{bucket}/{key}",
        bucket=bucket,
        key=key,
        sha256=sha256,
        uploaded=uploaded,
        files=len(files),
        bytes=len(bundle),
        metric_definitions=[MetricDefinition(**m) for m in metric_definitions],
    )
