"""register_job on moto: a spec dropped into S3 or given inline becomes one job record, once."""

from __future__ import annotations

import boto3
import pytest
import yaml
from infra_support import REGION, invoke, job_record, seed_data, spec
from lustrain_core.errors import SpecForbidden, SpecInvalid

JOBS_BUCKET = "lustrain-test-jobs"


def drop(spec_doc: dict, key: str = "jobs/tiny.yaml") -> dict:
    """Put a spec into the jobs bucket; the "Object Created" event S3 sends to EventBridge for it."""
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=JOBS_BUCKET)
    s3.put_bucket_versioning(Bucket=JOBS_BUCKET, VersioningConfiguration={"Status": "Enabled"})
    put = s3.put_object(Bucket=JOBS_BUCKET, Key=key, Body=yaml.safe_dump(spec_doc).encode())
    return {
        "version": "0",
        "id": "0b1c9a62-6f4e-4d36-9d8e-0a9f0e7a51c3",
        "detail-type": "Object Created",
        "source": "aws.s3",
        "account": "123456789012",
        "time": "2026-11-20T09:14:07Z",
        "region": REGION,
        "resources": [f"arn:aws:s3:::{JOBS_BUCKET}"],
        "detail": {
            "version": "0",
            "bucket": {"name": JOBS_BUCKET},
            "object": {
                "key": key,
                "size": 300,
                "etag": put["ETag"].strip('"'),
                "version-id": put["VersionId"],
                "sequencer": "00617F08299329D189",
            },
            "request-id": "N4N7GDK58NMKJ12R",
            "requester": "123456789012",
            "reason": "PutObject",
        },
    }


def records_in(table: str) -> list[dict]:
    return boto3.client("dynamodb", region_name=REGION).scan(TableName=table)["Items"]


def test_a_dropped_spec_becomes_a_recorded_job(aws):
    seed_data()
    event = drop(spec(data={"size_gib": 5}))
    job = invoke("register_job", {"execution": "drop-1", "input": event})
    etag = event["detail"]["object"]["etag"]
    from lustrain_core.steps.job import job_id_for

    assert job["job_id"] == job_id_for("tiny", f"s3://{JOBS_BUCKET}/jobs/tiny.yaml#{etag}")
    assert job["duplicate"] is False
    assert job["spec"]["compute"]["instance_count"] == 2
    assert job["plan"]["network"]["ips_needed"] > 12
    assert job["source"]["uri"] == f"s3://{JOBS_BUCKET}/jobs/tiny.yaml"
    record = job_record(aws.jobs_table, job["job_id"])
    assert record["status"] == "RUNNING"
    assert record["execution"] == "drop-1"
    assert record["resources"] == []
    assert record["plan"] == job["plan"]


def test_a_run_is_found_by_its_execution_and_a_direct_invoke_records_none(aws):
    """The jobs table indexes the execution name (on_execution_end finds a stopped run by it); DynamoDB refuses an
    empty string as an index key, so a direct invoke, which has no execution, records no execution at all."""
    from lustrain_core import clients
    from lustrain_core.steps import records

    seed_data()
    by_execution = invoke("register_job", {"execution": "drop-7", "input": drop(spec(data={"size_gib": 5}))})
    direct = invoke("register_job", drop(spec(name="direct", data={"size_gib": 5})))
    ddb = clients.client("dynamodb")
    assert records.find_by_execution(ddb, aws.jobs_table, "drop-7").job_id == by_execution["job_id"]
    assert "execution" not in job_record(aws.jobs_table, direct["job_id"])
    assert records.find_by_execution(ddb, aws.jobs_table, "drop-8") is None


def test_a_duplicated_s3_event_ends_as_a_duplicate_and_starts_nothing(aws):
    seed_data()
    event = drop(spec())
    first = invoke("register_job", {"execution": "drop-1", "input": event})
    again = invoke("register_job", {"execution": "drop-2", "input": event})
    assert again["duplicate"] is True
    assert again["job_id"] == first["job_id"]
    assert again["duplicate_of"] == "drop-1"
    assert "spec" not in again
    assert len(records_in(aws.jobs_table)) == 1
    assert job_record(aws.jobs_table, first["job_id"])["execution"] == "drop-1"


def test_a_retried_register_in_the_same_execution_carries_on(aws):
    seed_data()
    event = drop(spec())
    first = invoke("register_job", {"execution": "drop-1", "input": event})
    retried = invoke("register_job", {"execution": "drop-1", "input": event})
    assert retried["duplicate"] is False
    assert (retried["job_id"], retried["started_at"]) == (first["job_id"], first["started_at"])


