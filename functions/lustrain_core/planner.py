"""The planner: will this run fit, and what will it cost? Pure Python, no AWS calls.

Every rule here is one the field guide checks by hand before launch: IPs per instance against the subnet, Lustre
capacity against the data and its throughput against the GPUs' appetite, output against local NVMe, the cost
against the budget. Problems are collected and raised together as one SpecInvalid, each naming its field.
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from lustrain_core import instance_types
from lustrain_core.errors import FieldError, SpecInvalid
from lustrain_core.prices import InstanceType, PriceTable
from lustrain_core.spec import MAX_STORAGE_GIB, PERSISTENT_THROUGHPUTS, JobSpec
from lustrain_core.trainer import plan as trainer_plan
from lustrain_core.trainer import presets as trainer_presets

#: addresses AWS reserves in every subnet (network, router, DNS, future, broadcast)
AWS_RESERVED_IPS = 5
SCRATCH_MB_S_PER_TIB = 200
#: LZ4 on text, code, tokens and tabular data: AWS quotes up to ~50% savings; plan on less
LZ4_RATIO = 1.5
#: formats that are compressed already: LZ4 gains nothing on them
INCOMPRESSIBLE = frozenset(
    [
        ".jpg",
        ".jpeg",
        ".png",
        ".gif",
        ".webp",
        ".heic",
        ".avif",
        ".mp3",
        ".aac",
        ".ogg",
        ".opus",
        ".flac",
        ".m4a",
        ".mp4",
        ".mkv",
        ".webm",
        ".mov",
        ".avi",
        ".gz",
        ".tgz",
        ".bz2",
        ".xz",
        ".zst",
        ".zip",
        ".7z",
        ".rar",
        ".lz4",
        ".br",
        ".parquet",
        ".tfrecord",
        ".npz",
    ]
)
#: free space kept on the file system beyond the data (Lustre slows down when nearly full)
FS_FREE_FRACTION = 0.10
STATE_TRANSITIONS_PER_RUN = 30
LAMBDA_INVOCATIONS_PER_RUN = 15
#: runs longer than this are better off on a file system that survives a file-server failure
PERSISTENT_AFTER_HOURS = 72
#: checkpoints.to_filesystem: one checkpoint's write should take at most this long at the file system's
#: throughput. A stop, asked (the run's stop request) or at the trainer's own deadline, waits for the write in
#: flight, then stages and writes its stop-time checkpoint (goodput.stop_to_saved_s): two writes and a staging copy
#: of a few seconds fit SageMaker's 120 s between a stop and SIGKILL when each write takes at most 50 s, so that even
#: a stop the trainer hears late (a deadline reached early) keeps its checkpoint.
CHECKPOINT_WRITE_TARGET_S = 50
#: data.preload: the warm-up job's one instance (steps/preload.py), a CPU type of the catalogue
PRELOAD_INSTANCE_TYPE = "ml.m5.xlarge"
#: MB/s the warm-up's instance reads from Lustre: m5.xlarge's baseline network bandwidth, 1.25 Gbps (EC2 User
#: Guide, "Network specifications", general purpose instances: "Up to 10" Gbps with a 1.25 Gbps baseline; the burst
#: lasts minutes, a warm-up hours)
PRELOAD_READ_MB_S = 156.0
#: how much longer than its expected time the warm-up may run (MaxRuntimeInSeconds) before SageMaker stops it
PRELOAD_RUNTIME_FACTOR = 3
#: the warm-up's MaxRuntimeInSeconds when the data's size is unknown, and the least it gets
PRELOAD_UNKNOWN_SECONDS = 24 * 3600
PRELOAD_MIN_SECONDS = 3600
#: checkpoints the trainer keeps (trainer/lustrain_trainer/hparams.py's keep_checkpoints default)
TRAINER_KEEP_CHECKPOINTS = 2
#: steps between the trainer's checkpoints and micro-steps per step where the spec and the preset do not say
#: (trainer/lustrain_trainer/hparams.py's checkpoint_interval and grad_accum defaults)
TRAINER_CHECKPOINT_INTERVAL = 500
TRAINER_GRAD_ACCUM = 1

# --- goodput (plan_goodput): what a run loses to checkpoints, interruptions and its stop ---------------------------
#: The interruption rate a fleet is planned with: "During a 54-day snapshot period of pre-training, we experienced a
#: total of 466 job interruptions ... 419 were unexpected" on up to 16,384 H100 GPUs (Dubey et al., "The Llama 3 Herd
#: of Models", 2024, arXiv:2407.21783, section 3.3.4 and table 5): 419 / (54 x 24 x 16,384) = 1.97e-5 a GPU-hour,
#: one GPU's mean time between interruptions 50,677 h; a fleet of N GPUs sees one every 50,677 / N hours.
LLAMA3_UNEXPECTED_INTERRUPTIONS = 419
LLAMA3_SNAPSHOT_DAYS = 54
LLAMA3_GPUS = 16_384
GPU_MTBF_HOURS = LLAMA3_SNAPSHOT_DAYS * 24 * LLAMA3_GPUS / LLAMA3_UNEXPECTED_INTERRUPTIONS
GPU_MTBF_SOURCE = (
    "Llama 3 (Dubey et al. 2024, arXiv:2407.21783, section 3.3.4): 419 unexpected interruptions in 54 days on 16,384 "
    "GPUs, one GPU's MTBF 50,677 h"
)
#: The stack setting (template parameter GpuMtbfHours) that replaces GPU_MTBF_HOURS: one GPU's mean time between
#: unexpected interruptions, in hours; empty or 0 keeps Llama 3's
GPU_MTBF_SETTING = "LUSTRAIN_GPU_MTBF_HOURS"
#: Seconds between rank 0's reads of the run's stop request: trainer/lustrain_trainer/stopping.py's DEFAULT_POLL_S
#: (the trainer ships without the control plane, so it is stated here too; a test keeps the two equal)
STOP_REQUEST_POLL_SECONDS = 10
#: What the bounded wait before StopTrainingJob (goodput.stop_wait_s) allows beyond stop_to_saved_s: a minute for
#: what the plan does not count, torch.distributed.checkpoint's planning over every rank and the staging buffers'
#: allocation (issue 39 names both; neither is measured yet)
STOP_WAIT_MARGIN_S = 60
#: The longest a restart may spend in SageMaker's checkpoint sync: it copies the whole checkpoint prefix (every kept
#: checkpoint) to every instance before the entry point starts, while the fleet is billed and idle. Above it the
#: checkpoints must go to the file system (checkpoints.to_filesystem), where each rank reads only its own shards.
SYNC_RESUME_MAX_S = 600
#: The share of the GPU's dense bf16 peak a step runs at, until a step-time model exists: the low end of Llama 3's
#: 38-43% BF16 model FLOPs utilisation on 8,192 to 16,384 H100s (Dubey et al. 2024, table 4); MFU counts the model's
#: FLOPs, as Shape.flops_per_token does. Not measured on A100 or with this trainer.
STEP_MFU = 0.38
STEP_MFU_SOURCE = "38% of the GPU's dense bf16 peak: the low end of Llama 3's 38-43% BF16 MFU (Dubey et al. 2024, table 4)"
#: GB/s one instance uploads to S3 through SageMaker's checkpoint sync: one TCP flow's 5 Gbps ("Bandwidth for
#: single-flow traffic is limited to 5 Gbps", EC2 User Guide, "Amazon EC2 instance network bandwidth"). SageMaker
#: documents neither its sync's parallelism nor its pace, so the plan takes one flow: a bound, not a measurement.
S3_SYNC_GB_S = 5 / 8
S3_SYNC_SOURCE = (
    "SageMaker's checkpoint sync at one TCP flow's 5 Gbps a host (EC2 User Guide, instance network bandwidth: "
    "single-flow limit; the sync's parallelism is undocumented), after the local NVMe write"
)
LUSTRE_SOURCE = (
    "the file system's throughput capacity, storage x MB/s per TiB (FSx for Lustre User Guide, performance), less "
    "the GPUs' data ingest while training reads"
)


def quota_name(instance_type: str, *, spot: bool) -> str:
    """The Service Quotas name of the quota a training job's instances count against (the L- code differs between
    sources): spot and on-demand jobs count against different quotas, named in the type's catalogue row. The plan
    and the live check both use this."""
    return instance_types.quota_name(instance_type, spot=spot)


def valid_capacities(upto_gib: float) -> list[int]:
    """SCRATCH_2 / PERSISTENT_2 capacities: 1200, 2400, then multiples of 2400 GiB."""
    caps = [1200, 2400]
    while caps[-1] < upto_gib:
        caps.append(caps[-1] + 2400)
    return caps


def smallest_capacity(at_least_gib: float) -> int:
    return next(c for c in valid_capacities(at_least_gib) if c >= at_least_gib)


def usable_ips(prefix_length: int) -> int:
    return int(2 ** (32 - prefix_length) - AWS_RESERVED_IPS)


def lustre_ips(storage_gib: int) -> int:
    """ENIs a Lustre file system takes: about one per file server (one per 1.2 TiB step) plus the metadata server."""
    return storage_gib // 1200 + 1


@dataclass
class NetworkPlan:
    ips_per_instance: int
    ips_for_instances: int
    ips_for_filesystem: int
    ips_headroom: int
    ips_needed: int
    subnet_prefix_length: int | None
    usable_ips: int | None
    vpc_cidr: str | None
    subnet_cidr: str | None
    reuse_subnet_id: str | None
    #: the instance type's EFA interfaces (its catalogue row): what ips_per_instance is planned from
    efa_interfaces: int = 0


@dataclass
class FilesystemPlan:
    deployment_type: str
    storage_gib: int | None
    throughput_per_tib: int | None
    per_unit_storage_throughput: int | None
    throughput_mb_s: float | None
    demand_mb_s: float
    data_gib: float | None
    stored_gib: float | None
    compression: str
    reuse_file_system_id: str | None
    reason: str
    #: the cheapest valid file system of each deployment type for the same data and demand, side by side
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    #: checkpoints.to_filesystem: one checkpoint's size, how many the file system holds, the burst's MB/s
    checkpoints: dict[str, Any] | None = None
    #: what set the capacity: "the data", "data ingest", "checkpoint bursts", "checkpoints kept", "the smallest
    #: capacity FSx offers", or "as given"
    decided_by: str | None = None


@dataclass
class CostPlan:
    #: None where the instance type has no confirmed price (`unpriced`): the instances' part is unknown
    compute_usd: float | None
    filesystem_usd: float
    control_plane_usd: float
    total_usd: float | None
    hourly_usd: float | None
    prices_as_of: str
    assumptions: list[str]
    #: code.secrets' interface endpoints, made with the run's network and gone with it
    network_usd: float = 0.0
    #: the warm pool's instances, kept compute.keep_alive_minutes after the job (SageMaker bills
    #: ResourceRetainedBillableTimeInSeconds x InstanceCount at the training price)
    warm_pool_usd: float | None = 0.0
    #: data.preload's warm-up job (its instance, and the file system's hours it adds before the training)
    preload_usd: float = 0.0


@dataclass
class Plan:
    network: NetworkPlan
    filesystem: FilesystemPlan
    output: dict[str, Any]
    quota: dict[str, Any]
    cost: CostPlan
    recommendation: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    #: the trainer's memory plan (lustrain_core.trainer.plan) when the hyperparameters name one of its presets
    memory: dict[str, Any] | None = None
    #: the instance type's catalogue row as planned (data/instance_types.json)
    instance: dict[str, Any] | None = None
    #: a cold first epoch (each file read through to S3 while the fleet bills) next to the data.preload warm-up
    preload: dict[str, Any] | None = None
    #: what the run loses to checkpoints, interruptions and its stop, and the checkpoint interval (plan_goodput)
    goodput: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(
    spec: JobSpec,
    *,
    data_gib: float | None = None,
    extension_bytes: dict[str, int] | None = None,
    prices: PriceTable | None = None,
    gpu_mtbf_hours: float | None = None,
) -> Plan:
    """Plan a run. `data_gib` (measured from S3) wins over the spec's hint; `extension_bytes` is a sample of the
    data's bytes per file extension, used to judge how well it compresses; `gpu_mtbf_hours` one GPU's mean time
    between interruptions (default: the stack's setting, else Llama 3's rate; see gpu_mtbf_hours)."""
    prices = prices or PriceTable()
    errors: list[FieldError] = []
    warnings: list[str] = []

    itype = prices.instance_types.get(spec.compute.instance_type)
    if itype is None:
        raise SpecInvalid.one(
            "compute.instance_type",
            spec.compute.instance_type,
            f"unknown to the planner; known: {', '.join(sorted(prices.instance_types))} (add its row to "
            "data/instance_types.json, or for this plan with --prices: {\"instance_types\": {type: row}})",
        )
    priced = itype.hourly_usd is not None
    if not priced and spec.budget.max_usd is not None:
        # everything else is planned without a price (its cost unknown); a run held to a budget cannot be
        raise SpecInvalid.one(
            "compute.instance_type",
            spec.compute.instance_type,
            "has no confirmed on-demand price in the instance-type catalogue, so the run cannot be held to "
            f"budget.max_usd: give one with --prices ({{\"instance_hourly_usd\": {{\"{itype.name}\": <$ an hour>}}}}) "
            "or add hourly_usd, price_as_of and price_source to its row",
        )

    memory, layout = _plan_memory(spec, errors)
    fs = _plan_filesystem(spec, itype, data_gib, extension_bytes, prices, errors, warnings, memory)
    net = _plan_network(spec, itype, fs, errors)
    output = _plan_output(spec, itype, errors, memory)
    cost = _plan_cost(spec, itype, fs, prices)
    preload = plan_preload(spec, itype, fs, prices)
    if not priced:
        cost = unpriced(cost, spec)
        preload["cold_first_epoch_usd"] = None
        warnings.append(
            f"compute.instance_type {itype.name} has no confirmed on-demand price in the catalogue: the run's cost is "
            "unknown, and a run held to a budget (budget.max_usd, or the stack's MaxBudgetUsdPerRun) is refused; "
            f'give one with --prices ({{"instance_hourly_usd": {{"{itype.name}": <$ an hour>}}}})'
        )
    if spec.data.preload:
        cost.preload_usd = preload["warmup_usd"]
        cost.total_usd = round(cost.total_usd + preload["warmup_usd"], 2)
        cost.assumptions.append(
            f"data.preload: 1 x {PRELOAD_INSTANCE_TYPE} and the file system for the warm-up's "
            f"{preload['warmup_seconds'] or 0:,} s"
        )
        cold_usd = preload["cold_first_epoch_usd"]
        if cold_usd is not None and preload["warmup_usd"] > cold_usd:
            warnings.append(
                f"data.preload: the warm-up (${preload['warmup_usd']:,.2f}, one {PRELOAD_INSTANCE_TYPE} at "
                f"{preload['warmup_read_mb_s']:,.0f} MB/s) costs more than a cold first epoch read at the file "
                f"system's {preload['import_mb_s']:,.0f} MB/s (${cold_usd:,.2f}): it pays off only where FSx loads "
                "the files from S3 slower than that"
            )
    goodput = plan_goodput(
        spec, itype, fs, layout, errors, warnings,
        gpu_mtbf_hours if gpu_mtbf_hours is not None else mtbf_setting(),
    )
    recommendation = _recommend(spec, fs)
    if (
        recommendation["deployment_type"] != spec.filesystem.deployment_type
        and not spec.filesystem.file_system_id
    ):
        warnings.append(recommendation["why"])
    if spec.filesystem.keep:
        monthly = _fs_monthly_usd(fs, prices)
        warnings.append(
            f"filesystem.keep is true: the file system stays after the run and bills about ${monthly:,.0f} a month"
        )
    if spec.budget.max_usd is not None and cost.total_usd is not None and cost.total_usd > spec.budget.max_usd:
        errors.append(
            FieldError(
                "budget.max_usd",
                spec.budget.max_usd,
                f"the run is estimated at ${cost.total_usd:,.2f} (compute ${cost.compute_usd:,.2f} + file system "
                f"${cost.filesystem_usd:,.2f}); raise the budget or lower compute.instance_count or "
                "compute.max_runtime_hours",
            )
        )
    if errors:
        raise SpecInvalid(errors)
    quota = {
        "instance_type": spec.compute.instance_type,
        "instances_requested": spec.compute.instance_count,
        "quota_name": itype.quota_name(spot=spec.compute.spot),
    }
    if spec.compute.training_plan is not None:
        # reserved capacity (steps/training_plans.py): the run waits for the plan's instances, not this quota
        quota["training_plan"] = spec.compute.training_plan
        warnings.append(
            f"compute.training_plan {spec.compute.training_plan}: the plan's instances are paid up front (its "
            "UpfrontFee); the compute cost here is at on-demand prices"
        )
    if itype.unconfirmed:
        warnings.append(
            f"{itype.name}: not checked against AWS's documentation: {', '.join(itype.unconfirmed)} "
            "(see its row in data/instance_types.json)"
        )
    return Plan(
        net, fs, output, quota, cost, recommendation, warnings, memory, instance_summary(itype), preload, goodput
    )


def plan_preload(
    spec: JobSpec, itype: InstanceType, fs: FilesystemPlan, prices: PriceTable
) -> dict[str, Any]:
    """What a cold first epoch costs, next to data.preload's warm-up. FSx for Lustre linked to S3 imports metadata
    only and copies a file's contents in on its first read (FSx for Lustre User Guide, "Importing changes from your
    data repository": lazy load), so the first epoch reads the data at the pace the file system loads it from S3:
    no faster than its throughput capacity (fs.throughput_mb_s, the figure FSx provisions for the file system's
    reads and writes; "Amazon FSx for Lustre performance"), while the fleet bills. The warm-up reads every file once
    before the GPUs start, on one PRELOAD_INSTANCE_TYPE at min(that throughput, PRELOAD_READ_MB_S); it adds its
    time to the file system's hours. Figures are None where the data's size or the file system's throughput is
    unknown (a reused file system: its throughput is its own)."""
    gib = fs.data_gib
    fs_mb_s = fs.throughput_mb_s
    warm = prices.instance_types.get(PRELOAD_INSTANCE_TYPE)
    warm_hourly = (warm.hourly_usd if warm is not None else None) or 0.0
    fs_hourly = _fs_monthly_usd(fs, prices) / prices.hours_per_month
    fraction = prices.spot_price_fraction if spec.compute.spot else 1.0
    fleet_hourly = spec.compute.instance_count * (itype.hourly_usd or 0.0) * fraction
    result: dict[str, Any] = {
        "enabled": spec.data.preload,
        "data_gib": gib,
        "import_mb_s": fs_mb_s,
        "import_mb_s_source": "the file system's throughput capacity (FSx for Lustre User Guide, performance)",
        "cold_first_epoch_seconds": None,
        "cold_first_epoch_usd": None,
        "warmup_instance_type": PRELOAD_INSTANCE_TYPE,
        "warmup_read_mb_s": None,
        "warmup_seconds": None,
        "warmup_usd": 0.0,
        "max_runtime_seconds": PRELOAD_UNKNOWN_SECONDS,
    }
    if gib is None:
        return result
    mb = gib * 2**30 / 1e6
    read = min(PRELOAD_READ_MB_S, fs_mb_s) if fs_mb_s else PRELOAD_READ_MB_S
    warm_s = math.ceil(mb / read)
    result.update(
        warmup_read_mb_s=read,
        warmup_seconds=warm_s,
        warmup_usd=round((warm_hourly + fs_hourly) * warm_s / 3600, 2),
        max_runtime_seconds=max(PRELOAD_MIN_SECONDS, PRELOAD_RUNTIME_FACTOR * warm_s),
    )
    if fs_mb_s:
        cold_s = math.ceil(mb / fs_mb_s)
        result.update(
            cold_first_epoch_seconds=cold_s,
            cold_first_epoch_usd=round(fleet_hourly * cold_s / 3600, 2),
        )
    return result


def mtbf_setting(env: Mapping[str, str] | None = None) -> float:
    """One GPU's mean time between unexpected interruptions, in hours: the stack's LUSTRAIN_GPU_MTBF_HOURS (template
    parameter GpuMtbfHours), else (unset, empty or 0) Llama 3's GPU_MTBF_HOURS. A value that is not a number of hours
    is the stack's mistake, not the spec's: ValueError, naming the setting."""
    raw = (os.environ if env is None else env).get(GPU_MTBF_SETTING, "").strip()
    if not raw:
        return GPU_MTBF_HOURS
    try:
        hours = float(raw)
    except ValueError:
        hours = -1.0
    if not math.isfinite(hours) or hours < 0:
        raise ValueError(
            f"stack setting {GPU_MTBF_SETTING}={raw!r} is not a number of hours at or above 0 (0: Llama 3's rate): "
            "fix the stack's parameter GpuMtbfHours"
        )
    return hours or GPU_MTBF_HOURS


def _figure(value: float) -> str:
    """A figure for a sentence: whole above 10, else three significant digits."""
    return f"{value:,.0f}" if value >= 10 else f"{value:.3g}"


def _whole(raw: Any, default: int) -> int:
    """A hyperparameter's whole number as SageMaker passes it ("500", 500, "5e2"); the trainer's default where it is
    not one (the trainer refuses it itself at start)."""
    try:
        value = float(str(raw))
    except ValueError:
        return default
    return int(value) if math.isfinite(value) and value >= 1 else default


def _checkpoint_medium(
    spec: JobSpec, fs: FilesystemPlan, layout: trainer_plan.Plan, keep: int, devices: int
) -> dict[str, Any]:
    """Where the checkpoints go, and at what pace a checkpoint is written there and read back at a restart.

    - Lustre (checkpoints.to_filesystem): every rank writes its shards to the file system, which takes them at its
      throughput capacity less the data the GPUs read meanwhile; at a restart every rank reads its own shards
      (a host its 1/hosts share), before training reads data, at the whole throughput.
    - S3 through SageMaker's checkpoint sync (CheckpointConfig): each host writes its share to local NVMe (the memory
      plan's checkpoint_write_s), which SageMaker uploads at S3_SYNC_GB_S; at a restart SageMaker copies the whole
      checkpoint prefix (the kept checkpoints) to every instance before the entry point starts.
    A figure is None where the file system's throughput is not the plan's (a reused file system)."""
    c = spec.compute
    checkpoint = layout.checkpoint_bytes
    if spec.checkpoints.to_filesystem:
        throughput = fs.throughput_mb_s
        if not throughput:
            return {"medium": "lustre", "write_s": None, "resume_gb_per_host": checkpoint / c.instance_count / 1e9,
                    "resume_s": None, "source": "a reused file system's throughput is not the plan's"}
        ingest = devices * spec.data.ingest_mb_s_per_gpu
        spare = throughput - ingest if throughput > ingest else throughput
        return {
            "medium": "lustre",
            "write_s": checkpoint / (spare * 1e6),
            "resume_gb_per_host": checkpoint / c.instance_count / 1e9,
            "resume_s": checkpoint / (throughput * 1e6),
            "source": f"{LUSTRE_SOURCE}: {spare:,.0f} of {throughput:,.0f} MB/s for a write, all of it at a resume",
        }
    upload_s = layout.host_checkpoint_bytes / (S3_SYNC_GB_S * 1e9)
    prefix = keep * checkpoint
    return {
        "medium": "s3 (SageMaker checkpoint sync)",
        "write_s": layout.checkpoint_write_s + upload_s,
        "resume_gb_per_host": prefix / 1e9,
        "resume_s": prefix / (S3_SYNC_GB_S * 1e9),
        "source": f"{S3_SYNC_SOURCE}; a restart copies the whole prefix ({keep} kept) to every instance",
    }


def _interval_given(
    spec: JobSpec, hp: dict[str, Any], errors: list[FieldError]
) -> tuple[str, float] | None:
    """The checkpoint interval in minutes the spec gives, and the field it gives it in: checkpoints.every_minutes, or
    the trainer's own hyperparameter checkpoint_every_minutes (0 there: by steps only); None where neither does."""
    field_name = "code.hyperparameters.checkpoint_every_minutes"
    raw = hp.get("checkpoint_every_minutes")
    if spec.checkpoints.every_minutes is not None:
        if raw is not None:
            errors.append(FieldError(
                field_name, raw,
                "the checkpoint interval is given twice: keep checkpoints.every_minutes (which the plan checks and "
                "passes to the trainer) and remove this hyperparameter",
            ))
        return "checkpoints.every_minutes", spec.checkpoints.every_minutes
    if raw is None:
        return None
    try:
        minutes = float(str(raw))
    except ValueError:
        minutes = -1.0
    if not math.isfinite(minutes) or minutes < 0:
        errors.append(FieldError(
            field_name, raw, "a number of minutes above 0, or 0 for checkpoints by steps only (checkpoint_interval)"
        ))
        return None
    return field_name, minutes


