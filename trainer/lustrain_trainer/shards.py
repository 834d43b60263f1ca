"""The on-disk format of a prepared data set: a few large uint16 token shards plus index.json.

A shard is raw little-endian uint16 tokens with no header, so it can be memory-mapped (or read with
numpy.fromfile) directly; everything else about the data set lives in the index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .tokenizer import TOKENIZER_INFO

INDEX_NAME = "index.json"
FORMAT = "lustrain-token-shards"
VERSION = 1
DTYPE = "<u2"
TOKEN_BYTES = 2
SPLITS = ("train", "val")


class DataError(ValueError):
    """The data directory is missing, incomplete or not in lustrain's token-shard format."""


@dataclass(frozen=True)
class Shard:
    path: Path
    tokens: int


@dataclass(frozen=True)
class DataIndex:
    root: Path
    splits: dict[str, list[Shard]]
    raw: dict[str, Any]

    def tokens(self, split: str) -> int:
        return sum(shard.tokens for shard in self.splits.get(split, []))


def shard_name(split: str, number: int) -> str:
    return f"{split}-{number:05d}.bin"


def read_index(root: Path) -> DataIndex:
    """Read and check index.json; a shard whose size disagrees with it is reported, not silently used."""
    index_path = root / INDEX_NAME
    if not index_path.is_file():
        raise DataError(
            f"{index_path} not found: the data directory must hold token shards and {INDEX_NAME} "
            "(make them with `python -m lustrain_trainer.prepare SRC OUT`)"
        )
    try:
        raw = json.loads(index_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{index_path} is not readable JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise DataError(f"{index_path}: format must be {FORMAT!r}, got {raw.get('format')!r}")
    if raw.get("version") != VERSION or raw.get("dtype") != DTYPE:
        raise DataError(
            f"{index_path}: version {raw.get('version')!r} dtype {raw.get('dtype')!r} not supported "
            f"(this trainer reads version {VERSION}, dtype {DTYPE})"
        )
    if raw.get("tokenizer") != TOKENIZER_INFO:
        raise DataError(
            f"{index_path}: tokenizer {raw.get('tokenizer')!r} is not this trainer's {TOKENIZER_INFO}"
        )
    splits: dict[str, list[Shard]] = {}
    for split, entry in raw.get("splits", {}).items():
        shards = []
        for item in entry.get("shards", []):
            path = root / item["file"]
            expected = int(item["tokens"]) * TOKEN_BYTES
            actual = path.stat().st_size if path.is_file() else None
            if actual != expected:
                raise DataError(
                    f"{path}: expected {expected} bytes from {INDEX_NAME}, found "
                    f"{'no file' if actual is None else f'{actual} bytes'} (incomplete copy?)"
                )
            shards.append(Shard(path=path, tokens=int(item["tokens"])))
        splits[split] = shards
    if not splits.get("train"):
        raise DataError(f"{index_path}: no train shards")
    return DataIndex(root=root, splits=splits, raw=raw)
