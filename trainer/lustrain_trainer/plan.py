"""The memory plan: what one rank holds to train a model, computed from its shape alone, before money is spent.

Pure Python (no torch): `train.py --dry_run` prints it, and lustrain's control plane (plan, validate,
register_job) computes the same numbers from a spec's hyperparameters when they name one of the trainer's
presets. Every figure is bytes, from the terms below; the model is never built.

The block is the GPT's or the Llama's (Shape.arch): grouped-query attention's narrower k and v, SwiGLU's three
matrices and an untied head are counted where they are. Per rank, training with AdamW (fp32 master weights, two
fp32 moments), sharded over a group of `shard` GPUs (FSDP; HSDP when the world holds several such groups, each a
replica) or whole on every GPU (DDP, shard 1):

- state: parameters 4P/shard, gradients 4P/shard, optimizer 8P/shard;
- working (FSDP): one block's parameters gathered, with the next one prefetched (2 x block x bytes per weight),
  and one block's unsharded gradients before their reduce-scatter (4 x block);
- activations at the micro-batch, with flash attention (no sequence-squared term): 34 x tokens x width bytes per
  layer in 16-bit precision (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models", 2022, section 4.1; the Llama block's, counted the same way, in Shape), twice that in fp32; with
  activation checkpointing each layer keeps only its input (2 x tokens x width) and one layer at a time is
  recomputed in full; plus the logits and their fp32 gradient;
- overhead: the CUDA context, NCCL's buffers and the caching allocator's fragmentation (GPU_OVERHEAD_BYTES).

A checkpoint holds the parameters and both moments (12P bytes); DCP writes each shard once (replicas
deduplicated), so a host writes 12P / hosts. Its blocking part is the copy of this rank's state to host memory;
the write goes on while training does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1 << 30
#: CUDA context (about 0.5 GiB on an A100), NCCL's communicators and buffers (about 1 GiB on 8 GPUs with EFA) and
#: the caching allocator's fragmentation: an estimate, not a measurement on this code
GPU_OVERHEAD_BYTES = 3 * GIB
ACTIVATION_BYTES_PER_TOKEN_WIDTH = 34
#: the share of a GPU's nominal memory a plan may fill: the driver keeps some (an A100 40 GB shows torch 39.4 GiB)
#: and a plan at the edge fails on the first long sequence
USABLE_GPU_SHARE = 0.92


@dataclass(frozen=True)
class Hardware:
    """An instance type as the plan needs it. Source: AWS's instance type pages (GPUs, their memory, host memory)."""

    gpus: int
    gpu_bytes: int
    host_bytes: int
    #: GB/s one host writes a checkpoint to its checkpoint directory (see WRITE_RATE_SOURCE)
    write_gbps: float
    #: GB/s one GPU copies its state to pinned host memory (the checkpoint's blocking part)
    stage_gbps: float


#: A host's write rate: AWS's "Amazon EC2 P4d instances deep dive" (AWS Compute Blog) measured the 8 local NVMe
#: drives in RAID 0 at 8.2 GiB/s of sequential writes (fio, 128 KiB blocks, 96 threads): 8 GB/s here. p5's
#: drives are taken to be no faster. The device-to-host copy (the blocking part) is an assumption until
#: bench/gpu_check.py measures it on the card: 10 GB/s a GPU (PCIe Gen4 x16 peaks at 32 GB/s, shared by two
#: GPUs behind one switch on a p4d), 20 GB/s on PCIe Gen5 (p5).
WRITE_RATE_SOURCE = "host NVMe write 8 GB/s (AWS P4d deep dive, fio); device-to-host 10-20 GB/s per GPU (assumed)"
#: SageMaker's grace between SIGTERM and SIGKILL on a stop (StopTrainingJob's API reference), and torchrun's before
#: it kills its workers: 30 s, configurable (TORCH_ELASTIC_SHUTDOWN_TIMEOUT) only from torch 2.12
SAGEMAKER_STOP_GRACE_S = 120
TORCHRUN_DEFAULT_GRACE_S = 30

