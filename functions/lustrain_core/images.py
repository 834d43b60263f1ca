"""The SageMaker PyTorch training image (DLC) for a framework version, region and instance type.

Resolved from data/pytorch_images.json, an extract of the sagemaker SDK's own image-URI config (the SDK is too
big for the Lambda bundle), following the SDK's `image_uris.retrieve(framework="pytorch", image_scope="training")`
step by step. tests/unit/test_images.py checks the two agree; scripts/refresh_images.py refreshes the extract.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from typing import Any

from lustrain_core.errors import SpecInvalid

ECR_URI_TEMPLATE = "{registry}.dkr.{hostname}/{repository}:{tag}"

# The SDK sends these families to other image configs (Neuron, Graviton), which lustrain does not extract.
_NEURON_PREFIXES = ("inf", "trn")
_GRAVITON_FAMILIES = frozenset({"m6g", "m6gd", "c6g", "c6gd", "c6gn", "c7g", "r6g", "r6gd"})


@cache
def _config() -> dict[str, Any]:
    text = resources.files("lustrain_core").joinpath("data/pytorch_images.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def available_versions() -> list[str]:
    """Every framework_version a spec may name: the full versions and their short aliases (2.8 -> 2.8.0)."""
    config = _config()
    return sorted({*config["versions"], *config["version_aliases"]}, key=_version_key)


def instance_family(instance_type: str) -> str:
    """ml.p4d.24xlarge -> p4d (the SDK's own rule)."""
    match = re.match(r"^ml[._]([a-z\d\-]+)\.?\w*$", instance_type)
    return match[1] if match else ""


def _processor(family: str, processors: list[str]) -> str:
    if family in processors:
        return family
    return "gpu" if family[:1] in ("g", "p") else "cpu"


def pytorch_training_image(framework_version: str, region: str, instance_type: str) -> str:
    """The ECR URI of the PyTorch training DLC, e.g. 763104351884.dkr.ecr.us-east-1.amazonaws.com/
    pytorch-training:2.8-gpu-py312. The tag keeps the version as given, as the SDK does (2.8 -> "2.8-...")."""
    config = _config()
    family = instance_family(instance_type)
    if not family:
        raise SpecInvalid.one(
            "compute.instance_type", instance_type, "a SageMaker instance type like ml.p4d.24xlarge"
        )
    if family.startswith(_NEURON_PREFIXES) or family in _GRAVITON_FAMILIES:
        raise SpecInvalid.one(
            "compute.instance_type",
            instance_type,
            "lustrain resolves PyTorch images for GPU and x86 CPU instances only: give image.uri for this type",
        )
    resolved = config["version_aliases"].get(framework_version, framework_version)
    entry = config["versions"].get(resolved)
    if entry is None:
        raise SpecInvalid.one(
            "image.framework_version",
            framework_version,
            f"no SageMaker PyTorch training image for this version; available: {', '.join(available_versions())}",
        )
    registry = entry["registries"].get(region)
    hostname = config["ecr_hostnames"].get(region)
    if registry is None or hostname is None:
        raise SpecInvalid.one(
            "image.framework_version",
            framework_version,
            f"no SageMaker PyTorch training image for this version in region {region}: give image.uri instead",
        )
    if family == "p2":
        raise SpecInvalid.one(
            "compute.instance_type",
            instance_type,
            "SageMaker dropped p2 instances for PyTorch 1.13 and later: use a newer GPU type such as ml.g5",
        )
    processor = _processor(family, config["processors"])
    container_version = entry.get("container_version", {}).get(processor)
    tag_processor = processor if entry.get("processor_in_tag", True) else None
    # the config's one Python version for each version lustrain extracts; the newest if it ever lists more
    py_version = entry["py_versions"][-1]
    tag_prefix = entry.get("tag_prefix", framework_version)
    tag = "-".join(part for part in (tag_prefix, tag_processor, py_version, container_version) if part)
    return ECR_URI_TEMPLATE.format(
        registry=registry, hostname=hostname, repository=entry["repository"], tag=tag
    )


@cache
def _prepare_config() -> dict[str, Any]:
    text = resources.files("lustrain_core").joinpath("data/prepare_image.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def prepare_image(region: str) -> str:
    """The image data preparation's processing jobs run in: the Hugging Face PyTorch training DLC, e.g.
    763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-training:2.8.0-transformers4.56.2-gpu-py312-
    cu129-ubuntu22.04, as the SDK's image_uris.retrieve("huggingface", ...) names it.

    Why this image: the job runs in the run's private subnet, where nothing can be pip-installed, and a bpe:VOCAB
    tokenizer needs Hugging Face `tokenizers`; the PyTorch DLC does not list it, the Hugging Face DLC installs
    transformers (which requires tokenizers) on top of the PyTorch DLC (numpy, boto3). Only a GPU build is
    published; it runs on the CPU instances preparation uses (nothing in preparation touches CUDA), at the cost of
    a larger image to pull."""
    config = _prepare_config()
    registry = config["registries"].get(region)
    hostname = config["ecr_hostnames"].get(region)
    if registry is None or hostname is None:
        raise SpecInvalid.one(
            "region",
            region,
            "no Hugging Face PyTorch training image in this region (data preparation's image): "
            f"regions: {', '.join(sorted(config['registries']))}",
        )
    processor = config["processors"][-1]
    pytorch = config["base_framework_version"].removeprefix("pytorch")
    tag = "-".join(
        (
            f"{pytorch}-transformers{config['transformers_version']}",
            processor,
            config["py_version"],
            config["container_version"][processor],
        )
    )
    return ECR_URI_TEMPLATE.format(
        registry=registry, hostname=hostname, repository=config["repository"], tag=tag
    )


#: SageMaker's PyTorch training images' tags begin with their framework version ("2.8-gpu-py312", "2.8.0-gpu-...")
_TAG_VERSION = re.compile(r"^(\d+\.\d+(?:\.\d+)?)-")


def pytorch_training_version(image_uri: str) -> str | None:
    """The framework version of one of SageMaker's PyTorch training images (its repository and registries, from
    the same config), or None for any other image. The twin runs such an image's entry point as that image does
    (lustrain/twin/simulator: a first process that does not pass SIGTERM on)."""
    config = _config()
    match = re.fullmatch(r"(\d{12})\.dkr\.[^/]+/([^:@]+):([^@]+)", image_uri)
    if match is None:
        return None
    registry, repository, tag = match.groups()
    entries = config["versions"].values()
    if not any(
        entry.get("repository") == repository and registry in entry.get("registries", {}).values()
        for entry in entries
    ):
        return None
    version = _TAG_VERSION.match(tag)
    return version[1] if version else None
