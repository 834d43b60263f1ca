"""Data preparation on SageMaker Processing: what a preparation run is made of, decided purely.

`lustrain data prepare s3://SRC s3://OUT --instances N` runs lustrain_trainer.prepare (the trainer package, shipped
as the job's code as for training) in the stages of its contract, each a SageMaker Processing job in the run's
private subnet, one after the other:

1. plan (1 instance): lists SRC, trains the BPE once where the tokenizer is bpe:VOCAB, writes a file list per part
   (OUT/plan/files-PPPPP.json), OUT/tokenizer.json and OUT/prepare-plan.json (the parts and totals). One instance, not the CLI or a Lambda: training a BPE on its sample takes minutes and
   needs `tokenizers` (the image has it, a Lambda does not), and the caller's machine may be far from the data.
2. work (N instances, `--worker auto`): each instance tokenizes the parts p with p % N == its position in the
   sorted hosts of /opt/ml/config/resourceconfig.json, reading its files from S3 itself (a corpus is never copied
   whole to every instance) and writing each part's shards and parts/part-NNNNN.json to OUT.
3. merge (1 instance): checks every part is whole and writes OUT/index.json.

Why Processing and not a training job: a processing job is billed and limited as data work (its own instance
quotas, "ml.<type> for processing job usage"), takes any command as its entry point, and gives every instance
/opt/ml/config/resourceconfig.json, which is how a worker knows its share without a coordinator.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lustrain_core.errors import SpecInvalid
from lustrain_core.planner import usable_ips
from lustrain_core.prices import PriceTable
from lustrain_core.trainer.prepare_estimate import PrepareEstimate, estimate_prepare

if TYPE_CHECKING:
    from lustrain_core.spec import PrepareSpec

#: The stages of a preparation run, in order; plan and merge are small: one instance each, whatever --instances says
STAGES = ("plan", "work", "merge")
SINGLE_INSTANCE_STAGES = frozenset({"plan", "merge"})
#: in the instance catalogue (data/instance_types.json), so that `lustrain plan` can price it
DEFAULT_INSTANCE_TYPE = "ml.c5.xlarge"
#: the instance's volume holds the code, the tokenizer's sample and the shards in flight (a shard is 256 MiB)
VOLUME_GIB = 100
#: the longest one stage may run (botocore's ProcessingMaxRuntimeInSeconds allows 1..777600): a stage estimated
#: longer is refused before anything is created (check_stage_runtimes), not stopped by SageMaker a day in
MAX_RUNTIME_SECONDS = 24 * 3600
#: CreateProcessingJob's InstanceCount allows 1..100 (botocore's model; the spec's `instances` says the same)
MAX_INSTANCES = 100
#: Where the code is unpacked in the container, and its entry point: the bundle is upload_code's sourcedir.tar.gz
#: (a ProcessingInput is copied, not unpacked); each item of ContainerEntrypoint is at most 256 characters.
CODE_DIR = "/opt/ml/processing/input/code"
#: The preparation's scratch files (the plan's spilled listing and file lists, a large object staged to be read in
#: chunks: about 15 GB at 10^8 files) go to TMPDIR, here on the job's storage volume (VOLUME_GIB, where SageMaker
#: puts what lies under /opt/ml/processing) rather than the container's own small disk
SCRATCH_DIR = "/opt/ml/processing/scratch"
RESOURCE_CONFIG = "/opt/ml/config/resourceconfig.json"
ENTRY_SCRIPT = (
    'code="$1"; export TMPDIR="$2"; shift 2; mkdir -p "$TMPDIR" || exit 1; '
    'tar -xzf "$code/sourcedir.tar.gz" -C "$code" || exit 1; '
    'PYTHONPATH="$code${PYTHONPATH:+:$PYTHONPATH}" exec python3 -m lustrain_trainer.prepare "$@"'
)
ENTRYPOINT = ["/bin/sh", "-c", ENTRY_SCRIPT, "prepare", CODE_DIR, SCRATCH_DIR]
#: A processing job's start (provisioning the instances, pulling the image) and end, per stage: not in the
#: preparation's own estimate (prepare_estimate), which times the work alone. A round figure, not measured.
STAGE_OVERHEAD_SECONDS = 300
#: The run's own network (create_network): a VPC of the training runs' default block, and a private subnet with an
#: address per instance (a processing job's instance has one network interface in it) and headroom as the planner
#: leaves for training (at least 5, or a tenth)
VPC_CIDR = "10.80.0.0/16"
#: The file the code bundle must hold: the preparation's module, at the package's path (ENTRY_SCRIPT runs it)
ENTRY_MODULE_FILE = "lustrain_trainer/prepare.py"
#: vCPUs of an instance of these families: 2 for .large, 4 for .xlarge, 4N for .Nxlarge (the EC2 instance types'
#: published sizes); the BPE encodes on every core
_VCPU_FAMILIES = frozenset({"c5", "c6i", "c7i", "m5", "m6i", "m7i", "r5", "r6i", "r7i"})


@dataclass(frozen=True)
class PrepareRun:
    """What one preparation run is: where from, where to, how, on what."""

    job_id: str
    source: str
    output: str
    tokenizer: str = "bytes"
    instances: int = 1
    instance_type: str = DEFAULT_INSTANCE_TYPE
    #: bytes per shard and per part of the work (prepare's --shard-size; None: its default, 256 MiB)
    shard_size: int | None = None

    @property
    def stages(self) -> tuple[str, ...]:
        return STAGES

    def instances_of(self, stage: str) -> int:
        return 1 if stage in SINGLE_INSTANCE_STAGES else self.instances

    def job_name(self, stage: str) -> str:
        """The stage's processing job name: the run's id and the stage ([a-zA-Z0-9](-*[a-zA-Z0-9]){0,62})."""
        suffix = f"-prep-{stage}"
        return f"{self.job_id[: 63 - len(suffix)].rstrip('-')}{suffix}"

    def arguments(self, stage: str) -> list[str]:
        """lustrain_trainer.prepare's arguments for the stage (the contract's command lines)."""
        common = [self.source, self.output]
        if stage == "plan":
            sized = ["--shard-size", str(self.shard_size)] if self.shard_size else []
            return [*common, "--stage", "plan", "--tokenizer", self.tokenizer, *sized]
        if stage == "work":
            return [
                *common,
                "--stage",
                "work",
                "--worker",
                "auto",
                "--workers",
                str(self.instances),
                "--resource-config",
                RESOURCE_CONFIG,
            ]
        if stage == "merge":
            return [*common, "--stage", "merge"]
        raise ValueError(f"unknown stage {stage!r}: one of {', '.join(STAGES)}")


def subnet_cidr(instances: int, vpc_cidr: str = VPC_CIDR) -> str:
    """The run's private subnet: the first block of the VPC large enough for its instances and headroom."""
    needed = instances + max(5, math.ceil(0.1 * instances))
    vpc = ipaddress.IPv4Network(vpc_cidr)
    prefix = next(p for p in range(28, vpc.prefixlen - 1, -1) if usable_ips(p) >= needed)
    return str(next(vpc.subnets(new_prefix=prefix)))


