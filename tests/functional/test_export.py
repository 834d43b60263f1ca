"""`lustrain export MODEL -o DIR` on moto: MODEL as a model directory, a model.tar.gz, an s3:// model (GZIP or NONE
upload) or a run of the stack, each written as the same Hugging Face directory (transformers loading it is
tests/unit/trainer/test_trainer_export.py's)."""

from __future__ import annotations

import json
import tarfile
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest
import torch
from infra_support import REGION
from lustrain_core.steps import records
from lustrain_trainer import generate
from lustrain_trainer.model import CONFIG_FILE, MODEL_FILE, LlamaConfig, build
from lustrain_trainer.tokenizer import TOKENIZER_INFO

from lustrain import cli, operate

CONFIG = LlamaConfig(n_layer=1, n_head=2, n_kv_head=1, n_embd=16, ffn_hidden=32, seq_len=8)
JOB = "tiny-llama-1a2b3c4d-1"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    root = tmp_path / "model"
    root.mkdir()
    torch.manual_seed(0)
    torch.save(build(CONFIG).state_dict(), root / MODEL_FILE)
    (root / CONFIG_FILE).write_text(json.dumps({"model": CONFIG.to_dict(), "tokenizer": TOKENIZER_INFO}))
    return root


def tarball(model_dir: Path, path: Path) -> Path:
    # as SageMaker packs /opt/ml/model: its files at the archive's root
    with tarfile.open(path, "w:gz") as tar:
        for file in model_dir.iterdir():
            tar.add(file, arcname=file.name)
    return path


def exported(out: Path, model_dir: Path) -> None:
    """out is the Hugging Face directory of model_dir: a Llama config, the weights, the tokenizer."""
    hf = json.loads((out / "config.json").read_text())
    assert (hf["model_type"], hf["num_key_value_heads"], hf["hidden_size"]) == ("llama", 1, 16)
    assert {"model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    ours = generate.load_model(model_dir)
    idx = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(generate.load_model(out)(idx), ours(idx))


def test_a_model_directory_and_a_model_tar_gz_export_alike(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["export", str(model_dir), "-o", str(tmp_path / "a")]) == 0
    exported(tmp_path / "a", model_dir)
    assert "load it: transformers.AutoModelForCausalLM.from_pretrained(" in capsys.readouterr().out
    archive = tarball(model_dir, tmp_path / "model.tar.gz")
    assert cli.main(["export", str(archive), "-o", str(tmp_path / "b")]) == 0
    exported(tmp_path / "b", model_dir)
    assert not list(tmp_path.glob(".lustrain-export-*"))  # the extracted copy is gone


def test_an_s3_model_exports_from_its_tar_gz_or_its_prefix(aws, model_dir: Path, tmp_path: Path) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    bucket = aws.artifacts_bucket
    s3.upload_file(
        str(tarball(model_dir, tmp_path / "model.tar.gz")), bucket, f"jobs/{JOB}/output/model.tar.gz"
    )
    for file in model_dir.iterdir():  # CompressionType NONE: the model's files under output/model/
        s3.upload_file(str(file), bucket, f"jobs/{JOB}/output/model/{file.name}")

    args = ["--region", REGION]
    assert (
        cli.main(
            ["export", f"s3://{bucket}/jobs/{JOB}/output/model.tar.gz", "-o", str(tmp_path / "gz"), *args]
        )
        == 0
    )
    exported(tmp_path / "gz", model_dir)
    assert (
        cli.main(["export", f"s3://{bucket}/jobs/{JOB}/output/model/", "-o", str(tmp_path / "none"), *args])
        == 0
    )
    exported(tmp_path / "none", model_dir)
    assert cli.main(["export", f"s3://{bucket}/jobs/nothing/", "-o", str(tmp_path / "no"), *args]) == 2


def test_a_run_exports_the_model_of_its_newest_completed_attempt(
    aws, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    uri = f"s3://{aws.artifacts_bucket}/jobs/{JOB}/output/model.tar.gz"
    s3.upload_file(
        str(tarball(model_dir, tmp_path / "model.tar.gz")),
        aws.artifacts_bucket,
        f"jobs/{JOB}/output/model.tar.gz",
    )
    records.put_new(
        boto3.client("dynamodb", region_name=REGION),
        aws.jobs_table,
        {
            "job_id": "tiny-llama-1a2b3c4d",
            "execution": "exec-1",
            "status": "SUCCEEDED",
            "training_attempts": 2,
            "created_at": datetime(2026, 6, 2, tzinfo=UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "spec": {"name": "tiny-llama"},
            "resources": [],
        },
    )
    stack = operate.Stack(
        "lustrain",
        "arn:aws:states:us-east-1:123456789012:stateMachine:m",
        aws.jobs_table,
        "jobs",
        aws.artifacts_bucket,
        boto3.Session(region_name=REGION),
    )
    monkeypatch.setattr(cli, "_stack", lambda args: stack)
    attempts = [
        {
            "TrainingJobName": "tiny-llama-1a2b3c4d-1",
            "TrainingJobStatus": "Completed",
            "ModelArtifacts": {"S3ModelArtifacts": uri},
        },
        {"TrainingJobName": "tiny-llama-1a2b3c4d-2", "TrainingJobStatus": "Failed"},
    ]
    monkeypatch.setattr(operate, "training_jobs", lambda stack, record: attempts)

    assert cli.main(["export", "tiny-llama", "-o", str(tmp_path / "hf"), "--region", REGION]) == 0
    exported(tmp_path / "hf", model_dir)

    attempts[0]["TrainingJobStatus"] = "Stopped"
    assert cli.main(["export", "tiny-llama-1a2b3c4d", "-o", str(tmp_path / "none"), "--region", REGION]) == 2
    assert (
        "run tiny-llama-1a2b3c4d has no completed training job with a model (its attempts: "
        "tiny-llama-1a2b3c4d-1 Stopped, tiny-llama-1a2b3c4d-2 Failed)"
    ) in capsys.readouterr().err
