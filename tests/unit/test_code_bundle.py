"""sourcedir.tar.gz: the same files give the same bytes, and what goes in is checked before SageMaker sees it."""

from __future__ import annotations

import gzip
import io
import json
import tarfile

import pytest
from lustrain_core.errors import SpecInvalid
from lustrain_core.steps.code import build_bundle, check_entry_point, parse_metric_definitions

FILES = [
    ("train.py", b"print('train')\n"),
    ("lustrain_trainer/__init__.py", b""),
    ("lustrain_trainer/model.py", b"class GPT: ...\n"),
    ("metric_definitions.json", b'[{"Name": "train_loss", "Regex": "train_loss=([0-9.]+)"}]'),
]


def members(bundle: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tar:
        return tar.getmembers()


def test_the_same_files_in_any_order_give_the_same_bytes():
    assert build_bundle(FILES) == build_bundle(list(reversed(FILES)))


def test_different_content_gives_different_bytes():
    changed = [(name, body + b"#") if name == "train.py" else (name, body) for name, body in FILES]
    assert build_bundle(changed) != build_bundle(FILES)


def test_entries_are_sorted_with_fixed_times_owners_and_modes():
    entries = members(build_bundle(FILES))
    assert [m.name for m in entries] == sorted(name for name, _ in FILES)
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in entries} == {(0, 0, 0, "", "", 0o644)}


def test_the_gzip_header_carries_no_time_and_no_name():
    bundle = build_bundle(FILES)
    assert bundle[4:8] == b"\0\0\0\0"  # MTIME
    assert bundle[3] & 0x08 == 0  # FNAME flag
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(bundle)), mode="r:") as tar:
        assert tar.extractfile("train.py").read() == b"print('train')\n"


def test_a_missing_entry_point_lists_the_python_files_found():
    with pytest.raises(SpecInvalid) as info:
        check_entry_point([name for name, _ in FILES], "main.py", "s3://code/gpt/")
    (error,) = info.value.errors
    assert error.path == "code.entry_point"
    assert "lustrain_trainer/model.py" in error.message and "train.py" in error.message
    assert "metric_definitions.json" not in error.message


def test_an_entry_point_in_a_subdirectory_is_found():
    check_entry_point(["src/train.py"], "src/train.py", "s3://code/gpt/")


def test_metric_definitions_pass_through():
    body = json.dumps([{"Name": "train_loss", "Regex": r"train_loss=([0-9.]+)"}]).encode()
    assert parse_metric_definitions(body) == [{"Name": "train_loss", "Regex": r"train_loss=([0-9.]+)"}]


def test_more_than_40_metric_definitions_are_refused():
    body = json.dumps([{"Name": f"m{i}", "Regex": f"m{i}=(\\d+)"} for i in range(41)]).encode()
    with pytest.raises(SpecInvalid, match="at most 40"):
        parse_metric_definitions(body)


def test_every_bad_metric_definition_is_named():
    body = json.dumps(
        [
            {"Name": "", "Regex": "x=(\\d+)"},
            {"Name": "ok", "Regex": "r" * 501},
            {"Name": "broken", "Regex": "loss=([0-9"},
            {"Name": "extra", "Regex": "x", "Unit": "s"},
        ]
    ).encode()
    with pytest.raises(SpecInvalid) as info:
        parse_metric_definitions(body)
    messages = [e.message for e in info.value.errors]
    assert len(messages) == 4
    assert messages[0].startswith("metric_definitions.json[0].Name: a string of 1..255")
    assert messages[1].startswith("metric_definitions.json[1].Regex: a string of 1..500")
    assert messages[2].startswith("metric_definitions.json[2].Regex: not a regular expression")
    assert messages[3].startswith('metric_definitions.json[3]: an object with exactly "Name" and "Regex"')
    assert {e.path for e in info.value.errors} == {"code.source"}


def test_metric_definitions_that_are_not_json_say_so():
    with pytest.raises(SpecInvalid, match="not valid JSON"):
        parse_metric_definitions(b"{Name: loss")
