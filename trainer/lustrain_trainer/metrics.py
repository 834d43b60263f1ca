"""The metric log line and the SageMaker MetricDefinitions that read it, generated from one table.

    step=120 train_loss=2.3456 tokens_per_s=15234.2 tokens_per_s_per_gpu=1904.3 mfu=0.4123 lr=2.861e-03 val_loss=2.4012 val_ppl=11.036 val_bpb=1.4521 tokens_seen=491520
    step=500 ckpt_blocking_s=0.412                              (each checkpoint: the time training waited for it)
    step=100 resumed_from=100                                  (once, at start: the step training resumes from)

`step` is a metric too: SageMaker keeps the last value of each (FinalMetricDataList), so the control plane knows
how far a failed attempt got and where the next one resumed (lustrain_core.steps.attempts). `tokens_seen` (counted
from the run's first step, across resumes) is one for the same reason: the final figures of a job are its
FinalMetricDataList, which `lustrain status` and `report` read without downloading anything.

The evaluation's figures (`val_*`, at each evaluation):
- val_loss: the mean cross-entropy per token, in nats, over eval_batches batches of the val split;
- val_ppl: perplexity, exp(val_loss);
- val_bpb: bits per byte, val_loss x val tokens / val bytes / ln 2, the split's tokens and UTF-8 source bytes as
  the data's index gives them (split_bytes): a loss per byte of text, comparable across tokenizers where a loss
  per token is not (a token of a 50k-vocabulary BPE carries several bytes, a token of the byte tokenizer one).

TensorBoard (`Board`): rank 0 also writes the figures as TensorBoard scalars (loss, learning rate, tokens/s, MFU,
grad norm, the evaluation) to LUSTRAIN_TENSORBOARD_DIR, which the CreateTrainingJob request sets to its
TensorBoardOutputConfig's LocalPath (/opt/ml/output/tensorboard): SageMaker uploads that directory to the run's
archive while the job runs. The event files are written by lustrain_trainer.tfevents, with the standard library:
SageMaker's PyTorch training images ship no tensorboard package, which torch.utils.tensorboard needs.

trainer/metric_definitions.json is this module's output (`python -m lustrain_trainer.metrics`); a test
keeps the two equal, so the control plane's regexes cannot drift from what the trainer prints.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .shards import DataIndex

# name -> format of its value. Every value is a plain decimal or exponent number, which NUMBER captures.
METRICS: dict[str, str] = {
    "train_loss": "{:.4f}",
    "tokens_per_s": "{:.1f}",
    "tokens_per_s_per_gpu": "{:.1f}",
    "mfu": "{:.4f}",
    "lr": "{:.3e}",
    "val_loss": "{:.4f}",
    "val_ppl": "{:.3f}",
    "val_bpb": "{:.4f}",
    "tokens_seen": "{:.0f}",
    "resumed_from": "{:.0f}",
    "ckpt_blocking_s": "{:.3f}",
}
#: the step every line starts with, a metric of its own
STEP = "step"
NUMBER = r"([0-9.eE+-]+)"


#: the evaluation's figures, in the order `lustrain status` shows them
EVALUATION = ("val_loss", "val_ppl", "val_bpb")


def perplexity(loss: float) -> float:
    """exp(loss) of a loss in nats per token; inf where that overflows a float (a diverged run)."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def bits_per_byte(loss: float, tokens: int, source_bytes: int) -> float:
    """A loss in nats per token as bits per byte of source text: loss x tokens / bytes / ln 2."""
    if tokens <= 0 or source_bytes <= 0:
        raise ValueError(
            f"bits per byte needs tokens and bytes above 0, got {tokens} tokens, {source_bytes} bytes"
        )
    return loss * tokens / source_bytes / math.log(2)


def split_bytes(index: DataIndex, split: str) -> tuple[int, int] | None:
    """(tokens, UTF-8 source bytes) of one split of a data set, or None where its index cannot say (the index
    decides the bytes: DataIndex.text_bytes)."""
    tokens, source = index.tokens(split), index.text_bytes(split)
    return (tokens, source) if tokens > 0 and source > 0 else None


def evaluation(val_loss: float, split: tuple[int, int] | None) -> dict[str, float]:
    """The figures of one evaluation, from its loss: val_loss, val_ppl and, where the split's bytes are known,
    val_bpb."""
    figures = {"val_loss": val_loss, "val_ppl": perplexity(val_loss)}
    if split is not None:
        figures["val_bpb"] = bits_per_byte(val_loss, *split)
    return figures


def final_summary(
    metrics: dict[str, float], step: int, tokens_seen: int, elapsed_s: float, evaluated_at: int | None
) -> dict[str, Any]:
    """The end of a training process in one place (summary.json's `final`): the last train loss, the last
    evaluation (and its step), the tokens seen since the run's first step, the step reached and the process's wall
    time. A figure not measured (no val split, a diverged loss) is null."""

    def finite(name: str) -> float | None:
        value = metrics.get(name)
        return float(value) if value is not None and math.isfinite(value) else None

    return {
        "step": step,
        "tokens_seen": tokens_seen,
        "elapsed_s": elapsed_s,
        "train_loss": finite("train_loss"),
        "val_step": evaluated_at,
        **{name: finite(name) for name in EVALUATION},
    }


#: where rank 0 writes TensorBoard's event files (the request builder sets it; unset: no TensorBoard)
TENSORBOARD_DIR_ENV = "LUSTRAIN_TENSORBOARD_DIR"
#: the figures TensorBoard shows, by the tag each is written under
SCALARS: dict[str, str] = {
    "train_loss": "loss/train",
    "val_loss": "loss/val",
    "val_bpb": "eval/bits_per_byte",
    "lr": "learning_rate",
    "tokens_per_s": "throughput/tokens_per_s",
    "tokens_per_s_per_gpu": "throughput/tokens_per_s_per_gpu",
    "mfu": "throughput/mfu",
    "grad_norm": "grad_norm",
}


class Board:
    """TensorBoard's scalars, from rank 0 only (lustrain_trainer.tfevents writes the event files: the image has no
    tensorboard package); does nothing where it is off (no directory, or another rank)."""

    def __init__(self, writer: Any = None) -> None:
        self.writer = writer

    @classmethod
    def open(cls, directory: str | None, is_main: bool, say: Callable[[str], None]) -> Board:
        if not directory or not is_main:
            return cls()
        from .tfevents import EventWriter

        say(f"TensorBoard event files in {directory}")
        return cls(EventWriter(directory))

    @property
    def on(self) -> bool:
        return self.writer is not None

    def write(self, step: int, values: dict[str, float]) -> None:
        if self.writer is None:
            return
        scalars = {
            tag: float(value)
            for name, tag in SCALARS.items()
            if (value := values.get(name)) is not None and math.isfinite(value)
        }
        if scalars:
            self.writer.add_scalars(scalars, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def format_line(step: int, values: dict[str, float]) -> str:
    unknown = set(values) - set(METRICS)
    if unknown:
        raise KeyError(f"not metrics of this trainer: {sorted(unknown)}")
    parts = [f"step={step}"]
    parts += [f"{name}={fmt.format(values[name])}" for name, fmt in METRICS.items() if name in values]
    return " ".join(parts)


def metric_definitions() -> list[dict[str, str]]:
    # \b keeps "lr=" from matching inside a longer key such as "min_lr=" ("_" is a word character).
    return [{"Name": name, "Regex": f"\\b{name}={NUMBER}"} for name in (STEP, *METRICS)]


def main() -> int:
    json.dump(metric_definitions(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
