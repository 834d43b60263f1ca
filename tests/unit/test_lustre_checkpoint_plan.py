"""checkpoints.to_filesystem without AWS: the planner sizes Lustre for the checkpoints, the trainer writes to the
Lustre channel, the export requests are FSx's, and the export adds no state to the execution's history."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from lustrain_core import planner
from lustrain_core.errors import SpecInvalid
from lustrain_core.spec import validate_spec
from lustrain_core.steps import exports


def spec_with(**sections):
    doc = {
        "name": "gpt",
        "data": {"s3_uri": "s3://bkt/data/", "size_gib": 100},
        "output": {"s3_uri": "s3://bkt/o/"},
    }
    doc.update(sections)
    return validate_spec(doc)


def giant(to_filesystem: bool, **hyperparameters):
    """The field guide's fleet (50 x p4d) training the trainer's 70b preset, reading 10 MB/s a GPU."""
    return spec_with(
        compute={"instance_type": "ml.p4d.24xlarge", "instance_count": 50},
        code={
            "source": "trainer/",
            "hyperparameters": {"preset": "gpt-64b", "activation_checkpointing": "true", **hyperparameters},
        },
        data={"s3_uri": "s3://bkt/data/", "size_gib": 100, "ingest_mb_s_per_gpu": 10},
        checkpoints={"to_filesystem": to_filesystem},
        # checkpoints on Lustre need a file system that survives a file server (scratch keeps one copy)
        filesystem={"deployment_type": "persistent"},
    )


def test_a_70b_runs_checkpoint_bursts_decide_lustres_size_and_its_checkpoints_are_held():
    fs = planner.plan(giant(True)).filesystem
    ckpt = fs.checkpoints
    assert ckpt is not None
    # 12 bytes a parameter (fp32 weights and Adam's two moments): hundreds of GB for a 70B-class model
    assert 700 < ckpt["state_gb"] < 900
    assert (ckpt["kept"], ckpt["held_at_once"]) == (2, 3)
    assert ckpt["burst_mb_s"] == pytest.approx(
        ckpt["state_gb"] * 1000 / planner.CHECKPOINT_WRITE_TARGET_S, rel=1e-3
    )
    assert fs.decided_by == "checkpoint bursts" and "sized by throughput for checkpoint bursts" in fs.reason
    # the file system writes a checkpoint within the target and holds all three
    assert fs.throughput_mb_s >= fs.demand_mb_s >= ckpt["burst_mb_s"]
    assert fs.storage_gib >= ckpt["kept_gib"]
    # without checkpoints on Lustre the same run is refused: each restart would copy both kept checkpoints to every
    # host through SageMaker's sync, for far longer than a restart may take
    with pytest.raises(SpecInvalid) as refused:
        planner.plan(giant(False))
    assert [e.path for e in refused.value.errors] == ["checkpoints.to_filesystem"]


def test_keeping_more_checkpoints_holds_more_on_lustre():
    two = planner.plan(giant(True)).filesystem.checkpoints
    five = planner.plan(giant(True, keep_checkpoints=5)).filesystem.checkpoints
    assert two is not None and five is not None
    assert five["held_at_once"] == 6 and five["kept_gib"] == pytest.approx(2 * two["kept_gib"], rel=1e-3)


def test_a_checkpoint_of_unknown_size_is_not_sized_and_the_plan_says_so():
    p = planner.plan(spec_with(checkpoints={"to_filesystem": True}, filesystem={"deployment_type": "persistent"}))
    assert p.filesystem.checkpoints is None
    assert any(
        w.startswith("checkpoints.to_filesystem: the checkpoints' size is unknown") for w in p.warnings
    )


def test_the_planners_kept_checkpoints_are_the_trainers_default():
    from lustrain_trainer.hparams import Hyperparameters

    defaults = {f.name: f.default for f in dataclasses.fields(Hyperparameters)}
    assert defaults["keep_checkpoints"] == planner.TRAINER_KEEP_CHECKPOINTS


def test_the_trainer_writes_to_the_lustre_channel_when_the_job_has_one():
    from lustrain_trainer.hparams import parse, resolve_paths

    env = {
        "SM_CHANNEL_TRAINING": "/opt/ml/input/data/training",
        "SM_CHANNEL_CHECKPOINTS": "/opt/ml/input/data/checkpoints",
        "SM_TRAINING_ENV": "{}",
    }
    _, given, _ = parse([], env)
    assert resolve_paths(given, env, []).checkpoints == Path("/opt/ml/input/data/checkpoints")
    without = {k: v for k, v in env.items() if k != "SM_CHANNEL_CHECKPOINTS"}
    assert resolve_paths(given, without, []).checkpoints == Path("/opt/ml/checkpoints")


def test_an_export_request_is_one_fsx_takes_and_names_the_run_and_the_export():
    import botocore.session
    from botocore.validate import validate_parameters

    request = exports.export_request(
        "fs-0123456789abcdef0", ["/lustrain-checkpoints/r-1"], "r-1", "stack", "teardown"
    )
    model = botocore.session.get_session().get_service_model("fsx")
    validate_parameters(request, model.operation_model("CreateDataRepositoryTask").input_shape)
    assert request["Paths"] == ["lustrain-checkpoints/r-1"] and request["Report"] == {"Enabled": False}
    assert {t["Key"]: t["Value"] for t in request["Tags"]}["lustrain:export"] == "teardown"
    with pytest.raises(ValueError, match="1 to 100 paths"):
        exports.task_paths(["/"])
    with pytest.raises(ValueError, match="1 to 100 paths"):
        exports.task_paths([f"/p{i}" for i in range(101)])
