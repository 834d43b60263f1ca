"""`python -m lustrain_trainer.prepare SRC OUT`: a tree of text files into token shards plus an index."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from lustrain_trainer import prepare as prep
from lustrain_trainer.data import ShardReader
from lustrain_trainer.shards import DataError, read_index
from lustrain_trainer.tokenizer import EOS


def make_tree(root: Path) -> dict[str, bytes]:
    files = {
        "a.py": b"def a():\n    return 1\n",
        "pkg/b.py": b"class B:\n    pass\n",
        "pkg/deep/c.txt": "caf\u00e9 au lait\n".encode(),
        "pkg/image.png": b"\x89PNG\r\n\x1a\n\x00\x00binary",
        "pkg/__pycache__/b.cpython-311.pyc": b"compiled",
        "site-packages/vendored.py": b"import everything\n",
        ".hidden/secret.py": b"x = 1\n",
    }
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def shard_tokens(out: Path, split: str = "train") -> np.ndarray:
    index = read_index(out)
    return np.concatenate([np.fromfile(s.path, dtype="<u2") for s in index.splits[split]])


def test_text_files_become_shards_of_bytes_and_eos_in_sorted_order(tmp_path: Path) -> None:
    files = make_tree(tmp_path / "src")
    assert prep.main([str(tmp_path / "src"), str(tmp_path / "out"), "--val-fraction", "0"]) == 0

    tokens = shard_tokens(tmp_path / "out")
    assert tokens[-1] == EOS
    ends = np.flatnonzero(tokens == EOS)
    starts = [0, *(ends[:-1] + 1)]
    documents = [bytes(tokens[a:b].astype(np.uint8)) for a, b in zip(starts, ends, strict=True)]
    # binary files, caches, installed packages and hidden directories are not the tree's own text
    assert documents == [files["a.py"], files["pkg/b.py"], files["pkg/deep/c.txt"]]
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["splits"]["train"]["documents"] == 3
    assert index["splits"]["train"]["tokens"] == sum(len(doc) + 1 for doc in documents)
    assert "val" not in index["splits"]


def test_glob_double_star_spans_directories_and_single_star_does_not(tmp_path: Path) -> None:
    make_tree(tmp_path / "src")
    everywhere = [rel for rel, _ in prep.source_files(tmp_path / "src", "**/*.py")]
    top_level = [rel for rel, _ in prep.source_files(tmp_path / "src", "*.py")]
    assert everywhere == ["a.py", "pkg/b.py"]
    assert top_level == ["a.py"]


def test_stdlib_corpus_is_capped_deterministic_and_split_for_validation(tmp_path: Path) -> None:
    args = ["stdlib", "--glob", "**/*.py", "--max-bytes", "2MiB", "--shard-size", "512KiB"]
    assert prep.main([args[0], str(tmp_path / "one"), *args[1:]]) == 0
    assert prep.main([args[0], str(tmp_path / "two"), *args[1:]]) == 0

    one, two = read_index(tmp_path / "one"), read_index(tmp_path / "two")
    assert one.raw == two.raw
    for a, b in zip(one.splits["train"], two.splits["train"], strict=True):
        assert a.path.read_bytes() == b.path.read_bytes()
    assert one.raw["source"]["bytes"] == 2 << 20
    assert len(one.splits["train"]) == 8 and all(s.tokens <= 256 * 1024 for s in one.splits["train"])
    # whole documents, about the default 1% of the text (one document more at most)
    val_share = one.tokens("val") / (one.tokens("train") + one.tokens("val"))
    assert 0.005 < val_share < 0.03
    # the first document is the first stdlib file in sorted order, byte for byte
    first_rel, first_path = prep.source_files(prep.stdlib_source_dir(), "**/*.py")[0]
    tokens = shard_tokens(tmp_path / "one")
    first_doc = tokens[: int(np.argmax(tokens == EOS))]
    assert bytes(first_doc.astype(np.uint8)) == first_path.read_bytes()[: len(first_doc)], first_rel


def test_rerun_into_the_same_directory_leaves_no_stale_shards(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert prep.main(["stdlib", str(out), "--glob", "**/*.py", "--max-bytes", "200KiB",
                      "--shard-size", "64KiB"]) == 0
    many = len(list(out.glob("train-*.bin")))
    assert prep.main(["stdlib", str(out), "--glob", "**/*.py", "--max-bytes", "20KiB"]) == 0
    assert many > 1
    assert sorted(p.name for p in out.glob("train-*.bin")) == ["train-00000-000.bin"]
    assert sorted(p.name for p in (out / "parts").iterdir()) == ["part-00000.json", "part-00001.json"]
    assert not list(out.glob("*.tmp"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing-dir"], "is not a directory"),
        (["SRC", "--glob", "**/*.rs"], "match --glob"),
        (["SRC", "--val-fraction", "0.7"], "--val-fraction 0.7 is not allowed"),
    ],
)
def test_bad_input_exits_2_naming_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              args: list[str], message: str) -> None:
    make_tree(tmp_path / "src")
    argv = [str(tmp_path / "src") if a == "SRC" else str(tmp_path / a) if a == "missing-dir" else a for a in args]
    assert prep.main([argv[0], str(tmp_path / "out"), *argv[1:]]) == 2
    assert message in capsys.readouterr().err


def test_a_size_without_a_known_unit_is_refused_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        prep.main(["stdlib", "out", "--max-bytes", "4 parsecs"])
    assert exc.value.code == 2
    assert "use bytes or a unit, e.g. 4MiB" in capsys.readouterr().err
    assert prep.parse_size("4MiB") == 4 << 20 and prep.parse_size("500kB") == 500_000


def test_a_shard_cut_short_is_reported_by_name(tmp_path: Path) -> None:
    assert prep.main(["stdlib", str(tmp_path), "--glob", "**/*.py", "--max-bytes", "20KiB"]) == 0
    shard = tmp_path / "train-00000-000.bin"
    shard.write_bytes(shard.read_bytes()[:1000])
    reader = ShardReader(read_index(tmp_path), "train")  # the index is read without touching a shard
    with pytest.raises(DataError, match=r"train-00000-000.bin: expected \d+ bytes .* found 1000 bytes"):
        reader.read(0, 0, 10)  # the rank that opens it is told


@pytest.mark.parametrize(("tokenizer", "streamed"), [("bytes", False), ("bpe:300", False), ("bytes", True)])
def test_max_bytes_cuts_at_a_whole_character_never_inside_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokenizer: str, streamed: bool
) -> None:
    """--max-bytes that falls inside a multi-byte UTF-8 character backs off to the character's start: every
    tokenizer reads whole characters (a BPE or file tokenizer crashed on the broken one; bytes wrote it). A file
    too large to read whole (`streamed`) is cut the same way, from the few bytes around the cut."""
    if streamed:
        monkeypatch.setattr(prep, "WHOLE_FILE", 400)  # both files (880, 1080 bytes) read in chunks
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("naïve café résumé " * 40)  # 2-byte characters
    (src / "b.txt").write_text("日本語のテキスト、" * 40)  # 3-byte characters
    size_a = len((src / "a.txt").read_bytes())
    cut = size_a + 4 + 1  # one byte into b.txt's second 3-byte character
    out = tmp_path / "out"
    assert prep.main([str(src), str(out), "--max-bytes", str(cut), "--val-fraction", "0",
                      "--tokenizer", tokenizer]) == 0
    index = json.loads((out / "index.json").read_text())
    assert index["source"]["max_bytes"] == cut
    if tokenizer == "bytes":
        tokens = np.concatenate([np.fromfile(p, dtype="<u2") for p in sorted(out.glob("train-*.bin"))])
        assert int((tokens == EOS).sum()) == 2  # two documents, each ended once
        text = bytes(tokens[tokens != EOS].astype(np.uint8))
        # everything decodes, and b.txt's part is its first whole character only (3 bytes, not 5)
        assert text.decode("utf-8").endswith("日") and len(text) == size_a + 3


@pytest.mark.parametrize("max_bytes", [None, "1MiB"])
def test_files_that_are_not_utf8_text_are_counted_named_and_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], max_bytes: str | None
) -> None:
    """A file in another encoding (or binary) is left out, as before, but never in silence: the index and the
    summary count them and name the first few, whether the plan (with --max-bytes) or a worker found them."""
    src = tmp_path / "src"
    src.mkdir()
    for n in range(3):
        (src / f"ok-{n}.txt").write_text(f"plain text number {n}\n" * 20)
    (src / "latin1-a.txt").write_bytes("café crème\n".encode("latin-1") * 20)
    (src / "latin1-b.txt").write_bytes("naïve\n".encode("latin-1") * 20)
    (src / "image.bin").write_bytes(bytes(range(256)) * 4)
    out = tmp_path / "out"
    args = [str(src), str(out), "--val-fraction", "0", *(["--max-bytes", max_bytes] if max_bytes else [])]
    assert prep.main(args) == 0
    index = json.loads((out / "index.json").read_text())
    assert index["source"]["not_text"] == {"count": 3, "examples": ["image.bin", "latin1-a.txt", "latin1-b.txt"]}
    assert index["splits"]["train"]["documents"] == 3
    err = capsys.readouterr().err
    assert "note: 3 matched file(s) are not UTF-8 text" in err and "latin1-a.txt" in err
