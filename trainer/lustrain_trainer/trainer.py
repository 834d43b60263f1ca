"""The training run: SageMaker's contract in, a trained model, checkpoints and a summary out.

    python train.py --data DIR [--preset tiny] [--max_steps 300] ...      (one process)
    python -m torch.distributed.run --nproc_per_node N train.py ...        (DDP or FSDP)

On SIGTERM (SageMaker stopping the job, a spot interruption) or Ctrl-C every rank finishes its step, a
checkpoint is saved and the process exits 0; the next start resumes from the newest good checkpoint.

Exit codes: 0 trained (or stopped with a checkpoint), 2 the run's own input is wrong (hyperparameters, data, a
checkpoint of another model), faults.INFRASTRUCTURE_EXIT_CODE (75) the machine under it failed (NCCL, EFA, CUDA,
ECC, a lost rank, a failed pre-flight: see faults.py), any other the code's own error (a traceback).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import torch
from torch import nn

from . import checkpoint, distributed, faults
from .data import Batch, BatchPlan, Prefetcher, ShardReader
from .distributed import Dist
from .hparams import (
    Hosts,
    HyperparameterError,
    Hyperparameters,
    RunPaths,
    parse,
    read_hosts,
    resolve_paths,
    shape_of,
)
from .metrics import format_line
from .model import CONFIG_FILE, GPT, MODEL_FILE
from .shards import DataError, DataIndex, read_index
from .tokenizer import TOKENIZER_INFO

DATA_TRACE_ENV = "LUSTRAIN_DATA_TRACE"
#: SageMaker's directory of the "resume" channel: the checkpoint of the run this one continues
RESUME_CHANNEL_ENV = "SM_CHANNEL_RESUME"
SUMMARY_FILE = "summary.json"


def say(message: str) -> None:
    """Information for people; metric lines go through format_line so the MetricDefinitions see only them."""
    print(f"lustrain: {message}", flush=True)


class StopRequest:
    """Set by SIGTERM/SIGINT; the loop notices it between steps, when a consistent checkpoint can be taken."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: someone wants out now, checkpoint or not
        self.signal = signal.Signals(signum).name

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopRequest]:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        try:
            yield self
        finally:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)


