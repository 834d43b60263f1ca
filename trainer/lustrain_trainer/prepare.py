"""Turn a tree of text files into a few large token shards plus an index, on one machine or on many.

    python -m lustrain_trainer.prepare SRC OUT [--glob '**/*.py'] [--max-bytes 4MiB] [--tokenizer bytes]
                                               [--instances N] [--stage plan | work | merge]

SRC is a directory, an s3:// prefix, or `stdlib` for the standard library's own source tree (real text that ships
with every Python, so the local example needs no download); OUT is a directory or an s3:// prefix. Large shards suit
Lustre, which serves a few big files far faster than millions of small ones.

A preparation runs in three stages, so that a corpus of terabytes is tokenized by many machines at once and the
result does not depend on how many there were:

1. plan (one process): lists SRC (sorted paths and sizes, streamed: never all in memory), decides which files go to
   validation, trains the BPE once (bpe:VOCAB, on a bounded sample), and cuts the listing into numbered parts of
   about a shard's worth of text each. It writes each part's list of files (OUT/plan/files-NNNNN.json),
   OUT/tokenizer.json and OUT/prepare-plan.json, which names the parts and the totals. Nothing in it depends on the
   number of workers.
2. work (worker K of N, each on its own machine or process): tokenizes the parts p with p % N == K, reading their
   lists and their files itself (from S3 with boto3: the corpus is never copied whole to each machine; a large file
   is read and tokenized in chunks), and writes each part's shards, then OUT/parts/part-NNNNN.json last, so a part
   counts only when whole. A part already whole is skipped:
   a retried worker redoes only what is missing. `--worker auto` takes K and N from SageMaker Processing's
   resourceconfig.json.
3. merge (one process): checks every part of the plan is whole and writes index.json (shards in part order), or
   names the parts that are missing (exit 2).

`prepare SRC OUT` runs the three in this process; `--instances N` runs the work in N local processes.

--tokenizer (tokenizer.py): `bytes` (the default), `bpe:VOCAB` (a byte-level BPE trained here on a sample of the
corpus, the same sample and so the same tokenizer.json for the same input), or the path or s3:// URL of an existing
tokenizer.json. The tokenizer.json is written beside index.json, which records its sha256.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import functools
import hashlib
import heapq
import json
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np

from . import layout
from . import tokenizer as tok
from .shards import (
    FORMAT,
    INDEX_NAME,
    PLAN_NAME,
    SPLITS,
    VERSION,
    part_file,
    plan_list,
    shard_name,
)

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
#: with the sample, not the corpus (bench/prepare.py: 18 s for the 31 MB stdlib corpus on two busy cores, so minutes
#: for 256 MiB)
BPE_SAMPLE = 256 << 20
#: documents encoded at once (a batch runs on all cores), or fewer when they reach BATCH_BYTES
BATCH_DOCUMENTS, BATCH_BYTES = 256, 8 << 20
#: files a worker reads at once (S3 GETs are latency-bound: a few dozen in flight keep one instance busy)
READ_THREADS = 16
#: a file of up to this many bytes is read whole (READ_THREADS at once); a larger one is read in chunks of
#: READ_CHUNK, so that what a worker or the plan holds does not grow with the largest file of the corpus (a worker
#: spools a large S3 object to its volume first: it checks the whole file is text before tokenizing it)
WHOLE_FILE = 16 << 20
READ_CHUNK = 8 << 20
TOKENIZER_HELP = "bytes | bpe:VOCAB | PATH or s3:// URL of a tokenizer.json"
PLAN_FORMAT = "lustrain-prepare-plan"
#: 2: the plan names its parts, each part's files are in a list of its own (plan/files-PPPPP.json); 3: a special
#: token's text is text and files not UTF-8 are counted (parts tokenized under 2 are never reused)
PLAN_VERSION = 3
#: the layout of what prepare writes (shards.py), for a cache of prepared data to key on: 2, shards by part
LAYOUT = "layout2"
STAGES = ("all", "plan", "work", "merge")
#: where SageMaker Processing tells each instance who it is and who the others are: {"current_host": "algo-1",
#: "hosts": ["algo-1", "algo-2", "algo-3"]} (https://docs.aws.amazon.com/sagemaker/latest/dg/
#: build-your-own-processing-container.html#byoc-config)
RESOURCE_CONFIG = Path("/opt/ml/config/resourceconfig.json")


class PrepareError(ValueError):
    pass


class Readable(Protocol):
    """A file or an S3 object's body, read a chunk at a time."""

    def read(self, size: int = -1, /) -> bytes: ...


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
    return [(rel, root / rel) for rel, _ in sorted_files(root, glob_regex(pattern))]


def sorted_files(root: Path, regex: re.Pattern[str], prefix: str = "") -> Iterator[tuple[str, int]]:
    """(prefix + path relative to root, size) of the files under root whose path matches, in the order of their
    paths as strings, one directory's entries in memory at a time: a directory's entries are visited sorted by name,
    a subdirectory's as name + "/", so that its files come where a sort of all the paths puts them. Hidden and
    SKIP_DIRS directories are left out, and directories reached through a symbolic link (as os.walk does)."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return  # as os.walk: a directory that cannot be read is passed over
    keyed = []
    for entry in entries:
        if entry.is_dir():
            if not (entry.is_symlink() or entry.name in SKIP_DIRS or entry.name.startswith(".")):
                keyed.append((entry.name + "/", entry))
        else:
            keyed.append((entry.name, entry))
    for key, entry in sorted(keyed, key=lambda item: item[0]):
        if key.endswith("/"):
            yield from sorted_files(Path(entry.path), regex, prefix + key)
        elif regex.fullmatch(prefix + key) and Path(entry.path).is_file():
            yield prefix + key, Path(entry.path).stat().st_size


def is_text(data: bytes) -> bool:
    if b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def wanted(rel: str) -> bool:
    """A listed file is part of the tree's own text: in no skipped or hidden directory."""
    return not any(d in SKIP_DIRS or d.startswith(".") for d in rel.split("/")[:-1])


# -- where the data lies: a local directory or an S3 prefix ------------------------------------------------------


