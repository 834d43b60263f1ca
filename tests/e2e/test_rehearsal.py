"""The real state machine definition, executing the real handlers on the twin, with a real (tiny) training run."""

from __future__ import annotations

import io
import json
import math
import tarfile
from pathlib import Path

import pytest
import yaml

from lustrain import operate, report
from lustrain.cli import main
from lustrain.twin.rehearse import operator_session, rehearse

pytestmark = pytest.mark.slow

QUICK = Path(__file__).with_name("quick.yaml")
#: quick.yaml's run: 6 steps of the tiny preset (16 x 64 tokens a step), evaluated at steps 3 and 6
TOKENS_SEEN = 6 * 16 * 64


def archive_object(result, name: str) -> bytes:
    """The object of the run's archive whose key ends with `name`."""
    bucket, prefix = result.archive.removeprefix("s3://").split("/", 1)
    (key,) = [o["key"] for o in result.archive_objects if o["key"].endswith(name)]
    return operator_session().client("s3").get_object(Bucket=bucket, Key=prefix + key)["Body"].read()


def test_a_whole_run_succeeds_archives_and_leaves_nothing_behind(tmp_path, capsys, mlflow_server):
    seen: dict = {}

    def inspect(stack, result):
        seen["mlflow_before"] = mlflow_of(mlflow_server, result.job_id)
        # EventBridge may deliver the attempt's end again: the MLflow run is the same, its history unchanged
        session = operator_session()
        (job,) = [j for j in operate.training_jobs(operate.Stack.locate(stack.name, session), operate.find_run(
            operate.Stack.locate(stack.name, session), result.job_id))]
        again = {"source": "aws.sagemaker", "detail-type": "SageMaker Training Job State Change", "detail": {
            "TrainingJobName": job["TrainingJobName"], "TrainingJobStatus": job["TrainingJobStatus"]}}
        answer = session.client("lambda").invoke(
            FunctionName=stack.function_names()["notify"], Payload=json.dumps(again).encode()
        )
        seen["again"] = json.loads(answer["Payload"].read())
        seen["mlflow_after"] = mlflow_of(mlflow_server, result.job_id)
        # the final summary in the archive's output.tar.gz, and the evaluation as `status` and `report` show it
        with tarfile.open(fileobj=io.BytesIO(archive_object(result, "/output/output.tar.gz"))) as tar:
            member = tar.extractfile("summary.json")
            assert member is not None
            seen["summary"] = json.loads(member.read())
        capsys.readouterr()
        assert main(["status", result.job_id, "--stack", stack.name]) == 0
        seen["status"] = capsys.readouterr().out
        seen["report"] = report.build(operate.Stack.locate(stack.name, operator_session()), result.job_id, tmp_path)

    run = rehearse(QUICK, inspect=inspect, parameters={"MlflowTrackingUri": mlflow_server.url})

    assert run.status == "SUCCEEDED", (run.error, run.cause)
    assert run.resources_left == 0, run.leftovers
    archived = {o["key"].rsplit("/", 1)[-1] for o in run.archive_objects}
    assert {"model.tar.gz", "manifest.json", "describe_training_job.json", "final_metrics.json"} <= archived
    entered = [s.name for s in run.states]
    assert entered[0] == "Register the job" and "Start the training job" in entered
    assert "Tear down the run" in entered
    assert any("train_loss=" in line for line in run.training_log_tail)
    assert run.transitions <= 30 and run.lambda_invocations <= 15
    final = seen["summary"]["final"]
    assert (final["step"], final["val_step"], final["tokens_seen"]) == (6, 6, TOKENS_SEEN)
    assert final["val_ppl"] == pytest.approx(math.exp(final["val_loss"])) and 0 < final["val_bpb"] < 8
    assert (
        f"  evaluation:  final at step 6: val_loss {final['val_loss']:.4f}, perplexity {final['val_ppl']:,.2f}, "
        f"{final['val_bpb']:.4f} bits/byte; train_loss {final['train_loss']:.4f}; {TOKENS_SEEN:,} tokens seen"
    ) in seen["status"]
    made = seen["report"]
    (first, last) = made.series["val_bpb"]["val_bpb"]
    assert (first[0], last[0]) == (3, 6) and last[1] == pytest.approx(final["val_bpb"], abs=1e-4)
    assert "evaluation, final at step 6" in made.html_path.read_text()

    # the run is an MLflow run: named by its job id, the spec's fields as params, the metrics at their steps,
    # FINISHED, and the model's S3 location as its artifact
    logged = seen["mlflow_before"]
    assert logged["info"]["run_name"] == run.job_id and logged["info"]["status"] == "FINISHED"
    params = {p["key"]: p["value"] for p in logged["data"]["params"]}
    spec = yaml.safe_load(QUICK.read_text())
    assert params["compute.instance_type"] == spec["compute"]["instance_type"]
    assert params["code.hyperparameters.max_steps"] == "6"
    assert logged["val_bpb"] == [(3, pytest.approx(first[1], abs=1e-4)), (6, pytest.approx(last[1], abs=1e-4))]
    assert logged["train_loss"] == [(s, pytest.approx(v)) for s, v in made.series["loss"]["train_loss"]]
    assert [step for step, _ in logged["train_loss"]] == [2, 4, 6]  # quick.yaml's log_interval
    model = json.loads(mlflow_server.artifact(logged["model_artifact"]))
    assert model["model_s3_uri"].startswith(run.archive) and model["model_s3_uri"].endswith("/model.tar.gz")
    tags = {t["key"]: t["value"] for t in logged["data"]["tags"]}
    assert tags["lustrain.model_s3_uri"] == model["model_s3_uri"]
    experiment, run_id = logged["info"]["experiment_id"], logged["info"]["run_id"]
    assert f"  mlflow:      {mlflow_server.url}/#/experiments/{experiment}/runs/{run_id}\n" in seen["status"]
    assert seen["again"]["mlflow"]["tracked"] is True
    assert seen["mlflow_after"] == logged, "a second delivery of the attempt's end changed the MLflow run"