#: The control plane's catalogue of instance types (lustrain_core/data/instance_types.json), copied beside this file
#: by scripts/refresh_trainer_plan.py: the trainer runs in SageMaker's image without the control plane, and a test
#: keeps the copies equal. GPUs, their memory and bf16 peak, host memory and the checkpoint rates come from its rows.
CATALOGUE_FILE = Path(__file__).with_name("instance_types.json")
CATALOGUE: dict[str, dict[str, Any]] = json.loads(CATALOGUE_FILE.read_text())["instance_types"]

#: the GPU instance types whose rows carry what the plan needs (the checkpoint rates included)
INSTANCES: dict[str, Hardware] = {
    name: Hardware(row["gpus"], int(row["gpu_memory_gib"] * GIB), int(row["host_memory_gib"] * GIB),
                   float(row["checkpoint_write_gbps"]), float(row["stage_gbps"]))
    for name, row in CATALOGUE.items()
    if row.get("gpus") and row.get("checkpoint_write_gbps") and row.get("stage_gbps")
}
DEFAULT_INSTANCE = "ml.p4d.24xlarge"

#: dense bf16 TFLOP/s per GPU by the name torch.cuda.get_device_name() contains, first match wins: what MFU is
#: measured against where the instance type is not known (the catalogue's rows: NVIDIA's datasheets, half the
#: figures quoted with sparsity)
PEAK_TFLOPS_BY_GPU_NAME = tuple(dict.fromkeys(
    (row["gpu"], float(row["bf16_dense_tflops_per_gpu"]))
    for row in CATALOGUE.values() if row.get("gpu") and row.get("bf16_dense_tflops_per_gpu")
))


def peak_tflops(device_name: str, instance_type: str | None = None) -> float | None:
    """The GPU's dense bf16 peak: the instance type's catalogue row (SageMaker's SM_CURRENT_INSTANCE_TYPE) first,
    else the GPU's name; None for a GPU the catalogue does not know (no MFU then)."""
    row = CATALOGUE.get(instance_type or "")
    if row and row.get("bf16_dense_tflops_per_gpu"):
        return float(row["bf16_dense_tflops_per_gpu"])
    for marker, tflops in PEAK_TFLOPS_BY_GPU_NAME:
        if marker in device_name:
            return tflops
    return None


def efa_interfaces(instance_type: str) -> int:
    """The EFA interfaces of an instance type, from its catalogue row (0: no EFA, or a type it does not know)."""
    return int(CATALOGUE.get(instance_type, {}).get("efa_interfaces") or 0)


def efa_device_rdma(instance_type: str) -> bool:
    """Whether GPUDirect RDMA over EFA is turned on for an instance type (its catalogue row's efa_device_rdma)."""
    return bool(CATALOGUE.get(instance_type, {}).get("efa_device_rdma"))


