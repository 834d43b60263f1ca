"""code.secrets end to end on the twin: a Secrets Manager secret and an SSM SecureString reach the training process
through the run's interface endpoints, as its role, and their values appear nowhere a run leaves its traces: the
jobs table, the execution history, the notice, the archive (DescribeTrainingJob included) and the job's request.
The job's own code, with its role, reads no other secret of its team (only those its spec names), nor another run's
checkpoint."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from lustrain.twin import rehearse as rehearsal
from lustrain.twin.rehearse import REGION, STACK_NAME, operator_session, rehearse

pytestmark = pytest.mark.slow

QUICK = Path(__file__).with_name("quick.yaml")
TOKEN = "hf_twin-secret-0f3c9a7b51d24e86"
PASSWORD = "wandb-twin-secret-77aa01c2"
#: what the entry point proves it saw: the values' digests, never the values
SEEN = {
    name: hashlib.sha256(value.encode()).hexdigest()
    for name, value in (("HF_TOKEN", TOKEN), ("DB_PASSWORD", PASSWORD))
}

ENTRY_POINT = """
import hashlib, json, os
from pathlib import Path

seen = {name: hashlib.sha256(os.environ[name].encode()).hexdigest() for name in ("HF_TOKEN", "DB_PASSWORD")}
model = Path(os.environ["SM_MODEL_DIR"])
model.mkdir(parents=True, exist_ok=True)
(model / "seen.json").write_text(json.dumps(seen))
print("step=1 train_loss=1.0 tokens_per_s=1", flush=True)
print("secrets seen " + json.dumps(seen, sort_keys=True), flush=True)

# the job's own code, with its role, asks for a secret and a parameter of its team that the spec does not name,
# and reads, writes, deletes and lists another run's checkpoints; and writes and lists in its own run's folder:
# what each call answered goes in the model, which the archive keeps
import boto3
from botocore.exceptions import ClientError

bucket, theirs = os.environ["OTHER_RUN_BUCKET"], os.environ["OTHER_RUN_KEY"]
own = "default/" + os.environ["TRAINING_JOB_NAME"].rsplit("-", 1)[0] + "/"
asked = {}
for what, service, call, params in (
    ("unnamed secret", "secretsmanager", "get_secret_value", {"SecretId": os.environ["NOT_NAMED_SM"]}),
    ("unnamed parameter", "ssm", "get_parameter", {"Name": os.environ["NOT_NAMED_SSM"], "WithDecryption": True}),
    ("other run", "s3", "get_object", {"Bucket": bucket, "Key": theirs}),
    ("other run write", "s3", "put_object", {"Bucket": bucket, "Key": theirs, "Body": b"planted"}),
    ("other run delete", "s3", "delete_object", {"Bucket": bucket, "Key": theirs}),
    ("other run list", "s3", "list_objects_v2", {"Bucket": bucket, "Prefix": theirs.rsplit("/", 2)[0] + "/"}),
    ("own write", "s3", "put_object", {"Bucket": bucket, "Key": own + "written-by-its-code.txt", "Body": b"mine"}),
    ("own list", "s3", "list_objects_v2", {"Bucket": bucket, "Prefix": own}),
):
    try:
        getattr(boto3.client(service), call)(**params)
        asked[what] = "done"
    except ClientError as refused:
        asked[what] = refused.response["Error"]["Code"]
# and writes into another run's log stream: the run's private subnet has no route to CloudWatch Logs (no NAT, no
# logs endpoint; SageMaker's agent writes the job's own streams from outside it), so the call never gets there
from botocore.config import Config
from botocore.exceptions import EndpointConnectionError

try:
    boto3.client("logs", config=Config(retries={"max_attempts": 1}, connect_timeout=5)).put_log_events(
        logGroupName="/aws/sagemaker/TrainingJobs", logStreamName="other-0000abcd-1/algo-1-1700000000",
        logEvents=[{"timestamp": 1700000000000, "message": "step=999999 train_loss=0.0"}],
    )
    asked["other run log"] = "done"
except EndpointConnectionError:
    asked["other run log"] = "no route"
except ClientError as refused:
    asked["other run log"] = refused.response["Error"]["Code"]
