"""What a training job reads and writes in S3, as its execution role, through the path its network gives it.

SageMaker makes these calls with the job's execution role: downloading the code (sagemaker_submit_directory),
the S3 channels and the checkpoints, uploading model.tar.gz, output.tar.gz and the checkpoints. Here each is
authorized by the twin's IAM (the `authorize` collaborator, which also applies the policy of the VPC endpoint the
job's traffic goes through), then served from moto's S3 backend in this process, so the simulator works the
same under mock_aws and in server mode.
"""

from __future__ import annotations

import builtins
import io
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from botocore.exceptions import ClientError

#: authorize(service, operation, params): raise the service's ClientError when the job's role may not.
Authorize = Callable[[str, str, dict[str, Any]], None]


class MissingBucket(Exception):
    def __init__(self, bucket: str) -> None:
        super().__init__(bucket)
        self.bucket = bucket


class InvalidUri(ValueError):
    """Not an s3:// URI."""


def split_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise InvalidUri(f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


def as_dir_prefix(prefix: str) -> str:
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def denied_text(error: ClientError) -> str:
    """How SageMaker quotes an S3 error in a FailureReason: 'AccessDenied (403): <message>'."""
    info = error.response.get("Error", {})
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 403)
    return f"{info.get('Code', 'AccessDenied')} ({status}): {info.get('Message', '')}"


@dataclass(frozen=True)
class JobStorage:
    """S3 as one job sees it: every call authorized as its role, then served by moto's backend."""

    account: str
    authorize: Authorize

    @property
    def _backend(self) -> Any:
        from moto.s3.models import s3_backends

        return s3_backends[self.account]["aws"]

    def _bucket(self, name: str) -> Any:
        from moto.s3.exceptions import MissingBucket as MotoMissingBucket

        try:
            return self._backend.get_bucket(name)
        except MotoMissingBucket:
            raise MissingBucket(name) from None

    def get(self, bucket: str, key: str) -> bytes | None:
        """The object's bytes; None when the bucket or the key does not exist. ClientError when refused."""
        self.authorize("s3", "GetObject", {"Bucket": bucket, "Key": key})
        try:
            self._bucket(bucket)
        except MissingBucket:
            return None
        found = self._backend.get_object(bucket, key)
        return None if found is None else bytes(found.value)

    def list(self, bucket: str, prefix: str) -> list[tuple[str, bytes]]:
        """Every object under the prefix and its bytes (ListObjectsV2, then GetObject each). MissingBucket."""
        self.authorize("s3", "ListObjectsV2", {"Bucket": bucket, "Prefix": prefix})
        keys, _folders, _truncated, _marker = self._backend.list_objects(
            self._bucket(bucket), prefix, None, None, None
        )
        found = []
        for item in keys:
            if item.name.endswith("/"):
                continue
            self.authorize("s3", "GetObject", {"Bucket": bucket, "Key": item.name})
            found.append((item.name, bytes(item.value)))
        return found

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.authorize("s3", "PutObject", {"Bucket": bucket, "Key": key})
        self._bucket(bucket)
        self._backend.put_object(bucket, key, data)

    def delete(self, bucket: str, key: str) -> None:
        """DeleteObject: S3 answers it alike whether the key was there or not. ClientError when refused."""
        self.authorize("s3", "DeleteObject", {"Bucket": bucket, "Key": key})
        self._bucket(bucket)
        self._backend.delete_object(bucket, key)

    def keys(self, bucket: str, prefix: str) -> builtins.list[tuple[str, int]]:
        """ListObjectsV2 of a prefix (its s3:prefix as the role's condition sees it): each key and its size."""
        self.authorize("s3", "ListObjectsV2", {"Bucket": bucket, "Prefix": prefix})
        found, _folders, _truncated, _marker = self._backend.list_objects(
            self._bucket(bucket), prefix, None, None, None
        )
        return [(item.name, int(item.size)) for item in found]


def write_below(root: Path, relative: str, data: bytes) -> None:
    """Write `relative` under `root`, refusing keys that would climb out of it ('..')."""
    parts = [p for p in PurePosixPath(relative).parts if p not in ("/", "")]
    if not parts or ".." in parts:
        return
    path = root.joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def tar_gz(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(directory.rglob("*")):
            archive.add(path, arcname=path.relative_to(directory).as_posix(), recursive=False)
    return buffer.getvalue()
