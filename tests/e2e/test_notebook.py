"""The notebook in examples/ runs, as the README says to run it (`.venv/bin/jupyter execute --output OUT
examples/rehearse.ipynb`, nbclient's command) and as a notebook user would: it rehearses tiny.yaml on the twin,
follows the run with lustrain.operate, and shows its report's plots inline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.slow

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "rehearse.ipynb"


def test_the_example_notebook_rehearses_a_run_follows_it_and_shows_its_plots(tmp_path):
    executed = tmp_path / "rehearse.ipynb"
    jupyter = Path(sys.executable).parent / "jupyter"
    subprocess.run(
        [str(jupyter), "execute", "--timeout", "600", "--output", str(executed), str(NOTEBOOK)],
        check=True, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    notebook = nbformat.read(executed, as_version=4)

    text = "".join(
        output.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
    )
    assert "Register the job" in text and "Start the training job" in text
    assert ": SUCCEEDED, 0 resources left" in text
    assert "train_loss" in text
    images = [
        output for output in notebook.cells[-1].outputs
        if output.output_type == "display_data" and "image/png" in output.data
    ]
    assert len(images) == 6  # loss, validation bits per byte, speed, the time line, cost, throughput
