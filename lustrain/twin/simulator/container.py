"""The SageMaker training container's contract: /opt/ml, the SM_* environment, the config files, the command.

What a script-mode PyTorch entry point sees on SageMaker (the SageMaker training toolkit's environment), laid out
under a work directory of this machine.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lustrain_core import images

from lustrain.twin.simulator.job import FAILURE_REASON_MAX, JobFailure, SimulatedJob
from lustrain.twin.training_plans import capacity_environment

#: The current host's name, as SageMaker names the first instance of a job.
CURRENT_HOST = "algo-1"


#: The container's /opt/ml, which the twin lays out under each job's work directory (Layout.root).
OPT_ML = "/opt/ml"
#: TensorBoardOutputConfig's LocalPath where the request gives none (SageMaker API Reference)
TENSORBOARD_DEFAULT_PATH = "/opt/ml/output/tensorboard"


def in_layout(layout: Layout, value: str) -> str:
    """A path in the container (under /opt/ml) as the twin's path of it; any other value as it is. The request's
    settings name container paths (TensorBoardOutputConfig's LocalPath, which the job's Environment repeats)."""
    if value == OPT_ML or value.startswith(OPT_ML + "/"):
        return str(layout.root / value[len(OPT_ML) :].lstrip("/"))
    return value


@dataclass(frozen=True)
class Layout:
    """A job's /opt/ml, under its work directory."""

    root: Path
    code: Path = field(init=False)
    input: Path = field(init=False)
    model: Path = field(init=False)
    output: Path = field(init=False)
    output_data: Path = field(init=False)
    checkpoints: Path = field(init=False)
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        for name, sub in (
            ("code", "code"),
            ("input", "input"),
            ("model", "model"),
            ("output", "output"),
            ("output_data", "output/data"),
            ("checkpoints", "checkpoints"),
        ):
            object.__setattr__(self, name, self.root / sub)
        object.__setattr__(self, "log", self.root / f"{CURRENT_HOST}.log")

    @property
    def config(self) -> Path:
        return self.input / "config"

    def channel(self, name: str) -> Path:
        return self.input / "data" / name

    def create(self) -> None:
        for path in (
            self.code,
            self.config,
            self.input / "data",
            self.model,
            self.output_data,
            self.checkpoints,
        ):
            path.mkdir(parents=True, exist_ok=True)


def decoded_hyperparameters(raw: dict[str, str]) -> dict[str, Any]:
    """SageMaker script mode sends every value JSON-encoded ('"s3://b/k"', '3'); plain strings are kept."""
    decoded: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            decoded[key] = json.loads(value)
        except (TypeError, ValueError):
            decoded[key] = value
    return decoded


def user_hyperparameters(hps: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in hps.items() if not k.startswith("sagemaker_")}


def hyperparameter_args(hps: dict[str, Any]) -> list[str]:
    """The entry point's arguments, `--key value` in key order, as the SageMaker training toolkit builds them."""
    args: list[str] = []
    for key, value in sorted(user_hyperparameters(hps).items()):
        shown = json.dumps(value) if isinstance(value, dict | list) else str(value)
        args += [f"--{key}", shown]
    return args