class LocalStore:
    """A local directory, as the stages read and write it: files appear whole (written aside, then renamed)."""

    def __init__(self, root: Path, label: str | None = None) -> None:
        self.root, self.label = root, label or str(root)

    def files(self, pattern: str) -> Iterator[tuple[str, int]]:
        """(path relative to the root, size) of the files matching `pattern`, in path order, as the walk finds
        them (never all in memory)."""
        if not self.root.is_dir():
            raise PrepareError(f"SRC {self.root} is not a directory (give a directory of text files, an s3:// "
                               f"prefix, or {STDLIB!r})")
        return sorted_files(self.root, glob_regex(pattern))

    def sizes(self) -> dict[str, int]:
        """Every file under the root and its size. A file gone between the listing and its stat (another worker's
        shard.tmp, renamed to its shard meanwhile) is passed over: S3's listing has no such gap."""
        if not self.root.is_dir():
            return {}
        found = {}
        for path in self.root.rglob("*"):
            try:
                if path.is_file():
                    found[path.relative_to(self.root).as_posix()] = path.stat().st_size
            except FileNotFoundError:
                continue
        return found

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    @contextlib.contextmanager
    def open(self, rel: str) -> Iterator[Readable]:
        """The file as a stream, read a chunk at a time."""
        with (self.root / rel).open("rb") as stream:
            yield stream

    @contextlib.contextmanager
    def spooled(self, rel: str) -> Iterator[Path]:
        """The file on this machine's disk: here, where it lies."""
        yield self.root / rel

    def read_if_any(self, rel: str) -> bytes | None:
        path = self.root / rel
        return path.read_bytes() if path.is_file() else None

    def write(self, rel: str, data: bytes) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def staging(self) -> Path:
        """Where a shard is written before it is published: beside its final place, so publishing is a rename."""
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root

    def publish(self, path: Path, rel: str) -> None:
        os.replace(path, self.root / rel)

    def delete(self, rels: Iterable[str]) -> None:
        for rel in rels:
            (self.root / rel).unlink(missing_ok=True)