(model / "asked.json").write_text(json.dumps(asked, sort_keys=True))
"""
#: a run of the same team, whose checkpoint the job's own code asks for
OTHER_RUN = ("lustrain-example-results", "default/other-0000abcd/checkpoints/step-00000001.pt")


def spec_file(tmp_path: Path, secrets: dict[str, str]) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(ENTRY_POINT)
    doc = yaml.safe_load(QUICK.read_text())
    doc["name"] = "secrets"
    # two instances under torchrun: the launcher runs in each worker and hands it over to the entry point
    doc["compute"]["instance_count"] = 2
    doc["code"] = {
        "source": str(code),
        "entry_point": "train.py",
        "distribution": "torchrun",
        "secrets": secrets,
        "environment": {
            "NOT_NAMED_SM": f"{STACK_NAME}/default/not-named",
            "NOT_NAMED_SSM": f"/{STACK_NAME}/default/not-named",
            "OTHER_RUN_BUCKET": OTHER_RUN[0],
            "OTHER_RUN_KEY": OTHER_RUN[1],
        },
    }
    path = tmp_path / "secrets.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def everything_as_text(stack: Any, result: Any, queue: str) -> dict[str, str]:
    """Every trace of the run, each as the text a reader of it would see."""
    session = operator_session()
    ddb, sfn, s3, sqs = (session.client(s) for s in ("dynamodb", "stepfunctions", "s3", "sqs"))
    traces: dict[str, str] = {}
    tables = [r.ref for r in stack.resources.values() if r.type == "AWS::DynamoDB::Table"]
    traces["tables"] = json.dumps([ddb.scan(TableName=t)["Items"] for t in tables], default=str)
    history = sfn.get_paginator("get_execution_history").paginate(executionArn=result.execution_arn)
    traces["history"] = json.dumps([e for page in history for e in page["events"]], default=str)
    traces["notices"] = json.dumps(
        sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", [])
    )
    bucket, _, prefix = result.archive.removeprefix("s3://").partition("/")
    archived = []
    for obj in result.archive_objects:
        body = s3.get_object(Bucket=bucket, Key=prefix + obj["key"])["Body"].read()
        if obj["key"].endswith(".tar.gz"):
            with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                body = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())  # type: ignore[union-attr]
        archived.append(f"{obj['key']}: {body.decode(errors='replace')}")
    traces["archive"] = "\n".join(archived)
    sagemaker = session.client("sagemaker")
    traces["training jobs"] = json.dumps(
        [sagemaker.describe_training_job(TrainingJobName=a["training_job_name"]) for a in result.attempts],
        default=str,
    )
    return traces


def test_the_trainer_sees_its_secrets_and_their_values_are_nowhere_else(tmp_path, monkeypatch):
    account = "123456789012"
    secret_arn = f"arn:aws:secretsmanager:{REGION}:{account}:secret:{STACK_NAME}/default/hf-token"
    parameter_arn = f"arn:aws:ssm:{REGION}:{account}:parameter/{STACK_NAME}/default/db-password"
    path = spec_file(tmp_path, {"HF_TOKEN": secret_arn, "DB_PASSWORD": parameter_arn})
    queue: dict[str, str] = {}
    fill_data = rehearsal.ensure_data

    def with_secrets_and_a_notice_queue(spec: Any, say: Any, tokenizer: str = "bytes") -> None:
        # in the stack's account, before the spec is dropped: the secrets, and a queue that receives the notices
        session = operator_session()
        secret = session.client("secretsmanager").create_secret(
            Name=f"{STACK_NAME}/default/hf-token", SecretString=TOKEN
        )
        assert secret["ARN"].startswith(secret_arn + "-")
        session.client("ssm").put_parameter(
            Name=f"/{STACK_NAME}/default/db-password", Value=PASSWORD, Type="SecureString"
        )
        # the team's too, but named by no spec: the job's role reads neither
        session.client("secretsmanager").create_secret(Name=f"{STACK_NAME}/default/not-named", SecretString="x")
        session.client("ssm").put_parameter(
            Name=f"/{STACK_NAME}/default/not-named", Value="x", Type="SecureString"
        )
        sqs = session.client("sqs")
        queue["url"] = sqs.create_queue(QueueName="notices")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue["url"], AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        topic = next(t["TopicArn"] for t in session.client("sns").list_topics()["Topics"])
        session.client("sns").subscribe(
            TopicArn=topic, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "true"}
        )
        fill_data(spec, say, tokenizer)
        rehearsal.ensure_bucket(OTHER_RUN[0])
        session.client("s3").put_object(Bucket=OTHER_RUN[0], Key=OTHER_RUN[1], Body=b"another run's weights")

    monkeypatch.setattr(rehearsal, "ensure_data", with_secrets_and_a_notice_queue)
    traces: dict[str, str] = {}

    def inspect(stack: Any, result: Any) -> None:
        traces.update(everything_as_text(stack, result, queue["url"]))
        other = operator_session().client("s3").get_object(Bucket=OTHER_RUN[0], Key=OTHER_RUN[1])
        traces["other run's checkpoint"] = other["Body"].read().decode()

    run = rehearse(path, inspect=inspect)

    assert run.status == "SUCCEEDED", (run.error, run.cause)
    # the entry point, started by the launcher, had both values in its environment
    assert f"secrets seen {json.dumps(SEEN, sort_keys=True)}" in run.training_log_tail
    assert json.dumps(SEEN) in traces["archive"]
    # the role reads the secrets the spec names, and no other of its team's (the session tags name them)
    # and its own code, with its role, was refused the team's other secret and parameter, and another run's checkpoint
    asked = {"other run": "AccessDenied", "unnamed parameter": "AccessDeniedException"}
    asked["unnamed secret"] = "AccessDeniedException"
    # nor could it write, delete or list another run's checkpoints; in its own run's folder it may
    asked.update({"other run write": "AccessDenied", "other run delete": "AccessDenied",
                  "other run list": "AccessDenied", "own write": "done", "own list": "done",
                  "other run log": "no route"})  # fmt: skip
    assert json.dumps(asked, sort_keys=True) in traces["archive"], traces["archive"]
    assert traces["other run's checkpoint"] == "another run's weights"
    # and no trace of the run holds either value (the traces are read: the spec's ARNs are in them)
    assert secret_arn in traces["history"] and parameter_arn in traces["tables"]
    for where, text in traces.items():
        for value in (TOKEN, PASSWORD):
            assert value not in text, f"{where} holds a secret's value"
    assert traces["notices"] != "[]" and "lustrain_secrets_launcher.py" in traces["training jobs"]
    # the interface endpoints went with the rest of the network
    assert run.resources_left == 0, run.leftovers
