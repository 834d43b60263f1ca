"""The job's secrets launcher: reads code.secrets inside the training container, then becomes the entry point.

A spec's code.secrets never travel in CreateTrainingJob's Environment (which the jobs table, the execution history and
DescribeTrainingJob would keep): upload_code (steps/code.py) puts this file and SECRETS_FILE (the names, the ARNs and
the real entry point; no value) into the code bundle, and start_training names this file as the script-mode program.
SageMaker then runs it where it would have run the entry point: alone, or under torchrun once per process (8 on a
p4d, 400 on 50 of them). Its values are read with the job's execution role (GetSecretValue, or GetParameter
WithDecryption) once per host, not once per process: Parameter Store answers 40 transactions a second by default,
shared by GetParameter, GetParameters and GetParametersByPath in the account and region, so 400 processes reading at
once are throttled and the job fails. The local rank 0 (torchrun's LOCAL_RANK; a process without it is alone) reads
them, with boto3's adaptive retries (client-side rate limiting on throttling), and hands them to the host's other
ranks in a file of mode 0600 in /dev/shm (memory, never the instance's disk), written atomically (a temporary file,
then a rename); each other rank waits for that file (at most WAIT_SECONDS, then fails naming the wait), reads it once,
and the last of the LOCAL_WORLD_SIZE - 1 readers deletes it. Every process then puts the values into its own
environment and replaces itself with the entry point (os.execv), which sees them as ordinary variables, with the same
arguments and process id.

Signals are not how the trainer is stopped. SageMaker's PyTorch training image runs `bash -m
start_with_right_hostname.sh` as the container's first process, which drops SIGTERM, and the training toolkit that
starts torchrun installs no handler (aws/sagemaker-training-toolkit issues #125 and #173): after StopTrainingJob
the entry point may get no SIGTERM before SIGKILL. The stack asks the trainer to save and exit through a
stop request instead; this launcher neither relies on signals nor changes their handling.

The job runs in a private subnet with no internet, on SageMaker's PyTorch training image: this file uses only the
standard library and boto3, which the image ships (the SageMaker training toolkit in it depends on boto3), and reaches
Secrets Manager and SSM through the run's interface endpoints (steps/network.py), whose private DNS answers for the
services' own names. It imports nothing of lustrain's: it is copied into the bundle on its own.

A secret that cannot be read fails the job before the entry point starts, with a FailureReason (SageMaker's
/opt/ml/output/failure) naming the variable, its ARN and AWS's error; no value is ever printed. The local rank 0
hands that reason to the host's other ranks too, so none of them waits for values that will not come.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

#: The launcher's name in the code bundle, and the file beside it that says what to read and what to run.
LAUNCHER_FILE = "lustrain_secrets_launcher.py"
SECRETS_FILE = "lustrain_secrets.json"
#: A FailureReason holds at most 1024 characters.
MAX_FAILURE = 1000
#: Where the local rank 0 leaves the values for the host's other ranks: a tmpfs (memory) in every Linux container,
#: SageMaker's included (Docker mounts one per container); a 0700 directory under the temporary directory otherwise
HANDOFF_DIR = Path("/dev/shm")  # noqa: S108 - a file of mode 0600 made by mkstemp, checked on reading
#: How long a local rank other than 0 waits for the values: rank 0's reads take seconds, or a few tens of seconds when
#: Parameter Store throttles a large fleet and the adaptive retries space them out (MAX_ATTEMPTS, below)
WAIT_SECONDS = 300.0
#: Attempts per call, the first included (botocore's total_max_attempts; its retry modes' default is 3): 50 hosts'
#: rank 0 reading at once against Parameter Store's default 40 transactions a second need more than one second's worth
MAX_ATTEMPTS = 10

#: client(service, region) -> a boto3 client
ClientFactory = Callable[[str, str], Any]


class SecretUnavailable(Exception):
    """A secret of code.secrets could not be read: the variable, the ARN and why (never a value)."""


def boto3_client(service: str, region: str) -> Any:
    import boto3
    from botocore.config import Config

    # a subnet with no route to the service makes connections hang, not fail: give up in seconds, not minutes.
    # "adaptive" retries (botocore's retry modes: legacy, standard, adaptive) also slow the client down when the
    # service throttles it (a client-side token bucket), which a fleet's rank 0 processes reading at once need
    config = Config(
        connect_timeout=5, read_timeout=10, retries={"mode": "adaptive", "total_max_attempts": MAX_ATTEMPTS}
    )
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
    """Every secret's value by its variable's name; SecretUnavailable names the first that cannot be read.

    One client per service and region serves all its secrets: adaptive retries keep their rate limit in the client."""
    made: dict[tuple[str, str], Any] = {}

    def shared(service: str, region: str) -> Any:
        if (service, region) not in made:
            made[service, region] = client(service, region)
        return made[service, region]

    values: dict[str, str] = {}
    for name, arn in sorted(secrets.items()):
        try:
            values[name] = read_secret(arn, shared)
        except Exception as error:
            reason = (
                str(error) if isinstance(error, SecretUnavailable) else f"{type(error).__name__}: {error}"
            )
            raise SecretUnavailable(f"code.secrets.{name} ({arn}) could not be read: {reason}") from None
    return values


def local_ranks(env: Mapping[str, str]) -> tuple[int, int]:
    """(LOCAL_RANK, LOCAL_WORLD_SIZE) as torchrun sets them for each process of a host; (0, 1) for a process started
    alone (neither set). SecretUnavailable names a variable that is not what torchrun sets."""
    if "LOCAL_RANK" not in env and "LOCAL_WORLD_SIZE" not in env:
        return 0, 1
    numbers: dict[str, int] = {}
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        raw = env.get(name)
        if raw is None or not raw.strip().isdigit():
            raise SecretUnavailable(
                f"{name}={raw!r}: torchrun sets LOCAL_RANK and LOCAL_WORLD_SIZE together, as whole numbers"
            )
        numbers[name] = int(raw)
    rank, size = numbers["LOCAL_RANK"], numbers["LOCAL_WORLD_SIZE"]
    if not 0 <= rank < size:
        raise SecretUnavailable(f"LOCAL_RANK={rank} must be below LOCAL_WORLD_SIZE={size}")
    return rank, size


def handoff_dir(given: Path | None = None) -> Path:
    """The directory of the host's hand-off file: `given` (tests), else /dev/shm, else a directory of this user's
    under the temporary directory, mode 0700, refused if another user owns it or may enter it."""
    if given is not None:
        return given
    if HANDOFF_DIR.is_dir() and os.access(HANDOFF_DIR, os.W_OK | os.X_OK):
        return HANDOFF_DIR
    fallback = Path(tempfile.gettempdir()) / f"lustrain-secrets-{os.getuid()}"
    with contextlib.suppress(FileExistsError):  # another rank of the host made it first
        fallback.mkdir(mode=0o700)
    found = fallback.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise SecretUnavailable(
            f"{fallback} (where the host's ranks share the values without /dev/shm) must be a directory of this "
            f"user's with mode 0700; it is {stat.filemode(found.st_mode)}, owner {found.st_uid}"
        )
    return fallback


def handoff_name(env: Mapping[str, str], parent: int) -> str:
    """The hand-off file's name, the same for every process of one torchrun on one host and no other: its agent
    (the workers' parent process), its run id and its restart (a restarted group reads again, into a new file)."""
    key = "|".join(
        (env.get("TORCHELASTIC_RUN_ID", ""), env.get("TORCHELASTIC_RESTART_COUNT", "0"), str(parent))
    )
    return f"lustrain-secrets-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def publish(directory: Path, name: str, payload: dict[str, Any]) -> Path:
    """Write the hand-off file atomically: a temporary file of mode 0600 (mkstemp's) in the same directory, then a
    rename, so a waiting rank sees either no file or the whole of it."""
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(payload, out)
        os.replace(temporary, directory / name)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return directory / name


def receive(
    directory: Path,
    name: str,
    rank: int,
    readers: int,
    wait_s: float = WAIT_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Wait (at most `wait_s`) for the local rank 0's hand-off file, read it once, and delete it if this is the
    last of its `readers` to read it (each reader leaves a marker; the one that finds them all removes the file and
    the markers)."""
    path = directory / name
    deadline = clock() + wait_s
    pause = 0.01
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            break
        except FileNotFoundError:
            if clock() >= deadline:
                raise SecretUnavailable(
                    f"local rank {rank} waited {wait_s:g} s for the values local rank 0 reads and leaves in {path}; "
                    "none came (did local rank 0 start, and can it reach Secrets Manager and SSM?)"
                ) from None
            sleep(pause)
            pause = min(pause * 2, 0.5)
    with os.fdopen(fd, encoding="utf-8") as handoff:
        found = os.fstat(handoff.fileno())
        if found.st_uid != os.getuid() or found.st_mode & 0o077:
            raise SecretUnavailable(
                f"{path} must belong to this user with mode 0600; it is {stat.filemode(found.st_mode)}, "
                f"owner {found.st_uid}: not read"
            )
        payload: dict[str, Any] = json.load(handoff)
    _read_by(directory, name, rank, readers)
    return payload


def _read_by(directory: Path, name: str, rank: int, readers: int) -> None:
    with contextlib.suppress(FileExistsError):  # this rank's marker from a read that did not finish
        os.close(os.open(directory / f".{name}.read.{rank}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    markers = list(directory.glob(f".{name}.read.*"))
    if len(markers) < readers:
        return
    (directory / name).unlink(missing_ok=True)
    for marker in markers:
        marker.unlink(missing_ok=True)


def host_values(
    secrets: dict[str, str],
    client: ClientFactory,
    env: Mapping[str, str] | None = None,
    directory: Path | None = None,
    wait_s: float = WAIT_SECONDS,
    parent: int | None = None,
) -> dict[str, str]:
    """The secrets' values, read once per host: by this process if it is alone or the local rank 0 (which then
    hands them, or why they could not be read, to the host's other ranks), else from the local rank 0's file."""
    env = os.environ if env is None else env
    rank, size = local_ranks(env)
    if size == 1 or not secrets:
        return fetch(secrets, client)
    where = handoff_dir(directory)
    name = handoff_name(env, os.getppid() if parent is None else parent)
    if rank > 0:
        payload = receive(where, name, rank, size - 1, wait_s)
        if "error" in payload:
            raise SecretUnavailable(str(payload["error"]))
        return {str(k): str(v) for k, v in dict(payload["values"]).items()}
    try:
        values = fetch(secrets, client)
    except SecretUnavailable as error:
        # where even that cannot be written, the other ranks end at their wait's bound; this rank's reason is the job's
        with contextlib.suppress(OSError):
            publish(where, name, {"error": str(error)})
        raise
    try:
        publish(where, name, {"values": values})
    except OSError as error:
        raise SecretUnavailable(
            f"the values could not be handed to the host's other {size - 1} rank(s) in {where}: {error}"
        ) from None
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


def main(argv: list[str], client: ClientFactory = boto3_client, handoff: Path | None = None) -> int:
    """Read the secrets (once per host), put them into the environment and become the entry point; 1 on failure.
    `handoff`: the directory of the host's hand-off file (tests), else /dev/shm."""
    code_dir = Path(__file__).resolve().parent
    config = json.loads((code_dir / SECRETS_FILE).read_text(encoding="utf-8"))
    try:
        values = host_values(dict(config["secrets"]), client, directory=handoff)
    except SecretUnavailable as error:
        return fail(str(error))
    os.environ.update(values)
    program = command(code_dir, str(config["entry_point"]), argv[1:])
    os.execv(program[0], program)  # noqa: S606 - the job's own entry point, as SageMaker would start it
    return 0  # not reached: execv replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv))