def plan_goodput(
    spec: JobSpec,
    itype: InstanceType,
    fs: FilesystemPlan,
    layout: trainer_plan.Plan | None,
    errors: list[FieldError],
    warnings: list[str],
    gpu_mtbf_hours: float = GPU_MTBF_HOURS,
) -> dict[str, Any]:
    """What a run loses of its billed GPU-hours, and the checkpoint interval that loses least: one computation, which
    `lustrain plan` shows, the run's record keeps ($.job.plan.goodput) and launch_plan.hyperparameters passes to the
    trainer (checkpoint_every_minutes).

    The interval: checkpoints.every_minutes, else Young-Daly's optimum sqrt(2 x C x MTBF) (Young 1974, Daly 2006) for
    a save that blocks training C seconds (the memory plan's checkpoint_blocking_s) on a fleet whose GPUs fail
    independently at one per `gpu_mtbf_hours` (MTBF = gpu_mtbf_hours / GPUs), never shorter than a checkpoint's
    write (an asynchronous save cannot start before the one before it is written). The trainer also saves every
    checkpoint_interval steps, whichever comes first; the losses count the clock's interval (the steps' only where
    code.hyperparameters.checkpoint_every_minutes is 0: by steps only).

    The losses, in GPU-seconds of every GPU: each save's blocking time; at each expected interruption (GPUs x
    hours / gpu_mtbf_hours), the work since the last checkpoint on disk (half an interval plus a write, on average)
    and the restart's checkpoint read (resume_s); the stop at the run's end (stop_to_saved_s). Billed GPU-hours are
    the cost plan's: every GPU for compute.max_runtime_hours. Figures are None where a term is unknown (no preset,
    so no memory plan; a reused file system's throughput). Refused, by field: an interval under the save's blocking
    time or longer than the run."""
    c = spec.compute
    devices = c.instance_count * max(itype.gpus, 1)
    hours = c.max_runtime_hours
    hp = {str(key).replace("-", "_"): value for key, value in dict(spec.code.hyperparameters).items()}
    preset = trainer_presets.PRESETS.get(str(hp.get("preset", "")), {})
    keep = _whole(hp.get("keep_checkpoints", preset.get("keep_checkpoints")), TRAINER_KEEP_CHECKPOINTS)
    steps = _whole(hp.get("checkpoint_interval", preset.get("checkpoint_interval")), TRAINER_CHECKPOINT_INTERVAL)
    grad_accum = _whole(hp.get("grad_accum", preset.get("grad_accum")), TRAINER_GRAD_ACCUM)
    fleet_mtbf_h = gpu_mtbf_hours / devices
    medium = _checkpoint_medium(spec, fs, layout, keep, devices) if layout is not None else None
    blocking = layout.checkpoint_blocking_s if layout is not None else None
    write_s = medium["write_s"] if medium else None
    peak = itype.bf16_dense_tflops_per_gpu
    step_s = layout.micro_batch_flops * grad_accum / (peak * 1e12 * STEP_MFU) if layout and peak else None
    young_daly_s = math.sqrt(2 * blocking * fleet_mtbf_h * 3600) if blocking else None
    sync_max_gb = SYNC_RESUME_MAX_S * S3_SYNC_GB_S
    if medium is not None and not spec.checkpoints.to_filesystem and medium["resume_s"] > SYNC_RESUME_MAX_S:
        errors.append(FieldError(
            "checkpoints.to_filesystem", False,
            f"each restart would copy {medium['resume_gb_per_host']:,.0f} GB ({keep} kept checkpoints) to every one "
            f"of the {c.instance_count} instances through SageMaker's checkpoint sync, about "
            f"{medium['resume_s']:,.0f} s at {S3_SYNC_GB_S:g} GB/s a host, above the {SYNC_RESUME_MAX_S} s "
            f"({sync_max_gb:,.0f} GB a host) a restart may spend there: set checkpoints.to_filesystem: true (each "
            "rank then writes and reads only its own shards on Lustre, exported to S3), or keep fewer checkpoints "
            "(code.hyperparameters.keep_checkpoints)",
        ))

    if (
        spec.checkpoints.to_filesystem
        and spec.filesystem.file_system_id is None
        and spec.filesystem.deployment_type == "scratch"
    ):
        errors.append(FieldError(
            "filesystem.deployment_type", "scratch",
            "checkpoints.to_filesystem needs persistent: a scratch file system keeps one copy of its data, and a "
            "file server's failure loses every checkpoint its export to S3 had not yet reached (FSx for Lustre "
            "User Guide, deployment options); persistent replicates within its zone",
        ))

    given = _interval_given(spec, hp, errors)
    every: float | None
    if given is not None:
        path, every = given
        source = f"as given ({path})"
        if every > 0 and blocking is not None and every * 60 < blocking:
            errors.append(FieldError(
                path, every,
                f"under the save's blocking time: each checkpoint stops training for {blocking:.2f} s on "
                f"{c.instance_count} x {c.instance_type} (the memory plan's checkpoint_blocking_s); use at least "
                f"{math.ceil(blocking / 60 * 100) / 100:g} minutes, or leave it unset for Young-Daly's optimum",
            ))
        if every > hours * 60:
            errors.append(FieldError(
                path, every,
                f"longer than the run: compute.max_runtime_hours is {hours:g} ({hours * 60:g} minutes), so no "
                f"checkpoint would be taken by the clock; use at most {hours * 60:g} minutes",
            ))
        if every > 0 and write_s is not None and every * 60 < write_s:
            warnings.append(
                f"{path} {every:g}: shorter than a checkpoint's write ({write_s:,.1f} s to "
                f"{medium['medium'] if medium else 'its medium'}): each save waits for the one before it to be "
                "written, and training waits with it"
            )
    elif young_daly_s is not None and blocking is not None:
        every = round(max(young_daly_s, write_s or 0.0) / 60, 2)
        source = (
            f"Young-Daly: sqrt(2 x {_figure(blocking)} s x {fleet_mtbf_h:,.1f} h) = {young_daly_s / 60:.2f} min"
            + (f", raised to a checkpoint's write ({write_s:,.1f} s)" if write_s and write_s > young_daly_s else "")
        )
    else:
        every, source = None, (
            "none by the clock: without one of the trainer's presets in code.hyperparameters the save's blocking "
            "time is unknown (set checkpoints.every_minutes)"
        )

    by_clock_s = every * 60 if every else None
    by_steps_s = steps * step_s if step_s else None
    # the clock's interval where there is one: the steps' at the plan's step time (a floor: FLOPs at STEP_MFU leave
    # out every fixed cost of a step) would count saves a small model does not make
    interval_s = by_clock_s or by_steps_s
    stop_to_saved_s = (
        STOP_REQUEST_POLL_SECONDS + step_s + blocking + 2 * write_s
        if step_s is not None and blocking is not None and write_s is not None else None
    )
    resume_s = medium["resume_s"] if medium else None
    interruptions = devices * hours / gpu_mtbf_hours
    billed = devices * hours
    lost: float | None = None
    if interval_s and blocking is not None and write_s is not None and resume_s is not None and stop_to_saved_s:
        per_gpu_s = (
            hours * 3600 / interval_s * blocking
            + interruptions * (interval_s / 2 + write_s + resume_s)
            + stop_to_saved_s
        )
        lost = devices * per_gpu_s / 3600

    def rounded(value: float | None, digits: int = 1) -> float | None:
        return None if value is None else round(value, digits)

    mtbf_source = (
        GPU_MTBF_SOURCE if gpu_mtbf_hours == GPU_MTBF_HOURS
        else f"the stack's setting {GPU_MTBF_SETTING} (template parameter GpuMtbfHours): {gpu_mtbf_hours:,.0f} h a GPU"
    )
    return {
        "checkpoint_every_minutes": every,
        "checkpoint_blocking_s": rounded(blocking, 3),
        "checkpoint_write_s": rounded(write_s),
        "checkpoint_medium": medium["medium"] if medium else None,
        "checkpoint_interval_s": rounded(interval_s),
        "young_daly_minutes": rounded(young_daly_s / 60 if young_daly_s else None, 2),
        "gpus": devices,
        "gpu_mtbf_hours": round(gpu_mtbf_hours, 1),
        "fleet_mtbf_hours": round(fleet_mtbf_h, 2),
        "step_s": rounded(step_s),
        "stop_request_poll_s": STOP_REQUEST_POLL_SECONDS,
        "stop_to_saved_s": rounded(stop_to_saved_s),
        "stop_wait_s": math.ceil(stop_to_saved_s + STOP_WAIT_MARGIN_S) if stop_to_saved_s is not None else None,
        "resume_read_gb_per_host": rounded(medium["resume_gb_per_host"] if medium else None, 2),
        # on Lustre each rank reads only the parts of the shards it holds (DCP reads by offset), on any mesh
        "resume_read_gb_per_rank": rounded(
            layout.checkpoint_bytes / devices / 1e9 if layout is not None and spec.checkpoints.to_filesystem
            else medium["resume_gb_per_host"] if medium else None, 3),
        "checkpoint_sync_max_gb_per_host": round(sync_max_gb, 1),
        "resume_s": rounded(resume_s),
        "expected_interruptions": round(interruptions, 2),
        "billed_gpu_hours": round(billed, 1),
        "lost_gpu_hours": rounded(lost),
        "fraction": None if lost is None else round(max(0.0, 1 - lost / billed), 4),
        "sources": {
            "checkpoint_every_minutes": source
            + (f"; the trainer also saves every {steps} steps (at least {_figure(by_steps_s)} s at the plan's step "
               "time), whichever comes first" if by_steps_s else ""),
            "checkpoint_blocking_s": "the memory plan: this rank's state copied to host memory at the catalogue's "
            "stage_gbps (an assumption until bench/gpu_check.py measures it)",
            "checkpoint_write_s": medium["source"] if medium else "unknown: no memory plan",
            "gpu_mtbf_hours": mtbf_source,
            "step_s": f"the memory plan's {grad_accum} x {layout.micro_batch_flops / 1e12:,.1f} TFLOP a GPU at "
            f"{STEP_MFU_SOURCE}" if layout and step_s else "unknown: no memory plan or no GPU peak",
            "stop_request_poll_s": "the trainer's read of the run's stop request (trainer/lustrain_trainer/stopping.py)",
            "stop_to_saved_s": "the poll, the step in flight, the save's blocking time and two writes (the one in "
            "flight, then the stop's own)",
            "stop_wait_s": f"stop_to_saved_s + {STOP_WAIT_MARGIN_S} s for what is not counted (checkpoint planning "
            "over every rank, staging buffers' allocation)",
            "resume_read_gb_per_rank": "on Lustre, the rank's share of the checkpoint: the same mesh reads its own "
            "shards (bench/goodput.py's resume_read_ratio), a new mesh the parts of several it now holds, the same "
            "bytes (DCP reads by offset); through SageMaker's sync every host gets the whole prefix first",
            "checkpoint_sync_max_gb_per_host": f"SYNC_RESUME_MAX_S ({SYNC_RESUME_MAX_S} s of a restart in SageMaker's "
            "checkpoint sync) at its rate: a larger checkpoint prefix is refused without checkpoints.to_filesystem",
            "resume_s": "the checkpoint's read from instances ready to the first step, at the medium's rate; the "
            "image's pull and torchrun's rendezvous are not counted (no published figure)",
            "expected_interruptions": "GPUs x compute.max_runtime_hours / gpu_mtbf_hours (spot reclaims not "
            "counted)",
            "lost_gpu_hours": "every save's blocking time; per interruption half an interval, a write and resume_s; "
            "the final stop's stop_to_saved_s",
            "fraction": "1 - lost_gpu_hours / billed_gpu_hours (every GPU for compute.max_runtime_hours, as the cost)",
        },
    }


