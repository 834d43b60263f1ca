"""The training run: SageMaker's contract in, a trained model, checkpoints and a summary out.

    python train.py --data DIR [--preset tiny] [--max_steps 300] ...      (one process)
    python -m torch.distributed.run --nproc_per_node N train.py ...        (DDP or FSDP)

On the run's stop request (the stack's cancel, a teardown), a signal where one arrives, or Ctrl-C every rank
finishes its step, a checkpoint is saved and the process exits 0; at the run's deadline (MaxRuntimeInSeconds less
the time to save, a training plan's end) the same save is made, then the trainer waits for SageMaker's stop
(stopping.py says why). The next start resumes from the newest good checkpoint.

Exit codes: 0 trained (or stopped with a checkpoint), 2 the run's own input is wrong (hyperparameters, data, a
checkpoint of another model), faults.INFRASTRUCTURE_EXIT_CODE (75) the machine under it failed (NCCL, EFA, CUDA,
ECC, a lost rank, a failed pre-flight: see faults.py), any other the code's own error (a traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import nn

from . import checkpoint, distributed, faults, plan, shards, stopping
from . import tokenizer as tok
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
from .metrics import TENSORBOARD_DIR_ENV, Board, evaluation, final_summary, format_line, split_bytes
from .model import (
    CONFIG_FILE,
    MODEL_FILE,
    CausalLM,
    ModelConfig,
    build,
    config_from_dict,
    init_weights,
    local_part,
)
from .shards import DataError, DataIndex, read_index
from .stopping import StopRequest

DATA_TRACE_ENV = "LUSTRAIN_DATA_TRACE"
#: SageMaker names the training job in its container's environment (the same name across a spot job's tries)
JOB_NAME_ENV = "TRAINING_JOB_NAME"
#: SageMaker's directory of the "resume" channel: the checkpoint of the run this one continues
RESUME_CHANNEL_ENV = "SM_CHANNEL_RESUME"
SUMMARY_FILE = "summary.json"


def say(message: str) -> None:
    """Information for people; metric lines go through format_line so the MetricDefinitions see only them."""
    print(f"lustrain: {message}", flush=True)


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


def build_model(hp: Hyperparameters, info: Dist, fsdp: bool, shard_group: int, bf16: bool,
                config: ModelConfig | None = None) -> CausalLM:
    """The model as this rank trains it: built on `meta` (no memory), sharded there when FSDP is on, then only this
    rank's part materialised on its device and initialised (init_weights: the same weights for the same seed,
    whatever the world size). No rank ever holds the whole model unless it trains the whole model (DDP)."""
    model = build_model_on_meta(hp, info, fsdp, shard_group, bf16, config)
    model.to_empty(device=info.device)
    if not fsdp:
        model.tie_weights()
    init_weights(model, hp.seed)
    return model


def layout(hp: Hyperparameters, info: Dist, bf16: bool, vocab_size: int | None = None) -> tuple[bool, int]:
    """(fsdp, shard group) for this world: what was asked, else what the memory plan says fits this GPU."""
    if not info.active:
        return False, 1
    if hp.shard_group:
        if hp.fsdp == "false":
            raise HyperparameterError("hyperparameter shard_group: sharding needs fsdp true or auto, not false")
        if info.world_size % hp.shard_group:
            raise HyperparameterError(
                f"hyperparameter shard_group: {hp.shard_group} does not divide the world size {info.world_size}")
        return True, hp.shard_group
    if hp.fsdp == "false":
        return False, 1
    if info.device.type != "cuda":
        return (True, info.world_size) if hp.fsdp == "true" else (False, 1)
    props = torch.cuda.get_device_properties(info.device)
    # the plan of this very GPU; its checkpoint times (from the rates) are not what is asked here
    hardware = plan.Hardware(gpus=distributed.gpus_per_host(info), gpu_bytes=props.total_memory, host_bytes=0,
                             write_gbps=1.0, stage_gbps=1.0)
    shard = plan.choose_shard(hp.plan_shape(vocab_size), batch_size=hp.batch_size,
                              activation_checkpointing=hp.activation_checkpointing, world_size=info.world_size,
                              bf16=bf16, hardware=hardware, allow_ddp=hp.fsdp == "auto")
    return shard > 1 or hp.fsdp == "true", shard


class Trainer:
    def __init__(self, hp: Hyperparameters, paths: RunPaths, info: Dist, hosts: Hosts, index: DataIndex) -> None:
        self.hp, self.paths, self.info, self.hosts, self.index = hp, paths, info, hosts, index
        # the run lustrain started this job for, the run it may continue, and that run's checkpoint (if any)
        self.run_id = os.environ.get(checkpoint.RUN_ID_ENV) or None
        self.resume_from = os.environ.get(checkpoint.RESUME_FROM_ENV) or None
        resume_dir = os.environ.get(RESUME_CHANNEL_ENV)
        self.resume_dir = Path(resume_dir) if resume_dir else None
        # With distribution none on several hosts each host trains alone; only the first one writes.
        self.writes = info.is_main and (info.active or hosts.is_first)
        # the model's vocabulary is the data's: its tokenizer, recorded with the model and its checkpoints
        self.tokenizer_info = index.tokenizer
        self.config = data_model_config(hp, self.tokenizer_info)
        self.bf16 = hp.precision == "bf16" or (
            hp.precision == "auto" and info.device.type == "cuda" and torch.cuda.is_bf16_supported())
        if hp.precision == "bf16" and info.device.type != "cuda":
            raise HyperparameterError("hyperparameter precision: bf16 needs a GPU (use auto or fp32 on CPU)")

        if info.device.type == "cpu" and hp.cpu_threads:
            torch.set_num_threads(hp.cpu_threads)
        torch.manual_seed(hp.seed)
        self.fsdp, self.shard_group = layout(hp, info, self.bf16, self.config.vocab_size)
        self.model = build_model(hp, info, self.fsdp, self.shard_group, self.bf16, self.config)
        self.parameters = self.config.parameter_count()
        self.step_module: nn.Module = self.model
        self.optimizer = make_optimizer(self.model, hp, info.device, sharded=self.fsdp)
        # micro-batches of the whole world per optimizer step: a resumed run keeps it, whatever its world size
        self.grad_accum = hp.grad_accum
        self.checkpointer = checkpoint.Checkpointer(paths.checkpoints, info.rank, info.world_size,
                                                    hp.keep_checkpoints, say)
        # this process's saves go to directories of their own: a save cut short by a crash is never mixed up with
        # the same step saved again by the next attempt
        self.save_id = f"{distributed.broadcast_int(int.from_bytes(os.urandom(4), 'little'), info):08x}"
        # the instance type's catalogue row where SageMaker names it, else the GPU's own name
        self.peak_tflops = (plan.peak_tflops(torch.cuda.get_device_name(info.device),
                                             os.environ.get("SM_CURRENT_INSTANCE_TYPE"))
                            if info.device.type == "cuda" else None)
        self.val_plan: BatchPlan | None = None
        if hp.eval_interval and index.splits.get("val"):
            try:
                self.val_plan = BatchPlan([s.tokens for s in index.splits["val"]], hp.batch_size, hp.seq_len,
                                          info.rank, info.world_size, hp.seed, shuffle=False, split="val",
                                          token_bytes=index.token_bytes)
            except DataError as exc:
                self.log(f"validation off: {exc}")
            self.val_reader = ShardReader(index, "val")
        # the val split's (tokens, source bytes): what turns a loss per token into bits per byte
        self.val_split = split_bytes(index, "val")
        if self.val_plan and self.val_split is None:
            self.log("validation bits per byte off: the data's index gives no source bytes for its val split")
        self.evaluated_at: int | None = None
        self.saved_step = -1
        #: when the last checkpoint began (monotonic), for checkpoint_every_minutes
        self.last_save_started = time.monotonic()
        #: this process's start (seconds since the epoch), and what earlier tries of the same job had run before it
        self.process_started = time.time()
        self.job_seconds_before = 0.0
        # TensorBoard's scalars from the writing rank (metrics.Board); the gradients' norm is measured at each
        # logged step on every rank (under FSDP it is a collective), whoever writes it
        self.board = Board.open(os.environ.get(TENSORBOARD_DIR_ENV), self.writes, say)
        self.grad_norm: torch.Tensor | None = None

    def log(self, message: str) -> None:
        if self.info.is_main:
            say(message)

    @property
    def global_micro_batches(self) -> int:
        return self.grad_accum * self.info.world_size

    def train_plan(self) -> BatchPlan:
        return BatchPlan([s.tokens for s in self.index.splits["train"]], self.hp.batch_size, self.hp.seq_len,
                         self.info.rank, self.info.world_size, self.hp.seed, grad_accum=self.grad_accum,
                         split="train", token_bytes=self.index.token_bytes)

    # -- state ---------------------------------------------------------------------------------------

    def _model_state(self) -> dict[str, Any]:
        """The whole model's weights on CPU (no optimizer state), for rank 0 to write the trained model. Under FSDP
        every rank must call this: the shards are gathered onto rank 0, a tensor at a time."""
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.writes:
            return {}
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}

    def _sharded_state(self) -> dict[str, Any]:
        """Model and optimizer state as this rank holds it (its shards under FSDP), keyed by parameter name: what
        every rank saves, and loads into, whatever the world size or sharding that wrote it."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optimizer": optimizer_state}

    def save_checkpoint(self, step: int, tokens_seen: int, reason: str, blocking: bool = False) -> float:
        """Start a sharded checkpoint of step `step` (every rank); the seconds training was blocked. With blocking,
        returns once it is committed (the end of training, a stop)."""
        if step == self.saved_step:
            if blocking:
                self.checkpointer.wait()
            return 0.0
        manifest = {"run": self.run_id, "model_config": self.config.to_dict(), "shape": shape_of(self.hp),
                    "tokens_seen": tokens_seen, "global_micro_batches": self.global_micro_batches,
                    "world_size": self.info.world_size, "hyperparameters": self.hp.to_dict(),
                    "tokenizer": self.tokenizer_info,
                    # the SageMaker job and how long it has run by now: a restart of the same job in place (spot)
                    # counts it against the job's MaxRuntimeInSeconds, which covers every try
                    "job": os.environ.get(JOB_NAME_ENV), "job_seconds": round(self.job_seconds(), 1)}
        self.last_save_started = time.monotonic()
        blocked = self.checkpointer.save(step, self._sharded_state(), manifest, self.save_id, reason, blocking)
        self.saved_step = step
        return blocked

    def _choose_checkpoint(self) -> tuple[dict[str, Any] | None, checkpoint.Loaded | None]:
        """Rank 0's choice of the checkpoint to resume from, as every rank needs it (no tensors), or a refusal."""
        loaded = checkpoint.load_latest(self.paths.checkpoints, say)
        if loaded is None and self.resume_dir is not None:
            # the run this one continues (checkpoints.resume_from): its checkpoint, brought by the resume channel
            loaded = checkpoint.load_latest(self.resume_dir, say)
            if loaded is not None:
                say(f"continuing run {loaded.payload.get('run')} from {loaded.path.name}")
        if loaded is None:
            return {"step": 0}, None
        why = checkpoint.foreign(loaded.payload, self.run_id, self.resume_from)
        if why:
            return {"refusal": f"{loaded.path} will not be continued: {why}"}, loaded
        refusal = tokenizer_refusal(loaded, self.tokenizer_info, self.paths.data)
        if refusal:
            return {"refusal": refusal}, loaded
        if _as_config_dict(loaded.payload["model_config"]) != self.config.to_dict():
            held = dict(sorted(loaded.payload["model_config"].items(),
                               key=lambda kv: list(self.config.to_dict()).index(kv[0])
                               if kv[0] in self.config.to_dict() else len(kv[0])))
            return {"refusal": (
                f"the newest checkpoint in {loaded.path.parent} holds {held}, another "
                f"model than this run's {self.config.to_dict()}: use another checkpoint_dir or the same model "
                "hyperparameters")}, loaded
        micro = loaded.payload.get("global_micro_batches")
        if micro and micro % self.info.world_size:
            return {"refusal": (
                f"{loaded.path.name} was trained with a global batch of {micro} micro-batches, which "
                f"{self.info.world_size} ranks cannot share evenly: resume on a world size that divides {micro}, "
                "or start a new run to change the global batch (batch_size, grad_accum)")}, loaded
        return {"step": loaded.step, "sharded": loaded.sharded, "path": str(loaded.path),
                "directory": loaded.path.parent == self.paths.checkpoints,
                "tokens_seen": int(loaded.payload.get("tokens_seen", 0)), "global_micro_batches": micro,
                # how long this very training job had run at that save (an earlier try of it: a spot restart)
                "job_seconds": float(loaded.payload.get("job_seconds") or 0.0)
                if loaded.payload.get("job") and loaded.payload.get("job") == os.environ.get(JOB_NAME_ENV) else 0.0,
                }, loaded

    def restore(self) -> tuple[int, int]:
        """Load the newest good checkpoint, as rank 0 chooses it: (step, tokens_seen), (0, 0) if none.

        A sharded checkpoint is loaded by every rank, each reading the parts of the shards it now holds (any world
        size, any sharding); a version 1 file is read by rank 0 and broadcast under FSDP, or read by every rank
        from its own checkpoint directory otherwise (SageMaker restores the checkpoints to every instance).
        """
        choice, loaded = self._choose_checkpoint() if self.info.is_main else (None, None)
        choice = distributed.broadcast_object(choice, self.info)
        assert choice is not None
        if "refusal" in choice:
            raise checkpoint.CheckpointMismatch(choice["refusal"])
        step = int(choice["step"])
        if step == 0:
            return 0, 0
        micro = choice.get("global_micro_batches")
        if micro and micro != self.global_micro_batches:
            self.grad_accum = micro // self.info.world_size
            self.log(f"the checkpoint's global batch is {micro} micro-batches: grad_accum {self.grad_accum} on "
                     f"{self.info.world_size} rank(s) keeps it, and the data position with it")
        if choice["sharded"]:
            self._load_sharded(Path(choice["path"]))
        else:
            self._load_full(step, loaded, bool(choice["directory"]))
        self.log(f"resumed from {Path(choice['path']).name} at step {step}")
        self.job_seconds_before = float(choice.get("job_seconds") or 0.0)
        self.saved_step = step
        self.checkpointer.committed_step = step
        return step, int(choice["tokens_seen"])

    def _load_sharded(self, path: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._sharded_state()
        reader = checkpoint.counting_reader(path)
        dcp.load(state, storage_reader=reader)
        read = reader.bytes_read
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        # what a restart reads: each rank only the parts of the shards it holds (DCP reads by offset), so on the
        # same mesh its own file; the busiest rank's bytes of the checkpoint's files over its own shards'
        own = sum(p.stat().st_size for p in path.glob(f"__{self.info.rank}_*.distcp"))
        ratio = read / own if own else -1.0
        worst = distributed.all_reduce(torch.tensor([ratio, float(read)], device=self.info.device), self.info,
                                       op="max").tolist() if self.info.active else [ratio, float(read)]
        if worst[0] >= 0:
            self.log(f"checkpoint read {worst[1] / 1e6:,.1f} MB on the busiest rank: resume_read_ratio "
                     f"{worst[0]:.3f} of a rank's own shards")

    def _load_full(self, step: int, loaded: checkpoint.Loaded | None, own: bool) -> None:
        """A version 1 checkpoint: the whole state in one file."""
        payload: dict[str, Any] = loaded.payload if loaded is not None else {}
        if loaded is None and not self.fsdp:
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

    def write_model(self, step: int, metrics: dict[str, float]) -> None:
        model_state = self._model_state()
        if not self.writes:
            return
        self.paths.model.mkdir(parents=True, exist_ok=True)
        checkpoint.save_atomic(model_state, self.paths.model / MODEL_FILE)
        config = {"model": self.config.to_dict(), "tokenizer": self.tokenizer_info, "trained_steps": step,
                  "metrics": metrics, "hyperparameters": self.hp.to_dict()}
        copy_tokenizer_file(self.index, self.paths.model)
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

    def job_seconds(self) -> float:
        """How long this SageMaker job has run so far, over its tries (as far as its checkpoints tell)."""
        return self.job_seconds_before + time.time() - self.process_started

    def _agreed(self, stop: StopRequest, save_due: bool) -> tuple[int, bool]:
        """Why the loop ends, if it does (stopping.NONE, REQUESTED, DEADLINE), and whether a checkpoint is due by
        time, as every rank must see them: all leave the loop, and all save, at the same step. One all-reduce."""
        code = stop.code()
        if not self.info.active:
            return code, save_due
        flags = torch.tensor([float(code), 1.0 if save_due else 0.0], device=self.info.device)
        agreed = distributed.all_reduce(flags, self.info, op="max").tolist()
        return int(agreed[0]), bool(agreed[1])

    def _save_due_by_time(self) -> bool:
        """checkpoint_every_minutes since the last save began (0: by steps only)."""
        every_s = 60.0 * self.hp.checkpoint_every_minutes
        return every_s > 0 and time.monotonic() - self.last_save_started >= every_s

    def train_step(self, step: int, lr: float, next_batch: Callable[[], Batch], measure: bool = False) -> torch.Tensor:
        """One optimizer step over grad_accum micro-batches; returns this rank's loss (detached, no sync). The
        gradients' norm before the step is kept in self.grad_norm where they are clipped, or `measure` asks."""
        hp = self.hp
        if hp.dropout:
            # Dropout masks depend on (seed, rank, step) alone, so a resumed run draws the same ones.
            torch.manual_seed(hp.seed * 1_000_003 + self.info.rank * 10_007 + step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device=self.info.device)
        no_sync = getattr(self.step_module, "no_sync", None)
        for micro in range(self.grad_accum):
            x, y = next_batch().inputs_targets(self.info.device, hp.batch_size, hp.seq_len)
            # DDP all-reduces gradients only on the last micro-batch of the step.
            last = micro == self.grad_accum - 1
            with (no_sync() if no_sync and not last else contextlib.nullcontext()), self._autocast():
                loss = self.step_module(x, y) / self.grad_accum
            loss.backward()
            total += loss.detach()
        self.grad_norm = None
        if hp.grad_clip:
            self.grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), hp.grad_clip)
        elif measure:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            self.grad_norm = torch.nn.utils.get_total_norm(grads) if grads else None
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total

    def run(self, stop: StopRequest) -> Outcome:
        hp, info = self.hp, self.info
        self.process_started = stop.started
        start, tokens_seen = self.restore()
        resumed_from = start or None
        stop.spent_before(self.job_seconds_before)
        if stop.deadline is not None:
            self.log(f"deadline: {stop.describe_deadline()}")
        if info.is_main:
            # where this attempt starts: with the `step` metric's last value, how far a failed attempt got
            print(format_line(start, {"resumed_from": start}), flush=True)
        if start >= hp.max_steps:
            self.log(f"checkpoint step {start} already reaches max_steps {hp.max_steps}: nothing to train")
            self.write_model(start, {})
            return Outcome("completed", start, resumed_from, {}, tokens_seen)
        # DDP is wrapped after the restore so its first broadcast carries the restored weights.
        if info.active and not self.fsdp:
            self.step_module = distributed.wrap(self.model, info)
        tokens_per_step = hp.batch_size * hp.seq_len * self.global_micro_batches
        flops_per_token = hp.plan_shape(self.config.vocab_size).flops_per_token()
        # this rank's micro-batches are numbered step * grad_accum + micro: the plan maps them to the data
        prefetch = Prefetcher(self.train_plan(), ShardReader(self.index, "train"), start * self.grad_accum,
                              hp.prefetch, pin=info.device.type == "cuda")
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
        stopped_by, save_due = stopping.NONE, False
        self.model.train()
        try:
            while step < hp.max_steps:
                stopped_by, save_due = self._agreed(stop, self._save_due_by_time())
                if stopped_by != stopping.NONE:
                    status = "deadline" if stopped_by == stopping.DEADLINE else "interrupted"
                    break
                if save_due and step > start:
                    values = {"ckpt_blocking_s": self.save_checkpoint(step, tokens_seen, "interval (time)")}
                    if info.is_main:
                        print(format_line(step, values), flush=True)
                step += 1
                lr = lr_at(step, hp)
                logged = step % hp.log_interval == 0 or step == hp.max_steps
                loss_sum += self.train_step(step, lr, next_batch, measure=logged)
                tokens_seen += tokens_per_step
                window_steps += 1

                values: dict[str, float] = {}
                board: dict[str, float] = {}
                if logged:
                    elapsed = time.perf_counter() - window_start
                    values["train_loss"] = float(distributed.all_reduce(loss_sum / window_steps, info).item())
                    values["tokens_per_s"] = tokens_per_step * window_steps / max(elapsed, 1e-9)
                    values["tokens_per_s_per_gpu"] = values["tokens_per_s"] / info.world_size
                    if self.peak_tflops:
                        # model FLOPs utilisation: the model's training FLOPs per second over the GPUs' bf16 peak
                        values["mfu"] = values["tokens_per_s_per_gpu"] * flops_per_token / (self.peak_tflops * 1e12)
                    values["lr"] = lr
                    if self.grad_norm is not None:
                        board["grad_norm"] = _as_float(self.grad_norm)
                    loss_sum.zero_()
                    window_steps, window_start = 0, time.perf_counter()
                if self.val_plan and (step % hp.eval_interval == 0 or step == hp.max_steps):
                    values.update(evaluation(self.evaluate(), self.val_split))
                    self.evaluated_at = step
                if values:
                    values["tokens_seen"] = tokens_seen
                    metrics.update(values)
                    if info.is_main:
                        print(format_line(step, values), flush=True)
                    self.board.write(step, {**values, **board})
                if step % hp.checkpoint_interval == 0:
                    values = {"ckpt_blocking_s": self.save_checkpoint(step, tokens_seen, "interval")}
                    if info.is_main:
                        print(format_line(step, values), flush=True)
                else:
                    self.checkpointer.poll()  # commit the checkpoint in flight once it is written
        finally:
            prefetch.close()
            self.board.close()
            if trace:
                trace.close()
        # Blocking: the process ends after this, and a stop must end in a committed checkpoint (the write in
        # flight, if any, finishes first).
        self.save_checkpoint(step, tokens_seen, "end of training" if status == "completed"
                             else stop.describe(stopped_by), blocking=True)
        if status == "completed":
            self.write_model(step, metrics)
        return Outcome(status, step, resumed_from, metrics, tokens_seen)


