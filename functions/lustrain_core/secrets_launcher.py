"""The job's secrets launcher: reads code.secrets inside the training container, then becomes the entry point.

A spec's code.secrets never travel in CreateTrainingJob's Environment (which the jobs table, the execution history and
DescribeTrainingJob would keep): upload_code (steps/code.py) puts this file and SECRETS_FILE (the names, the ARNs and
the real entry point; no value) into the code bundle, and start_training names this file as the script-mode program.
SageMaker then runs it where it would have run the entry point, alone or once per process under torchrun; it reads
each secret with the job's execution role (GetSecretValue, or GetParameter WithDecryption), puts the values into its
own environment and replaces itself with the entry point (os.execv), which sees them as ordinary variables, with
the same arguments, process id and signals (a stop's SIGTERM reaches the trainer).

The job runs in a private subnet with no internet, on SageMaker's PyTorch training image: this file uses only the
standard library and boto3, which the image ships (the SageMaker training toolkit in it depends on boto3), and reaches
Secrets Manager and SSM through the run's interface endpoints (steps/network.py), whose private DNS answers for the
services' own names. It imports nothing of lustrain's: it is copied into the bundle on its own.

A secret that cannot be read fails the job before the entry point starts, with a FailureReason (SageMaker's
/opt/ml/output/failure) naming the variable, its ARN and AWS's error; no value is ever printed.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The launcher's name in the code bundle, and the file beside it that says what to read and what to run.
LAUNCHER_FILE = "lustrain_secrets_launcher.py"
SECRETS_FILE = "lustrain_secrets.json"
#: A FailureReason holds at most 1024 characters.
MAX_FAILURE = 1000

#: client(service, region) -> a boto3 client
ClientFactory = Callable[[str, str], Any]


class SecretUnavailable(Exception):
    """A secret of code.secrets could not be read: the variable, the ARN and why (never a value)."""


def boto3_client(service: str, region: str) -> Any:
    import boto3
    from botocore.config import Config

    # a subnet with no route to the service makes connections hang, not fail: give up in seconds, not minutes
    config = Config(connect_timeout=5, read_timeout=10, retries={"mode": "standard", "max_attempts": 3})
    return boto3.client(service, region_name=region, config=config)


def read_secret(arn: str, client: ClientFactory) -> str:
    """One secret's value: a Secrets Manager secret's SecretString, or an SSM parameter's decrypted value."""
    _, _, service, region, _account, _ = arn.split(":", 5)
    if service == "secretsmanager":
        answer = client(service, region).get_secret_value(SecretId=arn)
        if "SecretString" not in answer:
            raise SecretUnavailable(
                "it holds binary data (SecretBinary); an environment variable takes a string"
            )
        return str(answer["SecretString"])
    if service == "ssm":
        return str(client(service, region).get_parameter(Name=arn, WithDecryption=True)["Parameter"]["Value"])
    raise SecretUnavailable(f"{service} is neither secretsmanager nor ssm")


def fetch(secrets: dict[str, str], client: ClientFactory) -> dict[str, str]:
    """Every secret's value by its variable's name; SecretUnavailable names the first that cannot be read."""
    values: dict[str, str] = {}
    for name, arn in sorted(secrets.items()):
        try:
            values[name] = read_secret(arn, client)
        except Exception as error:
            reason = (
                str(error) if isinstance(error, SecretUnavailable) else f"{type(error).__name__}: {error}"
            )
            raise SecretUnavailable(f"code.secrets.{name} ({arn}) could not be read: {reason}") from None
    return values


def command(code_dir: Path, entry_point: str, args: list[str]) -> list[str]:
    """How SageMaker's script mode runs the entry point: a shell script with sh, anything else with Python."""
    path = str(code_dir / entry_point)
    if entry_point.endswith(".sh"):
        return ["/bin/sh", path, *args]
    return [sys.executable, path, *args]


def fail(message: str) -> int:
    """Report a failure as SageMaker reads it (the failure file becomes the job's FailureReason) and on stderr."""
    text = f"lustrain could not start the entry point: {message}"[:MAX_FAILURE]
    output = Path(os.environ.get("SM_OUTPUT_DIR", "/opt/ml/output"))
    try:
        output.mkdir(parents=True, exist_ok=True)
        (output / "failure").write_text(text, encoding="utf-8")
    except OSError:
        pass  # the message still reaches the job's log
    print(text, file=sys.stderr, flush=True)
    return 1


def main(argv: list[str], client: ClientFactory = boto3_client) -> int:
    code_dir = Path(__file__).resolve().parent
    config = json.loads((code_dir / SECRETS_FILE).read_text(encoding="utf-8"))
    try:
        values = fetch(dict(config["secrets"]), client)
    except SecretUnavailable as error:
        return fail(str(error))
    os.environ.update(values)
    program = command(code_dir, str(config["entry_point"]), argv[1:])
    os.execv(program[0], program)  # noqa: S606 - the job's own entry point, as SageMaker would start it
    return 0  # not reached: execv replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv))
