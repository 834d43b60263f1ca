"""The planner's rules, checked with the field guide's own numbers and AWS's limits."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lustrain_core import prepare_plan
from lustrain_core.errors import SpecInvalid
from lustrain_core.planner import lustre_ips, plan, usable_ips, valid_capacities
from lustrain_core.prices import PriceTable
from lustrain_core.spec import (
    is_prepare,
    load_spec,
    load_spec_file,
    parse_document,
    validate_prepare_spec,
    validate_spec,
)


def spec_with(**sections):
    doc = {"name": "gpt", "data": {"s3_uri": "s3://bkt/data/"}, "output": {"s3_uri": "s3://bkt/out/"}}
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    return validate_spec(doc)


def errors_of(spec, **kw):
    with pytest.raises(SpecInvalid) as info:
        plan(spec, **kw)
    return {e.path: e.message for e in info.value.errors}


# --- network -----------------------------------------------------------------------------------------


def test_usable_addresses_of_a_prefix_follow_aws_reserving_five():
    assert usable_ips(24) == 251
    assert usable_ips(23) == 507
    assert usable_ips(28) == 11


def test_the_field_guides_50_p4d_need_300_ips_and_a_slash_23():
    p = plan(load_spec_file("examples/p4d-50x-persistent.yaml"))
    assert p.network.ips_for_instances == 300
    assert p.network.ips_needed >= 300
    assert p.network.subnet_prefix_length == 23
    assert p.network.usable_ips == 507
    assert p.network.subnet_cidr == "10.80.0.0/23"


def test_a_slash_24_for_50_p4d_is_an_error_naming_the_need_and_the_prefix_that_fits():
    spec = spec_with(
        compute={"instance_count": 50},
        network={"subnet_prefix_length": 24},
        data={"size_gib": 1000, "ingest_mb_s_per_gpu": 1},
    )
    msg = errors_of(spec)["network.subnet_prefix_length"]
    assert "251 usable" in msg and "/23" in msg
    assert "50 x 6" in msg


def test_ips_per_instance_follow_the_instance_type():
    assert plan(spec_with(compute={"instance_count": 3})).network.ips_for_instances == 18
    cpu = plan(spec_with(compute={"instance_type": "ml.m5.xlarge", "instance_count": 3}))
    # SageMaker: a training instance without EFA should have at least 2 private IPs
    assert cpu.network.ips_for_instances == 6


def test_auto_prefix_is_the_smallest_subnet_that_fits_and_lustre_counts():
    p = plan(spec_with(compute={"instance_count": 2}))
    n = p.network
    assert n.ips_for_filesystem == lustre_ips(p.filesystem.storage_gib) > 0
    assert usable_ips(n.subnet_prefix_length) >= n.ips_needed
    assert usable_ips(n.subnet_prefix_length + 1) < n.ips_needed


def test_a_vpc_too_small_for_the_run_is_an_error_on_vpc_cidr():
    spec = spec_with(compute={"instance_count": 50}, network={"vpc_cidr": "10.0.0.0/24"})
    assert "too small" in errors_of(spec)["network.vpc_cidr"]


def test_an_existing_subnet_is_planned_without_a_prefix():
    spec = spec_with(
        network={"subnet_id": "subnet-0123456789abcdef0", "security_group_ids": ["sg-0123456789abcdef0"]}
    )
    n = plan(spec).network
    assert n.reuse_subnet_id == "subnet-0123456789abcdef0"
    assert n.subnet_prefix_length is None and n.ips_needed > 0


# --- file system -------------------------------------------------------------------------------------


def test_valid_capacities_are_1200_2400_then_multiples_of_2400():
    assert valid_capacities(10000)[:5] == [1200, 2400, 4800, 7200, 9600]


def test_scratch_throughput_covers_the_gpus_demand():
    p = plan(spec_with(compute={"instance_count": 2}, data={"size_gib": 100, "ingest_mb_s_per_gpu": 100}))
    fs = p.filesystem
    assert fs.deployment_type == "SCRATCH_2"
    assert fs.demand_mb_s == 2 * 8 * 100
    assert fs.throughput_mb_s >= 1600
    # 1600 MB/s at 200 MB/s/TiB needs 8 TiB: the next valid capacity is 9600 GiB
    assert fs.storage_gib == 9600
    assert "throughput" in fs.reason


def test_capacity_holds_the_data_after_lz4_but_images_do_not_compress():
    text = plan(spec_with(data={"size_gib": 3000, "ingest_mb_s_per_gpu": 1}, compute={"instance_count": 1}))
    images = plan(
        spec_with(data={"size_gib": 3000, "ingest_mb_s_per_gpu": 1}, compute={"instance_count": 1}),
        extension_bytes={".jpg": 90, ".json": 10},
    )
    raw = plan(
        spec_with(
            data={"size_gib": 3000, "ingest_mb_s_per_gpu": 1},
            compute={"instance_count": 1},
            filesystem={"compression": "none"},
        )
    )
    # 3000 GiB of text is 2000 GiB stored: 2200 GiB with 10% free fits 2400; uncompressed needs 4800
    assert text.filesystem.storage_gib == 2400
    assert raw.filesystem.storage_gib == 4800
    assert images.filesystem.storage_gib == 4800
    assert text.filesystem.stored_gib < images.filesystem.stored_gib <= raw.filesystem.stored_gib


def test_persistent_auto_picks_the_cheapest_tier_that_serves_the_demand():
    p = plan(load_spec_file("examples/p4d-50x-persistent.yaml"))
    fs = p.filesystem
    assert fs.deployment_type == "PERSISTENT_2"
    assert fs.per_unit_storage_throughput in (125, 250, 500, 1000)
    assert fs.throughput_mb_s >= fs.demand_mb_s
    prices = PriceTable().fsx_gb_month_usd
    chosen = fs.storage_gib * prices[("PERSISTENT_2", fs.throughput_per_tib)]
    for tier in (125, 250, 500, 1000):
        pinned = plan(
            load_spec_file("examples/p4d-50x-persistent.yaml").model_copy(update={"filesystem": p_fs(tier)})
        ).filesystem
        assert chosen <= pinned.storage_gib * prices[("PERSISTENT_2", tier)] + 1e-6


def p_fs(tier):
    from lustrain_core.spec import Filesystem

    return Filesystem(deployment_type="persistent", throughput_per_tib=tier)


def test_an_invalid_capacity_names_the_valid_neighbours():
    msg = errors_of(spec_with(filesystem={"storage_gib": 3000}))["filesystem.storage_gib"]
    assert "2400 or 4800" in msg


def test_an_invalid_persistent_throughput_names_the_valid_values():
    spec = spec_with(filesystem={"deployment_type": "persistent", "throughput_per_tib": 300})
    msg = errors_of(spec)["filesystem.throughput_per_tib"]
    assert "250 or 500" in msg


def test_an_explicit_capacity_too_small_for_the_data_is_an_error():
    spec = spec_with(filesystem={"storage_gib": 1200}, data={"size_gib": 5000})
    assert "too small" in errors_of(spec)["filesystem.storage_gib"]


def test_an_explicit_capacity_below_the_demand_warns_that_gpus_will_wait():
    p = plan(spec_with(filesystem={"storage_gib": 1200}, data={"size_gib": 10}))
    assert any("GPUs will wait" in w for w in p.warnings)


def test_unknown_data_size_is_a_warning_not_a_guess():
    p = plan(spec_with())
    assert any("data.size_gib" in w for w in p.warnings)
    assert plan(spec_with(), data_gib=5000).filesystem.data_gib == 5000


def test_reusing_a_file_system_skips_sizing():
    fs = plan(spec_with(filesystem={"file_system_id": "fs-0123456789abcdef0"})).filesystem
    assert fs.reuse_file_system_id == "fs-0123456789abcdef0" and fs.storage_gib is None


# --- output, cost, budget, quota --------------------------------------------------------------------


def test_output_beyond_the_p4d_local_nvme_must_go_to_lustre():
    msg = errors_of(spec_with(output={"expected_size_gib": 7000}))["output.expected_size_gib"]
    assert "to_filesystem" in msg
    p = plan(spec_with(output={"expected_size_gib": 7000, "to_filesystem": True}, data={"size_gib": 10}))
    assert p.filesystem.storage_gib >= 7000


def test_cost_is_instances_times_price_times_hours_plus_the_file_system():
    p = plan(spec_with(compute={"instance_count": 2, "max_runtime_hours": 10}, data={"size_gib": 100}))
    assert p.cost.compute_usd == pytest.approx(2 * 37.688 * 10, rel=1e-6)
    assert 0 < p.cost.filesystem_usd < p.cost.compute_usd
    assert p.cost.total_usd == pytest.approx(p.cost.compute_usd + p.cost.filesystem_usd, abs=0.01)


def test_spot_is_cheaper_and_prices_can_be_overridden(tmp_path):
    on_demand = plan(spec_with(data={"size_gib": 10})).cost.compute_usd
    spot = plan(spec_with(compute={"spot": True}, data={"size_gib": 10})).cost.compute_usd
    assert spot < on_demand
    override = tmp_path / "prices.json"
    override.write_text('{"instance_hourly_usd": {"ml.p4d.24xlarge": 10}, "as_of": "2027-01-01"}')
    p = plan(spec_with(data={"size_gib": 10}), prices=PriceTable.load(override))
    assert p.cost.compute_usd == pytest.approx(2 * 10 * 24) and p.cost.prices_as_of == "2027-01-01"


def test_a_budget_below_the_estimate_is_refused_with_the_figures():
    msg = errors_of(spec_with(budget={"max_usd": 100}, data={"size_gib": 10}))["budget.max_usd"]
    assert "$1,8" in msg and "instance_count" in msg


def test_quota_carries_what_the_live_check_needs():
    q = plan(spec_with(compute={"instance_count": 7}, data={"size_gib": 1})).quota
    assert q == {
        "instance_type": "ml.p4d.24xlarge",
        "instances_requested": 7,
        "quota_name": "ml.p4d.24xlarge for training job usage",
    }


def test_long_or_kept_runs_are_recommended_persistent():
    assert plan(spec_with(data={"size_gib": 1})).recommendation["deployment_type"] == "scratch"
    long = plan(spec_with(compute={"max_runtime_hours": 200}, data={"size_gib": 1}))
    assert long.recommendation["deployment_type"] == "persistent"
    assert any("persistent recommended" in w for w in long.warnings)


def test_an_unknown_instance_type_is_an_error_listing_the_known_ones():
    msg = errors_of(spec_with(compute={"instance_type": "ml.x9.huge"}))["compute.instance_type"]
    assert "ml.p4d.24xlarge" in msg


def test_every_example_plans():
    examples = sorted(Path("examples").glob("*.yaml"))
    names = {p.name for p in examples}
    assert {"tiny.yaml", "llama-tiny.yaml", "p4d-2x-scratch.yaml", "p4d-50x-persistent.yaml"} <= names
    for path in examples:
        doc = parse_document(path.read_bytes(), source=str(path))
        if is_prepare(doc):  # data preparation: planned by its own planner
            spec = validate_prepare_spec(doc)
            hourly = PriceTable().instance_types[spec.instance_type].hourly_usd
            estimate = prepare_plan.plan_of(spec.name, spec.tokenizer, spec.instances, spec.instance_type,
                                            spec.size_gib, hourly)
            assert estimate["cost_usd"] > 0, path
            continue
        assert plan(load_spec_file(path)).cost.total_usd > 0


# --- properties --------------------------------------------------------------------------------------

instance_types = st.sampled_from([*sorted(PriceTable().instance_types), "ml.p9.unknown"])
specs = st.fixed_dictionaries(
    {
        "name": st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True),
        "data": st.fixed_dictionaries(
            {"s3_uri": st.just("s3://bkt/data/")},
            optional={
                "size_gib": st.one_of(st.none(), st.floats(0.001, 500_000)),
                "ingest_mb_s_per_gpu": st.floats(0.1, 5000),
            },
        ),
        "output": st.fixed_dictionaries(
            {"s3_uri": st.just("s3://bkt/out/")},
            optional={"expected_size_gib": st.floats(0, 50_000), "to_filesystem": st.booleans()},
        ),
    },
    optional={
        "compute": st.fixed_dictionaries(
            {},
            optional={
                "instance_type": instance_types,
                "instance_count": st.integers(-1, 300),
                "spot": st.booleans(),
                "max_runtime_hours": st.floats(0.1, 700),
            },
        ),
        "filesystem": st.fixed_dictionaries(
            {},
            optional={
                "deployment_type": st.sampled_from(["scratch", "persistent"]),
                "storage_gib": st.one_of(st.just("auto"), st.integers(1, 200_000)),
                "throughput_per_tib": st.one_of(st.just("auto"), st.sampled_from([125, 250, 300, 500, 1000])),
                "compression": st.sampled_from(["lz4", "none"]),
            },
        ),
        "network": st.fixed_dictionaries(
            {},
            optional={
                "vpc_cidr": st.sampled_from(
                    ["10.80.0.0/16", "10.0.0.0/24", "192.168.0.0/20", "172.16.0.0/28"]
                ),
                "subnet_prefix_length": st.one_of(st.just("auto"), st.integers(14, 30)),
            },
        ),
        "budget": st.fixed_dictionaries({}, optional={"max_usd": st.floats(1, 1e7)}),
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs)
def test_any_spec_gives_a_plan_or_field_pointed_errors_never_a_crash(doc):
    try:
        p = plan(load_spec(yaml.safe_dump(doc)))
    except SpecInvalid as exc:
        assert exc.errors and all(e.path and e.message for e in exc.errors if e.path != "")
        return
    fs = p.filesystem
    assert fs.storage_gib in valid_capacities(fs.storage_gib)
    assert fs.throughput_mb_s >= fs.demand_mb_s or any("GPUs will wait" in w for w in p.warnings)
    assert usable_ips(p.network.subnet_prefix_length) >= p.network.ips_needed
    # a type with no confirmed price is planned with its cost unknown, never $0
    priced = p.instance is not None and p.instance["hourly_usd"] is not None
    assert (p.cost.total_usd is not None and p.cost.total_usd > 0) if priced else p.cost.total_usd is None


def test_a_throughput_bound_run_is_compared_on_both_types_and_recommended_by_the_figures():
    """50 x p4d over 20 TB for 48 h: the throughput sizes both file systems, and PERSISTENT_2 comes out cheaper
    (and with fewer IPs) than SCRATCH_2, so the plan says so rather than "scratch costs less"."""
    result = plan(spec_with(compute={"instance_count": 50, "max_runtime_hours": 48}, data={"size_gib": 20_000}))
    options = {a["deployment_type"]: a for a in result.filesystem.alternatives}
    scratch, persistent = options["SCRATCH_2"], options["PERSISTENT_2"]
    assert persistent["cost_usd"] < scratch["cost_usd"] and persistent["ips"] < scratch["ips"]
    for option in (scratch, persistent):
        assert option["throughput_mb_s"] >= result.filesystem.demand_mb_s
    assert result.recommendation["deployment_type"] == "persistent"
    why = result.recommendation["why"]
    assert f"${persistent['cost_usd']:,.2f}" in why and f"${scratch['cost_usd']:,.2f}" in why
    assert "costs less" not in why.split(";")[0]


def test_a_short_data_bound_run_is_recommended_scratch_because_its_figures_say_it_costs_less():
    result = plan(spec_with(data={"size_gib": 5000}, compute={"instance_count": 1, "max_runtime_hours": 12}))
    options = {a["deployment_type"]: a for a in result.filesystem.alternatives}
    assert options["SCRATCH_2"]["cost_usd"] < options["PERSISTENT_2"]["cost_usd"]
    assert result.recommendation["deployment_type"] == "scratch"
    assert "costs less" in result.recommendation["why"]


def test_the_plan_shows_the_quota_the_live_check_counts_a_spot_run_against():
    from lustrain_core.launch import compile_offline

    spot = spec_with(compute={"spot": True}, data={"size_gib": 1})
    result, launch = compile_offline(spot)
    assert result.quota["quota_name"] == "ml.p4d.24xlarge for spot training job usage" == launch.quota.name
