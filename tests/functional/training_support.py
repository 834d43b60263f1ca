"""Helpers for the training handlers' functional tests: a run's state document up to start_training, held jobs,
and a record of the AWS calls a handler makes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
from infra_support import REGION, register
from lustrain_core.document import Code, Filesystem, MetricDefinition, Network, dumped

CODE_BUCKET = "lustrain-test-code"
RESULTS_BUCKET = "lustrain-test-results"
TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAAdGVzdC10b2tlbi1vbmU="

# the sections the steps before start_training make, built through the run document's own models
NETWORK = dumped(
    Network(
        vpc_id="vpc-0a1b2c3d4e5f60718",
        subnet_id="subnet-0f1e2d3c4b5a69788",
        security_group_ids=["sg-0123456789abcdef0"],
        availability_zone="us-east-1a",
        created=True,
    )
)
FILESYSTEM = dumped(
    Filesystem(
        file_system_id="fs-0123456789abcdef0",
        lifecycle="AVAILABLE",
        ready=True,
        mount_name="abcdef12",
        directory_path="/abcdef12/data",
        created=True,
    )
)


def code_section(job: dict[str, Any]) -> dict[str, Any]:
    name = job["spec"]["name"]
    key = f"code/{name}/{'0' * 64}/sourcedir.tar.gz"
    return dumped(
        Code(
            submit_directory=f"s3://lustrain-test-artifacts/{key}",
            bucket="lustrain-test-artifacts",
            key=key,
            sha256="0" * 64,
            uploaded=True,
            metric_definitions=[MetricDefinition(Name="train_loss", Regex=r"\btrain_loss=([0-9.]+)")],
        )
    )


def training_input(spec_doc: dict[str, Any] | None = None, token: str = TOKEN) -> dict[str, Any]:
    """start_training's input: a registered job (register_job on moto) and the sections the run adds before it."""
    doc = register(spec_doc)
    return {
        **doc,
        "network": dict(NETWORK),
        "filesystem": dict(FILESYSTEM),
        "code": code_section(doc["job"]),
        "task_token": token,
    }


@contextmanager
def held_training_jobs() -> Iterator[None]:
    """The twin's simulated training jobs stay InProgress/Starting (they never run) and are stopped afterwards."""
    from lustrain.twin import simulator

    before = simulator.settings()
    simulator.configure(start_delay_s=3600.0)
    try:
        yield
    finally:
        simulator.reset()
        simulator.configure(**before.__dict__)


@contextmanager
def calls_of(client: Any) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every operation `client` sends while the block runs, with its parameters, in order."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        seen.append((model.name, dict(params)))

    client.meta.events.register("provide-client-params", record)
    try:
        yield seen
    finally:
        client.meta.events.unregister("provide-client-params", record)


def token_item(table: str, name: str) -> dict[str, Any] | None:
    from lustrain_core.steps import records

    item = boto3.client("dynamodb", region_name=REGION).get_item(
        TableName=table, Key={"training_job_name": {"S": name}}, ConsistentRead=True
    )
    return records.from_item(item["Item"]) if "Item" in item else None


def move_job(name: str, status: str, secondary: str, reason: str | None = None) -> None:
    """What DescribeTrainingJob says of a held job from now on (the twin's job moves; no event is sent)."""
    from moto.sagemaker.models import sagemaker_backends

    from lustrain.twin.patches.sagemaker import _state

    _state(sagemaker_backends["123456789012"][REGION]).jobs[name]._move(status, secondary, reason)
