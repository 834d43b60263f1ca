"""One process or many: torchrun's environment decides (DDP over gloo on CPU, NCCL on GPU; FSDP on request).

Only rank 0 writes files every rank would otherwise write (checkpoints, the model, the summary), and only
rank 0 reads a checkpoint: its state is broadcast, so other hosts need no copy of the checkpoint directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

# Parameters, gradients and two Adam moments in fp32: the memory a model needs per replica to train.
TRAINING_BYTES_PER_PARAMETER = 16


@dataclass(frozen=True)
class Dist:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def init(env: Mapping[str, str] | None = None) -> Dist:
    env = os.environ if env is None else env
    world_size = int(env.get("WORLD_SIZE", "1"))
    rank = int(env.get("RANK", "0"))
    local_rank = int(env.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world_size > 1:
        dist.init_process_group(backend="nccl" if cuda else "gloo", device_id=device if cuda else None)
    return Dist(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def shutdown(info: Dist) -> None:
    if info.active and dist.is_initialized():
        dist.destroy_process_group()


def use_fsdp(choice: str, parameters: int, info: Dist) -> bool:
    """FSDP when asked, or ('auto') when a full replica would not fit in about 60% of one GPU."""
    if not info.active:
        return False
    if choice != "auto":
        return choice == "true"
    if info.device.type != "cuda":
        return False
    gpu_bytes = torch.cuda.get_device_properties(info.device).total_memory
    return parameters * TRAINING_BYTES_PER_PARAMETER > 0.6 * gpu_bytes


def wrap(model: nn.Module, info: Dist, fsdp: bool, bf16: bool) -> nn.Module:
    """The module to call in the training loop; `model` itself stays the one whose state is saved."""
    if fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32)
        for block in getattr(model, "blocks", []):
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model
    if info.active:
        return DistributedDataParallel(model, device_ids=[info.device.index] if info.device.type == "cuda" else None)
    return model


def all_reduce(tensor: torch.Tensor, info: Dist, op: str = "mean") -> torch.Tensor:
    if info.active:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        if op == "mean":
            tensor /= info.world_size
    return tensor


def broadcast_int(value: int, info: Dist) -> int:
    if not info.active:
        return value
    box = torch.tensor([value], dtype=torch.int64, device=info.device)
    dist.broadcast(box, src=0)
    return int(box.item())


def barrier(info: Dist) -> None:
    if info.active:
        dist.barrier()
