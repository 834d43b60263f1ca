"""The trainer reads its copy of the instance catalogue: the memory plan's hardware, the bf16 peak MFU is measured
against and the instance types that get the EFA defaults, so a type the control plane can plan the trainer knows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lustrain_trainer import distributed, plan

CATALOGUE = json.loads(
    (Path(__file__).resolve().parents[3] / "functions/lustrain_core/data/instance_types.json").read_text()
)["instance_types"]


def test_the_plan_knows_every_giant_type_with_its_gpus_and_memory() -> None:
    for name in (
        "ml.p4d.24xlarge",
        "ml.p5.48xlarge",
        "ml.p5e.48xlarge",
        "ml.p5en.48xlarge",
        "ml.p6-b200.48xlarge",
    ):
        hardware = plan.INSTANCES[name]
        assert hardware.gpus == CATALOGUE[name]["gpus"] == 8
        assert hardware.gpu_bytes == int(CATALOGUE[name]["gpu_memory_gib"] * plan.GIB)
    assert plan.INSTANCES["ml.p5en.48xlarge"].gpu_bytes == 141 * plan.GIB


def test_mfu_is_measured_against_the_instance_types_row_then_the_gpus_name() -> None:
    assert plan.peak_tflops("NVIDIA B200", "ml.p6-b200.48xlarge") == 2250.0
    assert plan.peak_tflops("NVIDIA H200", "ml.p5en.48xlarge") == 989.0
    assert plan.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0  # no SageMaker type named: the GPU's name
    assert plan.peak_tflops("NVIDIA B200") == 2250.0
    assert plan.peak_tflops("Some Future GPU", "ml.unknown.xlarge") is None


@pytest.mark.parametrize(
    ("instance_type", "efa"),
    [
        ("ml.p6-b200.48xlarge", True),
        ("ml.p5en.48xlarge", True),
        ("ml.g5.12xlarge", False),
        ("ml.m5.xlarge", False),
    ],
)
def test_efa_defaults_go_to_the_types_whose_row_has_efa(
    monkeypatch: pytest.MonkeyPatch, instance_type: str, efa: bool
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    added = distributed.apply_network_defaults({"SM_CURRENT_INSTANCE_TYPE": instance_type})
    assert bool(added) is efa
    assert plan.efa_interfaces(instance_type) == CATALOGUE[instance_type]["efa_interfaces"]
    # GPUDirect RDMA over EFA only where the row says so: the p6 and p5en rows do not (SageMaker's toolkit turns
    # it on for p4d and p4de alone)
    assert "FI_EFA_USE_DEVICE_RDMA" not in added


@pytest.mark.parametrize("instance_type", ["ml.p4d.24xlarge", "ml.p4de.24xlarge"])
def test_device_rdma_is_turned_on_where_sagemakers_toolkit_turns_it_on(
    monkeypatch: pytest.MonkeyPatch, instance_type: str
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert distributed.apply_network_defaults({"SM_CURRENT_INSTANCE_TYPE": instance_type})[
        "FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert CATALOGUE[instance_type]["efa_device_rdma"] is True
    assert sorted(t for t, row in CATALOGUE.items() if row.get("efa_device_rdma")) == [
        "ml.p4d.24xlarge", "ml.p4de.24xlarge"]
