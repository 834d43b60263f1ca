"""Benchmark of `prepare` and `export` at the scale they exist for: what the plan stage, one worker and an export hold
in memory, old layout against new, side by side.

    python bench/prepare_scale.py [--files 100000,1000000] [--model-mb 400]

- plan: the plan stage (bytes tokenizer) over a synthetic listing of N files of 200 kB each (20 TB at 10^8 files:
  the issue's corpus), listed in order as an S3 listing gives it; its peak Python memory by tracemalloc. "old" is
  the whole-listing layout as the plan made it before (the listing, its entries and every part's files in one
  document, serialized whole); "new" is prepare.plan itself (the listing streamed to a spill file, one list per part,
  a small plan document).
- worker: one worker of 100 taking its first part: "old" parses the whole plan document, "new" reads the plan
  document and its part's list (prepare.read_plan, prepare.part_files); peak Python memory by tracemalloc.
- export: a Llama model of about --model-mb MB of float32 weights, exported to safetensors shards of 100 MB; its peak
  anonymous memory (RssAnon, sampled every 2 ms in a process of its own: the pages of a memory-mapped model.pt are
  file-backed, reclaimable, and not in it; counted from after the same work on a tiny model, which pays torch's
  one-time setup) and peak RSS (VmHWM, which counts the mapped pages it read). "whole" loads model.pt whole
  (torch.load without mmap), "mmap" is export.export as it is. The same for generate's load_model ("whole": a model
  of its own, the state read whole and copied in, as it was).

Lines are key=value; mb figures are MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lustrain_trainer import prepare as prep

FILE_BYTES = 200_000
MiB = 1 << 20


class Listing:
    """A source store of N files of FILE_BYTES, listed in path order without being held (what S3 pages give)."""

    label = "s3://bench/corpus"

    def __init__(self, files: int) -> None:
        self.count = files
        self.root = Path("/nonexistent")

    def files(self, pattern: str) -> Iterator[tuple[str, int]]:
        return ((f"shard{k // 10_000:05d}/doc{k:09d}.txt", FILE_BYTES) for k in range(self.count))


def old_plan(src: Listing, shard_bytes: int) -> bytes:
    """The plan document of the whole-listing layout, made as prepare made it: the listing in a list, its entries,
    the parts with their files, one JSON document."""
    listing = sorted(src.files("**/*"))
    entries = [[rel, size, size] for rel, size in listing if size]
    parts: list[dict[str, Any]] = []
    current: list[list[Any]] = []
    size = 0
    for entry in entries:
        if current and size + entry[2] > shard_bytes:
            parts.append({"part": len(parts), "split": "train", "bytes": size, "files": current})
            current, size = [], 0
        current.append(entry)
        size += entry[2]
    parts.append({"part": len(parts), "split": "train", "bytes": size, "files": current})
    document = {"format": prep.PLAN_FORMAT, "version": 1, "source": {"files": len(entries)}, "parts": parts}
    return (json.dumps(document, separators=(",", ":")) + "\n").encode()


def peak(call: Any) -> tuple[Any, float, float]:
    """(result, peak traced MiB, seconds) of call()."""
    tracemalloc.start()
    started = time.perf_counter()
    result = call()
    seconds = time.perf_counter() - started
    _, top = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return result, top / MiB, seconds


def bench_prepare(files: int, tmp: Path, shard_bytes: int = 256 * MiB) -> None:
    src = Listing(files)
    text, old_mb, old_s = peak(lambda: old_plan(src, shard_bytes))
    out = prep.store_of(tmp / f"new{files}")
    document, new_mb, new_s = peak(lambda: prep.plan(src, out, shard_bytes=shard_bytes, val_fraction=0.0))  # type: ignore[arg-type]
    key = f"plan_files{files}"
    print(f"{key}_old_peak_mb={old_mb:.1f} {key}_new_peak_mb={new_mb:.1f} {key}_old_seconds={old_s:.1f} "
          f"{key}_new_seconds={new_s:.1f} {key}_old_plan_bytes={len(text)} "
          f"{key}_new_plan_bytes={(tmp / f'new{files}' / prep.PLAN_NAME).stat().st_size} "
          f"{key}_parts={len(document['parts'])}")

    def old_worker() -> int:
        plan = json.loads(text)
        mine = [p for p in plan["parts"] if p["part"] % 100 == 0]
        return len(mine[0]["files"])

    def new_worker() -> int:
        plan, _ = prep.read_plan(out)
        mine = [p for p in plan["parts"] if p["part"] % 100 == 0]
        return len(prep.part_files(out, mine[0]))

    old_files, old_mb, _ = peak(old_worker)
    new_files, new_mb, _ = peak(new_worker)
    assert old_files == new_files, (old_files, new_files)
    key = f"worker_files{files}"
    print(f"{key}_old_peak_mb={old_mb:.1f} {key}_new_peak_mb={new_mb:.1f} {key}_part_files={new_files}")


CHILD = r"""
import functools, json, sys, threading, time, resource
from pathlib import Path
import torch
from lustrain_trainer import export, generate
mode, what, model_dir, out, warm_dir = sys.argv[1:6]
peak = {"anon": 0}
stop = threading.Event()
def sample():
    while not stop.is_set():
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                peak["anon"] = max(peak["anon"], int(line.split()[1]))
        time.sleep(0.002)
