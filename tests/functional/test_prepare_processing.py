"""Data preparation as SageMaker Processing jobs: the stages' requests pass botocore's model, and a stage's job,
built by aws_requests.prepare_job and started by steps/prepare, runs the trainer package's prepare on the twin (the
job's code shipped as upload_code's bundle, in a private subnet that reaches S3 through its gateway endpoint, as a
role that reads the source and writes the output only) and writes the same shards as a local run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from lustrain_core import aws_requests, limits, prepare_plan
from lustrain_core.config import Settings
from lustrain_core.errors import PrepareFailed
from lustrain_core.images import prepare_image
from lustrain_core.steps import prepare, prepare_role, records

from lustrain.twin import simulator

REGION = "us-east-1"
ACCOUNT = "123456789012"
BUCKET = "lustrain-prep-data"
ARTIFACTS = "lustrain-prep-artifacts"
TRAINER = Path(__file__).resolve().parents[2] / "trainer"
#: about 20 KB in 12 files: 4 KiB parts make several, which the four work instances share
CORPUS = {
    f"corpus/d{i % 3}/f{i:02d}.txt": (
        f"document {i}: the quick brown fox jumps over the lazy dog; naïve café, déjà vu.\n" * (12 + 3 * i)
    ).encode()
    for i in range(12)
}


def _run(**overrides: Any) -> prepare_plan.PrepareRun:
    given: dict[str, Any] = {
        "job_id": "corpus-prep-0123abcd",
        "source": f"s3://{BUCKET}/corpus/",
        "output": f"s3://{BUCKET}/shards/",
        "tokenizer": "bytes",
        "instances": 4,
    }
    given.update(overrides)
    return prepare_plan.PrepareRun(**given)


def _request(
    run: prepare_plan.PrepareRun,
    stage: str,
    settings: Settings,
    role: str = f"arn:aws:iam::{ACCOUNT}:role/lustrain-prepare",
    **network: Any,
) -> dict[str, Any]:
    return aws_requests.prepare_job(
        run,
        stage,
        role_arn=role,
        image_uri=prepare_image(REGION),
        code_s3_uri=f"s3://{ARTIFACTS}/code/{run.job_id}/abc/sourcedir.tar.gz",
        subnet_id=network.get("subnet_id", "subnet-0123456789abcdef0"),
        security_group_ids=network.get("security_group_ids", ["sg-0123456789abcdef0"]),
        tags=[{"Key": "lustrain:job-id", "Value": run.job_id}],
        settings=settings,
    )


@pytest.mark.parametrize("stage", ["plan", "work", "merge"])
def test_every_stage_request_passes_botocores_model(stage: str, settings: Settings) -> None:
    run = _run(job_id="a-very-long-spec-name-that-fills-forty-c-0123abcd", tokenizer="bpe:4096")
    request = _request(run, stage, settings)
    assert limits.problems("sagemaker", "CreateProcessingJob", request) == []
    cluster = request["ProcessingResources"]["ClusterConfig"]
    # the BPE is trained once (plan) and the index merged once: only the work is split
    assert cluster["InstanceCount"] == (4 if stage == "work" else 1)
    assert len(request["ProcessingJobName"]) <= 63 and request["ProcessingJobName"].endswith(f"-prep-{stage}")
    assert request["NetworkConfig"]["VpcConfig"]["Subnets"] == ["subnet-0123456789abcdef0"]
    assert "huggingface-pytorch-training" in request["AppSpecification"]["ImageUri"]
    assert all(len(item) <= 256 for item in request["AppSpecification"]["ContainerEntrypoint"])
    # the container's boto3 calls the stack's region, reached through the subnet's gateway endpoint
    assert request["Environment"] == {"AWS_DEFAULT_REGION": settings.region}


def test_the_stages_follow_the_contract() -> None:
    run = _run(tokenizer="bpe:4096")
    assert run.arguments("plan")[2:] == ["--stage", "plan", "--tokenizer", "bpe:4096"]
    assert run.arguments("work")[2:] == [
        "--stage",
        "work",
        "--worker",
        "auto",
        "--workers",
        "4",
        "--resource-config",
        "/opt/ml/config/resourceconfig.json",
    ]
    assert run.arguments("merge")[2:] == ["--stage", "merge"]
    assert prepare_plan.next_stage(run, []) == "plan"
    assert prepare_plan.next_stage(run, ["plan"]) == "work"
    assert prepare_plan.next_stage(run, ["plan", "work", "merge"]) is None


def test_the_estimate_is_the_preparations_own_plus_each_stages_start() -> None:
    from lustrain_core.trainer.prepare_estimate import estimate_prepare

    one = prepare_plan.plan_of("c", "bpe:4096", 1, "ml.c5.xlarge", 1000, 0.2)
    eight = prepare_plan.plan_of("c", "bpe:4096", 8, "ml.c5.xlarge", 1000, 0.2)
    assert eight["wall_hours"] < one["wall_hours"] / 4  # the work is split, the plan and merge are not
    assert eight["instance_hours"] >= one["instance_hours"]  # and each instance starts, and bills, on its own
    own = estimate_prepare(1000 * 2**30, "bpe:4096", 8, vcpus=4)
    assert eight["wall_hours"] == round((own.seconds + 3 * prepare_plan.STAGE_OVERHEAD_SECONDS) / 3600, 2)
    assert (prepare_plan.vcpus_of("ml.c5.xlarge"), prepare_plan.vcpus_of("ml.m5.4xlarge")) == (4, 16)
    assert prepare_plan.vcpus_of("ml.p4d.24xlarge") is None


def test_a_failed_stage_names_the_job_and_sagemakers_reason() -> None:
    assert prepare.outcome({"ProcessingJobStatus": "Completed"}) == "Completed"
    assert prepare.outcome({"ProcessingJobStatus": "InProgress"}) == "InProgress"
    with pytest.raises(PrepareFailed, match="x-prep-work Failed: AlgorithmError: boom"):
        prepare.outcome(
            {
                "ProcessingJobName": "x-prep-work",
                "ProcessingJobStatus": "Failed",
                "FailureReason": "AlgorithmError: boom",
            }
        )


class _Stages:
    """SageMaker as the stages' jobs see it: each one created is InProgress until the test ends it."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.created: list[str] = []

    def describe_processing_job(self, ProcessingJobName: str) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        if ProcessingJobName not in self.jobs:
            raise ClientError(
                {"Error": {"Code": "ValidationException", "Message": "Requested resource not found."}},
                "DescribeProcessingJob",
            )
        return self.jobs[ProcessingJobName]

    def create_processing_job(self, **request: Any) -> None:
        name = request["ProcessingJobName"]
        self.created.append(name)
        self.jobs[name] = {"ProcessingJobName": name, "ProcessingJobStatus": "InProgress", "request": request}

    def end(self, name: str, status: str, reason: str = "") -> None:
        self.jobs[name].update(ProcessingJobStatus=status, FailureReason=reason)


