"""The on-disk format of a prepared data set: a few large token shards plus index.json (and tokenizer.json).

A shard is raw little-endian tokens with no header, uint16 while the vocabulary fits in 16 bits and uint32 beyond
(the index's "dtype"), so it can be memory-mapped (or read with numpy.fromfile) directly; everything else about the
data set lives in the index:

- version 2: "tokenizer" is the tokenizer's info (tokenizer.py: kind, vocab_size, eos, sha256 and the name of its
  tokenizer.json, which lies beside index.json), and each split records "bytes", the UTF-8 bytes of its
  documents' text (what bits per byte divides by, whatever the tokenizer);
- version 1 (still read): the byte tokenizer, uint16 shards, no "bytes" (a split's bytes are its tokens less one
  EOS per document).

The layout `prepare` writes (a directory, or an S3 prefix with the same keys):

    index.json                  the index (shards listed by split, in part order)
    tokenizer.json              the tokenizer's file, where it has one
    train-PPPPP-SSS.bin         shard SSS of part PPPPP (val-PPPPP-SSS.bin for validation's parts)
    prepare-plan.json           the plan: its parts (split, bytes, files, their list's sha256), the tokenizer, the
                                options, the totals
    plan/files-PPPPP.json       part PPPPP's files ([path, size, bytes to take] each): the worker that makes the
                                part reads its list alone
    parts/part-PPPPP.json       a part's record (its shards, tokens, documents, bytes), written when it is whole

A shard is named by its part, so the workers that make the parts need not agree on anything but the plan, and the
same input makes the same files whatever the number of workers. The trainer reads only the index and the files it
names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .layout import INDEX_NAME, PARTS_DIR, PLAN_LISTS_DIR, PLAN_NAME  # noqa: F401 - the shards' names, re-exported
from .tokenizer import TOKENIZER_FILE, TOKENIZER_INFO, dtype_for, normalized

FORMAT = "lustrain-token-shards"
VERSION = 2
VERSIONS = (1, 2)
#: the byte tokenizer's shards (and every version 1 index's)
DTYPE = "<u2"
TOKEN_BYTES = 2
DTYPES = ("<u2", "<u4")
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
    dtype: str = DTYPE

    def tokens(self, split: str) -> int:
        return sum(shard.tokens for shard in self.splits.get(split, []))

    @property
    def shard_count(self) -> int:
        return sum(len(found) for found in self.splits.values())

    @property
    def token_bytes(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def tokenizer(self) -> dict[str, Any]:
        """The tokenizer info the data was made with, in its current form (version 1: the byte tokenizer)."""
        return normalized(self.raw.get("tokenizer"))

    def text_bytes(self, split: str) -> int:
        """The UTF-8 bytes of a split's documents (version 1: its tokens less one EOS per document); 0 where the
        index cannot say."""
        entry = self.raw.get("splits", {}).get(split, {})
        if "bytes" in entry:
            return int(entry["bytes"])
        if self.raw.get("version") == 1 and "documents" in entry:
            return int(entry.get("tokens", 0)) - int(entry["documents"])
        return 0


def shard_name(split: str, part: int, number: int) -> str:
    return f"{split}-{part:05d}-{number:03d}.bin"


def part_file(part: int) -> str:
    return f"{PARTS_DIR}/part-{part:05d}.json"


def plan_list(part: int) -> str:
    return f"{PLAN_LISTS_DIR}/files-{part:05d}.json"


def read_index(root: Path) -> DataIndex:
    """Read and check index.json. It touches no shard: the ranks check every shard's size once at the start, each
    its share (check_share), and a reader checks each again as it opens it (check_shard), so a shard whose size
    disagrees with the index is reported, not silently used."""
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
    version, dtype = raw.get("version"), raw.get("dtype")
    if version not in VERSIONS or dtype not in DTYPES or (version == 1 and dtype != DTYPE):
        raise DataError(
            f"{index_path}: version {version!r} dtype {dtype!r} not supported (this trainer reads version "
            f"{VERSION} with dtype {' or '.join(DTYPES)}, and version 1 with {DTYPE})"
        )
    check_tokenizer(index_path, raw, dtype)
    splits: dict[str, list[Shard]] = {}
    for split, entry in raw.get("splits", {}).items():
        # sizes from the index alone: the start's check spreads one stat per shard over the ranks (check_share),
        # where every rank checking every shard would be 10^5 shards x 400 ranks = 4*10^7 stats on Lustre's
        # metadata server
        splits[split] = [Shard(path=root / item["file"], tokens=int(item["tokens"]))
                         for item in entry.get("shards", [])]
    if not splits.get("train"):
        raise DataError(f"{index_path}: no train shards")
    return DataIndex(root=root, splits=splits, raw=raw, dtype=dtype)


def check_shard(shard: Shard, token_bytes: int) -> None:
    """The shard's file is there at the size the index gives it (one stat): a reader calls it as it opens one."""
    expected = shard.tokens * token_bytes
    try:
        actual: int | None = shard.path.stat().st_size
    except FileNotFoundError:
        actual = None
    if actual != expected:
        raise DataError(
            f"{shard.path}: expected {expected} bytes from {INDEX_NAME}, found "
            f"{'no file' if actual is None else f'{actual} bytes'} (incomplete copy?)"
        )


