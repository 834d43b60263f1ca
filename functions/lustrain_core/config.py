"""The stack's settings, read once from the Lambda environment (template.yaml sets every one)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

#: where the CLI uploads a local code directory before a run (lustrain submit), under the artifacts bucket
#: the stack's stop requests (lustrain_core/stop_request.py)
CONTROL_PREFIX = "control/"
UPLOADS_PREFIX = "uploads/"


@dataclass(frozen=True)
class Settings:
    region: str = "us-east-1"
    jobs_table: str = "lustrain-jobs"
    tokens_table: str = "lustrain-task-tokens"
    queue_table: str = "lustrain-capacity-queue"
    artifacts_bucket: str = "lustrain-artifacts"
    archive_prefix: str = "archive/"
    code_prefix: str = "code/"
    sagemaker_role_arn: str = "arn:aws:iam::123456789012:role/lustrain-sagemaker"
    notify_topic_arn: str = ""
    stack_name: str = "lustrain"
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        defaults = cls()
        return cls(
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or defaults.region,
            jobs_table=env.get("JOBS_TABLE", defaults.jobs_table),
            tokens_table=env.get("TOKENS_TABLE", defaults.tokens_table),
            queue_table=env.get("QUEUE_TABLE", defaults.queue_table),
            artifacts_bucket=env.get("ARTIFACTS_BUCKET", defaults.artifacts_bucket),
            archive_prefix=env.get("ARCHIVE_PREFIX", defaults.archive_prefix),
            code_prefix=env.get("CODE_PREFIX", defaults.code_prefix),
            sagemaker_role_arn=env.get("SAGEMAKER_ROLE_ARN", defaults.sagemaker_role_arn),
            notify_topic_arn=env.get("NOTIFY_TOPIC_ARN", defaults.notify_topic_arn),
            stack_name=env.get("STACK_NAME", defaults.stack_name),
            extra={k: v for k, v in env.items() if k.startswith("LUSTRAIN_")},
        )

    @property
    def own_data_prefix(self) -> str:
        """Where a stack deployed without AllowedDataPrefixes lets runs read data (template.yaml, DataReadPolicy)."""
        return f"s3://{self.artifacts_bucket}/data/"

    @property
    def own_output_prefix(self) -> str:
        """Where a stack deployed without AllowedOutputPrefixes lets runs write (template.yaml, OutputReadPolicy)."""
        return f"s3://{self.artifacts_bucket}/results/"

    @property
    def reserved_prefixes(self) -> tuple[str, ...]:
        """The stack's own locations of code bundles, uploaded code, archives and stop requests: no run's data or
        results."""
        bucket = f"s3://{self.artifacts_bucket}/"
        return (bucket + self.code_prefix, bucket + UPLOADS_PREFIX, bucket + self.archive_prefix,
                bucket + CONTROL_PREFIX)

    def whole_seconds(self, name: str, *, least: int) -> int | None:
        """A stack setting in whole seconds (at least `least`), or None where the stack leaves it unset."""
        raw = self.extra.get(name, "").strip()
        if not raw:
            return None
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"stack setting {name}={raw!r} is not a whole number of seconds") from None
        if value < least:
            raise ValueError(f"stack setting {name}={raw!r} must be {least} or more")
        return value