def test_a_new_version_of_the_same_key_is_a_new_job(aws):
    seed_data()
    first = invoke("register_job", {"execution": "a", "input": drop(spec())})
    second = invoke("register_job", {"execution": "b", "input": drop(spec(compute={"instance_count": 1}))})
    assert first["job_id"] != second["job_id"]
    assert second["duplicate"] is False


def test_an_inline_spec_and_a_spec_s3_uri_start_a_job_each(aws):
    seed_data()
    inline = invoke("register_job", {"execution": "console-1", "input": {"spec": spec()}})
    drop(spec(name="tiny-b"), key="cli/tiny-b.yaml")
    by_uri = invoke(
        "register_job",
        {"execution": "cli-7", "input": {"spec_s3_uri": f"s3://{JOBS_BUCKET}/cli/tiny-b.yaml"}},
    )
    assert inline["source"]["kind"] == "inline" and inline["job_id"].startswith("tiny-")
    assert by_uri["source"]["kind"] == "s3-uri" and by_uri["job_id"].startswith("tiny-b-")
    assert len(records_in(aws.jobs_table)) == 2


def test_the_data_is_measured_in_s3_when_size_gib_is_absent(aws):
    files = {f"part-{i}.txt": b"x" * 1000 for i in range(10)}
    files["images/cat.jpg"] = b"j" * 5000
    seed_data(files=files)
    boto3.client("s3", region_name=REGION).put_object(
        Bucket="lustrain-test-data", Key="elsewhere.bin", Body=b"z" * 99
    )
    job = invoke("register_job", {"execution": "m", "input": {"spec": spec()}})
    assert job["plan"]["filesystem"]["data_gib"] == pytest.approx(15_000 / 2**30)


def test_an_invalid_spec_fails_naming_the_field_and_records_nothing(aws):
    seed_data()
    with pytest.raises(SpecInvalid) as exc:
        invoke("register_job", {"execution": "bad", "input": {"spec": spec(compute={"instance_count": 0})}})
    assert "compute.instance_count" in exc.value.message
    assert records_in(aws.jobs_table) == []


def test_a_local_code_directory_fails_at_code_source_and_records_nothing(aws):
    seed_data()
    with pytest.raises(SpecInvalid) as exc:
        invoke("register_job", {"execution": "local", "input": {"spec": spec(code={"source": "trainer/"})}})
    assert [e.path for e in exc.value.errors] == ["code.source"]
    assert records_in(aws.jobs_table) == []


def test_a_spec_that_cannot_be_read_from_s3_names_spec_s3_uri(aws):
    with pytest.raises(SpecInvalid) as exc:
        invoke(
            "register_job", {"execution": "x", "input": {"spec_s3_uri": f"s3://{JOBS_BUCKET}/missing.yaml"}}
        )
    assert [e.path for e in exc.value.errors] == ["spec_s3_uri"]


def test_an_empty_data_prefix_fails_at_data_s3_uri(aws):
    seed_data(files={})
    with pytest.raises(SpecInvalid) as exc:
        invoke("register_job", {"execution": "empty", "input": {"spec": spec()}})
    assert [e.path for e in exc.value.errors] == ["data.s3_uri"]


@pytest.mark.parametrize(
    ("changed", "field"),
    [
        ({"data": {"s3_uri": "s3://no-such-data-bucket/tokens/", "size_gib": 10}}, "data.s3_uri"),
        ({"data": {"s3_uri": "s3://lustrain-test-data/nothing-here/", "size_gib": 10}}, "data.s3_uri"),
        ({"output": {"s3_uri": "s3://no-such-results-bucket/x/"}}, "output.s3_uri"),
        ({"checkpoints": {"s3_uri": "s3://no-such-checkpoints-bucket/x/"}}, "checkpoints.s3_uri"),
        ({"checkpoints": {"resume_from": "tiny-0badc0de"}}, "checkpoints.resume_from"),
        (
            {"checkpoints": {"resume_from": "s3://lustrain-test-results/tiny/none/"}},
            "checkpoints.resume_from",
        ),
    ],
)
def test_every_s3_location_is_checked_before_anything_is_recorded_whether_or_not_size_gib_is_given(
    aws, changed, field
):
    seed_data()
    with pytest.raises(SpecInvalid) as exc:
        invoke("register_job", {"execution": "where", "input": {"spec": spec(**changed)}})
    assert [e.path for e in exc.value.errors] == [field]
    assert records_in(aws.jobs_table) == []


