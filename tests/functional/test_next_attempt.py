"""next_attempt on moto with the twin's SageMaker: the attempt that just ended is found by the job record's count
and described, and the run policy decides whether another starts."""

from __future__ import annotations

import pytest
from infra_support import invoke, job_record, spec
from training_support import held_training_jobs, training_input


@pytest.fixture
def started(aws):
    from lustrain.twin.patches import service_quotas

    service_quotas.set_quota("ml.p4d.24xlarge", 4, "us-east-1")
    with held_training_jobs():
        yield aws


def ended_in_failure(tokens_table: str, name: str, reason: str) -> None:
    """What SageMaker and on_training_event leave after an attempt failed: the job Failed with its reason, and its
    callback sent (the token no longer waits)."""
    from lustrain_core import clients
    from lustrain_core.steps.training import CALLBACK_SENT
    from moto.sagemaker.models import sagemaker_backends

    from lustrain.twin.patches.sagemaker import _state

    _state(sagemaker_backends["123456789012"]["us-east-1"]).jobs[name]._move("Failed", "Failed", reason)
    clients.client("dynamodb").update_item(
        TableName=tokens_table,
        Key={"training_job_name": {"S": name}},
        UpdateExpression="SET #status = :sent",
        ExpressionAttributeNames={"#status": "status"},
        ExpressionAttributeValues={":sent": {"S": CALLBACK_SENT}},
    )


def failed(event: dict, error: str) -> dict:
    document = {k: v for k, v in event.items() if k != "task_token"}
    return {
        **document,
        "failure": {"Error": error, "Cause": "InternalServerError: We encountered an internal error."},
    }


def test_an_infrastructure_fault_starts_another_attempt_and_the_attempt_is_recorded(started):
    event = training_input()
    name = invoke("start_training", event)["training_job_name"]
    ended_in_failure(started.tokens_table, name, "InternalServerError: We encountered an internal error.")

    decided = invoke("next_attempt", failed(event, "InfrastructureError"))

    assert decided["retry"] is True and decided["wait_seconds"] == 15
    (attempt,) = decided["attempts"]
    assert (attempt["attempt"], attempt["training_job_name"], attempt["failure_class"]) == (
        1,
        name,
        "infrastructure",
    )
    assert attempt["outcome"] == "Failed"
    # the next start_training is attempt 2, with a name of its own
    assert job_record(started.jobs_table, event["job"]["job_id"])["judged_attempt"] == 1
    assert invoke("start_training", event)["training_job_name"].endswith("-2")
    assert job_record(started.jobs_table, event["job"]["job_id"])["training_attempts"] == 2


def test_no_attempt_starts_beside_a_live_job_the_run_ends_clearly(started):
    """A CapacityError reached next_attempt (a forged callback, or one from before events were verified) while
    SageMaker says the job is InProgress: no retry, the reason names the live job, and the run's teardown stops
    it."""
    from lustrain_core import clients

    event = training_input()
    name = invoke("start_training", event)["training_job_name"]

    decided = invoke("next_attempt", failed(event, "CapacityError"))

    assert decided["retry"] is False and decided["wait_seconds"] == 0
    assert (
        f"{name} is InProgress" in decided["reason"]
        and "no other attempt starts beside a live one" in decided["reason"]
    )
    (attempt,) = decided["attempts"]
    assert (attempt["training_job_name"], attempt["outcome"]) == (name, "InProgress")
    jobs = clients.client("sagemaker").list_training_jobs()["TrainingJobSummaries"]
    assert [j["TrainingJobName"] for j in jobs] == [name]


def test_the_users_own_error_ends_the_run_and_the_last_attempt_allowed_is_the_last(started):
    event = training_input(spec(compute={"instance_count": 2, "max_runtime_hours": 1, "max_attempts": 1}))
    invoke("start_training", event)

    user = invoke("next_attempt", failed(event, "TrainingFailed"))
    assert user["retry"] is False and "not retried" in user["reason"]
    capacity = invoke("next_attempt", failed(event, "CapacityError"))
    assert capacity["retry"] is False and "compute.max_attempts=1" in capacity["reason"]


def test_a_start_sagemaker_refused_is_no_attempt_and_goes_back_to_the_queue_a_bounded_number_of_times(
    started,
):
    from lustrain_core import clients, recovery

    event = training_input()
    # CreateTrainingJob answered ResourceLimitExceeded: the record counts the try (names are unique forever), no
    # job exists
    clients.client("dynamodb").update_item(
        TableName=started.jobs_table,
        Key={"job_id": {"S": event["job"]["job_id"]}},
        UpdateExpression="SET training_attempts = :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
    )
    decided = invoke("next_attempt", failed(event, "QuotaExceeded"))
    assert (decided["retry"], decided["wait_seconds"], decided["attempts"]) == (True, 0, [])
    assert (decided["refusals"], decided["refused"]) == (1, True)
    assert "back to the capacity queue" in decided["reason"]

    # the run's document does not grow with refusals, and a quota SageMaker counts otherwise cannot loop forever
    event["recovery"] = {**decided, "refusals": recovery.MAX_REFUSALS}
    last = invoke("next_attempt", failed(event, "QuotaExceeded"))
    assert (last["retry"], last["refusals"]) == (False, recovery.MAX_REFUSALS + 1)
    assert f"refused the run's job {recovery.MAX_REFUSALS + 1} times" in last["reason"]
