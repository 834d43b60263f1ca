"""The patches as a whole: pinned to moto 5.2.5, installed once, and working in moto's server mode too."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import boto3
import moto
import pytest
import requests
from moto.awslambda.models import LambdaFunction
from moto.events.models import Rule
from moto.fsx.models import FSxBackend
from moto.server import ThreadedMotoServer
from twinhelpers import REGION, lambda_task, make_function, make_state_machine, run_execution

from lustrain.twin import patches
from lustrain.twin.patches import lambda_invoke


def test_installed_moto_is_the_version_the_patches_were_written_for() -> None:
    # If this fails, moto was upgraded: port lustrain/twin/patches to its internals before changing the pin.
    assert moto.__version__ == patches.MOTO_VERSION == "5.2.5"
    patches.check_moto_version()


def test_another_moto_version_is_refused_loudly() -> None:
    with pytest.raises(
        patches.MotoVersionMismatch, match=r"the twin patches moto 5\.2\.5's internals; upgrade them"
    ):
        patches.check_moto_version("5.3.0")


def test_install_is_idempotent_and_replaces_the_internals_it_names() -> None:
    patches.install()
    first = (LambdaFunction._invoke_lambda, Rule.send_to_targets, FSxBackend.create_file_system)

    patches.install()

    assert (LambdaFunction._invoke_lambda, Rule.send_to_targets, FSxBackend.create_file_system) == first
    assert LambdaFunction._invoke_lambda is lambda_invoke.invoke_in_process
    assert hasattr(FSxBackend, "create_data_repository_task")


@pytest.fixture
def moto_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's server in this process, as the twin's server mode runs it, executing ASL for real."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "MOTO_PORT": str(port),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    patches.install()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        requests.post(f"{endpoint}/moto-api/reset", timeout=10)
        requests.post(
            f"{endpoint}/moto-api/config", json={"stepfunctions": {"execute_state_machine": True}}, timeout=10
        )
        yield endpoint
    finally:
        requests.post(
            f"{endpoint}/moto-api/config",
            json={"stepfunctions": {"execute_state_machine": False}},
            timeout=10,
        )
        requests.post(f"{endpoint}/moto-api/reset", timeout=10)
        server.stop()


@pytest.mark.slow
def test_server_mode_runs_handlers_in_process_and_their_calls_reach_the_server(moto_server: str) -> None:
    session = boto3.Session(region_name=REGION)
    lambda_client = session.client("lambda", endpoint_url=moto_server)
    sfn = session.client("stepfunctions", endpoint_url=moto_server)
    session.client("s3", endpoint_url=moto_server).create_bucket(Bucket="seen-by-the-handler")
    iam = session.client("iam", endpoint_url=moto_server)
    function_arn = make_function(
        "check-quota", "twinfakes.check_quota.handler", lambda_client=lambda_client, iam=iam
    )

    direct = json.loads(lambda_client.invoke(FunctionName="check-quota", Payload=b"{}")["Payload"].read())
    machine = make_state_machine(
        "server-mode",
        {"StartAt": "Check", "States": {"Check": lambda_task(function_arn, End=True)}},
        sfn=sfn,
        iam=iam,
    )
    execution = run_execution(machine, {}, sfn=sfn)

    # The handler listed the server's buckets: AWS_ENDPOINT_URL pointed its boto3 at the server.
    assert direct == {"buckets": 1}
    assert execution["status"] == "SUCCEEDED"
    assert json.loads(execution["output"]) == {"buckets": 1}
