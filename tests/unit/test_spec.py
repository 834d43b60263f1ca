"""The job spec: field names fixed, unknown keys refused, every error naming its field."""

from __future__ import annotations

import json
import time

import pytest
from lustrain_core.errors import SpecInvalid
from lustrain_core.launch_plan import checkpoint_location
from lustrain_core.spec import MAX_SPEC_BYTES, json_schema, load_spec

MINIMAL = "name: gpt\ndata: {s3_uri: s3://bkt/data/}\noutput: {s3_uri: s3://bkt/out/}\n"


def errors_of(text: str) -> dict[str, str]:
    with pytest.raises(SpecInvalid) as info:
        load_spec(text)
    return {e.path: e.message for e in info.value.errors}


def test_minimal_spec_gets_design_defaults():
    spec = load_spec(MINIMAL)
    assert spec.compute.instance_type == "ml.p4d.24xlarge"
    assert spec.compute.instance_count == 2
    assert spec.image.framework_version == "2.8" and spec.image.uri is None
    assert spec.code.distribution == "torchrun"
    assert spec.filesystem.deployment_type == "scratch"
    assert spec.filesystem.mount_path == "/data"
    assert spec.network.vpc_cidr == "10.80.0.0/16"
    # each run checkpoints under its own job id, below the output by default
    assert checkpoint_location(spec, "gpt-0badc0de") == "s3://bkt/out/gpt-0badc0de/checkpoints/"


def test_json_and_yaml_give_the_same_spec():
    doc = {"name": "gpt", "data": {"s3_uri": "s3://bkt/data/"}, "output": {"s3_uri": "s3://bkt/out/"}}
    assert load_spec(json.dumps(doc)) == load_spec(MINIMAL)


def test_every_field_name_of_the_design_is_accepted():
    text = """
name: gpt-small
compute: {instance_type: ml.p4d.24xlarge, instance_count: 2, spot: true, max_runtime_hours: 24, max_wait_hours: 48}
image: {framework_version: "2.8", uri: null}
code: {source: trainer/, entry_point: train.py, hyperparameters: {lr: 0.001}, distribution: torchrun, environment: {A: b}}
data: {s3_uri: s3://bucket/prefix/, size_gib: null, ingest_mb_s_per_gpu: 100}
filesystem: {deployment_type: persistent, storage_gib: auto, throughput_per_tib: 250, compression: lz4,
             mount_path: /data, keep: false, file_system_id: null}
network: {vpc_cidr: 10.80.0.0/16, subnet_prefix_length: auto, availability_zone: auto, subnet_id: null,
          security_group_ids: []}
output: {s3_uri: s3://bucket/results/, expected_size_gib: 10, to_filesystem: false}
checkpoints: {s3_uri: null}
budget: {max_usd: null}
tags: {team: ml}
"""
    spec = load_spec(text)
    assert spec.filesystem.throughput_per_tib == 250


def test_unknown_keys_are_errors_that_list_the_allowed_ones():
    errs = errors_of(MINIMAL + "compute: {instance_cout: 3}\n")
    assert "compute.instance_cout" in errs
    assert "instance_count" in errs["compute.instance_cout"]


def test_several_errors_are_reported_together_each_with_path_and_value():
    with pytest.raises(SpecInvalid) as info:
        load_spec("name: Bad_Name\ncompute: {instance_count: 0}\ndata: {s3_uri: nope}\n")
    text = str(info.value)
    paths = {e.path for e in info.value.errors}
    assert {"name", "compute.instance_count", "data.s3_uri", "output"} <= paths
    assert "'Bad_Name'" in text and "a-z, 0-9" in text
    assert "got 0" in text


@pytest.mark.parametrize(
    ("patch", "path", "words"),
    [
        ("compute: {max_wait_hours: 30}", "compute", "spot"),
        (
            "compute: {spot: true, max_runtime_hours: 10, max_wait_hours: 5}",
            "compute",
            ">= max_runtime_hours",
        ),
        ("compute: {max_runtime_hours: 700}", "compute.max_runtime_hours", "672"),
        (
            "image: {uri: 123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1, framework_version: '2.8'}",
            "image",
            "exactly one",
        ),
        ("filesystem: {throughput_per_tib: 250}", "filesystem", "persistent"),
        ("filesystem: {storage_gib: big}", "filesystem.storage_gib", "auto"),
        ("filesystem: {compression: zstd}", "filesystem.compression", "lz4"),
        ("network: {vpc_cidr: 8.8.8.0/24}", "network.vpc_cidr", "private"),
        ("network: {subnet_prefix_length: 30}", "network.subnet_prefix_length", "16 to 28"),
        ("network: {subnet_id: subnet-0123456789abcdef0}", "network", "security_group_ids"),
        ("code: {entry_point: ../evil.py}", "code.entry_point", "inside code.source"),
        ("code: {distribution: mpi}", "code.distribution", "torchrun"),
        ("tags: {'aws:x': y}", "tags", "reserved"),
    ],
)
def test_bad_values_name_the_field_and_what_is_allowed(patch, path, words):
    errs = errors_of(MINIMAL + patch + "\n")
    assert path in errs, errs
    assert words in errs[path]


def test_custom_image_uri_replaces_the_default_framework_version():
    spec = load_spec(MINIMAL + "image: {uri: 123456789012.dkr.ecr.us-east-1.amazonaws.com/my/img:1}\n")
    assert spec.image.framework_version is None


def test_a_spec_over_one_mebibyte_is_refused_before_parsing():
    big = MINIMAL + "# " + "x" * (MAX_SPEC_BYTES + 10) + "\n"
    errs = errors_of(big)
    assert "at most 1 MiB" in errs[""]


def test_an_alias_bomb_is_refused_quickly():
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 10):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 9)}]")
    started = time.monotonic()
    errs = errors_of("\n".join(lines) + "\n")
    assert time.monotonic() - started < 5  # expanded, this document has 9**10 strings
    assert "alias" in errs[""]


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string", "42", "{not: [valid", "\x00\x01"])
def test_documents_that_are_not_a_mapping_are_refused_clearly(text):
    errs = errors_of(text)
    assert "" in errs


def test_yaml_tags_that_build_objects_are_refused():
    errs = errors_of("!!python/object/apply:os.system ['echo hi']\n")
    assert "not valid YAML" in errs[""]


def test_schema_names_every_top_level_field_and_forbids_extras():
    schema = json_schema()
    assert set(schema["properties"]) == {
        "name",
        "compute",
        "image",
        "code",
        "data",
        "filesystem",
        "network",
        "output",
        "checkpoints",
        "budget",
        "tags",
    }
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"name", "data", "output"}
