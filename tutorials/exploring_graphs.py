"""Tutorial: exploring graph construction: listings, pictures, gradient graphs and ONNX.

Build a small two-layer MLP the PopXL way (one subgraph per layer, called from the main graph),
then look at it: ``print(graph)`` gives a typed listing (one line per op, ``name:dtype[shape]``,
called bodies nested), a ``Graph`` or ``Ir`` shows as a picture in Jupyter (or
``popxl.visualize.to_svg``), ``transforms.autodiff`` makes a gradient graph you can look at the
same way, and ``popxl.export_onnx`` writes the program for Netron or ONNX Runtime.

    python tutorials/exploring_graphs.py      # prints the listing, writes mlp.svg and mlp.onnx to a new temp dir
    python tutorials/exploring_graphs.py --out pictures    # ... into ./pictures instead
    python tutorials/exploring_graphs.py --picture docs/linear_and_gradient.svg   # the guide's picture
"""
from __future__ import annotations

import argparse
import os
import tempfile
from typing import Tuple

import numpy as np

import popxl
import popxl.ops as ops
from popxl import transforms


class Linear(popxl.Module):
    """x @ W + b, then gelu; W and b are graph inputs bound at the call site."""

    def __init__(self, out_features: int) -> None:
        self.out_features = out_features

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        self.W = popxl.graph_input((x.shape[-1], self.out_features), popxl.float32, "W")
        self.b = popxl.graph_input((self.out_features,), popxl.float32, "b")
        return ops.gelu(x @ self.W + self.b)


def build_mlp(batch: int = 4, sizes: Tuple[int, ...] = (8, 16, 4), seed: int = 0) -> popxl.Ir:
    """An inference MLP: a stream in, one called subgraph per layer, softmax, a stream out."""
    rng = np.random.default_rng(seed)
    ir = popxl.Ir()
    with ir.main_graph:
        x_stream = popxl.h2d_stream((batch, sizes[0]), popxl.float32, name="x")
        y_stream = popxl.d2h_stream((batch, sizes[-1]), popxl.float32, name="probs")
        x = ops.host_load(x_stream, "x")
        for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
            with popxl.name_scope(f"layer{i}"):
                layer = Linear(n_out)
                graph = ir.create_graph(layer, x)
                W = popxl.variable(rng.normal(0, n_in ** -0.5, (n_in, n_out)).astype(np.float32), name="W")
                b = popxl.variable(np.zeros(n_out, np.float32), name="b")
                (x,) = ops.call(graph, x, inputs_dict={layer.W: W, layer.b: b})
        ops.host_store(y_stream, ops.softmax(x, axis=1))
    return ir


def layer_with_gradient(batch: int = 4, n_in: int = 8, n_out: int = 16):
    """One layer's forward graph and the gradient graph autodiff makes for it."""
    ir = popxl.Ir()
    with ir.main_graph:
        graph = ir.create_graph(Linear(n_out), popxl.TensorSpec((batch, n_in), popxl.float32))
        grads = transforms.autodiff(graph)
    return ir, graph, grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--picture", help="only write the picture of a layer and its gradient graph (SVG) here")
    parser.add_argument("--out", help="the directory to write mlp.svg and mlp.onnx into (default: a new temp dir)")
    args = parser.parse_args()
    if args.picture:
        ir, _, _ = layer_with_gradient()
        with open(args.picture, "w") as f:
            f.write(popxl.visualize.to_svg(ir))
        return
    ir = build_mlp()
    print(ir)
    _, graph, grads = layer_with_gradient()
    print(grads.graph)
    out = args.out or tempfile.mkdtemp(prefix="exploring_graphs_")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "mlp.svg"), "w") as f:
        f.write(popxl.visualize.to_svg(ir))
    popxl.export_onnx(ir, os.path.join(out, "mlp.onnx"))
    print(f"wrote mlp.svg and mlp.onnx in {out}")


if __name__ == "__main__":
    main()
