"""The rehearsal's example data (rehearse.ensure_data) on the twin's S3: made with the tokenizer the rehearsal was
given, with what the trainer reads to know it (index.json, tokenizer.json), and cached apart per tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from lustrain_core.spec import load_spec_file
from moto import mock_aws

from lustrain.twin import rehearse

EXAMPLES = Path(__file__).parents[3] / "examples"


def test_an_empty_data_prefix_is_filled_with_shards_of_the_rehearsals_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rehearse, "CACHE", tmp_path / "cache")
    said: list[str] = []
    llama, tiny = load_spec_file(EXAMPLES / "llama-tiny.yaml"), load_spec_file(EXAMPLES / "tiny.yaml")
    with mock_aws():
        rehearse.ensure_data(llama, said.append, "bpe:4096")
        rehearse.ensure_data(tiny, said.append)
        s3 = boto3.Session(aws_access_key_id="k", aws_secret_access_key="k", region_name="us-east-1").client(
            "s3"
        )

        def index_and_files(uri: str) -> tuple[dict[str, object], set[str]]:
            bucket, _, prefix = uri.removeprefix("s3://").partition("/")
            listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
            body = s3.get_object(Bucket=bucket, Key=prefix + "index.json")["Body"].read()
            return json.loads(body), {o["Key"].removeprefix(prefix) for o in listed}

        bpe_index, bpe_files = index_and_files(llama.data.s3_uri)
        bytes_index, bytes_files = index_and_files(tiny.data.s3_uri)

    assert bpe_index["tokenizer"]["kind"] == "bpe" and bpe_index["tokenizer"]["vocab_size"] == 4096
    assert "tokenizer.json" in bpe_files
    assert bytes_index["tokenizer"]["kind"] == "bytes" and "tokenizer.json" not in bytes_files
    # the same text, in fewer tokens
    assert bpe_index["splits"]["val"]["bytes"] == bytes_index["splits"]["val"]["bytes"]
    assert bpe_index["splits"]["train"]["tokens"] < bytes_index["splits"]["train"]["tokens"] / 2
    assert "tokenizer bpe:4096" in said[0] and "tokenizer bytes" in said[1]
    assert sorted(p.name.rsplit("-", 1)[-1] for p in (tmp_path / "cache").iterdir()) == ["bpe4096", "bytes"]
