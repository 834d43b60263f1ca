"""The secrets launcher in the job: reads code.secrets as the job's role, then becomes the entry point; a secret it
cannot read fails the job naming the variable and the ARN, never a value. And what the plan and the request make
of code.secrets (no value anywhere, the launcher as the program, the endpoints' cost)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from lustrain_core import launch_plan, planner, secrets_launcher
from lustrain_core.spec import load_spec
from lustrain_core.steps import code

SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:gpt/hf-AbCdEf"
PARAMETER = "arn:aws:ssm:us-east-1:123456789012:parameter/gpt/wandb"
VALUES = {SECRET: "hf_the-secret-value", PARAMETER: "wandb-the-secret-value"}
MINIMAL = "name: gpt\ndata: {s3_uri: s3://bkt/data/}\noutput: {s3_uri: s3://bkt/out/}\n"


class FakeClient:
    """Secrets Manager and SSM as the job's role sees them: VALUES, or AccessDenied for anything else."""

    def __init__(self, service: str, region: str, calls: list[tuple[str, str, str]]) -> None:
        self.service, self.region, self.calls = service, region, calls

    def _value(self, arn: str, operation: str) -> str:
        self.calls.append((self.service, self.region, operation))
        if arn not in VALUES:
            raise ClientError(
                {
                    "Error": {
                        "Code": "AccessDeniedException",
                        "Message": f"not authorized to perform on {arn}",
                    }
                },
                operation,
            )
        return VALUES[arn]

    def get_secret_value(self, SecretId: str) -> dict[str, Any]:
        return {"ARN": SecretId, "SecretString": self._value(SecretId, "GetSecretValue")}

    def get_parameter(self, Name: str, WithDecryption: bool) -> dict[str, Any]:
        assert WithDecryption is True
        return {
            "Parameter": {"Name": Name, "Type": "SecureString", "Value": self._value(Name, "GetParameter")}
        }


def clients(calls: list[tuple[str, str, str]]) -> Any:
    return lambda service, region: FakeClient(service, region, calls)


def test_each_secret_is_read_from_its_own_service_and_region():
    calls: list[tuple[str, str, str]] = []
    values = secrets_launcher.fetch({"HF_TOKEN": SECRET, "WANDB_API_KEY": PARAMETER}, clients(calls))
    assert values == {"HF_TOKEN": VALUES[SECRET], "WANDB_API_KEY": VALUES[PARAMETER]}
    assert sorted(calls) == [
        ("secretsmanager", "us-east-1", "GetSecretValue"),
        ("ssm", "us-east-1", "GetParameter"),
    ]


def test_a_secret_the_role_may_not_read_is_named_with_its_arn_and_aws_error():
    other = "arn:aws:secretsmanager:us-east-1:123456789012:secret:other/x-AbCdEf"
    with pytest.raises(secrets_launcher.SecretUnavailable) as info:
        secrets_launcher.fetch({"HF_TOKEN": SECRET, "OTHER": other}, clients([]))
    assert str(info.value).startswith(f"code.secrets.OTHER ({other}) could not be read: ClientError")
    assert "AccessDeniedException" in str(info.value) and "the-secret-value" not in str(info.value)


def test_a_binary_secret_is_refused():
    class Binary(FakeClient):
        def get_secret_value(self, SecretId: str) -> dict[str, Any]:
            return {"ARN": SecretId, "SecretBinary": b"\x00"}

    with pytest.raises(secrets_launcher.SecretUnavailable, match="SecretBinary"):
        secrets_launcher.fetch({"KEY": SECRET}, lambda service, region: Binary(service, region, []))


def launcher_dir(tmp_path: Path, secrets: dict[str, str]) -> Path:
    (tmp_path / secrets_launcher.SECRETS_FILE).write_text(
        json.dumps({"entry_point": "train.py", "secrets": secrets})
    )
    return tmp_path


def test_the_launcher_puts_the_values_in_its_environment_and_becomes_the_entry_point(tmp_path, monkeypatch):
    launcher_dir(tmp_path, {"HF_TOKEN": SECRET})
    monkeypatch.setattr(secrets_launcher, "__file__", str(tmp_path / secrets_launcher.LAUNCHER_FILE))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    execs: list[tuple[str, list[str], str | None]] = []
    monkeypatch.setattr(
        os, "execv", lambda path, argv: execs.append((path, argv, os.environ.get("HF_TOKEN")))
    )
    secrets_launcher.main(["lustrain_secrets_launcher.py", "--lr", "0.1"], clients([]))
    assert execs == [
        (sys.executable, [sys.executable, str(tmp_path / "train.py"), "--lr", "0.1"], VALUES[SECRET])
    ]