def trainer_checkpoint_every_minutes(goodput: dict[str, Any] | None) -> float | None:
    """The checkpoint interval by the clock the trainer is passed (checkpoint_every_minutes), from the plan's goodput:
    None where the plan has none (the spec names none of the trainer's presets and sets no checkpoints.every_minutes:
    its entry point may not be lustrain's trainer)."""
    if not goodput:
        return None
    every = goodput.get("checkpoint_every_minutes")
    return float(every) if every else None


def instance_summary(itype: InstanceType) -> dict[str, Any]:
    """The catalogue row's figures the plan rests on, as `lustrain plan --json` shows them."""
    return {
        "instance_type": itype.name,
        "gpus": itype.gpus,
        "gpu": itype.gpu,
        "gpu_memory_gib": itype.gpu_memory_gib,
        "bf16_dense_tflops_per_gpu": itype.bf16_dense_tflops_per_gpu,
        "efa_interfaces": itype.efa_interfaces,
        "ips_per_instance": itype.ips,
        "local_nvme_gb": itype.local_nvme_gb,
        "usable_output_gib": itype.usable_output_gib,
        "hourly_usd": itype.hourly_usd,
        "price_as_of": itype.price_as_of,
        "price_source": itype.price_source,
        "quota_names": asdict(itype.quota_names),
        "unconfirmed": list(itype.unconfirmed),
    }


