"""The instance-type catalogue (data/instance_types.json): read and checked, planned per type, and one row away
from a new type for every reader: the planner, the launch plan, the network and training steps and the trainer."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from lustrain_core import instance_types
from lustrain_core.errors import SpecInvalid
from lustrain_core.instance_types import INSTANCE_TYPES, CatalogueError, parse, parse_row
from lustrain_core.planner import plan
from lustrain_core.prices import PriceTable
from lustrain_core.spec import Budget, validate_spec

from lustrain.cli import main

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "functions" / "lustrain_core" / "data" / "instance_types.json"
GIANT_TYPES = (
    "ml.p4d.24xlarge",
    "ml.p4de.24xlarge",
    "ml.p5.48xlarge",
    "ml.p5e.48xlarge",
    "ml.p5en.48xlarge",
    "ml.p6-b200.48xlarge",
)
#: EFA interfaces per instance: EC2's network cards with EFA (p4d, p4de), EC2's P5 EFA configuration (p5, p5e),
#: EC2's DescribeInstanceTypes MaximumEfaInterfaces as quoted publicly (p5en, p6-b200; see the rows' notes)
EFA = {
    "ml.p4d.24xlarge": 4,
    "ml.p4de.24xlarge": 4,
    "ml.p5.48xlarge": 32,
    "ml.p5e.48xlarge": 32,
    "ml.p5en.48xlarge": 16,
    "ml.p6-b200.48xlarge": 8,
}


def document() -> dict[str, Any]:
    return json.loads(DATA.read_text())


def spec_for(instance_type: str, count: int = 4) -> Any:
    return validate_spec(
        {
            "name": "catalogue",
            "data": {"s3_uri": "s3://bkt/data/", "size_gib": 100},
            "output": {"s3_uri": "s3://bkt/out/"},
            "compute": {"instance_type": instance_type, "instance_count": count, "max_runtime_hours": 2},
            "code": {"source": "s3://bkt/code/"},
        }
    )


def priced(*names: str) -> PriceTable:
    """The catalogue with a price for the types it has none for (as `--prices` gives one)."""
    return PriceTable().with_overrides({"instance_hourly_usd": {name: 100.0 for name in names}})


def test_the_catalogue_has_the_giant_types_and_the_ones_the_rehearsal_uses() -> None:
    for name in (*GIANT_TYPES, "ml.g5.12xlarge", "ml.g5.48xlarge", "ml.m5.xlarge", "ml.c5.xlarge"):
        assert name in INSTANCE_TYPES


def test_every_row_is_a_training_instance_type_sagemaker_knows() -> None:
    model = botocore.session.get_session().get_service_model("sagemaker")
    offered = set(model.shape_for("TrainingInstanceType").enum)
    assert set(INSTANCE_TYPES) <= offered, set(INSTANCE_TYPES) - offered


def test_every_row_passes_the_specs_and_the_stacks_instance_type_patterns() -> None:
    """A catalogued type can be asked for (compute.instance_type) and allowed by an administrator (the template's
    AllowedInstanceTypes, LUSTRAIN_ALLOWED_INSTANCE_TYPES): ml.p6-b200.48xlarge has a hyphen in its family."""
    from lustrain.twin.cfn import load_template

    allowed = re.compile(
        load_template(ROOT / "template.yaml")["Parameters"]["AllowedInstanceTypes"]["AllowedPattern"]
    )
    for name in INSTANCE_TYPES:
        assert spec_for(name).compute.instance_type == name
        assert allowed.fullmatch(name), name


def test_every_row_names_its_sources_and_what_they_do_not_confirm() -> None:
    for name, row in INSTANCE_TYPES.items():
        assert row.sources.get("ips_per_instance"), name
        assert row.quota_names.training == f"{name} for training job usage"
        assert row.quota_names.spot == f"{name} for spot training job usage"
        assert row.quota_names.warm_pool == f"{name} for training warm pool usage"
        if row.hourly_usd is None:
            assert "hourly_usd" in row.unconfirmed, name
        else:
            assert row.price_as_of and row.price_source, name


@pytest.mark.parametrize("name", GIANT_TYPES)
def test_each_giant_type_is_planned_with_its_efa_interfaces_and_ips(name: str) -> None:
    row = INSTANCE_TYPES[name]
    assert row.efa_interfaces == EFA[name]
    # one IP per EFA interface, the primary and a spare; never below SageMaker's 5 for an EFA instance
    assert row.ips == EFA[name] + 2 >= instance_types.MIN_IPS_EFA
    assert row.gpus == 8 and row.local_nvme and row.bf16_dense_tflops_per_gpu

    p = plan(spec_for(name), prices=priced(name))

    assert p.network.efa_interfaces == EFA[name]
    assert p.network.ips_per_instance == EFA[name] + 2
    assert p.network.ips_for_instances == 4 * (EFA[name] + 2)
    assert p.instance is not None and p.instance["efa_interfaces"] == EFA[name]
    assert p.quota["quota_name"] == f"{name} for training job usage"


def test_p5_needs_a_wider_subnet_than_p4d_for_the_same_count() -> None:
    p4d = plan(spec_for("ml.p4d.24xlarge", 50), prices=priced())
    p5 = plan(spec_for("ml.p5.48xlarge", 50), prices=priced())
    assert p4d.network.ips_for_instances == 300
    assert p5.network.ips_for_instances == 1700
    assert p5.network.subnet_prefix_length is not None and p4d.network.subnet_prefix_length is not None
    assert p5.network.subnet_prefix_length < p4d.network.subnet_prefix_length


def test_plan_json_shows_each_types_efa_interfaces_and_ips(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    spec = tmp_path / "p5en.yaml"
    spec.write_text(
        "name: big\ndata: {s3_uri: 's3://bkt/data/', size_gib: 100}\noutput: {s3_uri: 's3://bkt/out/'}\n"
        "compute: {instance_type: ml.p5en.48xlarge, instance_count: 3, max_runtime_hours: 1}\n"
        "code: {source: 's3://bkt/code/'}\n"
    )
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"instance_hourly_usd": {"ml.p5en.48xlarge": 90.0}, "as_of": "2026-12-01"}))

    assert main(["plan", str(spec), "--json", "--prices", str(prices)]) == 0
    out = json.loads(capsys.readouterr().out)

    assert out["network"]["efa_interfaces"] == 16 and out["network"]["ips_per_instance"] == 18
    assert out["instance"]["efa_interfaces"] == 16 and out["instance"]["ips_per_instance"] == 18
    assert out["instance"]["hourly_usd"] == 90.0 and out["instance"]["price_as_of"] == "2026-12-01"
    assert any("not checked against AWS's documentation" in w for w in out["warnings"])


def test_a_type_without_a_confirmed_price_is_planned_with_its_cost_unknown_and_refused_only_under_a_budget() -> None:
    assert INSTANCE_TYPES["ml.p6-b200.48xlarge"].hourly_usd is None
    unknown = plan(spec_for("ml.p6-b200.48xlarge"))
    # the network, file system, memory and EFA figures are all there; the instances' cost is unknown, not $0
    assert unknown.network.ips_for_instances > 0 and unknown.filesystem.storage_gib and unknown.instance
    assert (unknown.cost.compute_usd, unknown.cost.total_usd, unknown.cost.hourly_usd) == (None, None, None)
    assert unknown.cost.filesystem_usd > 0 and "cost is unknown" in unknown.cost.assumptions[0]
    assert any("no confirmed on-demand price" in w and "--prices" in w for w in unknown.warnings)
    budgeted = spec_for("ml.p6-b200.48xlarge").model_copy(update={"budget": Budget(max_usd=1000)})
    with pytest.raises(SpecInvalid) as refused:
        plan(budgeted)
    error = refused.value.errors[0]
    assert error.path == "compute.instance_type" and "budget.max_usd" in error.message and "--prices" in error.message

    p = plan(spec_for("ml.p6-b200.48xlarge", 2), prices=priced("ml.p6-b200.48xlarge"))
    assert p.cost.compute_usd == 2 * 100.0 * 2


def test_prices_can_add_a_whole_row_for_one_plan() -> None:
    row = copy.deepcopy(document()["instance_types"]["ml.p5en.48xlarge"])
    row.update(
        hourly_usd=70.0,
        price_as_of="2026-12-01",
        quota_names={
            "training": "ml.p5en.48xlarge for training job usage",
            "spot": "ml.p5en.48xlarge for spot training job usage",
        },
    )
    table = PriceTable().with_overrides({"instance_types": {"ml.p5en.48xlarge": row}})
    assert table.instance_types["ml.p5en.48xlarge"].hourly_usd == 70.0
    assert plan(spec_for("ml.p5en.48xlarge"), prices=table).cost.compute_usd == 4 * 70.0 * 2


def test_a_price_alone_for_a_type_outside_the_catalogue_is_refused() -> None:
    with pytest.raises(
        ValueError, match=re.escape("ml.p9.48xlarge is not in the catalogue; add its whole row")
    ):
        PriceTable().with_overrides({"instance_hourly_usd": {"ml.p9.48xlarge": 1.0}})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ips_per_instance": 4}, "ips_per_instance 4 is below SageMaker's floor of 5"),
        ({"efa_interfaces": 0, "ips_per_instance": 1}, "ips_per_instance 1 is below SageMaker's floor of 2"),
        ({"price_as_of": None}, "hourly_usd 37.688 needs price_as_of"),
        ({"usable_output_gib": 9000}, "usable_output_gib 9000.0 is more than its 8000.0 GB of local NVMe"),
        ({"gpus": -1}, "gpus is -1; allowed: a whole number, 0 or more"),
        ({"colour": "red"}, "unknown keys ['colour']"),
        ({"quota_names": {"training": "ml.p5.48xlarge for training job usage", "spot": "x"}}, "quota_names"),
        ({"gpu": None}, "gpu names the GPU"),
        ({"efa_device_rdma": "yes"}, "efa_device_rdma is 'yes'; allowed: true or false"),
        ({"efa_interfaces": 0, "ips_per_instance": 2}, "efa_device_rdma is true for a type without EFA"),
    ],
)
def test_a_row_that_breaks_a_rule_is_refused_naming_the_type_and_field(change: dict, message: str) -> None:
    row = {**document()["instance_types"]["ml.p4d.24xlarge"], **change}
    with pytest.raises(CatalogueError) as refused:
        parse_row("ml.p4d.24xlarge", row)
    assert str(refused.value).startswith("ml.p4d.24xlarge")
    assert message in str(refused.value)


def test_the_shipped_file_parses_to_what_the_modules_hold() -> None:
    assert parse(document()) == INSTANCE_TYPES


def test_local_nvme_and_the_health_check_follow_the_rows() -> None:
    from lustrain_core.launch_plan import instances_of
    from lustrain_core.steps.network import EFA_RULES, required_rules

    def infra_check(spec: Any) -> bool:
        return instances_of(spec).infra_check

    assert INSTANCE_TYPES["ml.p6-b200.48xlarge"].local_nvme and not INSTANCE_TYPES["ml.m5.xlarge"].local_nvme
    assert infra_check(spec_for("ml.p5.48xlarge", 2)) and not infra_check(spec_for("ml.p5.48xlarge", 1))
    assert not infra_check(spec_for("ml.p5en.48xlarge", 2))  # not confirmed for this type: off
    assert set(EFA_RULES) <= set(required_rules("ml.p5en.48xlarge", 1))
    assert not set(EFA_RULES) & set(required_rules("ml.m5.xlarge", 1))


ADD_A_ROW = """
import json, sys
from lustrain_core.planner import plan
from lustrain_core.spec import validate_spec
from lustrain_core.steps.network import EFA_RULES, required_rules
from lustrain_core.launch_plan import instances_of
from lustrain_trainer import plan as trainer_plan