def test_a_secret_that_cannot_be_read_fails_the_job_with_a_failure_reason_and_no_entry_point(
    tmp_path, monkeypatch
):
    launcher_dir(tmp_path, {"OTHER": "arn:aws:ssm:us-east-1:123456789012:parameter/nope"})
    monkeypatch.setattr(secrets_launcher, "__file__", str(tmp_path / secrets_launcher.LAUNCHER_FILE))
    monkeypatch.setenv("SM_OUTPUT_DIR", str(tmp_path / "output"))
    monkeypatch.setattr(os, "execv", lambda *a: pytest.fail("the entry point must not start"))
    assert secrets_launcher.main(["launcher"], clients([])) == 1
    reason = (tmp_path / "output" / "failure").read_text()
    assert "code.secrets.OTHER (arn:aws:ssm:us-east-1:123456789012:parameter/nope)" in reason


def test_the_launcher_imports_nothing_of_lustrain():
    # it is copied into the bundle alone and runs on SageMaker's image: stdlib and boto3 only
    source = Path(secrets_launcher.__file__).read_text()
    imports = {
        line.split()[1].split(".")[0] for line in source.splitlines() if line.startswith(("import ", "from "))
    }
    assert imports <= {"__future__", "json", "os", "sys", "collections", "pathlib", "typing"}


def spec_with_secrets(extra: str = "") -> Any:
    return load_spec(
        MINIMAL + f"code: {{secrets: {{HF_TOKEN: '{SECRET}', WANDB_API_KEY: '{PARAMETER}'}}}}\n" + extra
    )


def test_with_secrets_the_bundle_carries_the_launcher_and_the_arns_but_no_value():
    spec = spec_with_secrets()
    files = dict(code.secrets_launcher_files(spec, ["train.py"]))
    assert files[secrets_launcher.LAUNCHER_FILE] == Path(secrets_launcher.__file__).read_bytes()
    assert json.loads(files[secrets_launcher.SECRETS_FILE]) == {
        "entry_point": "train.py",
        "secrets": {"HF_TOKEN": SECRET, "WANDB_API_KEY": PARAMETER},
    }
    assert code.secrets_launcher_files(load_spec(MINIMAL), ["train.py"]) == []


def test_a_source_holding_the_launchers_name_is_refused():
    with pytest.raises(Exception, match="rename it") as info:
        code.secrets_launcher_files(spec_with_secrets(), ["train.py", secrets_launcher.LAUNCHER_FILE])
    assert [e.path for e in info.value.errors] == ["code.source"]


def test_with_secrets_sagemaker_runs_the_launcher_and_the_environment_holds_no_secret():
    spec = spec_with_secrets()
    hps = launch_plan.hyperparameters(spec, "s3://b/k/sourcedir.tar.gz", "us-east-1")
    assert json.loads(hps["sagemaker_program"]) == secrets_launcher.LAUNCHER_FILE
    assert (
        json.loads(launch_plan.hyperparameters(load_spec(MINIMAL), "", "us-east-1")["sagemaker_program"])
        == "train.py"
    )
    shown = json.dumps([hps, launch_plan.environment(spec)])
    assert "HF_TOKEN" not in shown and "the-secret-value" not in shown


def test_the_plan_prices_one_interface_endpoint_per_service_for_the_runs_hours():
    plain = planner.plan(load_spec(MINIMAL + "compute: {max_runtime_hours: 10}\n"), data_gib=100)
    with_secrets = planner.plan(spec_with_secrets("compute: {max_runtime_hours: 10}\n"), data_gib=100)
    # Secrets Manager and SSM: two endpoints at $0.01 per AZ-hour for the 10 h run and its hour of building
    assert (plain.cost.network_usd, with_secrets.cost.network_usd) == (0.0, 0.22)
    assert with_secrets.cost.total_usd == pytest.approx(plain.cost.total_usd + 0.22, abs=0.011)
    assert with_secrets.cost.hourly_usd == pytest.approx(plain.cost.hourly_usd + 0.02, abs=0.011)
    assert any("$0.02/h" in a and "secretsmanager, ssm" in a for a in with_secrets.cost.assumptions)
