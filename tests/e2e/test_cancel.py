"""Cancel tears down at once, on the twin: a run stopped while its model trains, by `lustrain cancel` or by a bare
StopExecution (the console, `aws stepfunctions stop-execution`), is torn down by the event of its stop, not by the
sweeper's next round: bench/cancel.py measures how soon (within a minute is the goal), this test what it leaves.

On AWS a stopped execution is ABORTED and runs no Catch; the twin does the same (tests/e2e/test_sweeper.py proves
that no teardown state runs). What tears the run down is the stack's rule on "Step Functions Execution Status
Change" and on_execution_end: it asks the trainer to stop through the run's stop request (SageMaker's PyTorch
image, which the twin runs the entry point as, passes no SIGTERM on), and the trainer saves the step it reached and
exits: the job ends Completed with not one step lost. Then it deletes the file system and the network, records who
stopped the run, and publishes a notice saying so.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lustrain import board, cli, operate, report
from lustrain.twin import rehearse
from lustrain.twin.iam import usage
from lustrain.twin.rehearse import REGION, STACK_NAME, drop, operator_session, twin, until

pytestmark = pytest.mark.slow

def training(sagemaker: Any, name: str) -> str | None:
    """The name of the run's training job once it trains."""
    for summary in sagemaker.list_training_jobs(StatusEquals="InProgress")["TrainingJobSummaries"]:
        if summary["TrainingJobName"].startswith(name + "-"):
            job = sagemaker.describe_training_job(TrainingJobName=summary["TrainingJobName"])
            return str(job["TrainingJobName"]) if job["SecondaryStatus"] == "Training" else None
    return None


