"""`lustrain data prepare SRC OUT --tokenizer s3://BUCKET/KEY`: a team's existing tokenizer.json, read from S3."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
from lustrain_trainer import tokenizer as tok
from lustrain_trainer.shards import read_index
from moto import mock_aws

from lustrain.cli import main as cli_main


def small_tokenizer_json() -> bytes:
    """A byte-level BPE of a few merges, GPT-2's EOS name, made with the library (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.train_from_iterator(["the cat sat on the mat"] * 10, trainer=trainers.BpeTrainer(
        vocab_size=262, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return hf.to_str().encode()


def test_a_tokenizer_json_in_s3_tokenizes_the_data_and_travels_with_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = small_tokenizer_json()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("the cat sat on the mat\n")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="team-tokenizers")
        s3.put_object(Bucket="team-tokenizers", Key="gpt2/tokenizer.json", Body=text)

        out = tmp_path / "out"
        assert cli_main(["data", "prepare", str(tmp_path / "src"), str(out), "--val-fraction", "0",
                         "--tokenizer", "s3://team-tokenizers/gpt2/tokenizer.json"]) == 0
        missing = ["data", "prepare", str(tmp_path / "src"), str(tmp_path / "none"),
                   "--tokenizer", "s3://team-tokenizers/llama3/tokenizer.json"]
        assert cli_main(missing) == 2

    assert "--tokenizer s3://team-tokenizers/llama3/tokenizer.json: NoSuchKey" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
    index = read_index(out)
    assert (out / "tokenizer.json").read_bytes() == text
    assert index.tokenizer["kind"] == "file" and index.tokenizer["vocab_size"] == 262
    assert index.tokenizer["eos"] == 0  # <|endoftext|>, GPT-2's name for it
    tokens = tok.load(index.tokenizer, out)
    assert tokens.decode(tokens.encode("the cat sat on the mat\n")) == "the cat sat on the mat\n"
    assert index.tokens("train") < len("the cat sat on the mat\n")  # merges, not bytes
