"""The PyTorch training image: lustrain's extract resolves exactly what the sagemaker SDK resolves."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest
from lustrain_core.errors import SpecInvalid
from lustrain_core.images import available_versions, prepare_image, pytorch_training_image

REPO = Path(__file__).resolve().parents[2]
REGIONS = (
    "us-east-1",
    "us-west-2",
    "eu-west-1",
    "ap-northeast-1",
    "cn-north-1",
    "il-central-1",
    "af-south-1",
)
INSTANCE_TYPES = ("ml.p4d.24xlarge", "ml.p5.48xlarge", "ml.g5.12xlarge", "ml.m5.xlarge", "ml.c5.xlarge")


@pytest.fixture
def image_uris(monkeypatch):
    """The sagemaker SDK's resolver (importing the SDK alone takes seconds: only the slow tests ask for it).

    The SDK rereads pytorch.json and botocore's endpoints on every call (~0.25 s); the answers do not change."""
    from sagemaker.core import common_utils, image_uris

    monkeypatch.setattr(image_uris, "config_for_framework", functools.cache(image_uris.config_for_framework))
    monkeypatch.setattr(common_utils, "_botocore_resolver", functools.cache(common_utils._botocore_resolver))
    return image_uris


def _refresh_script():
    spec = importlib.util.spec_from_file_location("refresh_images", REPO / "scripts" / "refresh_images.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_committed_extract_is_what_the_installed_sdk_would_give(image_uris):
    """Guards an SDK upgrade that changes tags or registries: refresh the data file to make this pass."""
    script = _refresh_script()
    assert script.DATA_FILE.read_text() == script.render(script.extract())
    assert script.PREPARE_FILE.read_text() == script.render(script.extract_prepare())


@pytest.mark.slow
@pytest.mark.parametrize("region", REGIONS[:3])
def test_the_preparation_image_is_what_the_sdk_names(image_uris, region):
    """The Hugging Face DLC is published for GPU only: the SDK is asked for a GPU instance type; the processing
    job runs the same image on a CPU instance."""
    expected = image_uris.retrieve(
        "huggingface",
        region,
        version="4.56.2",
        base_framework_version="pytorch2.8.0",
        py_version="py312",
        instance_type="ml.g5.xlarge",
        image_scope="training",
    )
    assert prepare_image(region) == expected


@pytest.mark.slow
@pytest.mark.parametrize("region", REGIONS)
def test_every_version_and_instance_type_agrees_with_the_sdk(image_uris, region):
    for version in available_versions():
        for instance_type in INSTANCE_TYPES:
            py_version = image_uris.list_py_versions("pytorch", version, image_scope="training")[-1]
            expected = image_uris.retrieve(
                "pytorch",
                region,
                version=version,
                py_version=py_version,
                instance_type=instance_type,
                image_scope="training",
            )
            assert pytorch_training_image(version, region, instance_type) == expected, (
                version,
                instance_type,
            )


def test_the_field_guides_p4d_image():
    assert (
        pytorch_training_image("2.8", "us-east-1", "ml.p4d.24xlarge")
        == "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8-gpu-py312"
    )
    assert pytorch_training_image("2.8.0", "eu-west-1", "ml.m5.xlarge").endswith(
        "pytorch-training:2.8.0-cpu-py312"
    )


def test_the_preparation_image_is_the_hugging_face_dlc_and_a_region_without_it_is_named():
    assert prepare_image("us-east-1") == (
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-training:"
        "2.8.0-transformers4.56.2-gpu-py312-cu129-ubuntu22.04"
    )
    with pytest.raises(SpecInvalid, match="no Hugging Face PyTorch training image in this region"):
        prepare_image("xx-nowhere-1")


def test_versions_offered_start_where_torchrun_is_supported():
    versions = available_versions()
    assert "1.13" in versions and "2.8" in versions and "2.8.0" in versions
    assert "1.12" not in versions


def test_an_unknown_version_names_the_available_ones():
    with pytest.raises(SpecInvalid) as info:
        pytorch_training_image("9.9", "us-east-1", "ml.p4d.24xlarge")
    (error,) = info.value.errors
    assert error.path == "image.framework_version"
    assert "2.8" in error.message and "1.13" in error.message


def test_a_region_without_images_says_so():
    with pytest.raises(SpecInvalid) as info:
        pytorch_training_image("2.8", "xx-nowhere-1", "ml.p4d.24xlarge")
    assert "xx-nowhere-1" in str(info.value) and "image.uri" in str(info.value)


@pytest.mark.parametrize(
    "instance_type", ["ml.trn1.32xlarge", "ml.inf2.xlarge", "ml.c6g.xlarge", "ml.p2.xlarge"]
)
def test_instance_types_without_an_extracted_image_are_refused_at_the_instance_type(instance_type):
    with pytest.raises(SpecInvalid) as info:
        pytorch_training_image("2.8", "us-east-1", instance_type)
    assert info.value.errors[0].path == "compute.instance_type"
