"""data.preload, offline: the plan's cold first epoch next to the warm-up (time and money), the warm-up's cost in the
run's total, the launch plan's warm-up job and its request against botocore's model, and the spec's refusals."""

from __future__ import annotations

import math

import pytest
from lustrain_core import aws_requests, limits, planner
from lustrain_core.config import Settings
from lustrain_core.document import Code, Filesystem, Job, Network, Plan, Run, Sections
from lustrain_core.errors import SpecInvalid
from lustrain_core.launch import compile_offline
from lustrain_core.spec import validate_spec
from lustrain_core.steps import preload

from lustrain.plan_text import render_plan


def spec_with(**sections):
    doc = {
        "name": "gpt",
        "data": {"s3_uri": "s3://bkt/data/", "size_gib": 1024},
        "output": {"s3_uri": "s3://bkt/out/"},
        "compute": {"instance_type": "ml.p4d.24xlarge", "instance_count": 4},
    }
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    return validate_spec(doc)


def test_the_plan_prices_a_cold_first_epoch_next_to_the_warm_up():
    p = planner.plan(spec_with())
    pre = p.preload
    assert pre is not None and pre["enabled"] is False
    mb = 1024 * 2**30 / 1e6
    fs_mb_s = p.filesystem.throughput_mb_s
    assert pre["import_mb_s"] == fs_mb_s
    # the first epoch reads 1 TiB at no more than the file system's throughput while 4 p4d bill
    assert pre["cold_first_epoch_seconds"] == math.ceil(mb / fs_mb_s)
    fleet = 4 * planner.PriceTable().instance_types["ml.p4d.24xlarge"].hourly_usd
    assert pre["cold_first_epoch_usd"] == round(fleet * pre["cold_first_epoch_seconds"] / 3600, 2)
    # the warm-up: one m5.xlarge at its baseline network bandwidth (or the file system's, if lower)
    assert pre["warmup_instance_type"] == "ml.m5.xlarge"
    assert pre["warmup_read_mb_s"] == min(planner.PRELOAD_READ_MB_S, fs_mb_s)
    assert pre["warmup_seconds"] == math.ceil(mb / pre["warmup_read_mb_s"])
    assert 0 < pre["warmup_usd"] < pre["cold_first_epoch_usd"]
    assert pre["max_runtime_seconds"] == planner.PRELOAD_RUNTIME_FACTOR * pre["warmup_seconds"]
    # off: the warm-up is shown, not counted
    assert p.cost.preload_usd == 0.0


def test_the_warm_up_is_counted_in_the_runs_cost_when_on():
    off = planner.plan(spec_with())
    on = planner.plan(spec_with(data={"preload": True}))
    assert on.preload is not None and on.preload["enabled"] is True
    assert on.cost.preload_usd == on.preload["warmup_usd"] > 0
    assert on.cost.total_usd == pytest.approx(off.cost.total_usd + on.preload["warmup_usd"], abs=0.011)
    assert any("data.preload" in a for a in on.cost.assumptions)


def test_lustrain_plan_shows_the_cold_first_epoch_and_the_warm_up_in_time_and_money():
    p = planner.plan(spec_with(data={"preload": True}))
    text = render_plan("gpt", p)
    cold = next(line for line in text.splitlines() if "cold 1st epoch" in line)
    warm = next(line for line in text.splitlines() if line.strip().startswith("warm-up"))
    assert "on: " in warm
    assert f"${p.preload['cold_first_epoch_usd']:,.2f}" in cold and "1,024 GiB" in cold
    assert f"${p.preload['warmup_usd']:,.2f}" in warm and "ml.m5.xlarge" in warm


def test_without_the_datas_size_the_times_are_unknown_and_the_warm_up_gets_a_day():
    p = planner.plan(spec_with(data={"size_gib": None, "preload": True}))
    assert p.preload is not None
    assert p.preload["cold_first_epoch_seconds"] is None and p.preload["warmup_seconds"] is None
    assert p.preload["max_runtime_seconds"] == planner.PRELOAD_UNKNOWN_SECONDS
    assert "unknown" in render_plan("gpt", p)


