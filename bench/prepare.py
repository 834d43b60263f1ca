"""Benchmark of `lustrain data prepare` on one machine: tokens per second for each tokenizer, on the stdlib corpus.

    python bench/prepare.py [--tokenizers bytes,bpe:4096] [--glob '**/*.py'] [--max-bytes SIZE]

For each tokenizer the whole preparation is timed (reading the files, for bpe:VOCAB training the tokenizer on its
sample, encoding, writing the shards and the index), then, for bpe:VOCAB, the training alone, so that the encoding
rate (what grows with the corpus; the training's sample is bounded) is printed apart. Lines are key=value; the
cores this process may use are printed too (the BPE trains and encodes on all of them).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from lustrain_trainer import prepare as prep
from lustrain_trainer import tokenizer as tok


def label(spec: str) -> str:
    return spec.replace(":", "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizers", default="bytes,bpe:4096", help="comma-separated --tokenizer values")
    parser.add_argument("--glob", default="**/*.py")
    parser.add_argument("--max-bytes", type=prep.parse_size, default=None)
    args = parser.parse_args()
    src = prep.stdlib_source_dir()
    print(f"corpus=stdlib glob={args.glob} cpus={len(os.sched_getaffinity(0))}")
    for spec in args.tokenizers.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            index = prep.prepare(src, Path(tmp), args.glob, args.max_bytes, source_label=prep.STDLIB,
                                 tokenizer=spec, shard_bytes=256 << 20)
            elapsed = time.perf_counter() - started
        tokens = sum(split["tokens"] for split in index["splits"].values())
        text = index["source"]["bytes"]
        name = label(spec)
        print(f"{name}_bytes={text} {name}_tokens={tokens} {name}_bytes_per_token={text / tokens:.2f} "
              f"{name}_vocab_size={index['tokenizer']['vocab_size']}")
        print(f"{name}_seconds={elapsed:.2f} {name}_tokens_per_s={tokens / elapsed:.0f} "
              f"{name}_mb_per_s={text / elapsed / 1e6:.2f}")
        kind, vocab = prep.parse_tokenizer(spec)
        if kind == "bpe":
            files = prep.source_files(src, args.glob)
            started = time.perf_counter()
            texts, _ = prep.bpe_sample(files, args.max_bytes, prep.BPE_SAMPLE)
            tok.train_bpe(texts, int(vocab or 0))
            train = time.perf_counter() - started
            print(f"{name}_train_seconds={train:.2f} "
                  f"{name}_encode_tokens_per_s={tokens / max(elapsed - train, 1e-9):.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