class S3Store:
    """An s3:// prefix, through boto3 with the caller's credentials (imported only here: a local preparation never
    needs it). Keys are the prefix, "/", then the path relative to it."""

    #: keys per ListObjectsV2 page: its MaxKeys, at most 1,000 (ListObjectsV2)
    page_keys = 1000

    def __init__(self, url: str) -> None:
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not bucket:
            raise PrepareError(f"{url}: an S3 location names a bucket (s3://BUCKET/PREFIX)")
        self.bucket, self.prefix = bucket, prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.label = f"s3://{bucket}/{self.prefix}".rstrip("/")
        import boto3

        self.client: Any = boto3.client("s3")  # made here, once: the reading threads share it (boto3's clients are)
        self._staging: Path | None = None

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return call()
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise PrepareError(f"{what}: {error.get('Code')}: {error.get('Message')}") from exc
        except (BotoCoreError, Boto3Error) as exc:  # Boto3Error: upload_file's S3UploadFailedError
            raise PrepareError(f"{what}: {exc}") from exc

    def _list(self) -> Iterator[tuple[str, int]]:
        """(path, size) of every object under the prefix, a page (1,000 keys) at a time: a listing of 10^8 keys is
        never held at once. A general purpose bucket lists keys in UTF-8 binary order (ListObjectsV2), the order of
        Python's str: a listing out of that order (a directory bucket's) is refused, since the plan depends on it."""
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix, PaginationConfig={"PageSize": self.page_keys})
        iterator = iter(pages)
        last = ""
        while True:
            page = self._call(f"listing {self.label}", lambda: next(iterator, None))
            if page is None:
                return
            for item in page.get("Contents", []):
                key = item["Key"]
                if key.endswith("/"):  # a console "folder" is an empty key ending in /
                    continue
                rel = key[len(self.prefix) :]
                if rel < last:
                    raise PrepareError(f"listing {self.label}: {rel!r} came after {last!r}: the keys are not listed "
                                       "in order (a directory bucket?); use a general purpose bucket")
                last = rel
                yield rel, int(item["Size"])

    def files(self, pattern: str) -> Iterator[tuple[str, int]]:
        regex = glob_regex(pattern)
        return ((rel, size) for rel, size in self._list() if regex.fullmatch(rel) and wanted(rel))

    def sizes(self) -> dict[str, int]:
        return dict(self._list())

    def read(self, rel: str) -> bytes:
        return self._call(f"reading {self.label}/{rel}",  # type: ignore[no-any-return]
                          lambda: self.client.get_object(Bucket=self.bucket, Key=self.prefix + rel)["Body"].read())

    @contextlib.contextmanager
    def open(self, rel: str) -> Iterator[Readable]:
        """The object as a stream (GetObject's body), read a chunk at a time."""
        body = self._call(f"reading {self.label}/{rel}",
                          lambda: self.client.get_object(Bucket=self.bucket, Key=self.prefix + rel)["Body"])
        try:
            yield _Checked(body, f"reading {self.label}/{rel}", self._call)
        finally:
            body.close()

    @contextlib.contextmanager
    def spooled(self, rel: str) -> Iterator[Path]:
        """The object downloaded to the staging directory (download_file: in ranged parts, a few at once, never
        whole in memory), removed afterwards."""
        fd, name = tempfile.mkstemp(dir=self.staging(), suffix=".spool")
        os.close(fd)
        path = Path(name)
        try:
            self._call(f"reading {self.label}/{rel}",
                       lambda: self.client.download_file(self.bucket, self.prefix + rel, str(path)))
            yield path
        finally:
            path.unlink(missing_ok=True)

    def read_if_any(self, rel: str) -> bytes | None:
        from botocore.exceptions import ClientError

        def get() -> bytes | None:
            try:
                return self.client.get_object(Bucket=self.bucket, Key=self.prefix + rel)["Body"].read()  # type: ignore[no-any-return]
            except ClientError as exc:
                # NoSuchKey needs s3:ListBucket, which listing OUT needs anyway (without it S3 answers AccessDenied:
                # GetObject's documentation)
                if exc.response.get("Error", {}).get("Code") == "NoSuchKey":
                    return None
                raise

        return self._call(f"reading {self.label}/{rel}", get)  # type: ignore[no-any-return]

    def write(self, rel: str, data: bytes) -> None:
        self._call(f"writing {self.label}/{rel}",
                   lambda: self.client.put_object(Bucket=self.bucket, Key=self.prefix + rel, Body=data))

    def staging(self) -> Path:
        if self._staging is None:
            self._staging = Path(tempfile.mkdtemp(prefix="lustrain-prepare-"))
        return self._staging

    def publish(self, path: Path, rel: str) -> None:
        # upload_file sends a large shard in parts, several at once; the object appears only when whole
        self._call(f"writing {self.label}/{rel}",
                   lambda: self.client.upload_file(str(path), self.bucket, self.prefix + rel))
        path.unlink()

    def delete(self, rels: Iterable[str]) -> None:
        keys = [{"Key": self.prefix + rel} for rel in rels]
        for start in range(0, len(keys), 1000):  # DeleteObjects takes up to 1,000 keys
            answer = self._call(f"deleting under {self.label}", lambda start=start: self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": keys[start : start + 1000], "Quiet": True}))
            # a key it could not delete is in Errors, not an exception
            if answer.get("Errors"):
                error = answer["Errors"][0]
                raise PrepareError(f"deleting s3://{self.bucket}/{error.get('Key')}: {error.get('Code')}: "
                                   f"{error.get('Message')} ({len(answer['Errors'])} keys not deleted)")


class _Checked:
    """A stream whose read errors are PrepareErrors naming what was read."""

    def __init__(self, body: Any, what: str, call: Callable[[str, Callable[[], Any]], Any]) -> None:
        self.body, self.what, self.call = body, what, call

    def read(self, size: int = -1, /) -> bytes:
        data: bytes = self.call(self.what, functools.partial(self.body.read, size))
        return data


Store = LocalStore | S3Store


def store_of(location: str | Path, label: str | None = None) -> Store:
    text = str(location)
    if text.startswith("s3://"):
        return S3Store(text)
    if text == STDLIB and not Path(text).exists():
        return LocalStore(stdlib_source_dir(), STDLIB)
    return LocalStore(Path(text), label)


# -- shards --------------------------------------------------------------------------------------------------------


@dataclass
class ShardWriter:
    """Writes one part's tokens of one split into shards of at most shard_tokens, each published when whole."""

    store: Store
    split: str
    part: int
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
        self.add_tokens(tokens)
        self.end_document(len(data))

    def end_document(self, text_bytes: int) -> None:
        """The end of a document of `text_bytes` whose tokens were given by add_tokens."""
        self.documents += 1
        self.text_bytes += text_bytes

    def add_tokens(self, tokens: np.ndarray) -> None:
        """Tokens of the current document, in order (a large document's, a chunk at a time)."""
        tokens = tokens.astype(self.dtype, copy=False)
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

    def _name(self) -> str:
        return shard_name(self.split, self.part, len(self.shards))

    def _tmp_path(self) -> Path:
        return self.store.staging() / (self._name() + ".tmp")

    def _open(self) -> None:
        self._file = open(self._tmp_path(), "wb", buffering=1 << 20)  # noqa: SIM115 - closed in _close
        self._hash = hashlib.sha256()
        self._in_shard = 0

    def _close(self) -> None:
        assert self._file is not None
        self._file.close()
        name = self._name()
        self.store.publish(self._tmp_path(), name)
        self.shards.append({"file": name, "tokens": self._in_shard, "sha256": self._hash.hexdigest()})
        self._file = None


# -- tokenizers ----------------------------------------------------------------------------------------------------


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


def read_many(store: Store, files: Iterable[tuple[str, int]]) -> Iterator[tuple[str, bytes | None]]:
    """(path, contents) of (path, listed size) in order, READ_THREADS read ahead at once, at most twice that held in
    memory; None for a file listed above WHOLE_FILE bytes, which the caller reads in chunks (scan, stream_document)."""
    with ThreadPoolExecutor(READ_THREADS) as pool:
        pending: list[tuple[str, Any]] = []
        for rel, size in files:
            pending.append((rel, pool.submit(store.read, rel) if size <= WHOLE_FILE else None))
            if len(pending) >= 2 * READ_THREADS:
                first, future = pending.pop(0)
                yield first, None if future is None else future.result()
        for rel, future in pending:
            yield rel, None if future is None else future.result()


def chunks_of(stream: Readable, limit: int | None = None) -> Iterator[bytes]:
    """The stream's bytes (the first `limit` of them, where given), READ_CHUNK at a time."""
    left = limit
    while left is None or left > 0:
        chunk = stream.read(READ_CHUNK if left is None else min(READ_CHUNK, left))
        if not chunk:
            return
        if left is not None:
            left -= len(chunk)
        yield chunk


def text_scan(chunks: Iterable[bytes], keep: int) -> tuple[bool, bytes, int]:
    """(is_text of the whole, its first `keep` bytes, its length) of a file read in chunks: what is_text(data),
    data[:keep] and len(data) give, holding `keep` bytes and a chunk."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    head, length, text = bytearray(), 0, True
    for chunk in chunks:
        length += len(chunk)
        if len(head) < keep:
            head += chunk[: keep - len(head)]
        if text and b"\0" in chunk:
            text = False
        elif text:
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError:
                text = False
    if text:
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            text = False
    return text, bytes(head), length


def scan(store: Store, rel: str, keep: int) -> tuple[bool, bytes, int]:
    """text_scan of a file, read a chunk at a time from the store."""
    with store.open(rel) as stream:
        return text_scan(chunks_of(stream), keep)


def path_hash(rel: str) -> int:
    """Where a file falls in the BPE sample's order: its path's sha256, the same whatever the listing's order."""
    return int.from_bytes(hashlib.sha256(rel.encode()).digest(), "big")


class SampleChooser:
    """The files of the smallest path hashes whose bytes reach `limit`, chosen as the planned files go by: a heap
    of at most those files (and the next), never the whole listing. `add` them in listing order."""

    def __init__(self, limit: int, after: int = -1) -> None:
        self.limit, self.after = limit, after
        self.heap: list[tuple[int, int, list[Any]]] = []  # (-hash, listing index, entry): the largest hash on top
        self.held = 0  # bytes of the files in the heap
        self.seen = 0  # bytes of every file added with a hash after `after`

    def add(self, index: int, entry: list[Any]) -> None:
        key = path_hash(entry[0])
        if key <= self.after:
            return
        self.seen += entry[2]
        heapq.heappush(self.heap, (-key, index, entry))
        self.held += entry[2]
        while self.held - self.heap[0][2][2] >= self.limit:  # the rest reach the limit without the largest hash
            self.held -= heapq.heappop(self.heap)[2][2]

    def chosen(self) -> list[tuple[int, list[Any]]]:
        """(hash, entry) of the files chosen: in listing order when all of them fit, else in hash order."""
        if self.after < 0 and self.seen <= self.limit:  # the first round, and the whole corpus fits
            return [(-key, entry) for key, _, entry in sorted(self.heap, key=lambda item: item[1])]
        return [(-key, entry) for key, _, entry in sorted(self.heap, reverse=True)]


def bpe_sample(store: Store, first: SampleChooser, entries: Callable[[], Iterable[list[Any]]], limit: int
               ) -> tuple[list[str], dict[str, Any]]:
    """The documents a BPE is trained on: all of a corpus of up to `limit` bytes, else the files of the smallest
    path hashes (an even spread over the corpus, the same whatever the order of the listing or the machine that
    reads it) up to `limit` bytes of text, the last one cut there. `first` chose them as the plan listed the files;
    where some of those are not text, the next ones in hash order are chosen from `entries` (the planned files
    again), as many rounds as it takes. Only the sample is read, a chunk at a time for a large file, and never more
    of a file than the sample takes: the plan of a corpus of terabytes costs its listing and its sample."""
    texts: list[str] = []
    used, chooser = 0, first
    while True:
        order = chooser.chosen()
        last = chooser.after
        for (key, (rel, _, take)), (_, data) in zip(order, read_many(store, ((e[0], e[1]) for _, e in order)),
                                                       strict=True):
            if used >= limit:
                break
            last = key
            keep = min(take, limit - used)
            text, head, _ = (is_text(data), data[:keep], 0) if data is not None else scan(store, rel, keep)
            if text and head:
                texts.append(head.decode("utf-8", errors="ignore"))  # a cut may split a character
                used += len(head)
        if used >= limit or chooser.seen <= chooser.limit:  # the limit reached, or every file read
            break
        chooser = SampleChooser(limit - used, after=last)  # the next files in hash order, for what is left
        for index, entry in enumerate(entries()):
            chooser.add(index, entry)
        if not chooser.heap:
            break
    return texts, {"bytes": used, "documents": len(texts), "limit": limit}


def make_tokenizer(spec: str, store: Store, sample: SampleChooser | None, entries: Callable[[], Iterable[list[Any]]],
                   sample_limit: int) -> tuple[tok.ByteTokenizer | tok.HFTokenizer, bytes | None, dict[str, Any]]:
    """(tokenizer, its tokenizer.json's bytes or None, how it was trained) for a --tokenizer value; `sample` chose
    a bpe:VOCAB's sample as the plan listed the files."""
    kind, argument = parse_tokenizer(spec)
    if kind == "bytes":
        return tok.ByteTokenizer(), None, {}
    try:
        if kind == "bpe":
            assert sample is not None
            texts, trained = bpe_sample(store, sample, entries, sample_limit)
            text = tok.train_bpe(texts, int(argument or 0))
            return tok.from_json(text, kind="bpe"), text, {"sample": trained, "requested_vocab_size": argument}
        text = read_tokenizer_file(str(argument))
        return tok.from_json(text, kind="file", where=f"--tokenizer {argument}"), text, {"from": argument}
    except tok.TokenizerError as exc:
        raise PrepareError(f"{exc}; allowed: {TOKENIZER_HELP}") from exc


def load_tokenizer(out: Store, info: dict[str, Any]) -> tok.ByteTokenizer | tok.HFTokenizer:
    """The plan's tokenizer, from the tokenizer.json the plan wrote beside it (checked against its sha256)."""
    if info["kind"] == "bytes":
        return tok.ByteTokenizer()
    text = out.read(tok.TOKENIZER_FILE)
    if hashlib.sha256(text).hexdigest() != info["sha256"]:
        raise PrepareError(f"{out.label}/{tok.TOKENIZER_FILE} is not the tokenizer the plan recorded "
                           f"(sha256 {info['sha256'][:12]}): plan again")
    return tok.from_json(text, kind=info["kind"], where=f"{out.label}/{tok.TOKENIZER_FILE}")


# -- 1. plan ---------------------------------------------------------------------------------------------------------


def planned_files(store: Store, listing: Iterable[tuple[str, int]], max_bytes: int | None,
                  left_out: NotText | None = None) -> Iterator[list[Any]]:
    """[path, size, bytes to take] of each file to tokenize, in order, as the listing goes by. With --max-bytes the
    text files are read in order until that much text is found (the last one cut there: what is read is bounded by
    max_bytes); without, every non-empty file is taken whole and a worker skips the binary ones as it reads them."""
    if max_bytes is None:
        yield from ([rel, size, size] for rel, size in listing if size)
        return
    used = 0
    for rel, data in read_many(store, ((rel, size) for rel, size in listing if size)):
        if used >= max_bytes:
            break
        text, _, length = (is_text(data), b"", len(data)) if data is not None else scan(store, rel, 0)
        if not text and left_out is not None:
            left_out.add(rel)
        if text:
            take = min(length, max_bytes - used)
            if take < length:  # the cut: at the last whole character, never inside one
                window, start = (data, 0) if data is not None else around(store, rel, take)
                take = whole_characters(window, take, start)
            if take:
                yield [rel, length, take]
                used += take


#: how many of the files left out for not being UTF-8 text a report names
NOT_TEXT_EXAMPLES = 5


class NotText:
    """The matched files left out because they are not UTF-8 text (binary, or another encoding): counted, and the
    first few named, in the order of the plan's parts (the same for any number of workers)."""

    def __init__(self, count: int = 0, examples: list[str] | None = None) -> None:
        self.count, self.examples = count, list(examples or [])

    def add(self, rel: str) -> None:
        self.count += 1
        if len(self.examples) < NOT_TEXT_EXAMPLES:
            self.examples.append(rel)

    def extend(self, other: dict[str, Any] | None) -> None:
        for rel in (other or {}).get("examples", []):
            if len(self.examples) < NOT_TEXT_EXAMPLES:
                self.examples.append(rel)
        self.count += int((other or {}).get("count", 0))

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "examples": self.examples}