def mlflow_of(server, job_id: str) -> dict:
    """The MLflow run of a lustrain run, as a team reads it from its tracking server: the run, its metrics'
    histories (step, value) and where its model artifact is."""
    experiments = server.call("POST", "mlflow/experiments/search", {"max_results": 100})["experiments"]
    found = server.call("POST", "mlflow/runs/search", {
        "experiment_ids": [e["experiment_id"] for e in experiments], "filter": f"attributes.run_name = '{job_id}'"})
    (logged,) = found["runs"]
    run_id = logged["info"]["run_id"]
    for key in ("train_loss", "val_bpb"):
        history = server.call("GET", f"mlflow/metrics/get-history?run_id={run_id}&metric_key={key}")["metrics"]
        logged[key] = sorted((m["step"], m["value"]) for m in history)
    experiment = logged["info"]["experiment_id"]
    logged["model_artifact"] = f"{experiment}/{run_id}/artifacts/lustrain/model.json"
    return logged


def test_a_preloaded_run_with_an_uncompressed_model_warms_up_first_and_archives_the_models_files(tmp_path):
    """One rehearsal for two fields (each run costs the suite half a minute):
    - data.preload: the warm-up job Completed before the training job was created, and went with the run;
    - output.compression: none: SageMaker (the twin) uploads /opt/ml/model's files under the archive's
      jobs/<training job>/output/model/, and the manifest lists each with its size and S3's checksum."""
    doc = yaml.safe_load(QUICK.read_text())
    doc["name"] = "quick-preload"
    doc["data"]["preload"] = True
    doc["output"]["compression"] = "none"
    spec = tmp_path / "quick-preload.yaml"
    spec.write_text(yaml.safe_dump(doc))
    jobs: dict[str, dict] = {}
    summary_json = b""

    def inspect(stack, result):
        nonlocal summary_json
        sagemaker = operator_session().client("sagemaker")
        for summary in sagemaker.list_training_jobs()["TrainingJobSummaries"]:
            name = summary["TrainingJobName"]
            jobs[name] = sagemaker.describe_training_job(TrainingJobName=name)
        summary_json = archive_object(result, "/output/data/summary.json")

    run = rehearse(spec, inspect=inspect)

    assert (run.status, run.resources_left) == ("SUCCEEDED", 0), (run.error, run.cause, run.leftovers)
    (warmup,) = [j for name, j in jobs.items() if name.endswith("-warmup")]
    (training,) = [j for name, j in jobs.items() if not name.endswith("-warmup")]
    assert (
        warmup["TrainingJobStatus"] == "Completed"
        and warmup["ResourceConfig"]["InstanceType"] == "ml.m5.xlarge"
    )
    # the data was read into Lustre before the GPUs started
    assert warmup["TrainingEndTime"] <= training["CreationTime"]
    keys = {o["key"] for o in run.archive_objects}
    assert "model.tar.gz" not in {k.rsplit("/", 1)[-1] for k in keys}
    model_files = {k.split("/output/model/", 1)[1] for k in keys if "/output/model/" in k}
    assert {"model.pt", "config.json"} <= model_files, keys
    assert "manifest.json" in keys
    # /opt/ml/output/data's files as they are: the final summary under output/data/
    final = json.loads(summary_json)["final"]
    assert (final["step"], final["tokens_seen"]) == (6, TOKENS_SEEN) and final["val_bpb"] > 0


