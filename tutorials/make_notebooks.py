"""Write the tutorial notebooks (*.ipynb) from the scripts, so the two never drift apart.

    python tutorials/make_notebooks.py
"""
from __future__ import annotations

import ast
import json
import os
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))

# notebook name -> (script, the cells after the script's docstring)
NOTEBOOKS: Dict[str, List[str]] = {
    "digits_mlp": [
        "EPOCHS = 10  # lower it for a quick look",
        "from digits_mlp import *\n\nresult = train(EPOCHS, optimizer=SGD(0.1))\nreport(result)",
        "# The program is ordinary IR: look at one layer's forward and gradient graphs.\n"
        "import popxl\nfrom popxl import transforms\n\n"
        "ir = popxl.Ir()\nwith ir.main_graph:\n"
        "    layer = Linear(8)\n"
        "    graph = ir.create_graph(layer, popxl.TensorSpec((4, 16), popxl.float32))\n"
        "    info = transforms.autodiff(graph)\n"
        "print([op.type for op in graph.ops])\nprint([op.type for op in info.graph.ops])\nprint(info)",
    ],
    "digits_mlp_adam": [
        "EPOCHS = 10",
        "from digits_mlp import train, report\nfrom digits_mlp_adam import Adam\n\n"
        "report(train(EPOCHS, optimizer=Adam(1e-2)))",
        "# AdamW: decoupled weight decay\nreport(train(EPOCHS, optimizer=Adam(1e-2, weight_decay=1e-3)))",
    ],
    "digits_mlp_accumulate": [
        "EPOCHS = 10",
        "from digits_mlp import SGD, train, report\n\n"
        "# micro-batches of 8, gradients of 4 of them averaged per update: an effective batch of 32\n"
        "report(train(EPOCHS, batch=8, optimizer=SGD(0.1), accumulate=4))",
    ],
}


def _docstring(script: str) -> str:
    with open(os.path.join(HERE, script + ".py")) as f:
        return ast.get_docstring(ast.parse(f.read())) or ""


def _cell(kind: str, text: str) -> dict:
    cell = {"cell_type": kind, "metadata": {}, "source": text.splitlines(keepends=True)}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def notebook(name: str) -> dict:
    doc = _docstring(name)
    title, _, rest = doc.partition("\n")
    cells = [_cell("markdown", f"# {title.removeprefix('Tutorial: ')}\n\n{rest.strip()}")]
    cells += [_cell("code", src) for src in NOTEBOOKS[name]]
    return {"cells": cells, "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                                        "name": "python3"}},
            "nbformat": 4, "nbformat_minor": 5}


def main() -> None:
    for name in NOTEBOOKS:
        with open(os.path.join(HERE, name + ".ipynb"), "w") as f:
            json.dump(notebook(name), f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