def _plan_memory(
    spec: JobSpec, errors: list[FieldError]
) -> tuple[dict[str, Any] | None, trainer_plan.Plan | None]:
    """The trainer's memory plan for the spec's hyperparameters, when they name one of its presets and the instance
    type is one the plan knows, as `lustrain plan` shows it and as the trainer's plan computed it (unrounded, for
    plan_goodput); a model that cannot fit its instances is refused, naming the smallest count that fits. The same
    numbers as `train.py --dry_run`."""
    named = str({str(k).replace("-", "_"): v for k, v in dict(spec.code.hyperparameters).items()}.get("preset", ""))
    if named in trainer_presets.RENAMED:
        # the trainer refuses it at its start, with the instances billing: refused here, before anything exists
        errors.append(FieldError("code.hyperparameters.preset", named, trainer_presets.renamed(named)))
        return None, None
    inputs = trainer_presets.plan_inputs(dict(spec.code.hyperparameters))
    if inputs is None or spec.compute.instance_type not in trainer_plan.INSTANCES:
        return None, None
    try:
        layout = trainer_plan.plan_of_run(inputs, spec.compute.instance_type, spec.compute.instance_count)
    except ValueError as exc:
        errors.append(FieldError("code.hyperparameters.shard_group", inputs["shard_group"], str(exc)))
        return None, None
    memory = dict(line.split("=", 1) for line in layout.lines())
    if not layout.fits:
        enough = trainer_plan.smallest_fitting_count(inputs, spec.compute.instance_type)
        fix = (f"use at least {enough} instances (the smallest count it fits)" if enough
               else "no count of this instance type fits it")
        errors.append(FieldError(
            "compute.instance_count", spec.compute.instance_count,
            f"the {inputs['preset']} model ({layout.parameters:,} parameters) needs "
            f"{layout.peak_bytes / trainer_plan.GIB:.1f} GiB per GPU on {spec.compute.instance_count} x "
            f"{spec.compute.instance_type} ({memory['sharding']}, shard group {layout.shard}), more than the "
            f"{trainer_plan.USABLE_GPU_SHARE * layout.gpu_bytes / trainer_plan.GIB:.1f} GiB a GPU can give: {fix}, "
            "or change code.hyperparameters (a smaller preset, batch_size, activation_checkpointing true)"))
    return memory, layout