def test_a_spec_outside_the_stacks_rules_is_forbidden_before_anything_is_recorded(aws, monkeypatch):
    seed_data()
    monkeypatch.setenv("LUSTRAIN_ALLOWED_INSTANCE_TYPES", "ml.g5.48xlarge,ml.m5.xlarge")
    with pytest.raises(SpecForbidden) as exc:
        invoke("register_job", {"execution": "f", "input": {"spec": spec()}})
    assert exc.value.details["rule"] == "LUSTRAIN_ALLOWED_INSTANCE_TYPES"
    assert records_in(aws.jobs_table) == []


def test_the_stack_budget_is_checked_against_the_plans_estimate(aws, monkeypatch):
    seed_data()
    monkeypatch.setenv("LUSTRAIN_MAX_BUDGET_USD", "10")
    with pytest.raises(SpecForbidden, match="LUSTRAIN_MAX_BUDGET_USD"):
        invoke("register_job", {"execution": "f", "input": {"spec": spec()}})
    assert records_in(aws.jobs_table) == []


def test_an_instance_type_with_no_price_is_refused_only_where_the_stack_holds_runs_to_a_budget(aws, monkeypatch):
    seed_data()
    unpriced = spec(compute={"instance_type": "ml.p6-b200.48xlarge", "instance_count": 1, "max_runtime_hours": 1})
    unpriced.pop("budget", None)
    monkeypatch.setenv("LUSTRAIN_MAX_BUDGET_USD", "10000")
    with pytest.raises(SpecForbidden) as exc:
        invoke("register_job", {"execution": "f", "input": {"spec": unpriced}})
    assert exc.value.details["field"] == "compute.instance_type" and "no confirmed on-demand price" in str(exc.value)
    assert records_in(aws.jobs_table) == []
    monkeypatch.delenv("LUSTRAIN_MAX_BUDGET_USD")
    job = invoke("register_job", {"execution": "g", "input": {"spec": unpriced}})
    assert job["plan"]["cost"]["total_usd"] is None and job["plan"]["cost"]["filesystem_usd"] > 0


def test_a_file_system_the_stack_does_not_allow_is_forbidden_before_anything_is_recorded(aws, monkeypatch):
    seed_data()
    monkeypatch.setenv("LUSTRAIN_ALLOWED_EXISTING_RESOURCES", "none")
    reuse = spec(filesystem={"file_system_id": "fs-0123456789abcdef0"})
    with pytest.raises(SpecForbidden) as exc:
        invoke("register_job", {"execution": "f", "input": {"spec": reuse}})
    assert (exc.value.details["rule"], exc.value.details["field"]) == (
        "LUSTRAIN_ALLOWED_EXISTING_RESOURCES",
        "filesystem.file_system_id",
    )
    assert records_in(aws.jobs_table) == []


def test_the_record_register_job_writes_reads_as_a_job_record_and_writes_back_unchanged(aws):
    """The model round-trips the stored record: every attribute register_job wrote is a field read as written,
    and the record written again is the same item."""
    from lustrain_core import clients
    from lustrain_core.steps import records

    seed_data()
    job = invoke("register_job", {"execution": "drop-3", "input": drop(spec(data={"size_gib": 5}))})
    ddb = clients.client("dynamodb")
    item = ddb.get_item(TableName=aws.jobs_table, Key={"job_id": {"S": job["job_id"]}})["Item"]
    record = records.get(ddb, aws.jobs_table, job["job_id"])
    assert record is not None and not record.other  # the model names every attribute register_job writes
    assert (record.job_id, record.kind, record.execution, record.status, record.resources) == (
        job["job_id"],
        "train",
        "drop-3",
        "RUNNING",
        (),
    )
    assert (record.spec, record.plan, record.launch, record.source) == (
        job["spec"],
        job["plan"],
        job["launch"],
        job["source"],
    )
    assert record.stored() == records.from_item(item)
    ddb.delete_item(TableName=aws.jobs_table, Key={"job_id": {"S": job["job_id"]}})
    assert records.put_new(ddb, aws.jobs_table, record)
    again = ddb.get_item(TableName=aws.jobs_table, Key={"job_id": {"S": job["job_id"]}})["Item"]
    # the same values (a number may come back as 40 where it was written 40.0: DynamoDB holds one number)
    assert records.from_item(again) == records.from_item(item)


# --- data preparation runs (kind: prepare) --------------------------------------------------------------------

CORPUS = "s3://lustrain-test-data/text/"
SHARDS = "s3://lustrain-test-results/default/shards/"
TRAINER_PACKAGE = "s3://lustrain-test-artifacts/uploads/lustrain-trainer/0123456789abcdef/"