#: how many of the bad shards a start's error names (the count says how many there are)
NAMED_BAD_SHARDS = 5


def check_share(index: DataIndex, rank: int, world_size: int) -> list[str]:
    """This rank's share of the start's check of every shard (the shards whose position in the index, counted over
    the splits, is rank modulo world_size): each one's problem, from one stat. Spread over the ranks, a start makes
    one stat per shard in all (10^5 shards of 20 TB on 400 ranks: 250 each, seconds on Lustre's metadata server),
    and a cut or missing shard ends the run before its first step, not hours in when a rank opens it."""
    found: list[str] = []
    every = (shard for split in sorted(index.splits) for shard in index.splits[split])
    for position, shard in enumerate(every):
        if position % world_size != rank:
            continue
        try:
            check_shard(shard, index.token_bytes)
        except DataError as exc:
            found.append(str(exc))
        except (OSError, ValueError) as exc:
            # unreadable metadata (a permission, an I/O error on the file system): a bad shard too, said by every
            # rank, never an exception on one rank while the others wait for it in the gather
            found.append(f"{shard.path}: {type(exc).__name__}: {exc}")
    return found


def share_report(found: list[str]) -> list[tuple[int, list[str]]]:
    """What a rank sends of its share's problems to every other: how many, and the first few alone (a corpus whose
    every shard is cut would otherwise send each rank's every line to every rank)."""
    return [(len(found), found[:NAMED_BAD_SHARDS])] if found else []


def bad_shards_error(reports: list[tuple[int, list[str]]], shards: int) -> DataError:
    """The start's refusal of data with bad shards, from every rank's share_report: how many, and the first few."""
    count = sum(n for n, _ in reports)
    named = [line for _, lines in reports for line in lines][:NAMED_BAD_SHARDS]
    more = f" (and {count - len(named)} more)" if count > len(named) else ""
    return DataError(f"{count} of the {shards} shards in {INDEX_NAME} are not as it says: {'; '.join(named)}{more}")


def check_tokenizer(index_path: Path, raw: dict[str, Any], dtype: str) -> None:
    """The index's tokenizer is one the trainer can read ids of: version 1, the byte tokenizer; version 2, any
    kind whose ids fit the shards' dtype, its tokenizer.json beside the index (its contents are checked where
    the tokenizer is used: prepare and generate; training needs only the ids)."""
    info = raw.get("tokenizer")
    if raw.get("version") == 1:
        if normalized(info) != TOKENIZER_INFO:
            raise DataError(f"{index_path}: a version 1 index holds byte tokens, not tokenizer {info!r}")
        return
    if not isinstance(info, dict) or not isinstance(info.get("vocab_size"), int) or info["vocab_size"] < 1:
        raise DataError(f"{index_path}: tokenizer {info!r} has no vocab_size")
    if info["vocab_size"] > 1 << 31:
        raise DataError(f"{index_path}: a vocabulary of {info['vocab_size']} is beyond the 2**31 ids the trainer reads")
    if np.dtype(dtype).itemsize < np.dtype(dtype_for(info["vocab_size"])).itemsize:
        raise DataError(f"{index_path}: a vocabulary of {info['vocab_size']} does not fit dtype {dtype}")
    if info.get("file") and not (index_path.parent / str(info["file"])).is_file():
        raise DataError(
            f"{index_path.parent / str(info['file'])} not found: the data's tokenizer ({TOKENIZER_FILE}) must "
            f"lie beside {INDEX_NAME}"
        )
