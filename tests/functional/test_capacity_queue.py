"""The capacity queue (steps/queue.py) on moto's DynamoDB and the twin's Service Quotas: a line per instance type and
purchase option, first come first served, admissions that hold their instances, a bounded wait, and every end of
a run leaving the line. SageMaker's InProgress jobs are a stand-in list here: the queue only counts them."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from infra_support import REGION, job_record, register, spec
from lustrain_core.config import Settings
from lustrain_core.document import dumped
from lustrain_core.errors import QuotaExceeded
from lustrain_core.spec import validate_spec
from lustrain_core.steps import queue, quota, records, sweep

from lustrain.twin.patches import service_quotas


class Running:
    """SageMaker's InProgress and Stopping training jobs, as ListTrainingJobs and DescribeTrainingJob show them."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}

    def start(self, name: str, count: int, spot: bool = False, status: str = "InProgress") -> None:
        self.jobs[name] = {
            "TrainingJobName": name,
            "TrainingJobStatus": status,
            "EnableManagedSpotTraining": spot,
            "ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": count},
        }

    def end(self, name: str) -> None:
        self.jobs.pop(name)

    def get_paginator(self, operation: str) -> Any:
        jobs = self.jobs

        class Pages:
            def paginate(self, StatusEquals: str | None = None, WarmPoolStatusEquals: str | None = None) -> Any:
                def listed(job: dict[str, Any]) -> bool:
                    if WarmPoolStatusEquals is not None:
                        return (job.get("WarmPoolStatus") or {}).get("Status") == WarmPoolStatusEquals
                    return job["TrainingJobStatus"] == StatusEquals

                yield {"TrainingJobSummaries": [{"TrainingJobName": n} for n, j in jobs.items() if listed(j)]}

        return Pages()

    def describe_training_job(self, TrainingJobName: str) -> dict[str, Any]:
        return self.jobs[TrainingJobName]


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def line(aws: Settings):
    settings = Settings(**{**aws.__dict__, "extra": {queue.POLL_SETTING: "30"}})
    service_quotas.set_quota("ml.p4d.24xlarge", 4)
    running, clock = Running(), Clock()
    ddb = boto3.client("dynamodb", region_name=REGION)

    def look(document: dict[str, Any]) -> dict[str, Any]:
        """One visit of "Check the SageMaker quota": the admission or the wait; the document keeps the answer."""
        answer = dumped(
            queue.take_place(
                document,
                quotas=boto3.client("service-quotas", region_name=REGION),
                sagemaker=running,
                ddb=ddb,
                settings=settings,
                clock=clock,
            )
        )
        document["quota"] = answer
        return answer

    def run(name: str, count: int, **compute: Any) -> dict[str, Any]:
        return register(spec(name=name, compute={"instance_count": count, **compute}))

    def pool(spot: bool = False) -> dict[str, Any]:
        return queue.read_pool(ddb, settings.queue_table, f"ml.p4d.24xlarge#{'spot' if spot else 'on-demand'}")

    return {"settings": settings, "running": running, "clock": clock, "look": look, "run": run, "pool": pool, "ddb": ddb}


def compute_of(document: dict[str, Any]) -> Any:
    return validate_spec(document["job"]["spec"]).compute


def test_first_come_first_served_a_large_run_is_not_starved_by_small_ones(line):
    look, run, running = line["look"], line["run"], line["running"]
    running.start("someone-elses", 2)  # another workload holds 2 of the 4
    a, b, c = run("a", 2), run("b", 4), run("c", 2)

    assert look(a)["admitted"] is True  # 2 free: a fits
    first_b, first_c = look(b), look(c)
    assert (first_b["admitted"], first_b["position"]) == (False, 1)
    assert (first_c["admitted"], first_c["position"], first_c["ahead_instances"]) == (False, 2, 4)
    # QueuePollSeconds, or longer for a run allowed a long wait (24 h: 44 s, within the execution history limit)
    assert first_b["wait_seconds"] == queue.poll_seconds(line["settings"], compute_of(b)) == 44
    # what the queue promised a counts until its job exists: b's look sees 2 in use and 2 held
    assert (first_b["in_use"], first_b["held"], first_b["available"]) == (2, 2, 0)

    # a's job starts (its hold becomes SageMaker's count) and the other workload ends: 2 free, but b is first
    running.start("a-job", 2)
    queue.release_hold(line["ddb"], line["settings"], compute_of(a), a["job"]["job_id"])
    running.end("someone-elses")
    assert look(b)["admitted"] is False
    assert (look(c)["admitted"], c["quota"]["position"]) == (False, 2)

    running.end("a-job")  # a is done: b's 4 fit, c still waits behind b's hold
    assert look(b)["admitted"] is True
    assert look(c)["admitted"] is False and c["quota"]["position"] == 1


