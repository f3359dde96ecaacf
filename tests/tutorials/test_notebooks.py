"""Every tutorial notebook runs in a real Jupyter kernel (nbclient), and the committed notebooks
are what tutorials/make_notebooks.py writes."""
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"
sys.path.insert(0, str(TUTORIALS))
import make_notebooks  # noqa: E402

QUICK_EPOCHS = "EPOCHS = 1"


def test_every_tutorial_script_has_its_notebook():
    scripts = {p.stem for p in TUTORIALS.glob("*.py")} - {"make_notebooks"}
    assert scripts == set(make_notebooks.NOTEBOOKS)
    assert {p.stem for p in TUTORIALS.glob("*.ipynb")} == scripts


@pytest.mark.parametrize("name", sorted(make_notebooks.NOTEBOOKS))
def test_committed_notebook_is_generated(name):
    committed = nbformat.read(make_notebooks.path_of(name), as_version=4)
    assert committed == make_notebooks.notebook(name), "run: python tutorials/make_notebooks.py"
    assert all(cell.get("id") for cell in committed.cells)


@pytest.mark.parametrize("name", sorted(make_notebooks.NOTEBOOKS))
def test_notebook_runs_in_a_kernel(name, tmp_path):
    for script in TUTORIALS.glob("*.py"):  # run in a copy: notebooks may write files beside them
        shutil.copy(script, tmp_path)
    nb = make_notebooks.notebook(name)
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith("EPOCHS = "):
            cell.source = QUICK_EPOCHS + "  # the test's"
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    if name == "exploring_graphs":
        pictures = [o for o in outputs if o.output_type == "execute_result" and "image/svg+xml" in o.data]
        assert len(pictures) == 3  # the Ir, the gradient graph, the 12-layer model
        assert "graph main_graph {" in text and "= gelu_grad(" in text
        difference = float(text.rsplit("largest difference from popxl:", 1)[1].split()[0])
        assert difference < 1e-5
        assert (tmp_path / "mlp.onnx").exists()
    elif name.startswith("digits_mlp"):
        assert "held-out accuracy" in text