def training_env(
    job: SimulatedJob,
    layout: Layout,
    channels: dict[str, Path],
    hps: dict[str, Any],
    base: dict[str, str],
) -> dict[str, str]:
    """The entry point's environment: `base` (this machine's), the request's Environment, SageMaker's SM_*
    variables and the execution role's credentials (which SageMaker serves the container)."""
    hosts = [f"algo-{i}" for i in range(1, job.instance_count + 1)]
    user_hps = user_hyperparameters(hps)
    program = str(hps.get("sagemaker_program", ""))
    resource_config = {
        "current_host": CURRENT_HOST,
        "current_instance_type": job.instance_type,
        "hosts": hosts,
        "network_interface_name": "eth0",
    }
    input_data_config = {
        c["ChannelName"]: {k: v for k, v in c.items() if k not in ("ChannelName", "DataSource")}
        for c in job.request.get("InputDataConfig") or []
    }
    training_env = {
        "job_name": job.name,
        "current_host": CURRENT_HOST,
        "current_instance_type": job.instance_type,
        "hosts": hosts,
        "num_gpus": 0,
        "num_cpus": os.cpu_count() or 1,
        "hyperparameters": user_hps,
        "additional_framework_parameters": {k: v for k, v in hps.items() if k.startswith("sagemaker_")},
        "channel_input_dirs": {name: str(path) for name, path in channels.items()},
        "input_dir": str(layout.input),
        "input_config_dir": str(layout.config),
        "input_data_config": input_data_config,
        "model_dir": str(layout.model),
        "output_dir": str(layout.output),
        "output_data_dir": str(layout.output_data),
        "module_dir": str(hps.get("sagemaker_submit_directory", "")),
        "module_name": program.removesuffix(".py"),
        "user_entry_point": program,
        "resource_config": resource_config,
        "network_interface_name": "eth0",
        "log_level": 20,
    }
    env = dict(base)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        env.pop(name, None)
    env.update(job.credentials)
    env.update({str(k): in_layout(layout, str(v)) for k, v in (job.request.get("Environment") or {}).items()})
    env.update(
        {
            "SM_MODEL_DIR": str(layout.model),
            "SM_OUTPUT_DIR": str(layout.output),
            "SM_OUTPUT_DATA_DIR": str(layout.output_data),
            "SM_INPUT_DIR": str(layout.input),
            "SM_INPUT_CONFIG_DIR": str(layout.config),
            "SM_CHANNELS": json.dumps(sorted(channels)),
            "SM_HPS": json.dumps(user_hps),
            "SM_HOSTS": json.dumps(hosts),
            "SM_CURRENT_HOST": CURRENT_HOST,
            "SM_CURRENT_INSTANCE_TYPE": job.instance_type,
            "SM_NUM_GPUS": "0",
            "SM_NUM_CPUS": str(os.cpu_count() or 1),
            "SM_NETWORK_INTERFACE_NAME": "eth0",
            "SM_USER_ENTRY_POINT": program,
            "SM_MODULE_NAME": program.removesuffix(".py"),
            "SM_MODULE_DIR": str(hps.get("sagemaker_submit_directory", "")),
            "SM_USER_ARGS": json.dumps(hyperparameter_args(hps)),
            "SM_RESOURCE_CONFIG": json.dumps(resource_config),
            "SM_INPUT_DATA_CONFIG": json.dumps(input_data_config),
            "SM_TRAINING_ENV": json.dumps(training_env),
            "SM_CHECKPOINT_DIR": str(layout.checkpoints),
            "TRAINING_JOB_NAME": job.name,
            "TRAINING_JOB_ARN": job.arn,
            # Lines must reach the log (and the CLI) as they are printed, and two workers share two cores.
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(layout.code), env.get("PYTHONPATH", "")])),
        }
    )
    # a job on a training plan learns when its capacity ends, as SageMaker tells it
    env.update(capacity_environment(job.request))
    for name, path in channels.items():
        env[f"SM_CHANNEL_{name.upper()}"] = str(path)
    for key, value in user_hps.items():
        env[f"SM_HP_{key.upper()}"] = json.dumps(value) if isinstance(value, dict | list) else str(value)
    return env


def write_configs(job: SimulatedJob, layout: Layout, hps: dict[str, Any]) -> None:
    """/opt/ml/input/config/*.json, which some trainers read instead of the SM_* variables."""
    hosts = [f"algo-{i}" for i in range(1, job.instance_count + 1)]
    files = {
        "hyperparameters.json": {k: json.dumps(v) for k, v in user_hyperparameters(hps).items()},
        "resourceconfig.json": {"current_host": CURRENT_HOST, "hosts": hosts},
        "inputdataconfig.json": {
            c["ChannelName"]: {k: v for k, v in c.items() if k not in ("ChannelName", "DataSource")}
            for c in job.request.get("InputDataConfig") or []
        },
    }
    for name, content in files.items():
        (layout.config / name).write_text(json.dumps(content, indent=2), encoding="utf-8")


def algorithm_error(layout: Layout, rc: int, stderr_tail: list[str], command: list[str]) -> str:
    """FailureReason as the SageMaker training toolkit reports a failed script (or the script's failure file)."""
    failure_file = layout.output / "failure"
    if failure_file.is_file() and failure_file.read_text(encoding="utf-8").strip():
        return f"AlgorithmError: {failure_file.read_text(encoding='utf-8').strip()}"
    shown_cmd = " ".join(command)
    head = f'AlgorithmError: ExecuteUserScriptError:\nExitCode {rc}\nErrorMessage "'
    tail = f'"\nCommand "{shown_cmd}", exit code: {rc}'
    room = FAILURE_REASON_MAX - len(head) - len(tail)
    message = "\n".join(stderr_tail)
    if len(message) > room:
        message = message[-max(room, 0) :]
    return f"{head}{message}{tail}"