def lr_at(step: int, hp: Hyperparameters) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio * lr at max_steps."""
    if hp.warmup_steps and step <= hp.warmup_steps:
        return hp.lr * step / hp.warmup_steps
    span = max(1, hp.max_steps - hp.warmup_steps)
    progress = min(1.0, (step - hp.warmup_steps) / span)
    floor = hp.lr * hp.min_lr_ratio
    return floor + (hp.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, hp: Hyperparameters, device: torch.device, sharded: bool = False
                   ) -> torch.optim.Optimizer:
    # No weight decay on norms' gains: decaying them pulls activations toward zero for no regularising gain.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": hp.weight_decay}, {"params": other, "weight_decay": 0.0}]
    # The fused CUDA kernel for plain tensors; FSDP's sharded parameters keep the default implementation.
    return torch.optim.AdamW(groups, lr=hp.lr, betas=(0.9, 0.95),
                             fused=True if device.type == "cuda" and not sharded else None)


@dataclass
class Outcome:
    status: str
    step: int
    resumed_from: int | None
    metrics: dict[str, float] = field(default_factory=dict)
    tokens_seen: int = 0


class Trainer:
    def __init__(self, hp: Hyperparameters, paths: RunPaths, info: Dist, hosts: Hosts, index: DataIndex) -> None:
        self.hp, self.paths, self.info, self.hosts = hp, paths, info, hosts
        # the run lustrain started this job for, the run it may continue, and that run's checkpoint (if any)
        self.run_id = os.environ.get(checkpoint.RUN_ID_ENV) or None
        self.resume_from = os.environ.get(checkpoint.RESUME_FROM_ENV) or None
        resume_dir = os.environ.get(RESUME_CHANNEL_ENV)
        self.resume_dir = Path(resume_dir) if resume_dir else None
        # With distribution none on several hosts each host trains alone; only the first one writes.
        self.writes = info.is_main and (info.active or hosts.is_first)
        self.config = hp.model_config()
        self.bf16 = hp.precision == "bf16" or (
            hp.precision == "auto" and info.device.type == "cuda" and torch.cuda.is_bf16_supported())
        if hp.precision == "bf16" and info.device.type != "cuda":
            raise HyperparameterError("hyperparameter precision: bf16 needs a GPU (use auto or fp32 on CPU)")

        if info.device.type == "cpu" and hp.cpu_threads:
            torch.set_num_threads(hp.cpu_threads)
        torch.manual_seed(hp.seed)
        self.model = GPT(self.config, activation_checkpointing=hp.activation_checkpointing)
        self.parameters = sum(p.numel() for p in self.model.parameters())
        self.fsdp = distributed.use_fsdp(hp.fsdp, self.parameters, info)
        if not self.fsdp:
            self.model.to(info.device)
        self.step_module = distributed.wrap(self.model, info, self.fsdp, self.bf16) if self.fsdp else self.model
        self.optimizer = make_optimizer(self.model, hp, info.device, sharded=self.fsdp)

        self.train_plan = BatchPlan([s.tokens for s in index.splits["train"]], hp.batch_size, hp.seq_len,
                                    info.rank, info.world_size, hp.seed, split="train")
        self.train_reader = ShardReader(index, "train")
        self.val_plan: BatchPlan | None = None
        if hp.eval_interval and index.splits.get("val"):
            try:
                self.val_plan = BatchPlan([s.tokens for s in index.splits["val"]], hp.batch_size, hp.seq_len,
                                          info.rank, info.world_size, hp.seed, shuffle=False, split="val")
            except DataError as exc:
                self.log(f"validation off: {exc}")
            self.val_reader = ShardReader(index, "val")
        self.saved_step = -1

    def log(self, message: str) -> None:
        if self.info.is_main:
            say(message)

    # -- state ---------------------------------------------------------------------------------------

    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The full model and optimizer state (optimizer keyed by parameter name) on CPU, for rank 0 to save.

        Under FSDP every rank must call this: the shards are gathered onto rank 0.
        """
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            return get_state_dict(self.model, self.optimizer, options=options)
        if not self.writes:
            return {}, {}
        model_state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        return model_state, checkpoint.optimizer_state_by_name(self.model, self.optimizer)

    def save_checkpoint(self, step: int, tokens_seen: int, reason: str) -> None:
        if step == self.saved_step:
            return
        model_state, optim_state = self._state()
        if self.writes:
            started = time.monotonic()
            path = checkpoint.checkpoint_path(self.paths.checkpoints, step)
            payload = checkpoint.make_payload(step, model_state, optim_state, self.config.to_dict(),
                                              {"tokens_seen": tokens_seen, "hyperparameters": self.hp.to_dict(),
                                               "run": self.run_id})
            checkpoint.save_atomic(payload, path)
            checkpoint.save_manifest(checkpoint.manifest_path(self.paths.checkpoints, step), {
                "format": checkpoint.FORMAT, "version": checkpoint.VERSION, "run": self.run_id, "step": step,
                "model_config": self.config.to_dict(), "shape": shape_of(self.hp)})
            checkpoint.prune(self.paths.checkpoints, self.hp.keep_checkpoints)
            say(f"checkpoint saved {path.name} at step {step} ({reason}, {time.monotonic() - started:.2f}s)")
        distributed.barrier(self.info)
        self.saved_step = step

    def restore(self) -> tuple[int, int]:
        """Load the newest good checkpoint, as rank 0 chooses it: (step, tokens_seen), (0, 0) if none.

        Under FSDP rank 0 reads it and the state is broadcast; otherwise every rank reads the same step from
        its own checkpoint directory (SageMaker restores the checkpoints to every instance).
        """
        loaded = checkpoint.load_latest(self.paths.checkpoints, say) if self.info.is_main else None
        if loaded is None and self.resume_dir is not None and self.info.is_main:
            # the run this one continues (checkpoints.resume_from): its checkpoint, brought by the resume channel
            loaded = checkpoint.load_latest(self.resume_dir, say)
            if loaded is not None:
                say(f"continuing run {loaded.payload.get('run')} from {loaded.path.name}")
        refusal = None
        if loaded is not None:
            why = checkpoint.foreign(loaded.payload, self.run_id, self.resume_from)
            if why:
                refusal = f"{loaded.path} will not be continued: {why}"
            elif loaded.payload["model_config"] != self.config.to_dict():
                refusal = (
                    f"the newest checkpoint in {loaded.path.parent} holds {loaded.payload['model_config']}, another "
                    f"model than this run's {self.config.to_dict()}: use another checkpoint_dir or the same model "
                    "hyperparameters")
        # -1 tells every rank that rank 0 refuses the checkpoint, so none waits for a broadcast that never comes.
        step = distributed.broadcast_int(-1 if refusal else loaded.step if loaded else 0, self.info)
        if step < 0:
            raise checkpoint.CheckpointMismatch(refusal or "rank 0 refused the newest checkpoint (see its log)")
        if step == 0:
            return 0, 0
        payload: dict[str, Any] = {}
        if loaded is not None:
            payload = loaded.payload
        elif not self.fsdp:
            own = checkpoint.checkpoint_path(self.paths.checkpoints, step).exists()
            source = self.paths.checkpoints if own or self.resume_dir is None else self.resume_dir
            try:
                payload = checkpoint.load_step(source, step)
            except FileNotFoundError as exc:
                raise checkpoint.CheckpointMismatch(
                    f"rank {self.info.rank} on host {self.hosts.current}: rank 0 resumes from step {step} but "
                    f"{exc.filename} is missing here; every host needs the same checkpoint_dir contents"
                ) from exc
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            # Two calls, not set_state_dict: given an empty model state (every rank but 0), that one
            # skips the model and the ranks' broadcasts no longer pair up (seen as a hang on torch 2.13).
            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            set_model_state_dict(self.model, payload.get("model", {}), options=options)
            set_optimizer_state_dict(self.model, self.optimizer, payload.get("optimizer", {}), options=options)
        else:
            self.model.load_state_dict(payload["model"])
            self.optimizer.load_state_dict(
                checkpoint.optimizer_state_by_id(self.model, self.optimizer, payload["optimizer"]))
        if loaded is not None:
            say(f"resumed from {loaded.path.name} at step {step}")
        self.saved_step = step
        return step, distributed.broadcast_int(int(payload.get("tokens_seen", 0)), self.info)

    def write_model(self, step: int, metrics: dict[str, float]) -> None:
        model_state, _ = self._state()
        if not self.writes:
            return
        self.paths.model.mkdir(parents=True, exist_ok=True)
        checkpoint.save_atomic(model_state, self.paths.model / MODEL_FILE)
        config = {"model": self.config.to_dict(), "tokenizer": TOKENIZER_INFO, "trained_steps": step,
                  "metrics": metrics, "hyperparameters": self.hp.to_dict()}
        _write_json(self.paths.model / CONFIG_FILE, config)
        say(f"model written to {self.paths.model / MODEL_FILE} with {CONFIG_FILE}")

    # -- loop ----------------------------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.bf16:
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @torch.no_grad()
    def evaluate(self) -> float:
        assert self.val_plan is not None
        self.model.eval()
        total = torch.zeros((), device=self.info.device)
        batches = min(self.hp.eval_batches, self.val_plan.per_rank)
        for k in range(batches):
            shard, offset = self.val_plan.location(k)
            batch = Batch(k, shard, offset, self.val_reader.read(shard, offset, self.val_plan.batch_tokens))
            x, y = batch.inputs_targets(self.info.device, self.hp.batch_size, self.hp.seq_len)
            with self._autocast():
                total += self.step_module(x, y).float()
        self.model.train()
        return float(distributed.all_reduce(total / batches, self.info).item())

    def _stop_agreed(self, stop: StopRequest) -> bool:
        """Whether any rank was asked to stop: all must leave the loop at the same step."""
        if not self.info.active:
            return stop.signal is not None
        flag = torch.tensor([1.0 if stop.signal else 0.0], device=self.info.device)
        return bool(distributed.all_reduce(flag, self.info, op="max").item() > 0)

    def train_step(self, step: int, lr: float, next_batch: Callable[[], Batch]) -> torch.Tensor:
        """One optimizer step over grad_accum micro-batches; returns this rank's loss (detached, no sync)."""
        hp = self.hp
        if hp.dropout:
            # Dropout masks depend on (seed, rank, step) alone, so a resumed run draws the same ones.
            torch.manual_seed(hp.seed * 1_000_003 + self.info.rank * 10_007 + step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device=self.info.device)
        no_sync = getattr(self.step_module, "no_sync", None)
        for micro in range(hp.grad_accum):
            x, y = next_batch().inputs_targets(self.info.device, hp.batch_size, hp.seq_len)
            # DDP all-reduces gradients only on the last micro-batch of the step.
            last = micro == hp.grad_accum - 1
            with (no_sync() if no_sync and not last else contextlib.nullcontext()), self._autocast():
                loss = self.step_module(x, y) / hp.grad_accum
            loss.backward()
            total += loss.detach()
        if hp.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), hp.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total

    def run(self, stop: StopRequest) -> Outcome:
        hp, info = self.hp, self.info
        start, tokens_seen = self.restore()
        resumed_from = start or None
        if info.is_main:
            # where this attempt starts: with the `step` metric's last value, how far a failed attempt got
            print(format_line(start, {"resumed_from": start}), flush=True)
        if start >= hp.max_steps:
            self.log(f"checkpoint step {start} already reaches max_steps {hp.max_steps}: nothing to train")
            self.write_model(start, {})
            return Outcome("completed", start, resumed_from, {}, tokens_seen)
        # DDP is wrapped after the restore so its first broadcast carries the restored weights.
        if info.active and not self.fsdp:
            self.step_module = distributed.wrap(self.model, info, False, self.bf16)
        tokens_per_step = hp.batch_size * hp.seq_len * hp.grad_accum * info.world_size
        prefetch = Prefetcher(self.train_plan, self.train_reader, start * hp.grad_accum, hp.prefetch,
                              pin=info.device.type == "cuda")
        trace = _open_trace(info.rank)

        def next_batch() -> Batch:
            batch = prefetch.next()
            if trace:
                trace.write(f"{batch.number} {batch.shard} {batch.offset}\n")
            return batch

        metrics: dict[str, float] = {}
        loss_sum = torch.zeros((), device=info.device)
        window_steps, window_start = 0, time.perf_counter()
        step, status = start, "completed"
        self.model.train()
        try:
            while step < hp.max_steps:
                if self._stop_agreed(stop):
                    status = "interrupted"
                    break
                step += 1
                lr = lr_at(step, hp)
                loss_sum += self.train_step(step, lr, next_batch)
                tokens_seen += tokens_per_step
                window_steps += 1

                values: dict[str, float] = {}
                if step % hp.log_interval == 0 or step == hp.max_steps:
                    elapsed = time.perf_counter() - window_start
                    values["train_loss"] = float(distributed.all_reduce(loss_sum / window_steps, info).item())
                    values["tokens_per_s"] = tokens_per_step * window_steps / max(elapsed, 1e-9)
                    values["lr"] = lr
                    loss_sum.zero_()
                    window_steps, window_start = 0, time.perf_counter()
                if self.val_plan and (step % hp.eval_interval == 0 or step == hp.max_steps):
                    values["val_loss"] = self.evaluate()
                if values:
                    metrics.update(values)
                    if info.is_main:
                        print(format_line(step, values), flush=True)
                if step % hp.checkpoint_interval == 0:
                    self.save_checkpoint(step, tokens_seen, "interval")
        finally:
            prefetch.close()
            if trace:
                trace.close()
        self.save_checkpoint(step, tokens_seen, "stop requested by " + str(stop.signal)
                             if status == "interrupted" else "end of training")
        if status == "completed":
            self.write_model(step, metrics)
        return Outcome(status, step, resumed_from, metrics, tokens_seen)