def _as_float(norm: torch.Tensor) -> float:
    """A norm as a number; a sharded model's (FSDP's DTensor) is gathered first, on every rank alike."""
    full = getattr(norm, "full_tensor", None)
    return float((full() if full is not None else norm).item())


def data_model_config(hp: Hyperparameters, tokenizer_info: dict[str, Any]) -> ModelConfig:
    """The model the hyperparameters describe, with the vocabulary of the data's tokenizer."""
    return hp.model_config(vocab_size=int(tokenizer_info["vocab_size"]))


def tokenizer_refusal(loaded: checkpoint.Loaded, data_tokenizer: dict[str, Any], data: Path) -> str | None:
    """Why a checkpoint is not continued on this data: its model reads another tokenizer's ids (a manifest of
    before tokenizers were recorded holds the byte tokenizer's)."""
    held = loaded.payload.get("tokenizer")
    if tok.same_tokenizer(held, data_tokenizer):
        return None
    return (f"the newest checkpoint in {loaded.path.parent} is a model of tokenizer {tok.describe(held)}, but the "
            f"data {data} is tokenized with {tok.describe(data_tokenizer)}: prepare the data with the model's "
            "tokenizer (its tokenizer.json with --tokenizer PATH), or start a new model in another checkpoint_dir")


def copy_tokenizer_file(index: DataIndex, model_dir: Path) -> None:
    """The data's tokenizer.json into the model directory, so that generate and export decode with it."""
    name = index.tokenizer.get("file")
    target = model_dir / tok.TOKENIZER_FILE
    if not name:
        target.unlink(missing_ok=True)
        return
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.copyfile(index.root / str(name), tmp)
    os.replace(tmp, target)


