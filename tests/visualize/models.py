"""Small programs the display tests draw, list and export: an MLP trained with per-layer autodiff."""
from typing import Tuple

import numpy as np

import popxl
import popxl.ops as ops
from popxl import transforms


class Linear(popxl.Module):
    def __init__(self, width: int) -> None:
        self.width = width

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        self.w = popxl.graph_input((x.shape[-1], self.width), popxl.float32, "w")
        self.b = popxl.graph_input((self.width,), popxl.float32, "b")
        return ops.gelu(x @ self.w + self.b)


def mlp(layers: int = 2, width: int = 8, batch: int = 4, train: bool = True, seed: int = 0) -> popxl.Ir:
    """``layers`` Linear layers, each its own subgraph; with ``train`` every layer also has its
    gradient graph called and an SGD update of its weight."""
    rng = np.random.default_rng(seed)
    ir = popxl.Ir()
    with ir.main_graph:
        x_stream = popxl.h2d_stream((batch, width), popxl.float32, name="x")
        y_stream = popxl.d2h_stream((batch, width), popxl.float32, name="y")
        x = ops.host_load(x_stream, "x")
        for i in range(layers):
            with popxl.name_scope(f"layer{i}"):
                layer = Linear(width)
                graph = ir.create_graph(layer, x)
                w = popxl.variable(rng.normal(size=(width, width)).astype(np.float32) / width, name="w")
                b = popxl.variable(np.zeros(width, np.float32), name="b")
                info = ops.call_with_info(graph, x, inputs_dict={layer.w: w, layer.b: b})
                if train:
                    grads = transforms.autodiff(graph)
                    dy = popxl.constant(np.ones((batch, width), np.float32), name="dy")
                    _, dw, _ = ops.call(grads.graph, dy, inputs_dict=grads.inputs_dict(info))
                    ops.scaled_add_(w, dw, b=-0.1)
                x = info.outputs[0]
        ops.host_store(y_stream, x)
    return ir


def streams(ir: popxl.Ir) -> Tuple[popxl.HostToDeviceStream, popxl.DeviceToHostStream]:
    (h2d,), (d2h,) = ir.get_all_h2d_streams(), ir.get_all_d2h_streams()
    return h2d, d2h
