"""output.compression: how SageMaker uploads the model, chosen by the model's size unless the spec says."""

from __future__ import annotations

import pytest
from lustrain_core.errors import SpecInvalid
from lustrain_core.planner import GZIP_MAX_MODEL_GIB, plan
from lustrain_core.spec import validate_spec


def spec_with(output=None, hyperparameters=None, instance_count=2):
    doc = {
        "name": "gpt",
        "compute": {"instance_type": "ml.p4d.24xlarge", "instance_count": instance_count},
        "data": {"s3_uri": "s3://bkt/data/"},
        "output": {"s3_uri": "s3://bkt/out/", **(output or {})},
    }
    if hyperparameters:
        doc["code"] = {"source": "trainer/", "hyperparameters": hyperparameters}
    return validate_spec(doc)


def test_a_small_model_goes_up_as_one_model_tar_gz():
    out = plan(spec_with({"expected_size_gib": 1})).output
    assert out["compression"] == "GZIP" and out["model_bytes"] == 2**30


def test_a_model_above_the_threshold_goes_up_as_its_files_and_says_why():
    out = plan(spec_with({"expected_size_gib": GZIP_MAX_MODEL_GIB * 50})).output
    assert out["compression"] == "NONE"
    assert "output.compression: gzip" in out["compression_why"]


def test_the_trainers_preset_sizes_the_model_not_the_output_hint():
    # 6.4b parameters of fp32 weights: about 24 GiB, whatever output.expected_size_gib says
    out = plan(spec_with({"expected_size_gib": 1}, {"preset": "6.4b"}, instance_count=50)).output
    assert out["compression"] == "NONE" and out["model_bytes"] > GZIP_MAX_MODEL_GIB * 2**30


def test_the_spec_decides_when_it_says():
    assert plan(spec_with({"compression": "gzip", "expected_size_gib": 500})).output["compression"] == "GZIP"
    assert plan(spec_with({"compression": "none"})).output["compression"] == "NONE"


def test_an_unknown_compression_names_the_field_and_what_is_allowed():
    with pytest.raises(SpecInvalid) as info:
        spec_with({"compression": "zstd"})
    ((error,),) = [[e for e in info.value.errors if e.path == "output.compression"]]
    assert "gzip" in error.message and "none" in error.message
