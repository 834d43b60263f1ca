"""The secrets launcher in the job: reads code.secrets as the job's role, then becomes the entry point; a secret it
cannot read fails the job naming the variable and the ARN, never a value. And what the plan and the request make
of code.secrets (no value anywhere, the launcher as the program, the endpoints' cost)."""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
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
    assert imports <= {
        "__future__",
        "contextlib",
        "hashlib",
        "json",
        "os",
        "stat",
        "sys",
        "tempfile",
        "time",
        "collections",
        "pathlib",
        "typing",
    }


def ranks(rank: int, size: int) -> dict[str, str]:
    """The variables torchrun sets in each worker of one host (one agent, first start)."""
    return {
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(size),
        "TORCHELASTIC_RUN_ID": "none",
        "TORCHELASTIC_RESTART_COUNT": "0",
    }


def host(tmp_path: Path, size: int, secrets: dict[str, str]) -> tuple[dict[int, Any], list[Any]]:
    """Every local rank of a p4d-sized host, as threads with torchrun's variables: the others started before rank
    0, which runs last. What each got (values or the error) and every call that reached AWS."""
    calls: list[Any] = []
    got: dict[int, Any] = {}

    def worker(rank: int) -> None:
        try:
            got[rank] = secrets_launcher.host_values(
                secrets, clients(calls), env=ranks(rank, size), directory=tmp_path, wait_s=60, parent=4242
            )
        except secrets_launcher.SecretUnavailable as error:
            got[rank] = error

    others = [threading.Thread(target=worker, args=(rank,)) for rank in range(1, size)]
    for thread in others:
        thread.start()
    worker(0)
    for thread in others:
        thread.join()
    return got, calls


def test_under_torchrun_only_local_rank_0_reads_and_every_rank_gets_the_values(tmp_path):
    got, calls = host(tmp_path, 8, {"HF_TOKEN": SECRET, "WANDB_API_KEY": PARAMETER})
    # one read per secret for the host's 8 processes, not 16
    assert sorted(calls) == [
        ("secretsmanager", "us-east-1", "GetSecretValue"),
        ("ssm", "us-east-1", "GetParameter"),
    ]
    assert got == {
        rank: {"HF_TOKEN": VALUES[SECRET], "WANDB_API_KEY": VALUES[PARAMETER]} for rank in range(8)
    }
    # the last reader deleted the hand-off file and the readers' markers
    assert list(tmp_path.iterdir()) == []


def test_the_handoff_file_is_written_whole_with_mode_0600_and_no_temporary_file_is_left(tmp_path):
    values = secrets_launcher.host_values(
        {"HF_TOKEN": SECRET}, clients([]), env=ranks(0, 2), directory=tmp_path, parent=4242
    )
    [left] = list(tmp_path.iterdir())
    assert left.name == secrets_launcher.handoff_name(ranks(0, 2), 4242)
    assert stat.S_IMODE(left.stat().st_mode) == 0o600
    assert json.loads(left.read_text()) == {"values": values}


def test_a_secret_rank_0_cannot_read_fails_every_rank_of_the_host_with_its_reason_without_waiting(tmp_path):
    nope = "arn:aws:ssm:us-east-1:123456789012:parameter/nope"
    got, calls = host(tmp_path, 4, {"OTHER": nope})
    assert len(calls) == 1
    reasons = {rank: str(error) for rank, error in got.items()}
    assert set(reasons.values()) == {reasons[0]}
    assert reasons[0].startswith(f"code.secrets.OTHER ({nope}) could not be read: ClientError")
    assert list(tmp_path.iterdir()) == []


def test_a_rank_whose_values_never_come_fails_at_its_bound_naming_the_wait(tmp_path):
    with pytest.raises(secrets_launcher.SecretUnavailable) as info:
        secrets_launcher.host_values(
            {"HF_TOKEN": SECRET}, clients([]), env=ranks(3, 8), directory=tmp_path, wait_s=0.05, parent=4242
        )
    assert "local rank 3 waited 0.05 s for the values local rank 0 reads" in str(info.value)


def test_a_handoff_file_others_could_read_is_refused(tmp_path):
    name = secrets_launcher.handoff_name(ranks(1, 2), 4242)
    (tmp_path / name).write_text(json.dumps({"values": {"HF_TOKEN": "planted"}}))
    (tmp_path / name).chmod(0o644)
    with pytest.raises(secrets_launcher.SecretUnavailable, match="mode 0600"):
        secrets_launcher.host_values(
            {"HF_TOKEN": SECRET}, clients([]), env=ranks(1, 2), directory=tmp_path, parent=4242
        )