def _plan_filesystem(
    spec: JobSpec,
    itype: InstanceType,
    data_gib: float | None,
    extension_bytes: dict[str, int] | None,
    prices: PriceTable,
    errors: list[FieldError],
    warnings: list[str],
    memory: dict[str, Any] | None = None,
) -> FilesystemPlan:
    f = spec.filesystem
    kind = "SCRATCH_2" if f.deployment_type == "scratch" else "PERSISTENT_2"
    devices = max(itype.gpus, 1)
    ingest = spec.compute.instance_count * devices * spec.data.ingest_mb_s_per_gpu
    checkpoints = _plan_checkpoints(spec, memory, warnings)
    burst = checkpoints["burst_mb_s"] if checkpoints else 0.0
    # a checkpoint is written in the background while training goes on reading its data: both at once
    demand = ingest + burst
    if f.file_system_id:
        return FilesystemPlan(
            kind,
            None,
            None,
            None,
            None,
            demand,
            data_gib or spec.data.size_gib,
            None,
            f.compression.upper(),
            f.file_system_id,
            f"reusing {f.file_system_id}: capacity and throughput are that file system's",
        )

    data = data_gib if data_gib is not None else spec.data.size_gib
    if data is None:
        warnings.append(
            "data.size_gib is not set: the data is measured in S3 when the run starts and sized then"
        )
    ratio = _compression_ratio(f.compression, extension_bytes)
    stored = (data or 0.0) / ratio
    output_on_fs = spec.output.expected_size_gib if spec.output.to_filesystem else 0.0
    checkpoints_gib = checkpoints["kept_gib"] if checkpoints else 0.0
    need_gib = (stored + output_on_fs + checkpoints_gib) * (1 + FS_FREE_FRACTION)

    tiers = [SCRATCH_MB_S_PER_TIB] if kind == "SCRATCH_2" else list(PERSISTENT_THROUGHPUTS)
    if f.throughput_per_tib != "auto":
        if f.throughput_per_tib not in PERSISTENT_THROUGHPUTS:
            errors.append(
                FieldError(
                    "filesystem.throughput_per_tib",
                    f.throughput_per_tib,
                    f"PERSISTENT_2 takes 125, 250, 500 or 1000 MB/s per TiB; nearest: "
                    f"{_neighbours(f.throughput_per_tib, list(PERSISTENT_THROUGHPUTS))}",
                )
            )
            tiers = list(PERSISTENT_THROUGHPUTS)
        else:
            tiers = [f.throughput_per_tib]

    if f.storage_gib != "auto":
        valid = valid_capacities(f.storage_gib)
        if f.storage_gib not in valid:
            errors.append(
                FieldError(
                    "filesystem.storage_gib",
                    f.storage_gib,
                    f"{kind} capacity must be 1200, 2400 or a multiple of 2400 GiB; nearest valid: "
                    f"{_neighbours(f.storage_gib, [*valid, valid[-1] + 2400])}",
                )
            )
            capacity = smallest_capacity(f.storage_gib)
        else:
            capacity = f.storage_gib
        if capacity < need_gib:
            errors.append(
                FieldError(
                    "filesystem.storage_gib",
                    f.storage_gib,
                    f"too small: the data needs {need_gib:,.0f} GiB ({stored:,.0f} GiB stored after "
                    f"{f.compression} compression, plus output, {checkpoints_gib:,.0f} GiB of checkpoints and "
                    f"{FS_FREE_FRACTION:.0%} free); "
                    f"the smallest that fits is {smallest_capacity(need_gib)}",
                )
            )
        per_tib = min(tiers, key=lambda t: (capacity * t / 1024 < demand, prices.fsx_gb_month_usd[(kind, t)]))
        throughput = capacity * per_tib / 1024
        if throughput < demand:
            warnings.append(
                f"file system throughput {throughput:,.0f} MB/s is below the GPUs' demand of {demand:,.0f} MB/s: "
                "GPUs will wait on data (raise filesystem.storage_gib or throughput_per_tib)"
            )
        reason = f"{capacity} GiB as given at {per_tib} MB/s per TiB"
        decided_by = "as given"
    else:
        cheapest = _cheapest(kind, need_gib, demand, prices, spec.compute.max_runtime_hours, tiers)
        capacity, per_tib = cheapest["storage_gib"], cheapest["throughput_per_tib"]
        throughput = capacity * per_tib / 1024
        for_throughput = demand * 1024 / per_tib
        if max(need_gib, for_throughput) <= 1200:
            by = "the smallest capacity FSx offers"
        elif for_throughput > need_gib:
            by = "checkpoint bursts" if burst > ingest else "data ingest"
        else:
            by = "checkpoints kept" if checkpoints_gib > stored + output_on_fs else "the data"
        decided_by = by
        serves = f"{demand:,.0f} MB/s" + (
            f" ({ingest:,.0f} MB/s of data ingest + {burst:,.0f} MB/s of checkpoint bursts)" if burst else ""
        )
        reason = (
            f"cheapest {kind} that holds {need_gib:,.0f} GiB and serves {serves}: "
            f"{capacity} GiB at {per_tib} MB/s/TiB = {throughput:,.0f} MB/s, sized by "
            + (f"throughput for {by}" if for_throughput > need_gib and by != "the smallest capacity FSx offers" else by)
        )
    if capacity > MAX_STORAGE_GIB:
        errors.append(
            FieldError(
                "data.size_gib",
                data,
                f"the run needs {capacity:,} GiB of Lustre, more than one FSx for Lustre file system holds "
                f"({MAX_STORAGE_GIB:,} GiB): split the data into runs",
            )
        )
    alternatives = [
        _cheapest(other, need_gib, demand, prices, spec.compute.max_runtime_hours)
        for other in ("SCRATCH_2", "PERSISTENT_2")
    ]
    return FilesystemPlan(
        alternatives=alternatives,
        deployment_type=kind,
        storage_gib=capacity,
        throughput_per_tib=per_tib,
        per_unit_storage_throughput=per_tib if kind == "PERSISTENT_2" else None,
        throughput_mb_s=round(throughput, 1),
        demand_mb_s=round(demand, 1),
        data_gib=data,
        stored_gib=round(stored, 1) if data is not None else None,
        compression=f.compression.upper(),
        reuse_file_system_id=None,
        reason=reason,
        checkpoints=checkpoints,
        decided_by=decided_by,
    )