def next_stage(run: PrepareRun, done: list[str]) -> str | None:
    """The stage to run after those `done`, or None when the run is over."""
    for stage in run.stages:
        if stage not in done:
            return stage
    return None


def vcpus_of(instance_type: str) -> int | None:
    """The instance's vCPUs for the families whose sizes follow EC2's rule; None for any other (the estimate then
    uses the rate it measured, on 2 cores: a low figure)."""
    found = re.fullmatch(r"ml\.([a-z0-9]+)\.(\d*)(x?large)", instance_type)
    if found is None or found[1] not in _VCPU_FAMILIES:
        return None
    if found[3] == "large":
        return 2
    return 4 * int(found[2] or 1)


def _stage_seconds(found: PrepareEstimate) -> dict[str, float]:
    """Each stage's own run time, what its MaxRuntimeInSeconds bounds (the work stage's: its slowest instance)."""
    return {"plan": found.plan_seconds, "work": found.work_seconds, "merge": found.merge_seconds}


def plan_of(
    name: str, tokenizer: str, instances: int, instance_type: str, source_gib: float, hourly_usd: float | None
) -> dict[str, object]:
    """`lustrain plan` of a kind: prepare spec: its stages, wall time, instance-hours and cost, from the
    preparation's own estimate (lustrain_core.trainer.prepare_estimate, a copy of the trainer's) plus each stage's
    start; `too_long` says why the run cannot be started as it is (a stage over MAX_RUNTIME_SECONDS), else None."""
    vcpus = vcpus_of(instance_type)
    found = estimate_prepare(int(source_gib * 2**30), tokenizer, instances, vcpus)
    overhead = STAGE_OVERHEAD_SECONDS
    seconds = found.seconds + overhead * len(STAGES)
    instance_seconds = (
        found.plan_seconds + found.merge_seconds + found.work_seconds * instances + overhead * (instances + 2)
    )
    instance_hours = instance_seconds / 3600
    stage_seconds = _stage_seconds(found)
    return {
        "name": name,
        "kind": "prepare",
        "stages": [f"{stage} x{1 if stage in SINGLE_INSTANCE_STAGES else instances}" for stage in STAGES],
        "instance_type": instance_type,
        "instances": instances,
        "tokenizer": tokenizer,
        "source_gib": source_gib,
        "parts": found.parts,
        "wall_hours": round(seconds / 3600, 2),
        "stage_hours": {stage: round(s / 3600, 2) for stage, s in stage_seconds.items()},
        "too_long": _too_long(stage_seconds, tokenizer, instances, vcpus, int(source_gib * 2**30)),
        "instance_hours": round(instance_hours, 2),
        "cost_usd": None if hourly_usd is None else round(instance_hours * hourly_usd, 2),
        "instance_bytes_per_s": found.instance_bytes_per_s,
        "rate_source": found.rate_source,
    }