def _open_trace(rank: int) -> TextIO | None:
    """Where each batch this rank reads is recorded, when LUSTRAIN_DATA_TRACE names a directory (debugging)."""
    directory = os.environ.get(DATA_TRACE_ENV)
    if not directory:
        return None
    Path(directory).mkdir(parents=True, exist_ok=True)
    return open(Path(directory) / f"rank-{rank}.txt", "a", buffering=1)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    env = dict(os.environ)
    started = time.monotonic()
    try:
        hp, given, warnings = parse(argv, env)
        paths = resolve_paths(given, env, warnings)
        hosts = read_hosts(env)
        index = read_index(paths.data)
    except (HyperparameterError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        info = distributed.init()
    except Exception as exc:
        kind = faults.kind_of(exc)
        if kind is None:
            raise
        return faults.report(kind, exc)
    shut_down = True
    try:
        stop = StopRequest()
        with stop.installed():
            if info.is_main:
                for warning in warnings:
                    say(f"warning: {warning}")
            try:
                check = faults.preflight(info)
            except Exception as exc:
                shut_down = False  # a collective that failed may hang the process group's teardown
                return faults.report(faults.kind_of(exc) or "preflight", exc)
            if info.is_main:
                say(check.line())
            try:
                trainer = Trainer(hp, paths, info, hosts, index)
            except (HyperparameterError, DataError) as exc:
                print(f"error: {exc}", file=sys.stderr, flush=True)
                return 2
            trainer.log(
                f"preset {hp.preset}: {trainer.parameters:,} parameters, {hp.n_layer} layers, {hp.n_embd} wide; "
                f"{info.world_size} rank(s) on {info.device.type}, fsdp {trainer.fsdp}, "
                f"{'bf16' if trainer.bf16 else 'fp32'}; host {hosts.current} of {len(hosts.hosts) or 1}; "
                f"data {paths.data} ({index.tokens('train'):,} train tokens); "
                f"checkpoints {paths.checkpoints}"
            )
            try:
                outcome = trainer.run(stop)
            except checkpoint.CheckpointMismatch as exc:
                print(f"error: {exc}", file=sys.stderr, flush=True)
                return 2
            except Exception as exc:
                kind = faults.kind_of(exc)
                if kind is None:
                    raise  # the code's own error: its traceback is the job's FailureReason
                shut_down = False
                return faults.report(kind, exc)
        if trainer.writes:
            summary = {"status": outcome.status, "step": outcome.step, "max_steps": hp.max_steps,
                       "resumed_from_step": outcome.resumed_from, "tokens_seen": outcome.tokens_seen,
                       "metrics": outcome.metrics, "parameters": trainer.parameters, "preset": hp.preset,
                       "world_size": info.world_size, "host": hosts.current,
                       "elapsed_s": round(time.monotonic() - started, 3), "hyperparameters": hp.to_dict()}
            _write_json(paths.output / SUMMARY_FILE, summary)
            say(f"{outcome.status} at step {outcome.step} of {hp.max_steps}; summary in {paths.output / SUMMARY_FILE}")
        return 0
    finally:
        if shut_down:
            distributed.shutdown(info)