def llama_ffn_hidden(n_embd: int) -> int:
    """The Llama block's default SwiGLU width: two thirds of 4 x width, rounded up to a multiple of 256 (Meta's
    reference code; Llama 2 7B's 11008 from width 4096)."""
    return -(-int(2 * 4 * n_embd / 3) // 256) * 256


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_embd: int
    n_head: int
    seq_len: int
    vocab_size: int
    #: "gpt": LayerNorm, full multi-head attention, a 4x GELU MLP, learned positions, tied head; "llama": RMSNorm,
    #: rotary positions (no parameters), grouped-query attention, a SwiGLU MLP, a head tied or not
    arch: str = "gpt"
    #: key/value heads (0: n_head) and the MLP's hidden width (0: the block's default), the Llama block's
    n_kv_head: int = 0
    ffn_hidden: int = 0
    tie_embeddings: bool = True

    @property
    def kv_width(self) -> int:
        return (self.n_kv_head or self.n_head) * (self.n_embd // self.n_head)

    @property
    def ffn(self) -> int:
        if self.arch == "llama":
            return self.ffn_hidden or llama_ffn_hidden(self.n_embd)
        return 4 * self.n_embd

    @property
    def block_parameters(self) -> int:
        d = self.n_embd
        if self.arch == "llama":
            # two RMSNorm gains, q and o (d x d), k and v (d x kv_width), gate, up and down (d x ffn)
            return 2 * d + 2 * d * d + 2 * d * self.kv_width + 3 * d * self.ffn
        return 12 * d * d + 2 * d

    @property
    def lookup_parameters(self) -> int:
        """Parameters read by index, not multiplied: learned positions, and the token embedding where the head
        does not share it (a shared one is the head's matrix)."""
        positions = self.seq_len * self.n_embd if self.arch == "gpt" else 0
        return positions + (0 if self.tie_embeddings else self.vocab_size * self.n_embd)

    @property
    def parameters(self) -> int:
        """The model's trainable parameters: the token embedding, the head where it is its own, learned positions
        (GPT), the blocks and the final norm's gain. model.GPTConfig and model.LlamaConfig agree."""
        d = self.n_embd
        head = 0 if self.tie_embeddings else self.vocab_size * d
        positions = self.seq_len * d if self.arch == "gpt" else 0
        return self.vocab_size * d + head + positions + self.n_layer * self.block_parameters + d

    @property
    def activation_bytes_per_token_width(self) -> float:
        """A layer's saved activations per token per unit of width, in 16-bit precision. The GPT block: 34
        (Korthikanti et al., section 4.1). The Llama block, counted the same way (no dropout masks): both norms'
        inputs and outputs, q, the attention's output twice (kept by SDPA, and its contiguous copy by o_proj; 2
        each), k and v (2 each, kv_width wide) and the MLP's four ffn-wide tensors (gate, up, silu(gate), their
        product; 2 each). A test holds both within 15% of what autograd saves."""
        if self.arch == "llama":
            d = self.n_embd
            return 14 + 4 * self.kv_width / d + 8 * self.ffn / d
        return ACTIVATION_BYTES_PER_TOKEN_WIDTH

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 per multiplied parameter (forward and backward; an embedding lookup
        multiplies nothing) plus attention's 12 x layers x width x sequence (PaLM's appendix B: scores and values
        over every query head, however few key/value heads), without the recomputation activation checkpointing
        adds (MFU counts the model's FLOPs, not the hardware's)."""
        return 6.0 * (self.parameters - self.lookup_parameters) + 12.0 * self.n_layer * self.n_embd * self.seq_len


@dataclass(frozen=True)
class Plan:
    instance_type: str
    world_size: int
    gpus_per_host: int
    host_memory_bytes: int
    shard: int
    fsdp: bool
    parameters: int
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    working_bytes: int
    activation_bytes: int
    overhead_bytes: int
    gpu_bytes: int
    checkpoint_bytes: int
    host_checkpoint_bytes: int
    stage_bytes: int
    checkpoint_blocking_s: float
    checkpoint_write_s: float
    #: training FLOPs a token (Shape.flops_per_token) and the tokens of one rank's micro-batch: what a step costs a
    #: GPU, for a step's time at a fraction of the GPU's peak (lustrain's planner, goodput.step_s)
    flops_per_token: float = 0.0
    micro_batch_tokens: int = 0

    @property
    def micro_batch_flops(self) -> float:
        """The model's FLOPs one rank spends on one micro-batch, forward and backward (no recomputation counted)."""
        return self.flops_per_token * self.micro_batch_tokens

    @property
    def peak_bytes(self) -> int:
        return (self.parameter_bytes + self.gradient_bytes + self.optimizer_bytes + self.working_bytes
                + self.activation_bytes + self.overhead_bytes)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= USABLE_GPU_SHARE * self.gpu_bytes

    @property
    def replicas(self) -> int:
        return self.world_size // self.shard

    @property
    def stop_to_saved_s(self) -> float:
        """Worst case from SIGTERM to a checkpoint on disk: the write in flight finishes, then the stop-time
        checkpoint is staged and written."""
        return self.checkpoint_blocking_s + 2 * self.checkpoint_write_s

    @property
    def host_bytes(self) -> int:
        """Host memory a host's ranks hold for checkpoints: each rank's staged copy of its state."""
        return self.stage_bytes * self.gpus_per_host

    def lines(self) -> list[str]:
        gib = GIB
        return [
            f"instance_type={self.instance_type}",
            f"world_size={self.world_size}",
            f"hosts={max(1, self.world_size // self.gpus_per_host)}",
            f"parameters={self.parameters}",
            f"sharding={'hsdp' if self.fsdp and self.replicas > 1 else 'fsdp' if self.fsdp else 'ddp'}",
            f"shard_group={self.shard}",
            f"replicas={self.replicas}",
            f"parameter_gib_per_rank={self.parameter_bytes / gib:.2f}",
            f"gradient_gib_per_rank={self.gradient_bytes / gib:.2f}",
            f"optimizer_gib_per_rank={self.optimizer_bytes / gib:.2f}",
            f"working_gib_per_rank={self.working_bytes / gib:.2f}",
            f"activation_gib_per_rank={self.activation_bytes / gib:.2f}",
            f"overhead_gib_per_rank={self.overhead_bytes / gib:.2f}",
            f"peak_gib_per_gpu={self.peak_bytes / gib:.2f}",
            f"gpu_gib={self.gpu_bytes / gib:.2f}",
            f"fits={'yes' if self.fits else 'no'}",
            f"host_checkpoint_staging_gib={self.host_bytes / gib:.2f}",
            f"host_gib={self.host_memory_bytes / gib:.0f}",
            f"checkpoint_gb={self.checkpoint_bytes / 1e9:.1f}",
            f"checkpoint_gb_per_host={self.host_checkpoint_bytes / 1e9:.2f}",
            f"checkpoint_blocking_s={self.checkpoint_blocking_s:.1f}",
            f"checkpoint_write_s={self.checkpoint_write_s:.1f}",
            f"stop_to_saved_s={self.stop_to_saved_s:.1f}",
            f"micro_batch_tflop_per_gpu={self.micro_batch_flops / 1e12:.1f}",
            f"stop_within_sagemaker_grace={'yes' if self.stop_to_saved_s <= SAGEMAKER_STOP_GRACE_S else 'no'}",
            f"stop_within_torchrun_default_grace={'yes' if self.stop_to_saved_s <= TORCHRUN_DEFAULT_GRACE_S else 'no'}",
            f"rates={WRITE_RATE_SOURCE}",
        ]


def plan(shape: Shape, *, batch_size: int, activation_checkpointing: bool, world_size: int, bf16: bool = True,
         fsdp: bool | None = None, shard: int = 0, instance_type: str = DEFAULT_INSTANCE,
         hardware: Hardware | None = None) -> Plan:
    """The plan of one training layout. fsdp None and shard 0 choose: DDP if a whole replica fits a GPU, else the
    smallest shard group that fits (see shard_groups); a shard that does not divide world_size is an error."""
    hw = hardware or INSTANCES[instance_type]
    if fsdp is None or (fsdp and not shard):
        shard = shard or choose_shard(shape, batch_size=batch_size, activation_checkpointing=activation_checkpointing,
                                      world_size=world_size, bf16=bf16, hardware=hw, allow_ddp=fsdp is None)
        fsdp = shard > 1 or fsdp is True
    shard = shard if fsdp else 1
    if world_size % shard:
        raise ValueError(f"shard group {shard} does not divide the world size {world_size}")
    p = shape.parameters
    weight = 2 if bf16 else 4
    working = (2 * weight + 4) * shape.block_parameters if fsdp and shard > 1 else 0
    tokens = batch_size * shape.seq_len
    per_layer = int(shape.activation_bytes_per_token_width * tokens * shape.n_embd) * (1 if bf16 else 2)
    if activation_checkpointing:
        activations = shape.n_layer * weight * tokens * shape.n_embd + per_layer
    else:
        activations = shape.n_layer * per_layer
    activations += tokens * shape.vocab_size * (weight + 8)
    hosts = max(1, world_size // hw.gpus)
    checkpoint = 12 * p
    stage = 12 * p // shard
    return Plan(
        instance_type=instance_type, world_size=world_size, gpus_per_host=min(hw.gpus, world_size),
        host_memory_bytes=hw.host_bytes, shard=shard,
        fsdp=bool(fsdp), parameters=p, parameter_bytes=4 * p // shard, gradient_bytes=4 * p // shard,
        optimizer_bytes=8 * p // shard, working_bytes=working, activation_bytes=activations,
        overhead_bytes=GPU_OVERHEAD_BYTES, gpu_bytes=hw.gpu_bytes, checkpoint_bytes=checkpoint,
        host_checkpoint_bytes=checkpoint // hosts, stage_bytes=stage,
        checkpoint_blocking_s=stage / (hw.stage_gbps * 1e9),
        checkpoint_write_s=checkpoint / hosts / (hw.write_gbps * 1e9),
        flops_per_token=shape.flops_per_token(), micro_batch_tokens=tokens,
    )


def shard_groups(world_size: int, gpus_per_host: int) -> list[int]:
    """The shard group sizes a world can use, smallest first: the divisors of one host's GPUs (within a host, over
    NVLink), then whole hosts that divide the world (HSDP replicas across the rest)."""
    sizes = [s for s in range(2, min(gpus_per_host, world_size) + 1) if world_size % s == 0 and gpus_per_host % s == 0]
    hosts = world_size // gpus_per_host if world_size % gpus_per_host == 0 else 0
    sizes += [n * gpus_per_host for n in range(2, hosts + 1) if hosts % n == 0]
    if world_size not in sizes and world_size > 1:
        sizes.append(world_size)
    return sorted(set(sizes))


def choose_shard(shape: Shape, *, batch_size: int, activation_checkpointing: bool, world_size: int, bf16: bool,
                 hardware: Hardware, allow_ddp: bool = True) -> int:
    """The smallest shard group whose plan fits the GPU (1: DDP, when allowed and a whole replica fits); the whole
    world when none fits (the plan then says fits=no)."""
    candidates = ([1] if allow_ddp or world_size == 1 else []) + shard_groups(world_size, hardware.gpus)
    for size in candidates:
        candidate = plan(shape, batch_size=batch_size, activation_checkpointing=activation_checkpointing,
                         world_size=world_size, bf16=bf16, fsdp=size > 1, shard=size, hardware=hardware)
        if candidate.fits:
            return size
    return candidates[-1] if candidates else 1


def plan_of_run(inputs: dict[str, Any], instance_type: str, instance_count: int) -> Plan:
    """The plan of a run from presets.plan_inputs' values, on instance_count instances of instance_type."""
    hw = INSTANCES[instance_type]
    shape = Shape(n_layer=inputs["n_layer"], n_embd=inputs["n_embd"], n_head=inputs["n_head"],
                  seq_len=inputs["seq_len"], vocab_size=inputs["vocab_size"], arch=inputs.get("arch", "gpt"),
                  n_kv_head=inputs.get("n_kv_head", 0), ffn_hidden=inputs.get("ffn_hidden", 0),
                  tie_embeddings=inputs.get("tie_embeddings", True))
    fsdp = {"auto": None, "true": True, "false": False}.get(inputs["fsdp"])
    return plan(shape, batch_size=inputs["batch_size"], activation_checkpointing=inputs["activation_checkpointing"],
                world_size=instance_count * hw.gpus, bf16=inputs["precision"] != "fp32", fsdp=fsdp,
                shard=inputs["shard_group"], instance_type=instance_type)


def smallest_fitting_count(inputs: dict[str, Any], instance_type: str, max_count: int = 1000) -> int | None:
    """The fewest instances of instance_type on which the run's model fits (its shard group chosen by the plan)."""
    for count in range(1, max_count + 1):
        try:
            if plan_of_run({**inputs, "shard_group": 0}, instance_type, count).fits:
                return count
        except ValueError:
            continue
    return None
