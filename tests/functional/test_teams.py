"""Runs belong to a team (lustrain_core.teams): where a spec is dropped, or what a start through the API names, decides
it; the run's record, tags and results folder carry it; a run resumes only its own team's runs and reads only its
team's secrets, never the chat webhook. Every refusal names the field and what the run may use, and records nothing.
"""

from __future__ import annotations

import json

import boto3
import pytest
from infra_support import REGION, invoke, job_record, seed_data, spec
from lustrain_core.errors import SpecForbidden, SpecInvalid
from lustrain_core.steps import job as job_step
from lustrain_core.steps import records
from test_register_job import drop, records_in

RESULTS = "s3://lustrain-test-results/"
ACCOUNT = "123456789012"
WEBHOOK = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:lustrain-test/chat-AbCdEf"


@pytest.fixture
def teams(aws, monkeypatch):
    """A stack of two teams, its results location s3://lustrain-test-results/ and its secrets by team."""
    monkeypatch.setenv("LUSTRAIN_TEAMS", "vision,speech")
    monkeypatch.setenv("LUSTRAIN_ALLOWED_OUTPUT_PREFIXES", RESULTS)
    monkeypatch.setenv(
        "LUSTRAIN_ALLOWED_SECRETS",
        f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:lustrain-test/${{aws:PrincipalTag/lustrain-team}}/*",
    )
    monkeypatch.setenv("LUSTRAIN_NOTICE_WEBHOOK_SECRET", WEBHOOK)
    seed_data()
    return aws


def of_team(team: str, **sections) -> dict:
    return spec(data={"size_gib": 5}, output={"s3_uri": f"{RESULTS}{team}/"}, **sections)


def test_a_dropped_spec_belongs_to_the_team_of_its_folder_and_carries_it_everywhere(teams):
    job = invoke(
        "register_job", {"execution": "v-1", "input": drop(of_team("vision"), key="jobs/vision/a.yaml")}
    )
    record = job_record(teams.jobs_table, job["job_id"])
    assert record["team"] == "vision"
    assert {"Key": "lustrain:team", "Value": "vision"} in record["launch"]["tags"]
    assert record["launch"]["team"] == "vision"
    assert record["launch"]["checkpoint_s3_uri"] == f"{RESULTS}vision/{job['job_id']}/checkpoints/"


@pytest.mark.parametrize("key", ["jobs/a.yaml", "jobs/robotics/a.yaml"])
def test_a_drop_outside_a_teams_folder_of_a_stack_of_teams_is_refused_naming_them(teams, key):
    with pytest.raises(SpecForbidden) as refused:
        invoke("register_job", {"execution": "x", "input": drop(of_team("vision"), key=key)})
    assert refused.value.details["field"] == "detail.object.key"
    assert "jobs/<team>/" in str(refused.value) and "vision, speech" in str(refused.value)
    assert records_in(teams.jobs_table) == []


def test_a_start_through_the_api_names_one_of_the_stacks_teams(teams):
    for team in (None, "robotics", ["vision"]):
        start = {"spec": of_team("vision"), **({} if team is None else {"team": team})}
        with pytest.raises(SpecForbidden) as refused:
            invoke("register_job", {"execution": "api", "input": start})
        assert refused.value.details["field"] == "team" and "vision, speech" in str(refused.value)
    assert records_in(teams.jobs_table) == []
    job = invoke("register_job", {"execution": "api", "input": {"spec": of_team("speech"), "team": "speech"}})
    assert job_record(teams.jobs_table, job["job_id"])["team"] == "speech"


def test_a_run_writes_only_its_teams_folder(teams):
    with pytest.raises(SpecForbidden) as refused:
        invoke("register_job", {"execution": "x", "input": drop(of_team("speech"), key="jobs/vision/a.yaml")})
    assert refused.value.details["field"] == "output.s3_uri"
    assert (
        f"{RESULTS}vision/" in str(refused.value)
        and f"{RESULTS}speech/" not in str(refused.value).split(":", 1)[1]
    )
    assert records_in(teams.jobs_table) == []


def checkpoint_of(job_id: str, team: str, run_claimed: str, **config) -> str:
    """A committed checkpoint manifest in a run's checkpoint folder, claiming to be `run_claimed`'s."""
    manifest = {
        "run": run_claimed,
        "shape": {"preset": "tiny", "default_preset": "tiny", "overrides": {}},
        "model_config": {"n_layer": 2, **config},
    }
    key = f"{team}/{job_id}/checkpoints/step-000000006.json"
    boto3.client("s3", region_name=REGION).put_object(
        Bucket="lustrain-test-results", Key=key, Body=json.dumps(manifest).encode()
    )
    return f"s3://lustrain-test-results/{key}"


def test_a_run_resumes_only_a_run_of_its_team_and_learns_nothing_of_another_teams(teams):
    vision = invoke(
        "register_job", {"execution": "v", "input": drop(of_team("vision"), key="jobs/vision/v.yaml")}
    )
    checkpoint_of(vision["job_id"], "vision", vision["job_id"], n_layer=7)
    hyper = {"hyperparameters": {"preset": "tiny"}}

    # speech names vision's run by its id, and a run that does not exist: one answer for both, nothing of the model
    causes = []
    for named in (vision["job_id"], "tiny-0badc0de"):
        doc = of_team("speech", code={**spec()["code"], **hyper}, checkpoints={"resume_from": named})
        with pytest.raises(SpecInvalid) as refused:
            invoke(
                "register_job", {"execution": f"s-{len(causes)}", "input": {"spec": doc, "team": "speech"}}
            )
        assert [e.path for e in refused.value.errors] == ["checkpoints.resume_from"]
        causes.append(refused.value.errors[0].message)
    assert len(set(causes)) == 1 and "no run of team speech" in causes[0]
    assert "n_layer" not in causes[0] and "vision" not in causes[0]
    # ... and by its checkpoints' location, which lies outside speech's folders: refused naming those
    where = f"{RESULTS}vision/{vision['job_id']}/checkpoints/"
    doc = of_team("speech", code={**spec()["code"], **hyper}, checkpoints={"resume_from": where})
    with pytest.raises(SpecForbidden) as forbidden:
        invoke("register_job", {"execution": "s-uri", "input": {"spec": doc, "team": "speech"}})
    assert forbidden.value.details["field"] == "checkpoints.resume_from"
    assert f"use a location under {RESULTS}speech/" in str(forbidden.value) and "n_layer" not in str(
        forbidden.value
    )
    assert len(records_in(teams.jobs_table)) == 1  # vision's run alone: no refusal recorded anything

    # within the team, the resume tag is the record's run id, whatever the manifest claims
    other = invoke(
        "register_job", {"execution": "v2", "input": drop(of_team("vision"), key="jobs/vision/w.yaml")}
    )
    checkpoint_of(other["job_id"], "vision", "someone-else-0123abcd", n_layer=2)
    doc = of_team("vision", code={**spec()["code"], **hyper}, checkpoints={"resume_from": other["job_id"]})
    resumed = invoke("register_job", {"execution": "v3", "input": {"spec": doc, "team": "vision"}})
    launch = job_record(teams.jobs_table, resumed["job_id"])["launch"]
    assert launch["resume"]["run"] == other["job_id"]
    assert launch["resume"]["s3_uri"] == f"{RESULTS}vision/{other['job_id']}/checkpoints/step-000000006"


def test_a_job_reads_only_its_teams_secrets_and_never_the_chat_webhook(teams):
    own = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:lustrain-test/vision/hf-AbCdEf"
    theirs = own.replace("/vision/", "/speech/")
    for name, arn, rule in (
        ("HOOK", WEBHOOK, "LUSTRAIN_NOTICE_WEBHOOK_SECRET"),
        ("HOOK", WEBHOOK.removesuffix("-AbCdEf"), "LUSTRAIN_NOTICE_WEBHOOK_SECRET"),
        ("TOKEN", theirs, "LUSTRAIN_ALLOWED_SECRETS"),
    ):
        doc = of_team("vision", code={**spec()["code"], "secrets": {name: arn}})
        with pytest.raises(SpecForbidden) as refused:
            invoke("register_job", {"execution": "x", "input": {"spec": doc, "team": "vision"}})
        assert (refused.value.details["field"], refused.value.details["rule"]) == (
            f"code.secrets.{name}",
            rule,
        )
        # the refusal names what the run may use instead: its team's secrets
        assert "lustrain-test/vision/*" in str(refused.value)
    assert records_in(teams.jobs_table) == []
    doc = of_team("vision", code={**spec()["code"], "secrets": {"TOKEN": own}})
    assert (
        invoke("register_job", {"execution": "ok", "input": {"spec": doc, "team": "vision"}})["kind"]
        == "train"
    )


def test_a_one_team_stack_takes_a_spec_anywhere_under_jobs(aws):
    seed_data()
    for key in ("jobs/a.yaml", "jobs/some/folder/b.yaml"):
        job = invoke("register_job", {"execution": key, "input": drop(spec(data={"size_gib": 5}), key=key)})
        found = records.get(boto3.client("dynamodb", region_name=REGION), aws.jobs_table, job["job_id"])
        assert found is not None and found.team == "default"
    assert job_step.team_of(job_step.parse_start({"execution": "e", "input": {"spec": {}}}), aws) == "default"


def test_a_run_recorded_before_teams_is_not_resumed_where_no_job_may_read_it(teams):
    """A run whose checkpoints lie outside the team's folders (recorded before the stack had teams) is refused at
    registration, naming where a job may read, rather than failing its job with AccessDenied after all is built."""
    old = "tiny-0a1b2c3d"
    ddb = boto3.client("dynamodb", region_name=REGION)
    launch = {"checkpoint_s3_uri": f"{RESULTS}tiny/{old}/checkpoints/"}
    records.put_new(ddb, teams.jobs_table, records.JobRecord(job_id=old, team="vision", launch=launch))
    doc = of_team("vision", checkpoints={"resume_from": old})
    with pytest.raises(SpecInvalid) as refused:
        invoke("register_job", {"execution": "late", "input": {"spec": doc, "team": "vision"}})
    assert [e.path for e in refused.value.errors] == ["checkpoints.resume_from"]
    assert f"outside team vision's folders ({RESULTS}vision/)" in refused.value.errors[0].message


def test_a_run_reads_no_other_teams_results_as_its_data(teams):
    """Data, code and a preparation's source under a results location lie in the run's own team's folder: FSx would
    bring another team's checkpoints into the run's file system, which IAM does not guard."""
    for field, sections in (
        ("data.s3_uri", {"data": {"s3_uri": f"{RESULTS}speech/speech-0123abcd/checkpoints/", "size_gib": 5}}),
        ("code.source", {"code": {**spec()["code"], "source": f"{RESULTS}speech/code/"}}),
    ):
        doc = {**of_team("vision"), **sections}
        with pytest.raises(SpecForbidden) as refused:
            invoke("register_job", {"execution": "x", "input": {"spec": doc, "team": "vision"}})
        assert refused.value.details["field"] == field and f"{RESULTS}vision/" in str(refused.value)
    prep = {
        "kind": "prepare",
        "name": "c",
        "source": f"{RESULTS}speech/text/",
        "output": f"{RESULTS}vision/c/",
    }
    with pytest.raises(SpecForbidden) as refused:
        invoke("register_job", {"execution": "p", "input": {"spec": prep, "team": "vision"}})
    assert refused.value.details["field"] == "source"
    assert records_in(teams.jobs_table) == []