def test_a_restarted_worker_group_reads_again_into_a_new_file():
    first = secrets_launcher.handoff_name(ranks(0, 8), 4242)
    again = secrets_launcher.handoff_name({**ranks(0, 8), "TORCHELASTIC_RESTART_COUNT": "1"}, 4242)
    other_agent = secrets_launcher.handoff_name(ranks(0, 8), 4343)
    assert len({first, again, other_agent}) == 3


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"LOCAL_RANK": "1"}, "LOCAL_WORLD_SIZE=None"),
        ({"LOCAL_RANK": "x", "LOCAL_WORLD_SIZE": "8"}, "LOCAL_RANK='x'"),
        ({"LOCAL_RANK": "8", "LOCAL_WORLD_SIZE": "8"}, "LOCAL_RANK=8 must be below LOCAL_WORLD_SIZE=8"),
    ],
)
def test_local_ranks_torchrun_would_not_set_are_refused_naming_the_variable(env, named):
    with pytest.raises(secrets_launcher.SecretUnavailable, match=named):
        secrets_launcher.local_ranks(env)


def test_a_process_started_alone_reads_its_secrets_itself_and_leaves_no_file(tmp_path):
    calls: list[Any] = []
    values = secrets_launcher.host_values({"HF_TOKEN": SECRET}, clients(calls), env={}, directory=tmp_path)
    assert values == {"HF_TOKEN": VALUES[SECRET]} and len(calls) == 1
    assert list(tmp_path.iterdir()) == []


def test_without_dev_shm_the_ranks_meet_in_a_0700_directory_of_their_own(tmp_path, monkeypatch):
    monkeypatch.setattr(secrets_launcher, "HANDOFF_DIR", tmp_path / "no-shm")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    where = secrets_launcher.handoff_dir()
    assert where == tmp_path / f"lustrain-secrets-{os.getuid()}"
    assert stat.S_IMODE(where.stat().st_mode) == 0o700
    assert secrets_launcher.handoff_dir() == where  # the host's other ranks find the same one
    where.chmod(0o755)
    with pytest.raises(secrets_launcher.SecretUnavailable, match="mode 0700"):
        secrets_launcher.handoff_dir()


def test_a_local_rank_other_than_0_becomes_the_entry_point_with_rank_0s_values(tmp_path, monkeypatch):
    launcher_dir(tmp_path, {"HF_TOKEN": SECRET})
    handoff = tmp_path / "shm"
    handoff.mkdir()
    monkeypatch.setattr(secrets_launcher, "__file__", str(tmp_path / secrets_launcher.LAUNCHER_FILE))
    for name, value in ranks(1, 2).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    secrets_launcher.publish(
        handoff, secrets_launcher.handoff_name(ranks(1, 2), os.getppid()), {"values": {"HF_TOKEN": "from-0"}}
    )
    execs: list[str | None] = []
    monkeypatch.setattr(os, "execv", lambda path, argv: execs.append(os.environ.get("HF_TOKEN")))
    calls: list[Any] = []
    secrets_launcher.main(["launcher"], clients(calls), handoff=handoff)
    assert (execs, calls, list(handoff.iterdir())) == (["from-0"], [], [])


def test_the_launchers_clients_retry_adaptively_and_share_one_client_per_service():
    client = secrets_launcher.boto3_client("ssm", "us-east-1")
    assert client.meta.config.retries == {
        "mode": "adaptive",
        "total_max_attempts": secrets_launcher.MAX_ATTEMPTS,
    }
    made: list[str] = []

    def factory(service: str, region: str) -> Any:
        made.append(service)
        return FakeClient(service, region, [])

    second = "arn:aws:ssm:us-east-1:123456789012:parameter/gpt/other"
    VALUES[second] = "second-value"
    try:
        secrets_launcher.fetch({"A": PARAMETER, "B": second}, factory)
    finally:
        del VALUES[second]
    assert made == ["ssm"]


def test_the_launcher_does_not_claim_sigterm_reaches_the_trainer():
    # SageMaker's PyTorch image drops SIGTERM (bash as PID 1; sagemaker-training-toolkit #125, #173)
    doc = secrets_launcher.__doc__ or ""
    assert "SIGTERM reaches" not in doc and "drops SIGTERM" in doc and "stop request" in doc


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
