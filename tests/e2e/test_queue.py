"""The capacity queue on the twin, through the real state machine: a run that finds the quota taken waits with
nothing created, is never swept while it waits, is admitted when the quota frees, and a run whose queue time runs
out ends QuotaExceeded having created nothing."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from lustrain import cli, operate
from lustrain.twin import rehearse
from lustrain.twin.notice_receiver import receiver
from lustrain.twin.rehearse import REGION, STACK_NAME, drop, operator_session, twin, until

pytestmark = pytest.mark.slow

SCHEDULED_EVENT = Path(__file__).resolve().parents[2] / "events" / "sweep.json"


def states_of(sfn: Any, arn: str) -> list[str]:
    return [
        e["stateEnteredEventDetails"]["name"]
        for e in rehearse.execution_history(sfn, arn)
        if "stateEnteredEventDetails" in e
    ]


def queued(sfn: Any, arn: str) -> dict[str, Any] | None:
    """The run's latest answer from the queue once it says the run waits."""
    for output in reversed(list(rehearse.state_outputs(rehearse.execution_history(sfn, arn)))):
        answer = output.get("quota")
        if isinstance(answer, dict) and "admitted" in answer:
            return answer if answer["admitted"] is False else None
    return None


def test_runs_wait_for_the_quota_with_nothing_created_and_a_run_out_of_queue_time_ends_quota_exceeded(
    tmp_path, long_spec, quick_stops, monkeypatch, capsys
):
    from lustrain.twin.patches import service_quotas

    monkeypatch.setenv("LUSTRAIN_TEARDOWN_POLL_SECONDS", "0.2")
    chat = contextlib.ExitStack()
    hook = chat.enter_context(receiver())

    def webhook() -> dict[str, str]:
        """The team's chat, as a stack names it: a secret holding the URL (and its format) the notices go to."""
        secret = operator_session().client("secretsmanager").create_secret(
            Name="team/chat", SecretString=json.dumps({"url": hook.url, "format": "json"})
        )
        return {"NoticeWebhookSecretArn": secret["ARN"]}

    with chat, twin(before=webhook) as stack:
        session = operator_session()
        sfn, sagemaker = session.client("stepfunctions"), session.client("sagemaker")
        service_quotas.set_quota("ml.p4d.24xlarge", 1, REGION)
        ours = operate.Stack.locate(STACK_NAME, session)

        holder, holder_arn = drop(stack, long_spec("holder"))
        until(
            lambda: sagemaker.list_training_jobs(StatusEquals="InProgress")["TrainingJobSummaries"] or None,
            "the holder's training job",
            240,
        )
        # two more runs of one instance each: the quota (1) is taken
        hasty_path = long_spec("hasty")
        doc = yaml.safe_load(hasty_path.read_text())
        doc["compute"]["max_queue_hours"] = 0.004  # 14.4 s
        hasty_path.write_text(yaml.safe_dump(doc))
        hasty, hasty_arn = drop(stack, hasty_path)
        patient, patient_arn = drop(stack, long_spec("patient"))
        waiting = until(lambda: queued(sfn, patient_arn), "the patient run queued", 60)
        assert waiting["wait_seconds"] >= 1 and waiting["in_use"] == 1 and waiting["available"] == 0

        # while they wait, nothing of theirs exists, `lustrain status` shows their place, and the sweeper leaves them
        job_ids = {
            s.name: until(lambda a=arn: rehearse.job_id_of(rehearse.execution_history(sfn, a)) or None, s.name)
            for s, arn in ((hasty, hasty_arn), (patient, patient_arn))
        }
        for spec in (hasty, patient):
            assert rehearse.resources_left(job_ids[spec.name], spec) == ([], []), spec.name
        shown = operate.status(ours, job_ids["patient"])
        assert shown.queue["state"] == "queued" and shown.queue["position"] in (1, 2)
        assert cli.main(["status", "patient", "--stack", STACK_NAME]) == 0
        assert "  queue:       waiting in ml.p4d.24xlarge#on-demand: place " in capsys.readouterr().out
        # as the operator (the handlers of the runs under way run in this process, each as its own role)
        answer = session.client("lambda").invoke(
            FunctionName=stack.function_names()["sweep"], Payload=SCHEDULED_EVENT.read_bytes()
        )
        swept = json.loads(answer["Payload"].read())
        assert not [s for s in swept["swept"] if s["job_id"] in job_ids.values()]
        assert not [r for r in swept["released"] if r["job_id"] in job_ids.values()]
        assert sfn.describe_execution(executionArn=patient_arn)["status"] == "RUNNING"

        # the hasty run's queue time runs out: QuotaExceeded, with the numbers and the command, nothing created
        until(lambda: sfn.describe_execution(executionArn=hasty_arn)["status"] != "RUNNING" or None, "hasty's end", 60)
        ended = sfn.describe_execution(executionArn=hasty_arn)
        assert (ended["status"], ended["error"]) == ("FAILED", "QuotaExceeded")
        assert "compute.max_queue_hours=0.004" in ended["cause"]
        assert "request-service-quota-increase" in ended["cause"]
        visited = states_of(sfn, hasty_arn)
        assert "Create the network" not in visited and "Wait for capacity" in visited
        assert operate.status(ours, job_ids["hasty"]).run.error == "QuotaExceeded"

        # the holder ends: the patient run is admitted, builds its network and file system, and trains
        operate.cancel(ours, "holder")
        until(
            lambda: "Start the training job" in states_of(sfn, patient_arn) or None, "the patient run training", 120
        )
        admitted = [o["quota"] for o in rehearse.state_outputs(rehearse.execution_history(sfn, patient_arn))
                    if isinstance(o.get("quota"), dict) and o["quota"].get("admitted")]
        assert admitted and admitted[-1]["queued_s"] > 0
        operate.cancel(ours, "patient")
        holder_id = rehearse.job_id_of(rehearse.execution_history(sfn, holder_arn))
        for job_id, spec in ((holder_id, holder), (job_ids["patient"], patient)):
            until(lambda j=job_id, s=spec: rehearse.resources_left(j, s)[0] == [] or None, f"{spec.name} clean", 60)
        # and nobody is left in the line
        pools = session.client("dynamodb").scan(TableName=stack.outputs["CapacityQueueTableName"])
        for item in pools["Items"]:
            assert item["waiting"]["M"] == {} and item["holds"]["M"] == {}, item

        # the team's chat heard every moment of the runs, each with its cost so far, model and command
        ids = {**job_ids, "holder": holder_id}
        wanted = {("holder", "cancelled"), ("holder", "attempt-ended"), ("hasty", "queued"), ("hasty", "failed"),
                  ("patient", "queued"), ("patient", "admitted"), ("patient", "attempt-ended"),
                  ("patient", "cancelled")}

        def missing() -> set[tuple[str, str]]:
            return wanted - {(name, p["kind"]) for p in list(hook.posts) for name, j in ids.items() if p["job_id"] == j}

        with contextlib.suppress(AssertionError):
            until(lambda: not missing() or None, "every notice of the runs", 60)
        assert not missing(), (sorted(missing()), [(p["kind"], p["job_id"]) for p in hook.posts])
        posts = list(hook.posts)
        started = {p["facts"]["execution"] for p in posts if p["kind"] == "started"}
        assert {a.rsplit(":", 1)[-1] for a in (holder_arn, hasty_arn, patient_arn)} <= started
        by = {(p["job_id"], p["kind"]): p for p in posts}
        assert "QuotaExceeded" in by[(ids["hasty"], "failed")]["text"]
        caller = session.client("sts").get_caller_identity()["Arn"]
        assert f"cancelled by {caller} with lustrain cancel" in by[(ids["holder"], "cancelled")]["text"]
        assert by[(ids["patient"], "admitted")]["facts"]["queued_s"] > 0
        for p in posts:
            assert p["cost_so_far_usd"] is not None and f"lustrain status {p['job_id']} --stack" in p["command"]
        assert by[(ids["holder"], "cancelled")]["model_s3_uri"].endswith(f"/archive/{ids['holder']}/")
    # once every event was delivered (the twin drained them): the refusal told once, though its execution's FAILED
    # reached the notify function too (the state machine's notify had announced it)
    refused = [p for p in hook.posts if (p["job_id"], p["kind"]) == (ids["hasty"], "failed")]
    assert len(refused) == 1, refused