def _plan_checkpoints(spec: JobSpec, memory: dict[str, Any] | None, warnings: list[str]) -> dict[str, Any] | None:
    """checkpoints.to_filesystem's share of the file system: the checkpoints it holds at once (the kept ones and
    the one being written, which the trainer prunes the oldest after) and the throughput that writes one within
    CHECKPOINT_WRITE_TARGET_S. The size is the trainer's memory plan's (12 bytes a parameter: fp32 weights and
    both Adam moments; a 70B model's is about 840 GB); without one (a script that is not lustrain's trainer, or
    no preset) the checkpoints are not sized and the plan says so."""
    if not spec.checkpoints.to_filesystem:
        return None
    if memory is None or "checkpoint_gb" not in memory:
        warnings.append(
            "checkpoints.to_filesystem: the checkpoints' size is unknown (code.hyperparameters name none of the "
            "trainer's presets), so Lustre is sized for the data alone: set filesystem.storage_gib to hold the "
            "checkpoints kept"
        )
        return None
    state_gb = float(memory["checkpoint_gb"])
    raw = str(dict(spec.code.hyperparameters).get("keep_checkpoints", TRAINER_KEEP_CHECKPOINTS))
    try:
        keep = max(1, int(float(raw)))
    except ValueError:
        keep = TRAINER_KEEP_CHECKPOINTS
    held = keep + 1
    state_gib = state_gb * 1e9 / 2**30
    return {
        "state_gb": round(state_gb, 1),
        "kept": keep,
        "held_at_once": held,
        "kept_gib": round(held * state_gib, 1),
        "target_write_s": CHECKPOINT_WRITE_TARGET_S,
        "burst_mb_s": round(state_gb * 1e3 / CHECKPOINT_WRITE_TARGET_S, 1),
    }