def prepare_spec(**changed: object) -> dict:
    return {
        "kind": "prepare",
        "name": "corpus",
        "source": CORPUS,
        "output": SHARDS,
        "instances": 2,
        "code": TRAINER_PACKAGE,
        **changed,
    }


def seed_corpus() -> None:
    seed_data(CORPUS, {"a.txt": b"hello world\n" * 100, "b.txt": b"the quick brown fox\n" * 50})
    seed_data(TRAINER_PACKAGE, {"lustrain_trainer/prepare.py": b"# the preparation's entry module\n"})


def test_a_prepare_spec_becomes_a_recorded_preparation_and_a_training_one_says_its_kind(aws):
    seed_corpus()
    job = invoke("register_job", {"execution": "prep-1", "input": {"spec": prepare_spec()}})
    assert (job["kind"], job["duplicate"], job["spec"]["instances"]) == ("prepare", False, 2)
    assert job["plan"]["stages"] == ["plan x1", "work x2", "merge x1"]
    # the source was measured: 1,200 + 1,000 bytes
    assert job["plan"]["source_gib"] == pytest.approx(2200 / 2**30)
    assert "launch" not in job
    record = job_record(aws.jobs_table, job["job_id"])
    assert (record["kind"], record["status"], record["resources"]) == ("prepare", "RUNNING", [])
    assert record["spec"] == job["spec"] and record["plan"] == job["plan"]

    seed_data()
    trained = invoke("register_job", {"execution": "train-1", "input": {"spec": spec(data={"size_gib": 5})}})
    assert trained["kind"] == job_record(aws.jobs_table, trained["job_id"])["kind"] == "train"


def test_a_prepare_spec_started_twice_is_one_run(aws):
    seed_corpus()
    event = drop(prepare_spec(), key="jobs/corpus.yaml")
    first = invoke("register_job", {"execution": "a", "input": event})
    again = invoke("register_job", {"execution": "b", "input": event})
    assert (again["duplicate"], again["kind"], again["job_id"]) == (True, "prepare", first["job_id"])
    assert len(records_in(aws.jobs_table)) == 1


@pytest.mark.parametrize(
    ("env", "changed", "rule", "field"),
    [
        ("LUSTRAIN_ALLOWED_DATA_PREFIXES", {}, "LUSTRAIN_ALLOWED_DATA_PREFIXES", "source"),
        ("LUSTRAIN_ALLOWED_OUTPUT_PREFIXES", {}, "LUSTRAIN_ALLOWED_OUTPUT_PREFIXES", "output"),
        ("LUSTRAIN_MAX_INSTANCES_PER_RUN", {"instances": 3}, "LUSTRAIN_MAX_INSTANCES_PER_RUN", "instances"),
        ("LUSTRAIN_ALLOWED_INSTANCE_TYPES", {}, "LUSTRAIN_ALLOWED_INSTANCE_TYPES", "instance_type"),
    ],
)
def test_a_prepare_spec_outside_the_stacks_rules_is_forbidden_before_anything_is_recorded(
    aws, monkeypatch, env, changed, rule, field
):
    seed_corpus()
    allowed = {"LUSTRAIN_MAX_INSTANCES_PER_RUN": "2", "LUSTRAIN_ALLOWED_INSTANCE_TYPES": "ml.m5.xlarge"}
    monkeypatch.setenv(env, allowed.get(env, "s3://somewhere-else/"))
    with pytest.raises(SpecForbidden) as exc:
        invoke("register_job", {"execution": "f", "input": {"spec": prepare_spec(**changed)}})
    assert (exc.value.details["rule"], exc.value.details["field"]) == (rule, field)
    assert records_in(aws.jobs_table) == []


def test_a_stage_too_long_for_sagemaker_names_the_instances_that_fit(aws):
    seed_corpus()
    with pytest.raises(
        SpecInvalid, match=r"work stage is estimated at 281\.4 h, over the 24 h .* at least 24 "
    ):
        invoke(
            "register_job",
            {"execution": "f", "input": {"spec": prepare_spec(size_gib=2000, tokenizer="bpe:32768")}},
        )
    job = invoke(
        "register_job",
        {
            "execution": "f",
            "input": {"spec": prepare_spec(size_gib=2000, tokenizer="bpe:32768", instances=24)},
        },
    )
    assert job["plan"]["stage_hours"]["work"] <= 24 and job["plan"]["too_long"] is None


def test_a_prepare_spec_over_the_stacks_budget_is_forbidden(aws, monkeypatch):
    seed_corpus()
    monkeypatch.setenv("LUSTRAIN_MAX_BUDGET_USD", "0.01")
    with pytest.raises(SpecForbidden, match="LUSTRAIN_MAX_BUDGET_USD"):
        invoke("register_job", {"execution": "f", "input": {"spec": prepare_spec(instances=50)}})
    assert records_in(aws.jobs_table) == []


