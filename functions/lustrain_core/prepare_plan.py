"""Data preparation on SageMaker Processing: what a preparation run is made of, decided purely.

`lustrain data prepare s3://SRC s3://OUT --instances N` runs lustrain_trainer.prepare (the trainer package, shipped
as the job's code as for training) in the stages of its contract, each a SageMaker Processing job in the run's
private subnet, one after the other:

1. plan (1 instance): lists SRC, trains the BPE once where the tokenizer is bpe:VOCAB, writes OUT/prepare-plan.json
   and OUT/tokenizer.json. One instance, not the CLI or a Lambda: training a BPE on its sample takes minutes and
   needs `tokenizers` (the image has it, a Lambda does not), and the caller's machine may be far from the data.
2. work (N instances, `--worker auto`): each instance tokenizes the parts p with p % N == its position in the
   sorted hosts of /opt/ml/config/resourceconfig.json, reading its files from S3 itself (a corpus is never copied
   whole to every instance) and writing each part's shards and part-NNNNN.json to OUT.
3. merge (1 instance): checks every part is whole and writes OUT/index.json.

Until the stages exist in lustrain_trainer.prepare, the one-instance form runs as one job, `whole`: today's
prepare on local directories, SRC downloaded as a ProcessingInput and OUT uploaded as a ProcessingOutput.

Why Processing and not a training job: a processing job is billed and limited as data work (its own instance
quotas, "ml.<type> for processing job usage"), takes any command as its entry point, and gives every instance
/opt/ml/config/resourceconfig.json, which is how a worker knows its share without a coordinator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The stages of a preparation run, in order, and the ones run when the trainer has no stages yet.
STAGES = ("plan", "work", "merge")
WHOLE = ("whole",)
#: plan and merge are small: one instance each, whatever --instances says
SINGLE_INSTANCE_STAGES = frozenset({"plan", "merge", "whole"})
#: in the instance catalogue (data/instance_types.json), so that `lustrain plan` can price it
DEFAULT_INSTANCE_TYPE = "ml.c5.xlarge"
#: the instance's volume holds the code, the tokenizer's sample and the shards in flight (a shard is 256 MiB)
VOLUME_GIB = 100
#: the longest one stage may run (SageMaker's MaxRuntimeInSeconds allows 5 days; botocore: 1..777600)
MAX_RUNTIME_SECONDS = 24 * 3600
#: Where the code is unpacked in the container, and its entry point: the bundle is upload_code's sourcedir.tar.gz
#: (a ProcessingInput is copied, not unpacked); each item of ContainerEntrypoint is at most 256 characters.
CODE_DIR = "/opt/ml/processing/input/code"
DATA_DIR = "/opt/ml/processing/input/data"
OUTPUT_DIR = "/opt/ml/processing/output"
ENTRY_SCRIPT = (
    'code="$1"; shift; tar -xzf "$code/sourcedir.tar.gz" -C "$code" || exit 1; '
    'PYTHONPATH="$code${PYTHONPATH:+:$PYTHONPATH}" exec python3 -m lustrain_trainer.prepare "$@"'
)
ENTRYPOINT = ["/bin/sh", "-c", ENTRY_SCRIPT, "prepare", CODE_DIR]

#: Tokens per second one instance of DEFAULT_INSTANCE_TYPE tokenizes, until the preparation's own estimate (the
#: prepare engineer's pure estimate function, from bench/prepare.py's measurement) replaces it. Where it comes
#: from: a byte-level BPE in Hugging Face `tokenizers` encodes on the order of 1 MB of text per second per core,
#: about 250,000 tokens at 4 bytes a token, and ml.c5.xlarge has 4 vCPUs. Not measured on SageMaker: used for
#: `lustrain plan`'s estimate only.
TOKENS_PER_SECOND_PER_INSTANCE = 1_000_000
#: about 4 bytes of English text per BPE token
BYTES_PER_TOKEN = 4.0
#: a processing job's start (instances, image pull) and end, per stage
STAGE_OVERHEAD_SECONDS = 300


@dataclass(frozen=True)
class PrepareRun:
    """What one preparation run is: where from, where to, how, on what."""

    job_id: str
    source: str
    output: str
    tokenizer: str = "bytes"
    instances: int = 1
    instance_type: str = DEFAULT_INSTANCE_TYPE
    staged: bool = True

    @property
    def stages(self) -> tuple[str, ...]:
        return STAGES if self.staged else WHOLE

    def instances_of(self, stage: str) -> int:
        return 1 if stage in SINGLE_INSTANCE_STAGES else self.instances

    def job_name(self, stage: str) -> str:
        """The stage's processing job name: the run's id and the stage ([a-zA-Z0-9](-*[a-zA-Z0-9]){0,62})."""
        suffix = f"-prep-{stage}"
        return f"{self.job_id[: 63 - len(suffix)].rstrip('-')}{suffix}"

    def arguments(self, stage: str) -> list[str]:
        """lustrain_trainer.prepare's arguments for the stage (the contract's command lines)."""
        if stage == "whole":
            return [DATA_DIR, OUTPUT_DIR, "--tokenizer", self.tokenizer]
        common = [self.source, self.output]
        if stage == "plan":
            return [*common, "--stage", "plan", "--tokenizer", self.tokenizer]
        if stage == "work":
            return [*common, "--stage", "work", "--worker", "auto", "--workers", str(self.instances)]
        if stage == "merge":
            return [*common, "--stage", "merge"]
        raise ValueError(f"unknown stage {stage!r}: one of {', '.join(STAGES + WHOLE)}")


def next_stage(run: PrepareRun, done: list[str]) -> str | None:
    """The stage to run after those `done`, or None when the run is over."""
    for stage in run.stages:
        if stage not in done:
            return stage
    return None


@dataclass(frozen=True)
class Estimate:
    seconds: float
    instance_hours: float

    def cost_usd(self, hourly_usd: float | None) -> float | None:
        """What the instances bill at `hourly_usd` each (None when the type has no price)."""
        return None if hourly_usd is None else round(self.instance_hours * hourly_usd, 2)


def estimate(source_bytes: int, instances: int) -> Estimate:
    """The wall time and instance-hours of preparing `source_bytes` of text on `instances` instances."""
    tokens = source_bytes / BYTES_PER_TOKEN
    work = tokens / (TOKENS_PER_SECOND_PER_INSTANCE * max(1, instances))
    stages_seconds = STAGE_OVERHEAD_SECONDS * len(STAGES)
    seconds = work + stages_seconds
    instance_hours = (work * instances + STAGE_OVERHEAD_SECONDS * (instances + 2)) / 3600
    return Estimate(seconds=math.ceil(seconds), instance_hours=instance_hours)


def plan_of(
    name: str, instances: int, instance_type: str, source_gib: float, hourly_usd: float | None
) -> dict[str, object]:
    """`lustrain plan` of a kind: prepare spec: its stages, wall time, instance-hours and cost."""
    found = estimate(int(source_gib * 2**30), instances)
    return {
        "name": name,
        "kind": "prepare",
        "stages": [f"{stage} x{1 if stage in SINGLE_INSTANCE_STAGES else instances}" for stage in STAGES],
        "instance_type": instance_type,
        "source_gib": source_gib,
        "wall_hours": round(found.seconds / 3600, 2),
        "instance_hours": round(found.instance_hours, 2),
        "cost_usd": found.cost_usd(hourly_usd),
        "tokens_per_second_per_instance": TOKENS_PER_SECOND_PER_INSTANCE,
    }


def render_plan(plan: dict[str, object]) -> str:
    cost = plan["cost_usd"]
    return "\n".join(
        (
            f"{plan['name']}: data preparation of {plan['source_gib']} GiB on {plan['instance_type']}",
            f"  stages:         {', '.join(plan['stages'])}",  # type: ignore[arg-type]
            f"  wall time:      {plan['wall_hours']} h",
            f"  instance-hours: {plan['instance_hours']}",
            f"  cost:           {'unknown (no price for the type)' if cost is None else f'${cost:,.2f}'}",
            f"  (at {plan['tokens_per_second_per_instance']:,} tokens/s per instance, an estimate "
            "not yet measured on SageMaker)",
        )
    )
