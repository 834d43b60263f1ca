"""Turn a tree of text files into a few large token shards plus an index.

    python -m lustrain_trainer.prepare SRC OUT [--glob '**/*.py'] [--max-bytes 4MiB]

SRC is a directory, or `stdlib` for the standard library's own source tree (real text that ships with
every Python, so the local example needs no download). Large shards suit Lustre, which serves a few big
files far faster than millions of small ones. Output is deterministic: files are read in sorted order.
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

from .shards import DTYPE, FORMAT, INDEX_NAME, SPLITS, TOKEN_BYTES, VERSION, shard_name
from .tokenizer import TOKENIZER_INFO, encode_document

STDLIB = "stdlib"
# Installed packages and caches are not part of a source tree's own text (and the stdlib directory holds
# site-packages): skipping them keeps the stdlib corpus the same on every machine with the same Python.
SKIP_DIRS = frozenset({"__pycache__", "site-packages", "dist-packages", "node_modules"})
SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2,
              "mib": 1 << 20, "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30}


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
    shards: list[dict[str, Any]] = field(default_factory=list)
    documents: int = 0
    _file: BinaryIO | None = None
    _hash: Any = None
    _in_shard: int = 0

    def add_document(self, data: bytes) -> None:
        tokens = encode_document(data)
        self.documents += 1
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
                "shards": self.shards}

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


def prepare(src: Path, out: Path, pattern: str = "**/*", max_bytes: int | None = None,
            shard_tokens: int = 128 << 20, val_fraction: float = 0.01, source_label: str | None = None
            ) -> dict[str, Any]:
    if not src.is_dir():
        raise PrepareError(f"SRC {src} is not a directory (give a directory of text files, or {STDLIB!r})")
    if not 0 <= val_fraction < 0.5:
        raise PrepareError(f"--val-fraction {val_fraction} is not allowed: use 0 <= fraction < 0.5")
    files = source_files(src, pattern)
    if not files:
        raise PrepareError(f"no files under {src} match --glob {pattern!r}")
    out.mkdir(parents=True, exist_ok=True)
    # A previous preparation may have written more shards than this one will: leave no stale ones behind.
    for split in SPLITS:
        for old in out.glob(f"{split}-*.bin*"):
            old.unlink()
    (out / INDEX_NAME).unlink(missing_ok=True)

    writers = {split: ShardWriter(out, split, shard_tokens) for split in SPLITS}
    total = val_bytes = 0
    for number, data in enumerate(read_documents(files, max_bytes)):
        total += len(data)
        # Whole documents go to validation, spread through the corpus, keeping its share near val_fraction.
        to_val = number > 0 and val_bytes < val_fraction * total
        if to_val:
            val_bytes += len(data)
        writers["val" if to_val else "train"].add_document(data)
    splits = {split: writer.finish() for split, writer in writers.items()}
    if not splits["train"]["shards"]:
        raise PrepareError(f"no text found in the files under {src} matching {pattern!r} (all binary?)")
    if not splits["val"]["shards"]:
        del splits["val"]
    index = {
        "format": FORMAT, "version": VERSION, "dtype": DTYPE, "tokenizer": TOKENIZER_INFO,
        "source": {"root": source_label or str(src), "glob": pattern, "max_bytes": max_bytes,
                   "bytes": total, "files_matched": len(files)},
        "splits": splits,
    }
    tmp = out / (INDEX_NAME + ".tmp")
    tmp.write_text(json.dumps(index, indent=2) + "\n")
    os.replace(tmp, out / INDEX_NAME)
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lustrain data prepare",
        description="Tokenize a tree of text files (bytes) into a few large uint16 shards plus index.json.",
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
    args = parser.parse_args(argv)

    use_stdlib = args.src == STDLIB and not Path(args.src).exists()
    src = stdlib_source_dir() if use_stdlib else Path(args.src)
    shard_tokens = max(1, args.shard_size // TOKEN_BYTES)
    try:
        index = prepare(src, args.out, args.glob, args.max_bytes, shard_tokens, args.val_fraction,
                        source_label=STDLIB if use_stdlib else None)
    except (PrepareError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    parts = [f"{split}: {s['documents']} documents, {s['tokens']} tokens in {len(s['shards'])} shard(s)"
             for split, s in index["splits"].items()]
    print(f"prepared {index['source']['bytes']} bytes from {src} into {args.out} ({'; '.join(parts)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