def test_two_runs_admitted_at_once_never_oversubscribe(line, monkeypatch):
    look, run, clock = line["look"], line["run"], line["clock"]
    # r was admitted first, then SageMaker refused its job (another workload, since gone): it returns to its place
    r = run("r", 3)
    assert look(r)["admitted"] is True
    queue.release_hold(line["ddb"], line["settings"], compute_of(r), r["job"]["job_id"])
    r["failure"] = {"Error": QuotaExceeded.__name__, "Cause": "ResourceLimitExceeded"}
    clock.now += 10
    a = run("a", 3)

    measure = quota.measure
    raced: list[dict[str, Any]] = []

    def measure_while_another_is_admitted(job: Any, **kwargs: Any) -> dict[str, Any]:
        # r's whole return and admission lands between a's reading of the pool (a at the head) and a's write
        if not raced and job.job_id == a["job"]["job_id"]:
            raced.append(look(r))
        return measure(job, **kwargs)

    monkeypatch.setattr(quota, "measure", measure_while_another_is_admitted)
    answer = look(a)
    assert raced[0]["admitted"] is True
    # a's arithmetic (4 free) was stale: its write was refused, it read the pool again and saw r's 3 held
    assert answer["admitted"] is False and (answer["held"], answer["available"]) == (3, 1)
    assert sum(h["instances"] for h in line["pool"]()["holds"].values()) == 3


def test_a_run_whose_queue_time_runs_out_ends_quota_exceeded_and_leaves_the_line(line):
    look, run, running, clock = line["look"], line["run"], line["running"], line["clock"]
    running.start("busy", 4)
    waiting = run("patient", 2, max_queue_hours=1)
    assert look(waiting)["admitted"] is False
    clock.now += 1800
    assert look(waiting)["queued_s"] == 1800
    record = job_record(line["settings"].jobs_table, waiting["job"]["job_id"])
    assert record["queue"]["state"] == "queued" and record["queue"]["position"] == 1
    assert record["queue"]["left_s"] == 3600  # what the sweeper's deadline counts

    clock.now += 1800
    with pytest.raises(QuotaExceeded) as refused:
        look(waiting)
    message = refused.value.message
    assert "2 x ml.p4d.24xlarge requested, 4 in use by running training jobs, quota 4" in message
    assert "waited 3600 s in the queue, compute.max_queue_hours=1" in message
    assert "aws service-quotas request-service-quota-increase --service-code sagemaker" in message
    assert waiting["job"]["job_id"] not in line["pool"]()["waiting"]


def test_a_run_that_can_never_fit_or_may_not_wait_is_refused_at_once(line):
    look, run, running = line["look"], line["run"], line["running"]
    with pytest.raises(QuotaExceeded, match="more than the whole quota"):
        look(run("huge", 5))
    running.start("busy", 3)
    with pytest.raises(QuotaExceeded, match=r"compute\.max_queue_hours is 0: the run does not wait"):
        look(run("hasty", 2, max_queue_hours=0))
    assert line["pool"]()["waiting"] == {}


def test_spot_and_on_demand_wait_in_lines_of_their_own(line):
    service_quotas.set_quota("ml.p4d.24xlarge", 2, spot=True)
    look, run, running = line["look"], line["run"], line["running"]
    running.start("busy", 4)  # on-demand is full
    on_demand = run("od", 1)
    spot = run("sp", 1, spot=True, max_wait_hours=48)
    assert look(on_demand)["admitted"] is False
    assert look(spot)["admitted"] is True
    assert spot["quota"]["pool"] == "ml.p4d.24xlarge#spot"
    assert list(line["pool"](spot=True)["holds"]) == [spot["job"]["job_id"]]


def test_every_end_of_a_run_leaves_the_line_for_the_runs_behind_it(line):
    look, run, running = line["look"], line["run"], line["running"]
    running.start("busy", 3)
    head, behind = run("head", 2), run("behind", 1)
    look(head)
    line["clock"].now += 1
    look(behind)
    assert behind["quota"]["position"] == 2  # 1 is free, but head is first
    # head is stopped while it waits: its teardown (on_execution_end's) takes it out of the line
    queue.leave(line["ddb"], line["settings"], compute_of(head), head["job"]["job_id"])
    assert look(behind)["admitted"] is True


