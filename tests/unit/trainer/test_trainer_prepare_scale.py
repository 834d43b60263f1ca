"""`prepare` at the scale it exists for (20 TB in 10^8 files): what each stage holds and reads does not grow with the
corpus, and the output is byte for byte what reading every file whole gives.

Each test asserts what the code touches: the files a worker reads, the entries the BPE sample holds, the largest
read and the largest text the tokenizer is given; never a time or a resident-memory guess.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lustrain_trainer import prepare as prep
from lustrain_trainer import tokenizer as tok
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers

#: small shards, so that the small corpus is cut into several parts
SMALL = ["--shard-size", "8KiB", "--val-fraction", "0.1"]
#: what a pre-tokenizer's regex must see right around a cut: contractions, whitespace runs before a word or a
#: newline, digits, an added token's text, characters of several bytes
PIECES = [
    "a",
    "bc",
    "\u00e9",
    "1",
    "23",
    " ",
    "  ",
    "\n",
    "\t",
    "'s",
    "'re",
    ".",
    "!",
    "<|endoftext|>",
    "\U0001f600",
    "\u00fc",
    "  \n",
    "...",
]
#: Llama 3's pre-tokenizer regex (its tokenizer.json): a Split then a ByteLevel without a regex of its own
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stdlib's json package, a large text file (above the small WHOLE_FILE the tests set), and two large files
    that are binary only at their very end."""
    root = tmp_path_factory.mktemp("corpus")
    for rel, path in prep.source_files(prep.stdlib_source_dir(), "json/*.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(path.read_bytes())
    rng = random.Random(5)
    (root / "big" / "text.txt").parent.mkdir()
    (root / "big" / "text.txt").write_text("".join(rng.choice(PIECES) for _ in range(12_000)))
    (root / "big" / "nul.txt").write_bytes(b"text " * 3000 + b"\0")
    (root / "big" / "latin1.txt").write_bytes(b"text " * 3000 + b"\xe9")
    return root


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def outputs(root: Path) -> dict[str, bytes]:
    """What a preparation delivers: the shards, index.json and tokenizer.json."""
    return {
        rel: data
        for rel, data in tree(root).items()
        if rel.endswith(".bin") or ("/" not in rel and rel != "prepare-plan.json")
    }


def test_a_worker_reads_the_small_plan_and_its_own_parts_lists_only(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    assert prep.main([str(corpus), str(out), *SMALL, "--stage", "plan"]) == 0
    plan = json.loads((out / "prepare-plan.json").read_text())
    # the plan names its parts and totals; no file of the corpus is in it (at 10^8 files it was 7 GB)
    assert "json/decoder.py" not in (out / "prepare-plan.json").read_text()
    files = len(tree(corpus))
    assert plan["source"]["files"] == files and len(plan["parts"]) > 4
    assert sum(p["files"] for p in plan["parts"]) == files and {p["list"] for p in plan["parts"]} == {
        f"plan/files-{p['part']:05d}.json" for p in plan["parts"]
    }
    for part in plan["parts"]:  # each list is the JSON of its part, its sha256 the plan's
        text = (out / part["list"]).read_bytes()
        assert text == (json.dumps(json.loads(text), separators=(",", ":")) + "\n").encode()
        assert hashlib.sha256(text).hexdigest() == part["sha256"]
    read: list[str] = []
    for name in ("read", "read_if_any"):
        real = getattr(prep.LocalStore, name)

        def recorded(self: prep.LocalStore, rel: str, real: Any = real) -> Any:
            if self.root == out:
                read.append(rel)
            return real(self, rel)

        monkeypatch.setattr(prep.LocalStore, name, recorded)

    prep.work(prep.store_of(corpus), prep.store_of(out), 1, 2, say=lambda _: None)

    lists = sorted(rel for rel in read if rel.startswith("plan/"))
    assert lists == [f"plan/files-{p:05d}.json" for p in range(1, len(plan["parts"]), 2)]
    assert sorted(set(read) - set(lists)) == ["prepare-plan.json"]


def test_a_list_that_is_not_the_plans_is_refused_naming_it(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert prep.main([str(corpus), str(out), *SMALL, "--stage", "plan"]) == 0
    (out / "plan" / "files-00001.json").write_text('{"files": []}\n')
    assert prep.main([str(corpus), str(out), "--stage", "work", "--worker", "0", "--workers", "1"]) == 2
    assert (
        f"{out}/plan/files-00001.json is not the list the plan recorded: plan again"
        in capsys.readouterr().err
    )


def reference_sample(entries: list[list[Any]], data: dict[str, bytes], limit: int) -> list[str]:
    """The sample as the plan chose it when it held the whole listing: all files in listing order when they fit,
    else sorted by path hash, the binary ones skipped, up to `limit` bytes."""
    total = sum(e[2] for e in entries)
    order = (
        entries if total <= limit else sorted(entries, key=lambda e: hashlib.sha256(e[0].encode()).digest())
    )
    texts, used = [], 0
    for rel, _, take in order:
        if used >= limit:
            break
        if prep.is_text(data[rel]):
            piece = data[rel][: min(take, limit - used)]
            texts.append(piece.decode("utf-8", errors="ignore"))
            used += len(piece)
    return texts


class Files:
    """A store of files in memory, as the sample reads them."""

    def __init__(self, data: dict[str, bytes]) -> None:
        self.data = data

    def read(self, rel: str) -> bytes:
        return self.data[rel]


@pytest.mark.parametrize("limit", [300, 5_000, 10**9])
def test_the_bpe_sample_holds_only_what_it_takes_and_is_the_one_a_sort_of_the_whole_listing_gives(
    limit: int,
) -> None:
    rng = random.Random(limit)
    # 3,000 files of 50 to 150 bytes, one in three binary: the sample skips them and reads further in hash order
    data = {
        f"d{k // 100}/f{k:05d}.txt": (b"\0" if k % 3 == 0 else b"")
        + bytes(rng.choices(b"abc \n", k=rng.randint(50, 150)))
        for k in range(3000)
    }
    entries = [[rel, len(body), len(body)] for rel, body in sorted(data.items())]
    chooser = prep.SampleChooser(limit)
    held = 0
    for index, entry in enumerate(entries):
        chooser.add(index, entry)
        held = max(held, len(chooser.heap))

    texts, info = prep.bpe_sample(Files(data), chooser, lambda: entries, limit)  # type: ignore[arg-type]

    assert texts == reference_sample(entries, data, limit)
    assert info["bytes"] == min(limit, sum(len(t.encode()) for t in texts))
    # the heap holds the files that reach the limit (at least 50 bytes each) and one more, not the listing
    assert held <= (min(limit, 150 * 3000) // 50 + 2 if limit < 10**9 else 3000)
    if limit < 10**9:
        assert held < 3000 // 10


def test_a_large_file_is_read_and_tokenized_in_chunks_to_the_same_bytes(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = [*SMALL, "--tokenizer", "bpe:400"]
    assert prep.main([str(corpus), str(tmp_path / "whole"), *args]) == 0
    whole = outputs(tmp_path / "whole")
    # now every file of more than 4 KiB is read 1 KiB at a time and encoded about 2,000 characters at a time
    monkeypatch.setattr(prep, "WHOLE_FILE", 4096)
    monkeypatch.setattr(prep, "READ_CHUNK", 1024)
    monkeypatch.setattr(tok, "STREAM_CHARS", 2000)
    monkeypatch.setattr(tok, "STREAM_MARGIN", 100)
    reads: list[tuple[str, int]] = []
    real_read = prep.LocalStore.read

    def read(self: prep.LocalStore, rel: str) -> bytes:
        data = real_read(self, rel)
        if self.root == corpus:
            reads.append((rel, len(data)))
        return data

    encoded: list[int] = []
    real_load = prep.load_tokenizer

    def load_tokenizer(out: prep.Store, info: dict[str, Any]) -> Any:
        encoder = real_load(out, info)
        encoder.hf = Recording(encoder.hf, encoded)
        return encoder

    monkeypatch.setattr(prep.LocalStore, "read", read)
    monkeypatch.setattr(prep, "load_tokenizer", load_tokenizer)

    assert prep.main([str(corpus), str(tmp_path / "chunked"), *args]) == 0

    assert outputs(tmp_path / "chunked") == whole
    big = (corpus / "big" / "text.txt").stat().st_size
    assert big > 4 * 4096 and not [rel for rel, _ in reads if rel.startswith("big/")]
    assert max(size for _, size in reads) <= 4096
    # a text of a small file whole, or of a large one about STREAM_CHARS at a time: never the large file whole
    assert encoded and max(encoded) <= 4096 < big // 4


class Recording:
    """A `tokenizers` Tokenizer whose encode calls record the length of each text they are given."""

    def __init__(self, hf: Any, lengths: list[int]) -> None:
        self.hf, self.lengths = hf, lengths

    def __getattr__(self, name: str) -> Any:
        return getattr(self.hf, name)

    def encode(self, text: str, **kwargs: Any) -> Any:
        self.lengths.append(len(text))
        return self.hf.encode(text, **kwargs)

    def encode_batch(self, texts: list[str], **kwargs: Any) -> Any:
        self.lengths += [len(text) for text in texts]
        return self.hf.encode_batch(texts, **kwargs)


def llama3_like(bpe: tok.HFTokenizer) -> tok.HFTokenizer:
    hf = Tokenizer.from_str(bpe.hf.to_str())
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    return tok.from_json(hf.to_str().encode(), kind="file")


def test_a_document_encoded_in_chunks_gives_the_tokens_of_the_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tok, "STREAM_CHARS", 64)
    monkeypatch.setattr(tok, "STREAM_MARGIN", 16)
    monkeypatch.setattr(tok, "STREAM_LOOK", 8)
    monkeypatch.setattr(tok, "STREAM_PIECES", 4)
    rng = random.Random(0)
    corpus = ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, 300))) for _ in range(100)]
    gpt2 = tok.from_json(tok.train_bpe(corpus, 400), kind="bpe")
    hf = Tokenizer.from_str(gpt2.hf.to_str())
    hf.normalizer = normalizers.NFC()
    normalized = tok.from_json(hf.to_str().encode(), kind="file")
    assert gpt2.chunkable and llama3_like(gpt2).chunkable and not normalized.chunkable
    for encoder in (gpt2, llama3_like(gpt2), normalized, tok.ByteTokenizer()):
        for _ in range(60):
            document = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 1500))).encode()
            cuts = sorted(rng.sample(range(len(document) + 1), min(len(document) + 1, rng.randint(0, 20))))
            chunks = [document[a:b] for a, b in zip([0, *cuts], [*cuts, len(document)], strict=True)]
            streamed = np.concatenate(list(encoder.encode_stream(chunks)))
            assert streamed.tolist() == encoder.encode_document(document).tolist()
