"""The metric log line and the SageMaker MetricDefinitions that read it, generated from one table.

    step=120 train_loss=2.3456 tokens_per_s=15234.2 tokens_per_s_per_gpu=1904.3 mfu=0.4123 lr=2.861e-03 val_loss=2.4012
    step=500 ckpt_blocking_s=0.412                              (each checkpoint: the time training waited for it)
    step=100 resumed_from=100                                  (once, at start: the step training resumes from)

`step` is a metric too: SageMaker keeps the last value of each (FinalMetricDataList), so the control plane knows
how far a failed attempt got and where the next one resumed (lustrain_core.steps.attempts).

trainer/metric_definitions.json is this module's output (`python -m lustrain_trainer.metrics`); a test
keeps the two equal, so the control plane's regexes cannot drift from what the trainer prints.
"""

from __future__ import annotations

import json
import sys

# name -> format of its value. Every value is a plain decimal or exponent number, which NUMBER captures.
METRICS: dict[str, str] = {
    "train_loss": "{:.4f}",
    "tokens_per_s": "{:.1f}",
    "tokens_per_s_per_gpu": "{:.1f}",
    "mfu": "{:.4f}",
    "lr": "{:.3e}",
    "val_loss": "{:.4f}",
    "resumed_from": "{:.0f}",
    "ckpt_blocking_s": "{:.3f}",
}
#: the step every line starts with, a metric of its own
STEP = "step"
NUMBER = r"([0-9.eE+-]+)"


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
