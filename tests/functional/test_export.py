"""`lustrain export MODEL -o DIR` on moto: MODEL as a model directory, a model.tar.gz, an s3:// model (GZIP or NONE
upload) or a run of the stack, each written as the same Hugging Face directory (transformers loading it is
tests/unit/trainer/test_trainer_export.py's)."""

from __future__ import annotations

import io
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


# A training job writes what it likes under its model prefix (or into its model.tar.gz): a key or member that
# would land outside the folder the model is written to refuses the whole model, by name, before anything is
# written.

MODEL_PREFIX = f"jobs/{JOB}/output/model/"


def upload_model(s3, bucket: str, model_dir: Path) -> None:
    for file in model_dir.iterdir():
        s3.upload_file(str(file), bucket, MODEL_PREFIX + file.name)


def nothing_written(tmp_path: Path, out: Path, outside: Path) -> None:
    assert not out.exists()
    assert not list(outside.iterdir())
    assert not list(tmp_path.glob(".lustrain-export-*"))
    assert not [p for p in tmp_path.rglob("*") if "evil" in p.name]


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    return folder


def test_a_key_whose_rest_is_an_absolute_path_is_refused_and_nothing_written(
    aws, model_dir: Path, tmp_path: Path, outside: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    bucket = aws.artifacts_bucket
    upload_model(s3, bucket, model_dir)
    evil = MODEL_PREFIX + str(outside / "evil.sh")  # .../output/model//tmp/.../outside/evil.sh
    s3.put_object(Bucket=bucket, Key=evil, Body=b"echo owned\n")
    assert [
        k["Key"] for k in s3.list_objects_v2(Bucket=bucket)["Contents"] if k["Key"].endswith("evil.sh")
    ] == [evil]
    out = tmp_path / "hf"

    code = cli.main(["export", f"s3://{bucket}/{MODEL_PREFIX}", "-o", str(out), "--region", REGION])

    err = capsys.readouterr().err
    assert code == 2
    assert f"key {evil!r} is refused, its name is an absolute path" in err
    assert "nothing of the model was written" in err
    nothing_written(tmp_path, out, outside)


@pytest.mark.parametrize(
    "rest",
    ["../../evil", "sub/../../../evil", "..\\..\\evil", "sub//evil", "C:/evil", "c:evil", "."],
)
def test_a_key_that_could_leave_the_folder_is_refused_and_nothing_written(
    aws, model_dir: Path, tmp_path: Path, outside: Path, rest: str, capsys: pytest.CaptureFixture[str]
) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    bucket = aws.artifacts_bucket
    upload_model(s3, bucket, model_dir)
    s3.put_object(Bucket=bucket, Key=MODEL_PREFIX + rest, Body=b"evil")
    out = tmp_path / "hf"

    code = cli.main(["export", f"s3://{bucket}/{MODEL_PREFIX}", "-o", str(out), "--region", REGION])

    err = capsys.readouterr().err
    assert code == 2
    assert f"key {MODEL_PREFIX + rest!r} is refused, " in err
    nothing_written(tmp_path, out, outside)


def evil_tarball(model_dir: Path, path: Path, *extra: tuple[tarfile.TarInfo, bytes | None]) -> Path:
    """The model's files, then the extra members."""
    with tarfile.open(path, "w:gz") as tar:
        for file in model_dir.iterdir():
            tar.add(file, arcname=file.name)
        for info, data in extra:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def extracted_nothing(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The calls of TarFile.extractall: a refused archive makes none (no member is written, not even those
    before the refused one)."""
    calls: list[object] = []
    extractall = tarfile.TarFile.extractall

    def spy(self: tarfile.TarFile, *args: object, **kwargs: object) -> None:
        calls.append(args)
        extractall(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tarfile.TarFile, "extractall", spy)
    return calls


def test_a_model_tar_gz_with_a_member_outside_is_refused_and_nothing_written(
    aws,
    model_dir: Path,
    tmp_path: Path,
    outside: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    bucket = aws.artifacts_bucket
    archive = evil_tarball(model_dir, tmp_path / "upload.tar.gz", (tarfile.TarInfo("../evil"), b"evil"))
    s3.upload_file(str(archive), bucket, f"jobs/{JOB}/output/model.tar.gz")
    calls = extracted_nothing(monkeypatch)
    out = tmp_path / "hf"

    for model in (f"s3://{bucket}/jobs/{JOB}/output/model.tar.gz", str(archive)):
        code = cli.main(["export", model, "-o", str(out), "--region", REGION])

        err = capsys.readouterr().err
        assert code == 2
        assert "archive member '../evil' is refused, its name holds a .. segment" in err
        assert "nothing of the model was written" in err
        assert calls == []
        nothing_written(tmp_path, out, outside)


def test_a_model_tar_gz_with_a_link_or_a_device_is_refused_and_nothing_written(
    model_dir: Path,
    tmp_path: Path,
    outside: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the classic: a symbolic link to a folder outside, then a file written through it
    link = tarfile.TarInfo("sub")
    link.type, link.linkname = tarfile.SYMTYPE, str(outside)
    through = tarfile.TarInfo("sub/evil.sh")
    relative_link = tarfile.TarInfo("alias.pt")  # even one that stays inside: a model holds no links
    relative_link.type, relative_link.linkname = tarfile.SYMTYPE, MODEL_FILE
    hard = tarfile.TarInfo("hard.pt")
    hard.type, hard.linkname = tarfile.LNKTYPE, MODEL_FILE
    device = tarfile.TarInfo("null")
    device.type = tarfile.CHRTYPE
    archive = evil_tarball(
        model_dir,
        tmp_path / "model.tar.gz",
        (link, None),
        (through, b"echo owned\n"),
        (relative_link, None),
        (hard, None),
        (device, None),
    )
    calls = extracted_nothing(monkeypatch)
    out = tmp_path / "hf"

    assert cli.main(["export", str(archive), "-o", str(out)]) == 2

    err = capsys.readouterr().err
    assert f"archive member 'sub' is refused, it is a symbolic link (to {str(outside)!r})" in err
    assert "archive member 'alias.pt' is refused, it is a symbolic link (to 'model.pt')" in err
    assert "archive member 'hard.pt' is refused, it is a hard link (to 'model.pt')" in err
    assert "archive member 'null' is refused, it is a device" in err
    assert calls == []
    nothing_written(tmp_path, out, outside)


def test_a_model_with_folders_and_dot_slash_names_still_exports(
    aws, model_dir: Path, tmp_path: Path, outside: Path
) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    bucket = aws.artifacts_bucket
    upload_model(s3, bucket, model_dir)
    s3.put_object(Bucket=bucket, Key=MODEL_PREFIX + "logs/", Body=b"")  # a "folder" marker
    s3.put_object(Bucket=bucket, Key=MODEL_PREFIX + "logs/train.txt", Body=b"step 1\n")
    out = tmp_path / "prefix"
    assert cli.main(["export", f"s3://{bucket}/{MODEL_PREFIX}", "-o", str(out), "--region", REGION]) == 0
    exported(out, model_dir)
    # as `tar -C /opt/ml/model -czf model.tar.gz .` packs it: ./, ./model.pt, ...
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(model_dir, arcname=".")
    assert cli.main(["export", str(archive), "-o", str(tmp_path / "dot")]) == 0
    exported(tmp_path / "dot", model_dir)
    ordinary = tmp_path / "ordinary"
    ordinary.write_text("")  # the mode a file gets here (0644 under the usual umask), not 0600
    for file in [*out.iterdir(), *(tmp_path / "dot").iterdir()]:
        assert file.stat().st_mode & 0o777 == ordinary.stat().st_mode & 0o777, file
    assert not list(outside.iterdir())
    assert not list(tmp_path.glob(".lustrain-export-*"))