def collect_notices(sqs: Any, queue_url: str, into: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The notices published so far, by job id: each message is a report, a blank line, then its facts as JSON."""
    for message in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", []):
        facts = json.loads(message["Body"].split("\n\n")[-1])
        into[facts["job_id"]] = {**facts, "text": message["Body"]}
        sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    return into


def test_a_run_cancelled_while_training_is_torn_down_by_the_event_of_its_stop(tmp_path, long_spec, monkeypatch, capsys, quick_stops):
    from lustrain.twin.patches import service_quotas

    monkeypatch.setenv("LUSTRAIN_TEARDOWN_POLL_SECONDS", "0.2")
    with twin() as stack:
        session = operator_session()
        sfn, sagemaker, sqs = (session.client(s) for s in ("stepfunctions", "sagemaker", "sqs"))
        service_quotas.set_quota("ml.p4d.24xlarge", 8, REGION)
        queue = sqs.create_queue(QueueName="notices")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        session.client("sns").subscribe(
            TopicArn=stack.outputs["NotifyTopicArn"],
            Protocol="sqs",
            Endpoint=queue_arn,
            Attributes={"RawMessageDelivery": "true"},
        )
        ours = operate.Stack.locate(STACK_NAME, session)

        # the run cancelled by the CLI keeps a warm pool after its job: the teardown must end it (nothing bills after
        # the end), where the pool would otherwise bill its keep-alive
        pooled = long_spec("by-cli")
        doc = yaml.safe_load(pooled.read_text())
        doc["compute"]["keep_alive_minutes"] = 5
        pooled.write_text(yaml.safe_dump(doc))
        service_quotas.set_quota("ml.p4d.24xlarge", 1, REGION, warm_pool=True)
        by_cli, by_cli_arn = drop(stack, pooled)
        bare, bare_arn = drop(stack, long_spec("bare-stop"))
        jobs = {spec.name: until(lambda s=spec: training(sagemaker, s.name), f"{spec.name} training", 240)
                for spec in (by_cli, bare)}

        # `lustrain watch`, as the Python API has it, follows the first run until it ends: its record's end, which
        # the teardown writes (the test waits for the teardown below; the watch's own bound is only a backstop, long
        # enough for a busy machine: a shorter one ended the watch at the execution's ABORTED before the record's end)
        watched: list[operate.RunStatus] = []
        watcher = threading.Thread(
            target=lambda: watched.extend(operate.watch(ours, "by-cli", poll_s=0.5, timeout_s=900)), daemon=True
        )
        watcher.start()
        until(lambda: watched or None, "a first look from watch")
        # the log's step, read as `watch` shows it (the job's log reaches CloudWatch as it runs, as on SageMaker)
        step, total = until(lambda: ((p := operate.progress(ours, "by-cli"))[0] and p) or None, "a logged step", 60)
        assert total == 100_000 and step > 0

        # a bare StopExecution gives no error or cause; `lustrain cancel --wait` names the run by its spec name and
        # returns once its teardown has ended, saying what it stopped, deleted and kept
        sfn.stop_execution(executionArn=bare_arn)
        capsys.readouterr()
        assert cli.main(["cancel", "by-cli", "--wait", "--json", "--stack", STACK_NAME]) == 0
        cancelled = json.loads(capsys.readouterr().out)
        assert cancelled["execution_arn"] == by_cli_arn and cancelled["already_ended"] is None
        assert sfn.describe_execution(executionArn=by_cli_arn)["status"] == "ABORTED"
        assert sfn.describe_execution(executionArn=bare_arn)["status"] == "ABORTED"

        job_ids = {spec.name: rehearse.job_id_of(rehearse.execution_history(sfn, arn))
                   for spec, arn in ((by_cli, by_cli_arn), (bare, bare_arn))}
        torn = cancelled["teardown"]
        assert (torn["ended"], torn["status"], torn["error"], torn["left"]) == (True, "FAILED", "RunCancelled", [])
        assert {e["type"] for e in torn["deleted"]} >= {
            "vpc", "subnet", "security_group", "route_table", "vpc_endpoint", "file_system"
        }  # fmt: skip
        # it returned when the teardown had ended: nothing of the run is left, with no wait here
        assert rehearse.resources_left(job_ids["by-cli"], by_cli) == ([], [])
        assert torn["stopped"] == [{"type": "training_job", "id": jobs["by-cli"]}]
        for spec in (by_cli, bare):
            until(lambda s=spec: rehearse.resources_left(job_ids[s.name], s)[0] == [] or None,
                  f"0 resources left of {spec.name}", timeout=60)
        for name, job in jobs.items():
            # the trainer heard the stop request, saved and exited: nothing was killed
            assert sagemaker.describe_training_job(TrainingJobName=job)["TrainingJobStatus"] == "Completed", name
        pool = sagemaker.describe_training_job(TrainingJobName=jobs["by-cli"])["WarmPoolStatus"]
        assert pool["Status"] == "Terminated", pool  # ended by the teardown, not left Available
        stopped_at: dict[str, int] = {}
        for spec in (by_cli, bare):
            lines = [line.message for line in operate.logs(ours, job_ids[spec.name])]
            # it stopped because it was asked (no signal reaches it), and its checkpoints hold every step it reached
            stopped = [int(m[1]) for line in lines if (m := re.search(r"interrupted at step (\d+) of", line))]
            saved = [int(m[1]) for line in lines if (m := re.search(r"checkpoint saved step-\d+-\w+ at step (\d+)", line))]
            logged = [int(m[1]) for line in lines if (m := re.search(r"\bstep=(\d+) ", line))]
            # (the log shows every log_interval-th step: the step it stopped at is the last reached, logged or not)
            assert stopped and saved and max(saved) == stopped[-1] >= max(logged), (stopped, saved[-3:], max(logged))
            stopped_at[spec.name] = stopped[-1]

        # the record and `lustrain runs` / `status` say who stopped the run and what is left (nothing)
        runs = {r.name: r for r in operate.runs(ours)}
        assert {runs[n].error for n in ("by-cli", "bare-stop")} == {"RunCancelled"}
        assert {runs[n].state for n in ("by-cli", "bare-stop")} == {"FAILED"}
        shown = operate.status(ours, job_ids["by-cli"])
        caller = session.client("sts").get_caller_identity()["Arn"]
        assert shown.cause and f"cancelled by {caller} with lustrain cancel" in shown.cause
        assert shown.resources_left == []
        assert shown.training_job and shown.training_job["status"] == "Completed"
        assert [s.state for s in shown.timeline][-1] == "Start the training job"
        # the training state ended when the execution was stopped, not at "now"
        trained = shown.timeline[-1]
        assert trained.seconds is not None and trained.exited_at is not None
        assert trained.exited_at <= operate._iso(sfn.describe_execution(executionArn=by_cli_arn)["stopDate"])
        bare_cause = operate.status(ours, job_ids["bare-stop"]).cause or ""
        assert "no error or cause given" in bare_cause

        watcher.join(timeout=60)
        assert watched[0].run.state == "RUNNING" and watched[0].training_job["status"] == "InProgress"
        assert watched[-1].run.state == "FAILED" and watched[-1].run.error == "RunCancelled"

        # the report draws the run's own data: the losses its log holds, read with the job's MetricDefinitions
        made = report.build(ours, "by-cli", tmp_path / "reports")
        logged = report.metric_points(operate.logs(ours, "by-cli"), report._definitions(ours, operate.find_run(ours, "by-cli")))
        assert made.series["loss"]["train_loss"] == logged["train_loss"] and len(logged["train_loss"]) >= 2
        assert made.series["speed"]["tokens_per_s_per_gpu"] == logged["tokens_per_s_per_gpu"]
        drawn = made.figures["loss"].axes[0].lines[0].get_xydata().tolist()
        assert drawn == [list(point) for point in logged["train_loss"]]
        assert set(made.series["timeline"]) >= {"Register the job", "Start the training job"}
        assert made.series["timeline"]["Start the training job"][-1][1] == trained.seconds
        assert made.series["cost"]["so far"][0][1] == operate.status(ours, "by-cli").run.cost_so_far_usd
        assert all(path.stat().st_size > 1000 for path in made.pngs.values())
        page = made.html_path.read_text()
        assert all(f'src="{path.name}"' in page for path in made.pngs.values()) and "RunCancelled" in page
        # and where the run's TensorBoard files go: beside its model, under the run's own jobs/ prefix
        logdir = f"s3://{stack.outputs['ArtifactsBucketName']}/archive/{job_ids['by-cli']}/jobs/"
        assert made.tensorboard_logdir == logdir and f"tensorboard --logdir {logdir}" in page
        # `lustrain tensorboard` copies them here, one directory per attempt, and TensorBoard reads them: the trainer
        # wrote them in SageMaker's image, which has no tensorboard package
        capsys.readouterr()
        assert cli.main(["tensorboard", "by-cli", "-o", str(tmp_path / "tb"), "--json", "--stack", STACK_NAME]) == 0
        copied = json.loads(capsys.readouterr().out)
        assert (copied["logdir"], copied["files"]) == (logdir, 1)
        attempt = Path(copied["local_dir"]) / jobs["by-cli"]
        accumulator = EventAccumulator(str(attempt))
        accumulator.Reload()
        steps = [e.step for e in accumulator.Scalars("loss/train")]
        assert steps and steps == sorted(steps) and steps[-1] <= stopped_at["by-cli"]
        url = board.serve(copied["local_dir"], 0)
        with urllib.request.urlopen(f"{url}data/runs", timeout=30) as answer:
            assert json.loads(answer.read()) == [jobs["by-cli"]]

        # the same from the command line, as the README shows it; the training log holds both hosts' steps
        assert cli.main(["status", "by-cli", "--stack", STACK_NAME]) == 0
        shown_text = capsys.readouterr().out
        assert f"run {job_ids['by-cli']} (by-cli): FAILED, RunCancelled" in shown_text
        assert "Start the training job" in shown_text
        assert cli.main(["runs", "--stack", STACK_NAME, "--json"]) == 0
        listed = {r["job_id"]: r for r in json.loads(capsys.readouterr().out)}
        assert set(job_ids.values()) <= set(listed) and listed[job_ids["bare-stop"]]["error"] == "RunCancelled"
        assert cli.main(["logs", "by-cli", "--stack", STACK_NAME]) == 0
        logged = capsys.readouterr().out.splitlines()
        assert any(line.startswith("[algo-1] ") and "step=" in line for line in logged), logged[-5:]
        assert cli.main(["cancel", "by-cli", "--stack", STACK_NAME]) == 0  # already cancelled: nothing to do
        assert "already ended ABORTED" in capsys.readouterr().out
        assert cli.main(["watch", "by-cli", "--stack", STACK_NAME]) == 1  # it ended, and not SUCCEEDED
        assert f"run {job_ids['by-cli']}: FAILED (RunCancelled" in capsys.readouterr().out
        assert cli.main(["report", "by-cli", "--stack", STACK_NAME, "-o", str(tmp_path / "cli")]) == 0
        assert (tmp_path / "cli" / job_ids["by-cli"] / "report.html").exists()
        capsys.readouterr()

        # each run's notice says it was cancelled, by whom, and what was stopped and deleted
        sent: dict[str, dict[str, Any]] = {}
        until(lambda: len(collect_notices(sqs, queue, sent)) >= 2 or None, "both notices", timeout=30)
        for name, job_id in job_ids.items():
            notice = sent[job_id]
            assert notice["outcome"] == "cancelled" and notice["error"] == "RunCancelled", name
            assert {"type": "training_job", "id": jobs[name]} in notice["stopped"]
            assert {d["type"] for d in notice["deleted"]} >= {"file_system", "vpc", "subnet", "security_group"}
            assert notice["remaining"] == []
        assert caller in sent[job_ids["by-cli"]]["cause"]
        assert sent[job_ids["by-cli"]]["text"].startswith(f"lustrain run {job_ids['by-cli']} cancelled.")

        # each statement on_execution_end was allowed by alone, removed from its role, refuses that request
        role = usage.collect(stack)["OnExecutionEndFunctionRole"]
        assert len(usage.needed(role)) >= 3, usage.needed(role)
        assert usage.still_allowed_without(role) == {}
