"""A data preparation run on the twin's stack, started as a user starts one: `lustrain data prepare s3://SRC
s3://OUT --instances 2 --stack lustrain-twin` uploads the trainer package and drops a kind: prepare spec; the
state machine builds the run's network, bundles the package, runs the plan, work (two processing instances) and
merge stages, and tears the run down. Judged as a user would: the execution SUCCEEDED, `lustrain status` shows the
stages, `lustrain logs` has both work instances' lines, the shards are byte for byte a local one-process run's,
and nothing the run created is left, its own role included. And least privilege, as
tests/e2e/test_least_privilege.py proves it for a training run: each statement of the prepare function's that alone
allowed a request of the run, removed, refuses that request naming its action (the run's own role is held to its
run by tests/functional/test_prepare_role.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lustrain import cli, operate
from lustrain.twin.iam import enforce, usage
from lustrain.twin.rehearse import STACK_NAME, ensure_bucket, operator_session, twin, until

pytestmark = pytest.mark.slow

DATA, RESULTS = "lustrain-example-data", "lustrain-example-results"
SOURCE = f"s3://{DATA}/e2e-prepare/text/"
OUTPUT = f"s3://{RESULTS}/default/e2e-prepare/shards/"
#: about 6 KB of text in 6 files
CORPUS = {
    f"d{i % 2}/f{i}.txt": (
        f"document {i}: the quick brown fox jumps over the lazy dog; déjà vu.\n" * 16
    ).encode()
    for i in range(6)
}


def local_run(tmp_path: Path) -> dict[str, bytes]:
    """What `lustrain data prepare SRC OUT` writes on this machine, one process: every file, by its path."""
    src, out = tmp_path / "src", tmp_path / "local"
    for key, body in CORPUS.items():
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        (src / key).write_bytes(body)
    assert cli.main(["data", "prepare", str(src), str(out), "--instances", "1"]) == 0
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def test_a_preparation_on_two_instances_of_the_stack_writes_a_local_runs_shards_and_leaves_nothing(
    tmp_path, monkeypatch, capsys
):
    # the waits between looks: a second on the twin (a minute on AWS)
    monkeypatch.setenv("LUSTRAIN_PREPARE_LOOK_SECONDS", "1")
    local = local_run(tmp_path)
    capsys.readouterr()
    enforce.clear_log()
    with twin() as stack:
        session = operator_session()
        s3, sfn = session.client("s3"), session.client("stepfunctions")
        for bucket in (DATA, RESULTS):
            ensure_bucket(bucket)
        for key, body in CORPUS.items():
            s3.put_object(Bucket=DATA, Key=SOURCE.removeprefix(f"s3://{DATA}/") + key, Body=body)

        argv = ["data", "prepare", SOURCE, OUTPUT, "--instances", "2", "--stack", STACK_NAME]
        assert cli.main(argv) == 0
        said = capsys.readouterr().out
        assert "code uploaded to s3://" in said and "lustrain-trainer" in said
        job_id = said.split("run ", 1)[1].split(" started", 1)[0]

        ours = operate.Stack.locate(STACK_NAME, session)
        execution = stack.outputs["StateMachineArn"]

        def ended() -> dict | None:
            (run,) = [e for e in sfn.list_executions(stateMachineArn=execution)["executions"]]
            return (
                None
                if run["status"] == "RUNNING"
                else sfn.describe_execution(executionArn=run["executionArn"])
            )

        finished = until(ended, "the preparation's end", 300)
        assert finished["status"] == "SUCCEEDED", finished.get("cause")
        summary = json.loads(finished["output"])
        assert (summary["kind"], summary["stages"], summary["output_s3_uri"]) == (
            "prepare",
            ["plan", "work", "merge"],
            OUTPUT,
        )

        # `lustrain status` and `runs` show it as a data preparation, its stages done, nothing left
        found = operate.status(ours, job_id)
        assert (found.run.kind, found.run.state, found.run.instances) == ("prepare", "SUCCEEDED", 2)
        assert [(s["stage"], s["status"], s["instances"]) for s in found.stages] == [
            ("plan", "Completed", 1),
            ("work", "Completed", 2),
            ("merge", "Completed", 1),
        ]
        assert found.resources_left == []
        assert cli.main(["status", job_id, "--stack", STACK_NAME]) == 0
        shown = capsys.readouterr().out
        assert "prepare:     data preparation on 2 x ml.c5.xlarge" in shown and f"{job_id}-prep-work" in shown
        assert [r.kind for r in operate.runs(ours)] == ["prepare"]
        # `lustrain logs` reads the processing jobs' log group: both work instances wrote there
        hosts = {line.host for line in operate.logs(ours, job_id) if f"{job_id}-prep-work/" in line.stream}
        assert hosts == {"algo-1", "algo-2"}

        # the shards and the tokenizer, byte for byte what one local process writes; the index but its source
        written = {}
        prefix = OUTPUT.removeprefix(f"s3://{RESULTS}/")
        for item in s3.list_objects_v2(Bucket=RESULTS, Prefix=prefix)["Contents"]:
            written[item["Key"].removeprefix(prefix)] = s3.get_object(Bucket=RESULTS, Key=item["Key"])[
                "Body"
            ].read()
        made = sorted(name for name in local if name.endswith(".bin") or name == "tokenizer.json")
        assert made and sorted(n for n in written if n.endswith(".bin") or n == "tokenizer.json") == made
        assert all(written[name] == local[name] for name in made)
        ours_index, theirs = json.loads(written["index.json"]), json.loads(local["index.json"])
        ours_index.pop("source", None)
        theirs.pop("source", None)
        assert ours_index == theirs

        # nothing of the run is left: its network is gone, its processing jobs ended
        ec2 = session.client("ec2")
        tagged = [{"Name": "tag:lustrain:job-id", "Values": [job_id]}]
        assert ec2.describe_vpcs(Filters=tagged)["Vpcs"] == []
        assert ec2.describe_subnets(Filters=tagged)["Subnets"] == []
        assert ec2.describe_security_groups(Filters=tagged)["SecurityGroups"] == []
        sm = session.client("sagemaker")
        jobs = sm.list_processing_jobs()["ProcessingJobSummaries"]
        assert {j["ProcessingJobStatus"] for j in jobs} == {"Completed"} and len(jobs) == 3
        # each stage ran as the run's own role, which its teardown deleted after the network
        role = f"arn:aws:iam::123456789012:role/lustrain/{session.region_name}/{STACK_NAME}/{job_id}-prep"
        for summary in jobs:
            assert sm.describe_processing_job(ProcessingJobName=summary["ProcessingJobName"])["RoleArn"] == role
        assert session.client("iam").list_roles(PathPrefix="/lustrain/")["Roles"] == []

        # least privilege: the roles only a preparation uses, each needed statement removed in turn
        uses = usage.collect(stack)
        checked = []
        for role in ("PrepareFunctionRole",):
            needed = usage.needed(uses[role])
            assert needed, f"{role} made no call its own statements alone allowed"
            for ref, made in needed.items():
                decision = usage.replay(made[0], usage.without(uses[role].policies, ref))
                assert not decision.allowed, f"{role} {ref}: {made[0].action} still allowed without it"
                assert f"not authorized to perform: {made[0].action}" in usage.denial(made[0], decision)
                checked.append(made[0].action)
        assert {"sagemaker:CreateProcessingJob", "iam:PassRole", "iam:CreateRole"} <= set(checked), checked
