"""The twin runs a job as its image would: a SageMaker PyTorch image below torch 2.12 keeps torchrun's fixed 30 s
between a forwarded SIGTERM and its workers' SIGKILL (TORCH_ELASTIC_SHUTDOWN_TIMEOUT is read from 2.12 on), which
the twin's newer torch would otherwise stretch; from 2.12, and for an image that is not SageMaker's PyTorch, nothing
is set."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lustrain.twin.simulator import container

ECR = "763104351884.dkr.ecr.us-east-1.amazonaws.com"


@pytest.mark.parametrize(
    ("image", "environment"),
    [
        (f"{ECR}/pytorch-training:2.8-gpu-py312", {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "30"}),
        (f"{ECR}/pytorch-training:2.11.0-gpu-py312-cu128-ubuntu22.04-sagemaker", {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "30"}),
        (f"{ECR}/pytorch-training:2.12-gpu-py312", {}),
        ("123456789012.dkr.ecr.us-east-1.amazonaws.com/our-own-trainer:1", {}),
    ],
)
def test_torchruns_grace_after_a_forwarded_sigterm_is_the_images(image: str, environment: dict[str, str]) -> None:
    job = SimpleNamespace(request={"AlgorithmSpecification": {"TrainingImage": image}})
    assert container.image_environment(job) == environment  # type: ignore[arg-type]
