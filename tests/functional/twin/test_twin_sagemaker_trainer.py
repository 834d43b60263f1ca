"""The project's own trainer (trainer/), shipped as start_training ships it, run by the twin's SageMaker.

This is the end of the local promise: sourcedir.tar.gz from trainer/, token shards in S3, a script-mode
CreateTrainingJob under torchrun with two workers, and a Completed job whose model, metrics and checkpoints
land where SageMaker puts them.
"""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import boto3
import pytest

from lustrain.twin import simulator
from lustrain.twin.simulator import launcher

REGION = "us-east-1"
ACCOUNT = "123456789012"
BUCKET = "lustrain-trainer-test"
TRAINER = Path(__file__).resolve().parents[3] / "trainer"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (TRAINER / "train.py").is_file(), reason="trainer/train.py is not written yet"),
]


def sourcedir() -> bytes:
    """Every file of trainer/ (train.py, the lustrain_trainer package and its data files), as the code upload packs
    them."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(TRAINER.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.add(path, arcname=path.relative_to(TRAINER).as_posix())
    return buffer.getvalue()


def shards(tmp_path: Path) -> dict[str, bytes]:
    from lustrain_trainer import prepare

    text = tmp_path / "text"
    text.mkdir()
    for i in range(20):
        (text / f"doc{i}.txt").write_text(f"document {i}: the quick brown fox jumps over the lazy dog. " * 40)
    out = tmp_path / "shards"
    assert prepare.main([str(text), str(out), "--val-fraction", "0.1"]) == 0
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def untar(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}  # type: ignore[union-attr]


@pytest.fixture
def twin_s3(aws: Any, tmp_path: Path) -> Any:
    previous = simulator.settings()
    simulator.configure(start_delay_s=0.05, stop_grace_s=10.0, work_root=tmp_path / "jobs")
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="code/sourcedir.tar.gz", Body=sourcedir())
    for key, body in shards(tmp_path).items():
        s3.put_object(Bucket=BUCKET, Key=f"shards/{key}", Body=body)
    yield s3
    simulator.reset()
    simulator.configure(**dataclasses.asdict(previous))


def test_the_real_trainer_completes_under_torchrun_with_model_metrics_and_checkpoints(twin_s3: Any) -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    hyperparameters = {
        "preset": "tiny",
        "max_steps": 4,
        "log_interval": 1,
        "eval_interval": 0,
        "checkpoint_interval": 2,
        "batch_size": 4,
        "seq_len": 32,
        "warmup_steps": 0,
    }
    forked_before = launcher.forked_count()
    sm.create_training_job(
        TrainingJobName="real-trainer",
        HyperParameters={
            "sagemaker_program": json.dumps("train.py"),
            "sagemaker_submit_directory": json.dumps(f"s3://{BUCKET}/code/sourcedir.tar.gz"),
            "sagemaker_region": json.dumps(REGION),
            "sagemaker_torch_distributed_enabled": json.dumps("true"),
            **{k: json.dumps(v) for k, v in hyperparameters.items()},
        },
        AlgorithmSpecification={
            "TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8-cpu-py312",
            "TrainingInputMode": "File",
            "MetricDefinitions": json.loads((TRAINER / "metric_definitions.json").read_text()),
        },
        RoleArn=f"arn:aws:iam::{ACCOUNT}:role/lustrain-test-sagemaker",
        InputDataConfig=[
            {
                "ChannelName": "training",
                "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": f"s3://{BUCKET}/shards/"}},
            }
        ],
        OutputDataConfig={"S3OutputPath": f"s3://{BUCKET}/results"},
        ResourceConfig={"InstanceType": "ml.m5.xlarge", "InstanceCount": 2, "VolumeSizeInGB": 30},
        StoppingCondition={"MaxRuntimeInSeconds": 600},
        CheckpointConfig={"S3Uri": f"s3://{BUCKET}/checkpoints/real-trainer/"},
    )
    simulator.wait_all(timeout=300)

    done = sm.describe_training_job(TrainingJobName="real-trainer")
    log = next(j for j in simulator.jobs() if j.name == "real-trainer").log_path
    assert done["TrainingJobStatus"] == "Completed", (
        done.get("FailureReason"),
        log and log.read_text()[-3000:],
    )
    # torchrun was forked from the twin's fork server, which had imported torch (its workers are its own)
    assert launcher.forked_count() == forked_before + 1
    metrics = {m["MetricName"]: m["Value"] for m in done["FinalMetricDataList"]}
    assert metrics["train_loss"] > 0
    assert metrics["tokens_per_s"] > 0
    model = untar(
        twin_s3.get_object(Bucket=BUCKET, Key="results/real-trainer/output/model.tar.gz")["Body"].read()
    )
    assert model, "the trainer wrote nothing to SM_MODEL_DIR"
    checkpoints = twin_s3.list_objects_v2(Bucket=BUCKET, Prefix="checkpoints/real-trainer/").get(
        "Contents", []
    )
    assert checkpoints, "no checkpoint reached CheckpointConfig.S3Uri"