def test_a_run_allowed_a_long_wait_looks_less_often_to_stay_within_the_execution_history():
    from lustrain_core.spec import Compute

    settings = Settings(extra={queue.POLL_SETTING: "30"})
    # 9 history events a look; Step Functions keeps 25,000 per execution
    for hours, every in ((1, 30), (24, 44), (168, 303)):
        compute = Compute(max_queue_hours=hours)
        assert queue.poll_seconds(settings, compute) == every
        assert hours * 3600 / every * 9 < 25_000 - 5_000  # room for the rest of the run
    # the stack's QueueMaxLooks moves the bound (the twin sets it out of the way: its waits are shrunk, hours not)
    unbound = Settings(extra={queue.POLL_SETTING: "30", queue.MAX_LOOKS_SETTING: "1000000"})
    assert queue.poll_seconds(unbound, Compute(max_queue_hours=168)) == 30


def test_the_sweeper_takes_ended_and_unknown_runs_out_of_the_line(line):
    look, run, running = line["look"], line["run"], line["running"]
    running.start("busy", 4)
    ended, alive = run("ended", 1), run("alive", 1)
    look(ended), look(alive)
    records.set_fields(line["ddb"], line["settings"].jobs_table, ended["job"]["job_id"], {"status": "FAILED"})

    dead = run("dead", 1)
    look(dead)  # its execution is gone (no teardown ever ran), its record still RUNNING

    released = queue.prune(line["ddb"], line["settings"], running=lambda record: record.job_id != dead["job"]["job_id"])

    assert sorted((r["job_id"], r["reason"]) for r in released) == sorted(
        [
            (ended["job"]["job_id"], "its run ended FAILED"),
            (dead["job"]["job_id"], "its execution run-1 is no longer running"),
        ]
    )
    assert list(line["pool"]()["waiting"]) == [alive["job"]["job_id"]]
    # a run still queued has no resources: its deadline is past the time it may still wait
    record = records.JobRecord.from_stored(job_record(line["settings"].jobs_table, alive["job"]["job_id"]))
    assert sweep.deadline(record, 6) > line["clock"].now + 24 * 3600


def test_a_run_sagemaker_refused_goes_back_in_its_place_and_its_wait_keeps_counting(line):
    look, run, running, clock = line["look"], line["run"], line["running"], line["clock"]
    refused = run("refused", 2)
    assert look(refused)["admitted"] is True
    order = refused["quota"]["order"]
    clock.now += 1
    later = run("later", 2)
    running.start("someone-elses", 4)  # another workload took the quota before CreateTrainingJob
    assert look(later)["admitted"] is False
    queue.release_hold(line["ddb"], line["settings"], compute_of(refused), refused["job"]["job_id"])
    clock.now += 119
    refused["failure"] = {"Error": QuotaExceeded.__name__, "Cause": "ResourceLimitExceeded"}
    refused["recovery"] = {"attempts": [], "retry": True, "refusals": 1, "refused": True}

    back = look(refused)

    # back at its first place, ahead of the run that queued after it, with the 120 s since its admission counted
    assert (back["admitted"], back["order"], back["position"]) == (False, order, 1)
    assert back["queued_s"] == 120
    assert look(later)["position"] == 2
    # it waits at least one look, even with room: a quota SageMaker counts otherwise cannot spin it
    running.end("someone-elses")
    assert look(refused)["admitted"] is True


def test_a_retried_look_after_its_admission_is_admitted_again_in_the_same_place(line):
    look, run, clock = line["look"], line["run"], line["clock"]
    first = run("first", 2)
    retried = {key: value for key, value in first.items()}  # the same input, as Lambda retries it
    answer = look(first)
    clock.now += 5
    again = look(retried)
    assert (again["admitted"], again["order"], again["admitted_at"]) == (True, answer["order"], answer["admitted_at"])
    # one hold, not two
    assert list(line["pool"]()["holds"]) == [first["job"]["job_id"]]
    record = job_record(line["settings"].jobs_table, first["job"]["job_id"])
    assert record["queue"] == {"state": "admitted", "pool": "ml.p4d.24xlarge#on-demand", "queued_s": 0,
                               "admitted_at": answer["admitted_at"]}
