"""`lustrain submit`: the CLI's way to start a run on a deployed stack (here: buckets on moto)."""

from __future__ import annotations

import boto3
import pytest
import yaml
from moto import mock_aws

from lustrain.cli import main

SPEC = """name: gpt-small
code: {source: trainer/}
data: {s3_uri: s3://my-data/tokens/, size_gib: 10}
output: {s3_uri: s3://my-results/gpt/}
"""


@pytest.fixture
def buckets():
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        for name in ("jobs", "artifacts"):
            s3.create_bucket(Bucket=name)
        yield s3


def test_a_local_code_dir_is_uploaded_and_the_dropped_spec_points_at_it(buckets, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path.parent)
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "train.py").write_text("print('hi')\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)

    assert main(["submit", str(spec), "--jobs-bucket", "jobs", "--artifacts-bucket", "artifacts"]) == 0

    (dropped,) = buckets.list_objects_v2(Bucket="jobs", Prefix="jobs/")["Contents"]
    assert dropped["Key"].startswith("jobs/gpt-small-") and dropped["Key"].endswith(".yaml")
    doc = yaml.safe_load(buckets.get_object(Bucket="jobs", Key=dropped["Key"])["Body"].read())
    assert doc["code"]["source"].startswith("s3://artifacts/uploads/gpt-small/")
    prefix = doc["code"]["source"].removeprefix("s3://artifacts/")
    keys = [o["Key"] for o in buckets.list_objects_v2(Bucket="artifacts", Prefix=prefix)["Contents"]]
    assert keys == [prefix + "train.py"]
    assert "spec dropped at s3://jobs/jobs/gpt-small-" in capsys.readouterr().out


def test_code_source_is_read_from_the_spec_files_directory_not_the_working_one(buckets, tmp_path, capsys, monkeypatch):
    """`code.source: ../code/` in specs/spec.yaml is <dir>/code wherever the command runs; a trainer/ in the working
    directory is not the spec's when the spec's directory has none."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('from the spec')\n")
    (tmp_path / "specs").mkdir()
    (tmp_path / "elsewhere" / "trainer").mkdir(parents=True)
    (tmp_path / "elsewhere" / "trainer" / "train.py").write_text("print('from the working directory')\n")
    monkeypatch.chdir(tmp_path / "elsewhere")
    spec = tmp_path / "specs" / "spec.yaml"

    spec.write_text(SPEC)  # code.source: trainer/, which specs/ has not
    assert main(["submit", str(spec), "--jobs-bucket", "jobs", "--artifacts-bucket", "artifacts"]) == 2
    err = capsys.readouterr().err
    assert "code.source" in err and str(tmp_path / "specs" / "trainer") in err and "spec file's directory" in err
    assert buckets.list_objects_v2(Bucket="jobs").get("KeyCount", 0) == 0

    spec.write_text(SPEC.replace("trainer/", "../code/"))
    assert main(["submit", str(spec), "--jobs-bucket", "jobs", "--artifacts-bucket", "artifacts"]) == 0
    (dropped,) = buckets.list_objects_v2(Bucket="jobs", Prefix="jobs/")["Contents"]
    doc = yaml.safe_load(buckets.get_object(Bucket="jobs", Key=dropped["Key"])["Body"].read())
    bucket, _, key = doc["code"]["source"].removeprefix("s3://").partition("/")
    body = buckets.get_object(Bucket=bucket, Key=key + "train.py")["Body"].read()
    assert body == b"print('from the spec')\n"


def test_an_invalid_spec_drops_nothing_and_exits_2(buckets, tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("gpt-small", "Not_Valid"))

    assert main(["submit", str(spec), "--jobs-bucket", "jobs", "--artifacts-bucket", "artifacts"]) == 2

    assert "name" in capsys.readouterr().err
    assert buckets.list_objects_v2(Bucket="jobs").get("KeyCount", 0) == 0
    assert buckets.list_objects_v2(Bucket="artifacts").get("KeyCount", 0) == 0


def test_a_missing_bucket_is_an_aws_failure_exit_1(buckets, tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("trainer/", "s3://code/x/"))

    assert main(["submit", str(spec), "--jobs-bucket", "nope", "--artifacts-bucket", "artifacts"]) == 1
    assert "NoSuchBucket" in capsys.readouterr().err


def test_a_stack_that_is_not_lustrains_is_a_usage_error(buckets, tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    cfn = boto3.client("cloudformation", region_name="us-east-1")
    cfn.create_stack(StackName="other", TemplateBody='{"Resources": {"B": {"Type": "AWS::S3::Bucket"}}}')

    assert main(["submit", str(spec), "--stack", "other"]) == 2
    assert "not a lustrain stack" in capsys.readouterr().err


def test_a_prepare_spec_is_dropped_with_the_trainer_package_uploaded_as_its_code(buckets, capsys):
    assert main(["submit", "examples/prepare.yaml", "--jobs-bucket", "jobs", "--artifacts-bucket", "artifacts"]) == 0

    (dropped,) = buckets.list_objects_v2(Bucket="jobs", Prefix="jobs/")["Contents"]
    doc = yaml.safe_load(buckets.get_object(Bucket="jobs", Key=dropped["Key"])["Body"].read())
    assert (doc["kind"], doc["name"], doc["instances"]) == ("prepare", "corpus-bpe", 8)
    assert doc["code"].startswith("s3://artifacts/uploads/lustrain-trainer/")
    prefix = doc["code"].removeprefix("s3://artifacts/")
    keys = {o["Key"].removeprefix(prefix) for o in buckets.list_objects_v2(Bucket="artifacts", Prefix=prefix)["Contents"]}
    # the package at the prefix's root, as the processing jobs' entry point imports it
    assert {"lustrain_trainer/__init__.py", "lustrain_trainer/prepare.py"} <= keys
    assert not any("__pycache__" in key for key in keys)
    said = capsys.readouterr().out
    assert f"code uploaded to {doc['code']}" in said and "estimated at most $" in said


def test_a_run_for_a_team_is_dropped_in_its_teams_folder(buckets, tmp_path, capsys):
    """On a stack of several teams a run's team is the folder its spec lies in (jobs/<team>/): --team puts it there;
    a name no team may have is refused before anything is uploaded."""
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "train.py").write_text("print('hi')\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("s3://my-results/gpt/", "s3://my-results/vision/"))

    assert main(["submit", str(spec), "--jobs-bucket", "jobs", "--artifacts-bucket", "artifacts", "--team", "a/b"]) == 2
    assert "--team" in capsys.readouterr().err
    assert buckets.list_objects_v2(Bucket="artifacts").get("KeyCount", 0) == 0

    assert main(["submit", str(spec), "--jobs-bucket", "jobs", "--artifacts-bucket", "artifacts", "--team", "vision"]) == 0
    (dropped,) = buckets.list_objects_v2(Bucket="jobs", Prefix="jobs/")["Contents"]
    assert dropped["Key"].startswith("jobs/vision/gpt-small-")
