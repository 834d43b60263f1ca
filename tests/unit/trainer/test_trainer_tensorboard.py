"""TensorBoard from the trainer: rank 0 writes the figures as scalars, read back here with TensorBoard's own reader, in
SageMaker's PyTorch training image, which has no tensorboard package (lustrain_trainer.tfevents writes the files)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from lustrain_trainer.metrics import SCALARS, TENSORBOARD_DIR_ENV, Board
from lustrain_trainer.tfevents import EventWriter, crc32c
from test_trainer_runs import MICRO, metric_values, sagemaker_env, train_in_process

pytestmark = pytest.mark.slow


def scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files in `directory`, by tag, as TensorBoard itself reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(directory))
    board.Reload()
    return {tag: [(e.step, e.value) for e in board.Scalars(tag)] for tag in board.Tags()["scalars"]}


def test_rank_0_writes_loss_learning_rate_throughput_and_grad_norm_at_each_logged_step(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # as in SageMaker's PyTorch image: no tensorboard package, so torch.utils.tensorboard cannot be imported (the
    # trainer must not need it)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    board = tmp_path / "tensorboard"
    env = sagemaker_env(tmp_path, data, **{TENSORBOARD_DIR_ENV: str(board)})
    assert train_in_process(monkeypatch, env, *MICRO, "--max_steps", "3") == 0
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard")

    out = capsys.readouterr().out
    assert len(list(board.glob("events.out.tfevents.*"))) == 1
    by_tag = scalars(board)
    # every logged step (log_interval 1), the figures the log line gives and the gradients' norm besides
    for name in ("train_loss", "lr", "tokens_per_s", "tokens_per_s_per_gpu"):
        assert [s for s, _ in by_tag[SCALARS[name]]] == [1, 2, 3], name
    logged = metric_values(out, "train_loss")
    assert [round(v, 4) for _, v in by_tag["loss/train"]] == logged
    assert all(v > 0 for _, v in by_tag["grad_norm"]) and len(by_tag["grad_norm"]) == 3
    assert "throughput/mfu" not in by_tag  # MFU needs a GPU's peak; on CPU the log has none either
    assert f"TensorBoard event files in {board}" in out


def test_only_the_writing_rank_opens_tensorboard_and_only_where_a_directory_is_named() -> None:
    said: list[str] = []
    for directory, is_main in ((None, True), ("/tmp/tb", False)):
        board: Any = Board.open(directory, is_main, said.append)
        assert not board.on
        board.write(1, {"train_loss": 1.0})  # nothing to write to, nothing raised
    assert said == []


def test_the_records_checksum_is_crc32c():
    """TFRecord's checksum is CRC-32C: its check value (RFC 3720's)."""
    assert crc32c(b"123456789") == 0xE3069283


def test_a_file_of_scalars_reads_back_in_tensorboard(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path)
    writer.add_scalars({"loss/train": 2.5, "learning_rate": 3e-4}, step=1)
    writer.add_scalar("loss/train", 1.25, step=2**40)
    writer.add_scalar("loss/train", 0.5, step=-3)
    writer.close()
    read = scalars(tmp_path)
    assert read["loss/train"] == [(1, 2.5), (2**40, 1.25), (-3, 0.5)]
    assert read["learning_rate"] == [(1, pytest.approx(3e-4))]
    with pytest.raises(ValueError, match="closed"):
        writer.add_scalar("loss/train", 1.0, 3)
