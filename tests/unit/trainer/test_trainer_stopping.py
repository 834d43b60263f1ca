"""The trainer stops when asked, not when signalled: the run's stop request, its deadline, a training plan's end.

SageMaker's PyTorch image passes no SIGTERM on to the entry point (lustrain_trainer/stopping.py has the sources): a
stop the stack asks for must reach the trainer through its stop request, and a deadline through what it knows of
its own runtime. Real runs of train.py here, with the request a file of this machine (the trainer reads an s3://
one with its job's role; tests/functional/twin has that path).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from lustrain_trainer import stopping
from test_trainer_runs import launch, lines_until, sagemaker_env

pytestmark = pytest.mark.slow

MICRO = ["--n_layer", "1", "--n_head", "2", "--n_embd", "32", "--seq_len", "32", "--batch_size", "4",
         "--eval_interval", "0", "--log_interval", "1"]


def last_step(lines: list[str]) -> int:
    return max(int(m[1]) for line in lines if (m := re.match(r"step=(\d+) train_loss", line)))


def test_the_stop_request_saves_every_step_reached_and_exits_0_with_no_signal(
        data: Path, sourcedir: Path, tmp_path: Path) -> None:
    request = tmp_path / "stop-request.json"
    request.write_text('{"stop": false}')
    env = sagemaker_env(tmp_path, data, LUSTRAIN_STOP_REQUEST=str(request), LUSTRAIN_STOP_POLL_SECONDS="0.2",
                        TRAINING_JOB_NAME="run-1-1")
    process = launch(sourcedir, env, *MICRO, "--max_steps", "100000", "--checkpoint_interval", "100000")
    seen = list(lines_until(process, r"^step=5 "))
    request.write_text(json.dumps({"stop": True, "reason": "cancelled by someone"}))
    output, _ = process.communicate(timeout=120)
    lines = seen + output.splitlines()

    assert process.returncode == 0, output
    saved = re.search(r"checkpoint saved step-(\d+)-\w+ at step (\d+) \(stop requested by the stop request "
                      r"\(cancelled by someone\)", output)
    assert saved, output
    # the stop's checkpoint holds the last step trained: not one step is lost
    assert int(saved[2]) == last_step(lines)
    summary = json.loads((tmp_path / "output" / "summary.json").read_text())
    assert (summary["status"], summary["step"]) == ("interrupted", int(saved[2]))
    # the checkpoint says which SageMaker job made it and how long that job had run: a restart of the same job
    # (spot) stops that much sooner
    manifest = json.loads((tmp_path / "checkpoints" / f"step-{saved[1]}.json").read_text())
    assert manifest["job"] == "run-1-1" and manifest["job_seconds"] > 0


def test_at_its_deadline_the_trainer_saves_then_waits_for_sagemakers_stop(
        data: Path, sourcedir: Path, tmp_path: Path) -> None:
    # MaxRuntimeInSeconds 15 s, 1 s of it kept to save: the trainer stops itself about 14 s after it starts
    env = sagemaker_env(tmp_path, data, LUSTRAIN_MAX_RUNTIME_SECONDS="15", LUSTRAIN_STOP_RESERVE_SECONDS="1")
    process = launch(sourcedir, env, *MICRO, "--max_steps", "100000", "--checkpoint_interval", "100000")
    lines = list(lines_until(process, r".*waiting for SageMaker to stop the job"))
    assert process.poll() is None  # still there: the job must end Stopped at MaxRuntime, not Completed
    process.kill()  # SageMaker's stop
    process.wait(timeout=60)
    saved = next(m for line in lines if (m := re.search(r"checkpoint saved step-(\d+)-\w+ at step (\d+) \(deadline: "
                                                          r"MaxRuntimeInSeconds 15 s less 1 s to save", line)))
    assert int(saved[2]) == last_step(lines)
    assert (tmp_path / "checkpoints" / f"step-{saved[1]}.json").is_file()  # committed before the kill


def test_the_deadline_is_the_sooner_of_the_runtime_and_a_training_plans_usable_end() -> None:
    now = 1_800_000_000.0  # 2027
    # a capacity ending in 40 min is usable by a job for 10 min (30 min before its end), less the 60 s to save
    env = {stopping.MAX_RUNTIME_ENV: "7200", stopping.STOP_RESERVE_ENV: "60",
           stopping.CAPACITY_END_ENV: str(int(now + 40 * 60))}
    stop = stopping.StopRequest(env, clock=lambda: now)
    assert stop.deadline == now + 10 * 60 - 60 and "training plan" in (stop.deadline_reason or "")
    # in milliseconds it says the same
    env[stopping.CAPACITY_END_ENV] = str(int((now + 40 * 60) * 1000))
    assert stopping.StopRequest(env, clock=lambda: now).deadline == now + 10 * 60 - 60
    env[stopping.CAPACITY_END_ENV] = str(int(now + 5 * 3600))
    assert stopping.StopRequest(env, clock=lambda: now).deadline == now + 7200 - 60
    assert stopping.StopRequest({}, clock=lambda: now).deadline is None


def test_the_loop_hears_a_request_a_signal_or_the_deadline_and_the_deadline_wins() -> None:
    clock = [0.0]
    stop = stopping.StopRequest({stopping.MAX_RUNTIME_ENV: "100"}, clock=lambda: clock[0])
    assert stop.code() == stopping.NONE
    stop.reason = "SIGTERM"
    assert stop.code() == stopping.REQUESTED and stop.describe(stopping.REQUESTED) == "stop requested by SIGTERM"
    clock[0] = 100.0
    assert stop.code() == stopping.DEADLINE


class FakeS3:
    def __init__(self, bodies: list[bytes | Exception]) -> None:
        self.bodies = bodies
        self.asked: list[tuple[str, str]] = []

    def get_object(self, Bucket: str, Key: str) -> dict[str, object]:
        self.asked.append((Bucket, Key))
        body = self.bodies.pop(0)
        if isinstance(body, Exception):
            raise body

        class Body:
            def read(self) -> bytes:
                return body  # type: ignore[return-value]

        return {"Body": Body()}


def test_an_s3_request_is_read_with_get_object_and_a_failed_read_is_said_once_and_tried_again() -> None:
    said: list[str] = []
    s3 = FakeS3([PermissionError("AccessDenied"), PermissionError("AccessDenied"), b'{"stop": false}',
                 b'{"stop": true, "reason": "budget"}'])
    stop = stopping.StopRequest({stopping.STOP_REQUEST_ENV: "s3://artifacts/control/run-1/stop-request.json"},
                                say=said.append)
    assert [stop.check_request(lambda: s3) for _ in range(4)] == [False, False, False, True]
    assert s3.asked[0] == ("artifacts", "control/run-1/stop-request.json")
    assert len(said) == 1 and "cannot read the stop request" in said[0] and "AccessDenied" in said[0]
    assert stop.reason == "the stop request (budget)"


def test_a_restarted_try_of_the_same_job_stops_as_much_sooner_as_the_tries_before_it_ran() -> None:
    # SageMaker restarts a spot job in place, and its MaxRuntimeInSeconds covers every try
    now = 1_800_000_000.0
    env = {stopping.MAX_RUNTIME_ENV: "3600", stopping.STOP_RESERVE_ENV: "60"}
    stop = stopping.StopRequest(env, clock=lambda: now)
    stop.spent_before(1000.0)
    assert stop.deadline == now + 3600 - 60 - 1000 and "spent by an earlier try" in (stop.deadline_reason or "")
    # a training plan's capacity end is a moment: an earlier try changes nothing of it
    capacity = stopping.StopRequest({stopping.CAPACITY_END_ENV: str(int(now + 3600))}, clock=lambda: now)
    before = capacity.deadline
    capacity.spent_before(1000.0)
    assert capacity.deadline == before
