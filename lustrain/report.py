"""`lustrain report RUN`: an HTML page with PNG plots of one run, from what AWS keeps of it.

- loss by step: the training log's lines (CloudWatch, every attempt and host) read with the training job's own
  MetricDefinitions, as SageMaker reads them (`step`, `train_loss`, `val_loss`);
- validation bits per byte by step, from the same lines (`val_bpb`: comparable across tokenizers, where a loss per
  token is not), with the evaluation's latest or final figures (operate.evaluation) on the page;
- speed by step, from the same lines: tokens/s per GPU and, on GPUs, MFU (model FLOPs over the GPUs' bf16 peak);
- the states on a time line: the execution's history;
- cost: the plan's estimate before launch against what the run has cost so far (lustrain.operate), and the warm
  pools its training jobs kept with their billed seconds (operate.warm_pools);
- file-system throughput: what the plan provisioned against what the GPUs demand (data.ingest_mb_s_per_gpu).

The page and `Report.tensorboard_logdir` also say where the run's TensorBoard files are: its training jobs'
TensorBoardOutputConfig.S3OutputPath, under which SageMaker puts each job's `<job>/tensorboard-output/`.

`build` returns the figures' own data (`Report.series`) beside the files, so that a caller (a notebook, a test)
sees exactly what was drawn.
"""

from __future__ import annotations

import html
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lustrain_core import metric_lines
from lustrain_core.steps import records
from lustrain_core.steps.records import JobRecord

from lustrain import operate

STEP = metric_lines.STEP


@dataclass
class Report:
    job_id: str
    html_path: Path
    pngs: dict[str, Path]
    #: each figure's data: name -> {series name -> [(x, y), ...]}
    series: dict[str, dict[str, list[tuple[float, float]]]]
    figures: dict[str, Any] = field(default_factory=dict, repr=False)
    #: `tensorboard --logdir` this: every attempt's TensorBoard files (None for a run with no such job)
    tensorboard_logdir: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "html_path": str(self.html_path),
            "pngs": {k: str(v) for k, v in self.pngs.items()},
            "series": self.series,
            "tensorboard_logdir": self.tensorboard_logdir,
        }


def metric_points(lines: list[operate.LogLine], definitions: list[dict[str, str]]) -> dict[str, list[tuple[float, float]]]:
    """(step, value) of each metric a line logs beside its step, in time order: the MetricDefinitions' regexes."""
    found = metric_lines.points(((line.timestamp_ms, line.message) for line in lines), definitions)
    return {name: [(p.step, p.value) for p in curve] for name, curve in found.items()}


def _definitions(stack: operate.Stack, record: JobRecord) -> list[dict[str, str]]:
    jobs = operate.training_jobs(stack, record)
    if not jobs:
        return []
    return list((jobs[-1].get("AlgorithmSpecification") or {}).get("MetricDefinitions") or [])


def tensorboard_logdir(jobs: list[dict[str, Any]]) -> str | None:
    """Where the run's training jobs upload their TensorBoard files (the latest job's; a run's jobs share it)."""
    for job in reversed(jobs):
        path = (job.get("TensorBoardOutputConfig") or {}).get("S3OutputPath")
        if path:
            return str(path)
    return None


