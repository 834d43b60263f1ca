"""`lustrain validate | plan | schema`: what a user types, what they read, and the exit codes."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from lustrain.cli import main

DESIGN_PLAN_KEYS = [
    ("network", "ips_needed"),
    ("network", "subnet_prefix_length"),
    ("network", "usable_ips"),
    ("filesystem", "deployment_type"),
    ("filesystem", "storage_gib"),
    ("filesystem", "throughput_mb_s"),
    ("filesystem", "demand_mb_s"),
    ("cost", "total_usd"),
]


def test_plan_json_of_the_50_p4d_example_shows_300_ips_and_a_slash_23(capsys):
    assert main(["plan", "examples/p4d-50x-persistent.yaml", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for section, key in DESIGN_PLAN_KEYS:
        assert key in out[section], f"{section}.{key} missing"
    assert isinstance(out["warnings"], list)
    assert out["network"]["ips_needed"] >= 300
    assert out["network"]["subnet_prefix_length"] == 23
    assert out["filesystem"]["deployment_type"] == "PERSISTENT_2"


def test_plan_prints_a_readable_table(capsys):
    assert main(["plan", "examples/p4d-2x-scratch.yaml"]) == 0
    out = capsys.readouterr().out
    assert "IPs needed" in out and "SCRATCH_2" in out and "$" in out
    # IPs are counted as IPs: the instances' share names what each instance takes, never "N instances"
    assert re.search(r"IPs needed +\d+ \(12 for the instances, 6 each with 4 EFA interfaces; \d+ for Lustre; "
                     r"\d+ headroom\)", out), out
    # the trainer's memory plan of its preset (300m on 2 x p4d): a whole replica fits a GPU
    assert re.search(r"memory +\d[\d,]+ parameters, ddp .*fits yes", out)
    assert re.search(r"checkpoint +[\d.]+ GB .* SIGTERM to saved [\d.]+ s at worst", out)


def test_an_invalid_spec_exits_2_naming_field_value_and_allowed(tmp_path, capsys):
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        "name: gpt\ncompute: {instance_count: 0}\ndata: {s3_uri: s3://bkt/d/}\noutput: {s3_uri: s3://bkt/o/}\n"
    )
    assert main(["plan", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "compute.instance_count" in err and "got 0" in err and "greater than or equal to 1" in err


def test_a_plan_rule_broken_exits_2(tmp_path, capsys):
    spec = tmp_path / "budget.yaml"
    spec.write_text(
        "name: gpt\ndata: {s3_uri: s3://bkt/d/, size_gib: 1}\noutput: {s3_uri: s3://bkt/o/}\nbudget: {max_usd: 1}\n"
    )
    assert main(["plan", str(spec)]) == 2
    assert "budget.max_usd" in capsys.readouterr().err


def test_validate_ok_and_missing_file(capsys):
    assert main(["validate", "examples/tiny.yaml"]) == 0
    assert "valid job spec 'tiny'" in capsys.readouterr().out
    assert main(["validate", "examples/nope.yaml"]) == 2


def test_usage_errors_exit_2():
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2


def test_schema_is_json_schema_for_editors(tmp_path):
    out = tmp_path / "schema.json"
    assert main(["schema", "-o", str(out)]) == 0
    schema = json.loads(out.read_text())
    assert schema["title"] == "lustrain job spec v1"
    assert "compute" in schema["properties"]


def test_the_console_script_is_installed():
    done = subprocess.run(
        [sys.executable, "-m", "lustrain.cli", "plan", "examples/tiny.yaml", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["network"]["ips_needed"] > 0


def test_data_prepare_makes_token_shards_from_a_text_tree(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("def f():\n    return 1\n" * 200)
    (src / "b.txt").write_text("hello lustre\n" * 300)
    out = tmp_path / "shards"

    assert main(["data", "prepare", str(src), str(out)]) == 0

    index = json.loads((out / "index.json").read_text())
    assert index and any(p.suffix == ".bin" for p in out.iterdir())
    # the preparation's own options may come first, --help included
    assert main(["data", "prepare", "--tokenizer", "bytes", str(src), str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "index.json").read_bytes() == (out / "index.json").read_bytes().replace(
        str(out).encode(), str(tmp_path / "again").encode()
    ) or json.loads((tmp_path / "again" / "index.json").read_text())["splits"] == index["splits"]
    with pytest.raises(SystemExit) as helped:
        main(["data", "prepare", "--help"])
    assert helped.value.code == 0 and "--tokenizer" in capsys.readouterr().out


def test_data_prepare_refuses_a_missing_source(tmp_path, capsys):
    assert main(["data", "prepare", str(tmp_path / "nope"), str(tmp_path / "out")]) == 2


@pytest.mark.parametrize("command", ["validate", "plan"])
@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ("name: sg-team\n", "name"),
        ("name: gpt\nimage: {framework_version: '1.2'}\n", "image.framework_version"),
        ("name: gpt\ntags: {team: 'a#b'}\n", "tags.team"),
        ("name: gpt\ncode: {environment: {'NCCL-DEBUG': INFO}}\n", "code.environment.NCCL-DEBUG"),
    ],
)
def test_a_spec_aws_would_refuse_at_launch_exits_2_at_validate_and_plan(tmp_path, capsys, command, extra, field):
    spec = tmp_path / "launch.yaml"
    spec.write_text(extra + "data: {s3_uri: s3://bkt/d/, size_gib: 1}\noutput: {s3_uri: s3://bkt/o/}\n")
    assert main([command, str(spec)]) == 2
    assert f"- {field}:" in capsys.readouterr().err


def test_every_lustrain_command_a_message_or_the_docs_name_is_one_the_cli_has():
    """What a message, the README or a page of docs/ tells a user to type (`lustrain submit SPEC`, `lustrain status
    RUN`) is a real command."""
    import argparse
    from pathlib import Path

    from lustrain.cli import _parser

    root = Path(__file__).resolve().parents[2]
    commands = {
        name
        for action in _parser()._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    }
    named: dict[str, set[str]] = {}
    docs = [root / "README.md", *root.glob("docs/*.md")]
    sources = [*root.glob("lustrain/**/*.py"), *root.glob("functions/**/*.py"), *docs]
    # in a page, also what a command line of a code block runs (`    lustrain watch tiny`, `.venv/bin/lustrain ...`)
    in_docs = re.compile(r"(?:`|^ {4,}|`\.venv/bin/)lustrain ([a-z][a-z-]*)", re.MULTILINE)
    for path in sources:
        pattern = in_docs if path.suffix == ".md" else re.compile(r"`lustrain ([a-z][a-z-]*)")
        for found in pattern.finditer(path.read_text()):
            named.setdefault(found.group(1), set()).add(str(path.relative_to(root)))
    assert {"submit", "status", "runs"} <= set(named)  # the scan reads what it should
    named_in_docs = {name for name, files in named.items() if any(f.startswith("docs/") for f in files)}
    assert {"local", "rehearse"} <= named_in_docs  # and docs/ too
    assert {name: files for name, files in named.items() if name not in commands} == {}


def _no_aws(monkeypatch):
    # no region and no endpoint: an AWS call would fail with exit 1, so exit 2 shows nothing was asked of AWS
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["s3://bkt/text/", "OUT", "--stack", "lustrain"], "output"),
        (["s3://bkt/text/", "s3://bkt/shards/", "--stack=lustrain", "--instances", "0"], "instances"),
        (["s3://bkt/text/", "s3://bkt/text/shards/", "--stack", "lustrain"], ""),
        (["s3://bkt/text/", "s3://bkt/shards/", "--stack", "lustrain", "--instance-type", "c5"], "instance_type"),
    ],
)
def test_data_prepare_on_a_stack_refuses_a_preparation_it_cannot_run_before_any_aws_call(
    tmp_path, capsys, monkeypatch, argv, field
):
    _no_aws(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert main(["data", "prepare", *argv]) == 2
    err = capsys.readouterr().err
    assert f"{field}:" in err if field else "overlap" in err
    assert list(tmp_path.iterdir()) == []


def test_data_prepare_with_an_instance_type_needs_a_stack(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["data", "prepare", "s3://bkt/text/", "s3://bkt/shards/", "--instance-type", "ml.c5.xlarge"])
    assert exc.value.code == 2 and "--stack" in capsys.readouterr().err


def test_a_prepare_specs_name_comes_from_its_output_folder():
    from lustrain.submit import prepare_spec_of

    assert prepare_spec_of("s3://bkt/text/", "s3://bkt/Shards_BPE.32k/")["name"] == "shards-bpe-32k"
    assert prepare_spec_of("s3://bkt/text/", "s3://out-bkt")["name"] == "out-bkt"
    mine = prepare_spec_of("s3://bkt/text/", "s3://bkt/out/", name="mine", instances=3)
    assert (mine["name"], mine["instances"]) == ("mine", 3)


def test_a_prepare_spec_validates_as_one(capsys):
    assert main(["validate", "examples/prepare.yaml"]) == 0
    said = capsys.readouterr().out
    assert "valid data preparation spec 'corpus-bpe'" in said and "lustrain submit" in said
