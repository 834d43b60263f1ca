"""`prepare s3://SRC s3://OUT`: the corpus read from S3 by each worker itself, the shards, parts, plan and index written
to S3, the same bytes as a local preparation of the same files."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from lustrain_trainer import prepare as prep
from moto import mock_aws

FILES = {
    "a.py": b"def a():\n    return 1\n" * 300,
    "pkg/b.py": b"class B:\n    pass\n" * 400,
    "pkg/c.txt": "caf\u00e9 au lait\n".encode() * 500,
    "pkg/image.png": b"\x89PNG\r\n\x1a\n\x00\x00binary",
    "pkg/__pycache__/b.cpython-311.pyc": b"compiled",
    "d.md": b"# notes\n" * 900,
}
ARGS = ["--shard-size", "4KiB", "--val-fraction", "0.1"]


def test_s3_in_and_out_match_a_local_preparation_of_the_same_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for rel, data in FILES.items():
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_bytes(data)
    assert prep.main([str(tmp_path / "src"), str(tmp_path / "local"), *ARGS]) == 0
    local = {p.relative_to(tmp_path / "local").as_posix(): p.read_bytes()
             for p in (tmp_path / "local").rglob("*") if p.is_file()}

    # from S3 every text file is "large": spooled to the worker's disk and tokenized a chunk at a time
    monkeypatch.setattr(prep, "WHOLE_FILE", 1000)
    monkeypatch.setattr(prep, "READ_CHUNK", 300)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        for bucket in ("corpus", "prepared"):
            s3.create_bucket(Bucket=bucket)
        for rel, data in FILES.items():
            s3.put_object(Bucket="corpus", Key=f"web/{rel}", Body=data)
        s3.put_object(Bucket="corpus", Key="web/pkg/", Body=b"")  # a console "folder"
        src, out = "s3://corpus/web", "s3://prepared/runs/one/"
        # plan, two workers, merge, as a Processing job runs them
        assert prep.main([src, out, *ARGS, "--stage", "plan"]) == 0
        assert prep.main([out, "--stage", "merge"]) == 2
        assert "5 of 5 parts are not whole in s3://prepared/runs/one: part-00000, part-00001" in capsys.readouterr().err
        for k in range(2):
            assert prep.main([src, out, "--stage", "work", "--worker", str(k), "--workers", "2"]) == 0
        assert prep.main([out, "--stage", "merge"]) == 0
        keys = {o["Key"]: o for o in s3.list_objects_v2(Bucket="prepared")["Contents"]}
        remote = {key.removeprefix("runs/one/"): s3.get_object(Bucket="prepared", Key=key)["Body"].read()
                  for key in keys}
        # another plan into the same OUT removes the previous preparation's files
        assert prep.main([src, out, "--shard-size", "1MiB", "--stage", "plan"]) == 0
        replanned = [o["Key"] for o in s3.list_objects_v2(Bucket="prepared")["Contents"]]
        missing = prep.main(["s3://nowhere/web", str(tmp_path / "none"), "--stage", "plan"])

    assert missing == 2 and "listing s3://nowhere/web: NoSuchBucket" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
    assert replanned == ["runs/one/plan/files-00000.json", "runs/one/plan/files-00001.json",
                         "runs/one/prepare-plan.json"]
    assert sorted(remote) == sorted(local)
    shards = [name for name in local if name.endswith(".bin")]
    assert len(shards) > 3 and all(remote[name] == local[name] for name in shards)
    index, local_index = json.loads(remote["index.json"]), json.loads(local["index.json"])
    assert index["source"].pop("root") == "s3://corpus/web"
    local_index["source"].pop("root")
    assert index == local_index
    assert index["source"]["files_matched"] == 5  # the compiled file's directory is skipped there too


def test_the_listing_streams_a_page_at_a_time_in_key_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 10^8 keys the plan never holds the listing: the first file is there after one ListObjectsV2 call (a page
    of 1,000 keys; 10 here), and the keys come in the order a sort of their paths gives."""
    monkeypatch.setattr(prep.S3Store, "page_keys", 10)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="corpus")
        names = [f"web/d{k % 7}/f{k:04d}.txt" for k in range(25)]
        for name in names:
            s3.put_object(Bucket="corpus", Key=name, Body=b"x")
        store = prep.store_of("s3://corpus/web")
        calls: list[str] = []
        store.client.meta.events.register("before-call.s3.ListObjectsV2", lambda **_: calls.append("list"))

        files = store.files("**/*.txt")
        first = next(files)
        assert calls == ["list"]
        rest = [rel for rel, _ in files]

    assert len(calls) == 3
    assert [first[0], *rest] == sorted(name.removeprefix("web/") for name in names)