def _too_long(
    stage_seconds: dict[str, float], tokenizer: str, instances: int, vcpus: int | None, text_bytes: int
) -> dict[str, str] | None:
    """{"field", "message"} where a stage's estimate is over MAX_RUNTIME_SECONDS: the work stage names the fewest
    instances that bring it under (the plan and merge stages run on one instance whatever `instances` says)."""
    limit_h = MAX_RUNTIME_SECONDS / 3600
    for stage, seconds in stage_seconds.items():
        if seconds <= MAX_RUNTIME_SECONDS:
            continue
        said = f"its {stage} stage is estimated at {seconds / 3600:,.1f} h, over the {limit_h:.0f} h a stage may run"
        if stage != "work":
            return {
                "field": "source",
                "message": f"{said} on its one instance: split the source into several runs",
            }
        enough = next(
            (
                n
                for n in range(instances + 1, MAX_INSTANCES + 1)
                if estimate_prepare(text_bytes, tokenizer, n, vcpus).work_seconds <= MAX_RUNTIME_SECONDS
            ),
            None,
        )
        if enough is None:
            most = f", and would be on {MAX_INSTANCES}" if instances < MAX_INSTANCES else ""
            # the BPE encodes on every core; the byte tokenizer's rate does not grow with them
            fastest = estimate_prepare(text_bytes, tokenizer, MAX_INSTANCES, vcpus).work_seconds
            scales = estimate_prepare(text_bytes, tokenizer, MAX_INSTANCES, 2 * (vcpus or 2)).work_seconds < fastest
            advice = (
                "use an instance_type with more vCPUs (the work scales with them) or split the source into several runs"
                if scales
                else "split the source into several runs"
            )
            return {"field": "instances", "message": f"{said} on {instances} instances{most}: {advice}"}
        return {"field": "instances", "message": f"{said} on {instances}: use at least {enough} instances"}
    return None


def entry_module_missing(code: str) -> SpecInvalid:
    """The refusal of a `code` prefix without the preparation's module (register_job and upload_code check it)."""
    return SpecInvalid.one(
        "code",
        code,
        f"holds no {ENTRY_MODULE_FILE}: the trainer package (trainer/ of lustrain), with lustrain_trainer/ at the "
        "prefix's root",
    )


def check_stage_runtimes(plan: dict[str, object]) -> None:
    """SpecInvalid, naming the field to change, where plan_of found a stage too long to run (`too_long`)."""
    found = plan.get("too_long")
    if isinstance(found, dict):
        field = str(found["field"])
        raise SpecInvalid.one(field, plan.get(field, plan.get("source_gib")), str(found["message"]))


def planned(spec: PrepareSpec, source_gib: float, prices: PriceTable | None = None) -> dict[str, object]:
    """plan_of a spec at the price table's list prices (the package's own table unless given): what `lustrain plan`
    prints, `lustrain submit` estimates and the stack's register_job records."""
    itype = (prices or PriceTable()).instance_types.get(spec.instance_type)
    hourly = itype.hourly_usd if itype is not None else None
    return plan_of(spec.name, spec.tokenizer, spec.instances, spec.instance_type, source_gib, hourly)


def render_plan(plan: dict[str, object]) -> str:
    cost = plan["cost_usd"]
    too_long = plan.get("too_long")
    stages = plan["stages"]
    assert isinstance(stages, list)
    return "\n".join(
        (
            f"{plan['name']}: data preparation of {plan['source_gib']} GiB ({plan['tokenizer']}) on "
            f"{plan['instance_type']}",
            f"  stages:         {', '.join(stages)} ({plan['parts']} parts)",
            f"  wall time:      {plan['wall_hours']} h, with {STAGE_OVERHEAD_SECONDS} s to start each stage",
            f"  instance-hours: {plan['instance_hours']}",
            f"  cost:           {'unknown (no price for the type)' if cost is None else f'${cost:,.2f}'}",
            f"  (at {plan['instance_bytes_per_s']:,.0f} text bytes/s per instance: {plan['rate_source']})",
            *(
                [f"  refused: {too_long['field']}: {too_long['message']}"]
                if isinstance(too_long, dict)
                else []
            ),
        )
    )