def build(stack: operate.Stack, run: str, out_dir: str | Path, now: float | None = None) -> Report:
    """Write <out_dir>/<job id>/report.html and its PNGs; the report with the data of each figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    moment = time.time() if now is None else now
    record = operate.find_run(stack, run)
    job_id = record.job_id
    shown = operate.status(stack, job_id, now=moment)
    target = Path(out_dir) / job_id
    target.mkdir(parents=True, exist_ok=True)

    points = metric_points(operate.logs(stack, job_id), _definitions(stack, record))
    losses = {name: points.get(name, []) for name in ("train_loss", "val_loss")}
    spans = shown.timeline
    start = _epoch(spans[0].entered_at) if spans else moment
    states: dict[str, list[tuple[float, float]]] = {}
    for span in spans:
        took = span.seconds if span.seconds is not None else moment - _epoch(span.entered_at)
        states.setdefault(span.state, []).append((_epoch(span.entered_at) - start, took))
    provisioned, demand = record.planned_throughput_mb_s
    series: dict[str, dict[str, list[tuple[float, float]]]] = {
        "loss": {k: v for k, v in losses.items() if v},
        "val_bpb": {k: points[k] for k in ("val_bpb",) if points.get(k)},
        "speed": {k: points[k] for k in ("tokens_per_s_per_gpu", "mfu") if points.get(k)},
        "timeline": states,
        "cost": {"estimated": [(0, record.estimated_usd)], "so far": [(1, shown.run.cost_so_far_usd)]},
        "throughput": {
            "provisioned": [(0, provisioned)],
            "GPU demand": [(1, demand)],
        },
    }

    figures: dict[str, Any] = {}
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, xy in series["loss"].items():
        ax.plot([x for x, _ in xy], [y for _, y in xy], marker="." if name == "val_loss" else None, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"{job_id}: loss by step")
    if series["loss"]:
        ax.legend()
    else:
        _nothing_yet(ax, "no losses logged yet")
    figures["loss"] = fig

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, xy in series["val_bpb"].items():
        ax.plot([x for x, _ in xy], [y for _, y in xy], marker=".", label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("validation bits per byte")
    ax.set_title(f"{job_id}: validation bits per byte by step")
    if not series["val_bpb"]:
        _nothing_yet(ax, "no validation logged yet")
    figures["val_bpb"] = fig

    fig, ax = plt.subplots(figsize=(7, 3.5))
    speed = series["speed"]
    if "tokens_per_s_per_gpu" in speed:
        xy = speed["tokens_per_s_per_gpu"]
        ax.plot([x for x, _ in xy], [y for _, y in xy], label="tokens/s per GPU")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens/s per GPU")
    if "mfu" in speed:
        share = ax.twinx()
        share.plot([x for x, _ in speed["mfu"]], [y for _, y in speed["mfu"]], color="tab:orange", label="MFU")
        share.set_ylabel("MFU")
    ax.set_title(f"{job_id}: speed by step" + ("" if "mfu" in speed else " (MFU on GPUs only)"))
    if not speed:
        _nothing_yet(ax, "no speed logged yet")
    figures["speed"] = fig

    fig, ax = plt.subplots(figsize=(7, max(2.0, 0.35 * len(states) + 1)))
    for row, bars in enumerate(states.values()):
        ax.broken_barh(bars, (row - 0.4, 0.8))
    if states:
        ax.set_yticks(range(len(states)), list(states))
        ax.set_ylim(len(states) - 0.5, -0.5)
    else:
        _nothing_yet(ax, "no states recorded")
    ax.set_xlabel("seconds since the run started")
    ax.set_title("the states on a time line")
    figures["timeline"] = fig

    for name, unit, title, shown_as in (
        ("cost", "USD", f"cost: estimated before launch vs so far ({shown.run.state})", "${:,.2f}"),
        ("throughput", "MB/s", "file-system throughput: provisioned vs the GPUs' demand", "{:,.0f} MB/s"),
    ):
        fig, ax = plt.subplots(figsize=(5, 3))
        labels = list(series[name])
        values = [series[name][label][0][1] for label in labels]
        drawn = ax.bar(labels, values)
        # each bar carries its value, a zero one too (a bar of height 0 draws nothing but its label)
        ax.bar_label(drawn, labels=[shown_as.format(value) for value in values], padding=2)
        ax.set_ylim(0, max(values) * 1.25 if max(values) > 0 else 1)
        ax.set_ylabel(unit)
        ax.set_title(title)
        figures[name] = fig

    pngs: dict[str, Path] = {}
    for name, fig in figures.items():
        _fit_title(fig)
        fig.tight_layout()
        pngs[name] = target / f"{name}.png"
        fig.savefig(pngs[name], dpi=100)
        plt.close(fig)

    page = target / "report.html"
    logdir = tensorboard_logdir(operate.training_jobs(stack, record))
    page.write_text(_html(shown, pngs, logdir))
    return Report(job_id, page, pngs, series, figures, logdir)


def _nothing_yet(ax: Any, text: str) -> None:
    """An empty plot says so, in its middle, instead of drawing bare axes."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize="large", color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _fit_title(fig: Any) -> None:
    """Wrap each axes' title onto as many lines as the figure's width needs: a long title is not cut off."""
    renderer = fig.canvas.get_renderer()
    width = fig.bbox.width * 0.95
    for ax in fig.axes:
        title = ax.title
        text = title.get_text()
        if not text or title.get_window_extent(renderer).width <= width:
            continue
        per_line = max(10, int(len(text) * width / title.get_window_extent(renderer).width))
        title.set_text(textwrap.fill(text, per_line))


def _epoch(iso: str) -> float:
    found = records.moment(iso)
    assert found is not None, iso  # the timeline's moments are written by operate._iso
    return found


def _html(shown: operate.RunStatus, pngs: dict[str, Path], logdir: str | None = None) -> str:
    r = shown.run
    rows = "".join(
        f"<tr><td>{html.escape(s.entered_at)}</td><td>{'' if s.seconds is None else f'{s.seconds:.1f} s'}</td>"
        f"<td>{html.escape(s.state)}</td></tr>"
        for s in shown.timeline
    )
    images = "".join(f'<h2>{html.escape(name)}</h2><img src="{path.name}" alt="{html.escape(name)}">' for name, path in pngs.items())
    cause = f"<p>{html.escape(shown.cause)}</p>" if shown.cause else ""
    if shown.evaluation:
        cause += f"<p>evaluation, {html.escape(operate.evaluation_text(shown.evaluation))}</p>"
    if shown.warm_pool:
        cause += f"<p>warm pool: {html.escape(operate.warm_pool_text(shown.warm_pool))}</p>"
    if logdir:
        cause += f"<p>TensorBoard: <code>tensorboard --logdir {html.escape(logdir)}</code></p>"
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>lustrain run {html.escape(r.job_id)}</title></head><body>"
        f"<h1>lustrain run {html.escape(r.job_id)} ({html.escape(r.name)}): {html.escape(r.state)}</h1>{cause}"
        f"<p>{r.instances} x {html.escape(r.instance_type)}, attempt {r.attempt}, "
        f"cost so far ${r.cost_so_far_usd:,.2f}</p>{images}"
        f"<h2>states</h2><table><tr><th>entered</th><th>took</th><th>state</th></tr>{rows}</table>"
        "</body></html>\n"
    )
