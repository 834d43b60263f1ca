"""Turn a tree of text files into a few large token shards plus an index.

    python -m lustrain_trainer.prepare SRC OUT [--glob '**/*.py'] [--max-bytes 4MiB] [--tokenizer bytes]

SRC is a directory, or `stdlib` for the standard library's own source tree (real text that ships with
every Python, so the local example needs no download). Large shards suit Lustre, which serves a few big
files far faster than millions of small ones. Output is deterministic: files are read in sorted order.

--tokenizer (tokenizer.py): `bytes` (the default), `bpe:VOCAB` (a byte-level BPE trained here on a sample of the
corpus, the same sample and so the same tokenizer.json for the same input), or the path or s3:// URL of an existing
tokenizer.json. The tokenizer.json is written beside index.json, which records its sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from . import tokenizer as tok
from .shards import FORMAT, INDEX_NAME, SPLITS, VERSION, shard_name

STDLIB = "stdlib"
# Installed packages and caches are not part of a source tree's own text (and the stdlib directory holds
# site-packages): skipping them keeps the stdlib corpus the same on every machine with the same Python.
SKIP_DIRS = frozenset({"__pycache__", "site-packages", "dist-packages", "node_modules"})
SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2,
              "mib": 1 << 20, "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30}


#: bpe:VOCAB's range: the 256 bytes and EOS at least; at most 2**20 ids, several times any published LLM's (Llama 3
#: 128,256; Gemma 3 262,144)
BPE_VOCAB = (tok.VOCAB_SIZE, 1 << 20)
#: the text a BPE is trained on, at most: its merges are decided by the most frequent pairs, which a few hundred MB
#: of a corpus ranks as the whole would; the trainer holds the sample's distinct words in memory, and its time grows
#: with the sample, not the corpus (bench/prepare.py: 22 s for the 31 MB stdlib corpus on two busy cores, so minutes
#: for 256 MiB)
BPE_SAMPLE = 256 << 20
#: documents encoded at once (a batch runs on all cores), or fewer when they reach BATCH_BYTES
BATCH_DOCUMENTS, BATCH_BYTES = 256, 8 << 20
TOKENIZER_HELP = "bytes | bpe:VOCAB | PATH or s3:// URL of a tokenizer.json"


class PrepareError(ValueError):
    pass


def stdlib_source_dir() -> Path:
    return Path(sysconfig.get_paths().get("stdlib") or os.path.dirname(os.__file__))


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: use bytes or a unit, e.g. 4MiB, 500kB, 1G")
    value = int(float(match.group(1)) * SIZE_UNITS[unit])
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the size must be above zero")
    return value


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A path glob where `**/` spans any number of directories and `*`, `?` stay within one."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def source_files(root: Path, pattern: str) -> list[tuple[str, Path]]:
    regex = glob_regex(pattern)
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if regex.fullmatch(rel) and path.is_file():
                found.append((rel, path))
    return sorted(found)


def is_text(data: bytes) -> bool:
    if b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@dataclass
class ShardWriter:
    """Writes one split's tokens into shards of at most shard_tokens, each renamed into place when whole."""

    out: Path
    split: str
    shard_tokens: int
    dtype: str = "<u2"
    shards: list[dict[str, Any]] = field(default_factory=list)
    documents: int = 0
    text_bytes: int = 0
    _file: BinaryIO | None = None
    _hash: Any = None
    _in_shard: int = 0

    def add_document(self, data: bytes, tokens: np.ndarray) -> None:
        """A document's text and its tokens (EOS included)."""
        tokens = tokens.astype(self.dtype, copy=False)
        self.documents += 1
        self.text_bytes += len(data)
        start = 0
        while start < len(tokens):
            if self._file is None:
                self._open()
            take = min(len(tokens) - start, self.shard_tokens - self._in_shard)
            chunk = tokens[start : start + take].tobytes()
            assert self._file is not None
            self._file.write(chunk)
            self._hash.update(chunk)
            self._in_shard += take
            start += take
            if self._in_shard == self.shard_tokens:
                self._close()

    def finish(self) -> dict[str, Any]:
        if self._file is not None:
            self._close()
        return {"tokens": sum(s["tokens"] for s in self.shards), "documents": self.documents,
                "bytes": self.text_bytes, "shards": self.shards}

    def _tmp_path(self) -> Path:
        return self.out / (shard_name(self.split, len(self.shards)) + ".tmp")

    def _open(self) -> None:
        self._file = open(self._tmp_path(), "wb", buffering=1 << 20)  # noqa: SIM115 - closed in _close
        self._hash = hashlib.sha256()
        self._in_shard = 0

    def _close(self) -> None:
        assert self._file is not None
        self._file.close()
        name = shard_name(self.split, len(self.shards))
        os.replace(self._tmp_path(), self.out / name)
        self.shards.append({"file": name, "tokens": self._in_shard, "sha256": self._hash.hexdigest()})
        self._file = None