def whole_characters(data: bytes, take: int, start: int = 0) -> int:
    """`take` backed off to the start of the UTF-8 character it falls in (a byte 10xxxxxx continues one; a
    character has at most three): `data` holds the file's bytes from `start` through the one at `take`."""
    while take > start and data[take - start] & 0xC0 == 0x80:
        take -= 1
    return take


def around(store: Store, rel: str, take: int) -> tuple[bytes, int]:
    """The cut file's bytes from take - 3 through take, and where they start: read a chunk at a time, only those few
    kept (the cut file is read once, up to --max-bytes of it; its bytes are never held)."""
    start = max(0, take - 3)
    kept, at = b"", 0
    with store.open(rel) as stream:
        for chunk in chunks_of(stream, take + 1):
            end = at + len(chunk)
            if end > start:
                kept += chunk[max(0, start - at) :]
            at = end
    return kept, start


def splits_of(takes: Iterable[tuple[Any, int]], val_fraction: float) -> Iterator[tuple[str, tuple[Any, int]]]:
    """(split, (file, bytes to take)) of each planned file: whole files go to validation, spread through the
    corpus, keeping its share of the listed bytes near val_fraction: decided from the listing alone, as it goes by,
    so it is the same whatever the number of workers."""
    total = val_bytes = 0
    for number, item in enumerate(takes):
        total += item[1]
        to_val = number > 0 and val_bytes < val_fraction * total
        if to_val:
            val_bytes += item[1]
        yield ("val" if to_val else "train"), item


