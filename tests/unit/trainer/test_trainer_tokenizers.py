"""`prepare --tokenizer bytes | bpe:VOCAB | PATH`: the index (version 2) that records the tokenizer, uint32 shards for
a large vocabulary, and the trainer that takes its vocabulary from the data and refuses another tokenizer's model."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lustrain_trainer import generate, trainer
from lustrain_trainer import prepare as prep
from lustrain_trainer import tokenizer as tok
from lustrain_trainer.data import BatchPlan, Prefetcher, ShardReader
from lustrain_trainer.shards import read_index

from lustrain.cli import main as cli_main

TRAINER = Path(__file__).resolve().parents[3] / "trainer"
MICRO = ["--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--seq_len", "16", "--batch_size", "2",
         "--eval_interval", "0", "--log_interval", "1", "--max_steps", "2"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few dozen KB of real text (stdlib modules), enough for a BPE of a few hundred merges."""
    root = tmp_path_factory.mktemp("corpus")
    for rel, path in prep.source_files(prep.stdlib_source_dir(), "json/*.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(path.read_bytes())
    (root / "accents.txt").write_text("caf\u00e9 na\u00efve \u2014 \u00fcber \U0001f600\n" * 20)
    return root


def documents(out: Path, split: str = "train") -> tuple[list[np.ndarray], np.ndarray]:
    """A split's documents as token arrays (cut after each EOS), and all its tokens."""
    index = read_index(out)
    tokens = np.concatenate([np.fromfile(s.path, dtype=index.dtype) for s in index.splits[split]])
    ends = np.flatnonzero(tokens == index.tokenizer["eos"]) + 1
    return np.split(tokens, ends)[:-1], tokens


def large_vocabulary_tokenizer(path: Path) -> Path:
    """A byte-level tokenizer.json of 70,002 ids, made with the library: its EOS and one word above 65,535."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab.update({f"<unused{i}>": i for i in range(len(alphabet), 70_000)})
    hf = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(["<|end_of_text|>"])  # Llama 3's name for it
    hf.add_tokens(["lustrain"])
    hf.save(str(path))
    return path


def test_bpe_prepare_is_deterministic_and_its_tokens_decode_to_the_text(corpus: Path, tmp_path: Path) -> None:
    # a sample of about 40% of the corpus: the same documents each time, chosen by their content; the second run in
    # a process of its own (the library's hash maps are seeded per process)
    args = ["--tokenizer", "bpe:400", "--bpe-sample", "20KiB", "--val-fraction", "0"]
    assert prep.main([str(corpus), str(tmp_path / "one"), *args]) == 0
    subprocess.run([sys.executable, "-m", "lustrain_trainer.prepare", str(corpus), str(tmp_path / "two"), *args],
                   check=True, capture_output=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})

    one, two = tmp_path / "one", tmp_path / "two"
    assert sorted(p.name for p in one.iterdir()) == ["index.json", "parts", "plan", "prepare-plan.json",
                                                     "tokenizer.json", "train-00000-000.bin"]
    for name in ("index.json", "tokenizer.json", "train-00000-000.bin"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    index = read_index(one)
    info = index.tokenizer
    assert (index.raw["version"], index.dtype, info["kind"], info["vocab_size"]) == (2, "<u2", "bpe", 400)
    assert info["sha256"] == hashlib.sha256((one / "tokenizer.json").read_bytes()).hexdigest()
    sample = index.raw["tokenizer_source"]["sample"]
    assert sample["bytes"] == 20 << 10 and sample["documents"] < index.raw["splits"]["train"]["documents"]
    # BPE compresses, and decoding each document gives back its text exactly; "bytes" counts that text
    docs, tokens = documents(one)
    texts = [p.read_text() for _, p in prep.source_files(corpus, "**/*")]
    assert len(tokens) < 0.6 * index.text_bytes("train") and index.text_bytes("train") == sum(
        len(t.encode()) for t in texts)
    hf = tok.load(info, one)
    assert [hf.decode(d[:-1].tolist()) for d in docs] == texts


def test_a_vocabulary_beyond_65535_gives_uint32_shards_the_loader_reads_exactly(tmp_path: Path) -> None:
    path = large_vocabulary_tokenizer(tmp_path / "big.json")
    src = tmp_path / "src"
    src.mkdir()
    text = "lustrain trains giant models; lustrain " * 40
    (src / "a.txt").write_text(text)
    assert prep.main([str(src), str(tmp_path / "out"), "--tokenizer", str(path), "--val-fraction", "0"]) == 0

    index = read_index(tmp_path / "out")
    assert index.dtype == "<u4" and index.tokenizer["vocab_size"] == 70_002 and index.tokenizer["eos"] == 70_000
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == path.read_bytes()
    expected = np.array([*tok.load(index.tokenizer, tmp_path / "out").encode(text), 70000])
    _, tokens = documents(tmp_path / "out")
    assert np.array_equal(tokens, expected) and (tokens == 70_001).sum() == 80  # "lustrain", above 16 bits
    # the training loader: every batch's tokens, widened on the device, are the shard's
    plan = BatchPlan([s.tokens for s in index.splits["train"]], 2, 8, 0, 1, seed=1, shuffle=False)
    prefetch = Prefetcher(plan, ShardReader(index, "train"), 0, 2, pin=False)
    try:
        for _ in range(plan.per_rank):
            batch = prefetch.next()
            x, y = batch.inputs_targets(torch.device("cpu"), 2, 8)
            span = expected[batch.offset : batch.offset + plan.batch_tokens]
            assert np.array_equal(x.flatten().numpy(), span[:-1]) and np.array_equal(y.flatten().numpy(), span[1:])
    finally:
        prefetch.close()


def test_a_version_1_index_still_reads_as_the_byte_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("print('hello')\n" * 50)
    assert prep.main([str(tmp_path / "src"), str(tmp_path / "out"), "--val-fraction", "0"]) == 0
    raw = json.loads((tmp_path / "out" / "index.json").read_text())
    # what an index of before tokenizers were recorded holds
    raw.update(version=1, tokenizer={"kind": "bytes", "vocab_size": 257, "eos": 256})
    del raw["splits"]["train"]["bytes"]
    (tmp_path / "out" / "index.json").write_text(json.dumps(raw))

    index = read_index(tmp_path / "out")
    assert (index.dtype, index.tokenizer) == ("<u2", tok.TOKENIZER_INFO)
    assert index.text_bytes("train") == 15 * 50  # tokens less one EOS per document
    assert ShardReader(index, "train").read(0, 0, 6).tolist() == list(b"print(")
    raw["dtype"] = "<u4"
    (tmp_path / "out" / "index.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="version 1 with <u2"):
        read_index(tmp_path / "out")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("bpe:12", "--tokenizer bpe:12: VOCAB must be a whole number from 257 to 1048576"),
        ("bpe:lots", "--tokenizer bpe:lots: VOCAB must be a whole number"),
        ("missing.json", "--tokenizer {tmp}/missing.json: no such file; allowed: bytes | bpe:VOCAB | PATH"),
        ("notes.txt", "--tokenizer {tmp}/notes.txt is not a Hugging Face tokenizer.json"),
        ("s3://bucket-only", "an S3 URL names a bucket and a key"),
    ],
)
def test_a_bad_tokenizer_is_refused_naming_the_option_and_creating_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, message: str) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text('{"not": "a tokenizer"}')
    if not value.startswith(("bpe", "s3")):
        value = str(tmp_path / value)
    # through the CLI as a user types it
    assert cli_main(["data", "prepare", str(tmp_path / "src"), str(tmp_path / "out"), "--tokenizer", value]) == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_model_takes_the_datas_tokenizer_and_refuses_another_ones_checkpoint(
        corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bpe, byte = tmp_path / "bpe", tmp_path / "bytes"
    assert prep.main([str(corpus), str(bpe), "--tokenizer", "bpe:300", "--val-fraction", "0"]) == 0
    assert prep.main([str(corpus), str(byte), "--val-fraction", "0"]) == 0
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "LUSTRAIN_"))}
    env.update(SM_TRAINING_ENV="{}", SM_CHANNEL_TRAINING=str(bpe), SM_MODEL_DIR=str(run / "model"),
               SM_OUTPUT_DATA_DIR=str(run / "output"), SM_CHECKPOINT_DIR=str(run / "checkpoints"),
               SM_HOSTS='["algo-1"]', SM_CURRENT_HOST="algo-1")
    # the training process, as on an image without Hugging Face tokenizers: it reads ids and never imports it
    blocked = "import sys; sys.modules['tokenizers'] = None; import train; sys.exit(train.main())"
    done = subprocess.run([sys.executable, "-c", blocked, *MICRO], cwd=TRAINER, env=env, text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr

    info = read_index(bpe).tokenizer
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["tokenizer"] == info and config["model"]["vocab_size"] == 300
    assert (run / "model" / "tokenizer.json").read_bytes() == (bpe / "tokenizer.json").read_bytes()
    manifest = json.loads((run / "checkpoints" / "step-000000002.json").read_text())
    assert manifest["tokenizer"] == info
    # generate decodes with the model's own tokenizer
    capsys.readouterr()
    assert generate.main([str(run / "model"), "--prompt", "import json", "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.startswith("import json")

    # the same checkpoint_dir on byte-tokenized data: refused, both tokenizers named
    with monkeypatch.context() as patch:
        for key, value in {**env, "SM_CHANNEL_TRAINING": str(byte)}.items():
            patch.setenv(key, value)
        assert trainer.main([*MICRO, "--max_steps", "4"]) == 2
    error = capsys.readouterr().err
    assert f"is a model of tokenizer bpe (vocab_size 300, eos 0, sha256 {info['sha256'][:12]})" in error
    assert f"the data {byte} is tokenized with bytes (vocab_size 257, eos 256)" in error


@pytest.mark.parametrize("tokenizer", ["bpe:300", "file"])
def test_a_special_tokens_text_in_a_document_stays_text(tmp_path: Path, tokenizer: str) -> None:
    """A corpus about tokenizers holds "<|endoftext|>" as text: it is encoded as its characters, so the shards hold
    exactly one EOS per document (the one the pipeline appends) and each document decodes back to its text."""
    src = tmp_path / "src"
    src.mkdir()
    texts = [f"document {n}: the GPT-2 end token is written <|endoftext|> and Llama 3's <|end_of_text|>\n" * 5
             for n in range(3)]
    for n, text in enumerate(texts):
        (src / f"doc-{n}.txt").write_text(text)
    args = ["--val-fraction", "0"]
    if tokenizer == "file":
        args += ["--tokenizer", str(large_vocabulary_tokenizer(tmp_path / "tokenizer.json"))]  # EOS <|end_of_text|>
    else:
        args += ["--tokenizer", tokenizer]
    assert prep.main([str(src), str(tmp_path / "out"), *args]) == 0
    docs, tokens = documents(tmp_path / "out")
    eos = read_index(tmp_path / "out").tokenizer["eos"]
    assert int((tokens == eos).sum()) == len(texts) == len(docs)
    hf = tok.load(read_index(tmp_path / "out").tokenizer, tmp_path / "out")
    assert sorted(hf.decode(d[:-1].tolist()) for d in docs) == sorted(texts)
