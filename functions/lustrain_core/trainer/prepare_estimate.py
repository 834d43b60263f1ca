"""How long a data preparation takes (prepare.py's plan, work on N instances, merge), from the text's size, the
tokenizer and the number of instances: for `lustrain plan`'s time and cost of `lustrain data prepare`.

Pure: standard library only, no I/O, so the control plane can call it without the trainer's dependencies.

The rates are bench/prepare.py's, measured on a 2-core machine shared with other work (so lower than a quiet
machine's), one worker per process, reading local files:

    python bench/prepare.py --tokenizers bytes,bpe:4096 --workers 1,2 --shard-size 4MiB

The byte tokenizer runs on one core (numpy) and is bound by reading and writing; the BPE encodes on every core of
its instance (Hugging Face `tokenizers`), so its rate is scaled by the instance's vCPUs against the 2 it was
measured on when `vcpus` is given (an assumption: the encoder's threads scale with cores, the reading does not hold
it back). Not counted: starting the instances (the Processing job's provisioning) and S3's latency on a corpus of
many small files (each worker reads READ_THREADS files at once to hide it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: text bytes per second one worker with the machine to itself tokenizes and writes (bench/prepare.py, above: the
#: stdlib's 31.5 MB): the byte tokenizer in 0.83 s (38 MB/s, most of it the process's start: a lower bound), a
#: byte-level BPE of 4,096 in 59.3 s (0.53 MB/s, 158,190 tokens/s; two workers sharing the 2 cores: 0.41 MB/s each)
BYTES_RATE = 38e6
BPE_RATE = 0.53e6
#: text bytes per second the plan reads and trains a BPE on (its sample, at most BPE_SAMPLE): 31.5 MB in 17.7 s
BPE_TRAIN_RATE = 1.78e6
#: the cores those rates were measured on
MEASURED_VCPUS = 2
#: prepare.BPE_SAMPLE and the default shard (and part) size, repeated here so this module imports nothing
BPE_SAMPLE = 256 << 20
PART_BYTES = 256 << 20
#: the plan's and the merge's fixed costs (a listing, a few small reads and writes), and the merge's per part (reading
#: one record)
FIXED_SECONDS = 5.0
MERGE_SECONDS_PER_PART = 0.05
RATE_SOURCE = ("bench/prepare.py --tokenizers bytes,bpe:4096 --workers 1,2 --shard-size 4MiB on 2 shared cores "
               "(load average about 6)")


@dataclass(frozen=True)
class PrepareEstimate:
    plan_seconds: float
    work_seconds: float
    merge_seconds: float
    parts: int
    #: text bytes per second one instance works at
    instance_bytes_per_s: float
    rate_source: str = RATE_SOURCE

    @property
    def seconds(self) -> float:
        return self.plan_seconds + self.work_seconds + self.merge_seconds


def estimate_prepare(text_bytes: int, tokenizer: str = "bytes", instances: int = 1, vcpus: int | None = None,
                     part_bytes: int = PART_BYTES, bpe_sample_bytes: int = BPE_SAMPLE) -> PrepareEstimate:
    """The time of `prepare SRC OUT --tokenizer T` with its work on `instances` instances of `vcpus` vCPUs each:
    the plan (for bpe:VOCAB, training on the sample), the work (each instance takes every instances-th part of about
    part_bytes; the slowest takes ceil(parts / instances)), the merge."""
    if text_bytes < 0:
        raise ValueError(f"text_bytes {text_bytes} is not allowed: use 0 or more")
    if instances < 1:
        raise ValueError(f"instances {instances} is not allowed: use 1 or more")
    if vcpus is not None and vcpus < 1:
        raise ValueError(f"vcpus {vcpus} is not allowed: use 1 or more")
    if part_bytes < 1:
        raise ValueError(f"part_bytes {part_bytes} is not allowed: use 1 or more")
    if not tokenizer.strip():
        raise ValueError("tokenizer is empty; allowed: bytes | bpe:VOCAB | PATH or s3:// URL of a tokenizer.json")
    if tokenizer == "bytes":
        rate = BYTES_RATE
        train = 0.0
    else:  # bpe:VOCAB, or an existing tokenizer.json, which encodes as a trained BPE does
        rate = BPE_RATE * (vcpus / MEASURED_VCPUS if vcpus else 1)
        trained = tokenizer.startswith("bpe")
        train = min(text_bytes, bpe_sample_bytes) / BPE_TRAIN_RATE if trained else 0.0
    parts = max(1, math.ceil(text_bytes / part_bytes))
    work = math.ceil(parts / instances) * (text_bytes / parts) / rate
    return PrepareEstimate(plan_seconds=FIXED_SECONDS + train, work_seconds=work,
                           merge_seconds=FIXED_SECONDS + MERGE_SECONDS_PER_PART * parts, parts=parts,
                           instance_bytes_per_s=rate)