def test_the_stages_start_one_after_the_other_each_once_and_a_failed_one_ends_the_run(aws: Settings) -> None:
    ddb = boto3.client("dynamodb", region_name=REGION)
    run = _run(tokenizer="bpe:4096")
    records.put_new(ddb, aws.jobs_table, {"job_id": run.job_id})
    sm = _Stages()
    # the run's role: just made on the first look (IAM may not have spread it yet), ready on the later ones
    roles: list[str | None] = [None, "arn:aws:iam::123456789012:role/lustrain/us-east-1/s/prep"]

    def look(done: list[str]) -> dict[str, Any]:
        return prepare.advance(
            run,
            done,
            sagemaker=sm,
            ddb=ddb,
            settings=aws,
            request_of=lambda stage, role: _request(run, stage, aws, role),
            role_of=lambda: roles.pop(0) if len(roles) > 1 else roles[0],
        )

    pending = look([])
    assert (pending["stage"], pending["status"], sm.created) == ("plan", "Pending", [])
    first = look([])
    assert (first["stage"], first["status"], sm.created) == ("plan", "InProgress", [run.job_name("plan")])
    assert look([])["stage"] == "plan" and len(sm.created) == 1  # the work waits for the plan
    sm.end(run.job_name("plan"), "Completed")
    second = look(first["done"])
    assert (second["done"], second["stage"]) == (["plan"], "work")
    assert (
        sm.jobs[run.job_name("work")]["request"]["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 4
    )
    sm.end(run.job_name("work"), "Failed", "AlgorithmError: worker algo-3 exited with code 1")
    with pytest.raises(PrepareFailed, match="prep-work Failed: AlgorithmError: worker algo-3"):
        look(second["done"])
    assert run.job_name("merge") not in sm.created
    ledger = records.get(ddb, aws.jobs_table, run.job_id).resources
    assert [r["id"] for r in ledger] == [run.job_name("plan"), run.job_name("work")]


def test_four_instances_on_the_twin_write_a_local_one_instance_runs_shards_and_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Settings
) -> None:
    """plan (1 instance, trains the BPE once), work (4 instances, each its share of the parts, reading S3 itself),
    merge (1): the trainer package runs in the twin's processing jobs, in a private subnet, as a role that reads
    the code and SRC and writes OUT only; what lands in OUT is what a local --instances 1 run writes."""
    from lustrain_trainer import prepare as trainer_prepare
    from moto import mock_aws

    from lustrain.twin import patches
    from lustrain.twin.prepare_run import run_on_twin

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    patches.install()
    previous = simulator.settings()
    simulator.configure(start_delay_s=0.05, work_root=tmp_path / "jobs")
    run = _run(instances=4, tokenizer="bpe:300", shard_size=4096)
    corpus = [(key.removeprefix("corpus/"), body) for key, body in CORPUS.items()]
    try:
        with mock_aws():
            finished = run_on_twin(run, corpus, settings)
            ledger = records.get(
                boto3.client("dynamodb", region_name=REGION), settings.jobs_table, run.job_id
            )
            logs = boto3.client("logs", region_name=REGION)
            streams = logs.describe_log_streams(
                logGroupName="/aws/sagemaker/ProcessingJobs", logStreamNamePrefix=run.job_name("work")
            )["logStreams"]
    finally:
        simulator.reset()
        simulator.configure(**{f: getattr(previous, f) for f in previous.__dataclass_fields__})

    assert [look["stage"] for look in finished.looks] == ["plan", "work", "merge", None]
    assert finished.jobs["work"]["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 4
    assert len(streams) == 4  # each work instance ran, and logged to a stream of its own
    # each instance's scratch files went to TMPDIR on the job's volume (/opt/ml/processing), not the container's disk
    scratch = [p.relative_to(tmp_path / "jobs").parts[0] for p in (tmp_path / "jobs").rglob("processing/scratch")]
    stages = [next(s for s in ("plan", "work", "merge") if job.startswith(run.job_name(s))) for job in scratch]
    assert sorted(stages) == ["merge", "plan", "work", "work", "work", "work"]
    # the run's own role, then each stage, was in the run's ledger before it was created: teardown finds them
    assert [r["id"] for r in ledger.resources] == [
        prepare_role.role_name(run.job_id),
        *(run.job_name(s) for s in ("plan", "work", "merge")),
    ]

    local_src = tmp_path / "src"
    for key, body in CORPUS.items():
        (local_src / key).parent.mkdir(parents=True, exist_ok=True)
        (local_src / key).write_bytes(body)
    local_run = [
        str(local_src / "corpus"),
        str(tmp_path / "local"),
        "--tokenizer",
        "bpe:300",
        "--shard-size",
        "4096",
    ]
    assert trainer_prepare.main(local_run) == 0
    local = {
        p.relative_to(tmp_path / "local").as_posix(): p.read_bytes()
        for p in (tmp_path / "local").rglob("*")
        if p.is_file()
    }
    written = finished.written
    made = sorted(name for name in local if name.endswith(".bin") or name == "tokenizer.json")
    assert sorted(name for name in written if name.endswith(".bin") or name == "tokenizer.json") == made
    assert (
        len([name for name in made if name.endswith(".bin")]) > 2
    )  # several parts, shared by the two workers
    assert all(written[name] == local[name] for name in made)
    # the index records where the source was read from, which differs (a local path here): compare the rest
    ours, theirs = json.loads(written["index.json"]), json.loads(local["index.json"])
    ours.pop("source", None)
    theirs.pop("source", None)
    assert ours == theirs


def test_a_role_sagemaker_cannot_assume_yet_is_waited_for_while_new_then_refused(aws: Settings) -> None:
    from botocore.exceptions import ClientError

    ddb = boto3.client("dynamodb", region_name=REGION)
    run = _run()
    records.put_new(ddb, aws.jobs_table, {"job_id": run.job_id})
    role = f"arn:aws:iam::{ACCOUNT}:role/lustrain/{REGION}/s/{run.job_id}-prep"

    class NotSpreadYet(_Stages):
        def create_processing_job(self, **request: Any) -> None:
            raise ClientError(
                {
                    "Error": {
                        "Code": "ValidationException",
                        "Message": f"Could not assume role {role}. Please ensure that the role exists and allows "
                        "principal 'sagemaker.amazonaws.com' to assume the role.",
                    }
                },
                "CreateProcessingJob",
            )

    def look(new: bool) -> dict[str, Any]:
        return prepare.advance(
            run,
            [],
            sagemaker=NotSpreadYet(),
            ddb=ddb,
            settings=aws,
            request_of=lambda stage, arn: _request(run, stage, aws, arn),
            role_of=lambda: role,
            role_is_new=lambda: new,
        )

    assert look(new=True) == {"done": [], "stage": "plan", "status": "Pending"}
    with pytest.raises(ClientError, match="Could not assume role"):
        look(new=False)