@pytest.mark.parametrize(
    ("changed", "field"),
    [
        ({"source": "s3://lustrain-test-data/nothing-here/"}, "source"),
        ({"output": "s3://no-such-bucket-lustrain/shards/"}, "output"),
        ({"tokenizer": "s3://lustrain-test-data/tok/tokenizer.json"}, "tokenizer"),
        ({"instances": 0}, "instances"),
        ({"output": CORPUS + "shards/"}, ""),
        ({"code": None}, "code"),
        # a prefix without the preparation's module: refused here, not after the run's network exists
        ({"code": "s3://lustrain-test-data/text/"}, "code"),
        # each of the container's arguments is at most 256 characters (CreateProcessingJob's ContainerArguments)
        ({"output": "s3://lustrain-test-results/" + "s" * 230 + "/"}, "output"),
        # a stage estimated over the day a processing job may run (prepare_plan.MAX_RUNTIME_SECONDS)
        ({"size_gib": 2000, "tokenizer": "bpe:32768"}, "instances"),
    ],
)
def test_a_prepare_spec_that_cannot_run_is_refused_naming_the_field(aws, changed, field):
    seed_corpus()
    with pytest.raises(SpecInvalid) as exc:
        invoke("register_job", {"execution": "f", "input": {"spec": prepare_spec(**changed)}})
    assert [e.path for e in exc.value.errors] == [field]
    assert records_in(aws.jobs_table) == []


def test_a_preparation_writes_only_where_no_other_run_has_data(aws, monkeypatch):
    """A preparation's own role reads, writes and deletes under its output: an output that is the stack's output
    location itself or its team's folder, that holds what a preparation does not write, or that lies in a run's
    folder (now or later: a folder named as runs' are) is refused; an earlier preparation's output (a rerun) is
    not."""
    seed_corpus()
    monkeypatch.setenv("LUSTRAIN_ALLOWED_OUTPUT_PREFIXES", "s3://lustrain-test-results/")
    for whole in ("s3://lustrain-test-results/", "s3://lustrain-test-results/default/"):
        with pytest.raises(SpecForbidden) as forbidden:
            invoke("register_job", {"execution": "f", "input": {"spec": prepare_spec(output=whole)}})
        assert (forbidden.value.details["field"], forbidden.value.details["rule"]) == (
            "output",
            "LUSTRAIN_ALLOWED_OUTPUT_PREFIXES",
        )
        assert "s3://lustrain-test-results/default/corpus/" in str(forbidden.value)

    # an earlier preparation's output: its files, parts and plan lists
    seed_data(SHARDS, {
        "index.json": b"{}", "prepare-plan.json": b"{}", "tokenizer.json": b"{}", "train-00000-000.bin": b"x",
        "val-00001-000.bin": b"x", "parts/part-00000.json": b"{}", "plan/files-00000.json": b"[]",
    })  # fmt: skip
    assert invoke("register_job", {"execution": "rerun", "input": {"spec": prepare_spec()}})["kind"] == "prepare"

    # another run's checkpoints, or a file a preparation never writes, beside them
    for planted in ("gpt-0123abcd/checkpoints/step-100/model.pt", "notes.txt"):
        seed_data(SHARDS, {planted: b"x"})
        with pytest.raises(SpecInvalid) as invalid:
            invoke("register_job", {"execution": f"f-{planted[:3]}", "input": {"spec": prepare_spec(name="again")}})
        assert [e.path for e in invalid.value.errors] == ["output"]
        assert repr(planted.split("/")[0] + ("/" if "/" in planted else "")) in str(invalid.value)
        boto3.client("s3", region_name=REGION).delete_object(Bucket="lustrain-test-results", Key=f"default/shards/{planted}")

    # the folder of a run that has written nothing yet (queued): its results would land where the role writes
    seed_data()
    results = {"s3_uri": "s3://lustrain-test-results/default/"}
    trained = invoke("register_job", {"execution": "train-1", "input": {"spec": spec(data={"size_gib": 5}, output=results)}})
    for job_id in (trained["job_id"], "later-0badc0de"):
        inside = f"s3://lustrain-test-results/default/{job_id}/shards/"
        with pytest.raises(SpecForbidden) as forbidden:
            invoke("register_job", {"execution": "f-run", "input": {"spec": prepare_spec(name="inside", output=inside)}})
        assert forbidden.value.details["field"] == "output" and f"its folder {job_id} is named as a run" in str(forbidden.value)
