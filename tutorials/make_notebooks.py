"""Write the tutorial notebooks (*.ipynb) from the scripts with nbformat, so the two never drift apart.

    python tutorials/make_notebooks.py

Each notebook opens with its script's docstring and then runs cells that import the script's
functions. ``tests/tutorials/test_notebooks.py`` executes every notebook in a Jupyter kernel
(``EPOCHS`` lowered) and checks that these files are what this script writes.
"""
from __future__ import annotations

import ast
import os
from typing import Dict, List

import nbformat
from nbformat import v4

HERE = os.path.dirname(os.path.abspath(__file__))

# notebook name (= its script's name) -> the cells after the script's docstring. A cell starting
# with "## " is markdown.
NOTEBOOKS: Dict[str, List[str]] = {
    "digits_softmax_regression": [
        "EPOCHS = 10  # lower it for a quick look",
        "import numpy as np\nfrom digits_softmax_regression import train\n\n"
        "result = train(EPOCHS)\nlosses = result['losses']\n"
        "print(f\"loss {np.mean(losses[:10]):.3f} -> {np.mean(losses[-10:]):.3f}, \"\n"
        "      f\"held-out accuracy {result['accuracy']:.2%}\")",
        "# The training program: a repeat of one step, its gradients written by hand.\n"
        "from digits_softmax_regression import build_training_ir\n\n"
        "ir, *_ = build_training_ir(batch=32, steps_per_run=10, lr=0.5)\nprint(ir)",
    ],
    "digits_mlp": [
        "EPOCHS = 10  # lower it for a quick look",
        "from digits_mlp import *\n\nresult = train(EPOCHS, optimizer=SGD(0.1))\nreport(result)",
        "## The program is ordinary IR: one layer's forward and gradient graphs",
        "import popxl\nfrom popxl import transforms\n\n"
        "ir = popxl.Ir()\nwith ir.main_graph:\n"
        "    layer = Linear(8)\n"
        "    graph = ir.create_graph(layer, popxl.TensorSpec((4, 16), popxl.float32))\n"
        "    info = transforms.autodiff(graph)\n"
        "print(graph)\nprint(info.graph)\ninfo.graph  # a picture of the gradient graph",
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
    "exploring_graphs": [
        "## The listing\n\n`print` on a `Graph` or an `Ir` lists every op on one line, each tensor "
        "`name:dtype[shape]`, with the bodies of called graphs nested below their `call`.",
        "import popxl\nfrom exploring_graphs import build_mlp, layer_with_gradient\n\nir = build_mlp()\nprint(ir)",
        "## The picture\n\nThe last value of a cell that is a `Graph` or an `Ir` is drawn (Graphviz's "
        "`dot` layout, from the pygraphviz wheel). Variables are blue, constants gold, streams red; "
        "called graphs are clusters, reached by the dashed edges. Hover over a node for its full line.",
        "ir",
        "## Autodiff's gradient graph\n\n`transforms.autodiff` returns a `GradGraphInfo`; its `graph` "
        "is an ordinary graph: list it and draw it like any other.",
        "_, forward, grads = layer_with_gradient()\nprint(grads.graph)\n"
        "print('needs from the forward pass:', [t.name for t in grads.inputs])\ngrads.graph",
        "## Large programs\n\nA picture keeps to a node budget: graphs of the same structure are drawn "
        "once, a graph too large for it has each name scope folded into one node and is split into "
        "pages. `popxl.visualize.to_svg(ir, max_nodes=..., depth=..., page=...)` chooses.",
        "from IPython.display import SVG\n\nbig = build_mlp(sizes=(8,) * 13)  # 12 layers\n"
        "SVG(popxl.visualize.to_svg(big, max_nodes=80))",
        "## ONNX export\n\n`popxl.export_onnx` writes the program for Netron (or ONNX Runtime): ONNX ops "
        "where ONNX has them, popxl-only ops in the `ai.graphcore` domain, subgraphs as local functions.",
        "import numpy as np\nimport onnxruntime\n\nmodel = popxl.export_onnx(ir, 'mlp.onnx')\n"
        "print([f.name for f in model.functions], [n.op_type for n in model.graph.node])\n"
        "x = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)\n"
        "(probs,) = onnxruntime.InferenceSession('mlp.onnx').run(None, {'x': x})\n"
        "(h2d,), (d2h,) = ir.get_all_h2d_streams(), ir.get_all_d2h_streams()\n"
        "with popxl.Session(ir, 'cpu') as session:\n    ours = session.run({h2d: x})[d2h]\n"
        "print('largest difference from popxl:', np.abs(probs - ours).max())",
    ],
}


def _docstring(script: str) -> str:
    with open(os.path.join(HERE, script + ".py")) as f:
        return ast.get_docstring(ast.parse(f.read())) or ""


def notebook(name: str) -> nbformat.NotebookNode:
    title, _, rest = _docstring(name).partition("\n")
    title = title.removeprefix("Tutorial: ")
    cells = [v4.new_markdown_cell(f"# {title[:1].upper()}{title[1:]}\n\n{rest.strip()}")]
    for source in NOTEBOOKS[name]:
        cells.append(v4.new_markdown_cell(source) if source.startswith("## ") else v4.new_code_cell(source))
    for i, cell in enumerate(cells):  # stable ids: regenerating changes nothing
        cell["id"] = f"{name.replace('_', '-')}-{i}"
    nb = v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.validate(nb)
    return nb


def path_of(name: str) -> str:
    return os.path.join(HERE, name + ".ipynb")


def main() -> None:
    for name in NOTEBOOKS:
        nbformat.write(notebook(name), path_of(name))


if __name__ == "__main__":
    main()