def cut_parts(takes: Callable[[], Iterable[tuple[Any, int]]], val_fraction: float, part_bytes: int
              ) -> Iterator[dict[str, Any]]:
    """The planned files (`takes()`: (file, bytes to take) of each, read once per split) cut into numbered parts of
    about part_bytes of text (a file is never split; one larger than that is a part of its own), train's first, then
    validation's: one part's files in memory at a time."""
    number = 0
    for split in SPLITS:
        current: list[Any] = []
        size = 0
        for where, (file, take) in splits_of(takes(), val_fraction):
            if where != split:
                continue
            if current and size + take > part_bytes:
                yield {"part": number, "split": split, "bytes": size, "files": current}
                number += 1
                current, size = [], 0
            current.append(file)
            size += take
        if current:
            yield {"part": number, "split": split, "bytes": size, "files": current}
            number += 1



def location_of(store: Store) -> str:
    """How a worker names SRC or OUT: the stdlib by name, a directory by its absolute path, S3 by its URL."""
    if isinstance(store, S3Store) or store.label == STDLIB:
        return store.label
    return str(store.root.resolve())


def plan(src: Store, out: Store, pattern: str = "**/*", max_bytes: int | None = None, tokenizer: str = "bytes",
         val_fraction: float = 0.01, shard_tokens: int = 128 << 20, shard_bytes: int | None = None,
         bpe_sample_bytes: int = BPE_SAMPLE) -> dict[str, Any]:
    """List SRC, train the tokenizer if it is to be trained, cut the listing into parts; write each part's list of
    files (plan/files-PPPPP.json), OUT/tokenizer.json and OUT/prepare-plan.json (last), which names the parts, their
    lists' sha256 and the totals. The same SRC and options give the same plan, byte for byte: planning again into an
    OUT that holds it keeps the parts already made; another plan removes the previous preparation's files.

    Memory does not grow with the corpus: the listing streams by (a page of keys at a time) into a file on this
    machine's disk, one JSON line per planned file, from which the parts' lists are cut one at a time; the BPE's
    sample is chosen as it goes by (SampleChooser)."""
    if not 0 <= val_fraction < 0.5:
        raise PrepareError(f"--val-fraction {val_fraction} is not allowed: use 0 <= fraction < 0.5")
    kind, _ = parse_tokenizer(tokenizer)
    with tempfile.TemporaryDirectory(prefix="lustrain-plan-") as work_dir:
        spill = Path(work_dir) / "files.jsonl"

        def entries() -> Iterator[list[Any]]:
            with spill.open(encoding="utf-8") as lines:
                yield from (json.loads(line) for line in lines)

        matched, files, text_bytes = 0, 0, 0
        sample = SampleChooser(bpe_sample_bytes) if kind == "bpe" else None

        def counted() -> Iterator[tuple[str, int]]:
            nonlocal matched
            for item in src.files(pattern):
                matched += 1
                yield item

        listing = counted()
        left_out = NotText()
        with spill.open("w", encoding="utf-8") as lines:
            for entry in planned_files(src, listing, max_bytes, left_out):
                lines.write(json.dumps(entry, separators=(",", ":")) + "\n")
                if sample is not None:
                    sample.add(files, entry)
                files += 1
                text_bytes += entry[2]
        for _ in listing:  # --max-bytes stops reading early; the index counts every file matched
            pass
        if not matched:
            raise PrepareError(f"no files under {src.label} match --glob {pattern!r}")
        if not files:
            raise PrepareError(f"no text found in the files under {src.label} matching {pattern!r} (all binary?)")
        encoder, tokenizer_json, trained = make_tokenizer(tokenizer, src, sample, entries, bpe_sample_bytes)
        dtype = tok.dtype_for(encoder.vocab_size)
        if shard_bytes is not None:
            shard_tokens = max(1, shard_bytes // np.dtype(dtype).itemsize)
        part_bytes = shard_tokens * np.dtype(dtype).itemsize  # about a shard's worth of text
        lists = Path(work_dir) / "lists"
        lists.mkdir()
        parts = []
        def takes() -> Iterator[tuple[str, int]]:
            """(line, bytes to take) of each planned file: the spill's own JSON, its last number read alone (a
            plan of 10^8 files parses no line to cut its parts)."""
            with spill.open(encoding="utf-8") as lines:
                for line in lines:
                    yield line[:-1], int(line[line.rindex(",") + 1 : -2])

        for part in cut_parts(takes, val_fraction, part_bytes):
            # the list is json.dumps of the part, written from the spill's lines (each json.dumps of its entry)
            text = (f'{{"part":{part["part"]},"split":"{part["split"]}","bytes":{part["bytes"]},"files":['
                    f'{",".join(part["files"])}]}}\n').encode()
            name = plan_list(part["part"])
            (lists / Path(name).name).write_bytes(text)
            parts.append({"part": part["part"], "split": part["split"], "bytes": part["bytes"],
                          "files": len(part["files"]), "list": name, "sha256": hashlib.sha256(text).hexdigest()})
        document: dict[str, Any] = {
            "format": PLAN_FORMAT, "version": PLAN_VERSION, "dtype": dtype, "tokenizer": encoder.info,
            "source": {"root": src.label, "location": location_of(src), "glob": pattern, "max_bytes": max_bytes,
                       "files_matched": matched, "files": files, "bytes": text_bytes,
                       **({"not_text": left_out.to_dict()} if left_out.count else {})},
            "options": {"val_fraction": val_fraction, "shard_tokens": shard_tokens, "part_bytes": part_bytes},
            "parts": parts,
        }
        if trained:
            document["tokenizer_source"] = trained
        text = (json.dumps(document, separators=(",", ":")) + "\n").encode()
        if out.read_if_any(PLAN_NAME) != text:
            out.delete(rel for rel in sorted(out.sizes()) if layout.is_output(rel))
            def upload(name: str) -> None:  # each list read as it is sent: they are never all in memory
                out.write(name, (lists / Path(name).name).read_bytes())

            with ThreadPoolExecutor(READ_THREADS) as pool:  # S3 PUTs are latency-bound, as its GETs
                for _ in pool.map(upload, [part["list"] for part in parts]):
                    pass
        if tokenizer_json is not None:
            out.write(tok.TOKENIZER_FILE, tokenizer_json)
        out.write(PLAN_NAME, text)
    return document


def read_plan(out: Store) -> tuple[dict[str, Any], str]:
    """The plan in OUT and its sha256 (which each part records: a part of another plan is not whole)."""
    text = out.read_if_any(PLAN_NAME)
    if text is None:
        raise PrepareError(f"{out.label}/{PLAN_NAME} not found: run `prepare SRC OUT --stage plan` first")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PrepareError(f"{out.label}/{PLAN_NAME} is not readable JSON: {exc}") from exc
    if document.get("format") != PLAN_FORMAT or document.get("version") != PLAN_VERSION:
        raise PrepareError(f"{out.label}/{PLAN_NAME}: not a {PLAN_FORMAT} version {PLAN_VERSION} document (plan "
                           "again with this version of prepare)")
    return document, hashlib.sha256(text).hexdigest()


def part_files(out: Store, part: dict[str, Any]) -> list[list[Any]]:
    """[path, size, bytes to take] of a part's files, from its list (checked against the plan's sha256)."""
    text = out.read_if_any(part["list"])
    if text is None or hashlib.sha256(text).hexdigest() != part["sha256"]:
        what = "missing" if text is None else "not the list the plan recorded"
        raise PrepareError(f"{out.label}/{part['list']} is {what}: plan again")
    files: list[list[Any]] = json.loads(text)["files"]
    return files


# -- 2. work ---------------------------------------------------------------------------------------------------------


def whole_parts(out: Store, document: dict[str, Any], plan_sha: str, numbers: list[int]) -> dict[int, dict[str, Any]]:
    """The records of those of `numbers` whose part is whole: its record written under this plan, and every shard
    it lists present at the size its tokens make (one listing of OUT, then the records it holds)."""
    sizes = out.sizes()
    width = np.dtype(document["dtype"]).itemsize
    present = [n for n in numbers if part_file(n) in sizes]
    whole = {}
    for _, data in read_many(out, ((part_file(n), sizes[part_file(n)]) for n in present)):
        try:
            record = json.loads(data or b"")
        except json.JSONDecodeError:
            continue
        if record.get("plan") == plan_sha and all(
                sizes.get(s["file"]) == s["tokens"] * width for s in record.get("shards", [])):
            whole[int(record["part"])] = record
    return whole


def work(src: Store, out: Store, worker: int, workers: int, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Tokenize the plan's parts p with p % workers == worker that are not whole yet."""
    if not 0 <= worker < workers:
        raise PrepareError(f"--worker {worker} is not allowed with --workers {workers}: use 0 to {workers - 1}")
    document, plan_sha = read_plan(out)
    if location_of(src) != document["source"]["location"]:
        raise PrepareError(f"SRC {location_of(src)} is not the plan's source {document['source']['location']}")
    mine = [p for p in document["parts"] if p["part"] % workers == worker]
    whole = whole_parts(out, document, plan_sha, [p["part"] for p in mine])
    encoder = load_tokenizer(out, document["tokenizer"])
    made, tokens, text_bytes = [], 0, 0
    for part in mine:
        if part["part"] in whole:
            continue
        record = make_part(src, out, part, document, plan_sha, encoder)
        made.append(part["part"])
        tokens += record["tokens"]
        text_bytes += record["bytes"]
        say(f"worker {worker}/{workers}: {part_file(part['part'])}: {record['documents']} documents, "
            f"{record['tokens']} tokens")
    return {"worker": worker, "workers": workers, "made": made, "skipped": sorted(whole), "tokens": tokens,
            "bytes": text_bytes}


def make_part(src: Store, out: Store, part: dict[str, Any], document: dict[str, Any], plan_sha: str,
              encoder: tok.ByteTokenizer | tok.HFTokenizer) -> dict[str, Any]:
    """One part's shards, then its record (last: the part counts only once its shards are all there). Its files come
    from its own list: a worker reads the lists of its parts, one at a time, never the whole listing. Small files
    are encoded a batch at a time; a file above WHOLE_FILE bytes is read and encoded in chunks (stream_document)."""
    number, files = part["part"], part_files(out, part)
    writer = ShardWriter(out, part["split"], number, document["options"]["shard_tokens"], document["dtype"])
    batch: list[bytes] = []
    size = 0
    left_out = NotText()
    for (rel, listed, take), (_, data) in zip(files, read_many(src, ((f[0], f[1]) for f in files)), strict=True):
        if data is None:
            for text, tokens in encoded(encoder, batch):
                writer.add_document(text, tokens)
            batch, size = [], 0
            if not stream_document(src, rel, listed, take, encoder, writer):
                left_out.add(rel)
            continue
        if len(data) != listed:
            raise changed(src, rel, len(data), listed)
        if not is_text(data):
            left_out.add(rel)
        elif take:
            batch.append(data[:take])
            size += take
            if len(batch) >= BATCH_DOCUMENTS or size >= BATCH_BYTES:
                for text, tokens in encoded(encoder, batch):
                    writer.add_document(text, tokens)
                batch, size = [], 0
    for text, tokens in encoded(encoder, batch):
        writer.add_document(text, tokens)
    record = {"part": number, "split": part["split"], "plan": plan_sha, **writer.finish(),
              **({"not_text": left_out.to_dict()} if left_out.count else {})}
    out.write(part_file(number), (json.dumps(record, indent=1) + "\n").encode())
    return record


def changed(src: Store, rel: str, length: int, listed: int) -> PrepareError:
    return PrepareError(f"{src.label}/{rel} has {length} bytes, the plan {listed}: it changed since the plan; plan "
                        "again")


def encoded(encoder: tok.ByteTokenizer | tok.HFTokenizer, batch: list[bytes]) -> list[tuple[bytes, np.ndarray]]:
    """(document, its tokens) of a batch of documents, in order, encoded at once."""
    return list(zip(batch, encoder.encode_documents(batch), strict=True)) if batch else []


def stream_document(src: Store, rel: str, listed: int, take: int, encoder: tok.ByteTokenizer | tok.HFTokenizer,
                    writer: ShardWriter) -> bool:
    """A large file as one document, the same tokens as if it were read whole: on this machine's disk (an S3
    object spooled to the staging directory), checked to be text whole (a NUL or bad UTF-8 anywhere makes it
    binary, as is_text), then its first `take` bytes read and encoded READ_CHUNK at a time (the tokenizer's
    encode_stream cuts them where it splits the text anyway)."""
    with src.spooled(rel) as path:
        with path.open("rb") as stream:
            text, _, length = text_scan(chunks_of(stream), 0)
        if length != listed:
            raise changed(src, rel, length, listed)
        if not (text and take):
            return text
        with path.open("rb") as stream:
            for tokens in encoder.encode_stream(chunks_of(stream, take)):
                writer.add_tokens(tokens)
        writer.end_document(take)
        return True


def worker_from_resource_config(path: Path = RESOURCE_CONFIG) -> tuple[int, int]:
    """(K, N) of this instance in a SageMaker Processing job: its current_host's position among the sorted hosts."""
    try:
        config = json.loads(path.read_text())
        hosts, current = sorted(config["hosts"]), config["current_host"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PrepareError(f"--worker auto: {path} does not name current_host and hosts ({exc}); outside "
                           "SageMaker give --worker K --workers N") from exc
    if current not in hosts:
        raise PrepareError(f"--worker auto: {path}: current_host {current!r} is not one of hosts {hosts}")
    return hosts.index(current), len(hosts)


def run_workers(src: Store, out: Store, instances: int) -> list[int]:
    """The work stage in `instances` local processes at once (`--stage work --worker K --workers N`, as a
    Processing job's instances run it), each given an even share of this machine's cores for the tokenizer's
    threads; their exit codes, in worker order."""
    trainer_dir = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [trainer_dir, os.environ.get("PYTHONPATH")]))}
    env.setdefault("RAYON_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // instances)))
    command = [sys.executable, "-m", "lustrain_trainer.prepare", location_of(src), location_of(out),
               "--stage", "work", "--workers", str(instances)]
    processes = [subprocess.Popen([*command, "--worker", str(k)], env=env) for k in range(instances)]
    return [process.wait() for process in processes]


# -- 3. merge --------------------------------------------------------------------------------------------------------


def merge(out: Store) -> dict[str, Any]:
    """index.json from the plan and its parts, every one of which must be whole (else PrepareError naming those
    that are not)."""
    document, plan_sha = read_plan(out)
    numbers = [p["part"] for p in document["parts"]]
    whole = whole_parts(out, document, plan_sha, numbers)
    missing = [n for n in numbers if n not in whole]
    if missing:
        names = ", ".join(f"part-{n:05d}" for n in missing[:20]) + (f" and {len(missing) - 20} more"
                                                                    if len(missing) > 20 else "")
        raise PrepareError(f"{len(missing)} of {len(numbers)} parts are not whole in {out.label}: {names} "
                           "(run the work stage again: a worker redoes only the parts not whole)")
    splits: dict[str, dict[str, Any]] = {}
    left_out = NotText()
    left_out.extend(document["source"].get("not_text"))
    for number in numbers:
        record = whole[number]
        left_out.extend(record.get("not_text"))
        entry = splits.setdefault(record["split"], {"tokens": 0, "documents": 0, "bytes": 0, "shards": []})
        for key in ("tokens", "documents", "bytes"):
            entry[key] += record[key]
        entry["shards"] += record["shards"]
    splits = {split: splits[split] for split in SPLITS if splits.get(split, {}).get("shards")}
    source = document["source"]
    if "train" not in splits:
        raise PrepareError(f"no text found in the files under {source['root']} matching {source['glob']!r} "
                           "(all binary?)")
    index: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "dtype": document["dtype"], "tokenizer": document["tokenizer"],
        "source": {"root": source["root"], "glob": source["glob"], "max_bytes": source["max_bytes"],
                   "bytes": sum(s["bytes"] for s in splits.values()), "files_matched": source["files_matched"],
                   **({"not_text": left_out.to_dict()} if left_out.count else {})},
        "splits": splits,
    }
    if "tokenizer_source" in document:
        index["tokenizer_source"] = document["tokenizer_source"]
    out.write(INDEX_NAME, (json.dumps(index, indent=2) + "\n").encode())
    return index