def _cheapest(
    kind: str, need_gib: float, demand: float, prices: PriceTable, hours: float, tiers: list[int] | None = None
) -> dict[str, Any]:
    """The cheapest file system of `kind` (among throughput `tiers`, default all of the kind's) that holds `need_gib`
    and serves `demand` MB/s: its capacity, throughput tier, throughput, private IPs and cost for a run of `hours`
    (plus about an hour to create and delete it)."""
    if tiers is None:
        tiers = [SCRATCH_MB_S_PER_TIB] if kind == "SCRATCH_2" else list(PERSISTENT_THROUGHPUTS)
    options = []
    for tier in tiers:
        capacity = smallest_capacity(max(need_gib, demand * 1024 / tier))
        options.append((capacity * prices.fsx_gb_month_usd[(kind, tier)], capacity, tier))
    _, capacity, tier = min(options)
    monthly = capacity * 2**30 / 1e9 * prices.fsx_gb_month_usd[(kind, tier)]
    return {
        "deployment_type": kind,
        "storage_gib": capacity,
        "throughput_per_tib": tier,
        "throughput_mb_s": round(capacity * tier / 1024, 1),
        "ips": lustre_ips(capacity),
        "cost_usd": round(monthly * (hours + 1) / prices.hours_per_month, 2),
    }


def _compression_ratio(compression: str, extension_bytes: dict[str, int] | None) -> float:
    if compression == "none":
        return 1.0
    if not extension_bytes:
        return LZ4_RATIO
    total = sum(extension_bytes.values()) or 1
    incompressible = sum(b for ext, b in extension_bytes.items() if ext.lower() in INCOMPRESSIBLE)
    # stored bytes = compressible/LZ4_RATIO + incompressible; the ratio is data over stored
    stored = (total - incompressible) / LZ4_RATIO + incompressible
    return total / stored


def _plan_network(
    spec: JobSpec, itype: InstanceType, fs: FilesystemPlan, errors: list[FieldError]
) -> NetworkPlan:
    n = spec.network
    for_instances = spec.compute.instance_count * itype.ips
    for_fs = lustre_ips(fs.storage_gib) if fs.storage_gib and not fs.reuse_file_system_id else 0
    headroom = max(5, math.ceil(0.1 * (for_instances + for_fs)))
    needed = for_instances + for_fs + headroom
    if n.subnet_id:
        return NetworkPlan(
            itype.ips, for_instances, for_fs, headroom, needed, None, None, None, None, n.subnet_id,
            itype.efa_interfaces,
        )

    vpc = ipaddress.IPv4Network(n.vpc_cidr)
    fits = [p for p in range(28, vpc.prefixlen - 1, -1) if usable_ips(p) >= needed]
    best = fits[0] if fits else None
    if n.subnet_prefix_length == "auto":
        prefix = best
        if prefix is None:
            errors.append(
                FieldError(
                    "network.vpc_cidr",
                    n.vpc_cidr,
                    f"too small: the run needs {needed} IPs and a /{vpc.prefixlen} holds "
                    f"{usable_ips(vpc.prefixlen)} usable; use a larger block, e.g. /{_prefix_for(needed)} or wider",
                )
            )
    else:
        prefix = n.subnet_prefix_length
        if prefix < vpc.prefixlen:
            errors.append(
                FieldError(
                    "network.subnet_prefix_length",
                    prefix,
                    f"a /{prefix} subnet does not fit inside network.vpc_cidr {n.vpc_cidr}",
                )
            )
            prefix = None
        elif usable_ips(prefix) < needed:
            errors.append(
                FieldError(
                    "network.subnet_prefix_length",
                    prefix,
                    f"a /{prefix} has {usable_ips(prefix)} usable addresses; this run needs {needed} "
                    f"({spec.compute.instance_count} x {itype.ips} for instances + {for_fs} for Lustre + "
                    f"{headroom} headroom): use /{_prefix_for(needed)} or a lower prefix length (or auto)",
                )
            )
    subnet = str(next(vpc.subnets(new_prefix=prefix))) if prefix is not None else None
    return NetworkPlan(
        itype.ips,
        for_instances,
        for_fs,
        headroom,
        needed,
        prefix,
        usable_ips(prefix) if prefix is not None else None,
        n.vpc_cidr,
        subnet,
        None,
        itype.efa_interfaces,
    )


def _prefix_for(needed: int) -> int:
    return next(p for p in range(28, 0, -1) if usable_ips(p) >= needed)


#: a model above this is uploaded uncompressed unless output.compression says otherwise (output_compression)
GZIP_MAX_MODEL_GIB = 10.0
#: the bytes per parameter of the model lustrain's trainer writes to /opt/ml/model (fp32 weights)
MODEL_BYTES_PER_PARAMETER = 4


def model_bytes(spec: JobSpec, memory: dict[str, Any] | None) -> tuple[int, str]:
    """The model's size as the planner knows it, and whence: the trainer preset's parameters (fp32 weights) when
    the memory plan knows the model, else output.expected_size_gib."""
    if memory and str(memory.get("parameters", "")).isdigit():
        parameters = int(memory["parameters"])
        return (
            parameters * MODEL_BYTES_PER_PARAMETER,
            f"{parameters:,} parameters x {MODEL_BYTES_PER_PARAMETER} bytes",
        )
    return int(spec.output.expected_size_gib * 2**30), "output.expected_size_gib"


def output_compression(spec: JobSpec, size: int, source: str) -> tuple[str, str]:
    """OutputDataConfig.CompressionType, and why. SageMaker tars and gzips /opt/ml/model on one instance before
    it uploads it, one stream at a time, while every instance of the job bills; model weights hardly compress.
    Above GZIP_MAX_MODEL_GIB that costs the fleet minutes to hours (hundreds of GB), so the model goes up as its
    files (NONE: a prefix of files, uploaded in parallel); below, one model.tar.gz is handier and quick."""
    gib = size / 2**30
    if spec.output.compression is not None:
        return spec.output.compression.upper(), f"output.compression: {spec.output.compression}"
    if gib > GZIP_MAX_MODEL_GIB:
        return "NONE", (
            f"the model is about {gib:,.1f} GiB ({source}), above {GZIP_MAX_MODEL_GIB:g} GiB: uploaded as its files, "
            "not tarred and gzipped on one instance while the fleet bills (set output.compression: gzip for one "
            "model.tar.gz)"
        )
    return "GZIP", f"the model is about {gib:,.1f} GiB ({source}): one model.tar.gz"