def read_documents(files: list[tuple[str, Path]], max_bytes: int | None) -> Iterator[bytes]:
    """Yield the text files' contents, the last one cut so the total is exactly max_bytes."""
    used = 0
    for _rel, path in files:
        data = path.read_bytes()
        if not is_text(data):
            continue
        if max_bytes is not None:
            data = data[: max_bytes - used]
        if not data:
            continue
        used += len(data)
        yield data
        if max_bytes is not None and used >= max_bytes:
            return


def parse_tokenizer(spec: str) -> tuple[str, int | str | None]:
    """(kind, argument) of a --tokenizer value: ("bytes", None), ("bpe", VOCAB) or ("file", PATH or URL)."""
    if spec == "bytes":
        return "bytes", None
    if spec.startswith("bpe:") or spec == "bpe":
        text = spec.partition(":")[2]
        low, high = BPE_VOCAB
        if not text.isdigit() or not low <= int(text) <= high:
            raise PrepareError(f"--tokenizer {spec}: VOCAB must be a whole number from {low} to {high} "
                               f"(e.g. bpe:32000); allowed: {TOKENIZER_HELP}")
        return "bpe", int(text)
    if not spec.strip():
        raise PrepareError(f"--tokenizer is empty; allowed: {TOKENIZER_HELP}")
    return "file", spec


def read_tokenizer_file(location: str) -> bytes:
    """The bytes of a tokenizer.json at a local path or an s3:// URL."""
    if location.startswith("s3://"):
        bucket, _, key = location[len("s3://"):].partition("/")
        if not bucket or not key:
            raise PrepareError(f"--tokenizer {location}: an S3 URL names a bucket and a key (s3://BUCKET/KEY)")
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            body: bytes = boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise PrepareError(f"--tokenizer {location}: {error.get('Code')}: {error.get('Message')}") from exc
        except BotoCoreError as exc:
            raise PrepareError(f"--tokenizer {location}: {exc}") from exc
        return body
    path = Path(location)
    if not path.is_file():
        raise PrepareError(f"--tokenizer {location}: no such file; allowed: {TOKENIZER_HELP}")
    return path.read_bytes()


def bpe_sample(files: list[tuple[str, Path]], max_bytes: int | None, limit: int
               ) -> tuple[list[str], dict[str, Any]]:
    """The documents a BPE is trained on: all of a corpus of up to `limit` bytes, else the documents of the smallest
    content hashes (an even spread over the corpus, the same whatever the order or the machines that read it) up to
    `limit` bytes, the last one cut there. Costs a read of the corpus and its hashes before the training."""
    ranked, total = [], 0
    for number, data in enumerate(read_documents(files, max_bytes)):
        ranked.append((hashlib.sha256(data).digest()[:8], number, len(data)))
        total += len(data)
    take: dict[int, int] = {}
    used = 0
    for _, number, size in sorted(ranked) if total > limit else ranked:
        take[number] = min(size, limit - used)
        used += take[number]
        if used >= limit:
            break
    texts = [data[: take[number]].decode("utf-8", errors="ignore")  # a cut may split a character
             for number, data in enumerate(read_documents(files, max_bytes)) if number in take]
    return texts, {"bytes": used, "documents": len(texts), "limit": limit}


