"""A data preparation spec (kind: prepare): what it may say, and `lustrain plan`'s estimate of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lustrain_core import prepare_plan
from lustrain_core.errors import SpecInvalid
from lustrain_core.prices import INSTANCE_TYPES
from lustrain_core.spec import is_prepare, load_spec, parse_document, validate_prepare_spec

from lustrain.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "prepare.yaml"


def _spec(**changes: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "kind": "prepare",
        "name": "corpus",
        "source": "s3://bkt/text/",
        "output": "s3://bkt/shards/",
    }
    doc.update(changes)
    return doc


def test_the_example_is_a_prepare_spec_and_never_a_training_one() -> None:
    doc = parse_document(EXAMPLE.read_bytes())
    assert is_prepare(doc)
    spec = validate_prepare_spec(doc)
    assert (spec.instances, spec.tokenizer) == (8, "bpe:32768")
    with pytest.raises(SpecInvalid, match="kind"):
        load_spec(EXAMPLE.read_bytes())


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"instances": 101}, "instances"),
        ({"instances": 0}, "instances"),
        ({"source": "/local/text"}, "source"),
        ({"output": "s3://bkt/text/shards/"}, "overlap"),
        ({"instance_type": "c5.xlarge"}, "instance_type"),
        ({"tags": {"lustrain:job-id": "x"}}, "reserved"),
        ({"gpus": 8}, "gpus"),
    ],
)
def test_bad_fields_are_named(changes: dict[str, object], field: str) -> None:
    with pytest.raises(SpecInvalid, match=field):
        validate_prepare_spec(_spec(**changes))


def test_plan_estimates_time_and_cost_and_more_instances_shorten_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", str(EXAMPLE), "--json"]) == 0
    eight = json.loads(capsys.readouterr().out)
    assert eight["stages"] == ["plan x1", "work x8", "merge x1"]
    assert eight["cost_usd"] > 0 and eight["wall_hours"] > 0
    one = tmp_path / "one.yaml"
    one.write_text(EXAMPLE.read_text().replace("instances: 8", "instances: 1"))
    assert main(["plan", str(one), "--json"]) == 0
    single = json.loads(capsys.readouterr().out)
    assert single["wall_hours"] > 4 * eight["wall_hours"]
    price = INSTANCE_TYPES["ml.c5.xlarge"].hourly_usd
    assert eight == prepare_plan.plan_of("corpus-bpe", "bpe:32768", 8, "ml.c5.xlarge", 500.0, price)
    assert eight["rate_source"].startswith("bench/prepare.py")


def test_plan_says_a_stage_over_a_processing_jobs_day_and_the_instances_that_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    two = tmp_path / "two.yaml"
    two.write_text(EXAMPLE.read_text().replace("instances: 8", "instances: 2"))
    assert main(["plan", str(two), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["stage_hours"]["work"] > prepare_plan.MAX_RUNTIME_SECONDS / 3600
    assert plan["too_long"]["field"] == "instances"
    enough = int(plan["too_long"]["message"].rsplit("at least ", 1)[1].split()[0])
    fits = prepare_plan.plan_of("c", "bpe:32768", enough, "ml.c5.xlarge", 500.0, None)
    short = prepare_plan.plan_of("c", "bpe:32768", enough - 1, "ml.c5.xlarge", 500.0, None)
    assert fits["too_long"] is None and short["too_long"] is not None  # the fewest that fit
    assert main(["plan", str(two)]) == 0
    assert "refused: instances: its work stage is estimated at" in capsys.readouterr().out
    with pytest.raises(SpecInvalid) as exc:
        prepare_plan.check_stage_runtimes(plan)
    assert [e.path for e in exc.value.errors] == ["instances"]
    # past what 100 instances of the type do in a day, the answer is bigger instances or a smaller source
    huge = prepare_plan.plan_of("c", "bpe:32768", 100, "ml.c5.xlarge", 50_000.0, None)
    assert "an instance_type with more vCPUs" in huge["too_long"]["message"]
    # the byte tokenizer's rate does not grow with vCPUs: only a smaller source helps
    bytes_only = prepare_plan.plan_of("c", "bytes", 10, "ml.c5.xlarge", 500_000.0, None)
    assert bytes_only["too_long"]["message"].endswith(
        "on 10 instances, and would be on 100: split the source into several runs"
    )
    # a one-instance stage (plan, merge) too long names the source, which more instances do not shorten
    merge = prepare_plan._too_long({"plan": 60.0, "work": 3600.0, "merge": 30 * 3600.0}, "bytes", 8, 4, 2**40)
    assert merge is not None and merge["field"] == "source" and "merge stage" in merge["message"]


def test_plan_without_a_size_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "nosize.yaml"
    spec.write_text(EXAMPLE.read_text().replace("size_gib: 500\n", ""))
    assert main(["plan", str(spec)]) != 0
    assert "size_gib" in capsys.readouterr().err


def test_a_preparation_is_looked_at_often_while_a_stage_starts_then_every_ten_minutes():
    from lustrain_core.steps import prepare

    waits = [prepare.wait_after(n) for n in range(1, 40)]
    assert waits[: prepare.QUICK_LOOKS - 1] == [60] * (prepare.QUICK_LOOKS - 1)
    assert set(waits[prepare.QUICK_LOOKS :]) == {600}


def test_a_preparations_subnet_holds_its_instances_and_headroom():
    from lustrain_core import prepare_plan
    from lustrain_core.planner import usable_ips

    for instances in (1, 2, 6, 7, 50, 100):
        cidr = prepare_plan.subnet_cidr(instances)
        assert cidr.startswith("10.80.0.0/")
        assert usable_ips(int(cidr.split("/")[1])) >= instances + 5
    assert prepare_plan.subnet_cidr(2) == "10.80.0.0/28"
    assert prepare_plan.subnet_cidr(100) == "10.80.0.0/25"


@pytest.mark.parametrize(
    ("code", "message"),
    [("ValidationException", "Could not find requested job with name x"), ("ResourceNotFound", "no such job")],
)
def test_a_stage_that_does_not_exist_is_none_whatever_words_sagemaker_answers_it_with(code: str, message: str) -> None:
    """DescribeProcessingJob's model lists ResourceNotFound; AWS answers a ValidationException whose text is not
    a contract: either is a stage not started yet, and any other error is raised."""
    from botocore.exceptions import ClientError
    from lustrain_core.steps import prepare

    class SageMaker:
        def __init__(self, error: str, text: str) -> None:
            self.error, self.text = error, text

        def describe_processing_job(self, ProcessingJobName: str) -> dict:
            raise ClientError({"Error": {"Code": self.error, "Message": self.text}}, "DescribeProcessingJob")

    assert prepare.describe(SageMaker(code, message), "x") is None
    with pytest.raises(ClientError):
        prepare.describe(SageMaker("ThrottlingException", "slow down"), "x")


@pytest.mark.parametrize(
    ("name", "written"),
    [
        ("index.json", True), ("prepare-plan.json", True), ("tokenizer.json", True), ("train-00000-000.bin", True),
        ("val-00012-003.bin", True), ("train-00000-000.bin.tmp", True), ("parts/part-00000.json", True),
        ("plan/files-00000.json", True), ("notes.txt", False), ("model.pt", False),
        ("train-llama-0123abcd/checkpoints/x", False), ("index.json.bak", False), ("val.bin", False),
    ],
)  # fmt: skip
def test_what_a_preparation_writes_under_its_output_is_named_once(name: str, written: bool) -> None:
    # the trainer writes and replaces these; register_job refuses an output holding anything else (its copy of
    # the same module, which tests/unit/test_memory_plan.py holds byte for byte to the trainer's)
    from lustrain_core.trainer import layout

    assert layout.is_output(name) is written