thread = threading.Thread(target=sample, daemon=True)
real_load = torch.load
if mode == "whole":
    def whole(*args, **kwargs):
        kwargs["mmap"] = False
        return real_load(*args, **kwargs)
    torch.load = whole
def run(model_dir, out):
    if what == "export":
        export.export(Path(model_dir), Path(out), max_shard_bytes=100 * 2**20)
    elif mode == "whole":  # as load_model did: a model of its own, the state read whole, copied in
        config = json.loads((Path(model_dir) / "config.json").read_text())
        model = generate.build(generate.config_from_dict(config["model"]))
        model.load_state_dict(real_load(Path(model_dir) / "model.pt", map_location="cpu", weights_only=True))
    else:
        model = generate.load_model(Path(model_dir))
run(warm_dir, out + "-warm")  # torch's first use of these paths sets up tens of MB once, whatever the model
base = int([l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("RssAnon:")][0].split()[1])
thread.start()
run(model_dir, out)
stop.set(); thread.join()
hwm = int([l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM:")][0].split()[1])
print(json.dumps({"anon_mb": (peak["anon"] - base) / 1024, "hwm_mb": hwm / 1024}))
"""


def bench_export(model_mb: int, tmp: Path) -> None:
    import torch
    from lustrain_trainer.model import CONFIG_FILE, MODEL_FILE, LlamaConfig, build
    from lustrain_trainer.tokenizer import TOKENIZER_INFO

    # 8 layers of width 1024: 12.6M parameters a layer (GQA 16/4 heads, SwiGLU 2816) plus the embeddings
    layers = max(1, round(model_mb * MiB / 4 / (12.6e6)))
    config = LlamaConfig(n_layer=layers, n_head=16, n_kv_head=4, n_embd=1024, ffn_hidden=2816, seq_len=256)
    tiny = LlamaConfig(n_layer=1, n_head=2, n_kv_head=1, n_embd=32, ffn_hidden=64, seq_len=16)
    for config_of, model_dir in ((config, tmp / "model"), (tiny, tmp / "warm")):
        model_dir.mkdir()
        with torch.device("meta"):
            model = build(config_of)
        state = {name: torch.randn(p.shape) * 0.02 for name, p in model.state_dict().items()}
        torch.save(state, model_dir / MODEL_FILE)
        del state
        (model_dir / CONFIG_FILE).write_text(json.dumps({"model": config_of.to_dict(), "tokenizer": TOKENIZER_INFO}))
    model_dir = tmp / "model"
    size_mb = (model_dir / MODEL_FILE).stat().st_size / MiB
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for what in ("export", "generate"):
        figures = {}
        for mode in ("whole", "mmap"):
            done = subprocess.run([sys.executable, "-c", CHILD, mode, what, str(model_dir), str(tmp / f"hf-{mode}"),
                                   str(tmp / "warm")],
                                  check=True, capture_output=True, text=True, env=env)
            figures[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{what}_model_mb={size_mb:.0f} " + " ".join(
            f"{what}_{mode}_peak_anon_mb={f['anon_mb']:.0f} {what}_{mode}_peak_rss_mb={f['hwm_mb']:.0f}"
            for mode, f in figures.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="100000,1000000", help="comma-separated numbers of listed files")
    parser.add_argument("--model-mb", type=int, default=400, help="float32 weights of the exported model, MB")
    args = parser.parse_args()
    print(f"cpus={len(os.sched_getaffinity(0))} loadavg={'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        for files in (int(n) for n in args.files.split(",")):
            bench_prepare(files, Path(tmp))
        bench_export(args.model_mb, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