def make_tokenizer(spec: str, files: list[tuple[str, Path]], max_bytes: int | None,
                   sample_limit: int) -> tuple[tok.ByteTokenizer | tok.HFTokenizer, bytes | None, dict[str, Any]]:
    """(tokenizer, its tokenizer.json's bytes or None, how it was trained) for a --tokenizer value."""
    kind, argument = parse_tokenizer(spec)
    if kind == "bytes":
        return tok.ByteTokenizer(), None, {}
    try:
        if kind == "bpe":
            texts, sample = bpe_sample(files, max_bytes, sample_limit)
            text = tok.train_bpe(texts, int(argument or 0))
            return tok.from_json(text, kind="bpe"), text, {"sample": sample, "requested_vocab_size": argument}
        text = read_tokenizer_file(str(argument))
        return tok.from_json(text, kind="file", where=f"--tokenizer {argument}"), text, {"from": argument}
    except tok.TokenizerError as exc:
        raise PrepareError(f"{exc}; allowed: {TOKENIZER_HELP}") from exc


def prepare(src: Path, out: Path, pattern: str = "**/*", max_bytes: int | None = None,
            shard_tokens: int = 128 << 20, val_fraction: float = 0.01, source_label: str | None = None,
            tokenizer: str = "bytes", bpe_sample_bytes: int = BPE_SAMPLE, shard_bytes: int | None = None
            ) -> dict[str, Any]:
    """Tokenize the text files under `src` into shards in `out`. Shards hold shard_tokens tokens, or shard_bytes
    bytes where given (their tokens' width is known once the tokenizer is)."""
    if not src.is_dir():
        raise PrepareError(f"SRC {src} is not a directory (give a directory of text files, or {STDLIB!r})")
    if not 0 <= val_fraction < 0.5:
        raise PrepareError(f"--val-fraction {val_fraction} is not allowed: use 0 <= fraction < 0.5")
    files = source_files(src, pattern)
    if not files:
        raise PrepareError(f"no files under {src} match --glob {pattern!r}")
    encoder, tokenizer_json, trained = make_tokenizer(tokenizer, files, max_bytes, bpe_sample_bytes)
    dtype = tok.dtype_for(encoder.vocab_size)
    if shard_bytes is not None:
        shard_tokens = max(1, shard_bytes // np.dtype(dtype).itemsize)
    out.mkdir(parents=True, exist_ok=True)
    # A previous preparation may have written more shards than this one will: leave no stale ones behind.
    for split in SPLITS:
        for old in out.glob(f"{split}-*.bin*"):
            old.unlink()
    (out / INDEX_NAME).unlink(missing_ok=True)
    (out / tok.TOKENIZER_FILE).unlink(missing_ok=True)
    if tokenizer_json is not None:
        (out / tok.TOKENIZER_FILE).write_bytes(tokenizer_json)

    writers = {split: ShardWriter(out, split, shard_tokens, dtype) for split in SPLITS}
    total = val_bytes = 0
    for number, (data, tokens) in enumerate(encoded(encoder, read_documents(files, max_bytes))):
        total += len(data)
        # Whole documents go to validation, spread through the corpus, keeping its share near val_fraction.
        to_val = number > 0 and val_bytes < val_fraction * total
        if to_val:
            val_bytes += len(data)
        writers["val" if to_val else "train"].add_document(data, tokens)
    splits = {split: writer.finish() for split, writer in writers.items()}
    if not splits["train"]["shards"]:
        raise PrepareError(f"no text found in the files under {src} matching {pattern!r} (all binary?)")
    if not splits["val"]["shards"]:
        del splits["val"]
    index = {
        "format": FORMAT, "version": VERSION, "dtype": dtype, "tokenizer": encoder.info,
        "source": {"root": source_label or str(src), "glob": pattern, "max_bytes": max_bytes,
                   "bytes": total, "files_matched": len(files)},
        "splits": splits,
    }
    if trained:
        index["tokenizer_source"] = trained
    tmp = out / (INDEX_NAME + ".tmp")
    tmp.write_text(json.dumps(index, indent=2) + "\n")
    os.replace(tmp, out / INDEX_NAME)
    return index


def encoded(encoder: tok.ByteTokenizer | tok.HFTokenizer, documents: Iterator[bytes]
            ) -> Iterator[tuple[bytes, np.ndarray]]:
    """(document, its tokens) in order, encoded a batch at a time."""
    batch: list[bytes] = []
    size = 0
    for data in documents:
        batch.append(data)
        size += len(data)
        if len(batch) >= BATCH_DOCUMENTS or size >= BATCH_BYTES:
            yield from zip(batch, encoder.encode_documents(batch), strict=True)
            batch, size = [], 0
    if batch:
        yield from zip(batch, encoder.encode_documents(batch), strict=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lustrain data prepare",
        description="Tokenize a tree of text files into a few large token shards plus index.json (and the "
                    "tokenizer's tokenizer.json).",
    )
    parser.add_argument("src", metavar="SRC",
                        help=f"directory of text files, or {STDLIB!r} for this Python's standard library "
                             "source (an existing directory of that name wins)")
    parser.add_argument("out", metavar="OUT", type=Path, help="directory to write the shards and index.json")
    parser.add_argument("--glob", default="**/*",
                        help="files to take, relative to SRC (default: %(default)s)")
    parser.add_argument("--max-bytes", type=parse_size, default=None,
                        help="stop after this much text, e.g. 4MiB")
    parser.add_argument("--shard-size", type=parse_size, default=256 << 20,
                        help="bytes per shard file (default 256MiB)")
    parser.add_argument("--val-fraction", type=float, default=0.01,
                        help="share of documents held out for validation (default: %(default)s)")
    parser.add_argument("--tokenizer", default="bytes",
                        help=f"{TOKENIZER_HELP} (default: %(default)s): bpe:VOCAB trains a byte-level BPE of VOCAB "
                             f"tokens ({BPE_VOCAB[0]} to {BPE_VOCAB[1]}) on the corpus")
    parser.add_argument("--bpe-sample", type=parse_size, default=BPE_SAMPLE,
                        help="text a bpe:VOCAB tokenizer is trained on, at most: all of a smaller corpus, else a "
                             "sample chosen by content hash (default 256MiB)")
    args = parser.parse_args(argv)

    use_stdlib = args.src == STDLIB and not Path(args.src).exists()
    src = stdlib_source_dir() if use_stdlib else Path(args.src)
    try:
        index = prepare(src, args.out, args.glob, args.max_bytes, val_fraction=args.val_fraction,
                        source_label=STDLIB if use_stdlib else None, tokenizer=args.tokenizer,
                        bpe_sample_bytes=args.bpe_sample, shard_bytes=args.shard_size)
    except (PrepareError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    parts = [f"{split}: {s['documents']} documents, {s['tokens']} tokens in {len(s['shards'])} shard(s)"
             for split, s in index["splits"].items()]
    info = index["tokenizer"]
    if info["eos"] is None:
        print(f"note: the tokenizer has no end-of-document token (none of {' '.join(tok.EOS_NAMES)}): documents "
              "follow one another with nothing between them", file=sys.stderr)
    print(f"prepared {index['source']['bytes']} bytes from {src} into {args.out} ({'; '.join(parts)}); tokenizer "
          f"{info['kind']}, vocab_size {info['vocab_size']}, {index['dtype']} shards")
    return 0


if __name__ == "__main__":
    sys.exit(main())