# -- all three -------------------------------------------------------------------------------------------------------


def prepare(src: Path | str | Store, out: Path | str | Store, pattern: str = "**/*", max_bytes: int | None = None,
            shard_tokens: int = 128 << 20, val_fraction: float = 0.01, source_label: str | None = None,
            tokenizer: str = "bytes", bpe_sample_bytes: int = BPE_SAMPLE, shard_bytes: int | None = None,
            instances: int = 1, say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Tokenize the text files under `src` into shards in `out`: plan, work (in this process, or in `instances`
    local processes), merge. Shards hold shard_tokens tokens, or shard_bytes bytes where given (their tokens' width
    is known once the tokenizer is)."""
    source = src if isinstance(src, LocalStore | S3Store) else store_of(src, source_label)
    target = out if isinstance(out, LocalStore | S3Store) else store_of(out)
    plan(source, target, pattern, max_bytes, tokenizer, val_fraction, shard_tokens, shard_bytes, bpe_sample_bytes)
    if instances == 1:
        work(source, target, 0, 1, say)
    else:
        for k, code in enumerate(run_workers(source, target, instances)):
            if code:  # the merge names the parts it left
                print(f"worker {k}/{instances} exited with code {code}", file=sys.stderr)
    return merge(target)


# -- the command -----------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="lustrain data prepare",
        description="Tokenize a tree of text files into a few large token shards plus index.json (and the "
                    "tokenizer's tokenizer.json): plan, work (on one or many workers), merge.",
    )
    parser.add_argument("src", metavar="SRC",
                        help=f"directory or s3:// prefix of text files, or {STDLIB!r} for this Python's standard "
                             "library source (an existing directory of that name wins); with --stage merge, OUT "
                             "alone will do")
    parser.add_argument("out", metavar="OUT", nargs="?",
                        help="directory or s3:// prefix to write the shards and index.json to")
    parser.add_argument("--glob", default="**/*",
                        help="files to take, relative to SRC (default: %(default)s)")
    parser.add_argument("--max-bytes", type=parse_size, default=None,
                        help="stop after this much text, e.g. 4MiB")
    parser.add_argument("--shard-size", type=parse_size, default=256 << 20,
                        help="bytes per shard file, and the text per part of the work (default 256MiB)")
    parser.add_argument("--val-fraction", type=float, default=0.01,
                        help="share of the text held out for validation, in whole files (default: %(default)s)")
    parser.add_argument("--tokenizer", default="bytes",
                        help=f"{TOKENIZER_HELP} (default: %(default)s): bpe:VOCAB trains a byte-level BPE of VOCAB "
                             f"tokens ({BPE_VOCAB[0]} to {BPE_VOCAB[1]}) on the corpus")
    parser.add_argument("--bpe-sample", type=parse_size, default=BPE_SAMPLE,
                        help="text a bpe:VOCAB tokenizer is trained on, at most: all of a smaller corpus, else a "
                             "sample of files chosen by their paths' hashes (default 256MiB)")
    parser.add_argument("--stage", choices=STAGES, default="all",
                        help="all (default): plan, work, merge here; plan: write OUT/prepare-plan.json; work: "
                             "tokenize this worker's parts; merge: write index.json once every part is whole")
    parser.add_argument("--instances", type=int, default=1,
                        help="--stage all: run the work in this many local processes at once (default 1)")
    parser.add_argument("--worker", help="--stage work: this worker's number K (0 to N-1), or `auto` for its "
                                         "place among a SageMaker Processing job's hosts")
    parser.add_argument("--workers", type=int, help="--stage work: how many workers share the parts (N)")
    parser.add_argument("--resource-config", type=Path, default=RESOURCE_CONFIG,
                        help="--worker auto: SageMaker's resource config (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.out is None:
        if args.stage != "merge":
            parser.error("OUT is required (only --stage merge takes OUT alone)")
        args.src, args.out = None, args.src
    if args.instances < 1:
        parser.error(f"--instances {args.instances} is not allowed: use 1 or more")
    if args.instances > 1 and args.stage != "all":
        parser.error("--instances is for --stage all; a worker of a job gives --worker K --workers N")
    if args.stage == "work":
        if args.worker is None:
            parser.error("--stage work needs --worker K --workers N, or --worker auto")
        if args.worker != "auto":
            if not args.worker.isdigit() or args.workers is None or args.workers < 1:
                parser.error(f"--worker {args.worker}: give a number K from 0 to N-1 with --workers N (N >= 1), "
                             "or auto")
            if int(args.worker) >= args.workers:
                parser.error(f"--worker {args.worker} is not allowed with --workers {args.workers}: use 0 to "
                             f"{args.workers - 1}")
    elif args.worker is not None or args.workers is not None:
        parser.error("--worker and --workers are for --stage work")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        out = store_of(args.out)
        if args.stage == "merge":
            report(merge(out), out.label)
            return 0
        src = store_of(args.src)
        if args.stage == "plan":
            document = plan(src, out, args.glob, args.max_bytes, args.tokenizer, args.val_fraction,
                            shard_bytes=args.shard_size, bpe_sample_bytes=args.bpe_sample)
            print(f"planned {document['source']['bytes']} bytes of {document['source']['files']} files from "
                  f"{src.label} in {len(document['parts'])} parts into {out.label}/{PLAN_NAME}; next: "
                  f"--stage work --worker K --workers N on each worker, then --stage merge")
            return 0
        if args.stage == "work":
            if args.worker == "auto":
                worker, workers = worker_from_resource_config(args.resource_config)
                if args.workers is not None and args.workers != workers:
                    raise PrepareError(f"--workers {args.workers} but {args.resource_config} lists {workers} hosts")
            else:
                worker, workers = int(args.worker), args.workers
            done = work(src, out, worker, workers)
            print(f"worker {worker}/{workers}: made {len(done['made'])} part(s) ({done['tokens']} tokens from "
                  f"{done['bytes']} bytes), {len(done['skipped'])} already whole")
            return 0
        index = prepare(src, out, args.glob, args.max_bytes, val_fraction=args.val_fraction,
                        tokenizer=args.tokenizer, bpe_sample_bytes=args.bpe_sample, shard_bytes=args.shard_size,
                        instances=args.instances)
    except (PrepareError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report(index, out.label)
    return 0


def report(index: dict[str, Any], where: str) -> None:
    parts = [f"{split}: {s['documents']} documents, {s['tokens']} tokens in {len(s['shards'])} shard(s)"
             for split, s in index["splits"].items()]
    info = index["tokenizer"]
    if info["eos"] is None:
        print(f"note: the tokenizer has no end-of-document token (none of {' '.join(tok.EOS_NAMES)}): documents "
              "follow one another with nothing between them", file=sys.stderr)
    not_text = index["source"].get("not_text")
    if not_text:
        print(f"note: {not_text['count']} matched file(s) are not UTF-8 text (binary, or another encoding) and were "
              f"left out, e.g. {', '.join(not_text['examples'])}", file=sys.stderr)
    print(f"prepared {index['source']['bytes']} bytes from {index['source']['root']} into {where} "
          f"({'; '.join(parts)}); tokenizer {info['kind']}, vocab_size {info['vocab_size']}, {index['dtype']} shards")


if __name__ == "__main__":
    sys.exit(main())