def _as_config_dict(held: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's model config as this trainer writes it now (one saved before `arch` existed is a GPT's);
    as it is where it is no config this trainer reads (the comparison then names it)."""
    try:
        return config_from_dict(held).to_dict()
    except (TypeError, ValueError):
        return held


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


def _planning_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--dry_run", "--dry-run", action="store_true")
    parser.add_argument("--world_size", "--world-size", type=int, default=None)
    parser.add_argument("--instance_type", "--instance-type", default=None)
    return parser.parse_known_args(argv)


def dry_run(hp: Hyperparameters, world_size: int | None, instance_type: str | None, env: dict[str, str]) -> int:
    """The memory plan of this run, as key=value lines, without training or allocating the model: built on `meta`
    and, under torchrun, sharded there exactly as the run would shard it (its per-rank parameter bytes are
    printed beside the plan's); --world_size N plans a world this machine does not have."""
    instance_type = instance_type or env.get("SM_CURRENT_INSTANCE_TYPE") or plan.DEFAULT_INSTANCE
    if instance_type not in plan.INSTANCES:
        print(f"error: --instance_type {instance_type!r} is not one the plan knows (use "
              f"{' | '.join(plan.INSTANCES)})", file=sys.stderr)
        return 2
    if world_size is not None and world_size < 1:
        print(f"error: --world_size {world_size} is not allowed (use a number of ranks, 1 or more)", file=sys.stderr)
        return 2
    launched = int(env.get("WORLD_SIZE", "1"))
    world = world_size or launched
    bf16 = hp.precision != "fp32"
    fsdp = {"auto": None, "true": True, "false": False}[hp.fsdp]
    try:
        layout_plan = plan.plan(hp.plan_shape(), batch_size=hp.batch_size, world_size=world, bf16=bf16, fsdp=fsdp,
                                activation_checkpointing=hp.activation_checkpointing, shard=hp.shard_group,
                                instance_type=instance_type)
    except ValueError as exc:
        print(f"error: hyperparameter shard_group: {exc}", file=sys.stderr)
        return 2
    lines = [f"preset={hp.preset}", *layout_plan.lines()]
    if launched > 1 and world == launched:
        # the model as the run builds it, on meta: what this rank would hold, counted, not allocated
        info = distributed.init(timeout_s=hp.collective_timeout_s)
        try:
            model = build_model_on_meta(hp, info, layout_plan.fsdp, layout_plan.shard, bf16,
                                        hp.model_config(hp.plan_shape().vocab_size))
            held = sum(local_numel(p) for p in model.parameters())
            lines.append(f"measured_parameter_gib_per_rank={4 * held / plan.GIB:.2f}")
        finally:
            distributed.shutdown(info)
        if info.rank:
            return 0
    lines.append(f"peak_rss_mb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")
    for line in lines:
        print(line, flush=True)
    return 0


def build_model_on_meta(hp: Hyperparameters, info: Dist, fsdp: bool, shard_group: int, bf16: bool,
                        config: ModelConfig | None = None) -> CausalLM:
    with torch.device("meta"):
        model = build(config or hp.model_config(), activation_checkpointing=hp.activation_checkpointing)
    if fsdp:
        distributed.shard(model, info, bf16, shard_group)
    return model


def local_numel(p: torch.Tensor) -> int:
    local, _ = local_part(p)
    return local.numel()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    env = dict(os.environ)
    started = time.monotonic()
    started_at = time.time()  # the entry point's start: the runtime deadline counts from it (stopping.py)
    planning, argv = _planning_args(argv)
    if planning.dry_run:
        try:
            hp, _, warnings = parse(argv, env)
        except HyperparameterError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return 2
        return dry_run(hp, planning.world_size, planning.instance_type, env)
    try:
        hp, given, warnings = parse(argv, env)
        paths = resolve_paths(given, env, warnings)
        hosts = read_hosts(env)
        index = read_index(paths.data)
    except (HyperparameterError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    added = distributed.apply_network_defaults(os.environ)
    try:
        info = distributed.init(timeout_s=hp.collective_timeout_s)
    except Exception as exc:
        kind = faults.kind_of(exc)
        if kind is None:
            raise
        return faults.report(kind, exc)
    shut_down = True
    try:
        stop = StopRequest(say=say if info.is_main else None, started=started_at)
        # rank 0 reads the stop request; the loop's all-reduce tells the others
        with stop.installed(poll=info.rank == 0):
            if info.is_main:
                for warning in warnings:
                    say(f"warning: {warning}")
                if added:
                    say(f"network defaults for {os.environ.get('SM_CURRENT_INSTANCE_TYPE')}: "
                        + " ".join(f"{k}={v}" for k, v in sorted(added.items())))
            try:
                check = faults.preflight(info)
            except Exception as exc:
                shut_down = False  # a collective that failed may hang the process group's teardown
                return faults.report(faults.kind_of(exc) or "preflight", exc)
            if info.is_main:
                say(check.line())
            # every shard's size against the index, once, each rank its share: bad data ends the run now, on every
            # rank alike (an orderly exit), not hours in on the one rank that opens a cut shard
            try:
                found = shards.check_share(index, info.rank, info.world_size)
                bad = distributed.all_gather_lists(shards.share_report(found), info)
            except Exception as exc:
                shut_down = False  # a collective that failed may hang the process group's teardown
                return faults.report(faults.kind_of(exc) or "preflight", exc)
            if bad:
                if info.is_main:  # every rank knows; one says it
                    print(f"error: {shards.bad_shards_error(bad, index.shard_count)}", file=sys.stderr, flush=True)
                return 2
            try:
                trainer = Trainer(hp, paths, info, hosts, index)
            except (HyperparameterError, DataError) as exc:
                print(f"error: {exc}", file=sys.stderr, flush=True)
                return 2
            trainer.log(
                f"preset {hp.preset} ({hp.arch}): {trainer.parameters:,} parameters, {hp.n_layer} layers, {hp.n_embd} wide; "
                f"{info.world_size} rank(s) on {info.device.type}, fsdp {trainer.fsdp} (shard group {trainer.shard_group}), "
                f"{'bf16' if trainer.bf16 else 'fp32'}; host {hosts.current} of {len(hosts.hosts) or 1}; "
                f"data {paths.data} ({index.tokens('train'):,} train tokens, tokenizer "
                f"{tok.describe(index.tokenizer)}); "
                f"checkpoints {paths.checkpoints}"
            )
            try:
                outcome = trainer.run(stop)
            except checkpoint.CheckpointMismatch as exc:
                print(f"error: {exc}", file=sys.stderr, flush=True)
                return 2
            except DataError as exc:
                # a shard that is missing or shorter than the index says, found by the rank that opens it: the
                # data's fault, said in one line; the other ranks may wait in a collective, so no orderly teardown
                print(f"error: {exc}", file=sys.stderr, flush=True)
                shut_down = False
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
            summary["final"] = final_summary(outcome.metrics, outcome.step, outcome.tokens_seen,
                                             summary["elapsed_s"], trainer.evaluated_at)
            _write_json(paths.output / SUMMARY_FILE, summary)
            say(f"{outcome.status} at step {outcome.step} of {hp.max_steps}; summary in {paths.output / SUMMARY_FILE}")
        if outcome.status == "deadline":
            # the job must end Stopped (a budget spent, a run out of time), not Completed: SageMaker stops it
            trainer.log("checkpoint committed before the deadline; waiting for SageMaker to stop the job")
            stop.wait_for_sagemaker()
        return 0
    finally:
        if shut_down:
            distributed.shutdown(info)