def test_the_launch_plan_decides_the_warm_up_job_and_its_request_passes_botocores_model():
    spec = spec_with(data={"preload": True})
    plan, launch = compile_offline(spec, settings=Settings())
    assert launch.preload is not None
    assert launch.preload.name == f"{launch.job_id}-warmup"
    assert launch.preload.instance_type == "ml.m5.xlarge"
    assert launch.preload.image_uri.endswith("/pytorch-training:2.8-cpu-py312")
    assert launch.preload.max_runtime_seconds == plan.preload["max_runtime_seconds"]
    job = Job(launch.job_id, spec, plan.to_dict(), launch, Plan.model_validate(plan.to_dict()))
    run = Run(
        job,
        Sections(
            network=Network(
                subnet_id="subnet-0123456789abcdef0", security_group_ids=["sg-0123456789abcdef0"]
            ),
            filesystem=Filesystem(file_system_id="fs-0123456789abcdef0", mount_name="abcdefgh"),
            code=Code(submit_directory="s3://bkt/code/"),
        ),
    )
    request = aws_requests.preload_job(run, Settings())
    assert limits.problems("sagemaker", "CreateTrainingJob", request) == []
    # each ContainerEntrypoint item is at most 256 characters (botocore's model): the script fits
    assert all(len(item) <= 256 for item in request["AlgorithmSpecification"]["ContainerEntrypoint"])
    assert request["InputDataConfig"][0]["DataSource"]["FileSystemDataSource"]["FileSystemAccessMode"] == "ro"
    assert "HyperParameters" not in request and request["ResourceConfig"]["InstanceCount"] == 1
    # no preload, no warm-up
    assert compile_offline(spec_with(), settings=Settings())[1].preload is None


def test_a_script_longer_than_botocore_allows_would_be_caught_by_the_request_check():
    request = {
        "TrainingJobName": "x",
        "RoleArn": "arn:aws:iam::123456789012:role/r",
        "OutputDataConfig": {"S3OutputPath": "s3://b/o/"},
        "AlgorithmSpecification": {"TrainingInputMode": "File", "ContainerEntrypoint": ["x" * 257]},
    }
    assert limits.problems("sagemaker", "CreateTrainingJob", request)


def test_preload_must_be_a_boolean():
    with pytest.raises(SpecInvalid) as info:
        spec_with(data={"preload": "maybe"})
    assert [e.path for e in info.value.errors] == ["data.preload"]


@pytest.mark.parametrize("runtime", [3600, 3 * 86400, 28 * 86400])
@pytest.mark.parametrize("started_at", [1, 5, 200, 238])
def test_the_warm_ups_looks_outlast_its_max_runtime_within_the_poll_loops_bound(runtime, started_at):
    # its looks are the file system poll loop's (FilesystemPollMaxCount, the history budget's bound): the waits
    # between the looks left add up to at least its MaxRuntimeInSeconds, after which SageMaker has stopped it
    poll = {"initial_seconds": 480, "max_seconds": 30, "max_polls": 240}
    waited, polls = 0, started_at
    while polls < poll["max_polls"] - 1:
        waited += preload.wait_seconds(runtime, polls, poll)
        polls += 1
    assert waited >= runtime or started_at >= poll["max_polls"] - 1


def test_a_warm_up_dearer_than_a_cold_epoch_at_the_file_systems_throughput_is_warned_of():
    # 4 p4d on 1 TiB: the warm-up's hour on one m5.xlarge is cheaper than the fleet's cold first epoch
    cheap = planner.plan(spec_with(data={"preload": True}))
    assert cheap.preload["warmup_usd"] < cheap.preload["cold_first_epoch_usd"]
    assert not [w for w in cheap.warnings if w.startswith("data.preload")]
    # one CPU instance training on 20,000 GiB: its cold epoch costs cents, the warm-up's 38 h far more
    dear = planner.plan(
        spec_with(
            data={"preload": True, "size_gib": 20_000},
            compute={"instance_count": 1, "instance_type": "ml.m5.xlarge"},
        )
    )
    assert dear.preload["warmup_usd"] > dear.preload["cold_first_epoch_usd"]
    (warning,) = [w for w in dear.warnings if w.startswith("data.preload")]
    assert f"${dear.preload['warmup_usd']:,.2f}" in warning and "pays off only" in warning
