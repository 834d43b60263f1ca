"""Two runs of one shape in sequence on the twin, with compute.keep_alive_minutes: the first keeps its instances in a
warm pool and its network with them; the second takes both over (the same subnet and security group, so SageMaker
matches it), starts without launching instances, and owns nothing of the network; when the pool ends, one sweep
leaves nothing of either run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from lustrain_core.prices import PriceTable

from lustrain import cli
from lustrain.twin import rehearse
from lustrain.twin.rehearse import REGION, drop, twin, until

pytestmark = pytest.mark.slow

QUICK = Path(__file__).with_name("quick.yaml")
SCHEDULED_EVENT = Path(__file__).resolve().parents[2] / "events" / "sweep.json"
#: what launching a cold job's instances takes on the twin here (a matching job skips it)
PROVISION_S = 4.0


def pooled_spec(tmp_path: Path, name: str) -> Path:
    doc = yaml.safe_load(QUICK.read_text())
    doc["name"] = name
    doc["compute"]["keep_alive_minutes"] = 5
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def finished(sfn: Any, execution_arn: str) -> str:
    def ended() -> str | None:
        status = str(sfn.describe_execution(executionArn=execution_arn)["status"])
        return None if status == "RUNNING" else status

    status: str = until(ended, "the end of the run", timeout=600)
    return status


def training_job(sagemaker: Any, name: str) -> dict[str, Any]:
    summaries = sagemaker.list_training_jobs(NameContains=name)["TrainingJobSummaries"]
    assert len(summaries) == 1, summaries
    return dict(sagemaker.describe_training_job(TrainingJobName=summaries[0]["TrainingJobName"]))


def launching_s(job: dict[str, Any]) -> float:
    """How long the job was Starting: launching its instances (and the twin's start delay)."""
    starting = next(t for t in job["SecondaryStatusTransitions"] if t["Status"] == "Starting")
    return float((starting["EndTime"] - starting["StartTime"]).total_seconds())


def test_the_second_run_of_a_shape_reuses_the_pool_and_its_network_and_one_sweep_ends_both(
    tmp_path, monkeypatch, capsys
):
    from lustrain.twin import simulator
    from lustrain.twin.patches import fsx, service_quotas
    from lustrain.twin.patches import sagemaker as twin_sagemaker

    monkeypatch.setenv("LUSTRAIN_TEARDOWN_POLL_SECONDS", "0.2")
    before = simulator.settings()
    simulator.configure(provision_s=PROVISION_S)
    try:
        with twin() as stack:
            service_quotas.set_quota("ml.p4d.24xlarge", 8, REGION)
            service_quotas.set_quota("ml.p4d.24xlarge", 2, REGION, warm_pool=True)
            fsx.configure(polls=1)
            sfn = boto3.client("stepfunctions", region_name=REGION)
            sagemaker = boto3.client("sagemaker", region_name=REGION)

            first, first_arn = drop(stack, pooled_spec(tmp_path, "pool-first"))
            assert finished(sfn, first_arn) == "SUCCEEDED"
            first_job = training_job(sagemaker, "pool-first")
            assert first_job["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 300
            assert first_job["WarmPoolStatus"]["Status"] == "Available"
            first_id = rehearse.job_id_of(rehearse.execution_history(sfn, first_arn))
            kept, _ = rehearse.resources_left(first_id, first)
            assert first_job["VpcConfig"]["Subnets"][0] in kept and len(kept) == 5, (
                kept
            )  # the network, no more

            second, second_arn = drop(stack, pooled_spec(tmp_path, "pool-second"))
            assert finished(sfn, second_arn) == "SUCCEEDED"
            second_job = training_job(sagemaker, "pool-second")
            assert second_job["VpcConfig"] == first_job["VpcConfig"]
            first_job = training_job(sagemaker, "pool-first")
            assert first_job["WarmPoolStatus"]["Status"] == "Reused"
            assert first_job["WarmPoolStatus"]["ReusedByJob"] == second_job["TrainingJobName"]
            assert second_job["WarmPoolStatus"]["Status"] == "Available"
            # the cold job launched its instances; the one that took the pool over did not
            assert launching_s(first_job) >= PROVISION_S > launching_s(second_job)
            second_id = rehearse.job_id_of(rehearse.execution_history(sfn, second_arn))
            assert rehearse.resources_left(second_id, second) == ([], [])
            assert len(rehearse.resources_left(first_id, first)[0]) == 5
            # `lustrain leftovers`: the second job's pool bills its instances, and the first run's network is kept
            # while the pool runs in it (it bills nothing)
            capsys.readouterr()
            assert cli.main(["leftovers", "--stack", rehearse.STACK_NAME, "--json"]) == 1
            shown = json.loads(capsys.readouterr().out)["leftovers"]
            pool = next(left for left in shown if left["kind"] == "warm_pool")
            p4d = PriceTable().instance_types[second.compute.instance_type].hourly_usd
            assert (pool["id"], pool["run"], pool["state"], pool["kept"]) == (
                second_job["TrainingJobName"], "pool-second", "Available", True
            )  # fmt: skip
            assert pool["hourly_usd"] == pytest.approx(p4d * second.compute.instance_count)
            # what it billed so far, as SageMaker counts it (read after second_job was: it has only grown)
            assert pool["billed_s"] >= second_job["WarmPoolStatus"]["ResourceRetainedBillableTimeInSeconds"]
            network = [left for left in shown if left["kind"] != "warm_pool"]
            assert {left["job_id"] for left in network} == {first_id} and len(network) == 5
            assert all(left["kept"] and not left["bills"] for left in network), network

            # the pool ends (SageMaker's patch update, or its keep-alive ran out): the next sweep deletes the network
            assert twin_sagemaker.terminate_warm_pool(second_job["TrainingJobName"])
            assert training_job(sagemaker, "pool-second")["WarmPoolStatus"]["Status"] == "Terminated"
            answer = boto3.client("lambda", region_name=REGION).invoke(
                FunctionName=stack.function_names()["sweep"], Payload=SCHEDULED_EVENT.read_bytes()
            )
            payload = answer["Payload"].read()
            assert "FunctionError" not in answer, payload
            swept = {(s["job_id"], s["type"]) for s in json.loads(payload)["swept"]}
            assert {(first_id, kind) for kind in ("vpc", "subnet", "security_group", "route_table")} <= swept
            for spec, job_id in ((first, first_id), (second, second_id)):
                assert rehearse.resources_left(job_id, spec) == ([], []), spec.name
            assert cli.main(["leftovers", "--stack", rehearse.STACK_NAME]) == 0
    finally:
        simulator.configure(**before.__dict__)