#: torchrun kills its workers this long after it forwards a SIGTERM, in every torch before 2.12, which is the first
#: to read TORCH_ELASTIC_SHUTDOWN_TIMEOUT (torch/distributed/elastic/agent/server/api.py)
TORCHRUN_FIXED_GRACE_S = 30
TORCHRUN_GRACE_VARIABLE = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
TORCHRUN_GRACE_READ_FROM = (2, 12)


def framework_version(job: SimulatedJob) -> str | None:
    """The PyTorch version of the job's image when it is one of SageMaker's PyTorch training images, else None."""
    image = str((job.request.get("AlgorithmSpecification") or {}).get("TrainingImage") or "")
    return images.pytorch_training_version(image)


def sigterm_reaches_entry_point(job: SimulatedJob) -> bool:
    """Whether a stop's SIGTERM reaches the job's program. SageMaker signals the container's first process. In its
    PyTorch training images that is bash running start_with_right_hostname.sh, which starts the training toolkit
    (`train`) as a child and passes no signal on; the toolkit installs no handler either (aws/sagemaker-training-
    toolkit issues #125 and #173, aws/deep-learning-containers #632): the entry point never hears of the stop and
    is killed at the end of the grace. A ContainerEntrypoint replaces that first process, and any other image's
    first process is the image's own: those get the signal."""
    return replaces_entry_point(job) or framework_version(job) is None


def replaces_entry_point(job: SimulatedJob) -> bool:
    """Whether the job gives a ContainerEntrypoint, which replaces the image's own (the script-mode launcher)."""
    return bool((job.request.get("AlgorithmSpecification") or {}).get("ContainerEntrypoint"))


def image_environment(job: SimulatedJob) -> dict[str, str]:
    """What the image's own torch does that this machine's (newer) torch would not: before 2.12 torchrun's grace
    after a forwarded SIGTERM is 30 s whatever TORCH_ELASTIC_SHUTDOWN_TIMEOUT says."""
    version = framework_version(job)
    if version is None:
        return {}
    major_minor = tuple(int(part) for part in version.split(".")[:2])
    if major_minor < TORCHRUN_GRACE_READ_FROM:
        return {TORCHRUN_GRACE_VARIABLE: str(TORCHRUN_FIXED_GRACE_S)}
    return {}


def entrypoint(job: SimulatedJob, layout: Layout) -> list[str] | None:
    """AlgorithmSpecification.ContainerEntrypoint and ContainerArguments, which replace the image's own entry
    point (the script-mode launcher), or None. The container's /opt/ml is the job's layout here, so an item under
    /opt/ml/ names its place in the layout."""
    spec = job.request.get("AlgorithmSpecification") or {}
    given = spec.get("ContainerEntrypoint")
    if not given:
        return None
    items = [*given, *(spec.get("ContainerArguments") or [])]
    return [
        str(layout.root / item.removeprefix("/opt/ml/")) if item.startswith("/opt/ml/") else item
        for item in items
    ]


def command(job: SimulatedJob, code_dir: Path, hps: dict[str, Any], max_processes: int) -> list[str]:
    """The entry point's command line, as SageMaker's PyTorch container launches it (torchrun when distributed)."""
    program = str(hps["sagemaker_program"])
    if not (code_dir / program).is_file():
        raise JobFailure(
            f'AlgorithmError: ExecuteUserScriptError:\nExitCode 2\nErrorMessage "No such file: {program} '
            f'is not in the source directory {hps["sagemaker_submit_directory"]}"\nCommand "{program}"'
        )
    args = hyperparameter_args(hps)
    if str(hps.get("sagemaker_torch_distributed_enabled", "false")).lower() == "true":
        processes = min(job.instance_count, max_processes)
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes",
            "1",
            "--nproc_per_node",
            str(processes),
            program,
            *args,
        ]
    if program.endswith(".sh"):
        return ["/bin/sh", program, *args]
    return [sys.executable, program, *args]