# Every injected fault, and throttling at every step, runs in tests/e2e/test_fault_matrix.py (the same state
# machine and handlers, with a stand-in trainer so that 36 runs take about a minute). Here: the rehearse command.


def test_rehearse_json_reports_what_a_user_checks(capsys):
    code = main(["rehearse", str(QUICK), "--json", "--inject", "start_training:capacity-error"])

    out = json.loads(capsys.readouterr().out)
    assert code == 1
    for key in ("status", "error", "resources_left", "archive", "transitions", "lambda_invocations", "wall_s"):
        assert key in out
    assert out["status"] == "FAILED" and out["error"] == "CapacityError" and out["resources_left"] == 0


def test_an_invalid_spec_exits_2_before_anything_runs(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: quick\ndata: {s3_uri: s3://bkt/d/}\noutput: {s3_uri: s3://bkt/o/}\ncompute: {spot: 1x}\n")
    assert main(["rehearse", str(bad)]) == 2
    assert "compute.spot" in capsys.readouterr().err


def test_an_unknown_fault_is_a_usage_error(capsys):
    assert main(["rehearse", str(QUICK), "--inject", "check_quota:meteor"]) == 2
    assert "unknown fault" in capsys.readouterr().err


def test_moments_that_log_a_run_to_mlflow_at_once_make_one_mlflow_run(mlflow_server):
    """An attempt's end and the run's end may both find no MLflow run and make one: the job record keeps the
    first, and the run has one MLflow run with its params once."""
    from concurrent.futures import ThreadPoolExecutor

    import boto3
    from lustrain_core.config import Settings
    from lustrain_core.steps import records, tracking
    from moto import mock_aws

    from lustrain.twin import patches

    patches.install()  # the twin's DynamoDB: a conditional write atomic with its condition, as on AWS
    settings = Settings(stack_name="lustrain-race", jobs_table="jobs")
    server = tracking.Server(mlflow_server.url)
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        ddb.create_table(
            TableName="jobs",
            KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "job_id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        record = records.JobRecord(job_id="race-0123abcd", spec={"name": "race", "compute": {"instance_count": 2}})
        records.put_new(ddb, "jobs", record)
        with ThreadPoolExecutor(4) as pool:
            made = list(pool.map(lambda _: tracking.mlflow_run(server, settings, record, ddb)["run_id"], range(4)))
        kept = records.get(ddb, "jobs", record.job_id).mlflow_run
    assert set(made) == {kept}
    experiments = mlflow_server.call("POST", "mlflow/experiments/search", {"max_results": 100})["experiments"]
    live = mlflow_server.call("POST", "mlflow/runs/search", {
        "experiment_ids": [e["experiment_id"] for e in experiments], "filter": "attributes.run_name = 'race-0123abcd'"})
    assert [r["info"]["run_id"] for r in live["runs"]] == [kept]
    assert {p["key"]: p["value"] for p in live["runs"][0]["data"]["params"]} == {
        "name": "race", "compute.instance_count": "2"}