spec = validate_spec({
    "name": "new", "data": {"s3_uri": "s3://bkt/data/", "size_gib": 100}, "output": {"s3_uri": "s3://bkt/out/"},
    "compute": {"instance_type": "ml.p5.4xlarge", "instance_count": 2, "max_runtime_hours": 1},
    "code": {"source": "s3://bkt/code/"},
})
p = plan(spec)
print(json.dumps({
    "efa": p.network.efa_interfaces, "ips": p.network.ips_per_instance, "quota": p.quota["quota_name"],
    "compute_usd": p.cost.compute_usd, "resources": instances_of(spec).model_dump(),
    "infra_check": instances_of(spec).infra_check, "efa_rules": set(EFA_RULES) <= set(required_rules("ml.p5.4xlarge", 2)),
    "peak": trainer_plan.peak_tflops("NVIDIA H100 80GB HBM3", "ml.p5.4xlarge"),
    "trainer_knows": "ml.p5.4xlarge" in trainer_plan.INSTANCES,
}))
"""


def test_adding_a_type_is_one_row(tmp_path: Path) -> None:
    """A copy of the code whose catalogue has one more row (and the trainer its refreshed copy) plans the new type,
    builds its CreateTrainingJob resources, its security group rules and its trainer plan: nothing else changes."""
    shutil.copytree(ROOT / "functions", tmp_path / "functions")
    shutil.copytree(ROOT / "trainer", tmp_path / "trainer")
    catalogue = document()
    catalogue["instance_types"]["ml.p5.4xlarge"] = {
        **catalogue["instance_types"]["ml.p5.48xlarge"],
        "gpus": 1,
        "efa_interfaces": 1,
        "ips_per_instance": 5,
        "local_nvme_gb": 3840,
        "host_memory_gib": 256,
        "infra_check": False,
        "hourly_usd": 12.5,
        "price_as_of": "2026-12-01",
        "quota_names": {
            "training": "ml.p5.4xlarge for training job usage",
            "spot": "ml.p5.4xlarge for spot training job usage",
            "warm_pool": None,
        },
    }
    text = json.dumps(catalogue, indent=2)
    for copy_at in (
        "functions/lustrain_core/data",
        "functions/lustrain_core/trainer",
        "trainer/lustrain_trainer",
    ):
        (tmp_path / copy_at / "instance_types.json").write_text(text)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'functions'}{os.pathsep}{tmp_path / 'trainer'}"}

    done = subprocess.run(
        [sys.executable, "-c", ADD_A_ROW], capture_output=True, text=True, env=env, cwd=tmp_path, check=False
    )

    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["efa"] == 1 and out["ips"] == 5
    assert out["quota"] == "ml.p5.4xlarge for training job usage"
    assert out["compute_usd"] == 2 * 12.5 * 1
    assert out["resources"]["instance_type"] == "ml.p5.4xlarge" and out["resources"]["instance_count"] == 2
    assert out["resources"]["volume_size_gib"] is None  # local NVMe: no volume key
    assert out["infra_check"] is False and out["efa_rules"] is True
    assert out["peak"] == 989.0 and out["trainer_knows"] is True


def test_the_warm_pool_quota_name_comes_from_the_row_and_the_twin_and_the_steps_read_the_same():
    from lustrain_core.instance_types import INSTANCE_TYPES, warm_pool_quota_name
    from lustrain_core.steps import warm_pool

    from lustrain.twin.patches import service_quotas

    row = INSTANCE_TYPES["ml.p4d.24xlarge"]
    assert row.quota_names.warm_pool and warm_pool_quota_name("ml.p4d.24xlarge") == row.quota_names.warm_pool
    assert warm_pool.quota_name("ml.p4d.24xlarge") == service_quotas.warm_pool_quota_name("ml.p4d.24xlarge")
    assert warm_pool_quota_name("ml.x9.large") == "ml.x9.large for training warm pool usage"
