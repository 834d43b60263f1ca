"""One process or many: torchrun's environment decides (DDP over gloo on CPU, NCCL on GPU; FSDP or HSDP as the
memory plan says, or as asked).

Only rank 0 writes the files every rank would otherwise write (the model, the summary); every rank writes its own
shards of a checkpoint (checkpoint.py).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from . import plan


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


def init(env: Mapping[str, str] | None = None, timeout_s: int = 1800) -> Dist:
    """This process's place in the world; the process group's collectives give up after timeout_s (a rank waiting
    on another's checkpoint step, or a first step's compilation, must not be taken for a lost rank)."""
    env = os.environ if env is None else env
    world_size = int(env.get("WORLD_SIZE", "1"))
    rank = int(env.get("RANK", "0"))
    local_rank = int(env.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world_size > 1:
        dist.init_process_group(backend="nccl" if cuda else "gloo", device_id=device if cuda else None,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return Dist(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def shutdown(info: Dist) -> None:
    if info.active and dist.is_initialized():
        dist.destroy_process_group()


def gpus_per_host(info: Dist, env: Mapping[str, str] | None = None) -> int:
    """The ranks on this host (torchrun's LOCAL_WORLD_SIZE): the unit of a shard group within NVLink's reach."""
    env = os.environ if env is None else env
    return int(env.get("LOCAL_WORLD_SIZE", str(info.world_size)))


def shard(model: nn.Module, info: Dist, bf16: bool, shard_group: int) -> None:
    """Shard `model` in place with FSDP2 (fully_shard), block by block: over the whole world (FSDP), or over groups
    of shard_group ranks with the model replicated across the groups (HSDP: each group holds one whole replica,
    gradients are reduce-scattered within it and all-reduced across the replicas). Works on a model on `meta`:
    nothing is allocated until to_empty."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if info.world_size % shard_group:
        raise ValueError(f"shard_group {shard_group} does not divide the world size {info.world_size}")
    if shard_group == info.world_size:
        mesh = init_device_mesh(info.device.type, (info.world_size,), mesh_dim_names=("shard",))
    else:
        mesh = init_device_mesh(info.device.type, (info.world_size // shard_group, shard_group),
                                mesh_dim_names=("replicate", "shard"))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32)
    for block in getattr(model, "blocks", []):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def wrap(model: nn.Module, info: Dist) -> nn.Module:
    """The module DDP calls in the training loop (a sharded model is called as it is); `model` itself stays the
    one whose state is saved."""
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


def broadcast_object(value: Any, info: Dist) -> Any:
    """Rank 0's value (a small picklable one: a decision, not tensors) on every rank."""
    if not info.active:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_lists(items: list[Any], info: Dist) -> list[Any]:
    """Every rank's (small, picklable) list, joined in rank order, on every rank."""
    if not info.active:
        return list(items)
    gathered: list[Any] = [None] * info.world_size
    dist.all_gather_object(gathered, items)
    return [item for part in gathered for item in part]


#: NCCL and EFA settings that SageMaker's launcher does not set (and only where nothing set them: a spec's
#: environment wins). SageMaker's training toolkit (aws/sagemaker-training-toolkit, torch_distributed.py) sets, for
#: torchrun, FI_PROVIDER=efa on the types of its SM_EFA_NCCL_INSTANCES, FI_EFA_USE_DEVICE_RDMA=1 on those of its
#: SM_EFA_RDMA_INSTANCES (p4d, p4de), and NCCL_SOCKET_IFNAME to the instance's interface; nothing else (no
#: NCCL_PROTO, no RDMAV_FORK_SAFE). What it lacks, from AWS's EFA cheat sheet (aws-samples/awsome-distributed-training,
#: 1.architectures/efa-cheatsheet.md) and torch's own notes:
EFA_DEFAULTS: dict[str, str] = {
    # Where training runs outside that toolkit (its own torchrun, a rehearsal on EC2): EFA, not TCP sockets.
    "FI_PROVIDER": "efa",
    # NCCL's bootstrap over the instance's network interfaces, never loopback or docker's bridge.
    "NCCL_SOCKET_IFNAME": "^lo,docker",
    # A collective that fails (a lost EFA link) ends the process, so the run's policy can retry it as
    # infrastructure, instead of hanging until the collective timeout (torch's ProcessGroupNCCL notes).
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    # FSDP's all-gathers on their own streams free memory as soon as they are used (torchtitan sets the same).
    "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
}
#: GPUDirect RDMA over EFA: only on the types whose catalogue row says so (efa_device_rdma: the toolkit's own
#: list), as libfabric refuses it where the device cannot do it
DEVICE_RDMA = {"FI_EFA_USE_DEVICE_RDMA": "1"}


def apply_network_defaults(env: MutableMapping[str, str]) -> dict[str, str]:
    """Set the EFA defaults this host lacks, on an instance type with EFA interfaces (SageMaker's
    SM_CURRENT_INSTANCE_TYPE, in the catalogue plan.py reads) and a GPU; the ones set. Called before the process
    group starts, when NCCL reads them."""
    instance_type = env.get("SM_CURRENT_INSTANCE_TYPE", "")
    if not plan.efa_interfaces(instance_type) or not torch.cuda.is_available():
        return {}
    wanted = {**EFA_DEFAULTS, **(DEVICE_RDMA if plan.efa_device_rdma(instance_type) else {})}
    added = {key: value for key, value in wanted.items() if key not in env}
    env.update(added)
    return added
