"""The notebook in examples/ runs, as a SageMaker notebook user would run it: it rehearses tiny.yaml on the twin,
follows the run with lustrain.operate, and shows its report's four plots inline (executed with nbclient)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "rehearse.ipynb"


def test_the_example_notebook_rehearses_a_run_follows_it_and_shows_its_plots():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()

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
