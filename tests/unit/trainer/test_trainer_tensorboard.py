"""TensorBoard from the trainer: rank 0 writes the figures as scalars where the tensorboard package is there, and
the trainer trains all the same where it is not (SageMaker's PyTorch training images list no tensorboard)."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
from lustrain_trainer.metrics import SCALARS, TENSORBOARD_DIR_ENV, Board
from test_trainer_runs import MICRO, metric_values, sagemaker_env, train_in_process

pytestmark = pytest.mark.slow


class Recorder:
    """torch.utils.tensorboard's SummaryWriter, as far as the trainer uses it: what it was given."""

    made: list[Recorder] = []

    def __init__(self, log_dir: str) -> None:
        self.log_dir, self.scalars, self.closed = log_dir, [], False
        Recorder.made.append(self)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, step, value))

    def close(self) -> None:
        self.closed = True


def test_rank_0_writes_loss_learning_rate_throughput_and_grad_norm_at_each_logged_step(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = Recorder  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    Recorder.made.clear()
    board = tmp_path / "tensorboard"
    env = sagemaker_env(tmp_path, data, **{TENSORBOARD_DIR_ENV: str(board)})
    assert train_in_process(monkeypatch, env, *MICRO, "--max_steps", "3") == 0

    out = capsys.readouterr().out
    (writer,) = Recorder.made
    assert writer.log_dir == str(board) and writer.closed
    by_tag: dict[str, list[tuple[int, float]]] = {}
    for tag, step, value in writer.scalars:
        by_tag.setdefault(tag, []).append((step, value))
    # every logged step (log_interval 1), the figures the log line gives and the gradients' norm besides
    for name in ("train_loss", "lr", "tokens_per_s", "tokens_per_s_per_gpu"):
        assert [s for s, _ in by_tag[SCALARS[name]]] == [1, 2, 3], name
    logged = metric_values(out, "train_loss")
    assert [round(v, 4) for _, v in by_tag["loss/train"]] == logged
    assert all(v > 0 for _, v in by_tag["grad_norm"]) and len(by_tag["grad_norm"]) == 3
    assert "throughput/mfu" not in by_tag  # MFU needs a GPU's peak; on CPU the log has none either
    assert f"TensorBoard event files in {board}" in out


def test_without_the_tensorboard_package_the_trainer_says_so_once_and_trains(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # as where the package is missing: importing torch.utils.tensorboard raises ImportError
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    env = sagemaker_env(tmp_path, data, **{TENSORBOARD_DIR_ENV: str(tmp_path / "tensorboard")})
    assert train_in_process(monkeypatch, env, *MICRO, "--max_steps", "3") == 0
    out = capsys.readouterr().out
    assert out.count("TensorBoard off:") == 1 and "the log lines carry the metrics" in out
    assert len(metric_values(out, "train_loss")) == 3
    assert not (tmp_path / "tensorboard").exists()


def test_only_the_writing_rank_opens_tensorboard_and_only_where_a_directory_is_named() -> None:
    said: list[str] = []
    for directory, is_main in ((None, True), ("/tmp/tb", False)):
        board: Any = Board.open(directory, is_main, said.append)
        assert not board.on
        board.write(1, {"train_loss": 1.0})  # nothing to write to, nothing raised
    assert said == []