def _plan_output(
    spec: JobSpec, itype: InstanceType, errors: list[FieldError], memory: dict[str, Any] | None = None
) -> dict[str, Any]:
    o = spec.output
    size, source = model_bytes(spec, memory)
    compression, why = output_compression(spec, size, source)
    if o.expected_size_gib > itype.usable_output_gib and not o.to_filesystem:
        errors.append(
            FieldError(
                "output.expected_size_gib",
                o.expected_size_gib,
                f"above the {itype.usable_output_gib:,.0f} GiB of local storage usable for output on "
                f"{spec.compute.instance_type}: set output.to_filesystem: true to write results to Lustre "
                "and export them to S3",
            )
        )
    return {
        "s3_uri": o.s3_uri,
        "expected_size_gib": o.expected_size_gib,
        "local_usable_gib": round(itype.usable_output_gib, 1),
        "to_filesystem": o.to_filesystem,
        "model_bytes": size,
        "compression": compression,
        "compression_why": why,
        # each run's own: register_job appends its job id (launch.checkpoint_location)
        "checkpoints_s3_uri": f"{spec.checkpoints_base.rstrip('/')}/<job id>/checkpoints/",
    }


def _fs_monthly_usd(fs: FilesystemPlan, prices: PriceTable) -> float:
    if fs.storage_gib is None or fs.throughput_per_tib is None:
        return 0.0
    gb = fs.storage_gib * 2**30 / 1e9
    return gb * prices.fsx_gb_month_usd[(fs.deployment_type, fs.throughput_per_tib)]


def _plan_cost(spec: JobSpec, itype: InstanceType, fs: FilesystemPlan, prices: PriceTable) -> CostPlan:
    c = spec.compute
    hours = c.max_runtime_hours
    fraction = prices.spot_price_fraction if c.spot else 1.0
    hourly = itype.hourly_usd or 0.0  # a type without a price: plan() makes the parts that need it unknown
    compute = c.instance_count * hourly * hours * fraction
    # the file system lives about as long as the training job, plus its creation and teardown (~1 h)
    filesystem = _fs_monthly_usd(fs, prices) * (hours + 1) / prices.hours_per_month
    control = (
        STATE_TRANSITIONS_PER_RUN * prices.sfn_per_transition_usd
        + LAMBDA_INVOCATIONS_PER_RUN * prices.lambda_per_request_usd
    )
    assumptions = [
        f"{c.instance_count} x {c.instance_type} at ${hourly}/h (as of {itype.price_as_of}) for the full "
        f"max_runtime_hours ({hours} h)",
        f"file system for {hours + 1:g} h",
    ]
    if c.spot:
        assumptions.append(f"managed spot at {prices.spot_price_fraction:.0%} of on-demand (varies)")
    network, network_hourly = _endpoints_cost(spec, hours, prices, assumptions)
    warm_pool = c.instance_count * hourly * c.keep_alive_minutes / 60
    if c.keep_alive_minutes:
        assumptions.append(
            f"a warm pool of {c.instance_count} x {c.instance_type} kept {c.keep_alive_minutes} min after the job"
        )
    total = compute + filesystem + control + network + warm_pool
    return CostPlan(
        compute_usd=round(compute, 2),
        filesystem_usd=round(filesystem, 2),
        control_plane_usd=round(control, 4),
        total_usd=round(total, 2),
        hourly_usd=round(
            c.instance_count * hourly * fraction + filesystem / (hours + 1) + network_hourly, 2
        ),
        prices_as_of=prices.as_of,
        assumptions=assumptions,
        network_usd=round(network, 2),
        warm_pool_usd=round(warm_pool, 2),
    )


def unpriced(cost: CostPlan, spec: JobSpec) -> CostPlan:
    """The cost of a run on an instance type with no confirmed price: the parts that need it unknown (None), the
    file system, network and control plane as planned."""
    c = spec.compute
    return replace(
        cost,
        compute_usd=None,
        total_usd=None,
        hourly_usd=None,
        warm_pool_usd=None if c.keep_alive_minutes else 0.0,
        assumptions=[
            f"{c.instance_count} x {c.instance_type}: no confirmed on-demand price, so the instances' cost is unknown",
            *cost.assumptions[1:],
        ],
    )


def _endpoints_cost(
    spec: JobSpec, hours: float, prices: PriceTable, assumptions: list[str]
) -> tuple[float, float]:
    """(the run's, the hour's) cost of code.secrets' interface endpoints: one per service, in the run's one zone,
    billed by the started hour for as long as the network lives (the run, plus about an hour to build and tear
    down); an existing network's endpoints are not the run's. The GBs they carry are a few KB per job start."""
    services = [] if spec.network.subnet_id else spec.code.secret_services
    if not services:
        return 0.0, 0.0
    hourly = len(services) * prices.interface_endpoint_az_hour_usd
    billed_hours = math.ceil(hours + 1)
    assumptions.append(
        f"{len(services)} interface endpoint(s) for code.secrets ({', '.join(services)}) at "
        f"${prices.interface_endpoint_az_hour_usd}/AZ-hour (${hourly:g}/h) for {billed_hours} h, plus "
        f"${prices.interface_endpoint_gb_usd}/GB carried"
    )
    return hourly * billed_hours, hourly


def _recommend(spec: JobSpec, fs: FilesystemPlan) -> dict[str, Any]:
    """Scratch or persistent, for reasons true of the plan's own figures: the cost of each for this run, the IPs,
    surviving a file-server failure (PERSISTENT_2 replicates, SCRATCH_2 does not), the run's length, `keep`."""
    hours = spec.compute.max_runtime_hours
    by_kind = {a["deployment_type"]: a for a in fs.alternatives}
    scratch, persistent = by_kind.get("SCRATCH_2"), by_kind.get("PERSISTENT_2")
    if scratch is None or persistent is None:
        return {"deployment_type": spec.filesystem.deployment_type, "why": fs.reason}
    figures = (
        f"for this run persistent {persistent['storage_gib']:,} GiB at {persistent['throughput_per_tib']} MB/s/TiB "
        f"costs ${persistent['cost_usd']:,.2f} and takes {persistent['ips']} IPs, scratch {scratch['storage_gib']:,} "
        f"GiB ${scratch['cost_usd']:,.2f} and {scratch['ips']} IPs"
    )
    cheaper = "persistent" if persistent["cost_usd"] <= scratch["cost_usd"] else "scratch"
    if spec.filesystem.keep:
        choice, why = "persistent", "the file system is kept after the run (keep), and only PERSISTENT_2 survives a file-server failure"
    elif hours > PERSISTENT_AFTER_HOURS:
        choice, why = "persistent", (
            f"a {hours:g} h run should survive a file-server failure (PERSISTENT_2 replicates; SCRATCH_2 loses its "
            "data and must be rebuilt from S3)"
        )
    elif cheaper == "persistent":
        choice, why = "persistent", "it costs no more, and it survives a file-server failure"
    else:
        choice, why = "scratch", f"it costs less, and a {hours:g} h run can rebuild its file system from S3 after a failure"
    return {"deployment_type": choice, "why": f"{choice} recommended: {why}; {figures}"}


def _neighbours(value: int, valid: list[int]) -> str:
    below = [v for v in valid if v < value]
    above = [v for v in valid if v > value]
    parts = ([str(below[-1])] if below else []) + ([str(above[0])] if above else [])
    return " or ".join(parts)
