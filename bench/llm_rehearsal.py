"""Benchmark: does the Llama block on BPE data learn at least as well as today's rehearsal, at the same wall time?

Today's rehearsal (examples/tiny.yaml: preset tiny, the GPT block, byte tokens) and the tokenized one
(examples/llama-tiny.yaml: preset llama-tiny on bpe:4096) train on the rehearsal's own example data (the
standard library's source, rehearse.example_shards, one cache per tokenizer: the same documents, the same val
split) for the same wall time each, and each one's final validation bits per byte is printed: a loss per byte of
the same val text, comparable across tokenizers where a loss per token is not (metrics.bits_per_byte).

The same wall time: the baseline trains its spec's max_steps (or --baseline-steps), and the Llama model as many
steps as take the same time, each run warming up and decaying its learning rate over its own steps as a run of that
length would. Both presets train on one thread (cpu_threads 1), so on a quiet machine a training process's wall time
is its CPU time; on a busy one (where this was measured: the load is printed) its wall time is stretched by whatever
else runs, by a different amount for each run, while its CPU time is not. So the time matched is the CPU time of the
whole training process (start, steps, the final evaluation, the model's writing): the Llama model's per-step and
fixed CPU seconds are measured by two calibration runs of different lengths, and it trains the steps that give the
baseline's CPU time. Each run's CPU and wall seconds are printed beside its figures. Both evaluate once, at the end,
over their whole val split (eval_batches past its size). Each trains as one process (the rehearsal's two instances
are two ranks of the same batches each: the same for both models).

Then the Llama model is exported with `lustrain export`, loaded with transformers (LlamaForCausalLM), its logits
on a window of val text compared with ours (fp32), and both generate greedily from the same prompt: the same text
(transformers also samples some, at temperature 0.8).

    python bench/llm_rehearsal.py [--baseline-steps 150 600] [--tokenizer bpe:4096] [--no-export]

Each budget ends in key=value lines: <model>_val_bpb, <model>_cpu_s and <model>_wall_s (the training process),
<model>_steps; then export_logits_max_abs_diff, export_logits_equal, generated_*.
Exit status 1 where the Llama model learned less, or the export's logits or greedy text differ from ours.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
BASELINE_SPEC = REPO / "examples" / "tiny.yaml"
LLAMA_SPEC = REPO / "examples" / "llama-tiny.yaml"
#: the steps of the two calibration runs that measure the Llama model's CPU seconds per step and fixed ones
CALIBRATION_STEPS, LOG_INTERVAL = (20, 60), 10
PROMPT = "def "


def spec_hyperparameters(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text())["code"].get("hyperparameters") or {})


def train(data: Path, hyperparameters: dict[str, Any], steps: int, into: Path) -> dict[str, Any]:
    """Run train.py in a process of its own for `steps` steps, one evaluation at the end over the whole val split;
    its summary's final block, the process's CPU and wall seconds and its model directory."""
    args = {
        **hyperparameters,
        "max_steps": steps,
        "log_interval": LOG_INTERVAL,
        "eval_interval": steps,
        "eval_batches": 100_000,
        "checkpoint_interval": 10 * steps,
    }
    argv = [
        sys.executable,
        str(REPO / "trainer" / "train.py"),
        "--data",
        str(data),
        "--model_dir",
        str(into / "model"),
        "--checkpoint_dir",
        str(into / "checkpoints"),
        "--output_data_dir",
        str(into / "output"),
    ]
    argv += [item for key, value in args.items() for item in (f"--{key}", str(value))]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "trainer"), os.environ.get("PYTHONPATH", "")]),
    }
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    after, wall_s = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"train.py failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads((into / "output" / "summary.json").read_text())
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {**summary["final"], "cpu_s": cpu_s, "wall_s": wall_s, "model": into / "model"}


def export_and_compare(model_dir: Path, data: Path, out: Path) -> list[str]:
    """`lustrain export`, transformers' LlamaForCausalLM on it, our logits against theirs, greedy text from both."""
    import numpy as np
    import torch
    import transformers
    from lustrain_trainer import generate
    from lustrain_trainer.shards import read_index

    from lustrain.cli import main as lustrain

    code = lustrain(["export", str(model_dir), "-o", str(out)])
    if code != 0:
        raise SystemExit(f"lustrain export failed (exit {code})")
    theirs = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    ours = generate.load_model(model_dir)
    index = read_index(data)
    shard = index.splits["val"][0]
    seq_len = theirs.config.max_position_embeddings
    window = np.fromfile(shard.path, dtype=np.dtype(index.dtype))[: 2 * seq_len].astype(np.int64)
    idx = torch.from_numpy(window).view(2, seq_len)
    with torch.no_grad():
        theirs_logits, ours_logits = theirs(idx).logits, ours(idx)
    diff = float((theirs_logits - ours_logits).abs().max())
    equal = bool(torch.allclose(theirs_logits, ours_logits, rtol=1e-5, atol=1e-5))

    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    prompt_ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        made = theirs.generate(
            prompt_ids, max_new_tokens=40, do_sample=False, pad_token_id=tokenizer.eos_token_id
        )
    text_theirs = tokenizer.decode(made[0], skip_special_tokens=False)
    text_ours = generate.sample(ours, PROMPT, 40, 0.0, None, 0, generate.load_tokenizer(model_dir))
    torch.manual_seed(0)
    with torch.no_grad():
        sampled = theirs.generate(
            prompt_ids,
            max_new_tokens=40,
            do_sample=True,
            temperature=0.8,
            top_k=40,
            pad_token_id=tokenizer.eos_token_id,
        )
    return [
        f"export_dir_files={','.join(sorted(p.name for p in out.iterdir()))}",
        f"export_logits_max_abs_diff={diff:.2e}",
        f"export_logits_equal={str(equal).lower()}",
        f"generated_transformers={text_theirs!r}",
        f"generated_ours={text_ours!r}",
        f"generated_same={str(text_theirs == text_ours).lower()}",
        f"generated_sampled={tokenizer.decode(sampled[0])!r}",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline-steps",
        type=int,
        nargs="+",
        default=None,
        help="the baseline's steps, one budget each (default: examples/tiny.yaml's max_steps and "
        "the tiny preset's)",
    )
    parser.add_argument(
        "--tokenizer", default="bpe:4096", help="the Llama model's data (default %(default)s)"
    )
    parser.add_argument("--no-export", action="store_true", help="leave out the export and transformers")
    args = parser.parse_args()

    from lustrain_trainer.presets import PRESETS

    from lustrain.twin.rehearse import example_shards

    base_hp, llama_hp = spec_hyperparameters(BASELINE_SPEC), spec_hyperparameters(LLAMA_SPEC)
    budgets = args.baseline_steps or [int(base_hp["max_steps"]), int(PRESETS[base_hp["preset"]]["max_steps"])]
    load = os.getloadavg()
    print(f"load_before={load[0]:.2f} cpus={os.cpu_count()}", flush=True)
    started = time.monotonic()
    bytes_data, bpe_data = example_shards(tokenizer="bytes"), example_shards(tokenizer=args.tokenizer)
    print(f"data_prepare_s={time.monotonic() - started:.1f} (cached after the first run)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        short, long = (train(bpe_data, llama_hp, n, root / f"calibration-{n}") for n in CALIBRATION_STEPS)
        per_step = (long["cpu_s"] - short["cpu_s"]) / (CALIBRATION_STEPS[1] - CALIBRATION_STEPS[0])
        fixed = short["cpu_s"] - CALIBRATION_STEPS[0] * per_step
        print(f"llama_cpu_s_per_step={per_step:.3f} llama_cpu_s_fixed={fixed:.1f} (calibration)", flush=True)
        last_llama: Path | None = None
        ok = True
        for n, steps in enumerate(budgets):
            gpt = train(bytes_data, base_hp, steps, root / f"gpt-{n}")
            llama_steps = max(1, round((gpt["cpu_s"] - fixed) / per_step))
            llama = train(bpe_data, llama_hp, llama_steps, root / f"llama-{n}")
            print(
                f"budget={n} baseline={base_hp['preset']}/gpt/bytes candidate={llama_hp['preset']}/llama/"
                f"{args.tokenizer} load={os.getloadavg()[0]:.2f}"
            )
            for name, run in (("gpt_bytes", gpt), ("llama_bpe", llama)):
                print(
                    f"{name}_steps={run['step']} {name}_val_bpb={run['val_bpb']:.4f} "
                    f"{name}_cpu_s={run['cpu_s']:.1f} {name}_wall_s={run['wall_s']:.1f}",
                    flush=True,
                )
            ok &= llama["val_bpb"] <= gpt["val_bpb"]
            print(f"llama_bpe_learns_as_well={str(llama['val_bpb'] <= gpt['val_bpb']).lower()}", flush=True)
            last_llama = llama["model"]
        if not args.no_export and last_llama is not None:
            for line in export_and_compare(last_llama, bpe_data, root / "hf"):
                ok &= line not in ("export_logits_equal=false", "generated_same=false")
                print(line, flush=True)
    print(f"load_after={os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
